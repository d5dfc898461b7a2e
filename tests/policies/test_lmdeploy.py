"""LMDeploy preset against LMDeploy's own block-trie tests (``policies/lmdeploy.py``).

Sources: InternLM/lmdeploy ``tests/pytorch/paging/test_block_trie/test_checkpoint.py`` (stored
version 24d02506abc6) and ``test_checkpoint_lifecycle.py`` (27a2578b6869);
``lmdeploy/pytorch/paging/block_trie/checkpoint_lifecycle.py`` (24d02506abc6). The tests' fixture
block is 16 tokens; TINY's KV costs 2 B a token (32 B a block), a state 16 B.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import TINY, one_per_session, run, state_depths, toks

from policies.base import EngineRules
from policies.lmdeploy import LMDEPLOY_REFRESH, TieredLRUEviction, anchor_step
from sim.cache.engine_tree import EngineTree

B = 16


def _trie(states=None, kv_blocks=64):
    cap = kv_blocks * B * 2 + (states or 0) * 16
    return EngineTree(capacity_bytes=cap, kv_bytes_per_token=2, state_bytes=16, block_tokens=1,
                      policy=TieredLRUEviction(), state_capacity=states,
                      rules=EngineRules(refresh=LMDEPLOY_REFRESH, kv_extent="blocks", extent_block=B, frozen_block=B,
                                        anchor_block=B, state_pool=True))


def _save(tree, ids, step, t=1.0):
    """A sequence ``ids`` whose prefill ends at ``step`` (a checkpoint there)."""
    tree.set_time(t)
    seq = np.asarray(ids, dtype=np.int64)
    assert tree.insert(seq, len(seq), [step], t).inserted


def _blocks(tree):
    return (tree.kv_tokens + tree.frozen_tokens) / B


@pytest.mark.parametrize(("step", "anchor"), [(1, 0), (15, 0), (16, 16), (17, 16), (32, 32)])
def test_checkpoint_step_geometry(step, anchor):
    """LMDeploy test_checkpoint.py::test_checkpoint_step_geometry (block 16)."""
    assert anchor_step(step, B) == anchor


def test_ssm_checkpoint_save_owns_and_releases_partial_tail():
    """LMDeploy test_checkpoint_lifecycle.py::test_ssm_checkpoint_save_owns_and_releases_partial_tail:
    a checkpoint at 2B + 1 takes one state slot and one frozen KV block; releasing it gives both
    back (the two full blocks stay in the trie)."""
    tree = _trie(states=4)
    _save(tree, [1] * (2 * B + 1), 2 * B + 1)
    assert tree.n_states == 1 and _blocks(tree) == 3  # two trie blocks + the frozen one
    assert tree.evict_states(1) == 1
    assert tree.n_states == 0 and _blocks(tree) == 2 and tree.kv_tokens == 2 * B
    tree.check_invariants()


def test_ssm_checkpoint_replaces_partial_variant_at_same_anchor():
    """LMDeploy test_checkpoint_lifecycle.py::test_ssm_checkpoint_replaces_partial_variant_at_same_anchor:
    checkpoints at 2B + 1, then 2B + 3 of the same sequence: one anchor (2B), so the second
    replaces the first, and the frozen block is reused (no new block)."""
    tree = _trie(states=4)
    ids = [1] * (2 * B + 5)
    _save(tree, ids[:2 * B + 1], 2 * B + 1)
    blocks = _blocks(tree)
    _save(tree, ids[:2 * B + 3], 2 * B + 3, t=2.0)
    assert state_depths(tree) == [2 * B + 3] and tree.states_replaced == 1
    assert _blocks(tree) == blocks == 3
    assert tree.lookup(np.array(ids[:2 * B + 2])).hit_tokens == 0  # only 2B + 3 is left
    assert tree.lookup(np.array(ids[:2 * B + 4])).hit_tokens == 2 * B + 3
    tree.check_invariants()


def test_kv_pressure_evicts_unpinned_frozen_tail():
    """LMDeploy test_checkpoint_lifecycle.py::test_kv_pressure_evicts_unpinned_frozen_tail: a
    one-token sequence's checkpoint (anchored at the root) is a frozen block; KV pressure for one
    block evicts it first and frees that block."""
    tree = _trie(states=4)
    _save(tree, [1], 1)
    assert _blocks(tree) == 1 and tree.n_states == 1
    tree.set_time(2.0)
    assert tree.evict_kv(1) == B
    assert _blocks(tree) == 0 and tree.n_states == 0
    tree.check_invariants()


def test_ssm_checkpoint_save_evicts_unpinned_state_only():
    """LMDeploy test_checkpoint_lifecycle.py::test_ssm_checkpoint_save_evicts_unpinned_state_only:
    one checkpoint slot; A (two blocks) is published; B's checkpoint takes A's slot, A's node and
    KV stay. A + [3] then misses, B + [3] hits two blocks."""
    tree = _trie(states=1)
    a, b = [1] * (2 * B), [2] * (2 * B)
    _save(tree, a, 2 * B)
    _save(tree, b, 2 * B, t=2.0)
    assert tree.n_states == 1 and tree.kv_tokens == 4 * B  # A's KV kept
    assert tree.lookup(np.array(a + [3])).hit_tokens == 0
    assert tree.lookup(np.array(b + [3])).hit_tokens == 2 * B
    tree.check_invariants()


def test_match_ssm_partial_checkpoint_uses_private_destination():
    """LMDeploy test_checkpoint.py::test_match_ssm_partial_checkpoint_uses_private_destination
    (hit part): a partial checkpoint (0 or 1 full blocks + 1, or 1 block + B - 1) is reused at its
    exact step by a sequence that extends it."""
    for full, rem in ((0, 1), (1, 1), (1, B - 1)):
        step = full * B + rem
        ids = list(range(step))
        tree = _trie(states=4)
        _save(tree, ids, step)
        assert tree.lookup(np.array(ids + [999])).hit_tokens == step


def test_lmdeploy_preset_block_from_config_and_anchor_replacement():
    # --block-size 16 (the engine's block_size). r0: a 33-token prompt (2B + 1), checkpoint at 33
    # (3 blocks of KV charged: 2 in the trie, 1 frozen); r1 extends it to 35 tokens: it reuses 33
    # and its own checkpoint at 35 replaces 33 on anchor 32. Outputs end inside the last block:
    # nothing more is cached.
    trace = one_per_session((toks(0, 33), toks(100, 5)), (toks(0, 35), toks(200, 5)), (toks(0, 36), toks(300, 5)))
    got, sim = run(trace, "lmdeploy", spec=TINY, block_size=16)
    assert got == [0, 33, 35]
    assert state_depths(sim.tree) == [36] and sim.tree.states_replaced == 2
    assert sim.tree.kv_tokens + sim.tree.frozen_tokens == 3 * 16
    sim.tree.check_invariants()
    # the default block is 64: the same prompts sit inside the first block (anchor 0)
    got, sim = run(trace, "lmdeploy", spec=TINY)
    assert got == [0, 33, 35] and sim.tree.kv_tokens + sim.tree.frozen_tokens == 64


def test_lmdeploy_evicts_frozen_partial_checkpoints_first():
    # One budget, block 64, 64-token forwards. r0 (100 + 5 tokens): forwards end at 64 and 100,
    # one anchor (64): the prompt-end checkpoint at 100 replaces the one at 64. The trie keeps
    # [0, 64), the frozen block [64, 100): 100 tokens + 28 (frozen up to 128) = 256 B, a state:
    # 272 B. r1 (unrelated 10 + 5): a frozen checkpoint at 10 (anchor 0): 10 + 54 tokens + a
    # state = 144 B -> 416 > 400: r0's frozen checkpoint at 100 goes first, with the tail only
    # it held (36 tokens + 28 frozen + the state = 144 B), not r0's older trie block: 272 B.
    # r2 = r0's first 110 tokens: [0, 64) has no state -> no hit; its checkpoint at 110 (again
    # replacing its own at 64): 46 + 18 tokens + a state = 144 B -> 416 > 400: r1's frozen
    # checkpoint (t1) goes, and its whole 10-token tail with it.
    trace = one_per_session((toks(0, 100), toks(100, 5)), (toks(500, 10), toks(510, 5)),
                            (toks(0, 110), toks(0, 0)))
    got, sim = run(trace, "lmdeploy", spec=TINY, capacity=400, prefill_chunk_tokens=64)
    assert got == [0, 0, 0]
    st = sim.tree.stats
    assert (st.states_evicted, st.kv_tokens_evicted) == (2, 36 + 10)
    assert state_depths(sim.tree) == [110]  # 64 never made it: one insert keeps one state per anchor
    assert sim.tree.kv_tokens == 110 and sim.tree.used_bytes == (110 + 18) * 2 + 16
    sim.tree.check_invariants()
