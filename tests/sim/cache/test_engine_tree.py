"""The engines' cache variant (``sim/cache/engine_tree.py``): random operation sequences under
every combination of engine rules keep the tree's invariants and the pools' bounds; plus the
exact accounting of each rule on a hand-checked case."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import EngineRules
from policies.lmdeploy import LMDEPLOY_REFRESH, TieredLRUEviction
from policies.sglang import SGLANG_PATH_REFRESH, SGLANG_RULES, TwoListLRUEviction
from tree_cases import KV, STATE, engine_tree


def _tree(policy, rules=None, capacity=600, state_capacity=None):
    return engine_tree(rules, policy, capacity=capacity, states=state_capacity)


op = st.one_of(
    st.tuples(
        st.just("insert"),
        st.lists(st.integers(0, 3), min_size=1, max_size=40),
        st.lists(st.integers(1, 40), max_size=4),
        st.booleans(),
    ),
    st.tuples(st.just("match"), st.lists(st.integers(0, 3), min_size=1, max_size=40)),
    st.tuples(st.just("evict_kv"), st.integers(1, 30)),
    st.tuples(st.just("evict_states"), st.integers(1, 3)),
)
engines = st.sampled_from(
    [
        ("sglang", SGLANG_RULES),
        ("sglang", replace(SGLANG_RULES, refresh=SGLANG_PATH_REFRESH, kv_extent="state")),
        (
            "lmdeploy",
            EngineRules(
                refresh=LMDEPLOY_REFRESH,
                kv_extent="blocks",
                extent_block=8,
                frozen_block=8,
                anchor_block=8,
                state_pool=True,
            ),
        ),
    ]
)


@settings(max_examples=150, deadline=None)
@given(engine=engines, pool=st.sampled_from([None, 3, 8]), ops=st.lists(op, max_size=25))
def test_random_operations_keep_the_invariants_and_the_pools(engine, pool, ops):
    kind, rules = engine
    policy = TwoListLRUEviction() if kind == "sglang" else TieredLRUEviction()
    tree = _tree(policy, rules, state_capacity=pool)
    locked = []
    for t, o in enumerate(ops, start=1):
        tree.set_time(float(t))
        if o[0] == "insert":
            seq = np.array(o[1], dtype=np.int64)
            cps = sorted({c for c in o[2] if c <= len(seq)})
            res = tree.insert(seq, len(seq), cps, float(t), lock=o[3])
            if res.inserted and o[3]:
                locked.append(res.end_node)
        elif o[0] == "match":
            tree.lookup(np.array(o[1], dtype=np.int64))
        elif pool is not None or o[0] == "evict_kv":
            if o[0] == "evict_kv":
                tree.evict_kv(o[1])
            else:
                tree.evict_states(o[1])
        tree.check_invariants()
        if len(locked) > 2:
            tree.unlock(locked.pop(0))
            tree.check_invariants()
    for node in locked:
        tree.unlock(node)
    tree.check_invariants()
    if pool is not None:
        assert tree.n_states <= pool and tree.kv_bytes <= tree.kv_capacity_bytes


def test_frozen_block_and_kv_extent_accounting():
    # block 8: a 21-token sequence with a checkpoint at 21 keeps [0, 16) as whole blocks and the
    # frozen tail [16, 21): 21 tokens + 3 more for its frozen block = 3 blocks; an insert of 30
    # tokens with no state past 24 keeps 24 (whole blocks), the checkpoint at 21 stays (covered)
    tree = _tree(
        TieredLRUEviction(),
        EngineRules(kv_extent="blocks", extent_block=8, frozen_block=8, anchor_block=8),
        capacity=10**6,
    )
    tree.insert(np.arange(21), 21, [21], 1.0)
    assert (tree.kv_tokens, tree.frozen_tokens, tree.n_states) == (21, 3, 1)
    tree.insert(np.arange(30), 30, [], 2.0)
    assert (tree.kv_tokens, tree.frozen_tokens, tree.n_states) == (24, 3, 1)
    assert tree.used_bytes == (24 + 3) * KV + STATE
    # a checkpoint at 23 (same anchor 16) replaces the one at 21
    tree.insert(np.arange(23), 23, [23], 3.0)
    assert tree.states_replaced == 1 and tree.n_states == 1 and tree.frozen_tokens == 1
    assert tree.lookup(np.arange(24)).hit_tokens == 23
    tree.check_invariants()


def test_state_extent_keeps_kv_up_to_the_last_state():
    tree = _tree(TwoListLRUEviction(), EngineRules(kv_extent="state"), capacity=10**6)
    assert tree.insert(np.arange(30), 30, [], 1.0).end_node is tree.root  # no state: nothing kept
    tree.insert(np.arange(30), 30, [12], 1.0)
    assert tree.kv_tokens == 12 and tree.n_states == 1


def test_each_pool_pressure_pops_from_its_own_list():
    """Two pools (SGLang's --max-mamba-cache-size): KV pressure takes the KV list's victim (a
    stateless leaf goes first, SGLang's evict_full), state pressure the state list's (the least
    recent state; an inner one leaves its KV behind, evict_mamba). 2 B of KV per token, 16 B per
    state, room for 2 states and 30 KV tokens."""
    # KV pressure: A (10 tokens, state at 10), then E (15 tokens, no state): 25 tokens. D needs 10
    # more: the KV list gives the stateless E (the state list would have given A's state, whole leaf)
    tree = _tree(TwoListLRUEviction(), capacity=30 * KV + 2 * STATE, state_capacity=2)
    tree.set_time(1.0)
    tree.insert(np.arange(10), 10, [10], 1.0)
    tree.set_time(2.0)
    tree.insert(np.arange(500, 515), 15, [], 2.0)
    tree.set_time(3.0)
    tree.insert(np.arange(300, 310), 10, [10], 3.0)
    assert (tree.kv_tokens, tree.n_states) == (20, 2)
    assert tree.match(np.arange(10)).hit_tokens == 10 and tree.match(np.arange(500, 515)).match_sym == 0
    tree.check_invariants()

    # state pressure: A with states at 5 and 10 fills the state pool; B needs one: the state list
    # gives A's shallower state (ties: the shallower), which goes alone; its KV stays (15 tokens)
    tree = _tree(TwoListLRUEviction(), capacity=30 * KV + 2 * STATE, state_capacity=2)
    tree.set_time(1.0)
    tree.insert(np.arange(10), 10, [5, 10], 1.0)
    tree.set_time(2.0)
    tree.insert(np.arange(100, 105), 5, [5], 2.0)
    assert (tree.kv_tokens, tree.n_states) == (15, 2)
    assert tree.match(np.arange(10)).hit_tokens == 10
    assert tree.match(np.concatenate([np.arange(5), [77]])).hit_tokens == 0  # the state at 5 is gone
    tree.check_invariants()


@pytest.mark.parametrize(
    "rules, lower_state_access, kept",
    [
        (SGLANG_RULES, 1.0, "B"),  # today's SGLang: the split moves only the lower half's KV
        (replace(SGLANG_RULES, refresh=SGLANG_PATH_REFRESH), 3.0, "A"),  # before #31643: its state too
    ],
)
def test_a_split_refreshes_the_lower_halfs_state_only_under_path_refresh(rules, lower_state_access, kept):
    """An insert that splits an edge leaves the lower half's KV most recent; its state's recency
    moves too only under SGLang's old path refresh (``state="with-kv"``). A (10 tokens, state at
    10) at t=1 and B (10 tokens, state at 10) at t=2; at t=3 an insert sharing A's first 5 tokens
    splits A into [0, 5) and [5, 10). The state list's least recent state then goes: A's under
    today's refresh (its state is still from t=1), B's under path refresh."""
    tree = _tree(TwoListLRUEviction(), rules, capacity=10**6, state_capacity=3)
    tree.set_time(1.0)
    tree.insert(np.arange(10), 10, [10], 1.0)
    tree.set_time(2.0)
    tree.insert(np.arange(100, 110), 10, [10], 2.0)
    tree.set_time(3.0)
    tree.insert(np.array([0, 1, 2, 3, 4, 99, 98]), 7, [], 3.0)
    upper = tree.root.children[0]
    lower = upper.children[5]
    assert (upper.n_tokens, lower.n_tokens, lower.has_state) == (5, 5, True)
    assert (lower.last_access, lower.state_access) == (3.0, lower_state_access)
    assert tree.evict_states(1) == 1
    hits = (tree.match(np.arange(10)).hit_tokens, tree.match(np.arange(100, 110)).hit_tokens)
    assert hits == ((10, 0) if kept == "A" else (0, 10))
    tree.check_invariants()


def test_every_insert_refreshes_the_kv_recency_of_the_path_it_walks():
    """SGLang's insert walk (``insert="every"``): inserting a sequence already cached moves its
    path's KV recency to now (its state recency stays: today's refresh moves only a used state).
    A at t=1, B at t=2, A again at t=3: B is then the least recent leaf, so KV pressure takes B."""
    tree = _tree(TwoListLRUEviction(), SGLANG_RULES, capacity=10**6)
    tree.set_time(1.0)
    tree.insert(np.arange(10), 10, [10], 1.0)
    tree.set_time(2.0)
    tree.insert(np.arange(100, 110), 10, [10], 2.0)
    tree.set_time(3.0)
    res = tree.insert(np.arange(10), 10, [10], 3.0)
    a, b = tree.root.children[0], tree.root.children[100]
    assert res.inserted and res.end_node is a
    assert (a.last_access, a.state_access, b.last_access) == (3.0, 1.0, 2.0)
    assert tree.evict_kv(1) == 10
    assert (tree.match(np.arange(10)).hit_tokens, tree.match(np.arange(100, 110)).hit_tokens) == (10, 0)


def test_reinserting_the_same_anchored_state_replaces_nothing():
    """LMDeploy anchors (block 8): a second insert of the same 21 tokens with the same state at
    21 finds that state on its own path at the same step, so nothing is given up; the one state
    and its frozen 3-token block tail stay as they were."""
    tree = _tree(
        TieredLRUEviction(),
        EngineRules(kv_extent="blocks", extent_block=8, frozen_block=8, anchor_block=8),
        capacity=10**6,
    )
    tree.insert(np.arange(21), 21, [21], 1.0)
    tree.insert(np.arange(21), 21, [21], 2.0)
    assert (tree.states_replaced, tree.n_states, tree.frozen_tokens, tree.kv_tokens) == (0, 1, 3, 21)
    assert tree.lookup(np.arange(24)).hit_tokens == 21
    tree.check_invariants()


def test_an_insert_under_pool_pressure_reports_what_it_evicted():
    """With two pools, the insert's result counts the states and KV tokens its evictions freed:
    A (10 tokens, state) and the stateless E (15 tokens) fill 25 of 30 KV tokens; D (10 tokens,
    state) needs 5 more, and the KV list gives E: 0 states, 15 KV tokens."""
    tree = _tree(TwoListLRUEviction(), capacity=30 * KV + 2 * STATE, state_capacity=2)
    tree.set_time(1.0)
    tree.insert(np.arange(10), 10, [10], 1.0)
    tree.set_time(2.0)
    tree.insert(np.arange(500, 515), 15, [], 2.0)
    tree.set_time(3.0)
    res = tree.insert(np.arange(300, 310), 10, [10], 3.0)
    assert res.inserted and (res.evicted_states, res.evicted_kv_tokens) == (0, 15)
    assert tree.stats.kv_tokens_evicted == 15


def test_state_pool_parses_counts_and_sizes():
    from sim.cache.engine_tree import parse_state_pool
    from sim.errors import UsageError

    assert parse_state_pool(" 7 ", 16) == 7  # a count (spaces as a shell may leave them)
    assert parse_state_pool(7, 16) == 7
    assert parse_state_pool("160B", 16) == 10  # a size: whole states
    assert parse_state_pool("170B", 16) == 10
    for bad in ("0", "8B", "many"):
        with pytest.raises(UsageError):
            parse_state_pool(bad, 16)


# ---------------------------------------------------------------------- hash blocks (symbols of G tokens)
# LMDeploy's 64-token block on a trace whose symbols are 512 tokens (Mooncake) or 16 (Bailian):
# a prompt's last symbol is partial, so a state's exact token (not ``c * G``) sets its frozen block
LMD64 = EngineRules(
    refresh=LMDEPLOY_REFRESH, kv_extent="blocks", extent_block=64, frozen_block=64, anchor_block=64, state_pool=True
)


def _hash_tree(G, capacity=10**9, state_capacity=None, rules=LMD64):
    return engine_tree(rules, TieredLRUEviction(), capacity=capacity, block_tokens=G, states=state_capacity)


@pytest.mark.parametrize("pool", [None, 2])
def test_a_partial_last_hash_block_plans_its_frozen_block(pool):
    """The crash of `run --policy lmdeploy --trace mooncake:sample --capacity 5GB`: a prompt of
    1000 tokens on two 512-token symbols ends at 1000, off the 64-token grid, so its state owns
    a frozen block of 24 more tokens; planning it at 2 x 512 = 1024 tokens (on the grid) charged
    nothing, evicted too little and left the cache 48 B over capacity."""
    # A (one symbol, 512 tokens, state at 512: on the grid) costs 1024 + 16 B; B costs
    # (1000 + 24) x 2 + 16 = 2064 B; the cache is 1 B short of both
    cap = 1024 + STATE + 2064 - 1
    tree = _hash_tree(512, capacity=cap, state_capacity=pool)
    tree.set_time(1.0)
    assert tree.insert(np.array([9]), 512, [1], 1.0).inserted
    tree.set_time(2.0)
    res = tree.insert(np.array([1, 2]), 1000, [2], 2.0)
    assert res.inserted and res.evicted_states == 1  # A had to go
    assert (tree.kv_tokens, tree.frozen_tokens, tree.n_states) == (1000, 24, 1)
    assert tree.used_bytes == 2064 <= tree.capacity_bytes
    tree.check_invariants()


@pytest.mark.parametrize(
    ("G", "n_sym", "tokens", "kept"),
    [
        (512, 2, 1000, 512),  # the anchor block [960, 1024) lies inside symbol 2: the whole symbol goes
        (512, 3, 1400, 1024),  # [1344, 1408) inside symbol 3: symbols 1-2 stay
        (16, 63, 1000, 960),  # Bailian: blocks are whole symbols, the trie keeps [0, 960)
    ],
)
def test_a_frozen_trim_keeps_whole_symbols(G, n_sym, tokens, kept):
    """A dropped partial checkpoint frees its frozen block and the tokens only it held, back to
    the last 64-token block boundary, rounded down to a whole symbol (the tree holds symbols)."""
    tree = _hash_tree(G)
    tree.set_time(1.0)
    tree.insert(np.arange(1, n_sym + 1), tokens, [n_sym], 1.0)
    assert tree.frozen_tokens == 64 - tokens % 64
    assert tree.evict_kv(1) > 0  # KV pressure: the frozen checkpoint goes first
    assert (tree.n_states, tree.frozen_tokens, tree.kv_tokens) == (0, 0, kept)
    tree.check_invariants()


def test_the_prompt_end_anchor_is_its_exact_token():
    """Bailian's 16-token symbols: a prompt of 1020 tokens (64 symbols, the last 12 tokens) ends
    on the anchor block [960, 1024), as a chunk end at 976 does: one checkpoint stays (c x 16 =
    1024 would have anchored it on the next block and kept both)."""
    tree = _hash_tree(16)
    tree.set_time(1.0)
    tree.insert(np.arange(1, 65), 1020, [61, 64], 1.0)
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [1020]
    tree.check_invariants()


def test_an_anchor_inside_a_symbol_is_shared_only_by_that_symbol():
    """512-token symbols: prompts [1, 2] (1000 tokens) and [1, 3] (990) both end on the anchor
    block [960, 1024), but they differ in the symbol holding it, so they share no anchor (a hash
    block that differs is not matched in part, as a lookup does not): both states stay."""
    for rules in (LMD64, replace(LMD64, anchor_refusals=True)):
        tree = _hash_tree(512, rules=rules)
        tree.set_time(1.0)
        tree.insert(np.array([1, 2]), 1000, [2], 1.0)
        tree.set_time(2.0)
        tree.insert(np.array([1, 3]), 990, [2], 2.0)
        assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [990, 1000]
        assert tree.states_replaced == 0
        tree.check_invariants()


hash_op = st.one_of(
    st.tuples(
        st.just("insert"),
        st.lists(st.integers(0, 3), min_size=1, max_size=12),
        st.lists(st.integers(1, 12), max_size=3),
        st.integers(0, 511),
        st.booleans(),
    ),
    st.tuples(st.just("evict_kv"), st.integers(1, 600)),
    st.tuples(st.just("evict_states"), st.integers(1, 3)),
)


@settings(max_examples=150, deadline=None)
@given(
    G=st.sampled_from([16, 512]),
    pool=st.sampled_from([None, 3]),
    capacity=st.integers(1200, 12000),
    refusals=st.booleans(),
    ops=st.lists(hash_op, max_size=20),
)
def test_hash_blocks_keep_the_invariants_under_pressure(G, pool, capacity, refusals, ops):
    """Random inserts of partial-last-symbol sequences (``pad`` tokens short) on 16- and 512-token
    symbols under LMDeploy's 64-token rules, in a small cache: the planned room is what the insert
    charges, so the cache never exceeds its capacity (nor a pool its share)."""
    rules = replace(LMD64, anchor_refusals=refusals)
    capacity = max(capacity, (pool or 0) * STATE + 64 * KV + STATE)
    tree = _hash_tree(G, capacity=capacity * (G // 16), state_capacity=pool, rules=rules)
    locked = []
    for t, o in enumerate(ops, start=1):
        tree.set_time(float(t))
        if o[0] == "insert":
            seq = np.array(o[1], dtype=np.int64)
            cps = sorted({c for c in o[2] if c <= len(seq)})
            before = tree.used_bytes
            res = tree.insert(seq, len(seq) * G - o[3] % G, cps, float(t), lock=o[4])
            assert tree.used_bytes <= tree.capacity_bytes, (before, tree.used_bytes)
            if res.inserted and o[4]:
                locked.append(res.end_node)
        elif pool is not None or o[0] == "evict_kv":
            if o[0] == "evict_kv":
                tree.evict_kv(o[1])
            else:
                tree.evict_states(o[1])
        tree.check_invariants()
        if len(locked) > 1:
            tree.unlock(locked.pop(0))
            tree.check_invariants()
    for node in locked:
        tree.unlock(node)
    tree.check_invariants()


def test_an_anchor_block_replaces_only_states_on_paths_sharing_the_anchor():
    """LMDeploy's one state per block anchor (``_states_in_block``): a new checkpoint replaces the
    states that end in the same 8-token block on paths sharing the tokens before the anchor, not
    those on a branch that left earlier. Q = 0..5 then 200..215 with a state at 12; P = 0..5 then
    100..115 with a state at 10: both end in the block [8, 16), but Q left P's path at token 6,
    before the anchor at 8, so Q's state stays. R = 0..5 then 300..303 (a state at 10), inserted
    between them, splits the tree at token 6 first, so P's walk to its anchor crosses that whole
    edge before leaving the tree: three states, nothing replaced."""
    tree = _tree(TieredLRUEviction(), EngineRules(anchor_block=8), capacity=10**6)
    q = np.concatenate([np.arange(6), np.arange(200, 216)])
    r = np.concatenate([np.arange(6), np.arange(300, 304)])
    p = np.concatenate([np.arange(6), np.arange(100, 116)])
    tree.insert(q, len(q), [12], 1.0)
    tree.insert(r, len(r), [10], 2.0)
    tree.insert(p, len(p), [10], 3.0)
    assert (tree.n_states, tree.states_replaced) == (3, 0)
    assert tree.lookup(q).hit_tokens == 12
    tree.check_invariants()


def test_an_insert_that_fits_exactly_makes_no_eviction_call():
    """One budget (no state pool): 20 tokens and one state = 2 x 20 + 16 = 56 bytes in 56 fit
    with no call to make room (the alpha tuner starts at the first such call); a second path of
    one token then has to make room. Mutation survivor ``-m engine_tree --seed 1`` (2026-12-05):
    engine_tree.py L141, ``_fits`` answering None."""
    t = _tree(TwoListLRUEviction(), SGLANG_RULES, capacity=2 * 20 + STATE)
    seq = np.arange(20, dtype=np.int64)
    assert t.insert(seq, 20, [20], t.set_time(1.0)).inserted
    assert t.stats.eviction_calls == 0 and t.used_bytes == t.capacity_bytes
    t.insert(np.array([99], dtype=np.int64), 1, [], t.set_time(2.0))
    assert t.stats.eviction_calls == 1


def test_a_snapshot_is_not_kept_under_a_deeper_one_ending_its_block_on_the_same_edge():
    """TensorRT-LLM's one page per block (``snapshot_block`` 8): a state at 8 on one 8-token edge
    already covers the block (0, 8]; a later insert of that edge's first 4 tokens with a snapshot
    at 4 keeps nothing (the deeper state extends its path) and gives the new one up. The deeper
    state's edge starts at 0 and ends at the block's end: the walk must look inside it. Mutation
    survivor ``-m engine_tree --seed 1`` (2026-12-05): engine_tree.py L392, the walk's pruning by
    ``depth + n_tokens`` (a subtree starting at 8 or deeper) instead of ``depth - n_tokens``."""
    tree = _tree(TieredLRUEviction(), EngineRules(snapshot_block=8), capacity=10**6)
    seq = np.arange(8, dtype=np.int64)
    tree.insert(seq, 8, [8], tree.set_time(1.0))
    tree.insert(seq[:4], 4, [4], tree.set_time(2.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [8]
    assert tree.states_replaced == 1
    tree.check_invariants()


def test_an_anchor_state_on_a_node_ending_at_the_anchor_start_is_replaced():
    """LMDeploy's one state per anchor (``anchor_block`` 8): a state at exactly 8 sits on the
    anchor block [8, 16), as a new checkpoint at 12 does on a path that extends it: the new one
    replaces it. Then with the tree split at 8 (a branch 0..7, 300..303 with no state), a state
    at 12 on the branch 0..7, 100..103 is replaced by a checkpoint at 14 on a third branch: the
    walk stops at the node ending at the anchor and searches all its branches. Mutation survivor
    ``-m engine_tree --seed 1`` (2026-12-05): engine_tree.py L491, the anchor walk descending past
    a node whose depth equals the anchor (``<=``)."""
    tree = _tree(TieredLRUEviction(), EngineRules(anchor_block=8), capacity=10**6)
    tree.insert(np.arange(8), 8, [8], tree.set_time(1.0))
    tree.insert(np.arange(16), 16, [12], tree.set_time(2.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [12]
    assert tree.states_replaced == 1
    tree.check_invariants()

    tree = _tree(TieredLRUEviction(), EngineRules(anchor_block=8), capacity=10**6)
    a = np.concatenate([np.arange(8), np.arange(100, 104)])
    c = np.concatenate([np.arange(8), np.arange(300, 304)])
    b = np.concatenate([np.arange(8), np.arange(200, 208)])
    tree.insert(a, 12, [12], tree.set_time(1.0))
    tree.insert(c, 12, [], tree.set_time(2.0))
    tree.insert(b, 16, [14], tree.set_time(3.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [14]
    assert tree.states_replaced == 1
    tree.check_invariants()


def test_checkpoints_past_where_an_insert_leaves_a_cached_edge_anchor_at_their_own_tokens():
    """LMDeploy's 8-token rules: a cached edge 0..11 (a state at 12); an insert of 0..5 then
    100..113 leaves it at token 6 and asks for states at 14 and 17, both past the split: anchored
    at their own tokens (``_state_depths``), on blocks [8, 16) and [16, 24), both are kept (and the
    state at 12, on the other path, too). Mutation survivor ``-m engine_tree --seed 1``
    (2026-12-05): engine_tree.py L179, ``pos -= m`` at the split, which placed them 12 tokens
    deeper, on one anchor (only 17 kept)."""
    rules = EngineRules(kv_extent="blocks", extent_block=8, frozen_block=8, anchor_block=8)
    tree = _tree(TieredLRUEviction(), rules, capacity=10**6)
    tree.insert(np.arange(12), 12, [12], tree.set_time(1.0))
    seq = np.concatenate([np.arange(6), np.arange(100, 114)])
    tree.insert(seq, 20, [14, 17], tree.set_time(2.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [12, 14, 17]
    assert tree.states_replaced == 0
    assert tree.frozen_tokens == 4 + 2 + 7
    tree.check_invariants()


def test_a_snapshot_is_not_kept_under_a_deeper_one_below_a_split():
    """As above, with the deeper state one node further down: 0..7 with a state at 8, then 0..5,
    99 (no state) splits it at 6, so the state sits on the lower edge [6, 8). A snapshot at 4 has
    the node ending at 6 below it, and the state at 8 under that node still covers the block
    (0, 8]: the new one is given up. Mutation survivor ``-m engine_tree --seed 2`` (2026-12-05):
    engine_tree.py L396, the walk not descending below its first node."""
    tree = _tree(TieredLRUEviction(), EngineRules(snapshot_block=8), capacity=10**6)
    seq = np.arange(8, dtype=np.int64)
    tree.insert(seq, 8, [8], tree.set_time(1.0))
    tree.insert(np.array([0, 1, 2, 3, 4, 5, 99]), 7, [], tree.set_time(2.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n is not tree.root) == [6, 7, 8]
    tree.insert(seq[:4], 4, [4], tree.set_time(3.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [8]
    assert tree.states_replaced == 1
    tree.check_invariants()


def test_an_insert_the_engine_keeps_nothing_of_is_not_a_rejection():
    """SGLang's extra-buffer extent (``kv_extent="state"``): a sequence inserted without a state
    keeps no KV at all; the insert succeeds with nothing added (it ends at the root), and no
    rejected insert is counted (the simulation reports a rejected insert as "no room"). Mutation
    survivor ``-m engine_tree --seed 2`` (2026-12-05): engine_tree.py L432, that empty insert
    answering ``inserted=False``."""
    tree = _tree(TwoListLRUEviction(), replace(SGLANG_RULES, kv_extent="state"), capacity=10**6)
    res = tree.insert(np.arange(10, dtype=np.int64), 10, [], tree.set_time(1.0))
    assert res.inserted and res.end_node is tree.root
    assert (res.new_kv_tokens, res.new_states) == (0, 0)
    assert (tree.kv_tokens, tree.n_states, tree.stats.rejected_inserts) == (0, 0, 0)
    tree.check_invariants()


def test_a_snapshot_is_kept_when_the_path_leaves_a_deeper_states_edge_before_it():
    """TensorRT-LLM's blocks of 8: a state at 8 on the edge 0..7; a path 0, 1, 2, 50, 51, 52
    leaves that edge at token 3, before its snapshot at 6, so the two sit in different blocks
    (different tokens): both are kept. Mutation survivor ``-m engine_tree --seed 3`` (2026-12-05):
    engine_tree.py L384, the walk taking the edge's end (``max``) for where the path leaves it."""
    tree = _tree(TieredLRUEviction(), EngineRules(snapshot_block=8), capacity=10**6)
    tree.insert(np.arange(8, dtype=np.int64), 8, [8], tree.set_time(1.0))
    tree.insert(np.array([0, 1, 2, 50, 51, 52]), 6, [6], tree.set_time(2.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [6, 8]
    assert tree.states_replaced == 0
    tree.check_invariants()


def test_a_deeper_snapshot_of_the_block_replaces_the_shallower_one_two_edges_up():
    """TensorRT-LLM's one page per block (blocks of 8): 0..5 with a snapshot at 2 (edges [0, 2)
    and [2, 6)); the same tokens again with a snapshot at 6: no cached path branches off between
    2 and 6, so the new page replaces the one at 2 (``replace_page``). The branch check walks both
    edges. Mutation survivor ``-m engine_tree --seed 3`` (2026-12-05): engine_tree.py L361,
    the former ``_branches`` matching the edge against the wrong sequence (it saw a branch on the second
    edge and kept both)."""
    tree = _tree(TieredLRUEviction(), EngineRules(snapshot_block=8), capacity=10**6)
    seq = np.arange(6, dtype=np.int64)
    tree.insert(seq, 6, [2], tree.set_time(1.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n is not tree.root) == [2, 6]
    tree.insert(seq, 6, [6], tree.set_time(2.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [6]
    assert tree.states_replaced == 1
    tree.check_invariants()
