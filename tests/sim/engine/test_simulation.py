"""End-to-end replays of tiny hand-built traces: the exact hit tokens of each policy are worked
out by hand in each test."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import SimConfig
from sim.simulate import build, simulate
from policies.base import PolicyError
from sim.errors import UsageError
from traces.base import Request, Trace

BIG = 10**12  # capacity that never evicts


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int64)


def shared_prompt_trace(n_req=3, prompt=100, unique=20, out=10):
    """n_req single-turn sessions: the same 100-token system prompt + 20 own tokens."""
    reqs = []
    for i in range(n_req):
        inp = np.concatenate((toks(0, prompt), toks(1000 + 100 * i, unique)))
        reqs.append(Request(session_id=i, turn=0, input_tokens=inp, output_tokens=toks(5000 + 100 * i, out)))
    return Trace("shared-prompt", reqs)


def hits(trace, **cfg):
    res = simulate(trace, SimConfig(**{"capacity_bytes": BIG, "mode": "sequential", **cfg}))
    return list(res.requests["hit_tokens"]), res


@pytest.mark.parametrize("mode", ["sequential", "des"])
def test_branch_state_is_first_reused_on_third_occurrence(mode):
    # r1 leaves only its tail state; r2's speculative insertion finds the branch at 100 and
    # stores it (no hit itself); r3 hits it.
    for policy in ("sglang+", "marconi"):
        got, _ = hits(shared_prompt_trace(), policy=policy, mode=mode)
        assert got == [0, 0, 100], policy


def test_vllm_plus_hits_whole_32_token_blocks_from_the_second_request():
    # every block has a state; the 4th block mixes prompt and own tokens -> 3 blocks = 96
    got, _ = hits(shared_prompt_trace(), policy="vllm+")
    assert got == [0, 96, 96]


def test_vanilla_never_hits_and_pure_transformer_reuses_every_kv_token():
    got, _ = hits(shared_prompt_trace(), policy="vanilla")
    assert got == [0, 0, 0]
    got, _ = hits(shared_prompt_trace(), policy="sglang+", model="llama-7b")
    assert got == [0, 100, 100]


def test_chunk_alignment_moves_branch_state_down_to_the_chunk_boundary():
    got, _ = hits(shared_prompt_trace(), policy="marconi", state_alignment="chunk", chunk_size=64)
    assert got == [0, 0, 64]


def multi_turn_trace(turns=4, user=30, out=20):
    """One session: each turn's input = previous input + output + new user message."""
    reqs, hist = [], np.empty(0, dtype=np.int64)
    for t in range(turns):
        inp = np.concatenate((hist, toks(100 * t, user)))
        o = toks(10_000 + 100 * t, out)
        reqs.append(Request(0, t, inp, o, think_time=1.0))
        hist = np.concatenate((inp, o))
    return Trace("multi-turn", reqs)


@pytest.mark.parametrize("mode", ["sequential", "des"])
def test_multi_turn_chain_reuses_previous_input_and_output(mode):
    # turn t hits the tail state of turn t-1: 50 * t tokens
    for policy in ("sglang+", "marconi"):
        got, res = hits(multi_turn_trace(), policy=policy, mode=mode)
        assert got == [0, 50, 100, 150]
        assert res.summary["token_hit_rate"] == pytest.approx(300 / (30 + 80 + 130 + 180))


