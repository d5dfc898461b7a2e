"""``trtllm`` with a state pool (``--state-pool``): TensorRT-LLM's V2 storage manager keeps
attention KV pages and recurrent-state pages in two pool groups, each with its own LRU queue of the
committed pages no request holds, and evicts only from the group short of slots
(NVIDIA/TensorRT-LLM ``tensorrt_llm/runtime/kv_cache_manager_v2/_eviction_controller/
_eviction_controller.py`` ``PerLevelEvictionController``, C++ twin
``cpp/tensorrt_llm/batch_manager/kv_cache_manager_v2/evictionController.cpp``
``PerLevelEvictionController::evict``; ``_storage_manager.py`` ``_prepare_free_slots``). Hand-worked
on tiny traces: end offset 0 puts one state at each prompt's end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_cases import TINY, arrivals, cat, one_per_session, run, state_depths, toks

from policies.base import EngineRules
from policies.vllm_current import VllmFreeQueueEviction
from sim.cache.engine_tree import EngineTree
from sim.errors import UsageError

END0 = {"additional_snapshot_offsets_from_end": "0"}


def test_state_pressure_evicts_the_least_recently_used_state_with_its_leaf():
    """Three recurrent pages, one of them the running request's live state (two for the cache).
    r2 hits A's state (the request holds the matched snapshot until
    ``resume`` copies it, then releases it: it goes to the back of the queue, ``_kv_cache.py``
    ``_setup_for_reuse``), so when r2's own state needs a page B's is the oldest and goes; B is a
    leaf, so its block goes too (``_block_radix_tree.py`` ``clear_stale_blocks_after_page_unlink``
    at 065ff9e9, L572-L597: a block left without a recurrent page and without children is
    detached, then each ancestor so left). One budget keeps all three."""
    A, B = toks(0, 64), toks(1000, 64)
    trace = one_per_session(
        (A, toks(5000, 4)),
        (B, toks(5100, 4)),
        (cat(A, toks(2000, 32)), toks(5200, 4)),  # hits A's state (64)
        (cat(B, toks(3000, 32)), toks(5300, 4)),  # B's state is gone
    )
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="3", **END0)
    assert got == [0, 0, 64, 0]
    # r3's state then needs a page: A's (refreshed as r2 resumed from it) entered the queue before
    # r2's own snapshot at 96, so A's goes; A has a child, so only its state goes
    assert state_depths(sim.tree) == [96, 96]
    assert sim.tree.kv_tokens == 96 + 96
    got, _ = run(trace, "trtllm", spec=TINY, **END0)
    assert got == [0, 0, 64, 64]


def test_an_inner_state_is_dropped_alone_and_its_kv_stays():
    """Three recurrent pages, one of them the running request's live state (two for the cache).
    r1 extends A (hits A's state, then commits its own at 96); r2's state
    needs a page: A's and r1's are equally recent, and A's entered the queue first (r1 released it
    at ``resume``, before committing its snapshot), so A's goes. A's block has children, so the
    engine drops only the recurrent page (the walk up in ``clear_stale_blocks_after_page_unlink``
    stops at once) and keeps A's attention pages; r3, diverging after A, matches A's KV but has no
    state to resume from (``BlockRadixTree._prune_match`` truncates to the last block with a
    snapshot): 0, where one budget gives 64."""
    A = toks(0, 64)
    first = [
        (A, toks(5000, 4)),
        (cat(A, toks(2000, 32)), toks(5200, 4)),  # hits A (64), state at 96
        (toks(1000, 64), toks(5300, 4)),  # another conversation's state evicts A's
    ]
    got, sim = run(one_per_session(*first), "trtllm", spec=TINY, state_pool="3", **END0)
    assert got == [0, 64, 0]
    assert state_depths(sim.tree) == [64, 96]  # r2's and r1's
    assert sim.tree.kv_tokens == 96 + 64  # A's KV stays under r1's
    trace = one_per_session(*first, (cat(A, toks(3000, 32)), toks(5400, 4)))
    assert run(trace, "trtllm", spec=TINY, state_pool="3", **END0)[0] == [0, 64, 0, 0]
    assert run(trace, "trtllm", spec=TINY, **END0)[0] == [0, 64, 0, 64]


def test_the_running_request_holds_its_capacity_beyond_the_last_snapshot_point():
    """With the engine's pools the running request's pages come from the KV pool: its capacity
    grows to input + output - 1 tokens, one page per 32-token block (``_core/_kv_cache.py``
    ``resize``), and only the whole blocks up to its last snapshot point are the tree's (the
    partial block there stays its own page; the tree gets a copy, ``kvCache.cpp``
    ``_snapshotPartialBlockToTree``). A 600-token prompt with 99 more stored tokens and points
    256 / 512 / 600: ceil(699 / 32) = 22 pages, 18 of them (600 // 32) cached: 4 pages, 128
    tokens. Without a placement nothing is committed but the hit: all 22 pages beyond a hit of 0,
    and 22 - 3 with a hit of 100 (its 3 whole blocks are the tree's)."""
    from policies.base import AdmissionContext
    from policies.trtllm_current import TrtllmAdmission, TrtllmParams

    ctx = AdmissionContext(n_input=600, n_full=699, block_tokens=1)
    placed = TrtllmAdmission(TrtllmParams(periodic_snapshot_interval=256, additional_snapshot_offsets_from_end="0"))
    assert placed.running_blocks(0, ctx, set(), 1) == 4 * 32
    none = TrtllmAdmission(TrtllmParams())
    assert none.running_blocks(0, ctx, set(), 1) == 22 * 32
    assert none.running_blocks(100, ctx, set(), 1) == 19 * 32
    # on a hash-block trace the tokens are rounded up to whole symbols of the grid
    sym = AdmissionContext(n_input=2, n_full=3, block_tokens=512, full_tokens=1500)
    assert none.running_blocks(0, sym, set(), 1) == 3  # 47 pages = 1,504 tokens -> 3 symbols


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


def test_trtllm_a_block_matched_whole_reaches_its_snapshot_on_two_token_symbols():
    """As above on 2-token symbols: 32 prompts sharing their first 20 tokens (10 symbols), with
    snapshots at 20 and 64 tokens; a lookup of the first 40 tokens of one of them (and one new
    symbol) matches the block (0, 32] whole, so the snapshot at 20 inside it is its hit though
    the root has 32 children (the tokens the lookup may reach are its symbols x 2, 42). Mutation
    survivor ``-m engine_tree --seed 3`` (2026-12-05): engine_tree.py L283, that cap divided by
    the symbol size (10.5 tokens: the block not matched whole, the hit 0)."""
    t = EngineTree(
        EngineRules(kv_extent="state", snapshot_block=32),
        capacity_bytes=10**6,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=2,
        policy=VllmFreeQueueEviction(),
    )
    for k in range(32):
        now = t.set_time(k + 1.0)
        seq = np.array([*range(10), *range(1000 + 100 * k, 1022 + 100 * k)], dtype=np.int64)
        res = t.insert(seq, 64, [10, 32], now)
        assert res.inserted
        t.refresh_inserted(res, now, final=True)
    m = t.lookup(np.array([*range(10), *range(1000, 1010), 9], dtype=np.int64), now=t.set_time(100.0))
    assert (m.hit_tokens, m.match_tokens) == (20, 40)
    t.check_invariants()


def test_the_running_request_holds_a_live_recurrent_page():
    """``KvCache`` takes a private recurrent page for the request's running state when it resumes
    and frees it at ``close`` (never committed; ``_core/_kv_cache.py``, reproduced by
    ``benchmarks/differential_trtllm.py``'s ``EngineKvCache``: ``self.state = pools.new(SSM, ...)``),
    so while a request runs the pool holds one snapshot fewer (``EngineRules.running_states``).
    Two recurrent pages: r0 commits A's state (live page + A); r1's live page takes the free page,
    so its own state needs A's: A is evicted and r2 (A + 32) reuses nothing. TensorRT-LLM's own
    tree and manager methods driven by the harness give 0, 0, 0, 0 (with three pages 0, 0, 64, 0,
    the first test's trace). Without the live page the preset kept A (0, 0, 64, 0 with two)."""
    A, B = toks(0, 64), toks(1000, 64)
    trace = one_per_session(
        (A, toks(5000, 4)),
        (B, toks(5100, 4)),
        (cat(A, toks(2000, 32)), toks(5200, 4)),
        (cat(B, toks(3000, 32)), toks(5300, 4)),
    )
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="2", **END0)
    assert got == [0, 0, 0, 0]
    assert sim.tree.state_capacity == 2 and sim.tree.n_states <= 2


def test_a_state_on_the_running_path_is_evicted_though_its_kv_is_held():
    """A running request holds the attention pages of its matched blocks, not their snapshots:
    the one it resumes from goes back to the queue when ``resume`` copies it, the others never
    leave it (``_core/_kv_cache.py`` ``_setup_for_reuse`` / ``resume``). Five recurrent pages,
    snapshots at the prompt end and 32 before it: r0 = P (64 tokens) keeps 32 and 64, r1 = Q
    (20 tokens) keeps 20; r2 = P + 40 resumes from 64 (which goes to the back of the queue),
    holds its live page and commits 72 and 104: the last needs a page and the queue's front is
    P's state at 32, on r2's own path, so it goes (its KV stays) and Q's survives. r3 = Q + 10
    reuses 20; r4 = P[:32] + 40 reuses nothing. The harness driving TensorRT-LLM's own code gives
    0, 0, 64, 20, 0. Locking the path's states (the preset before) evicted Q's instead: 0, 0, 64,
    0, 32."""
    P, Q = toks(0, 64), toks(1000, 20)
    trace = one_per_session(
        (P, toks(9000, 1)),
        (Q, toks(9010, 1)),
        (cat(P, toks(2000, 40)), toks(9020, 1)),
        (cat(Q, toks(4000, 10)), toks(9030, 1)),
        (cat(P[:32], toks(3000, 40)), toks(9040, 1)),
    )
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="5", additional_snapshot_offsets_from_end="0,32")
    assert got == [0, 0, 64, 20, 0]
    assert state_depths(sim.tree) == [30, 40, 72, 104]
    sim.tree.check_invariants()


