"""GDSF eviction worked by hand: priority = clock + frequency x cost / size, the clock being the
priority of the last victim (Cherkasova 1998)."""

from __future__ import annotations

import numpy as np
import pytest

from policies.gdsf import GDSFEviction
from sim.cache.tree import HybridRadixTree
from sim.config import SimConfig
from sim.simulate import simulate
from traces.base import Request, Trace


class TokensSaved:
    """A cost model where a node saves one FLOP per token of its edge."""

    def node_flops(self, L_parent, L_node):
        return float(L_node - L_parent)

    def node_bytes(self, L_node):  # not used by GDSF
        raise AssertionError


def seq(first, n):
    return np.array([first] + [100 + first * 50 + i for i in range(n - 1)], dtype=np.int64)


def test_priorities_frequency_and_clock_by_hand():
    pol = GDSFEviction(TokensSaved())
    # 1 byte per KV token, 10 bytes per state
    tree = HybridRadixTree(capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=1, policy=pol)
    a, b, c = seq(1, 10), seq(2, 20), seq(3, 5)
    tree.insert(a, 10, [10], now=1.0)  # H(A) = 0 + 1 x 10 / (10 + 10) = 0.5
    tree.insert(b, 20, [20], now=2.0)  # H(B) = 0 + 1 x 20 / (20 + 10) = 0.667
    node_a = tree.match(a).hit_node
    tree.touch(node_a, 3.0)
    tree.touch(node_a, 4.0)  # two hits: F(A) = 3, H(A) = 0 + 3 x 0.5 = 1.5
    assert pol.priority(node_a) == pytest.approx(1.5)
    v = pol.pop_victim()
    assert v.node.depth_tokens == 20 and not v.drop_state_only  # B goes first
    assert pol.clock == pytest.approx(20 / 30)
    tree.evict(v.node)
    tree.insert(c, 5, [5], now=5.0)  # H(C) = 2/3 + 1 x 5 / (5 + 10) = 1.0
    v = pol.pop_victim()
    assert v.node.depth_tokens == 5 and pol.clock == pytest.approx(1.0)  # C (1.0) before A (1.5)
    tree.evict(v.node)
    v = pol.pop_victim()
    assert v.node is node_a and pol.clock == pytest.approx(1.5)
    tree.evict(v.node)
    assert pol.pop_victim() is None and tree.used_bytes == 0
    tree.check_invariants()


def test_single_child_state_holder_drops_its_state_and_merges():
    pol = GDSFEviction(TokensSaved())
    tree = HybridRadixTree(capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=1, policy=pol)
    long = seq(1, 30)
    tree.insert(long[:10], 10, [10], now=1.0)  # state at 10 ...
    tree.insert(long, 30, [30], now=2.0)  # ... under a longer leaf: a single-child state holder
    inner = tree.match(long[:10]).hit_node
    # H(inner) = 10 / (10 + 10) = 0.5 < H(leaf) = 20 / (20 + 10)
    v = pol.pop_victim()
    assert v.node is inner
    assert tree.evict(v.node) == (1, 0)  # its state only; the KV merged into the leaf
    assert tree.kv_tokens == 30 and tree.n_states == 1
    tree.check_invariants()


def test_gdsf_preset_runs_and_keeps_tree_invariants_under_pressure():
    rng = np.random.default_rng(0)
    system = rng.integers(0, 1000, size=300)
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=np.concatenate((system, rng.integers(0, 1000, size=50))),
            output_tokens=rng.integers(0, 1000, size=20),
        )
        for i in range(40)
    ]
    res = simulate(Trace("gdsf", reqs), SimConfig(policy="gdsf", mode="sequential", capacity_bytes=400 * 10**6))
    assert res.summary["evictions"] > 0 and res.summary["token_hit_rate"] > 0


class SquareCost:
    """A cost model where the marginal saving depends on the parent's depth (L^2 - Lp^2)."""

    def node_flops(self, L_parent, L_node):
        return float(L_node**2 - L_parent**2)

    def node_bytes(self, L_node):  # not used by GDSF
        raise AssertionError


def test_node_cost_is_marginal_to_the_parent_and_size_is_what_eviction_frees():
    pol = GDSFEviction(SquareCost())
    tree = HybridRadixTree(capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=1, policy=pol)
    long = seq(1, 30)
    tree.insert(long[:10], 10, [10], now=1.0)
    tree.insert(long, 30, [30], now=2.0)
    inner, leaf = tree.match(long[:10]).hit_node, tree.match(long).hit_node
    assert pol.priority(inner) == pytest.approx(100 / (10 + 10))  # (10^2 - 0) / (10 KV + 10)
    assert pol.priority(leaf) == pytest.approx((900 - 100) / (20 + 10))  # marginal to depth 10


def test_a_reference_restarts_the_priority_from_the_current_clock():
    pol = GDSFEviction(TokensSaved())
    tree = HybridRadixTree(capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=1, policy=pol)
    a, b = seq(1, 10), seq(2, 20)
    tree.insert(a, 10, [10], now=1.0)  # H(A) = 0.5
    tree.insert(b, 20, [20], now=2.0)  # H(B) = 0.667
    node_a = tree.match(a).hit_node
    tree.evict(pol.pop_victim().node)  # A (0.5) goes first; clock 0.5
    assert pol.clock == pytest.approx(0.5) and node_a.parent is None
    node_b = tree.match(b).hit_node
    tree.touch(node_b, 3.0)  # F(B) = 2 from clock 0.5: 0.5 + 2 x 20 / 30
    assert pol.priority(node_b) == pytest.approx(0.5 + 40 / 30)
    pol.update(node_b)  # no new reference: nothing counted again
    assert pol.priority(node_b) == pytest.approx(0.5 + 40 / 30)


def test_a_branch_state_holder_is_no_candidate_until_one_branch_is_left():
    """Candidates are leaves and single-child state holders: a state holder with two children
    (its KV is both branches' prefix) is not one, though its priority is the lowest. P = [0, 10)
    with a state, leaves [0, 30) and [0, 10) + 20 others below it: the leaves go first; with one
    branch left P becomes a candidate (H(P) = 0.5) and goes next, its state only."""
    pol = GDSFEviction(TokensSaved())
    tree = HybridRadixTree(capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=1, policy=pol)
    long = seq(1, 30)
    other = np.concatenate([long[:10], seq(7, 20)])
    tree.insert(long[:10], 10, [10], now=1.0)
    tree.insert(long, 30, [30], now=2.0)
    tree.insert(other, 30, [30], now=3.0)
    inner = tree.match(long[:10]).hit_node
    assert len(inner.children) == 2 and not pol.is_candidate(inner)
    v = pol.pop_victim()
    assert v.node is not inner and not v.node.children
    assert tree.evict(v.node) == (1, 20)  # a leaf: its state and its 20 KV tokens
    assert pol.is_candidate(inner)
    v = pol.pop_victim()
    assert v.node is inner
    assert tree.evict(v.node) == (1, 0)  # its state only; the KV merged into the last leaf
    tree.check_invariants()