def test_eviction_under_pressure_marconi_frees_old_turn_states_sglang_cannot():
    """Two sessions of 3 turns interleaved; capacity for the KV plus 3 states of marconi-7b.

    Inner (single-child) states of old turns are never candidates under LRU-on-leaves, so
    sglang+ must evict whole leaves (the other session's latest turn) and loses its hits,
    while marconi drops the stale inner states and keeps both chains alive."""
    from sim.cost import get_model

    spec = get_model("marconi-7b")
    reqs = []
    for s in range(2):
        hist = np.empty(0, dtype=np.int64)
        for t in range(3):
            inp = np.concatenate((hist, toks(100_000 * (s + 1) + 100 * t, 30)))
            o = toks(100_000 * (s + 1) + 50 + 100 * t, 20)
            reqs.append(Request(s, t, inp, o, think_time=1.0))
            hist = np.concatenate((inp, o))
    trace = Trace("pressure", reqs)
    kv = 2 * 150 * spec.kv_bytes_per_token()  # final KV of both sessions
    cap = kv + 3 * spec.state_bytes()
    common = dict(capacity_bytes=cap, mode="sequential", sessions_per_second=10.0)
    m = simulate(trace, SimConfig(policy="marconi", **common)).requests
    g = simulate(trace, SimConfig(policy="sglang+", **common)).requests
    # sessions interleave: s0t0, s1t0 (t=0.1), s0t1 (t=1), s1t1, s0t2, s1t2
    order = m.sort_values(["arrival_s", "request_id"])
    assert list(order["hit_tokens"]) == [0, 0, 50, 50, 100, 100]
    assert m["hit_tokens"].sum() == 300
    assert g["hit_tokens"].sum() < 300


def test_same_seed_same_result_and_poisson_arrivals_change_with_seed():
    trace = shared_prompt_trace(n_req=6)
    a = simulate(trace, SimConfig(capacity_bytes=BIG, arrival="poisson", seed=1)).requests
    b = simulate(trace, SimConfig(capacity_bytes=BIG, arrival="poisson", seed=1)).requests
    c = simulate(trace, SimConfig(capacity_bytes=BIG, arrival="poisson", seed=2)).requests
    assert a.equals(b)
    assert not np.allclose(a["arrival_s"], c["arrival_s"])


def test_ttft_includes_queueing_behind_one_server():
    trace = shared_prompt_trace(n_req=2)
    res = simulate(trace, SimConfig(capacity_bytes=BIG, policy="vanilla", sessions_per_second=1e6))
    q = res.requests["queue_s"].to_numpy()
    p = res.requests["prefill_s"].to_numpy()
    assert q[0] == 0 and q[1] == pytest.approx(p[0] - 1e-6, abs=1e-5)
    assert (res.requests["ttft_s"] == res.requests["queue_s"] + res.requests["prefill_s"]).all()


def test_impossible_capacity_and_unknown_names_are_usage_errors():
    trace = shared_prompt_trace()
    with pytest.raises(UsageError, match="smaller than one state checkpoint"):
        build(trace, SimConfig(capacity_bytes=10**6))
    with pytest.raises(PolicyError, match="unknown policy"):
        build(trace, SimConfig(policy="lfu-magic"))
    with pytest.raises(UsageError, match="unknown model"):
        build(trace, SimConfig(model="gpt-9"))
    with pytest.raises(UsageError):
        build(trace, SimConfig(sessions_per_second=-1))


def test_hash_block_trace_refuses_finer_checkpoint_grid():
    reqs = [Request(0, 0, np.array([1, 2, 3]), np.array([-1]), arrival=0.0, input_len=1500, output_len=10)]
    trace = Trace("mooncake-like", reqs, block_tokens=512, closed_loop=False)
    with pytest.raises(UsageError, match="finer"):
        build(trace, SimConfig(policy="vllm+"))
    res = simulate(trace, SimConfig(policy="marconi"))
    assert res.summary["input_tokens"] == 1500


# ---------------------------------------------------------------- TTFT credit for hits, by hand
# marconi-7b with the paper's formulas (docs/cost-model.md §2), written out here, not taken from sim.cost
D7, N7 = 4096, 128


def paper_flops(L: int) -> float:
    mamba = 12 * L * D7**2 + 16 * L * D7 * N7 + 10 * L * D7
    return 24 * mamba + 4 * (8 * L * D7**2 + 4 * L**2 * D7) + 28 * 16 * L * D7**2


def _timing():
    from sim.cost import TimingModel

    # 100 TFLOP/s, 5 ms fixed overhead, 2 ms per decoded token: round numbers for hand arithmetic
    return TimingModel(effective_tflops=100.0, overhead_ms=5.0, decode_ms_per_token=2.0)


