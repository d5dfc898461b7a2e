"""Marconi's eviction utility against victims chosen by hand (docs/presets.md §3): a few candidates
with known access times, lengths and bytes, at alpha 0, 1 and 2.

S(n) = minmax(1 / age) + alpha * minmax(FLOPs saved / bytes) over the current candidates; the
lowest score is evicted. FLOPs are marginal to the parent (F(L_n) - F(L_p)); bytes are one
checkpoint plus the KV of the whole root-to-node path."""

from __future__ import annotations

import numpy as np
import pytest

from policies.eviction import MarconiEviction
from sim.cache.tree import HybridRadixTree
from sim.cost import get_model

# marconi-7b with the paper's formulas (docs/cost-model.md §2), written out here, not taken from sim.cost
D, N = 4096, 128
STATE_7B = 24 * (D * N * 2 + (2 * D + 2 * N) * 4 * 2)  # 26,787,840 bytes
KV_7B = 4 * 2 * D * 2  # 65,536 bytes per token


def paper_flops(L: int) -> float:
    mamba = 12 * L * D**2 + 16 * L * D * N + 10 * L * D
    return 24 * mamba + 4 * (8 * L * D**2 + 4 * L**2 * D) + 28 * 16 * L * D**2


def minmax(x):
    lo, hi = min(x), max(x)
    return [(v - lo) / (hi - lo) for v in x]


# the candidates: last access, edge tokens, parent depth in tokens
CANDIDATES = {"A": (1.0, 1000, 0), "B": (4.0, 8000, 8000), "C": (7.0, 100, 0)}
NOW = 10.0


def hand_scores(alpha: float) -> dict:
    names = list(CANDIDATES)
    recency = minmax([1 / (NOW - CANDIDATES[n][0]) for n in names])
    eff = minmax(
        [(paper_flops(p + e) - paper_flops(p)) / (STATE_7B + KV_7B * (p + e)) for _, e, p in CANDIDATES.values()]
    )
    return {n: r + alpha * f for n, r, f in zip(names, recency, eff)}


def test_the_hand_scores():
    # recency: ages 9, 6, 3 -> 1/age normalised 0, 0.25, 1. Efficiency: A 1.42e5, B 1.09e5, C 3.93e4
    # FLOP/byte -> 1, 0.676, 0 (B's edge is long, but its bytes count the 8000-token path above it)
    assert [round(hand_scores(0)[n], 3) for n in "ABC"] == [0.0, 0.25, 1.0]
    assert [round(hand_scores(1)[n], 3) for n in "ABC"] == [1.0, 0.926, 1.0]
    assert [round(hand_scores(2)[n], 3) for n in "ABC"] == [2.0, 1.603, 1.0]


def utility_tree(alpha: float):
    """A (1000 tokens) and C (100) are leaves under the root; B (8000) is a leaf under an 8000-token
    branch node whose other child is locked, so the branch is no candidate. Tree bytes: 1 per KV
    token, 10 per state (the policy's efficiency uses the model's bytes, not these)."""
    pol = MarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=alpha))
    t = HybridRadixTree(capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=1, policy=pol)
    prefix = np.arange(100_000, 108_000)
    a, c = np.arange(0, 1000), np.arange(10_000, 10_100)
    b = np.concatenate((prefix, np.arange(20_000, 28_000)))
    t.insert(a, 1000, [1000], now=0)
    t.insert(c, 100, [100], now=0)
    t.insert(b, 16_000, [8000, 16_000], now=0)
    t.insert(np.concatenate((prefix, np.arange(40_000, 40_010))), 8010, [8010], now=0, lock=True)
    nodes = {"A": t.match(a).hit_node, "B": t.match(b).hit_node, "C": t.match(c).hit_node}
    for name, node in nodes.items():
        when, edge, parent = CANDIDATES[name]
        assert (node.n_tokens, node.depth_tokens - node.n_tokens) == (edge, parent)
        t.touch(node, when)
    t.now = NOW
    t.check_invariants()
    return t, pol, nodes


@pytest.mark.parametrize("alpha, victim", [(0.0, "A"), (1.0, "B"), (2.0, "C")])
def test_marconi_picks_the_hand_computed_victim(alpha, victim):
    scores = hand_scores(alpha)
    assert min(scores, key=scores.get) == victim
    _, pol, nodes = utility_tree(alpha)
    v = pol.pop_victim()
    assert v.node is nodes[victim] and not v.drop_state_only


@pytest.mark.parametrize("alpha, victim", [(0.0, "A"), (1.0, "B"), (2.0, "C")])
def test_a_full_cache_evicts_the_hand_computed_victim(alpha, victim):
    t, _, nodes = utility_tree(alpha)
    t.capacity_bytes = t.used_bytes  # full: one more token + state evicts exactly one leaf
    res = t.insert(np.array([90_000]), 1, [1], now=NOW)
    t.check_invariants()
    assert res.inserted and res.evicted_states == 1 and res.evicted_kv_tokens == CANDIDATES[victim][1]
    assert nodes[victim].parent is None  # detached from the tree
    assert all(n.parent is not None for k, n in nodes.items() if k != victim)


def test_alpha_set_by_a_tuner_takes_effect_on_the_next_eviction():
    _, pol, nodes = utility_tree(0.0)
    assert pol.pop_victim().node is nodes["A"]
    pol.alpha = 2.0
    assert pol.pop_victim().node is nodes["C"]


def _small_tree(capacity: int, alpha: float = 0.0):
    pol = MarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=alpha))
    return HybridRadixTree(capacity_bytes=capacity, kv_bytes_per_token=1, state_bytes=10, block_tokens=1, policy=pol)


def test_the_newest_leaf_is_a_candidate_as_soon_as_it_is_added():
    # three one-token leaves (11 bytes each); the two older ones are locked, so the third, the
    # newest node, is the only thing an insert can evict
    t = _small_tree(capacity=33)
    ends = [t.insert(np.array([k]), 1, [1], now=k, lock=k < 2).end_node for k in range(3)]
    t.set_time(5)
    res = t.insert(np.array([9]), 1, [1], now=5)
    assert res.inserted and res.evicted_kv_tokens == 1
    assert ends[2].parent is None and ends[0].parent is not None and ends[1].parent is not None


def test_candidate_arrays_grow_past_their_first_1024_slots():
    # 1500 leaves added with increasing access times, then a cache a quarter of that size: every
    # insert evicts the oldest leaf, so the survivors are exactly the newest ones
    t = _small_tree(capacity=10**9)
    for k in range(1500):
        t.insert(np.array([k]), 1, [1], now=k)
    t.capacity_bytes = t.used_bytes  # full
    for k in range(1500, 1510):
        t.set_time(k)
        assert t.insert(np.array([k]), 1, [1], now=k).evicted_kv_tokens == 1
    t.check_invariants()
    assert t.match(np.array([9])).hit_tokens == 0 and t.match(np.array([10])).hit_tokens == 1
    assert t.match(np.array([1509])).hit_tokens == 1
