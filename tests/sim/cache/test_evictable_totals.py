"""The evictable totals behind ``HybridRadixTree.could_reserve`` (``evictable_kv``,
``evictable_states``) are kept node by node as the tree changes; after any sequence of inserts,
lookups, locks (whole paths and locks ending inside a locked path), unlocks, evictions, reserves
and a policy switch they equal a from-scratch walk, and ``could_reserve`` answers what the walk it
replaced answered. Each engine policy that tells apart a locked node's state (SGLang's state list:
only a lock ending at the node holds its state; vLLM's free queue: a running path's states stay
free) is driven through its own tree variant. TensorRT-LLM's pools (``trtllm --state-pool``) also
keep the whole pages' padding (``EngineTree._pad``) node by node: ``check_invariants`` holds it to
the walk ``_page_pad`` after every operation, evictions of both queues included."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import EngineRules
from policies.eviction import LRULeafEviction, MarconiEviction
from policies.lmdeploy import TieredLRUEviction, block_rules
from policies.sglang import SGLANG_RULES, TwoListLRUEviction, UnifiedTwoListEviction
from policies.trtllm_current import TrtllmPoolEviction, pool_rules
from policies.vllm_current import VllmFreeQueueEviction
from sim.cache.tree import HybridRadixTree
from sim.cost import get_model
from tree_cases import KV, STATE, engine_tree

#: what ``policies.sglang_current``'s preset asks for with extra_buffer (``engine_rules``)
SGLANG_CURRENT_RULES = replace(SGLANG_RULES, cascade=False, kv_extent="state")
LMDEPLOY_RULES = block_rules(8)
#: what ``policies.trtllm_current``'s preset asks for with ``--state-pool``, with 4-token blocks and
#: pages (the sequences here are up to 24 tokens: several pages, a block's inner branches)
TRTLLM_POOL_RULES = pool_rules(4)


def _policy(name):
    return {
        "lru": LRULeafEviction,
        "marconi": lambda: MarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=1.0)),
        "sglang": UnifiedTwoListEviction,
        "sglang-0.5.9": TwoListLRUEviction,
        "vllm": VllmFreeQueueEviction,
        "lmdeploy": TieredLRUEviction,
        "trtllm": TrtllmPoolEviction,
    }[name]()


SETUPS = {  # name -> (policy, engine rules; None: the core tree)
    "lru": ("lru", None),
    "marconi": ("marconi", None),
    "sglang": ("sglang", SGLANG_CURRENT_RULES),
    "sglang-0.5.9": ("sglang-0.5.9", SGLANG_RULES),
    "vllm": ("vllm", EngineRules(kv_extent="blocks", extent_block=4)),
    "lmdeploy": ("lmdeploy", LMDEPLOY_RULES),
    "trtllm": ("trtllm", TRTLLM_POOL_RULES),
}


def _tree(setup: str, capacity: int, pool: int | None) -> HybridRadixTree:
    name, rules = SETUPS[setup]
    if rules is None:
        return HybridRadixTree(
            policy=_policy(name), capacity_bytes=capacity, kv_bytes_per_token=KV, state_bytes=STATE, block_tokens=1
        )
    return engine_tree(rules, _policy(name), capacity=capacity, states=pool if rules.state_pool else None)


def walk_could_reserve(tree: HybridRadixTree, kv_tokens: int, states: int) -> bool | None:
    """``could_reserve`` as it was, a walk over the tree (the oracle)."""
    kv_bytes = kv_tokens * tree.kv_bytes_per_token
    need = kv_bytes + states * tree.state_bytes
    tree._pending = (kv_bytes, states)
    if need <= 0 or tree._fits(need):
        return True
    keys = getattr(tree.policy, "keys", None)
    if keys is None:
        return None
    kv_free, states_free = tree.evictable_walk()  # itself checked against the totals (``_check``)
    return tree._fits_freed(kv_free, states_free, kv_bytes, states)


def _check(tree: HybridRadixTree, asks) -> None:
    assert (tree.evictable_kv, tree.evictable_states) == tree.evictable_walk()
    for kv, states in asks:
        assert tree.could_reserve(kv, states) == walk_could_reserve(tree, kv, states), (kv, states)


symbols = st.lists(st.integers(0, 3), min_size=1, max_size=24)
op = st.one_of(
    st.tuples(st.just("insert"), symbols, st.lists(st.integers(1, 24), max_size=4), st.booleans()),
    st.tuples(st.just("lookup"), symbols),
    # a lock ending at any node of an inserted sequence's path (inside a locked path, too)
    st.tuples(st.just("lock"), st.integers(0, 30), st.integers(0, 30)),
    st.tuples(st.just("unlock"), st.integers(0, 30)),
    st.tuples(st.just("evict"), st.integers(1, 3)),
    st.tuples(st.just("reserve"), st.integers(0, 40), st.integers(0, 2)),
    st.tuples(st.just("release"), st.integers(0, 30)),
)


@settings(max_examples=300, deadline=None)
@given(
    setup=st.sampled_from(sorted(SETUPS)),
    capacity=st.integers(60, 400),
    pool=st.sampled_from([None, 3]),
    ops=st.lists(op, min_size=4, max_size=30),
    asks=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 4)), min_size=1, max_size=3),
)
def test_incremental_totals_equal_a_walk_after_any_operations(setup, capacity, pool, ops, asks):
    tree = _tree(setup, capacity, pool)
    locks: list = []
    inserted: list[np.ndarray] = []
    held: list[tuple[int, int]] = []
    for t, o in enumerate(ops, start=1):
        now = tree.set_time(float(t))
        if o[0] == "insert":
            seq = np.array(o[1], dtype=np.int64)
            cps = sorted({1 + (c - 1) % len(seq) for c in o[2]})
            res = tree.insert(seq, len(seq), cps, now, lock=o[3])
            inserted.append(seq)
            if res.inserted and o[3] and res.end_node is not tree.root:
                locks.append(res.end_node)
        elif o[0] == "lookup":
            tree.lookup(np.array(o[1], dtype=np.int64), now=now)
        elif o[0] == "lock" and inserted:
            path = tree.match(inserted[o[1] % len(inserted)]).path
            path = [n for n in path if n.has_state] or path  # a state's share is what a lock may change
            if path:
                node = path[o[2] % len(path)]
                tree.lock(node)
                locks.append(node)
        elif o[0] == "unlock" and locks:
            tree.unlock(locks.pop(o[1] % len(locks)))
        elif o[0] == "evict":
            victim = tree.policy.pop_victim()
            if victim is not None:
                tree._apply_victim(victim)
        elif o[0] == "reserve":
            if tree.reserve(o[1], o[2]):
                held.append((o[1], o[2]))
        elif o[0] == "release" and held:
            tree.release(*held.pop(o[1] % len(held)))
        tree.check_invariants()
        _check(tree, asks)
    if setup in ("sglang", "vllm"):
        # a policy switch (a tuner's, ``Simulation.set_eviction``) while requests hold their paths:
        # a locked state's share follows the new policy's keys (the core LRU has none: no locked
        # state is free any more)
        tree.policy = _policy("lru")
        tree.policy.attach(tree)
        for node in tree.iter_nodes():
            if node is not tree.root:
                tree.policy.add(node)
        tree.recount_evictable()
        assert (tree.evictable_kv, tree.evictable_states) == tree.evictable_walk()
    for node in locks:
        tree.unlock(node)
    _check(tree, asks)


def _sglang_with_locked_states():
    """Three states on one path 0..8 (at 3, 6, 9), the path held by a request whose lock ends at
    the deepest node; a second lock ending at the middle node."""
    tree = _tree("sglang", 10**6, None)
    now = tree.set_time(1.0)
    res = tree.insert(np.arange(9, dtype=np.int64), 9, [3, 6, 9], now, lock=True)
    return tree, res.end_node


def test_sglang_a_lock_ending_at_a_state_holds_it_and_one_passing_through_does_not():
    """SGLang locks the KV of a request's whole path but the state of its own node only
    (``keys``): with the lock at 9, the states at 3 and 6 stay evictable (2), 9's does not; a
    second request stopping at 6 takes 6's state too (1); when it goes, 6's is free again (2)."""
    tree, end = _sglang_with_locked_states()
    assert (tree.evictable_kv, tree.evictable_states) == (0, 2)
    middle = end.parent
    assert middle.depth_tokens == 6
    tree.lock(middle)
    assert (tree.evictable_kv, tree.evictable_states) == (0, 1) == (0, tree.evictable_walk()[1])
    tree.unlock(middle)
    assert (tree.evictable_kv, tree.evictable_states) == (0, 2)
    tree.unlock(end)
    assert (tree.evictable_kv, tree.evictable_states) == (9, 3) == tree.evictable_walk()


@pytest.mark.parametrize("setup", ["lru", "sglang"])
def test_evicting_everything_leaves_nothing_evictable(setup):
    tree = _tree(setup, 10**6, None)
    for t, s in enumerate(([1, 2, 3, 4], [1, 2, 5, 6, 7], [8, 9]), start=1):
        tree.insert(np.array(s, dtype=np.int64), len(s), [len(s)], tree.set_time(float(t)))
    assert (tree.evictable_kv, tree.evictable_states) == (tree.kv_tokens, tree.n_states) == (9, 3)
    while (victim := tree.policy.pop_victim()) is not None:
        tree._apply_victim(victim)
    assert tree.kv_tokens == tree.n_states == 0
    assert (tree.evictable_kv, tree.evictable_states) == (0, 0)


def test_a_recency_touch_leaves_the_totals_and_a_reserve_changes_nothing_in_them():
    """A lookup's refresh moves recency only (``_touched``): the totals stay; ``reserve`` lowers
    the capacity, not what eviction could free."""
    tree = _tree("vllm", 10**6, None)
    tree.insert(np.arange(8, dtype=np.int64), 8, [4, 8], tree.set_time(1.0))
    before = (tree.evictable_kv, tree.evictable_states)
    assert before == (8, 2)
    tree.lookup(np.arange(8, dtype=np.int64), now=tree.set_time(2.0))
    assert tree.reserve(10, 1)
    assert (tree.evictable_kv, tree.evictable_states) == before == tree.evictable_walk()


def test_sglang_rules_run_with_a_lock_inside_a_split_path():
    """A lock ending inside an edge that a later insert splits: the upper half inherits the lock
    (``_split``) and its share is counted on arrival."""
    tree = _tree("sglang", 10**6, None)
    res = tree.insert(np.arange(8, dtype=np.int64), 8, [8], tree.set_time(1.0), lock=True)
    tree.insert(np.array([0, 1, 2, 3, 9], dtype=np.int64), 5, [4, 5], tree.set_time(2.0))
    tree.check_invariants()
    assert (tree.evictable_kv, tree.evictable_states) == tree.evictable_walk() == (1, 2)
    tree.unlock(res.end_node)
    assert (tree.evictable_kv, tree.evictable_states) == tree.evictable_walk() == (9, 3)


@pytest.mark.parametrize("setup", ["lru", "sglang"])
def test_evicting_an_inner_state_frees_it_whether_or_not_the_node_stays(setup):
    """``evict`` on a single-child node that holds a state frees the state and keeps its KV: the
    core tree merges the node into its child; SGLang's tree (``keeps_structure``) keeps it, as a
    stateless node whose KV is still evictable. Either way the node holds no state any more (a
    mutant left ``has_state`` set: the kept node still counted a state the pool had freed)."""
    tree = _tree(setup, 10**6, None)
    tree.insert(np.arange(6, dtype=np.int64), 6, [2, 6], tree.set_time(1.0))
    inner = tree.match(np.arange(6, dtype=np.int64)).path[0]
    assert inner.depth_tokens == 2 and inner.has_state and len(inner.children) == 1
    assert tree.evict(inner) == (1, 0)
    assert not inner.has_state
    assert (tree.n_states, tree.kv_tokens) == (1, 6)
    kept = setup == "sglang"
    assert (inner.parent is not None) is kept
    assert len(list(tree.iter_nodes())) == (3 if kept else 2)
    tree.check_invariants()
    assert (tree.evictable_kv, tree.evictable_states) == (6, 1)


def test_a_policy_switch_recounts_the_locked_states():
    """vLLM's free queue counts the states on a running path as free; after a switch to a policy
    without ``keys`` (a tuner's candidates) they are not: ``recount_evictable`` moves the total
    from 2 to 0, as the walk says."""
    tree = _tree("vllm", 10**6, None)
    res = tree.insert(np.arange(8, dtype=np.int64), 8, [4, 8], tree.set_time(1.0), lock=True)
    assert (tree.evictable_kv, tree.evictable_states) == (0, 2) == tree.evictable_walk()
    tree.policy = _policy("lru")
    tree.policy.attach(tree)
    for node in tree.iter_nodes():
        if node is not tree.root:
            tree.policy.add(node)
    assert tree.evictable_walk() == (0, 0)
    tree.recount_evictable()
    assert (tree.evictable_kv, tree.evictable_states) == (0, 0)
    tree.unlock(res.end_node)
    assert (tree.evictable_kv, tree.evictable_states) == (8, 2) == tree.evictable_walk()


@pytest.mark.parametrize("setup", ["sglang", "lmdeploy"])
def test_with_a_state_pool_the_evictable_kv_counts_as_free_kv(setup):
    """With the pools, ``could_reserve`` asks whether the KV pool less what eviction could free
    takes the charge (the walk oracle above calls the same ``_fits_freed``, so this is checked by
    hand): a 100-token KV pool holding two unlocked 40-token leaves has room for 40 more tokens,
    not for 120. Mutation (engine_tree, seed 16) survivor: ``kv_bytes - kv_freed`` -> ``+``."""
    tree = _tree(setup, 3 * STATE + 100 * KV, 3)
    for k, at in ((0, 1.0), (100, 2.0)):
        res = tree.insert(np.arange(k, k + 40, dtype=np.int64), 40, [40], tree.set_time(at))
        assert res.inserted
        tree.refresh_inserted(res, at, final=True)
    assert tree.kv_tokens == 80 and tree.evictable_kv == 80
    assert tree.could_reserve(40, 0) is True
    assert tree.could_reserve(120, 0) is False