@pytest.mark.parametrize("mode", ["des", "sequential"])
def test_hit_request_prefills_only_its_uncached_tokens(mode):
    # r1, r2 miss (r2 stores the branch state at 100), r3 hits the 100-token system prompt and
    # prefills tokens [100, 120) only: F(120) - F(100) FLOPs at 1e14 FLOP/s, plus the overhead
    cfg = SimConfig(policy="marconi", capacity_bytes=BIG, mode=mode, scheduler="fcfs")
    res = simulate(shared_prompt_trace(), cfg, timing=_timing()).requests
    assert list(res["hit_tokens"]) == [0, 0, 100]
    miss = 5e-3 + paper_flops(120) / 1e14
    hit = 5e-3 + (paper_flops(120) - paper_flops(100)) / 1e14
    # ~13.1 GFLOP per token x 20 tokens + the attention's quadratic part: 2.62 ms of compute
    assert hit == pytest.approx(5e-3 + 2.6203e-3, rel=1e-4)
    assert list(res["prefill_s"]) == pytest.approx([miss, miss, hit], rel=1e-12)
    # 10 output tokens: the prefill samples the first (TTFT), the other 9 take a decode step each
    assert list(res["decode_s"]) == pytest.approx([9 * 2e-3] * 3, rel=1e-12)
    if mode == "des":  # sessions start 1 s apart: nobody queues, the TTFT is the prefill time
        assert list(res["queue_s"]) == [0.0, 0.0, 0.0]
        assert list(res["ttft_s"]) == pytest.approx([miss, miss, hit], rel=1e-12)


def test_hit_request_ttft_with_the_jamba_fit():
    # docs/cost-model.md §5: TTFT = 17.8 ms + 0.0530 ms per prefilled token; r3 prefills 20 of its 120
    res = simulate(shared_prompt_trace(), SimConfig(policy="marconi", capacity_bytes=BIG, ttft_model="jamba"))
    want = [(17.8 + 0.0530 * 120) * 1e-3] * 2 + [(17.8 + 0.0530 * 20) * 1e-3]
    assert list(res.requests["ttft_s"]) == pytest.approx(want, rel=1e-12)


def test_requests_arriving_together_queue_behind_each_prefill():
    # 1e6 sessions/s: r2 and r3 arrive 1 and 2 us after r1, look up before anything is stored
    # (no hit), and wait on the one server: TTFT = queue + own prefill
    cfg = SimConfig(policy="marconi", capacity_bytes=BIG, sessions_per_second=1e6, scheduler="fcfs")
    res = simulate(shared_prompt_trace(), cfg, timing=_timing()).requests
    miss = 5e-3 + paper_flops(120) / 1e14
    assert list(res["hit_tokens"]) == [0, 0, 0]
    assert list(res["queue_s"]) == pytest.approx([0.0, miss - 1e-6, 2 * miss - 2e-6], abs=1e-12)
    assert list(res["ttft_s"]) == pytest.approx(list(res["queue_s"] + miss), rel=1e-12)


@pytest.mark.parametrize("mode", ["des", "sequential"])
def test_vanilla_records_every_request_with_a_full_prefill(mode):
    res = simulate(shared_prompt_trace(), SimConfig(policy="vanilla", capacity_bytes=BIG, mode=mode), timing=_timing())
    assert res.summary["input_tokens"] == 3 * 120 and res.summary["hit_tokens"] == 0
    assert list(res.requests["input_tokens"]) == [120, 120, 120]
    assert list(res.requests["arrival_s"]) == [0.0, 1.0, 2.0]  # one session per second
    assert list(res.requests["prefill_s"]) == pytest.approx([5e-3 + paper_flops(120) / 1e14] * 3, rel=1e-12)
    assert res.summary["flops_saved"] == 0.0 and res.summary["evictions"] == 0


@pytest.mark.parametrize("mode", ["des", "sequential"])
def test_occupancy_after_each_insert_by_hand(mode):
    # the chain stores 50 more tokens and one more tail state per turn, nothing evicted:
    # KV 50, 100, 150, 200 tokens x 65,536 B; states 1..4 x 26,787,840 B (marconi-7b)
    res = simulate(multi_turn_trace(), SimConfig(policy="marconi", capacity_bytes=BIG, mode=mode))
    occ = res.occupancy
    assert list(occ["kv_bytes"]) == [50 * k * 65_536 for k in (1, 2, 3, 4)]
    assert list(occ["state_bytes"]) == [k * 26_787_840 for k in (1, 2, 3, 4)]
    assert (res.summary["final_kv_bytes"], res.summary["final_state_bytes"]) == (200 * 65_536, 4 * 26_787_840)