def test_a_replaced_snapshot_is_let_go_after_the_new_page_is_taken():
    """One recurrent page per 32-token block, the deepest (``Block.replace_page``), but the new
    page is taken first: ``_snapshotSsmToTreeBlock`` allocates a fresh recurrent page (evicting
    from the queue's front when the pool is short) and only then does ``replace_page`` let the
    block's old page go. Three recurrent pages (one the live state): r0 = A (60 tokens) keeps 60,
    r1 = B (64) keeps 64; r2 = A + 2 resumes from 60 and commits 62 in the same block: the pool is
    short, so the front of the queue, B's 64, goes before A's 60 is replaced; r3 = B + 8 reuses
    nothing. The harness driving TensorRT-LLM's own code gives 0, 0, 60, 0 (with room, 0, 0, 60,
    64). Letting the old page go first (the preset before) kept B's: 0, 0, 60, 64."""
    A, B = toks(0, 60), toks(1000, 64)
    trace = one_per_session(
        (A, toks(9000, 1)),
        (B, toks(9010, 1)),
        (cat(A, toks(2000, 2)), toks(9020, 1)),
        (cat(B, toks(3000, 8)), toks(9030, 1)),
    )
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="3", **END0)
    assert got == [0, 0, 60, 0]
    assert state_depths(sim.tree) == [62, 72]
    sim.tree.check_invariants()


def test_a_state_pool_that_fills_the_capacity_leaves_no_room_for_kv():
    """``--state-pool`` N takes N states' bytes from ``--capacity`` for the recurrent pool group;
    the rest is the attention pool. A pool of exactly the capacity leaves a KV pool of 0 bytes,
    which holds no page: refused in one line (``EngineTree``: ``kv_capacity_bytes <= 0``), as one
    that leaves less. (Mutation survivor, engine_tree.py L108, seed 0.)"""
    trace = one_per_session((toks(0, 64), toks(5000, 4)))
    state = TINY.state_bytes()
    for capacity in (3 * state, 3 * state - 1):
        with pytest.raises(UsageError, match="leaves no room for KV"):
            run(trace, "trtllm", spec=TINY, capacity=capacity, state_pool="3", **END0)
    got, _ = run(trace, "trtllm", spec=TINY, capacity=3 * state + 64 * 2, state_pool="3", **END0)
    assert got == [0]


def _pool_tree(slots: int) -> EngineTree:
    from policies.trtllm_current import TrtllmPoolEviction  # noqa: PLC0415

    rules = EngineRules(kv_extent="state", snapshot_block=32, state_pool=True, cascade=True)
    return EngineTree(
        rules,
        state_capacity=slots,
        capacity_bytes=10**6,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=1,
        policy=TrtllmPoolEviction(),
    )


def test_an_insert_counts_again_a_state_on_its_path_taken_to_make_room():
    """States on a locked path are state victims with the engine's pools (rule above), so the
    room an insert makes may take a state it found on its own path and will add again: the
    states it needs are counted again after each victim (``EngineTree._evict_for``), and the pool
    is never exceeded (``marconi run --policy trtllm --state-pool 29 --scheduler fcfs`` on 100
    ShareGPT sessions at 2GB stopped on "capacity exceeded" before). Three state slots: the path
    holds states at 32 and 64 (locked, as a running request's), another path one at 50; inserting
    the path again with a third state at 96 needs one slot and takes the queue's front, the path's
    own 32, which it then needs again, so 64 goes too, then 50: the pool holds 32, 64 and 96 (a
    fixed count of one stopped after 32 and overflowed the pool)."""
    t = _pool_tree(3)
    seq = np.arange(96, dtype=np.int64)
    assert t.insert(seq[:64], 64, [32, 64], t.set_time(1.0)).inserted
    assert t.insert(np.arange(1000, 1050, dtype=np.int64), 50, [50], t.set_time(2.0)).inserted
    t.lock(t.match(seq[:64]).hit_node)  # a running request's path: KV held, states still victims
    res = t.insert(seq, 96, [32, 64, 96], t.set_time(3.0))
    assert res.inserted
    assert state_depths(t) == [32, 64, 96]
    t.check_invariants()


def test_a_request_with_more_snapshots_than_the_pool_keeps_its_last_ones():
    """TensorRT-LLM commits a request's snapshots one at a time (``try_commit_blocks`` at each
    point, ``kvCache.cpp`` ``_snapshotSsmToTreeBlock``: a fresh recurrent page, evicting from the
    queue's front when the pool is short), and each committed page enters the queue at once, so
    once the older pages are gone the request's own earlier snapshots are the front: a request
    with more points than the pool ends with its last ones, and all of its KV (the attention pool
    is apart). The preset refused the whole insert (no KV, no state, every other state evicted
    trying). Found by ``benchmarks/differential_trtllm.py --capacity 16GB`` on ``mooncake:sample``
    (interval 512, end offset 0, 54 recurrent pages): request 11's 87,169-token prompt has 171
    points; the engine kept its last 53 (the live page holds the 54th), the preset none; with
    this the two sides' snapshot sets agree after every one of the 300 requests. Two slots, four
    points: the last two stay, with the KV to the last."""
    t = _pool_tree(2)
    assert t.insert(np.arange(1000, 1040, dtype=np.int64), 40, [40], t.set_time(1.0)).inserted
    res = t.insert(np.arange(128, dtype=np.int64), 128, [32, 64, 96, 128], t.set_time(2.0))
    assert res.inserted
    assert state_depths(t) == [96, 128]  # the other path's state went first
    assert t.kv_tokens == 128
    t.check_invariants()


