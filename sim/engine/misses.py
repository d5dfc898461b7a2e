"""Why a request missed: its prompt tokens it did not reuse, split by cause (issue 43, item 3).

Per request, at its (last) lookup:

- ``S``: the longest prefix of its prompt shared with any earlier request (prompt + output, every
  token an earlier request sent or received; earlier = looked up before it), from a shadow radix
  trie of every sequence seen, never evicted (``ShadowTrie``: O(length) per request);
- ``never_shared = prompt - S``;
- ``last_token_rule``: the part of ``S`` no engine can reuse because of the last-token rules: a
  lookup stops at ``prompt - 1`` tokens (presets with ``lookup_cap_minus_one``), and an engine
  preset stores input + output - 1 tokens, so a prefix that reaches an earlier request's last
  token (every earlier sequence through that point ends there) loses that token. ``C`` = what is
  left;
- the rest, ``C - hit``, lies between the hit and ``C``. The trie keeps, per position of a state
  the cache ever admitted, what became of it (a mark: alive, evicted by an insert's eviction,
  evicted to make room for running requests, in an insert the cache rejected, or a state the
  engine places one alignment unit earlier under speculative decoding). The marks in
  ``(hit, C]`` that are not alive split it: each lost state's cause (``evicted``,
  ``held_by_running``, ``insert_rejected``, ``speculative``) gets the tokens between the lost state
  before it (or the hit) and itself, what that loss alone costs; the tokens past the deepest one
  (or all of ``(hit, C]`` when there is none) are ``no_checkpoint``: no state was ever placed there
  (the engine's block / page / track-interval geometry, or the sharing request has not inserted
  yet). So under vLLM's EAGLE drop with the shifted state evicted too, the block between them is
  ``speculative`` and the rest ``evicted``.

The causes add up to ``prompt - hit`` for every request. The evicted part also records when the
deepest evicted state went (``miss_evicted_at_s``). Positions are the trace's symbols (a token,
or a hash block), so the preset's coarser grid counts as geometry, not as "never shared".
"""

from __future__ import annotations


import numpy as np

from traces.base import joined

CAUSES = (
    "never_shared",
    "no_checkpoint",
    "last_token_rule",
    "evicted",
    "insert_rejected",
    "held_by_running",
    "speculative",
)
ALIVE, EVICTED, HELD, REJECTED, SPECULATIVE = "alive", "evicted", "held_by_running", "insert_rejected", "speculative"
_COMPARE_IN_NUMPY = 16  # edges at least this long are compared with one numpy pass


class _Node:
    __slots__ = ("seq", "a", "depth", "children", "max_end", "marks")

    def __init__(self, seq, a: int, depth: int, max_end: int) -> None:
        self.seq = seq  # the edge is seq[a : a + (depth - start)], a view of a request's symbols
        self.a = a
        self.depth = depth  # symbols from the root to the edge's end
        self.children: dict[int, _Node] = {}
        self.max_end = max_end  # the longest sequence through this node (symbols)
        self.marks: dict[int, tuple[str, float]] | None = None  # depth -> (kind, time)


