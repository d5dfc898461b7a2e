"""Eviction policies of the paper: LRU over leaves and Marconi's FLOP-aware eviction.

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
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np

from policies.base import CONSUMED_REFRESH, PATH_REFRESH, EvictionPolicy, NodeView, Victim, eviction, knob


class HeapEviction(EvictionPolicy):
    """Pop the lowest ``priority(node)`` among ``is_candidate`` nodes."""

    def attach(self, tree):
        super().attach(tree)
        self._heap: list = []
        self._alive = 0

    def is_candidate(self, node: NodeView) -> bool:
        return node.lock == 0 and not node.children and node.parent is not None

    @abstractmethod
    def priority(self, node: NodeView):
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

    def pop_node(self):
        """The lowest-priority candidate, taken off the heap (None when there is none)."""
        heap = self._heap
        while heap:
            _, _, version, node = heapq.heappop(heap)
            if version == node.version and node.parent is not None and self.is_candidate(node):
                return node
        return None

    def pop_victim(self):
        node = self.pop_node()
        return None if node is None else Victim(node)


@eviction("lru-leaf")
class LRULeafEviction(HeapEviction):
    """LRU over leaves (SGLang+ and vLLM+ in the paper): inner nodes are never candidates, so
    an old turn's state under a newer turn stays until it becomes a leaf again."""

    refresh = PATH_REFRESH

    def priority(self, node):
        return node.last_access


class DenseSlotEviction(EvictionPolicy):
    """Candidates in dense numpy arrays, one slot per node (a free list reuses slots), for policies
    whose victim depends on every candidate at once and is found by one vectorised pass.

    Every slot has ``_cand`` (is it a candidate now), ``_created`` (tie-break: the oldest node) and
    ``_nodes``; a subclass names its own per-slot arrays in ``_columns`` (name -> (fill, dtype)) and
    per-slot Python lists in ``_lists`` (reset to None when a slot is reused), and fills them in
    ``update``. Candidate slots are all below ``_hi``."""

    _columns: dict = {}
    _lists: tuple = ()

    def attach(self, tree):
        super().attach(tree)
        cap = 1024
        for name, (fill, dtype) in self._columns.items():
            setattr(self, name, np.full(cap, fill, dtype=dtype))
        for name in self._lists:
            setattr(self, name, [None] * cap)
        self._cand = np.zeros(cap, dtype=bool)
        self._created = np.zeros(cap, dtype=np.int64)
        self._nodes: list = [None] * cap
        self._free = list(range(cap - 1, -1, -1))
        self._hi = 0

    def _grow(self) -> None:
        cap = len(self._nodes)
        for name, (fill, dtype) in self._columns.items():
            setattr(self, name, np.concatenate((getattr(self, name), np.full(cap, fill, dtype=dtype))))
        for name in self._lists:
            getattr(self, name).extend([None] * cap)
        self._cand = np.concatenate((self._cand, np.zeros(cap, dtype=bool)))
        self._created = np.concatenate((self._created, np.zeros(cap, dtype=np.int64)))
        self._nodes.extend([None] * cap)
        self._free.extend(range(2 * cap - 1, cap - 1, -1))

    def add(self, node):
        if not self._free:
            self._grow()
        slot = self._free.pop()
        node.slot = slot
        self._nodes[slot] = node
        for name in self._lists:
            getattr(self, name)[slot] = None
        self._created[slot] = node.created
        if slot >= self._hi:
            self._hi = slot + 1
        self.update(node)

    def remove(self, node):
        slot = node.slot
        if slot < 0:
            return
        self._cand[slot] = False
        self._nodes[slot] = None
        node.slot = -1
        self._free.append(slot)


@eviction("marconi")
class MarconiEviction(DenseSlotEviction):
    """FLOP-aware eviction. Candidates: non-root nodes with at most one child that hold
    something (leaves; single-child nodes with a state). Evicting a single-child node drops its
    state only; its KV merges into the child."""

    refresh = CONSUMED_REFRESH

    @dataclass(frozen=True)
    class Params:
        alpha: float = knob(
            0.0,
            "Marconi's FLOP-efficiency weight (a number >= 0), or auto: tuned while the trace "
            "runs, by default by the duel tuner (shadow caches for SGLang+'s LRU and each "
            "--duel-candidates alpha, the best over a trailing window; --tuner replay: the paper's).",
        )

    def __init__(self, cost, params=None) -> None:
        super().__init__(cost, params)
        self.alpha = float(self.params.alpha)  # the tuner may change it on the fly

    _columns = {"_t": (0.0, np.float64), "_eff": (0.0, np.float64)}  # last access, FLOP efficiency
    _lists = ("_geom",)  # (edge tokens, end tokens) the cached efficiency was computed for

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
            flops = self.cost.node_flops(L_n - node.n_tokens, L_n)
            self._eff[slot] = flops / self.cost.node_bytes(L_n)

    def pop_victim(self):
        idx = np.flatnonzero(self._cand[: self._hi])
        if idx.size == 0:
            return None
        return Victim(self._nodes[self.choose(idx)])

    def scores(self, idx: np.ndarray) -> np.ndarray:
        """Scores of candidate slots ``idx``; the lowest is evicted."""
        age = np.maximum(self.tree.now - self._t[idx], 1e-9)
        score = _minmax(1.0 / age)
        if self.alpha:
            score = score + self.alpha * _minmax(self._eff[idx])
        return score

    def choose(self, idx: np.ndarray) -> int:
        """The slot to evict among candidate slots ``idx`` (ties: the oldest node)."""
        if idx.size == 1:
            return int(idx[0])
        score = self.scores(idx)
        ties = idx[score <= score.min()]
        return int(ties[np.argmin(self._created[ties])]) if ties.size > 1 else int(ties[0])

    def node_at(self, slot: int):
        return self._nodes[slot]


def _minmax(x: np.ndarray) -> np.ndarray:
    lo = x.min()
    span = x.max() - lo
    if span <= 0:
        return np.ones_like(x)
    return (x - lo) / span
