"""The artifact as ``sim.compat`` reproduces it (docs/presets.md §5), against hand computation: its
cost-model bug (1), its tree's eviction that stops on the bytes it *credits* (bug 2 can leave the
cache above capacity; the overshoot is counted), its byte estimate, its replay's state hits. The
artifact's whole replay is checked against its own results in tests/policies/test_golden.py."""

import numpy as np
import pytest

from policies.eviction import MarconiEviction
from sim.compat.artifact import ArtifactCost, ArtifactMarconiEviction, ArtifactTree
from sim.cost import get_model

D, N = 4096, 128


@pytest.fixture
def m7():
    return get_model("marconi-7b")


def test_bug1_subtracts_an_attention_layer_where_an_mlp_layer_belongs(m7):
    def attn(L):
        return 8 * L * D**2 + 4 * L**2 * D

    def mlp(L):
        return 16 * L * D**2

    def mamba(L):
        return 12 * L * D**2 + 16 * L * D * N + 10 * L * D

    Lp, Ln = 5000, 5300
    bug = 24 * mamba(Ln - Lp) + 4 * (attn(Ln) - attn(Lp)) + 28 * (mlp(Ln) - attn(Lp))
    assert ArtifactCost(m7).node_flops(Lp, Ln) == pytest.approx(bug, rel=1e-12)
    assert ArtifactCost(m7).node_bytes(Ln) == m7.node_bytes(Ln)


def test_bug1_term_sign_flips_at_2d(m7):
    def bug_term(Lp):  # what the artifact adds on top of the corrected marginal
        return ArtifactCost(m7).node_flops(Lp, Lp + 1) - m7.node_flops(Lp, Lp + 1)

    assert bug_term(0) == 0
    assert bug_term(4_000) > 0  # short parent: savings overstated
    assert bug_term(8_192) == pytest.approx(0, abs=1e3)  # 4Ld(2d - L) = 0
    assert bug_term(10_000) < 0 and bug_term(30_000) < 0
    assert ArtifactCost(m7).node_flops(30_000, 30_100) < 0  # the whole marginal goes negative


# ---------------------------------------------------------------- bug 2: credited bytes, overshoot
KV, STATE = 1, 10  # bytes per token and per checkpoint: easy hand arithmetic


def overshoot_tree(bugs: bool) -> ArtifactTree:
    """A (2 tokens) then B (8 tokens), each with a state: 12 + 18 = 30 bytes = the capacity. The
    artifact asks room for C, 15 bytes (5 tokens + a state). At alpha 0 the older A goes first
    (12 bytes). Bug 2 credits that leaf with the edge of the last candidate scored, B (depth-first
    order): 8 + 10 = 18 >= 15, so eviction stops and the cache ends at 30 - 12 + 15 = 33 bytes,
    3 above capacity. Fixed, A is credited 12 < 15, B goes too and the cache ends at 15."""
    pol = ArtifactMarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=0.0), bugs=bugs)
    t = ArtifactTree(
        split_states=True,
        fill_block=0,
        capacity_bytes=30,
        kv_bytes_per_token=KV,
        state_bytes=STATE,
        block_tokens=1,
        policy=pol,
    )
    t.insert(np.arange(0, 2), 2, [2], now=t.set_time(0))
    t.insert(np.arange(100, 108), 8, [8], now=t.set_time(0))
    assert t.used_bytes == 30
    res = t.insert(np.arange(200, 205), 5, [5], now=t.set_time(0), need_bytes=15)
    assert res.inserted
    t.check_invariants()
    return t


def test_bug_2_overshoots_capacity_by_the_hand_worked_bytes():
    t = overshoot_tree(bugs=True)
    assert (t.stats.overshoots, t.stats.peak_overshoot_bytes) == (1, 3)
    assert t.used_bytes == t.stats.peak_bytes == 33
    assert t.stats.evictions == 1 and t.match(np.arange(100, 108)).hit_tokens == 8


def test_bug_2_fixed_credits_the_evicted_leaf_and_stays_within_capacity():
    t = overshoot_tree(bugs=False)
    assert (t.stats.overshoots, t.stats.peak_overshoot_bytes) == (0, 0)
    assert t.used_bytes == 15 and t.stats.evictions == 2


def test_logical_clock_ticks_once_per_operation_and_per_eviction_call():
    t = overshoot_tree(bugs=True)
    # three set_time calls, plus one tick for the one insert that had to evict
    assert t.now == 4 and t.stats.eviction_calls == 1


# ---------------------------------------------------------------- the artifact's byte estimate
S7, K7 = 26_787_840, 65_536  # marconi-7b: one state, KV per token (tests/sim/test_cost.py)


def _artifact(policy: str):
    from sim.config import SimConfig
    from sim.simulate import build
    from traces.base import Request, Trace

    trace = Trace("one", [Request(0, 0, np.arange(10), np.arange(100, 105))])
    return build(trace, SimConfig(policy=policy, compat="paper", mode="sequential"))


def _match(match_tokens: int, hit_tokens: int):
    from types import SimpleNamespace

    return SimpleNamespace(match_tokens=match_tokens, hit_tokens=hit_tokens)


