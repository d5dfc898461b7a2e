"""Eviction policies: which cached node goes next when an insert needs room.

The tree tells the policy about every node whose candidacy or priority may have changed
(``add``, ``update``, ``remove``); the policy keeps its own index and answers ``pop_victim``
without scanning the tree.

- ``HeapEviction``: a static priority per node (``priority(node)``), popped from a heap with
  lazy invalidation (each entry carries the node's version; stale entries are skipped).
- ``MarconiEviction``: the paper's ``S(n) = minmax(recency) + alpha * minmax(flop_efficiency)``.
  Min-max normalisation over the *current* candidate set makes a node's score depend on every
  other candidate, so no static heap key exists. Candidates therefore live in dense numpy arrays
  (one slot per node, a free list for reuse) and each eviction scores them all in one vectorised
  pass: O(candidates) numpy work, no Python loop, no tree walk.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from sim.cost import ModelSpec
    from sim.tree import HybridRadixTree, Node


class EvictionPolicy(ABC):
    name = "base"
    #: "path": a hit or insert refreshes every node on its path (LRU engines, SGLang+, vLLM+);
    #: "consumed": only the node whose state is consumed (Marconi, SGLang after #31643).
    refresh = "path"

    def attach(self, tree: "HybridRadixTree") -> None:
        self.tree = tree

    @abstractmethod
    def add(self, node: "Node") -> None: ...

    @abstractmethod
    def update(self, node: "Node") -> None: ...

    @abstractmethod
    def remove(self, node: "Node") -> None: ...

    @abstractmethod
    def pop_victim(self) -> "Node | None":
        """The next node to evict, or None when nothing is evictable. A policy may also return
        ``(node, "drop-state")``: free the node's state only and keep its KV (a tombstone)."""

    def credited_bytes(self, states: int, kv_tokens: int, tree: "HybridRadixTree") -> int:
        """Bytes the eviction loop believes it freed (only paper mode ever lies here)."""
        return states * tree.state_bytes + kv_tokens * tree.kv_bytes_per_token


class HeapEviction(EvictionPolicy):
    """Pop the lowest ``priority(node)`` among ``is_candidate`` nodes."""

    def attach(self, tree):
        super().attach(tree)
        self._heap: list = []
        self._alive = 0

    def is_candidate(self, node: "Node") -> bool:
        return node.lock == 0 and not node.children and node.parent is not None

    @abstractmethod
    def priority(self, node: "Node"):
        """Sortable key; lower is evicted first."""

    def add(self, node):
        self._alive += 1
        self.update(node)

    def update(self, node):
        if node.parent is not None and self.is_candidate(node):
            heapq.heappush(self._heap, (self.priority(node), node.created, node.version, node))
            if len(self._heap) > 4 * self._alive + 1024:
                self._compact()

    def remove(self, node):
        self._alive -= 1
        node.version += 1

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[3].version == e[2] and e[3].parent is not None]
        heapq.heapify(self._heap)

    def pop_victim(self):
        heap = self._heap
        while heap:
            _, _, version, node = heapq.heappop(heap)
            if version == node.version and node.parent is not None and self.is_candidate(node):
                return node
        return None


class LRULeafEviction(HeapEviction):
    """LRU over leaves (SGLang+ and vLLM+ in the paper): inner nodes are never candidates, so
    an old turn's state under a newer turn stays until it becomes a leaf again."""

    name = "lru-leaf"
    refresh = "path"

    def priority(self, node):
        return node.last_access


