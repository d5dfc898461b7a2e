"""LMDeploy preset against LMDeploy's own block-trie tests (``policies/lmdeploy.py``).

Sources: InternLM/lmdeploy ``tests/pytorch/paging/test_block_trie/test_checkpoint.py`` (stored
version 24d02506abc6) and ``test_checkpoint_lifecycle.py`` (27a2578b6869);
``lmdeploy/pytorch/paging/block_trie/checkpoint_lifecycle.py`` (24d02506abc6). The tests' fixture
block is 16 tokens; TINY's KV costs 2 B a token (32 B a block), a state 16 B.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from engine_cases import TINY, cat, lmdeploy_trie, one_per_session, run, state_depths, toks

from policies.base import PolicyError, get_preset
from policies.lmdeploy import anchor_step
from sim.cache.engine_tree import EngineTree
from traces.base import Request, Trace

B = 16


_trie = lmdeploy_trie


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
    _save(tree, ids[: 2 * B + 1], 2 * B + 1)
    blocks = _blocks(tree)
    _save(tree, ids[: 2 * B + 3], 2 * B + 3, t=2.0)
    assert state_depths(tree) == [2 * B + 3] and tree.states_replaced == 1
    assert _blocks(tree) == blocks == 3
    assert tree.lookup(np.array(ids[: 2 * B + 2])).hit_tokens == 0  # only 2B + 3 is left
    assert tree.lookup(np.array(ids[: 2 * B + 4])).hit_tokens == 2 * B + 3
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
    # (3 blocks of KV charged: 2 in the trie, 1 frozen); r1 = r0's first 32 tokens + 3 others
    # (no hit: it differs at token 32) saves 35 on the same anchor 32, replacing 33; r2 (32 + 4
    # of r1's) reuses 35, and its own end (36, anchor 32) is refused: the checkpoint it restores
    # is pinned (test_current_presets.py); r3 = r0's 36 tokens finds no 33 and replaces 35 with
    # 36. The engine (benchmarks/differential_lmdeploy.py, LMDeploy 1263d5cd8): 0, 0, 35, 0.
    # Outputs end inside the last block: nothing more is cached.
    r1, r2 = cat(toks(0, 32), toks(500, 3)), cat(toks(0, 32), toks(500, 4))
    trace = one_per_session(
        (toks(0, 33), toks(100, 5)), (r1, toks(200, 5)), (r2, toks(300, 5)), (toks(0, 36), toks(400, 5))
    )
    got, sim = run(trace, "lmdeploy", spec=TINY, block_size=16)
    assert got == [0, 0, 35, 0]
    assert state_depths(sim.tree) == [36] and sim.tree.states_replaced == 2
    assert sim.tree.kv_tokens + sim.tree.frozen_tokens == 3 * 16
    sim.tree.check_invariants()
    # the default block is 64: the same prompts sit inside the first block (anchor 0)
    got, sim = run(trace, "lmdeploy", spec=TINY)
    assert got == [0, 0, 35, 0] and sim.tree.kv_tokens + sim.tree.frozen_tokens == 64


def test_lmdeploy_evicts_frozen_partial_checkpoints_first():
    # One budget, block 64 (128 B a block, 16 B a state), 64-token forwards. r0 (100 + 5 tokens):
    # forwards end at 64 and 100, one anchor (64): the prompt-end checkpoint at 100 replaces the
    # one at 64. The trie keeps [0, 64), the frozen block [64, 100) (100 tokens + 28 = 256 B), a
    # state: 272 B. r1 (unrelated 70 + 5): admission needs its two blocks, one is free, so one goes,
    # frozen checkpoints first (``BlockTrie.evict``, block_trie/trie.py L634-L648): r0's at 100,
    # with the tail only it held (36 tokens), not r0's older trie block. Its blocks then fill the
    # freed room: its save at 70 finds no free block for its frozen copy (``_create_checkpoint``
    # takes it without evicting, checkpoint_lifecycle.py L397-L406; ``reserve_save`` L85-L88 saves
    # nothing) and r1 keeps its state at 64 on its one full block. r2 = r0's first 110 tokens: no
    # state on [0, 64) -> no hit; admission evicts one block, r1's (its state with it: the least
    # recent leaf; r0's block is on r2's path), the trie gives r0's block back (it holds it
    # already), so r2's save at 110 finds a free block for its frozen copy -- so the preset had it
    # while its insert guarded the path it walked. LMDeploy admits r2 one 64-token chunk at a time
    # (``kv_token_limit``, scheduler.py L140-L152, L580-L585; ``reserve_long_context_chunk``
    # L608-L628): the first chunk needs one block and one is free, so nothing goes; the trie gives
    # r0's block back (``BlockTrie.allocate``, trie.py L590-L597), the second chunk takes the free
    # block, its save at 64 is on the grid, and the save at 110 finds no free block. The harness
    # driving LMDeploy 1263d5cd8's own scheduler and trie (3 blocks of 64, 2 or 3 checkpoint rows)
    # gives 64 to each of the probes r0's 110 + 10, r1's 64 + 10 and r0's 64 + 10: r1's state at 64
    # and r2's at 64 stay, none at 110 (the guarded preset gave 110, 0, 0).
    trace = one_per_session((toks(0, 100), toks(100, 5)), (toks(500, 70), toks(600, 5)), (toks(0, 110), toks(0, 0)))
    got, sim = run(trace, "lmdeploy", spec=TINY, capacity=400, prefill_chunk_tokens=64)
    assert got == [0, 0, 0]
    st = sim.tree.stats
    assert (st.states_evicted, st.kv_tokens_evicted) == (1, 36)
    assert state_depths(sim.tree) == [64, 64]  # r1's and r2's; 110 never saved
    assert sim.tree.kv_tokens == 128 and sim.tree.used_bytes == 128 * 2 + 2 * 16
    sim.tree.check_invariants()


# ---------------------------------------------------------------------- hash-block traces
# Mooncake's 512-token blocks are coarser than LMDeploy's 64-token block; Bailian's 16 finer.
# Positions are symbols; a prompt's last block is partial, so its end (where LMDeploy checkpoints)
# is off both grids.
def _hash_trace(G, prompts):
    """One request per session at t = i: (hash ids, input tokens, output tokens); outputs are
    fresh negative symbols, as the hash-block loader gives them."""
    reqs, nxt = [], -1
    for i, (ids, n_in, n_out) in enumerate(prompts):
        n_sym_out = -(-n_out // G)
        out = np.arange(nxt, nxt - n_sym_out, -1, dtype=np.int64)
        nxt -= n_sym_out
        reqs.append(
            Request(
                session_id=i,
                turn=0,
                input_tokens=np.asarray(ids, dtype=np.int64),
                output_tokens=out,
                arrival=float(i),
                input_len=n_in,
                output_len=n_out,
            )
        )
    return Trace(f"hash{G}", reqs, block_tokens=G, closed_loop=False)


# a shared first block (a system prompt), then each prompt's own blocks, the last one partial
MOONCAKE_LIKE = [
    ([0, 10, 11], 1000 + 512, 90),
    ([0, 20], 900, 40),
    ([0, 30, 31, 32], 3 * 512 + 77, 300),
    ([0, 10, 11, 12], 3 * 512 + 500, 20),
    ([0, 40], 513, 700),
    ([0, 20, 21], 2 * 512 + 1, 64),
]


@pytest.mark.parametrize("policy", ["lmdeploy", "lmdeploy-0.16-pytorch"])
@pytest.mark.parametrize("mode", ["sequential", "des"])
def test_coarse_hash_blocks_never_exceed_the_capacity(policy, mode):
    """`marconi run --policy lmdeploy --trace mooncake:sample --capacity 5GB` on a hand-made
    Mooncake-like trace, at every capacity from one block and a state up: the insert's planned
    room (each new partial checkpoint's frozen block at its exact token) is what it charges, so the
    cache never goes over (the run used to stop with `capacity exceeded`), and the tree stays
    consistent (a frozen trim keeps whole symbols)."""
    trace = _hash_trace(512, MOONCAKE_LIKE)
    for capacity in range(64 * 2 + 16, 12000, 52):
        _, sim = run(trace, policy, spec=TINY, capacity=capacity, mode=mode)
        tree = sim.tree
        assert tree.stats.peak_bytes <= tree.capacity_bytes == capacity
        tree.check_invariants()


def test_coarse_hash_blocks_hit_the_chunk_checkpoints_only():
    """What LMDeploy checkpoints on 512-token hash blocks: prefill forward ends only (chunk ends,
    the prompt end). r1 shares r0's first 3 blocks (1536 tokens), where 512-token chunks end: r1
    hits 1536; r2, sharing only the first block, hits 512. With 8192-token chunks (the default)
    no forward ends inside the shared blocks and nothing hits (`lmdeploy` on mooncake:sample,
    where the shared prefix is mostly one 512-token block): the engine's own behaviour, the same
    on the same prompts cut into 16-token blocks."""
    prompts = [([0, 1, 2, 3], 3 * 512 + 100, 10), ([0, 1, 2, 9], 3 * 512 + 7, 10), ([0, 5], 600, 10)]
    for G, scale in ((512, 1), (16, 32)):
        expand = [([b * scale + j for b in ids for j in range(scale)][: -(-n // G)], n, o) for ids, n, o in prompts]
        trace = _hash_trace(G, expand)
        got, sim = run(trace, "lmdeploy", spec=TINY, prefill_chunk_tokens=512)
        assert got == [0, 1536, 512], G
        sim.tree.check_invariants()
        got, _ = run(trace, "lmdeploy", spec=TINY)
        assert got == [0, 0, 0], G


@pytest.mark.parametrize(("chunk", "hits", "states"), [(896, [0, 896], [896, 1010]), (976, [0, 0], [1010])])
def test_bailian_blocks_keep_the_engine_grid(chunk, hits, states):
    """Bailian's 16-token blocks are finer than the 64-token block: anchors and frozen blocks are
    the engine's, at each state's exact token. r0: a 1020-token prompt (64 symbols, the last one
    12 tokens), r1 shares its first 63 symbols (1008 tokens) and ends at 1010. 896-token chunks:
    r0 checkpoints at 896 (anchor 896) and 1020 (anchor 960), r1 hits 896 and its prompt end at
    1010 replaces r0's 1020 on the shared anchor 960. 976-token chunks: r0's 976 and 1020 share
    anchor 960, so 1020 replaces 976 within the insert (1020 taken as 64 x 16 = 1024 would have
    anchored it on 1024 and kept both) and r1 hits nothing. In des mode, which inserts the
    prompt at prefill end (sequential mode's one insert of input + output places the prompt-end
    state at the end of its symbol, 1024, as every preset's on a hash-block trace)."""
    ids = list(range(64))
    trace = _hash_trace(16, [(ids, 1020, 5), (ids[:63] + [777], 1010, 5)])
    got, sim = run(trace, "lmdeploy", spec=TINY, prefill_chunk_tokens=chunk, mode="des", scheduler="fcfs")
    assert got == hits
    assert state_depths(sim.tree) == states and sim.tree.frozen_tokens == 1024 - 1010
    sim.tree.check_invariants()


def test_a_decode_interval_off_the_hash_blocks_is_refused():
    trace = _hash_trace(512, MOONCAKE_LIKE)
    with pytest.raises(
        PolicyError,
        match=r"^policy lmdeploy checkpoints decode every 64 tokens "
        r"\(--prefix-cache-decode-state-interval\), finer than \(or not a multiple of\) "
        r"the trace's 512-token blocks$",
    ):
        run(trace, "lmdeploy", spec=TINY, prefix_cache_decode_state_interval=64)
    run(trace, "lmdeploy", spec=TINY, prefix_cache_decode_state_interval=1024)


def _preset_trie(policy, states=4, kv_blocks=64):
    """LMDeploy's block trie on the tiny model (``lmdeploy_trie``'s sizes, block 16) with the
    engine rules and eviction of ``policy``'s preset."""
    preset = get_preset(policy)
    return EngineTree(
        capacity_bytes=kv_blocks * B * 2 + states * 16,
        kv_bytes_per_token=2,
        state_bytes=16,
        block_tokens=1,
        policy=preset.eviction_cls(),
        state_capacity=states,
        rules=preset.engine_rules(TINY, SimpleNamespace(block_size=B)),
    )


@pytest.mark.parametrize(("policy", "blocks"), [("lmdeploy", 5), ("lmdeploy-0.16-pytorch", 4 + (B - 1) / B)])
def test_lmdeploy_a_state_inside_a_block_owns_a_whole_block_once_the_path_goes_on(policy, blocks):
    """Rule 6 of the differential (benchmarks/results/2026-12-06-differential-lmdeploy-mooncake):
    ``_create_checkpoint`` allocates one block for a checkpoint off the block grid
    (lmdeploy/pytorch/paging/block_trie/checkpoint_lifecycle.py L404-L406, LMDeploy 1263d5cd8),
    and once the sequence fills that block ``_extend_trie_path`` gives the trie its own copy
    (block_trie/trie.py L557-L590): a state at 2B + 1 on a path that goes on to 4B holds four trie
    blocks and a whole frozen one, five. Alone on a leaf it holds the pad (two trie blocks and
    the frozen one). ``lmdeploy-0.16-pytorch`` keeps charging only the pad (B - 1 tokens)."""
    tree = _preset_trie(policy)
    ids = list(range(1, 4 * B + 1))
    _save(tree, ids[: 2 * B + 1], 2 * B + 1)
    assert _blocks(tree) == 3
    tree.check_invariants()
    tree.set_time(2.0)
    assert tree.insert(np.asarray(ids, dtype=np.int64), 4 * B, [], 2.0).inserted
    assert tree.n_states == 1 and _blocks(tree) == blocks
    tree.check_invariants()
    # the path past the state goes (its leaf evicted): the state's block is the pad again
    tree.set_time(3.0)
    leaf = [n for n in tree.iter_nodes() if n is not tree.root and not n.children][0]
    assert leaf.depth_tokens == 4 * B and not leaf.has_state
    while leaf.parent is not None:  # ``lmdeploy``: a block at a time
        tree.evict(leaf)
    assert tree.n_states == 1 and _blocks(tree) == 3
    tree.check_invariants()


def _seq(start, n):
    return np.arange(start, start + n, dtype=np.int64)


@pytest.mark.parametrize(("policy", "kv_left"), [("lmdeploy", 3 * B), ("lmdeploy-0.16-pytorch", 0)])
def test_lmdeploy_evicts_a_leaf_one_block_at_a_time(policy, kv_left):
    """LMDeploy's KV leaf eviction frees one trie block per turn, the least recent leaf block,
    and the parent becomes a candidate only once its last child is gone
    (lmdeploy/pytorch/paging/block_trie/kv_lifecycle.py L131-L139, LMDeploy 1263d5cd8); the
    checkpoint anchored on an evicted block goes with it (``release_checkpoint(leaf)``, L89). So
    one block of KV pressure on a four-block path whose state sits at its end (4B, anchored on
    the last block) frees that block and the state and keeps three blocks; the earlier preset
    evicts the whole leaf."""
    tree = _preset_trie(policy)
    tree.set_time(1.0)
    assert tree.insert(_seq(1, 4 * B), 4 * B, [4 * B], 1.0).inserted
    tree.set_time(2.0)
    assert tree.evict_kv(1) >= B
    assert tree.n_states == 0 and tree.kv_tokens == kv_left
    tree.check_invariants()


@pytest.mark.parametrize(
    ("policy", "evicted", "kv_left"), [("lmdeploy", 3 * B, 8 * B), ("lmdeploy-0.16-pytorch", 0, 8 * B)]
)
def test_lmdeploy_admission_makes_room_for_the_prompt_from_the_restored_block_on(policy, evicted, kv_left):
    """LMDeploy's SSM admission frees ``num_required_blocks`` before the forward
    (``_evict_for_ssm``, lmdeploy/pytorch/paging/eviction_helper/recompute_eviction_helper.py
    L69-L118): every block of the prompt past the blocks the sequence restored
    (block_manager/default_block_manager.py L26-L34), those the trie already holds included
    (``_extend_trie_path`` deduplicates them afterwards, block_trie/trie.py L557-L590). Eight
    blocks; X (three blocks) lost its state, Y and W hold two each (one block free). Z = X + one
    block, no hit: the engine frees three blocks first, the least recent leaf blocks the trie
    alone holds (ref count 1, ``KVBlockLifecycle.evict``, block_trie/kv_lifecycle.py L80-L83,
    L118-L123), X's own three (Z holds none of them: no checkpoint restored), and Z then holds four
    new blocks: Y and W stay whole. (The preset once guarded the path Z's insert walked and took Y
    and W's last block instead; the harness driving LMDeploy 1263d5cd8's own scheduler and trie on
    X, Y, W, V (16 tokens), Z, then W + 8 tokens, 8 blocks of 16 and 3 checkpoint rows, gives W's
    probe 32: W's state stayed.) The earlier preset evicts nothing. The simulation tells the tree
    ``(hit, prompt tokens)`` before a request's sequential insert (``admitting``)."""
    tree = _preset_trie(policy, kv_blocks=8)
    x = _seq(1000, 3 * B)
    for t, seq in ((1.0, x), (2.0, _seq(2000, 2 * B)), (3.0, _seq(3000, 2 * B))):
        tree.set_time(t)
        assert tree.insert(seq, len(seq), [len(seq)], t).inserted
    tree.set_time(3.5)
    assert tree.evict_states(1) == 1  # X's (the least recent)
    assert tree.kv_tokens == 7 * B and tree.n_states == 2
    z = np.concatenate([x, _seq(4000, B)])
    tree.set_time(4.0)
    if tree.admit_from_anchor:
        tree.admitting = (0, len(z))
    res = tree.insert(z, len(z), [len(z)], 4.0)
    assert res.inserted and res.evicted_kv_tokens == evicted
    assert tree.kv_tokens == kv_left and tree.admitting is None
    assert tree.lookup(_seq(2000, 2 * B)).match_tokens == 2 * B  # Y stays
    assert tree.lookup(_seq(3000, 2 * B)).match_tokens == 2 * B  # W stays
    tree.check_invariants()


def test_lmdeploy_admission_falls_back_to_the_insert_when_the_prompt_cannot_be_freed():
    """Where the prompt's blocks cannot all be freed (the cached ones on its own path are held by
    a running request: ref count 2, not a victim, ``KVBlockLifecycle._try_evict_leaf``,
    block_trie/kv_lifecycle.py L80-L83), the insert still goes in with the room it adds, counted
    once, not rejected: the trie gives those blocks back (trie.py L590-L597)."""
    tree = _preset_trie("lmdeploy", kv_blocks=4)
    x = _seq(1000, 3 * B)
    tree.set_time(1.0)
    held = tree.insert(x, len(x), [len(x)], 1.0).end_node
    tree.set_time(1.5)
    assert tree.evict_states(1) == 1
    tree.lock(held)
    z = np.concatenate([x, _seq(4000, B)])
    tree.set_time(2.0)
    tree.admitting = (0, len(z))
    inserts, rejected = tree.stats.inserts, tree.stats.rejected_inserts
    assert tree.insert(z, len(z), [len(z)], 2.0).inserted
    assert tree.stats.inserts == inserts + 1 and tree.stats.rejected_inserts == rejected
    assert tree.kv_tokens == 4 * B and tree.admitting is None
    tree.unlock(held)
    tree.check_invariants()


def test_lmdeploy_admission_fallback_reports_what_the_failed_attempt_evicted():
    """The admission's evictions stay done where it cannot free all it needs, and the insert
    reports them with its own: Y (one block) goes while the prompt's blocks are being freed, X's
    blocks on Z's path cannot (a running request holds them: ref count 2, not a victim,
    block_trie/kv_lifecycle.py L80-L83), and Z goes in with the room that is left; Y's block is
    counted as evicted once. (With X's blocks the trie's alone, they go too, the least recent
    leaf blocks, kv_lifecycle.py L118-L123.)"""
    tree = _preset_trie("lmdeploy", kv_blocks=5)
    y, x = _seq(2000, B), _seq(1000, 3 * B)
    ends = []
    for t, seq in ((0.5, y), (1.0, x)):
        tree.set_time(t)
        res = tree.insert(seq, len(seq), [len(seq)], t)
        assert res.inserted
        ends.append(res.end_node)
    tree.set_time(1.5)
    assert tree.evict_states(1) == 1  # Y's state (the least recent); its block stays
    tree.lock(ends[1])
    z = np.concatenate([x, _seq(4000, B)])
    tree.set_time(2.0)
    tree.admitting = (0, len(z))
    res = tree.insert(z, len(z), [len(z)], 2.0)
    assert res.inserted and res.evicted_kv_tokens == B
    assert tree.lookup(y).match_tokens == 0 and tree.kv_tokens == 4 * B
    tree.unlock(ends[1])
    tree.check_invariants()


# ---------------------------------------------------------------------- session 16 (issue 43)
# Rules 7, 10-12 of benchmarks/results/2026-12-06-differential-s16: each trace's hits are the ones
# ``benchmarks/differential_lmdeploy.py``'s harness gives driving LMDeploy 1263d5cd8's own
# scheduler and block trie (block 16, the tiny model's bytes: 32 B a block, 16 B a state).


def _pools(blocks, states=4):
    return {"capacity": blocks * B * 2 + states * 16, "state_pool": str(states), "block_size": B}


def test_lmdeploy_a_path_parting_inside_a_block_holds_its_own_copy_of_it():
    """Rule 7: the trie keys a node by a full block (``_extend_trie_path``, block_trie/trie.py
    L545-L598), so two paths that part inside a block each hold a whole copy of it and the
    shared tokens above hold none (``EngineRules.block_copies``, ``EngineTree._node_pad``). Four
    32-token prompts share their first 13 tokens: eight blocks, where the radix tree's tokens (89)
    fill 5.6; with eight blocks in the pool P1's state is gone when P1 + 8 comes and it reuses
    nothing (the harness: 0, 0, 0, 0, 32, 0; counting the shared tokens once: ..., 32, 32)."""
    T = toks(0, 13)
    P = [cat(T, toks(100 * (k + 1), 19)) for k in range(4)]
    outs = [toks(5000 + 100 * k, 1) for k in range(6)]
    trace = one_per_session(*zip([*P, cat(P[0], toks(900, 8)), cat(P[1], toks(910, 8))], outs))
    got, sim = run(trace, "lmdeploy", spec=TINY, **_pools(8))
    assert got == [0, 0, 0, 0, 32, 0]
    sim.tree.check_invariants()
    tree = _preset_trie("lmdeploy")
    for k, p in enumerate(P[:2]):
        _save(tree, p, len(p), 1.0 + k)
    assert tree.kv_tokens == 32 + 19 and tree.kv_bytes == 4 * B * 2  # two blocks each
    tree.check_invariants()


def test_lmdeploy_a_save_takes_its_frozen_block_only_from_free_blocks():
    """Rule 10: a checkpoint off the block grid needs a frozen block, which ``_create_checkpoint``
    allocates without evicting (block_trie/checkpoint_lifecycle.py L397-L406); with none free it
    raises ``MemoryError`` and ``reserve_save`` saves nothing (L85-L88), after the admission freed
    only the prompt's blocks (``_evict_for_ssm``). Six blocks: A (40: two trie blocks and a frozen
    one), then B (40): its three blocks take the three free ones, its save finds none, so B + 8
    reuses nothing; A's state stays. The preset made room for B's frozen block too (A's went) and
    gave 0, 0, 40, 0; the harness gives 0, 0, 0, 0 (seven blocks: 0, 0, 40, 40 on both sides)."""
    A, Bq = toks(0, 40), toks(500, 40)
    trace = one_per_session(
        (A, toks(5000, 1)),
        (Bq, toks(5100, 1)),
        (cat(Bq, toks(600, 8)), toks(5200, 1)),
        (cat(A, toks(700, 8)), toks(5300, 1)),
    )
    for blocks, hits in ((6, [0, 0, 0, 0]), (7, [0, 0, 40, 40])):
        got, sim = run(trace, "lmdeploy", spec=TINY, **_pools(blocks))
        assert got == hits
        sim.tree.check_invariants()


def test_lmdeploy_the_decode_evicts_for_the_blocks_the_sequence_holds():
    """Rule 11: admission makes room for the prompt's blocks from the restored one on, cached ones
    counted; ``_finish_admission`` then gives back those the trie holds already (``BlockTrie.allocate``
    after ``block_manager.allocate``, scheduler.py L451-L453; block_trie/trie.py L590-L597, none
    after a hit off the block grid, L394-L399), the save takes a free block, and the decode evicts
    for its own blocks, its partial last one included (``evict_for_seq``), which the tree does not
    keep. Eight blocks: Y and W (two each), Z (48 tokens, 25 output: 72 tokens, five blocks) finds
    four free, takes three for its prompt and evicts one for its decode: Y's last block with Y's
    state, so Y + 8 reuses nothing (the harness: 0, 0, 0, 0, 0; the preset made room for the
    four whole blocks it keeps: ..., 32, 0). With 17 output tokens (64: four blocks) nothing goes."""
    Y, W, Z = toks(0, 32), toks(300, 32), toks(600, 48)
    for out, hits in ((25, [0, 0, 0, 0, 0]), (17, [0, 0, 0, 32, 0])):
        trace = one_per_session(
            (Y, toks(5000, 1)),
            (W, toks(5100, 1)),
            (Z, toks(5200, out)),
            (cat(Y, toks(700, 8)), toks(5300, 1)),
            (cat(W, toks(800, 8)), toks(5400, 1)),
        )
        got, sim = run(trace, "lmdeploy", spec=TINY, **_pools(8))
        assert got == hits
        sim.tree.check_invariants()


def test_lmdeploy_the_decode_evicts_the_requests_own_new_checkpoint_first():
    """Rule 12: the decode's eviction takes frozen checkpoints first, least recent first
    (``BlockTrie.evict``, block_trie/trie.py L634-L648), the request's own, just saved, among them:
    where no other is left, its own goes before any trie block. Eight blocks: X (48) and W (32)
    hold five; R (X's first 32 tokens and 8 more, 40 output tokens) saves at 40 (a frozen block) and
    its decode needs one block more: its own checkpoint goes, so W + 8 and X + 8 reuse 32 and 48
    (the harness: 0, 0, 0, 32, 48). Rules 10-11 without this one gave up X's last block: ..., 0, 0."""
    X, W = toks(0, 48), toks(300, 32)
    trace = one_per_session(
        (X, toks(5000, 1)),
        (W, toks(5100, 1)),
        (cat(toks(0, 32), toks(800, 8)), toks(5150, 40)),
        (cat(W, toks(600, 8)), toks(5200, 1)),
        (cat(X, toks(700, 8)), toks(5300, 1)),
    )
    got, sim = run(trace, "lmdeploy", spec=TINY, **_pools(8, 3))
    assert got == [0, 0, 0, 32, 48]
    sim.tree.check_invariants()


@pytest.mark.parametrize(("blocks", "out"), [(5, 2), (6, 20), (7, 40)])
def test_lmdeploy_admission_evicts_the_cached_path_past_the_restored_blocks(blocks, out):
    """Rule 13: LMDeploy's admission frees the prompt's blocks from the least recent leaf blocks
    the trie alone holds (ref count 1, ``KVBlockLifecycle.evict``, block_trie/kv_lifecycle.py
    L80-L83, L118-L123); a request holds only the blocks it restored (``_apply_state_checkpoint_hit``,
    block_trie/trie.py L384-L386), so the cached path past its hit is a victim like any other
    (``EngineTree._admit``). R (X's first 32 tokens and 8 more) restores nothing: X's blocks, the
    least recent, go for R's, and R's insert adds the ones it shares again; W, saved after X, keeps
    its state, so W + 8 reuses 32. The preset that guarded the path R's insert walked took W's
    blocks instead (0 for W + 8 on each of these pools). The harness driving LMDeploy 1263d5cd8's
    own scheduler and trie: 0, 0, 0, 32, 0 on 5, 6 and 7 blocks of 16, 3 checkpoint rows."""
    X, W = toks(0, 48), toks(300, 32)
    trace = one_per_session(
        (X, toks(5000, 1)),
        (W, toks(5100, 1)),
        (cat(toks(0, 32), toks(800, 8)), toks(5150, out)),
        (cat(W, toks(600, 8)), toks(5200, 1)),
        (cat(X, toks(700, 8)), toks(5300, 1)),
    )
    got, sim = run(trace, "lmdeploy", spec=TINY, **_pools(blocks, 3))
    assert got == [0, 0, 0, 32, 0]
    sim.tree.check_invariants()


def test_lmdeploy_continuous_insert_that_evicts_its_own_paths_checkpoint_stays_within_capacity():
    """A checkpoint on a running path where no lock ends is a victim (``Lmdeploy016Eviction.keys``):
    a running request's insert under ``--scheduler continuous`` evicted the
    checkpoint at 256 tokens on its own path and added it back, 122112 bytes in a 119896-byte cache
    (the capacity assertion, found by a seeded random search of ``marconi run``); the room is now
    counted again after such a victim (``HybridRadixTree._grown``) and the run ends."""
    from click.testing import CliRunner

    from sim.cli import main

    trace = (
        "synthetic:agent:sessions=2,turns=7,prompt_tokens=473,task_tokens=126,output_tokens=30,obs_tokens=103,prompts=1"
    )
    args = ["run", "--model", "replay-tiny", "--trace", trace, "--trace-seed", "9", "--policy", "lmdeploy"]
    args += ["--capacity", "135KB", "--scheduler", "continuous", "--max-num-batched-tokens", "64"]
    args += ["--max-num-seqs", "3", "--sessions-per-second", "100", "--no-progress"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, (res.output, res.exception)
    assert "lmdeploy" in res.output