def test_marconi_estimate_is_one_or_two_states_plus_the_unmatched_kv():
    sim = _artifact("marconi")
    # input + output of 400 tokens matched 150 deep, its deepest state at 100: a branch at 150
    assert sim._need(_match(150, 100), 400) == 2 * S7 + 250 * K7 == 69_959_680
    # matched exactly up to its state: the tail state only
    assert sim._need(_match(100, 100), 400) == S7 + 300 * K7 == 46_448_640


def test_vllm_plus_estimate_counts_blocks_past_the_hit_plus_the_root_block():
    sim = _artifact("vllm+")
    assert sim.paper_block == 32  # the paper's 32-token blocks, on a token tree
    # hit 100 tokens -> ceil(100 / 32) = 4 blocks, + 1 for the root: 400 - 160 = 240 tokens
    assert sim._need(_match(100, 100), 400) == 240 * S7 / 32 + 240 * K7 == 216_637_440
    # no hit: 400 - 32 = 368 tokens; an insert shorter than the root block asks for negative room
    assert sim._need(_match(0, 0), 400) == 368 * S7 / 32 + 368 * K7
    assert sim._need(_match(0, 0), 20) < 0


def test_paper_replay_counts_state_hits_of_a_multi_turn_chain():
    from sim.config import SimConfig
    from sim.simulate import simulate
    from traces.base import Request, Trace

    reqs, hist = [], np.empty(0, dtype=np.int64)
    for t in range(4):  # each turn: the previous input + output + 30 new tokens; 20 output tokens
        inp = np.concatenate((hist, np.arange(100 * t, 100 * t + 30)))
        out = np.arange(10_000 + 100 * t, 10_000 + 100 * t + 20)
        reqs.append(Request(0, t, inp, out, think_time=1.0))
        hist = np.concatenate((inp, out))
    for compat in ("paper", "paper-fixed"):
        res = simulate(
            Trace("chain", reqs), SimConfig(policy="marconi", compat=compat, mode="sequential", capacity_bytes=10**12)
        )
        assert list(res.requests["hit_tokens"]) == [0, 50, 100, 150]
        assert list(res.requests["state_hit"]) == [False, True, True, True]
        assert res.summary["checkpoints_hit"] == 3 and res.summary["capacity_overshoots"] == 0


def test_marconi_refreshes_the_hit_node_on_the_artifacts_logical_clock():
    """r1 = 30 + 10 tokens; r2 extends it (hits its 40-token tail state). The clock ticks on every
    lookup, insert call and insert's own match: r1 1, 2, 3 (its node is created at 3); r2's lookup
    (4) and its insert's match (6) both touch the hit node; r2's new node is created at 6."""
    from sim.config import SimConfig
    from sim.engine.drivers import run
    from sim.simulate import build
    from traces.base import Request, Trace

    r1 = Request(0, 0, np.arange(0, 30), np.arange(100, 110))
    r2 = Request(
        1, 0, np.concatenate((np.arange(0, 30), np.arange(100, 110), np.arange(200, 220))), np.arange(300, 305)
    )
    sim = build(
        Trace("two", [r1, r2]), SimConfig(policy="marconi", compat="paper", mode="sequential", capacity_bytes=10**12)
    )
    res = run(sim)
    assert list(res.requests["hit_tokens"]) == [0, 40] and sim.tree.now == 6
    times = {n.depth_tokens: n.last_access for n in sim.tree.iter_nodes() if n is not sim.tree.root}
    assert times == {40: 6.0, 65: 6.0}
    # a lookup that misses touches nothing: r1's node keeps its creation time
    sim = build(
        Trace("one", [r1, Request(1, 0, np.arange(500, 520), np.arange(600, 602))]),
        SimConfig(policy="marconi", compat="paper", mode="sequential", capacity_bytes=10**12),
    )
    run(sim)
    assert {n.depth_tokens: n.last_access for n in sim.tree.iter_nodes() if n.depth_tokens == 40} == {40: 3.0}


def test_artifact_merge_keeps_the_newer_access_time():
    """Evicting a single-child node's state merges it into its child; the artifact's tree (with
    split states) gives the merged node the newer of the two access times, the core tree keeps
    the child's own."""
    from sim.cache.tree import HybridRadixTree

    def merged_time(tree_cls, **kw):
        pol = MarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=0.0))
        t = tree_cls(capacity_bytes=10**9, kv_bytes_per_token=KV, state_bytes=STATE, block_tokens=1, policy=pol, **kw)
        t.insert(np.arange(0, 4), 4, [4], now=1)
        t.insert(np.arange(0, 8), 8, [8], now=2)  # the 4-token node is now single-child with a state
        inner = t.match(np.arange(0, 4)).hit_node
        t.touch(inner, 9)
        assert t.evict(inner) == (1, 0)
        t.check_invariants()
        (leaf,) = [n for n in t.iter_nodes() if n is not t.root]
        assert leaf.n_tokens == 8 and t.n_states == 1
        return leaf.last_access

    assert merged_time(ArtifactTree, split_states=True, fill_block=0) == 9
    assert merged_time(HybridRadixTree) == 2