class MarconiEviction(EvictionPolicy):
    """FLOP-aware eviction. Candidates: non-root nodes with at most one child that hold
    something (leaves; single-child nodes with a state). Evicting a single-child node drops its
    state only; its KV merges into the child."""

    name = "marconi"
    refresh = "consumed"

    def __init__(self, spec: "ModelSpec", alpha: float = 0.0, paper_bugs: bool = False) -> None:
        self.spec = spec
        self.alpha = float(alpha)
        self.paper_bugs = paper_bugs  # bug 1 (MLP marginal FLOPs) and bug 2 (bytes credited)
        # paper mode: candidates are enumerated as the artifact does (depth-first pre-order,
        # children in insertion order); a tie goes to the first, bug 2 credits the last
        self.artifact_order = paper_bugs
        self._last_scored_tokens = 0

    def attach(self, tree):
        super().attach(tree)
        cap = 1024
        self._t = np.zeros(cap)
        self._eff = np.zeros(cap)
        self._cand = np.zeros(cap, dtype=bool)
        self._created = np.zeros(cap, dtype=np.int64)
        self._nodes: list = [None] * cap
        self._geom = [None] * cap  # (edge tokens, end tokens) the cached efficiency was computed for
        self._free = list(range(cap - 1, -1, -1))
        self._hi = 0  # slots in use are < _hi

    def _grow(self) -> None:
        cap = len(self._t)
        self._t = np.concatenate((self._t, np.zeros(cap)))
        self._eff = np.concatenate((self._eff, np.zeros(cap)))
        self._cand = np.concatenate((self._cand, np.zeros(cap, dtype=bool)))
        self._created = np.concatenate((self._created, np.zeros(cap, dtype=np.int64)))
        self._nodes.extend([None] * cap)
        self._geom.extend([None] * cap)
        self._free.extend(range(2 * cap - 1, cap - 1, -1))

    def add(self, node):
        if not self._free:
            self._grow()
        slot = self._free.pop()
        node.slot = slot
        self._nodes[slot] = node
        self._geom[slot] = None
        self._created[slot] = node.created
        if slot >= self._hi:
            self._hi = slot + 1
        self.update(node)

    def update(self, node):
        slot = node.slot
        if slot < 0:
            return
        nch = len(node.children)
        cand = node.lock == 0 and nch <= 1 and (nch == 0 or node.has_state)
        self._cand[slot] = cand
        if not cand:
            return
        self._t[slot] = node.last_access
        geom = (node.n_tokens, node.depth_tokens)
        if self._geom[slot] != geom:
            self._geom[slot] = geom
            L_n = node.depth_tokens
            flops = self.spec.node_flops(L_n - node.n_tokens, L_n, paper_bug=self.paper_bugs)
            self._eff[slot] = flops / self.spec.node_bytes(L_n)

    def remove(self, node):
        slot = node.slot
        if slot < 0:
            return
        self._cand[slot] = False
        self._nodes[slot] = None
        node.slot = -1
        self._free.append(slot)

    def pop_victim(self):
        hi = self._hi
        idx = np.flatnonzero(self._cand[:hi])
        if idx.size == 0:
            return None
        if idx.size == 1:
            best = int(idx[0])
        else:
            age = np.maximum(self.tree.now - self._t[idx], 1e-9)
            score = _minmax(1.0 / age)
            if self.alpha:
                score = score + self.alpha * _minmax(self._eff[idx])
            low = score.min()
            ties = idx[score <= low]
            order = self._dfs_rank() if self.artifact_order else self._created
            best = int(ties[np.argmin(order[ties])]) if ties.size > 1 else int(ties[0])
            if self.paper_bugs:
                # bug 2: the artifact credits a leaf eviction with the edge of the last candidate
                # it scored (in its enumeration order), not the evicted one.
                last = int(idx[np.argmax(order[idx])])
                self._last_scored_tokens = self._nodes[last].n_tokens
        if self.paper_bugs and idx.size == 1:
            self._last_scored_tokens = self._nodes[best].n_tokens
        return self._nodes[best]

    def _dfs_rank(self) -> np.ndarray:
        """Position of each slot in a depth-first pre-order walk (children in insertion order),
        the order the artifact lists its candidates in. O(nodes); paper mode only."""
        rank = np.zeros(len(self._t), dtype=np.int64)
        i = 0
        stack = [self.tree.root]
        while stack:
            node = stack.pop()
            if node.slot >= 0:
                rank[node.slot] = i
                i += 1
            if node.children:
                stack.extend(reversed(node.children.values()))
        return rank

    def credited_bytes(self, states, kv_tokens, tree):
        if self.paper_bugs and kv_tokens:
            return states * tree.state_bytes + self._last_scored_tokens * tree.kv_bytes_per_token
        return super().credited_bytes(states, kv_tokens, tree)


def _minmax(x: np.ndarray) -> np.ndarray:
    lo = x.min()
    span = x.max() - lo
    if span <= 0:
        return np.ones_like(x)
    return (x - lo) / span
