"""Exact values that pin three rules of ``sim/cache/engine_tree.py`` the other tests left open
(mutants of ``benchmarks/mutation.py`` seed 0, module ``engine_tree``, survived them).

Tree-level cases as in ``tests/policies/test_vllm_block_pool.py``: 1 byte of KV per token,
4-byte states, vLLM's free queue (``VllmFreeQueueEviction``), one time step per call.
"""

from __future__ import annotations

import numpy as np

from policies.base import EngineRules
from policies.vllm_current import VllmFreeQueueEviction
from sim.cache.engine_tree import EngineTree


class _Pool:
    def __init__(self, capacity: int, *, block_tokens: int = 1):
        self.t = 0.0
        self.B = block_tokens
        self.tree = EngineTree(
            EngineRules(duplicate_kv=True),
            capacity_bytes=capacity,
            kv_bytes_per_token=1,
            state_bytes=4,
            block_tokens=block_tokens,
            policy=VllmFreeQueueEviction(),
        )

    def tick(self) -> float:
        self.t += 1
        return self.tree.set_time(self.t)

    def insert(self, ids, states) -> None:
        seq = np.array(ids, dtype=np.int64)
        now = self.tick()
        res = self.tree.insert(seq, len(seq) * self.B, states, now)
        assert res.inserted
        self.tree.refresh_inserted(res, now, final=True)

    def lookup(self, ids):
        return self.tree.lookup(np.array(ids, dtype=np.int64), now=self.tick())


def test_caching_recomputed_kv_again_evicts_at_once_when_over_capacity():
    """vLLM's ``duplicate_kv`` rule (``BlockHashToBlockMap.insert``, ``block_pool.py`` L78-L82):
    the KV a request recomputes past its hit is cached a second time, and the room for those new
    blocks is made right then, from the oldest entries of the free queue. 18 bytes: A = tokens
    1..6 with a state at 2 (6 + 4 = 10 bytes); B looks up 1..8 (hit 2, match 6), then caches
    1..8 with a state at 8 (+2 KV + 4 = 16 bytes); cache_again adds copies of tokens 3..6 (4
    bytes: 20 > 18), so the two oldest entries go at once: two older copies (t = 1, copies first
    at equal recency), leaving 2 copy tokens, 18 bytes, and the tree whole (B's hit 8)."""
    c = _Pool(capacity=18)
    c.insert([1, 2, 3, 4, 5, 6], [2])
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    assert (m.hit_tokens, m.match_tokens) == (2, 6)
    c.insert([1, 2, 3, 4, 5, 6, 7, 8], [8])
    assert c.tree.used_bytes == 16
    c.tree.cache_again(m)
    assert (c.tree.copy_tokens, c.tree.used_bytes) == (2, 18)
    assert c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9]).hit_tokens == 8
    c.tree.check_invariants()


def test_evicting_an_older_copy_frees_its_whole_block():
    """An older KV copy holds one block (``block_tokens`` tokens); evicting it frees all of them.
    2-token blocks, 19 bytes: A = blocks [1, 2, 3] (6 tokens) with a state after block 1 (10
    bytes); B looks up [1, 2, 3, 4] (hit 2 tokens, match 6), caches [1, 2, 3, 4] with a state at
    its end (+2 KV + 4 = 16 bytes); cache_again adds copies of blocks 2 and 3 (4 tokens: 20 > 19),
    so one copy goes, 2 tokens: 2 copy tokens, 18 bytes (a copy freeing 1 token would stop at
    3 copy tokens and 19 bytes)."""
    c = _Pool(capacity=19, block_tokens=2)
    c.insert([1, 2, 3], [1])
    m = c.lookup([1, 2, 3, 4])
    assert (m.hit_tokens, m.match_tokens) == (2, 6)
    c.insert([1, 2, 3, 4], [4])
    assert c.tree.used_bytes == 16
    c.tree.cache_again(m)
    assert (c.tree.copy_tokens, c.tree.used_bytes) == (2, 18)
    assert c.lookup([1, 2, 3, 4, 5]).hit_tokens == 8
    c.tree.check_invariants()


def _trtllm_tree_hit(children: int) -> tuple[int, int]:
    """``children`` 64-token prompts sharing their first 20 tokens, each with snapshots at 20 and
    64 (TensorRT-LLM's 32-token radix blocks, KV kept to the last snapshot): the first block
    (0, 32] has ``children`` distinct paths. Returns a lookup's (hit, match) for the shared 20
    tokens followed by two new ones."""
    t = EngineTree(
        EngineRules(kv_extent="state", snapshot_block=32),
        capacity_bytes=10**6,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=1,
        policy=VllmFreeQueueEviction(),
    )
    for k in range(children):
        now = t.set_time(k + 1.0)
        seq = np.array([*range(20), *range(1000 + 100 * k, 1044 + 100 * k)], dtype=np.int64)
        res = t.insert(seq, 64, [20, 64], now)
        assert res.inserted
        t.refresh_inserted(res, now, final=True)
    m = t.lookup(np.array([*range(20), 9, 9], dtype=np.int64), now=t.set_time(100.0))
    t.check_invariants()
    return m.hit_tokens, m.match_tokens


def test_trtllm_snapshot_inside_a_partly_matched_block_needs_fewer_than_32_children():
    """TensorRT-LLM's partial match (``_block_radix_tree.py``
    ``find_best_partial_match_in_next_nodes``, stored version 065ff9e9 L291-L310: ``if
    len(block.next) >= 32: return None, 0``): the snapshot at 20 lies inside the block (0, 32]
    the lookup matches only 20 tokens of, so it is reached with 31 children under the root (hit
    20) and not with 32 (hit 0, the KV match still 20)."""
    assert _trtllm_tree_hit(31) == (20, 20)
    assert _trtllm_tree_hit(32) == (0, 20)