class ShadowTrie:
    """Every sequence seen, as a compressed radix trie over the trace's symbols; never evicted.
    ``walk`` and ``insert`` cost O(length) (numpy compares along edges)."""

    def __init__(self) -> None:
        self.root = _Node(None, 0, 0, 0)

    def walk(self, seq: np.ndarray) -> tuple[int, list[_Node]]:
        """Symbols of ``seq`` shared with the trie, and the nodes walked (the last holds the point
        where the match ends, at or inside its edge)."""
        node, pos, n, path = self.root, 0, len(seq), []
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                break
            length = child.depth - node.depth
            m = _common(seq, pos, child.seq, child.a, min(length, n - pos))
            path.append(child)
            pos += m
            if m < length:
                break
            node = child
        return pos, path

    def add(self, seq: np.ndarray, pos: int, path: list[_Node]) -> None:
        """Add ``seq`` where ``walk(seq)`` (``pos``, ``path``) left it, without comparing again."""
        n = len(seq)
        self.root.max_end = max(self.root.max_end, n)
        split = bool(path) and pos < n and pos < path[-1].depth
        for node in path[:-1] if split else path:  # a split edge's lower part does not hold seq
            node.max_end = max(node.max_end, n)
        if pos >= n:
            return
        if not path or pos == path[-1].depth:  # at a node boundary: a new leaf
            parent = path[-1] if path else self.root
            parent.children[int(seq[pos])] = _Node(seq, pos, n, n)
            return
        child = path[-1]  # inside its edge: split there
        parent = path[-2] if len(path) > 1 else self.root
        m = pos - parent.depth
        upper = _Node(child.seq, child.a, pos, max(child.max_end, n))
        parent.children[int(child.seq[child.a])] = upper
        child.a += m
        upper.children[int(child.seq[child.a])] = child
        if child.marks:
            up = {d: v for d, v in child.marks.items() if d <= pos}
            if up:
                upper.marks = up
                child.marks = {d: v for d, v in child.marks.items() if d > pos} or None
        upper.children[int(seq[pos])] = _Node(seq, pos, n, n)

    def insert(self, seq: np.ndarray) -> None:
        """Add ``seq`` (kept by reference: its symbols must not change)."""
        n = len(seq)
        node, pos = self.root, 0
        node.max_end = max(node.max_end, n)
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                node.children[int(seq[pos])] = _Node(seq, pos, n, n)
                return
            length = child.depth - node.depth
            m = _common(seq, pos, child.seq, child.a, min(length, n - pos))
            if m < length:  # split the edge after m symbols
                upper = _Node(child.seq, child.a, node.depth + m, max(child.max_end, n))
                node.children[int(seq[pos])] = upper
                child.a += m
                upper.children[int(child.seq[child.a])] = child
                if child.marks:
                    up = {d: v for d, v in child.marks.items() if d <= upper.depth}
                    if up:
                        upper.marks = up
                        child.marks = {d: v for d, v in child.marks.items() if d > upper.depth} or None
                pos += m
                if pos < n:
                    upper.children[int(seq[pos])] = _Node(seq, pos, n, n)
                return
            child.max_end = max(child.max_end, n)
            pos += m
            node = child

    def node_at(self, seq: np.ndarray, depth: int) -> _Node | None:
        """The node whose edge holds symbol position ``depth`` of ``seq`` (a sequence inserted
        before), following children by their first symbol only."""
        node = self.root
        while node.depth < depth:
            node = node.children.get(int(seq[node.depth])) if node.depth < len(seq) else None
            if node is None:
                return None
        return node

    def path_to(self, seq: np.ndarray, depth: int) -> list[_Node]:
        """The nodes from the root's child to the one whose edge holds position ``depth`` of
        ``seq``, which the trie holds up to ``depth`` (a sequence inserted before, or a prefix of
        one): ``walk(seq)``'s path cut there, found by first symbols alone ([] for depth 0)."""
        node, path = self.root, []
        while node.depth < depth:
            node = node.children[int(seq[node.depth])]
            path.append(node)
        return path

    def mark(self, seq: np.ndarray, depth: int, kind: str, t: float) -> None:
        node = self.node_at(seq, depth)
        if node is None or depth <= 0:
            return
        if node.marks is None:
            node.marks = {}
        node.marks[depth] = (kind, t)


def _common(a: np.ndarray, i: int, b: np.ndarray, j: int, k: int) -> int:
    """Length of the common run of ``a[i:i+k]`` and ``b[j:j+k]``."""
    if k >= _COMPARE_IN_NUMPY:
        neq = np.flatnonzero(a[i : i + k] != b[j : j + k])
        return int(neq[0]) if len(neq) else k
    for m in range(k):
        if a[i + m] != b[j + m]:
            return m
    return k