def test_joined_is_a_read_only_view_where_the_two_meet_and_a_copy_elsewhere():
    from traces.base import joined

    buf = np.arange(10, dtype=np.int32)
    a, b = buf[2:5], buf[5:8]
    v = joined(a, b)
    assert v.tolist() == [2, 3, 4, 5, 6, 7] and v.dtype == np.int32
    assert np.shares_memory(v, buf) and not v.flags.writeable
    assert joined(a, buf[5:5]) is a  # nothing after it: the prompt itself
    for other in (buf[6:8], buf[5:8].copy(), np.arange(5, 8, dtype=np.int64), buf[5:9:2]):
        c = joined(a, other)
        assert c.tolist() == np.concatenate((a, other)).tolist() and c.dtype == np.concatenate((a, other)).dtype
        assert not np.shares_memory(c, buf)
    assert not np.shares_memory(joined(buf[5:8], buf[2:5]), buf)  # b before a: never a view across


@pytest.mark.parametrize("policy", ["sglang+", "marconi", "sglang", "lmdeploy"])
def test_each_cache_keeps_views_of_the_trace_not_copies(policy):
    """A request's prompt + reply (and the engines' prompt + reply - 1) was a fresh copy in each
    cache's lookup memo and tree keys: the live cache and the duel tuner's nine shadows held ten
    copies of the trace (a 155 MB spelled Mooncake slice ran in 2 GB, the default synthetic:agent
    run in 2.1 GB, now 0.5 GB each). Where the trace holds them side by side, the sequence is a
    view of its buffer; the hits are those of copies."""
    parts = [(toks(0, 100), toks(1000 + 100 * i, 20), toks(5000 + 100 * i, 10)) for i in range(5)]
    buf = np.concatenate([np.concatenate(p) for p in parts])
    views = [Request(i, 0, buf[130 * i : 130 * i + 120], buf[130 * i + 120 : 130 * (i + 1)]) for i in range(5)]
    copies = [Request(i, 0, np.concatenate(p[:2]), p[2].copy()) for i, p in enumerate(parts)]
    cfg = SimConfig(policy=policy, model="replay-tiny", capacity_bytes=BIG, alpha="auto")
    sim = build(Trace("views", views), cfg)
    assert sim.regrid == 1
    for r in views:
        _, seq_full, *_ = sim._lookup_symbols(r)
        assert np.shares_memory(seq_full, buf)
    hits = simulate(Trace("views", views), cfg).requests["hit_tokens"].tolist()
    assert hits == simulate(Trace("copies", copies), cfg).requests["hit_tokens"].tolist()
    if policy in ("sglang+", "marconi"):  # the second request makes the branch at 100 the next three hit
        assert hits == [0, 0, 100, 100, 100]


@pytest.mark.parametrize("out", [1, 2, 10])
def test_fcfs_decodes_the_tokens_after_the_first_as_continuous_batching_does(out):
    """The prefill samples the first output token (TTFT ends there); fcfs then decoded all `out`
    tokens again: a 1-token reply ended a decode step after its TTFT, and a 10-token reply's TPOT
    was 10/9 of the per-token time (13.3 ms for marconi-7b's 12). Each scheduler now takes
    out - 1 decode steps, and the TPOT is the per-token time."""
    trace = shared_prompt_trace(n_req=2, out=out)
    timing = _timing()
    ends = {}
    for scheduler in ("fcfs", "continuous"):
        cfg = SimConfig(policy="sglang+", capacity_bytes=BIG, scheduler=scheduler, sessions_per_second=0.5)
        req = simulate(trace, cfg, timing=timing).requests
        assert list(req["e2e_s"] - req["ttft_s"]) == pytest.approx([(out - 1) * 2e-3] * 2, abs=1e-12)
        if out > 1:
            assert list(req["tpot_s"]) == pytest.approx([2e-3] * 2, rel=1e-9)
        ends[scheduler] = list(req["e2e_s"])
    assert ends["fcfs"] == pytest.approx(ends["continuous"], rel=1e-9)
