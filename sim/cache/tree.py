"""Hybrid radix tree: attention KV on edges, recurrent-state checkpoints at node ends.

Topology. A compressed radix tree over symbols (token ids, or prefix-block hashes standing for
``block_tokens`` tokens each; a hash-block prompt's last block may be partial, inside an inserted
sequence when its output's symbols follow: ``Span`` counts each insert's symbols in tokens). A
node's edge ``key`` holds the KV of its symbols for every attention layer; ``has_state`` means the
node holds one checkpoint (recurrent + conv state of every linear layer) taken exactly after its
last symbol.

Hit rule. A hybrid model can reuse a prefix only where a state exists: the hit is the deepest
fully matched node that holds a state (its ancestors' KV is on the path by construction). A
partial-edge match gives no hybrid hit. A model without linear layers reuses the longest KV
match, partial edges included.

Invariants (checked by ``check_invariants``; the property tests drive random operations):
- ``used_bytes == kv_tokens * kv_bytes_per_token + n_states * state_bytes`` and never exceeds
  ``capacity_bytes`` (``sim.compat`` reproduces an artifact that may).
- Every non-root node with exactly one child holds a state or a lock (stateless single-child
  nodes are merged away: they free nothing and cost a level), unless the eviction policy keeps
  the engine's structure (``keeps_structure``: SGLang's ``UnifiedRadixCache`` never merges).
- A node's end position (``depth_tokens``) survives splits and merges; only a stateless leaf
  grows, when a later insert extends it.
- A locked node (``lock > 0``) is never evicted or merged; locks cover whole root paths, so a
  node's lock count is >= each child's.

Checkpoint ids. Every admitted state gets a fresh id (``node.ckpt``) that it keeps until it is
evicted: a split creates a stateless upper node and a merge removes a stateless (or just evicted)
node, so the node holding a state, and its end position, never change while the state lives. A
``listener`` (the engine's event stream, or None) hears every admitted and evicted checkpoint and
every run of evicted KV tokens, each with the ``tag`` of the ``insert`` or ``reserve`` call making
the change (what the caller needs to attribute it; None outside such a call).

Bookkeeping is incremental: cached depths, token counts and byte totals, and what eviction could
free now (``evictable_kv`` / ``evictable_states``: each node's share is recounted wherever the
policy hears of the node, so ``could_reserve`` reads two totals; ``evictable_walk`` is the
from-scratch oracle ``check_invariants`` holds them to); the eviction policy
is told about every node whose candidacy or priority may have changed (``policy.update``) so it
can keep its own heap or arrays, and never scans the tree.

Variants (``sim.compat``) subclass the tree and override the hooks marked "hook" below; the core
path carries no compatibility switches.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Protocol
import numpy as np

from policies.base import EvictionPolicy, RefreshRule


class Span:
    """Token positions of an inserted sequence's symbol boundaries. Every symbol stands for
    ``block_tokens`` tokens except the last, which holds what is left of ``total``, and, with a
    ``cut`` ``(k, tokens)``, the k-th: the first k symbols hold ``tokens`` tokens. That is a
    hash-block request: its prompt's last block is partial (Mooncake hashes it on its own) and the
    output's symbols follow it, so a partial symbol sits inside the sequence."""

    __slots__ = ("n", "B", "total", "k", "short")

    def __init__(self, n: int, block_tokens: int, total: int, cut: tuple[int, int] | None = None) -> None:
        self.n, self.B, self.total = n, block_tokens, total
        self.k, self.short = n, 0
        if cut is not None and 0 < cut[0] < n:
            self.k, self.short = cut[0], cut[0] * block_tokens - cut[1]

    def tokens(self, j: int) -> int:
        """Tokens of the first ``j`` symbols (0 <= j <= n)."""
        if j >= self.n:
            return self.total
        return j * self.B - (self.short if j >= self.k else 0)


def _edge_match(key: np.ndarray, seq: np.ndarray, pos: int) -> int:
    """Symbols of edge ``key`` that ``seq`` matches from ``pos`` (the whole edge, or where they differ).
    Comparing raw bytes first is ~10x faster than numpy's element-wise equality for the common
    full-edge case."""
    klen = len(key)
    seg = seq[pos : pos + klen]
    if len(seg) == klen and (klen == 1 or key.tobytes() == seg.tobytes()):
        return klen
    diff = np.flatnonzero(key[: len(seg)] != seg)
    return int(diff[0]) if diff.size else len(seg)


class CacheListener(Protocol):
    """What the tree reports as it changes (the engine turns it into events); ``tag``: what the
    ``insert`` or ``reserve`` call making the change was given (None outside such a call)."""

    def state_added(self, node: "Node", tag: object) -> None: ...
    def state_removed(self, node: "Node", tag: object) -> None: ...
    def kv_removed(self, tokens: int, tag: object) -> None: ...


