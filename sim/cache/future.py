"""Offline knowledge of a trace's future, for the ``belady`` bound.

``NextUse`` answers, for a cached node, which not-yet-arrived request will next look up a prefix
that contains the node's whole root path (the next time the node can serve a hit). Requests are
numbered in their nominal arrival order (the order ``sequential`` mode replays them); a lookup
tells the index which request arrived (``arrived``), identified by its input, so identical inputs
are interchangeable.

Prefixes are compared by a polynomial hash over uint64 (wrap-around): ``H(s[:k]) = H(s[:k-1]) * X
+ s[k-1]``. A node's path hash is its parent's shifted by its edge plus the edge's own hash, kept
per node (a path never changes while the node lives: splits and merges keep end positions). Per
depth, the requests' prefix hashes are sorted once, lazily, the first time a node of that depth
asks; a query is a binary search plus a skip over requests already served.
"""

from __future__ import annotations

import numpy as np

_X = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier (golden ratio): a well-mixing base
NEVER = np.iinfo(np.int64).max


def _powers(base: np.uint64, n: int) -> np.ndarray:
    """base**0 .. base**n over uint64 (one cumulative product, wrapping around)."""
    out = np.ones(n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        out[1:] = base
        out = np.cumprod(out, dtype=np.uint64)
    return out


def _inverse(x: np.uint64) -> np.uint64:
    """x**-1 modulo 2**64 (x odd), by Newton's iteration."""
    inv = x
    with np.errstate(over="ignore"):
        for _ in range(6):
            inv = inv * (np.uint64(2) - x * inv)
    return inv


class NextUse:
    MAX_DEPTHS = 4096  # per-depth indexes kept at once

    def __init__(self, inputs: list[np.ndarray], max_depth: int) -> None:
        """``inputs``: each request's input symbols, in nominal arrival order."""
        self.n = len(inputs)
        self.lens = np.array([len(s) for s in inputs], dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.lens)[:-1])).astype(np.int64)
        top = max(max_depth, int(self.lens.max(initial=0))) + 1
        self.pw = _powers(_X, top)
        inv_pw = _powers(_inverse(_X), top)
        # prefix hash of length k = X**(k-1) * sum_{i<k} s_i * X**-i: one cumsum per request
        parts = []
        with np.errstate(over="ignore"):
            for s in inputs:
                L = len(s)
                acc = np.cumsum(s.astype(np.uint64) * inv_pw[:L], dtype=np.uint64)
                parts.append(acc * self.pw[:L])
        self.prefix = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
        self.served = np.zeros(self.n, dtype=bool)
        self.first_unserved = 0
        self._by_input: dict[tuple[int, int], list[int]] = {}
        for j in range(self.n - 1, -1, -1):  # stacks: the lowest ordinal on top
            key = (int(self.lens[j]), int(self.prefix[self.offsets[j] + self.lens[j] - 1]) if self.lens[j] else 0)
            self._by_input.setdefault(key, []).append(j)
        self._depth: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._path_hash: dict[int, int] = {}  # node.created -> root-path hash

    # ------------------------------------------------------------------ arrivals
    def arrived(self, seq: np.ndarray) -> None:
        """A request with input ``seq`` was looked up: the first unserved one with that input."""
        n = len(seq)
        h = 0
        if n:
            with np.errstate(over="ignore"):
                h = int(self._hash(seq))
        stack = self._by_input.get((n, h))
        if not stack:
            return  # not a request of the trace (a test's ad-hoc lookup)
        j = stack.pop()
        self.served[j] = True
        while self.first_unserved < self.n and self.served[self.first_unserved]:
            self.first_unserved += 1

    def _hash(self, seq: np.ndarray) -> np.uint64:
        L = len(seq)
        with np.errstate(over="ignore"):
            return (seq.astype(np.uint64) * self.pw[L - 1 :: -1][:L]).sum(dtype=np.uint64)

    # ------------------------------------------------------------------ queries
    def path_hash(self, node) -> int:
        """Hash of ``node``'s root path (memoised per node)."""
        key = node.created
        h = self._path_hash.get(key)
        if h is None:
            parent = node.parent
            root = parent is None or parent.parent is None
            ph = np.uint64(0) if root else np.uint64(self.path_hash(parent))
            with np.errstate(over="ignore"):
                h = int(ph * self.pw[len(node.key)] + self._hash(node.key))
            self._path_hash[key] = h
        return h

    def _index(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Prefix hashes of length ``d`` of every request that long, sorted (hash, ordinal)."""
        idx = self._depth.get(d)
        if idx is None:
            if len(self._depth) >= self.MAX_DEPTHS:  # bounded memory: drop the oldest depth
                del self._depth[next(iter(self._depth))]
            ords = np.flatnonzero(self.lens >= d)
            vals = self.prefix[self.offsets[ords] + d - 1]
            order = np.lexsort((ords, vals))
            idx = (vals[order], ords[order])
            self._depth[d] = idx
        return idx

    def next_use(self, node) -> int:
        """Ordinal of the next unserved request whose input holds ``node``'s root path and, when
        ``node`` has children holding states, stops short of all of them (a request that reaches
        a deeper state uses that one, not ``node``'s). NEVER: none."""
        d = node.depth_sym
        if d == 0:
            return NEVER
        vals, ords = self._index(d)
        h = np.uint64(self.path_hash(node))
        lo = int(np.searchsorted(vals, h, "left"))
        hi = int(np.searchsorted(vals, h, "right"))
        js = ords[lo:hi]
        js = js[~self.served[js]]
        if js.size == 0:
            return NEVER
        deeper = [c for c in node.children.values() if c.has_state]
        if deeper:
            lens, offs = self.lens[js], self.offsets[js]
            free = np.ones(js.size, dtype=bool)
            for c in deeper:
                dc = c.depth_sym
                reach = lens >= dc
                at = np.where(reach, offs + dc - 1, 0)
                free &= ~(reach & (self.prefix[at] == np.uint64(self.path_hash(c))))
            js = js[free]
        return int(js[0]) if js.size else NEVER