def test_a_path_ending_at_the_block_end_is_one_block_whatever_hangs_below():
    """Counting the radix-tree blocks under a whole block (``EngineTree._paths``): a path that
    reaches the block's end is one block, whatever branches after it (the next block's children
    are not this block's siblings). Under the root: one shared 20-token stem with a state at 20,
    then 40 prompts that all continue with the same 12 tokens to 32 and differ after it, and one
    that leaves at 20. The block (0, 32] has two paths, fewer than 32, so a request sharing the
    20 tokens and then leaving reaches the state at 20 by the partial match. (Mutation survivor,
    engine_tree.py L313, seed 0: ``>=`` made ``>`` counted the 40 continuations.)"""
    t = EngineTree(
        EngineRules(kv_extent="state", snapshot_block=32),
        capacity_bytes=10**6,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=1,
        policy=VllmFreeQueueEviction(),
    )
    stem = [*range(20), *range(500, 512)]  # to the block's end
    seqs = [[*stem, *range(1000 + 100 * k, 1032 + 100 * k)] for k in range(40)]
    seqs.append([*range(20), *range(3000, 3044)])
    for k, seq in enumerate(seqs):
        now = t.set_time(k + 1.0)
        res = t.insert(np.array(seq, dtype=np.int64), 64, [20, 64], now)
        assert res.inserted
        t.refresh_inserted(res, now, final=True)
    m = t.lookup(np.array([*range(20), 9, 9], dtype=np.int64), now=t.set_time(100.0))
    t.check_invariants()
    assert (m.hit_tokens, m.match_tokens) == (20, 20)


def test_a_hash_block_prompts_end_snapshot_takes_a_recurrent_page():
    """On a hash-block trace (16-token blocks here, Mooncake's 512) a prompt whose last block is
    partial still gets its end-offset-0 snapshot: ``try_commit_blocks`` (``mamba_cache_manager_v2.py``
    at 28295084972c) commits up to ``commit_limit = min(max(expect_snapshot_points), prompt_len)``,
    the prompt's last token, and ``kvCache.cpp`` ``_snapshotPartialBlockToTree`` puts the partial
    block's KV copy and the recurrent state at its end into the tree, where the state holds a page
    of the recurrent pool until the queue reaches it. The preset kept only the states on whole
    symbols (``t % block_tokens == 0``), so the pool kept more of them than the engine:
    ``mooncake:sample`` at 16GB (54 recurrent pages, interval 512, end offset 0) reused the shared
    first block's snapshot on requests 129 and 263, which the engine's prompt ends had pushed out
    (298 -> 300 of 300). Three recurrent pages (one the running request's live state): A (40
    tokens: blocks 1, 2 and half of 3) commits 32 and 40, B the same on its own blocks, which
    takes both of A's pages; C (A's first two blocks, then 4 tokens of its own) reuses nothing.
    The harness driving TensorRT-LLM's own tree and manager methods gives 0, 0, 0 and snapshots
    at 32 and 36 (with ten pages 0, 0, 32 and 32, 32, 36, 40, 40), as here; the preset before
    gave 0, 0, 32 with three."""
    from traces.base import Request, Trace  # noqa: PLC0415

    rows = [([1, 2, 3], 40), ([4, 5, 6], 40), ([1, 2, 7], 36)]
    trace = Trace(
        "hb",
        [
            Request(
                session_id=i,
                turn=0,
                input_tokens=np.array(ids, dtype=np.int64),
                output_tokens=np.zeros(0, dtype=np.int64),
                input_len=n,
                output_len=4,
                arrival=float(i),
            )
            for i, (ids, n) in enumerate(rows)
        ],
        closed_loop=False,
        block_tokens=16,
    )
    knobs = {"periodic_snapshot_interval": 32, **END0}
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="3", **knobs)
    assert got == [0, 0, 0]
    assert state_depths(sim.tree) == [32, 36]  # C's own (36: its partial block's end); the engine's too
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="10", **knobs)
    assert got == [0, 0, 32]
    assert state_depths(sim.tree) == [32, 32, 36, 40, 40]  # the engine's tree holds the same five


def test_two_snapshots_of_one_request_in_one_block_hold_two_pages_for_a_moment():
    """End offsets 0 and 13; three recurrent pages, one the running request's live state (two for
    the cache). A (40 tokens) commits 27 and 40 (two blocks): the pool is full. B (20 tokens)
    commits 7 and 20, both in its first block: ``_snapshotSsmToTreeBlock`` takes a page for 7
    (A's 27 goes, the queue's front), then one for 20 (A's 40 goes) and only then lets 7's go
    (``Block.replace_page``, ``_block_radix_tree.py`` L475-L487 at 065ff9e9), so A + 10 tokens
    reuses nothing. The preset inserted 20 alone, took one page (27 went) and kept A's 40 (hit
    40). The harness driving TensorRT-LLM's own tree and manager methods gives 0, 0, 0 and one
    snapshot, at 50 (found by comparing the two sides' snapshots after every request:
    ShareGPT, 2GB, end offsets 0 / 13, the 23rd served)."""
    A = toks(0, 40)
    out = toks(90_000, 3)
    trace = one_per_session((A, out), (toks(1000, 20), out), (cat(A, toks(500, 10)), out))
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="3", additional_snapshot_offsets_from_end="0,13")
    assert got == [0, 0, 0]
    assert state_depths(sim.tree) == [50]


def test_a_state_victims_leaf_keeps_the_block_that_holds_a_page_of_its_own():
    """A recurrent page dropped from the pool detaches its block, then each ancestor block left
    without children and without a recurrent page (``Block.clear_stale_blocks_after_page_unlink``,
    ``_block_radix_tree.py`` L572-L597 at 065ff9e9). T (48 tokens, snapshots at 1 and 48) and U
    (T's first 3 tokens, then its own, a snapshot at 23) split T's edge at 3, so T's leaf (3, 48]
    spans T's first block (0, 32], whose page is the snapshot at 1 (the first created block
    through it), and its second, whose page is 48. 48 taken by the state queue: the second
    block goes, the first stays with its KV (the leaf cut at 32, stateless), where the whole leaf
    went before. Without the snapshot at 1 the first block has no page and goes too. (ShareGPT,
    2GB, end offsets 0 / 13: the two sides' snapshots agreed through the 50th request served
    before, the 215th after; the engine kept the template's first block with its page at 1.)"""
    for cps, kept in (([1, 48], 32), ([48], None)):
        t = _pool_tree(4)
        t.insert(toks(0, 48), 48, cps, t.set_time(1.0))
        t.insert(cat(toks(0, 3), toks(600, 20)), 23, [23], t.set_time(2.0))
        leaf = next(n for n in t.iter_nodes() if n.has_state and n.depth_tokens == 48)
        t._state_drain = True  # as the state queue's victims are taken (``EngineTree._evict_for``)
        freed = t.evict(leaf)
        t._state_drain = False
        if kept:
            assert freed == (1, 16) and leaf.parent is not None and (leaf.depth_tokens, leaf.has_state) == (32, False)
            assert state_depths(t) == [1, 23] and t.kv_tokens == 32 + 20
        else:
            assert freed == (1, 45) and leaf.parent is None
            assert state_depths(t) == [23] and t.kv_tokens == 23
        t.check_invariants()


def test_a_state_victims_shortened_leaf_counts_its_state_and_kv_evicted():
    """The leaf cut at its block that holds a page of its own (the test above) counts one state
    and the leaf's KV past the cut evicted, taken by the state queue as a later insert needs a
    recurrent page: T (48 tokens, snapshots at 1 and 48), U (T's first 3 tokens, then 20 of its
    own, a snapshot at 23), a hit on the snapshot at 1, then V (10 tokens of its own, a snapshot
    at 10) with three recurrent pages: 48, the least recently used, goes, T's leaf (3, 48] cut at
    32. Every admitted state is then held or counted evicted (``TreeStats``: a run's summary
    reports them); the count was not incremented on this path and no test saw it (mutation run,
    session 17: ``stats.states_evicted += 1`` in ``EngineTree._detach_stale_blocks`` dropped)."""
    t = _pool_tree(3)
    t.insert(toks(0, 48), 48, [1, 48], t.set_time(1.0))
    t.insert(cat(toks(0, 3), toks(600, 20)), 23, [23], t.set_time(2.0))
    assert t.lookup(cat(toks(0, 1), toks(800, 5)), now=t.set_time(2.5)).hit_tokens == 1
    assert t.insert(toks(900, 10), 10, [10], t.set_time(3.0)).inserted
    assert state_depths(t) == [1, 10, 23] and t.kv_tokens == 32 + 20 + 10
    st = t.stats
    assert (st.evictions, st.states_evicted, st.kv_tokens_evicted) == (1, 1, 16)
    assert st.states_admitted - st.states_evicted == len(state_depths(t)) == 3
    t.check_invariants()