class MissLedger:
    """The miss causes of one run (an observer of ``admit`` / ``evict`` events, told of lookups,
    rejected inserts and reservations by the simulation): per-request arrays, one per cause."""

    def __init__(self, n: int, block_tokens: int, grid_tokens: int, stores_last_token: bool, cap_minus_one: bool):
        self.B = block_tokens  # tokens per trace symbol
        self.grid = grid_tokens  # tokens per symbol of the cache's tree
        self.stores_last_token = stores_last_token
        self.cap_minus_one = cap_minus_one
        self.trie = ShadowTrie()
        self.counts = {c: np.zeros(n, dtype=np.int64) for c in CAUSES}
        self.evicted_at = np.full(n, np.nan)
        # hit tokens of a lookup after a preemption past what the request shared with earlier ones at
        # its first lookup: its own chunks, published before it was preempted, or requests served since
        self.after_preemption = np.zeros(n, dtype=np.int64)
        self.running = False  # an eviction now makes room for running requests (continuous scheduler)
        self._seqs: dict[int, np.ndarray] = {}  # request id -> its symbols (input + output)
        self._ckpt: dict[int, tuple[np.ndarray, int]] = {}  # checkpoint id -> (sequence, symbol depth)
        self._seen: set[int] = set()
        self._first: dict[int, tuple[int, bool]] = {}  # request id -> (shared symbols, ends there) at its first lookup

    # ------------------------------------------------------------------ lookups
    def looked_up(self, r, hit_tokens: int, tok_in: int) -> None:
        """Split ``r``'s missed prompt tokens at its lookup (a repeated lookup, after a
        preemption, replaces the split); the first lookup adds its sequence to the trie."""
        i = r.request_id
        B = self.B
        first = i not in self._seen
        if first:  # walk the whole sequence once: the prompt is its prefix, the walk places the insert
            seq = joined(r.input_tokens, r.output_tokens)  # a view of the trace's buffer where they meet in it
        else:
            seq = r.input_tokens
        if first:
            M_sym, walked = self.trie.walk(seq)
            S_sym = min(M_sym, len(r.input_tokens))
            k = 0  # the walked nodes up to the one holding the prompt's point S
            while k < len(walked) and (k == 0 or walked[k - 1].depth < S_sym):
                k += 1
            path = walked[:k] if S_sym else []
        else:  # a lookup after a preemption: the trie holds the request itself now; keep the first answer
            S_sym, ends = self._first[i]
            # the nodes down to S, followed by their first symbol: no compare along the prompt again
            # (a waiting request is looked up again at every pass of the engine presets)
            path = self.trie.path_to(seq, S_sym)
        if first:  # every earlier sequence through S ends there: its last token was never stored
            ends = bool(path) and path[-1].max_end <= S_sym
            self._first[i] = (S_sym, ends)
        S = min(S_sym * B, tok_in)
        C = S
        if ends and not self.stores_last_token and S > 0:
            C = S - 1
        if self.cap_minus_one:
            C = min(C, max(tok_in - 1, 0))
        C = max(C, hit_tokens)
        row = {c: 0 for c in CAUSES}
        row["never_shared"] = tok_in - S
        row["last_token_rule"] = S - C if S >= C else 0
        gap_lo, gap_hi = hit_tokens, min(C, tok_in)
        if gap_hi > gap_lo:
            lo, hi = gap_lo // B, gap_hi // B  # marks at symbol depths in (lo, hi]
            if gap_hi == tok_in and tok_in % B:  # a hash-block prompt's partial last block: its state is at tok_in
                hi += 1
            lost = sorted(
                (d, k, t)
                for node in path
                if node.marks
                for d, (k, t) in node.marks.items()
                if k != ALIVE and lo < d <= hi
            )
            upto = gap_lo  # each lost state costs the tokens between the one before it and itself
            for d, k, t in lost:
                end = min(d * B, gap_hi)
                row[k] += end - upto
                upto = end
                if k in (EVICTED, HELD):
                    self.evicted_at[i] = t
            row["no_checkpoint"] = gap_hi - upto
        if S < C:  # the hit ran past the shared part (cannot happen with a shared trie; kept exact)
            row["never_shared"] -= C - S
        for c, v in row.items():
            self.counts[c][i] = v
        self.after_preemption[i] = 0 if first else max(0, hit_tokens - S)
        if first:
            self._seen.add(i)
            self._seqs[i] = seq
            self.trie.add(seq, M_sym, walked)

    # ------------------------------------------------------------------ what became of states
    def admit(self, t, checkpoint, request, position, phase) -> None:
        seq = self._seqs.get(request.request_id)
        if seq is None:
            return
        d = self._depth(request, position)
        if d > len(seq):  # in an output the trace gave no symbols (hash blocks): no prefix anyone shares
            return
        self._ckpt[checkpoint] = (seq, d)
        self.trie.mark(seq, d, ALIVE, t)

    def _depth(self, r, position: int) -> int:
        """The symbol depth of a state at token ``position`` of ``r``'s sequence: on a hash-block
        trace the prompt's last block may be partial and the output's blocks follow it."""
        B = self.B
        if B == 1:
            return position
        tok_in = r.n_input_tokens(B)
        if position <= tok_in:
            return -(-position // B)
        return len(r.input_tokens) + -(-(position - tok_in) // B)

    def evict(self, t, checkpoint, position) -> None:
        where = self._ckpt.pop(checkpoint, None)
        if where is not None:
            self.trie.mark(where[0], where[1], HELD if self.running else EVICTED, t)

    def rejected(self, r, positions_tokens, t: float) -> None:
        """An insert of ``r`` found no room: the states it would have placed never existed."""
        seq = self._seqs.get(r.request_id)
        if seq is None:
            return
        for p in positions_tokens:
            if p // self.B <= len(seq):  # (past it: an output without symbols, as in ``admit``)
                self.trie.mark(seq, p // self.B, REJECTED, t)

    def speculative(self, r, positions_tokens, t: float) -> None:
        """Positions where the engine would keep a state but for speculative decoding."""
        seq = self._seqs.get(r.request_id)
        if seq is None:
            return
        for p in positions_tokens:
            if p // self.B <= len(seq):
                self.trie.mark(seq, p // self.B, SPECULATIVE, t)

    # ------------------------------------------------------------------ results
    def columns(self) -> dict[str, np.ndarray]:
        out = {f"miss_{c}": v for c, v in self.counts.items()}
        out["miss_evicted_at_s"] = self.evicted_at
        out["hit_after_preemption"] = self.after_preemption
        return out


__all__ = ["CAUSES", "MissLedger", "ShadowTrie"]