class Node:
    __slots__ = (
        "key",
        "parent",
        "children",
        "n_tokens",
        "depth_sym",
        "depth_tokens",
        "has_state",
        "last_access",
        "lock",
        "slot",
        "version",
        "created",
        "ckpt",
        "free_kv",
        "free_state",
    )

    def __init__(
        self,
        key: np.ndarray,
        parent: "Node | None",
        n_tokens: int,
        depth_sym: int,
        depth_tokens: int,
        now: float,
        created: int,
    ) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.n_tokens = n_tokens  # tokens on this node's edge (KV held by this node)
        self.depth_sym = depth_sym  # symbols from root to the end of this edge
        self.depth_tokens = depth_tokens  # tokens from root to the end of this edge
        self.has_state = False
        self.last_access = now
        self.lock = 0
        self.slot = -1  # index in the eviction policy's arrays, if it keeps any
        self.version = 0  # bumped on every change, invalidates stale heap entries
        self.created = created  # creation order: deterministic tie-break
        self.ckpt = -1  # id of the checkpoint this node holds (kept through splits and merges)
        self.free_kv = 0  # its share of the tree's evictable totals (``_recount``)
        self.free_state = 0

    @property
    def parent_depth_tokens(self) -> int:
        return self.depth_tokens - self.n_tokens

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"Node(end={self.depth_tokens}, edge={self.n_tokens}, state={self.has_state}, "
            f"children={len(self.children)}, lock={self.lock})"
        )


@dataclass(slots=True)
class MatchResult:
    hit_node: Node  # deepest matched node with a state (root when none)
    hit_sym: int
    hit_tokens: int
    match_sym: int  # symbols matched token by token (may end inside an edge)
    match_tokens: int
    path: list[Node]  # fully matched nodes, root excluded, top-down
    split_node: Node | None  # node whose edge the match ended inside (None: ended at a node end)
    split_offset: int  # symbols of split_node's edge that matched


@dataclass(slots=True)
class InsertResult:
    inserted: bool
    new_kv_tokens: int = 0
    new_states: int = 0
    end_node: Node | None = None  # node ending at the last inserted symbol (locked if asked)
    evicted_states: int = 0
    evicted_kv_tokens: int = 0


@dataclass
class TreeStats:
    inserts: int = 0
    rejected_inserts: int = 0
    states_admitted: int = 0
    states_evicted: int = 0
    kv_tokens_evicted: int = 0
    evictions: int = 0  # eviction actions (a leaf removed or a state dropped)
    eviction_calls: int = 0  # inserts that had to make room (the alpha tuner starts at the first)
    peak_bytes: int = 0
    overshoots: int = 0  # paper mode: inserts that left the cache above capacity
    peak_overshoot_bytes: int = 0
    hit_states: dict = field(default_factory=dict)