def _page_tree(kv_tokens: int, page: int) -> EngineTree:
    from policies.trtllm_current import TrtllmPoolEviction  # noqa: PLC0415

    rules = EngineRules(
        kv_extent="state", snapshot_block=32, state_pool=True, cascade=True, kv_page=page, states_first=bool(page)
    )
    return EngineTree(
        rules,
        state_capacity=4,
        capacity_bytes=4 * 4 + kv_tokens,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=1,
        policy=TrtllmPoolEviction(),
    )


def test_the_attention_pool_holds_whole_pages_one_per_block():
    """A radix block holds one page per life cycle (``Block.storage``, ``_block_radix_tree.py``
    L390-L412 at 065ff9e9), a block is its first tokens plus up to 32 more, so two prompts that part
    inside a block hold one copy of that block each, and a prompt ending inside a block holds that
    partial block on a page of its own (``kvCache.cpp`` ``_snapshotPartialBlockToTree``). A (40
    tokens) and B (A's first 20, then 30 of its own): the token tree holds 20 + 20 + 30 = 70
    tokens, the engine 2 + 2 pages (128 tokens). With 100 tokens of KV, C (40 tokens of its own)
    needs A gone (the preset kept both, counting 80 tokens). ShareGPT 2GB, end offset 0: 1,217 ->
    1,221 of 1,235 (``benchmarks/differential_trtllm.py``)."""
    A, B, C = toks(0, 40), cat(toks(0, 20), toks(700, 30)), toks(300, 40)
    for page, kv_bytes, states in ((0, 70, [40, 40]), (32, 128, [40])):
        t = _page_tree(1000, page)
        t.insert(A, 40, [40], t.set_time(1.0))
        t.insert(B, 50, [50], t.set_time(2.0))
        assert t.kv_tokens == 70 and t.kv_bytes == kv_bytes
        t.check_invariants()
        t = _page_tree(100, page)
        t.insert(A, 40, [40], t.set_time(1.0))
        assert t.kv_bytes == (40 if not page else 64)
        assert t.insert(C, 40, [40], t.set_time(2.0)).inserted
        assert state_depths(t) == states and t.kv_tokens == 80 - 40 * bool(page)
        assert t.kv_bytes <= 100
        t.check_invariants()
    rules = run(one_per_session((A, toks(5000, 4))), "trtllm", spec=TINY, state_pool="3", **END0)[1].tree.rules
    assert (rules.kv_page, rules.states_first) == (32, True)


# ------------------------------------------------------------------ the attention pool page by page
# Found by benchmarks/differential_trtllm.py --capacity 2GB --additional-snapshot-offsets-from-end
# 0,13 (the simulator given the engine's own two pools), comparing the two sides' snapshots, pages
# and the blocks holding each snapshot after every request served
# (benchmarks/results/2026-12-06-differential-trtllm-pools/). Engine files: ``_block_radix_tree.py``
# at 065ff9e9, ``mamba_cache_manager_v2.py`` at 28295084972c, ``_core/_kv_cache.py`` at 00f6bd61.


def _paged_tree(pages: int, states: int) -> EngineTree:
    """The preset's tree with ``--state-pool``: 32-token blocks and pages, ``pages`` attention
    pages (1 byte of KV a token) and ``states`` recurrent pages (4 bytes each)."""
    from policies.trtllm_current import TrtllmPoolEviction, pool_rules  # noqa: PLC0415

    rules = pool_rules(32)
    return EngineTree(
        rules,
        state_capacity=states,
        capacity_bytes=states * 4 + pages * 32,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=1,
        policy=TrtllmPoolEviction(),
    )


def _ins(t, seq, cps, at):
    res = t.insert(seq, len(seq), cps, t.set_time(at))
    assert res.inserted
    t.refresh_inserted(res, at, final=True)
    t.check_invariants()


def test_an_attention_victim_is_one_page_its_leafs_last_block_first():
    """The storage manager evicts exactly the pages it is short of from the attention queue's
    front (``_storage_manager.py`` ``_prepare_free_slots``: ``num_to_evict = goal - free``), a
    request's pages entering it last block first (``_core/_kv_cache.py`` ``_clear_blocks``), and
    a dropped page removes its block's subtree only (``remove_subtree``, ``_block_radix_tree.py``
    L246-L269; ``detach_next`` L231-L243 clears the block's ``_prev``, so the walk up of
    ``clear_stale_blocks_after_page_unlink`` L586-L597 stops at once). Four pages: A (96 tokens,
    its snapshot at 96) holds three; B (64) needs two, so A loses its last block, the snapshot
    with it, and keeps 64 tokens of dead KV; C (32) takes A's next block. The preset took A's
    whole leaf (ShareGPT 2GB end offsets 0 / 13, the 196th request served: the engine's queue
    front was four blocks of such a chain)."""
    t = _paged_tree(4, 4)
    _ins(t, toks(0, 96), [96], 1.0)
    _ins(t, toks(500, 64), [64], 2.0)
    assert state_depths(t) == [64] and t.kv_tokens == 64 + 64
    assert [n.depth_tokens for n in t.root.children.values() if n.key[0] == 0] == [64]
    _ins(t, toks(900, 32), [32], 3.0)
    assert state_depths(t) == [32, 64] and t.kv_tokens == 32 + 64 + 32
    assert [n.depth_tokens for n in t.root.children.values() if n.key[0] == 0] == [32]


def test_the_cached_path_past_the_hit_is_not_held_by_the_request():
    """A request holds the pages of its match pruned to its last snapshot (``_prune_match``,
    ``_block_radix_tree.py`` L712-L774: ``matched = matched[:ssm_trunc]``), nothing of the cached
    path past it, so a state victim there goes with its blocks as any other. X (96 tokens, its
    snapshot at 96) and Y (X's first 6 tokens, then 90 of its own), one recurrent page for the
    cache: Y's snapshot takes X's page, and X's blocks go with it (no block of the two is
    shared). The preset protected X's leaf as the node Y's walk ends in, dropped only X's state
    and kept its 96 tokens (the 196th request served, above: the state at 492)."""
    t = _paged_tree(100, 1)
    _ins(t, toks(0, 96), [96], 1.0)
    _ins(t, cat(toks(0, 6), toks(700, 90)), [96], 2.0)
    assert state_depths(t) == [96] and t.kv_tokens == 96


def test_a_request_takes_its_pages_up_to_a_snapshot_point_before_that_snapshot():
    """The prefill runs chunk by chunk, each ending at a snapshot point: the chunk's pages are
    taken before its forward (``prepare_resources``: ``resize``), its blocks and the snapshot at
    its end committed after it (``update_context_resources`` -> ``try_commit_blocks``,
    ``mamba_cache_manager_v2.py`` at 28295084972c). Four pages, two recurrent: A (64, snapshot
    64) and B (64, snapshot 64) fill both; C (32, snapshot 32) takes its page first, A's last
    block with A's snapshot, and then needs no recurrent page more; A's first block stays as dead
    KV. Committing states first, the preset took A's snapshot and its two blocks (the 185th
    request served, above: the engine's page for the prompt took the partial block holding the
    oldest snapshot, 1,096, and the state queue then gave up 405)."""
    t = _paged_tree(4, 2)
    _ins(t, toks(0, 64), [64], 1.0)
    _ins(t, toks(500, 64), [64], 2.0)
    _ins(t, toks(900, 32), [32], 3.0)
    assert state_depths(t) == [32, 64] and t.kv_tokens == 32 + 64 + 32
    assert t.root.children[0].depth_tokens == 32 and not t.root.children[0].has_state


