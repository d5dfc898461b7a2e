"""Three tree rules no test held (mutation run of sim/cache/tree.py, seed 2,
benchmarks/results/2026-12-05-mutation-tree-evictable/): a lookup's walk end touched under a
merging tree, the state recency ``touch_path`` moves with the KV's, and ``evict`` on a stateless
inner node of a tree that keeps the engine's structure. Hand-checked trees of 1-token symbols."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from policies.sglang import SGLANG_PATH_REFRESH, SGLANG_RULES, TwoListLRUEviction, UnifiedTwoListEviction
from tree_cases import engine_tree


def _tree(policy, rules=SGLANG_RULES):
    return engine_tree(rules, policy, kv=1, state=4)


def seq(*xs):
    return np.array(xs, dtype=np.int64)


class _WalkEndLRU(TwoListLRUEviction):
    """SGLang's two lists with the walk-end touch, on a tree that merges (``keeps_structure``
    off): the tree keeps the node whole and touches all of it (``HybridRadixTree._touch_walk_end``)."""

    touch_walk_end = True


def test_a_walk_ending_inside_an_edge_touches_that_node_on_a_merging_tree():
    """A (0..7, state at 8) at t=1, B (20..23, state at 4) at t=2. A lookup at t=5 of 0..3 then 9
    ends inside A's edge with no hit (no state at 4): the walk end still touches A's node whole, so
    B is now the oldest leaf and goes first."""
    tree = _tree(_WalkEndLRU())
    tree.insert(seq(*range(8)), 8, [8], tree.set_time(1.0))
    tree.insert(seq(20, 21, 22, 23), 4, [4], tree.set_time(2.0))
    m = tree.lookup(seq(0, 1, 2, 3, 9), now=tree.set_time(5.0))
    assert m.hit_sym == 0 and m.split_node is not None and m.split_node.depth_tokens == 8
    assert m.split_node.last_access == 5.0  # one node still: the merging tree did not split it
    assert len(tree.root.children) == 2 and len(m.split_node.children) == 0
    victim = tree.policy.pop_kv_victim()
    assert victim.node.key[0] == 20


def test_touch_path_moves_the_state_recency_with_the_kv():
    """Under SGLang's path refresh (``state="with-kv"``) a path touched at t=3 has its states made
    most recent too: A's states (at 3, 6) were stored at t=1, B's (at 4) at t=2; after A's path is
    touched at t=3, B's state is the state list's oldest."""
    tree = _tree(TwoListLRUEviction(), replace(SGLANG_RULES, refresh=SGLANG_PATH_REFRESH))
    a = tree.insert(seq(0, 1, 2, 3, 4, 5), 6, [3, 6], tree.set_time(1.0))
    tree.insert(seq(20, 21, 22, 23), 4, [4], tree.set_time(2.0))
    tree.touch_path(a.end_node, tree.set_time(3.0))
    upper = a.end_node.parent
    assert (upper.state_access, a.end_node.state_access) == (3.0, 3.0)
    assert (upper.last_access, a.end_node.last_access) == (3.0, 3.0)
    victim = tree.policy.pop_state_victim()
    assert victim.node.key[0] == 20


def test_evicting_a_stateless_inner_node_of_a_structure_keeping_tree_frees_nothing_and_keeps_it():
    """SGLang's ``UnifiedRadixCache`` never merges: a stateless node left with one child (its
    sibling evicted) stays; ``evict`` on it frees nothing and leaves the tree as it was."""
    tree = _tree(UnifiedTwoListEviction())
    tree.insert(seq(0, 1, 2, 3, 4, 5), 6, [6], tree.set_time(1.0))
    tree.insert(seq(0, 1, 2, 9, 8), 5, [5], tree.set_time(2.0))
    upper = tree.match(seq(0, 1, 2)).path[0]
    assert upper.depth_tokens == 3 and not upper.has_state and len(upper.children) == 2
    leaf = tree.match(seq(0, 1, 2, 9, 8)).path[-1]
    tree.evict(leaf)
    assert len(upper.children) == 1 and upper.parent is tree.root  # kept: the tree never merges
    nodes, kv = len(list(tree.iter_nodes())), tree.kv_tokens
    assert tree.evict(upper) == (0, 0)
    assert upper.parent is tree.root and len(list(tree.iter_nodes())) == nodes and tree.kv_tokens == kv
    tree.check_invariants()
