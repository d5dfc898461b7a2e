"""HybridRadixTree: hand-worked cases for the hit rule, insertion, eviction and locks, plus
hypothesis-driven random operation sequences checked against the invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.eviction import LRULeafEviction, MarconiEviction
from sim.cost import get_model
from sim.cache.tree import HybridRadixTree

KV, STATE = 1, 10  # bytes per token and per checkpoint: easy hand arithmetic


def seq(*xs):
    return np.array(xs, dtype=np.int64)


def make_tree(capacity=10**9, policy=None, hybrid=True, block=1):
    return HybridRadixTree(
        capacity_bytes=capacity,
        kv_bytes_per_token=KV,
        state_bytes=STATE,
        block_tokens=block,
        policy=policy or LRULeafEviction(),
        hybrid=hybrid,
    )


def test_hit_is_deepest_matched_node_with_state_and_partial_edge_gives_nothing():
    t = make_tree()
    t.insert(seq(1, 2, 3, 4, 5, 6), 6, [6], now=1)
    m = t.match(seq(1, 2, 3, 9))
    assert (m.hit_tokens, m.match_tokens) == (0, 3)  # stopped inside the edge: no state there
    assert m.split_node is not None and m.split_offset == 3
    m = t.match(seq(1, 2, 3, 4, 5, 6, 7))
    assert m.hit_tokens == 6 and m.match_tokens == 6


def test_branch_insert_splits_edge_and_stores_state_at_split():
    t = make_tree()
    t.insert(seq(1, 2, 3, 4, 5, 6), 6, [6], now=1)
    t.insert(seq(1, 2, 3, 7, 8), 5, [3, 5], now=2)
    t.check_invariants()
    assert t.kv_tokens == 6 + 2  # shared prefix stored once
    assert t.n_states == 3
    assert t.used_bytes == 8 * KV + 3 * STATE
    assert t.match(seq(1, 2, 3, 9, 9)).hit_tokens == 3
    # a third request can now reuse the branch state
    assert t.match(seq(1, 2, 3, 4, 0)).hit_tokens == 3


def test_checkpoint_inside_a_cached_edge_cuts_it():
    t = make_tree()
    t.insert(seq(*range(10)), 10, [10], now=1)
    t.insert(seq(*range(10)), 10, [4], now=2)  # same tokens, one more state at 4
    t.check_invariants()
    assert t.kv_tokens == 10 and t.n_states == 2
    assert t.match(seq(0, 1, 2, 3, 4, 99)).hit_tokens == 4


def test_pure_transformer_reuses_longest_kv_match_including_partial_edge():
    t = make_tree(hybrid=False)
    t.insert(seq(1, 2, 3, 4, 5, 6), 6, [6], now=1)
    assert t.n_states == 0
    assert t.match(seq(1, 2, 3, 9)).hit_tokens == 3


def test_lru_leaf_evicts_oldest_leaf_and_never_inner_states():
    # capacity for 2 leaves of 5 tokens under a shared 5-token state node, plus one more leaf
    t = make_tree(capacity=25 + 3 * STATE)
    t.insert(seq(1, 1, 1, 1, 1, 2, 2, 2, 2, 2), 10, [10], now=1)  # leaf A (state)
    t.insert(seq(1, 1, 1, 1, 1, 3, 3, 3, 3, 3), 10, [5, 10], now=2)  # branch at 5 + leaf B
    assert t.used_bytes == 15 * KV + 3 * STATE
    # the next insert needs 5 KV + 1 state = 15 bytes; only 10 are free -> evict LRU leaf A
    res = t.insert(seq(1, 1, 1, 1, 1, 4, 4, 4, 4, 4), 10, [10], now=3)
    t.check_invariants()
    assert res.inserted and res.evicted_states == 1 and res.evicted_kv_tokens == 5
    assert t.match(seq(1, 1, 1, 1, 1, 2, 2, 2, 2, 2)).hit_tokens == 5  # A gone, branch state kept
    assert t.match(seq(1, 1, 1, 1, 1, 3, 3, 3, 3, 3)).hit_tokens == 10


def test_marconi_evicts_single_child_state_and_merges_kv():
    spec = get_model("marconi-7b")
    t = make_tree(capacity=12 + 2 * STATE, policy=MarconiEviction(spec, MarconiEviction.Params(alpha=0.0)))
    t.insert(seq(1, 2, 3, 4), 4, [4], now=1)  # turn 1 (state at 4)
    t.insert(seq(1, 2, 3, 4, 5, 6, 7, 8), 8, [8], now=2)  # turn 2 extends it: node 4 is single-child
    assert t.n_states == 2 and t.kv_tokens == 8
    t.touch(t.match(seq(1, 2, 3, 4, 5, 6, 7, 8)).hit_node, now=3)
    # needs 4 KV + 1 state = 14 bytes, 2 free: the stale turn-1 state (single child) goes first
    res = t.insert(seq(9, 9, 9, 9), 4, [4], now=4)
    t.check_invariants()
    assert res.inserted and res.evicted_states == 1 and res.evicted_kv_tokens == 0
    assert t.match(seq(1, 2, 3, 4, 0)).hit_tokens == 0  # that state is gone...
    assert t.match(seq(1, 2, 3, 4, 5, 6, 7, 8)).hit_tokens == 8  # ...its KV merged into turn 2
    assert t.kv_tokens == 12


def test_locked_path_is_never_evicted_and_insert_is_rejected_when_nothing_fits():
    t = make_tree(capacity=10 + STATE)
    t.insert(seq(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 10, [10], now=1, lock=True)
    res = t.insert(seq(5, 5), 2, [2], now=2)
    assert not res.inserted
    assert t.stats.rejected_inserts == 1
    assert t.match(seq(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)).hit_tokens == 10
    t.check_invariants()


def test_split_of_a_locked_edge_inherits_the_lock():
    t = make_tree()
    end = t.insert(seq(1, 2, 3, 4), 4, [4], now=1, lock=True).end_node
    t.insert(seq(1, 2, 9), 3, [2, 3], now=2)
    t.check_invariants()  # lock counts still cover the root path
    t.unlock(end)
    t.check_invariants()
    assert all(n.lock == 0 for n in t.iter_nodes() if n is not t.root)


def test_partial_last_block_counts_its_real_tokens():
    t = make_tree(block=4)
    t.insert(seq(7, 8, 9), 10, [3], now=1)  # 2 full blocks + a 2-token block
    assert t.kv_tokens == 10
    assert t.match(seq(7, 8, 9)).hit_tokens == 10
    assert t.match(seq(7, 8, 5)).hit_tokens == 0


# ---------------------------------------------------------------- property tests

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.lists(st.integers(0, 3), min_size=1, max_size=12),
            st.lists(st.integers(1, 12), max_size=4),
            st.booleans(),
        ),
        st.tuples(st.just("unlock"), st.integers(0, 50)),
        st.tuples(st.just("touch"), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, capacity=st.integers(15, 120), marconi=st.booleans(), alpha=st.sampled_from([0.0, 1.0]))
def test_random_operations_keep_invariants(ops, capacity, marconi, alpha):
    policy = (
        MarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=alpha)) if marconi else LRULeafEviction()
    )
    t = make_tree(capacity=capacity, policy=policy)
    inserted: list[np.ndarray] = []
    locks = []
    now = 0
    for op in ops:
        now += 1
        if op[0] == "insert":
            s = np.array(op[1], dtype=np.int64)
            cps = sorted({c for c in op[2] if c <= len(s)})
            res = t.insert(s, len(s), cps, now, lock=op[3])
            if res.inserted:
                inserted.append(s)
                if op[3]:
                    locks.append(res.end_node)
            locked_seqs = [n for n in locks]
            for n in locked_seqs:
                assert n.parent is not None, "a locked node was evicted"
        elif op[0] == "unlock" and locks:
            t.unlock(locks.pop(op[1] % len(locks)))
        elif op[0] == "touch":
            q = np.array(op[1], dtype=np.int64)
            m = t.match(q)
            # a hit never exceeds what was inserted: some inserted sequence has that prefix,
            # and the hit ends exactly at a node end that holds a state
            if m.hit_tokens:
                assert m.hit_node.has_state and m.hit_node.depth_tokens == m.hit_tokens
                assert any(len(s) >= m.hit_sym and np.array_equal(s[: m.hit_sym], q[: m.hit_sym]) for s in inserted)
            t.touch(m.hit_node, now)
        t.check_invariants()
    for n in locks:
        t.unlock(n)
    t.check_invariants()
    assert t.used_bytes <= capacity


@pytest.mark.parametrize("policy", ["lru", "marconi"])
def test_evicting_everything_returns_to_empty(policy):
    marconi = policy == "marconi"
    pol = MarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=1.0)) if marconi else LRULeafEviction()
    t = make_tree(policy=pol)
    rng = np.random.default_rng(0)
    for i in range(50):
        s = rng.integers(0, 4, size=rng.integers(1, 20))
        t.insert(s, len(s), [len(s)], now=i)
    while (victim := pol.pop_victim()) is not None:
        assert not victim.drop_state_only
        t.evict(victim.node)
        t.check_invariants()
    if policy == "marconi":  # marconi can empty the tree completely
        assert t.kv_tokens == 0 and t.n_states == 0
    else:  # LRU over leaves also cascades up to the root
        assert t.kv_tokens == 0 and t.n_states == 0


def test_planning_counts_the_pad_of_a_partial_last_block_and_evicts_exactly_one_leaf():
    """4-token blocks. A and B: 2 full blocks (8 tokens) + a state = 18 bytes each. C: 3 symbols for
    10 tokens (its last block holds 2) + a state = 20 bytes. Capacity 38 leaves 2 free: evicting
    the LRU leaf A frees 18, exactly enough (38 used after). A plan that ignored the pad would ask
    for 22 bytes and evict B too."""
    t = make_tree(capacity=38, block=4)
    t.insert(seq(1, 2), 8, [2], now=1)
    t.insert(seq(3, 4), 8, [2], now=2)
    assert t.used_bytes == 36
    t.set_time(3)
    res = t.insert(seq(5, 6, 7), 10, [3], now=3)
    t.check_invariants()
    assert res.inserted and (res.evicted_states, res.evicted_kv_tokens) == (1, 8)
    assert t.used_bytes == 38 == t.capacity_bytes and t.stats.evictions == 1
    assert t.match(seq(1, 2)).hit_tokens == 0
    assert t.match(seq(3, 4)).hit_tokens == 8
    assert t.match(seq(5, 6, 7)).hit_tokens == 10


def test_partial_last_block_insert_that_fits_exactly_evicts_nothing():
    t = make_tree(capacity=20, block=4)
    res = t.insert(seq(5, 6, 7), 10, [3], now=1)  # 10 tokens + a state = 20 bytes = the capacity
    assert res.inserted and t.stats.eviction_calls == 0 and t.used_bytes == 20
    # one more block under it (4 tokens + a state) must evict it: nothing else is there
    res = t.insert(seq(8, 9), 8, [2], now=2)
    assert res.inserted and res.evicted_kv_tokens == 10 and t.used_bytes == 18