def test_the_copy_of_a_partial_block_goes_only_once_the_next_one_is_taken():
    """Two snapshot points in one block (7 and 20): the commit at 20 makes the longer partial
    block, which adopts the one at 7 with its page (``Block.__init__``, ``_block_radix_tree.py``
    L428-L441), takes a page for its copy of the 20 tokens, and only then drops the adopted one
    (``replace_page`` L476-L488): the request holds its own block, the copy at 7 and the copy at
    20 for a moment. Three pages: A (64) holds two; C's first chunk takes A's last block (its own
    page and the copy at 7), its second A's first."""
    t = _paged_tree(3, 4)
    _ins(t, toks(0, 64), [64], 1.0)
    _ins(t, toks(900, 20), [7, 20], 2.0)
    assert state_depths(t) == [20] and t.kv_tokens == 20


def _y_hits_3(t: EngineTree) -> None:
    """Y (X's first 3 tokens, then its own 40) looks up at time 3 and hits X's snapshot at 3."""
    m = t.lookup(cat(toks(0, 3), toks(500, 40)), now=t.set_time(3.0))
    assert m.hit_tokens == 3
    t.forget(m)


def test_a_hit_inside_a_block_moves_that_blocks_page_to_the_queue_back():
    """A hit inside a block is that block's snapshot (the first created block through the
    point); the request holds the block's attention page until ``resume`` copies the partial
    block and lets it go (``_core/_kv_cache.py`` ``_setup_for_reuse`` / ``resume``), so the page
    goes to the queue's back, and a block left without a snapshot waits there in release order as
    any other (the queue has no other order). X (48 tokens, snapshots 3 and 48) loses 48 to the
    state queue: its first block stays, holding 3, as dead KV to 32. Z (32) comes later, then Y
    hits 3: X's first block is now more recent than Z, and W (40 tokens: two blocks and its own
    partial one at its snapshot) takes Z's page. The preset took the block without a snapshot
    first, and did not touch it on the hit (ShareGPT 2GB, end offsets 0 / 13: the template's first
    block, the 185th request served)."""
    t = _paged_tree(4, 4)
    _ins(t, toks(0, 48), [3, 48], 1.0)
    leaf = next(n for n in t.iter_nodes() if n.depth_tokens == 48)
    t._state_drain = True  # as the state queue's victims are taken (``EngineTree._evict_for``)
    t.evict(leaf)
    t._state_drain = False
    assert state_depths(t) == [3] and t.kv_tokens == 32
    _ins(t, toks(300, 32), [32], 2.0)
    _y_hits_3(t)
    _ins(t, toks(800, 40), [40], 4.0)
    assert state_depths(t) == [3, 40] and t.kv_tokens == 32 + 40
    assert 300 not in t.root.children


def test_the_decode_pages_are_taken_after_the_snapshots():
    """The request's live recurrent page is taken when it resumes, its decode pages only after
    its prompt's snapshots are committed (``update_context_resources`` during the prefill, the
    decode's ``resize`` after it), so a snapshot's victim frees the blocks the decode then takes.
    Six attention pages, three recurrent (one the live state): A and B (64 tokens each, one
    snapshot at the end) hold four pages and two; C (32 tokens, 64 out: its page, then two decode
    pages) takes its page, then A's snapshot for its own and A's two blocks with it, and its decode
    fits. Taking the decode's pages at the lookup, the preset then found no room for C's page, took
    A's last block (its snapshot with it), needed no recurrent page and kept A's first block
    (ShareGPT 2GB, end offsets 0 / 13: the 196th request served, the engine's decode pages came
    from the chain of the snapshot at 492)."""
    out = toks(90_000, 1)
    trace = one_per_session((toks(0, 64), out), (toks(500, 64), out), (toks(900, 32), toks(80_000, 64)))
    got, sim = run(trace, "trtllm", spec=TINY, capacity=6 * 64 + 3 * 16, state_pool="3", **END0)
    assert got == [0, 0, 0]
    assert state_depths(sim.tree) == [32, 64] and sim.tree.kv_tokens == 64 + 32
    assert 0 not in sim.tree.root.children
    sim.tree.check_invariants()


def test_a_hit_on_a_blocks_first_page_counts_once_the_leaf_is_cut_back_to_it():
    """The block holding a hit's snapshot goes to the queue's back (test above) while the rest
    of a long leaf through it keeps its place: X (96 tokens, snapshots 3 and 96: the first block
    holds 3) then Z (32), then Y hits 3. W (96 tokens) needs three pages of four: X's last two
    blocks go (96 with them), then Z, older than X's first block; X keeps 3 (ShareGPT 2GB, end
    offsets 0 / 13, the 215th request served: the engine took fourteen blocks of a chain and kept
    its first)."""
    t = _paged_tree(4, 4)
    _ins(t, toks(0, 96), [3, 96], 1.0)
    _ins(t, toks(300, 32), [32], 2.0)
    _y_hits_3(t)
    _ins(t, toks(800, 96), [96], 4.0)
    assert state_depths(t) == [3, 96] and t.kv_tokens == 32 + 96
    assert 300 not in t.root.children


def test_a_snapshot_goes_with_the_block_that_holds_its_page():
    """A snapshot is a page of the first created block through its point; dropping that block's
    attention page removes the block with its pages (``remove_subtree``, ``_block_radix_tree.py``
    L246-L269), the snapshot too, though the token tree keeps the state on a node above the
    block's leaf. X (48 tokens, snapshots 3 and 48) loses 48 to the state queue and keeps its first
    block (3..32, holding 3); taking that block's page as a KV victim takes 3 with it, and the
    3 tokens no block covers any more (ShareGPT 2GB, end offsets 0 / 13, the 1,179th request
    served: the engine lost the template's snapshot at 3 with a block 0)."""
    t = _paged_tree(4, 4)
    _ins(t, toks(0, 48), [3, 48], 1.0)
    t._state_drain = True
    t.evict(next(n for n in t.iter_nodes() if n.depth_tokens == 48))
    t._state_drain = False
    assert state_depths(t) == [3] and t.kv_tokens == 32
    assert t.evict(next(n for n in t.iter_nodes() if n.depth_tokens == 32)) == (1, 32)
    assert state_depths(t) == [] and t.kv_tokens == 0
    t.check_invariants()


def test_a_whole_block_matched_reaches_only_its_own_snapshot():
    """The lookup walks whole blocks by key and keeps the deepest matched block holding a page
    (``_prune_match``, ``_block_radix_tree.py`` L733-L744), so a state inside a block the request
    matches whole counts only where the request's block is the one holding its page. P1 (3 shared
    tokens, then its own; snapshots 3 and 48) makes the first block through 3; P2 (the same 3, then
    its own; snapshot 64) another; R matches P2's first block and 18 tokens of its second: the
    engine finds no page (3 is P1's block's), the preset reused 3 (ShareGPT 2GB, end offsets
    0 / 13, the 249th request served)."""
    t = _paged_tree(100, 10)
    _ins(t, cat(toks(0, 3), toks(100, 45)), [3, 48], 1.0)
    _ins(t, cat(toks(0, 3), toks(200, 61)), [64], 2.0)
    m = t.lookup(cat(toks(0, 3), toks(200, 47), toks(900, 10)), now=t.set_time(3.0))
    assert m.hit_tokens == 0
    t.forget(m)
    m = t.lookup(cat(toks(0, 3), toks(100, 40), toks(900, 10)), now=t.set_time(4.0))
    assert m.hit_tokens == 3  # P1's own block
    t.forget(m)


def test_a_snapshot_at_a_block_end_is_not_the_next_blocks_page():
    """A snapshot at token 32 is the page of the block ending there (``(p - 1) // 32``), not of
    the next one: a later snapshot at 40, in the next block, replaces nothing (``Block.replace_page``
    replaces a page of its own block only). Mutation seed 16 survivor (``lo < depth`` -> ``<=``)."""
    from engine_cases import snapshot_tree  # noqa: PLC0415

    t = snapshot_tree()
    t.insert(toks(0, 64), 64, [32], t.set_time(1.0))
    t.insert(toks(0, 40), 40, [40], t.set_time(2.0))
    assert state_depths(t) == [32, 40]
    t.check_invariants()