class HybridRadixTree:
    def __init__(
        self,
        *,
        capacity_bytes: int,
        kv_bytes_per_token: int,
        state_bytes: int,
        block_tokens: int,
        policy: EvictionPolicy,
        hybrid: bool = True,
    ) -> None:
        self.capacity_bytes = int(capacity_bytes)
        self.kv_bytes_per_token = int(kv_bytes_per_token)
        self.state_bytes = int(state_bytes) if hybrid else 0
        self.block_tokens = int(block_tokens)
        self.hybrid = hybrid
        self.policy = policy
        self.now = 0.0  # set by the engine before each operation (set_time); policies read it
        self.listener: CacheListener | None = None
        self._tag: object = None  # the tag of the insert / reserve under way (set only for its duration)
        # while an insert makes room: ``[seq, span, checkpoints, bytes planned, extra bytes, stale]``
        # (``_grown``: a victim on the insert's own path is one ``_apply`` adds again)
        self._replan: list | None = None
        self._created = 0
        self._next_ckpt = 0
        self.root = self._new_node(np.empty(0, dtype=np.int64), None, 0, 0, 0, 0.0)
        self.root.lock = 1  # the root is never a candidate
        self.kv_tokens = 0
        self.n_states = 0
        # what eviction could free now (``could_reserve``), kept up to date node by node
        self.evictable_kv = 0  # KV tokens of unlocked nodes
        self.evictable_states = 0  # states of unlocked nodes, and of locked ones the policy may drop
        self.stats = TreeStats()
        policy.attach(self)

    # ------------------------------------------------------------------ accounting
    @property
    def used_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token + self.n_states * self.state_bytes

    def set_time(self, t: float) -> float:
        """Hook: the clock before an operation at simulated time ``t``; returns the node time. An
        eviction policy with ``strict_clock`` orders operations at equal times as they happen
        (SGLang stamps recency from a counter, ``get_and_increase_time_counter``): each operation
        gets a time strictly after the previous one's, ``t`` itself whenever ``t`` is later."""
        if getattr(self.policy, "strict_clock", False) and t <= self.now:
            t = math.nextafter(self.now, math.inf)
        self.now = t
        return t

    def _new_node(self, key, parent, n_tokens, depth_sym, depth_tokens, now) -> Node:
        self._created += 1
        return Node(key, parent, n_tokens, depth_sym, depth_tokens, now, self._created)

    # ------------------------------------------------------------------ lookup
    def match(self, seq: np.ndarray, max_hit_sym: int | None = None, *, tokens: int | None = None) -> MatchResult:
        """Walk ``seq`` down the tree. ``max_hit_sym`` caps the usable hit (e.g. SGLang's
        input_len - 1 rule); states deeper than it are not used. ``tokens``: ``seq``'s own token
        count; a state past it is not used either (a trace that gave a hash id two lengths: a
        whole block where the state was taken, this prompt's partial last block here)."""
        tok_cap = math.inf if tokens is None else tokens
        node = self.root
        hit = self.root
        pos = 0
        n = len(seq)
        path: list[Node] = []
        split_node, split_off = None, 0
        limit = n if max_hit_sym is None else max_hit_sym
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                break
            m = _edge_match(child.key, seq, pos)
            if m == len(child.key):
                pos += m
                node = child
                path.append(child)
                if child.has_state and child.depth_sym <= limit and child.depth_tokens <= tok_cap:
                    hit = child
                continue
            split_node, split_off = child, m
            pos += m
            break
        match_tokens = self._tokens_at(node, split_node, split_off)
        if self.hybrid:
            hit_sym, hit_tokens = hit.depth_sym, hit.depth_tokens
        else:  # pure transformer: longest KV match, partial edges included
            hit_sym = min(pos, limit)
            hit_tokens = min(match_tokens, hit_sym * self.block_tokens)
            hit = node if split_node is None else split_node
        return MatchResult(hit, hit_sym, hit_tokens, pos, match_tokens, path, split_node, split_off)

    def _tokens_at(self, node: Node, split_node: Node | None, split_off: int) -> int:
        if split_node is None:
            return node.depth_tokens
        return node.depth_tokens + min(split_off * self.block_tokens, split_node.n_tokens)

    # ------------------------------------------------------------------ refresh / locks
    @property
    def refresh(self) -> RefreshRule:
        """The refresh rule in force: the eviction policy's (a tuner may switch policies)."""
        return self.policy.refresh

    def lookup(
        self, seq: np.ndarray, max_hit_sym: int | None = None, now: float | None = None, *, tokens: int | None = None
    ) -> MatchResult:
        """A lookup as an engine does it: ``match`` (``tokens``: ``seq``'s own token count), then
        the refresh rule's hit refresh (at ``now``, default the tree's clock)."""
        m = self.match(seq, max_hit_sym, tokens=tokens)
        now = self.now if now is None else now
        self.refresh_hit(m, now)
        if getattr(self.policy, "touch_walk_end", False):
            self._touch_walk_end(
                m, max_hit_sym, now, None if tokens is None else Span(len(seq), self.block_tokens, tokens)
            )
        return m

    def forget(self, m: MatchResult) -> None:
        """Hook: the lookup that returned ``m`` was given back (its request waits or was
        preempted) and nothing will be inserted for it."""

    def _touch_walk_end(self, m: MatchResult, max_hit_sym: int | None, now: float, span: Span | None = None) -> None:
        """The lookup's walk (up to ``max_hit_sym``) ended inside an edge: the engine splits that
        node there and both halves become most recent (SGLang's ``_split_node`` in its match), even
        when no hit reaches them. A tree that keeps the engine's structure (``merges`` False) splits
        it too; one that merges keeps the node whole and touches all of it. ``span``: the looked-up
        sequence's tokens (a walk ending after its partial last block cuts there, not a whole
        block on); None: whole blocks."""
        end = m.match_sym if max_hit_sym is None else min(m.match_sym, max_hit_sym)
        node = m.split_node if end == m.match_sym else None
        if end < m.match_sym:
            node = next((n for n in m.path if n.depth_sym - len(n.key) < end < n.depth_sym), None)
        if node is None or end <= node.depth_sym - len(node.key):
            return
        if self.merges:
            self.touch(node, now)
            return
        up = None if span is None else span.tokens(end) - (node.depth_tokens - node.n_tokens)
        upper = self._split(node, end - (node.depth_sym - len(node.key)), now, up)
        self.touch(upper, now)
        self.touch(node, now)
        if node is m.split_node:
            m.path.append(upper)
            m.split_node, m.split_offset = None, 0
        else:
            m.path.insert(m.path.index(node), upper)

    @property
    def merges(self) -> bool:
        """Whether stateless single-child nodes are merged into their child (the default). An
        eviction policy with ``keeps_structure`` keeps every node the engine's tree keeps: SGLang's
        ``UnifiedRadixCache`` never merges, so such a node's KV is evicted on its own, as a leaf
        once its children are gone, and a stateless leaf is not extended in place."""
        return not getattr(self.policy, "keeps_structure", False)

    def refresh_hit(self, m: MatchResult, now: float) -> None:
        """Move recency after a lookup that hit ``m`` (``RefreshRule.hit`` / ``.state``)."""
        if m.hit_sym <= 0:
            return
        rule = self.refresh
        if rule.hit == "consumed":
            nodes = [m.hit_node]
        elif rule.hit == "walked":
            nodes = m.path
        else:
            nodes = [n for n in m.path if n.depth_sym <= m.hit_sym]
        with_kv = rule.state == "with-kv"
        for node in nodes:
            node.last_access = now
            if with_kv:
                self._touch_state(node, now)
            self._touched(node)
        if not with_kv:
            self._touch_state(m.hit_node, now)
            self._touched(m.hit_node)

    def refresh_inserted(self, res: "InsertResult", now: float, final: bool) -> None:
        """Move recency after an insert (``RefreshRule.insert``); ``final``: the request's last."""
        when = self.refresh.insert
        if res.inserted and res.end_node is not None and (when == "every" or (final and when == "final")):
            self.touch_path(res.end_node, now)

    def _touch_state(self, node: Node, now: float) -> None:
        """Hook: move a node's state recency (the core tree has one recency per node)."""

    def touch(self, node: Node, now: float) -> None:
        if node is self.root:
            return
        node.last_access = now
        self._touched(node)

    def touch_path(self, node: Node, now: float) -> None:
        with_kv = self.refresh.state == "with-kv"
        while node is not None and node is not self.root:
            node.last_access = now
            if with_kv:
                self._touch_state(node, now)
            self._touched(node)
            node = node.parent

    def lock(self, node: Node) -> None:
        while node is not None and node is not self.root:
            node.lock += 1
            if node.lock == 1:
                self._changed(node)
            node = node.parent

    def unlock(self, node: Node) -> None:
        freed: list[Node] = []
        while node is not None and node is not self.root:
            node.lock -= 1
            assert node.lock >= 0, "unbalanced unlock"
            if node.lock == 0:
                self._changed(node)
                if not node.has_state and len(node.children) == 1 and self.merges:
                    freed.append(node)
            node = node.parent
        # merges deferred while these stateless single-child nodes were locked
        for node in freed:
            if node.parent is not None and node.lock == 0 and len(node.children) == 1 and not node.has_state:
                self._merge_into_child(node)

    def _changed(self, node: Node) -> None:
        node.version += 1
        self._recount(node)
        self.policy.update(node)

    def _touched(self, node: Node) -> None:
        """``_changed`` for a node whose recency alone moved: what eviction could free stays."""
        node.version += 1
        self.policy.update(node)

    def _recount(self, node: Node) -> None:
        """Bring ``node``'s share of ``evictable_kv`` / ``evictable_states`` up to date: called
        wherever the policy hears of it (``_changed``, a node added, a node detached: its
        ``parent`` None, its share 0). Its share: an unlocked node's KV and state; a locked node's
        state where the policy's ``keys`` lists it."""
        if node.parent is None:  # the root, or a node no longer in the tree
            kv = st = 0
        elif node.lock == 0:
            kv, st = node.n_tokens, 1 if node.has_state else 0
        else:
            kv = 0
            st = 1 if node.has_state and self._locked_state_free(node) else 0
        if kv != node.free_kv:
            self.evictable_kv += kv - node.free_kv
            node.free_kv = kv
        if st != node.free_state:
            self.evictable_states += st - node.free_state
            node.free_state = st

    def _locked_state_free(self, node: Node) -> bool:
        """Whether the policy may drop the state of locked ``node`` (its ``keys`` lists it: an
        engine that locks a running path's KV and not its states)."""
        keys = getattr(self.policy, "keys", None)
        return keys is not None and "state" in keys(node)

    def recount_evictable(self) -> None:
        """Recompute every node's share from scratch (after the eviction policy changed: a locked
        state's share follows its ``keys``)."""
        for node in self.iter_nodes():
            self._recount(node)

    def evictable_walk(self) -> tuple[int, int]:
        """``(evictable_kv, evictable_states)`` recounted by a walk over the tree: the oracle the
        incremental totals are checked against (``check_invariants``, tests); never on a hot path."""
        keys = getattr(self.policy, "keys", None)
        kv = st = 0
        for node in self.iter_nodes():
            if node.parent is None:
                continue
            if node.lock == 0:
                kv += node.n_tokens
                st += node.has_state
            elif node.has_state and keys is not None and "state" in keys(node):
                st += 1
        return kv, st

    # ------------------------------------------------------------------ insert
    def insert(
        self,
        seq: np.ndarray,
        seq_tokens: int,
        checkpoints: list[int],
        now: float,
        *,
        lock: bool = False,
        protect: Node | None = None,
        need_bytes: float | None = None,
        tag: object = None,
        cut: tuple[int, int] | None = None,
    ) -> InsertResult:
        """Insert ``seq`` (KV for every symbol) with states at the symbol positions
        ``checkpoints`` (sorted, each in 1..len(seq)). Evicts as needed; if the insert cannot
        fit after evicting every candidate, nothing is inserted and it is counted as rejected.

        ``protect``: a node whose root path must survive the evictions of this insert (the
        request's matched path); the path of ``seq`` is always protected.
        ``need_bytes``: a variant's own estimate of the bytes to make room for (the core plans
        the exact bytes and ignores it).
        ``tag``: handed to the listener with every change this insert makes.
        ``cut``: ``(k, tokens)`` when the k-th symbol is partial though not the last (``Span``): the
        first k symbols hold ``tokens`` tokens.
        """
        outer, self._tag = self._tag, tag
        try:
            return self._insert(seq, seq_tokens, checkpoints, now, lock, protect, need_bytes, cut)
        finally:
            self._tag = outer

    def _insert(
        self,
        seq: np.ndarray,
        seq_tokens: int,
        checkpoints: list[int],
        now: float,
        lock: bool,
        protect: Node | None,
        need_bytes: float | None,
        cut: tuple[int, int] | None = None,
    ) -> InsertResult:
        """Hook: ``insert``'s work (a variant overrides this, so its changes carry the tag too)."""
        self.stats.inserts += 1
        n = len(seq)
        if n == 0:
            return InsertResult(True, end_node=self.root)
        span = Span(n, self.block_tokens, seq_tokens, cut)
        need, guard = self._room_needed(seq, span, checkpoints, need_bytes)
        ev_states = ev_kv = 0
        if not self._fits(need):
            if guard is not None:
                self.lock(guard)
            if protect is not None:
                self.lock(protect)
            plan = [seq, span, checkpoints, self._planned_bytes(seq, span, checkpoints), 0, guard is None]
            outer, self._replan = self._replan, plan
            try:
                ok, ev_states, ev_kv = self._evict_for(need)
            finally:
                self._replan = outer
                if guard is not None:
                    self.unlock(guard)
                if protect is not None:
                    self.unlock(protect)
            if not ok:
                self.stats.rejected_inserts += 1
                return InsertResult(False, evicted_states=ev_states, evicted_kv_tokens=ev_kv)
        kv_before, st_before = self.kv_tokens, self.n_states
        end = self._apply(seq, span, checkpoints, now)
        used = self.used_bytes
        if used > self.capacity_bytes:
            self._over_capacity(used)
        self.stats.peak_bytes = max(self.stats.peak_bytes, used)
        new_states = self.n_states - st_before
        self.stats.states_admitted += new_states
        if lock:
            self.lock(end)
        return InsertResult(True, self.kv_tokens - kv_before, new_states, end, ev_states, ev_kv)

    def _room_needed(
        self, seq: np.ndarray, span: Span, checkpoints: list[int], need_bytes: float | None
    ) -> tuple[float, Node | None]:
        """Hook: (bytes the insert needs, node whose root path eviction must spare)."""
        need_kv, need_states, walk_end = self._plan(seq, span, checkpoints)
        return need_kv * self.kv_bytes_per_token + need_states * self.state_bytes, walk_end

    def _planned_bytes(self, seq: np.ndarray, span: Span, checkpoints: list[int]) -> float:
        """Hook: the bytes ``_apply`` would add to the tree as it is now (no mutation)."""
        need_kv, need_states, _ = self._plan(seq, span, checkpoints)
        return need_kv * self.kv_bytes_per_token + need_states * self.state_bytes

    def _grown(self) -> float:
        """Bytes the insert making room needs beyond its plan: a victim on its own path (a locked
        node's state where the policy's ``keys`` lists it, as vLLM's free queue holds a cached state
        apart from the blocks a running request holds) is one ``_apply`` adds again, so what the
        insert adds is planned again after such a victim (0 outside an insert's eviction)."""
        r = self._replan
        if r is None:
            return 0
        if r[5]:
            r[4] = max(0, self._planned_bytes(r[0], r[1], r[2]) - r[3])
            r[5] = False
        return r[4]

    def _fits(self, need: float) -> bool:
        """Hook: whether ``need`` more bytes fit without evicting (a pooled cache checks each pool)."""
        return self.used_bytes + need <= self.capacity_bytes

    def _over_capacity(self, used: int) -> None:
        """Hook: an insert left the cache above capacity (never expected of the core)."""
        raise AssertionError(f"capacity exceeded: {used} > {self.capacity_bytes}")

    def _plan(self, seq: np.ndarray, span: Span, checkpoints: list[int]) -> tuple[int, int, Node]:
        """Tokens of new KV and number of new states the insert would add (no mutation).
        Returns the deepest node the walk reached (its root path must survive eviction)."""
        need_kv, new_cps, node = self._plan_new(seq, span, checkpoints)
        return need_kv, len(new_cps), node

    def _plan_new(self, seq: np.ndarray, span: Span, checkpoints: list[int]) -> tuple[int, list[int], Node]:
        """``_plan`` with the checkpoints that would add a state (those not already held)."""
        node = self.root
        pos = 0
        n = len(seq)
        ends_with_state: set[int] = set()
        stop = n + 1  # checkpoints from here on are not added (_longer)
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                break
            m = _edge_match(child.key, seq, pos)
            if m == len(child.key) and self._longer(child, span, pos + m):
                node, stop, pos = child, pos + m, n  # _apply stops here: nothing more is added
                break
            pos += m
            node = child  # on a partial match: the edge the insert will split, to protect too
            if m == len(child.key):
                if child.has_state:
                    ends_with_state.add(pos)
                continue
            break
        need_kv = span.total - span.tokens(pos)
        new_cps = [c for c in checkpoints if c not in ends_with_state and c < stop] if self.hybrid else []
        return need_kv, new_cps, node

    def _apply(self, seq: np.ndarray, span: Span, checkpoints: list[int], now: float) -> Node:
        n = len(seq)
        cps = checkpoints if self.hybrid else []
        ci = 0
        node = self.root
        pos = 0
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                break
            klen = len(child.key)
            m = _edge_match(child.key, seq, pos)
            while ci < len(cps) and cps[ci] <= pos:
                ci += 1
            c = cps[ci] if ci < len(cps) else -1
            if pos < c < pos + m:  # a checkpoint inside an already cached edge: cut it there
                node = self._split(child, c - pos, now, span.tokens(c) - span.tokens(pos))
                pos = c
                self._add_state(node)
                continue
            if m == klen and self._longer(child, span, pos + klen):
                return child  # nothing of seq can hang under it: see _longer
            if m == klen:
                pos += klen
                node = child
                if pos == c and not child.has_state:
                    self._add_state(child)
                elif pos == c and getattr(self.policy, "reinsert_refreshes_state", False):
                    self._touch_state(child, now)  # the engine inserted this state again
                    self._touched(child)
                continue
            if pos + m == n and c != n:
                return child  # seq ends inside a cached edge and needs no state there
            node = self._split(child, m, now, span.tokens(pos + m) - span.tokens(pos))
            pos += m
            self._after_split(node, pos == c)
            break
        while pos < n:  # the missing part: new edges, cut at every checkpoint
            while ci < len(cps) and cps[ci] <= pos:
                ci += 1
            nxt = min(cps[ci], n) if ci < len(cps) else n
            tokens = span.tokens(nxt) - span.tokens(pos)
            self._before_extend(node)
            if not node.children and not node.has_state and node is not self.root and self.merges:
                # extend a stateless leaf rather than hang a child under it
                self._extend_leaf(node, seq[pos:nxt], tokens)
            else:
                leaf = self._new_node(
                    seq[pos:nxt], node, tokens, node.depth_sym + (nxt - pos), node.depth_tokens + tokens, now
                )
                node.children[int(seq[pos])] = leaf
                self.kv_tokens += tokens
                self._changed(node)
                node = leaf
                self._recount(leaf)
                self.policy.add(leaf)
            pos = nxt
            if ci < len(cps) and pos == cps[ci]:
                self._add_state(node)
        return node

    @staticmethod
    def _longer(child: Node, span: Span, end: int) -> bool:
        """Whether the whole-matched edge ``child`` (the inserted sequence's symbols up to ``end``)
        holds more tokens than the sequence does there: a trace gave a hash id two lengths (a
        whole block where the edge was cached, this sequence's partial block here). The sequence
        is covered up to that symbol (its tokens are the block's first ones) but nothing of it can
        hang below, nor a state sit at the edge's end: both would lie past its own tokens. Never
        true where each hash id has one length."""
        return child.depth_tokens > span.tokens(end)

    def _after_split(self, node: Node, at_checkpoint: bool) -> None:
        """Hook: an insert diverged inside an edge and split it; ``node`` ends at the divergence."""
        if at_checkpoint:
            self._add_state(node)

    def _before_extend(self, node: Node) -> None:
        """Hook: new symbols are about to hang under (or extend) ``node``."""

    def _extend_leaf(self, leaf: Node, key: np.ndarray, tokens: int) -> None:
        leaf.key = np.concatenate((leaf.key, key))
        leaf.n_tokens += tokens
        leaf.depth_sym += len(key)
        leaf.depth_tokens += tokens
        self.kv_tokens += tokens
        self._changed(leaf)

    def _add_state(self, node: Node) -> None:
        node.has_state = True
        node.ckpt = self._next_ckpt
        self._next_ckpt += 1
        self.n_states += 1
        self._changed(node)
        if self.listener is not None:
            self.listener.state_added(node, self._tag)

    def _state_gone(self, node: Node) -> None:
        """``node``'s state was just freed (its ``has_state`` already False)."""
        if self.listener is not None:
            self.listener.state_removed(node, self._tag)
        node.ckpt = -1

    def _split(self, child: Node, m: int, now: float, up_tokens: int | None = None) -> Node:
        """Cut ``child``'s edge after ``m`` symbols; return the new upper node. ``up_tokens``: the
        tokens of those symbols, as the inserting sequence counts them (``Span``: one of them may
        be a partial block); default ``m`` whole blocks. The cut stays inside the edge (at least a
        token on each side) even if a trace gave one hash id two lengths."""
        parent = child.parent
        if up_tokens is None:
            up_tokens = m * self.block_tokens
        up_tokens = max(1, min(up_tokens, child.n_tokens - 1))
        upper = self._new_node(
            child.key[:m],
            parent,
            up_tokens,
            child.depth_sym - len(child.key) + m,
            child.depth_tokens - child.n_tokens + up_tokens,
            now,
        )
        upper.lock = child.lock  # locks cover whole root paths
        parent.children[int(child.key[0])] = upper
        child.key = child.key[m:]
        child.n_tokens -= up_tokens
        child.parent = upper
        upper.children[int(child.key[0])] = child
        self._recount(upper)
        self.policy.add(upper)
        self._changed(child)
        return upper

    # ------------------------------------------------------------------ memory held outside the cache
    def reserve(self, kv_tokens: int, states: int, *, tag: object = None) -> bool:
        """Charge memory held outside the cache against its capacity: ``kv_tokens`` of KV and
        ``states`` state slots of running requests (``--scheduler continuous``). Evicts cached
        entries to make room; returns False, charging nothing, when the unlocked entries cannot
        free enough. The charge lowers the capacity the cache itself may use until ``release``.
        ``tag``: handed to the listener with every eviction this makes."""
        kv_bytes = kv_tokens * self.kv_bytes_per_token
        need = kv_bytes + states * self.state_bytes
        if need <= 0:
            return True
        self._pending = (kv_bytes, states)
        if not self._fits(need):
            outer, self._tag = self._tag, tag
            try:
                if not self._evict_for(need)[0]:
                    return False
            finally:
                self._tag = outer
        self._hold(kv_bytes, states)
        return True

    def could_reserve(self, kv_tokens: int, states: int) -> bool | None:
        """Whether ``reserve(kv_tokens, states)`` would succeed, asked without evicting anything:
        it fits now, or would once every entry the policy can give up is gone (an unlocked node's
        KV and state, a locked node's state where the policy's ``keys`` lists it), as an engine
        checks a request before it admits it (vLLM's ``allocate_slots`` counts the cached blocks
        in the free queue as free, SGLang's ``PrefillAdder`` the evictable size). Reads the totals
        kept node by node (``evictable_kv``, ``evictable_states``; ``evictable_walk`` recounts
        them). None when the policy cannot say (it has no ``keys``)."""
        kv_bytes = kv_tokens * self.kv_bytes_per_token
        need = kv_bytes + states * self.state_bytes
        self._pending = (kv_bytes, states)
        if need <= 0 or self._fits(need):
            return True
        keys = getattr(self.policy, "keys", None)
        if keys is None:
            return None
        return self._fits_freed(self.evictable_kv, self.evictable_states, kv_bytes, states)

    def _fits_freed(self, kv_free: int, states_free: int, kv_bytes: int, states: int) -> bool:
        """Hook: whether ``kv_bytes`` of KV and ``states`` states fit once ``kv_free`` KV tokens
        and ``states_free`` states are evicted (a pooled cache checks each pool)."""
        freed = kv_free * self.kv_bytes_per_token + states_free * self.state_bytes
        return self.used_bytes - freed + kv_bytes + states * self.state_bytes <= self.capacity_bytes

    def release(self, kv_tokens: int, states: int) -> None:
        """Give back a charge made by ``reserve``."""
        self._hold(-kv_tokens * self.kv_bytes_per_token, -states)

    def _hold(self, kv_bytes: int, states: int) -> None:
        """Hook: lower (raise, for negative amounts) the capacity left to the cache."""
        self.capacity_bytes -= kv_bytes + states * self.state_bytes

    # ------------------------------------------------------------------ eviction
    def _apply_victim(self, victim) -> tuple[int, int]:
        """Free what the policy chose: an inner node's state only, or the node with its KV.
        Returns (states freed, KV tokens freed)."""
        r = self._replan
        if r is not None and victim.node.lock > 0:
            r[5] = True  # the insert's path is locked (its walk is guarded): only a locked victim is on it
        if victim.drop_state_only:
            return self.drop_state(victim.node)
        return self.evict(victim.node)

    def _evict_for(self, need: float) -> tuple[bool, int, int]:
        """Evict until ``need`` more bytes fit. Returns (fits, states evicted, KV tokens evicted)."""
        self.stats.eviction_calls += 1
        evicted = [0, 0]  # states, KV tokens
        ok = self._drain(
            lambda: self.used_bytes + need + self._grown() > self.capacity_bytes, self.policy.pop_victim, evicted
        )
        return ok, evicted[0], evicted[1]

    def _drain(self, over, pop, evicted: list) -> bool:
        """Apply ``pop()``'s victims while ``over()``, adding (states, KV tokens) freed to
        ``evicted``; False when the pool runs dry first."""
        while over():
            victim = pop()
            if victim is None:
                return False
            s, kv = self._apply_victim(victim)
            evicted[0] += s
            evicted[1] += kv
        return True

    def evict(self, node: Node) -> tuple[int, int]:
        """Evict one candidate: a leaf goes with its KV and state; a single-child node loses its
        state and is merged into its child. Returns (states freed, KV tokens freed)."""
        assert node.lock == 0 and node is not self.root and len(node.children) <= 1
        self.stats.evictions += 1
        parent = node.parent
        if not node.children:
            freed_states = 1 if node.has_state else 0
            freed_kv = node.n_tokens
            del parent.children[int(node.key[0])]
            self.kv_tokens -= freed_kv
            self.n_states -= freed_states
            node.has_state = False
            if freed_states:
                self._state_gone(node)
            if self.listener is not None:
                self.listener.kv_removed(freed_kv, self._tag)
            self.policy.remove(node)
            node.parent = None
            self._recount(node)
            self._after_child_removed(parent)
        else:
            if not node.has_state:  # nothing to free: only structure
                if self.merges:
                    self._merge_into_child(node)
                return 0, 0
            node.has_state = False
            self.n_states -= 1
            self._state_gone(node)
            freed_states, freed_kv = 1, 0
            if self.merges:
                self._merge_into_child(node)
            else:
                self._changed(node)
        self.stats.states_evicted += freed_states
        self.stats.kv_tokens_evicted += freed_kv
        return freed_states, freed_kv

    def drop_state(self, node: Node) -> tuple[int, int]:
        """Free ``node``'s state and keep its KV (a tombstone). A single-child node is merged
        into its child (the compression invariant); a leaf stays as a stateless leaf; a branch
        node stays as a stateless branch. A locked node (a policy whose engine locks only KV on a
        running path: TensorRT-LLM's pools) keeps its KV and is merged when unlocked. Returns
        (states freed, KV tokens freed) = (1, 0)."""
        assert node is not self.root and node.has_state
        self.stats.evictions += 1
        self.stats.states_evicted += 1
        node.has_state = False
        self.n_states -= 1
        self._state_gone(node)
        if len(node.children) == 1 and self.merges and node.lock == 0:
            self._merge_into_child(node)
        else:
            self._changed(node)
        return 1, 0

    def _after_child_removed(self, parent: Node) -> None:
        if parent is self.root:
            return
        if len(parent.children) == 1 and not parent.has_state and parent.lock == 0 and self.merges:
            self._merge_into_child(parent)
        else:
            self._changed(parent)

    def _merge_into_child(self, node: Node) -> None:
        """Remove single-child ``node``; its only child absorbs its edge (KV moves, nothing freed)."""
        (child,) = node.children.values()
        parent = node.parent
        child.key = np.concatenate((node.key, child.key))
        child.n_tokens += node.n_tokens
        child.parent = parent
        parent.children[int(child.key[0])] = child
        self.policy.remove(node)
        node.parent = None
        node.children = {}
        self._recount(node)
        self._changed(child)

    # ------------------------------------------------------------------ introspection
    def checkpoints(self) -> dict[int, int]:
        """Live checkpoints: id -> end position in tokens (a full walk; tests and tools)."""
        return {n.ckpt: n.depth_tokens for n in self.iter_nodes() if n.has_state}

    def iter_nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_invariants(self) -> None:
        """Full recount (tests only): bytes, depths, locks, compression, capacity."""
        kv = states = 0
        for node in self.iter_nodes():
            if node is self.root:
                continue
            kv += node.n_tokens
            states += node.has_state
            p = node.parent
            assert p is not None and p.children.get(int(node.key[0])) is node, "broken parent link"
            assert node.depth_tokens == p.depth_tokens + node.n_tokens, "stale depth"
            assert node.depth_sym == p.depth_sym + len(node.key), "stale symbol depth"
            assert len(node.key) >= 1
            if p is not self.root:
                assert p.lock >= node.lock, "lock does not cover the root path"
            if len(node.children) == 1 and self.merges:
                assert node.has_state or node.lock > 0, "stateless single-child node not merged"
            assert (node.ckpt >= 0) == node.has_state, "checkpoint id out of step with the state"
        assert kv == self.kv_tokens, (kv, self.kv_tokens)
        assert states == self.n_states, (states, self.n_states)
        walk = self.evictable_walk()
        assert walk == (self.evictable_kv, self.evictable_states), ("evictable totals", walk)
        self._check_capacity()

    def _check_capacity(self) -> None:
        """Hook: the capacity invariant."""
        assert self.used_bytes <= self.capacity_bytes, "capacity exceeded"
