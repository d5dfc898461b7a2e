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
from sim.cache.engine_tree import EngineTree

KV, STATE = 2, 16


def _tree(policy, rules=None, capacity=600, state_capacity=None):
    return EngineTree(rules or EngineRules(), capacity_bytes=capacity, kv_bytes_per_token=KV, state_bytes=STATE, block_tokens=1,
                      policy=policy, state_capacity=state_capacity)


op = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=40),
              st.lists(st.integers(1, 40), max_size=4), st.booleans()),
    st.tuples(st.just("match"), st.lists(st.integers(0, 3), min_size=1, max_size=40)),
    st.tuples(st.just("evict_kv"), st.integers(1, 30)),
    st.tuples(st.just("evict_states"), st.integers(1, 3)),
)
engines = st.sampled_from([
    ("sglang", SGLANG_RULES),
    ("sglang", replace(SGLANG_RULES, refresh=SGLANG_PATH_REFRESH, kv_extent="state")),
    ("lmdeploy", EngineRules(refresh=LMDEPLOY_REFRESH, kv_extent="blocks", extent_block=8, frozen_block=8,
                             anchor_block=8, state_pool=True)),
])


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
    tree = _tree(TieredLRUEviction(), EngineRules(kv_extent="blocks", extent_block=8, frozen_block=8, anchor_block=8),
                 capacity=10**6)
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


@pytest.mark.parametrize("rules, lower_state_access, kept", [
    (SGLANG_RULES, 1.0, "B"),  # today's SGLang: the split moves only the lower half's KV
    (replace(SGLANG_RULES, refresh=SGLANG_PATH_REFRESH), 3.0, "A"),  # before #31643: its state too
])
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
    tree = _tree(TieredLRUEviction(), EngineRules(kv_extent="blocks", extent_block=8, frozen_block=8, anchor_block=8),
                 capacity=10**6)
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

    assert parse_state_pool(" 7 ", 16) == 7            # a count (spaces as a shell may leave them)
    assert parse_state_pool(7, 16) == 7
    assert parse_state_pool("160B", 16) == 10          # a size: whole states
    assert parse_state_pool("170B", 16) == 10
    for bad in ("0", "8B", "many"):
        with pytest.raises(UsageError):
            parse_state_pool(bad, 16)