FCFS = {"mode": "des", "scheduler": "fcfs"}


def test_fcfs_matches_a_request_when_its_server_takes_it():
    """TensorRT-LLM matches a request when the scheduler takes its first context chunk
    (``KVCacheManagerV2.prepare_context`` -> ``_prepare_context_impl``,
    ``tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py``: ``if
    req.is_first_context_chunk:`` ... ``self._create_kv_cache(req.py_request_id, ..., tokens)``
    with ``tokens`` the prompt less its last token), not at its arrival. Under ``--scheduler fcfs``
    r1 (A + 32) arrives while r0 (A) prefills: looked up when the server takes it, after r0's
    prefill committed A's snapshot at 64, it reuses 64 (the preset looked it up at its arrival
    and got 0). The harness driving TensorRT-LLM's own tree with the simulator's fcfs events
    (``benchmarks/differential_trtllm.py --scheduler fcfs``) gives 0, 64."""
    trace = arrivals([(toks(0, 64), 4, 0.0), (cat(toks(0, 64), toks(2000, 32)), 4, 0.0001)])
    assert run(trace, "trtllm", spec=TINY, **FCFS, **END0)[0] == [0, 64]


def test_fcfs_charges_running_requests_and_puts_back_no_evicted_prompt_state():
    """Under ``--scheduler fcfs`` requests overlap: r0 (A, 200 output tokens) still decodes while
    r1 (B) prefills. Three recurrent pages: r0's live state, A's snapshot and r1's live state
    (``KvCache`` takes a private page for the running state and frees it at ``close``; sequential
    mode charges it, ``hold_running``), so r1's snapshot at 64 takes A's page, the queue's only
    one. r0's end then commits nothing (``try_commit_blocks``, ``mamba_cache_manager_v2.py`` at
    28295084972c, ends ``if request.context_remaining_length == 0: kv_cache.stop_committing()``):
    A's state stays gone, r2 (A + 32) reuses nothing and r3 (B + 32) reuses B's 64. The harness
    driving TensorRT-LLM's own code with the simulator's fcfs events gives 0, 0, 0, 64. Before,
    the preset charged a running request nothing (0, 0, 64, 64), and with the charge alone its
    end insert put A's state back, evicting B's (0, 0, 64, 0)."""
    A, B = toks(0, 64), toks(1000, 64)
    trace = arrivals([(A, 200, 0.0), (B, 4, 0.05), (cat(A, toks(2000, 32)), 4, 1.0), (cat(B, toks(3000, 32)), 4, 1.1)])
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="3", **FCFS, **END0)
    assert got == [0, 0, 0, 64]
    assert state_depths(sim.tree) == [64, 96]
    sim.tree.check_invariants()
    # one budget: nothing is short, every prompt state stays
    assert run(trace, "trtllm", spec=TINY, **FCFS, **END0)[0] == [0, 0, 64, 64]


def test_a_snapshot_whose_block_goes_making_room_for_its_page_is_lost():
    """A snapshot's recurrent page is taken before it is installed in its block (a new page, then
    ``Block.replace_page``, ``_block_radix_tree.py`` L475-L487 at 065ff9e9). Where the block is
    one the tree already holds past the request's hit and the state victim is the leaf below it,
    the victim's block is detached, then each ancestor left a leaf without a recurrent page
    (``clear_stale_blocks_after_page_unlink`` L586-L597), the snapshot's block among them: the
    snapshot is freed with it, its KV put back alone. One recurrent page: A (49 tokens, its
    snapshot at 49, in its second block; the first holds no page), then B (A's first 9 tokens,
    its snapshot at 9, in A's first block): the engine ends with B's 9 tokens and no snapshot,
    where the preset kept 9. C (A's first 5 tokens, then 4 of its own) puts its snapshot in its
    own block, which stays. (ShareGPT 100 sessions, 2GB, end offset 0, ``--scheduler fcfs``,
    ``benchmarks/differential_trtllm.py``: event 135, request 254's prefill, a 9-token prompt on
    the chat template's first block.)"""
    for seq, states in ((toks(0, 9), []), (cat(toks(0, 5), toks(700, 4)), [9])):
        t = _paged_tree(8, 1)
        _ins(t, toks(0, 49), [49], 1.0)
        _ins(t, seq, [9], 2.0)
        assert state_depths(t) == states and t.kv_tokens == 9
        assert t.snapshots_lost == (not states)


def test_a_hit_inside_a_block_leaves_a_longer_leaf_in_place_until_it_is_cut_back():
    """The block a hit inside it holds ends at the next multiple of the block size (32 here), not
    32 tokens past the hit: X (33 tokens, snapshots 3 and 33) runs one token into its second
    block, so Y's hit at 3 moves only X's first block to the queue's back (the leaf's ``head``,
    counted once the leaf is cut back to it): the leaf keeps its own place (last touched at 1).
    Were the block's end taken as 3 - 1 + 32 = 34, the whole leaf would be touched at 3."""
    t = _paged_tree(4, 4)
    _ins(t, toks(0, 33), [3, 33], 1.0)
    _ins(t, toks(300, 32), [32], 2.0)
    _y_hits_3(t)
    leaf = next(n for n in t.iter_nodes() if n.depth_tokens == 33)
    assert (leaf.last_access, leaf.head) == (1.0, (32, 3.0))
    _ins(t, toks(800, 40), [40], 4.0)
    assert state_depths(t) == [3, 40] and 300 not in t.root.children
    t.check_invariants()


def test_a_partial_leaf_replaced_by_the_requests_block_frees_its_page_before_the_next_copy():
    """Rule 25: the prefill commits the hit's block whole over the tree's partial leaf block that it
    extends (``Block.__init__`` adopts the shorter sibling's pages, ``_block_radix_tree.py``
    L429-L448 at 065ff9e9; the request's page then replaces its attention page, ``replace_page``
    L475-L487, which goes), and only then takes the partial copy at its snapshot point off the
    page grid: that point holds one page fewer than the path counts. Five attention pages: C (32,
    snapshot 32), A (40, snapshot 40: two pages, the second a partial copy), then B (A + 30, snapshot
    at 70): the engine peaks at five (A's partial page gone before B's copy at 70 is taken), so C
    stays and C + 8 reuses 32. The preset counted six and evicted C (0). Checked with
    ``benchmarks/differential_trtllm.py``'s harness driving TensorRT-LLM's own tree on this trace
    (0, 0, 40, 32); with four pages both give 0 for the last."""
    A, C = toks(0, 40), toks(500, 32)
    trace = one_per_session(
        (C, toks(5000, 1)),
        (A, toks(5100, 1)),
        (cat(A, toks(100, 30)), toks(5200, 1)),
        (cat(C, toks(600, 8)), toks(5300, 1)),
    )
    for pages, last in ((5, 32), (4, 0)):
        got, sim = run(trace, "trtllm", spec=TINY, capacity=pages * 32 * 2 + 5 * 16, state_pool="5", **END0)
        assert got == [0, 0, 40, last]
        sim.tree.check_invariants()


def test_a_committed_partial_block_keeps_its_place_when_its_request_ends():
    """Rule 26 (``--scheduler fcfs``): the partial block at a request's last snapshot point is a
    copy the tree takes when the point is committed (``kvCache.cpp``
    ``_snapshotPartialBlockToTree``: a new page no request holds, in the queue from then on); the
    request's whole blocks go to the queue when it closes (``_core/_kv_cache.py`` ``_clear_blocks``).
    A (40 tokens, snapshot 40) is committed at 1 and ends at 3; B (64) is served whole at 2; C (32)
    then needs one of four pages: the queue's front is A's partial copy (1), so A loses its snapshot
    and its 8 tokens past 32, and B keeps its snapshot. The preset stamped A's whole leaf with its
    end (3) and took B's last block. (ShareGPT 100 sessions, 2GB, end offset 0, ``--scheduler
    fcfs``: events 798 and 935, the engine's queue front was such copies of requests that had
    ended later.)"""
    t = _paged_tree(4, 4)
    A = toks(0, 40)
    leaf = t.insert(A, 40, [40], t.set_time(1.0), lock=True).end_node
    assert t.stamp_partial_tail(leaf) == 40  # committed at 1 (its symbol: a token here)
    _ins(t, toks(500, 64), [64], 2.0)
    tail = t.partial_tail(leaf)
    now = t.set_time(3.0)
    end = t.insert(A, 40, [40], now, protect=leaf)
    t.unlock(leaf)
    t.refresh_inserted(end, now, final=True)
    t.keep_partial_tail(tail)
    assert (leaf.last_access, leaf.head) == (1.0, (32, 3.0))
    _ins(t, toks(900, 32), [32], 4.0)
    assert state_depths(t) == [32, 64] and t.kv_tokens == 32 + 64 + 32
    # a leaf ending on the page grid, or with children, is the request's own: stamped at its end
    assert t.partial_tail(next(n for n in t.iter_nodes() if n.depth_tokens == 64)) is None


def test_a_running_request_holds_its_own_pages_from_its_lookup_to_its_end():
    """Rule 27 (``--scheduler fcfs``): a running request's own pages, those its capacity has beyond
    the tree's blocks (``_core/_kv_cache.py`` ``resize``: one page per 32-token block), are held
    from its lookup: the private copy of a partially matched block (``resume``); from its prefill's
    end: the partial block at its last snapshot point (the tree gets a copy); at its end: the
    decode's pages (``running_blocks``). A 100-token prompt with a hit of 40 and a snapshot at 100:
    one page at the lookup (block 1, 40 // 32), one after the context (block 3, past 96), and
    ceil(129 / 32) - 3 = 2 at the end; a hit on the page grid holds none at its lookup."""
    from policies.base import AdmissionContext
    from policies.trtllm_current import TrtllmAdmission, TrtllmParams

    ctx = AdmissionContext(n_input=100, n_full=130, block_tokens=1, full_tokens=129)
    adm = TrtllmAdmission(TrtllmParams(additional_snapshot_offsets_from_end="0"))
    assert [adm.own_blocks(40, ctx, c) for c in (40, 100, 129)] == [32, 32, 64]
    assert adm.own_blocks(64, ctx, 64) == 0
    assert adm.running_blocks(40, ctx, set(), 1) == adm.own_blocks(40, ctx, 129)


def test_a_running_requests_partial_copy_stays_an_attention_victim():
    """Rule 28 (``--scheduler fcfs``): no request holds a tree's partial block (the copy at its last
    snapshot point is a new page, ``kvCache.cpp`` ``_snapshotPartialBlockToTree``; a partially
    matched block's page is let go by ``resume``, ``_core/_kv_cache.py``), so a running request's
    prompt-end copy stays in the attention queue while it decodes. Four attention pages: A (40
    tokens, 24 output tokens) holds its first block, its own partial page, and the tree's copy at 40;
    B (64) prefills while A decodes and needs two pages: one is free, the other is A's copy, with
    A's snapshot. A + 8 then reuses nothing, B + 8 nothing (B's last block went for C). The preset
    locked A's whole leaf: B's insert found no room and A + 8 reused 40. The harness driving
    TensorRT-LLM's own code with these fcfs events gives 0, 0, 0, 0, 0 (five pages: 0, 0, 0, 40, 0
    on both sides). (ShareGPT 100 sessions, 2GB, end offset 0, ``--scheduler fcfs``: event 1196,
    the engine evicted the copy at 2,021 of a request still decoding.)"""
    A, B, C = toks(0, 40), toks(1000, 64), toks(2000, 32)
    rows = [(A, 24, 0.0), (B, 1, 0.002), (C, 1, 1.0), (cat(A, toks(3000, 8)), 1, 2.0), (cat(B, toks(4000, 8)), 1, 3.0)]
    for pages, hits in ((4, [0, 0, 0, 0, 0]), (5, [0, 0, 0, 40, 0])):
        got, sim = run(
            arrivals(rows), "trtllm", spec=TINY, capacity=pages * 64 + 4 * 16, state_pool="4", **FCFS, **END0
        )
        assert got == hits
        sim.tree.check_invariants()


def test_a_requests_end_puts_its_blocks_in_the_queue_even_when_it_inserts_nothing():
    """Rule 29 (``--scheduler fcfs``): a request's ``close`` releases the blocks it held, last block
    first (``_core/_kv_cache.py`` ``_clear_blocks``), also where its end commits nothing (its
    prompt's snapshot went since its prefill: the end insert adds no state, so nothing of its path
    was touched), and before its decode's pages evict anything (``resize`` at its end, while it
    still holds them: ``EngineTree.release_path`` then ``Simulation.finish_running``). Three
    attention pages: A (40, snapshot 40) is committed at 1 and runs; B (64) takes A's partial copy
    with A's snapshot (rule 28), A keeps its first block; A ends at 3; C (32) needs a page: the
    queue's front is B's last block (2), not A's block (3). Left at A's commit (1), A's block went
    and B kept its snapshot."""
    t = _paged_tree(3, 4)
    A = toks(0, 40)
    leaf = t.insert(A, 40, [40], t.set_time(1.0), lock=True).end_node
    _ins(t, toks(500, 64), [64], 2.0)
    assert state_depths(t) == [64] and leaf.depth_tokens == 32 and not leaf.has_state
    now = t.set_time(3.0)
    end = t.insert(A[:32], 32, [], now, protect=leaf)  # the end adds nothing: its state is gone
    t.unlock(leaf)
    t.refresh_inserted(end, now, final=True)
    assert leaf.last_access == 1.0
    t.release_path(leaf, None)
    assert leaf.last_access == 3.0
    _ins(t, toks(900, 32), [32], 4.0)
    assert state_depths(t) == [32] and leaf.parent is not None and t.kv_tokens == 32 + 32 + 32
    t.check_invariants()


def test_a_request_takes_a_page_for_every_block_from_its_hit_before_it_rebases():
    """Rule 30: a request holds its match pruned to its hit and nothing of the path the tree caches
    past it, and ``resize`` takes a page for every block of a chunk from the hit's on before the
    commit finds a block the tree holds whole and lets the request's own page go (``_commitBlock``,
    ``allowSeqRebasing``; the harness's ``EngineKvCache._commit_block``): the room an insert needs
    at a snapshot point counts the cached path past the hit again (``EngineTree._stage_needs``,
    ``_held_to``). Seven attention pages, every prompt snapshotted at 32 and at its end: F (32), X
    (100: four pages), then Y (X's first 96 tokens and 8 of its own) hits 32 and takes three pages
    (blocks 1-3) though X holds blocks 1 and 2: two are free, so F's page goes and F + 8 reuses
    nothing. The preset counted from the end of the cached path (96: two pages) and kept F (32).
    The harness driving TensorRT-LLM's own code gives 0, 0, 32, 0 in sequential mode and under
    fcfs. (ShareGPT 100 sessions, 2GB, end offset 0, ``--scheduler fcfs``: event 1336, a 432-token
    prompt with no hit and a cached path of 192 tokens: the engine evicted five pages, the preset
    one.)"""
    F, X, Y = toks(500, 32), toks(0, 100), cat(toks(0, 96), toks(700, 8))
    trace = one_per_session(
        (F, toks(5000, 1)), (X, toks(5100, 1)), (Y, toks(5200, 1)), (cat(F, toks(600, 8)), toks(5300, 1))
    )
    knobs = {"additional_snapshot_offsets_from_start": "32", **END0}
    for mode in ({}, FCFS):
        got, sim = run(trace, "trtllm", spec=TINY, capacity=7 * 64 + 5 * 16, state_pool="5", **mode, **knobs)
        assert got == [0, 0, 32, 0]
        sim.tree.check_invariants()
    got, _ = run(trace, "trtllm", spec=TINY, capacity=8 * 64 + 5 * 16, state_pool="5", **knobs)
    assert got == [0, 0, 32, 32]


def test_a_state_victim_on_a_running_leaf_takes_its_chain_out_of_the_tree():
    """Rule 31 (``--scheduler fcfs``): a recurrent page's eviction detaches its block and each
    ancestor left a leaf without one whether or not a request holds them
    (``clear_stale_blocks_after_page_unlink``, ``_block_radix_tree.py`` L572-L597 at 065ff9e9: the
    walk asks only for a recurrent page and children), so a running request whose prompt-end
    snapshot is taken loses its whole chain from the tree; it keeps the pages to its ``close``,
    which frees them instead of queueing them (no longer in the tree). One recurrent page: A (64,
    snapshot 64) runs; B (64, snapshot 64) takes A's page; A's KV stays charged while A runs (its
    pages), and goes at its end (``EngineTree.release_path``). Queued there, it was a KV victim
    later, after older blocks. (ShareGPT 100 sessions, 2GB, interval 256 + end 0, ``--scheduler
    fcfs``: event 381, the snapshot at 459 of a request still decoding; with this rule the two
    trees hold the same blocks outside each such request's run.)"""
    t = _paged_tree(4, 1)
    A = toks(0, 64)
    leaf = t.insert(A, 64, [64], t.set_time(1.0), lock=True).end_node
    _ins(t, toks(500, 64), [64], 2.0)
    assert state_depths(t) == [64] and t.kv_tokens == 64 + 64 and leaf.parent is not None
    now = t.set_time(3.0)
    t.refresh_inserted(t.insert(A, 64, [], now, protect=leaf), now, final=True)
    t.unlock(leaf)
    t.release_path(leaf, None)
    assert leaf.parent is None and t.kv_tokens == 64 and 0 not in t.root.children
    t.check_invariants()


CONTINUOUS = {"mode": "des", "scheduler": "continuous"}


def _held_per_step(monkeypatch) -> list:
    """Each step event's (steps, [(request, position, KV charged to it)]) once the step is done."""
    from sim.engine import batching

    seen = []
    apply = batching.ContinuousEngine._apply

    def recorded(self, batch, k, t0, dt):
        apply(self, batch, k, t0, dt)
        seen.append((k, [(int(s.req.request_id), s.pos, s.held_kv) for s in self.running]))

    monkeypatch.setattr(batching.ContinuousEngine, "_apply", recorded)
    return seen


def test_continuous_a_running_request_holds_whole_pages_of_its_own(monkeypatch):
    """Rule 32 (``--scheduler continuous`` with ``--state-pool``): a running request holds whole
    pages (``_core/_kv_cache.py`` ``resize``: one page per 32-token block of its capacity), not the
    tokens it computed: every page from its hit's block on while its context runs (nothing is the
    tree's before the simulator's prompt insert), then the pages past the tree's (``own_blocks``:
    its partial block at the snapshot point, the tree having a copy, and the decode's); and a
    decode run stops before a step whose token enters a new page (the engine allocates it then,
    evicting then). A (40 tokens, 40 output tokens, end offset 0): 32 tokens of its own after its
    prompt (block 1: tokens 32-40 and the decode's up to 63), runs of 24 and 15 steps (token 64
    opens block 2). Per token it held 0 after its prompt and decoded in one run of 39 steps.
    (ShareGPT 100 sessions, 2GB pools, end offset 0, 0.1 sessions/s: the engine's pools in use and
    the preset's parted at event 824, a run charged at its start evicting a page the engine never
    took.)"""
    seen = _held_per_step(monkeypatch)
    A = toks(0, 40)
    got, sim = run(
        arrivals([(A, 40, 0.0)]), "trtllm", spec=TINY, capacity=8 * 64 + 4 * 16, state_pool="4", **CONTINUOUS, **END0
    )
    assert got == [0]
    assert seen == [(1, [(0, 40, 32)]), (24, [(0, 64, 32)]), (15, [])]
    sim.tree.check_invariants()
    # one budget (no pools): charged per token, as before
    seen.clear()
    run(arrivals([(A, 40, 0.0)]), "trtllm", spec=TINY, **CONTINUOUS, **END0)
    assert seen == [(1, [(0, 40, 0)]), (39, [])]


def test_continuous_a_chunk_ending_on_a_snapshot_point_is_committed_there():
    """Rule 34 (``--scheduler continuous`` with ``--state-pool``): a context chunk that ends on a
    snapshot point inside the prompt is committed there, KV and snapshot
    (``update_context_resources`` calls ``try_commit_blocks`` when ``context_current_position`` is
    in ``expect_snapshot_points``, ``mamba_cache_manager_v2.py`` at 28295084972c L71-L92; the
    commit, ``kv_cache.commit(tokens)``, L50), so a request
    scheduled while the prompt still runs matches it. A (200 tokens, interval 64 + end 0, 64-token
    chunks) commits 64 after its first chunk; B (A's first 64 tokens + 40) is scheduled two
    steps later and reuses 64. The preset inserted A's prompt at its end only: B got 0. The
    harness driving TensorRT-LLM's own tree with these steps gives 0, 64. (ShareGPT 100 sessions,
    2GB pools, interval 256 + end 0, 0.25 sessions/s: requests 336, 1049 and 794 read 256 on the
    engine's tree during other requests' prefills.)"""
    A = toks(0, 200)
    rows = [(A, 4, 0.0), (cat(A[:64], toks(5000, 40)), 1, 0.002)]
    got, sim = run(
        arrivals(rows),
        "trtllm",
        spec=TINY,
        capacity=64 * 64 + 16 * 16,
        state_pool="16",
        periodic_snapshot_interval=64,
        prefill_chunk_tokens=64,
        **CONTINUOUS,
        **END0,
    )
    assert got == [0, 64]
    assert state_depths(sim.tree) == [64, 104, 128, 192, 200]
    sim.tree.check_invariants()


@pytest.mark.parametrize(
    ("interval", "hit_tokens"),
    [(0, 756_449), (256, 487_730)],
)
def test_continuous_sharegpt_rows_match_the_engines_hits(interval, hit_tokens):
    """Rules 26, 29 and the context's snapshots only, under ``--scheduler continuous`` with the
    engine's pools as under fcfs (``ContinuousEngine._prompt_done`` / ``_finish``): the committed
    partial block keeps its place when its request ends (``kvCache.cpp``
    ``_snapshotPartialBlockToTree``), ``close`` queues the request's blocks last first also where it
    inserts nothing (``_core/_kv_cache.py`` ``_clear_blocks``), and the end puts back no prompt
    state evicted since the prefill (``try_commit_blocks``' ``stop_committing``,
    ``mamba_cache_manager_v2.py`` at 28295084972c L58-L59). ShareGPT 100 sessions, the engine's 2GB pools
    (468 attention pages, 29 recurrent), 0.1 sessions/s: the hit tokens TensorRT-LLM's own tree and
    manager give on the simulator's steps (``benchmarks/differential_trtllm.py --scheduler
    continuous``), every request equal; the preset gave 758,748 (end 0) with rule 32's page charge
    alone, 760,240 before rule 32 (485,013 with the interval before rules 32 and 34)."""
    from sim.config import SimConfig
    from sim.engine.drivers import run as drive_run
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace("sharegpt", TraceOptions(sessions=100))
    # the steps TensorRT-LLM's tree was run on were timed by the H200 timing of 2026-12-04 (the
    # committed one until session 19 added the resumed-call term): the same file here, so that
    # the schedule, and so the engine's count, is the one the differential checked
    config = SimConfig(
        policy="trtllm",
        model="qwen3.5-9b",
        timing_file=str(Path(__file__).resolve().parents[1] / "data" / "h200-timing-2026-12-04.json"),
        capacity_bytes=1_984_561_152,
        state_pool="29",
        sessions_per_second=0.1,
        periodic_snapshot_interval=interval,
        prefill_chunk_tokens=8192,
        **CONTINUOUS,
        **END0,
    )
    res = drive_run(build(trace, config))
    assert int(res.requests["hit_tokens"].sum()) == hit_tokens
