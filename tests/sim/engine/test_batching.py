"""``--scheduler continuous`` (sim/engine/batching.py): hand-worked tiny traces and invariants.

The step structure follows vLLM v1's scheduler (vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``:
running requests first in admission order, then waiting ones up to the token budget; recompute
preemption of the newest running request). Times are checked against the timing model's own
``step_time_s`` of the batch the test works out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config import SimConfig
from sim.cost import default_timing, get_model
from sim.engine.events import Admit, EventLog, Step
from sim.simulate import build, simulate
from sim.engine.drivers import run
from sim.errors import UsageError
from traces.base import Request, Trace

BIG = 10**13
SPEC = get_model("marconi-7b")
TIMING = default_timing("marconi-7b")
S, K = SPEC.state_bytes(), SPEC.kv_bytes_per_token()


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int64)


def open_trace(specs):
    """Open-loop requests ``(arrival, input_tokens, output_len)``, each with its own tokens."""
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=toks(10_000 * (i + 1), n_in),
            output_tokens=toks(10_000 * (i + 1) + 5_000, n_out),
            arrival=t,
        )
        for i, (t, n_in, n_out) in enumerate(specs)
    ]
    return Trace("tiny", reqs, closed_loop=False)


def go(trace, **cfg):
    log = EventLog()
    res = simulate(trace, SimConfig(**{"capacity_bytes": BIG, "scheduler": "continuous", **cfg}), observers=(log,))
    return res, log.events


def steps_of(events):
    return [e for e in events if isinstance(e, Step)]


def test_two_requests_arriving_together_share_one_step():
    res, ev = go(open_trace([(0.0, 300, 3), (0.0, 200, 3)]), policy="sglang+")
    first = steps_of(ev)[0]
    assert first.prefills == ((0, 0, 300), (1, 0, 200)) and first.decodes == () and first.tokens == 500
    dt = TIMING.step_time_s(SPEC, [(0, 300), (0, 200)], [])
    assert list(res.requests["ttft_s"]) == [dt, dt]
    # then both decode together: the 2 remaining tokens of each as one run of 2 identical steps
    second = steps_of(ev)[1]
    assert second.decodes == ((0, 300), (1, 200)) and second.steps == 2
    assert second.seconds == pytest.approx(2 * TIMING.decode_time_s(1))
    assert res.summary["batch_size_max"] == 2 and res.summary["steps"] == 3


def test_long_prompt_goes_in_budget_chunks_and_a_short_one_rides_along():
    # budget 1000: the 3,500-token prompt runs as 1000 + 1000 + 1000 + 500. The short request
    # arriving during the first step waits while the partial prefill takes the whole budget (vLLM
    # v1 serves running requests first), then shares the step of the last chunk: its first token
    # comes with the long prompt's, not one prefill later as in fcfs. A request already decoding
    # (2) gets its token in every step, between the chunks.
    trace = open_trace([(0.5, 3500, 2), (0.501, 100, 2), (0.0, 50, 200)])
    res, ev = go(trace, policy="sglang+", max_num_batched_tokens=1000)
    st_ = [s for s in steps_of(ev) if s.t_start >= 0.5]
    assert [s.prefills for s in st_[:4]] == [
        ((0, 0, 999),),
        ((0, 999, 1998),),
        ((0, 1998, 2997),),
        ((0, 2997, 3500), (1, 0, 100)),
    ]
    assert all(s.decodes and s.decodes[0][0] == 2 for s in st_[:4])
    assert all(s.tokens <= 1000 for s in steps_of(ev))
    ends = np.cumsum([s.seconds for s in st_[:4]])
    assert ends[3] == pytest.approx(st_[3].t_end - st_[0].t_start)
    ttft = res.requests["ttft_s"].to_numpy()
    assert ttft[1] == pytest.approx(ttft[0] - 0.001)  # the same step as the long prompt's last chunk
    fcfs = (
        simulate(trace, SimConfig(policy="sglang+", capacity_bytes=BIG, scheduler="fcfs")).requests["ttft_s"].to_numpy()
    )
    assert fcfs[1] == pytest.approx(fcfs[0] + TIMING.prefill_time_s(SPEC, 0, 100) - 0.001)


def test_sglang_v1_states_land_on_the_scheduler_chunk_ends():
    # budget 1000, two 1,500-token prompts at once: A runs 0-1000 then 1000-1500; B gets the
    # 500 tokens left in step 2, then 500-1500. SGLang no_buffer keeps a state at each chunk
    # end, so B's states sit at 500 and 1500 (fcfs with --prefill-chunk 1000 would put it at 1000)
    # (A has one output token: it is done with its prefill, so B has the whole third step)
    res, ev = go(open_trace([(0.0, 1500, 1), (0.0, 1500, 2)]), policy="sglang-v1", max_num_batched_tokens=1000)
    assert [s.prefills for s in steps_of(ev)[:3]] == [
        ((0, 0, 1000),),
        ((0, 1000, 1500), (1, 0, 500)),
        ((1, 500, 1500),),
    ]
    admits = {}
    for e in ev:
        if isinstance(e, Admit):
            admits.setdefault(e.request.request_id, []).append((e.position, e.phase))
    assert admits[0][:2] == [(1000, "chunk"), (1500, "prompt-end")]
    assert admits[1][:2] == [(500, "chunk"), (1500, "prompt-end")]


def test_sglang_v2_tracks_one_state_per_scheduled_step():
    # the same steps under extra_buffer: one tracked state per step, the step end rounded down to
    # 64 tokens from the step start: A (0-1000, 1000-1500) at 960 and 1448; B (0-500, 500-1500)
    # at 448 and 500 + 960 = 1460
    res, ev = go(open_trace([(0.0, 1500, 1), (0.0, 1500, 2)]), policy="sglang-v2", max_num_batched_tokens=1000)
    admits = {}
    for e in ev:
        if isinstance(e, Admit):
            admits.setdefault(e.request.request_id, []).append(e.position)
    assert admits[0][:2] == [960, 1448] and admits[1][:2] == [448, 1460]


def test_vllm_align_chunks_are_cut_on_the_block_grid():
    # block 256, budget 600, a 1,000-token prompt: 512 (whole blocks under the budget), then cut
    # at the last full block 768, then the 232-token tail; states at 512 and 768
    res, ev = go(open_trace([(0.0, 1000, 2)]), policy="vllm-align", block_size=256, max_num_batched_tokens=600)
    assert [s.prefills for s in steps_of(ev)[:3]] == [((0, 0, 512),), ((0, 512, 768),), ((0, 768, 1000),)]
    admits = [e.position for e in ev if isinstance(e, Admit)]
    assert admits[:2] == [512, 768]


def test_preemption_when_memory_runs_out_recomputes_and_finishes():
    # room for 2 state slots and 230 tokens of KV: both 100-token prompts fit (200 tokens), both
    # decode (+2 tokens a step) until step 16 finds no room: the newer request (1) is preempted
    # (all its memory back), waits until 0 finishes, then recomputes its prompt + the 16 tokens
    # it had generated and finishes its 50 tokens
    trace = open_trace([(0.0, 100, 50), (0.0, 100, 50)])
    res, ev = go(trace, policy="sglang+", capacity_bytes=2 * S + 230 * K)
    st_ = steps_of(ev)
    pre = [s for s in st_ if s.preempted]
    assert len(pre) == 1 and pre[0].preempted == (1,) and pre[0].decodes == ((0, 115),)
    assert res.summary["preemptions"] == 1
    assert [p for s in st_ for p in s.prefills if p[0] == 1] == [(1, 0, 100), (1, 0, 116)]
    assert list(res.requests["output_tokens"]) == [50, 50]
    assert res.requests["e2e_s"].notna().all()
    assert res.summary["peak_charged_bytes"] <= 2 * S + 230 * K and res.summary["memory_overshoots"] == 0


def test_state_pool_slots_limit_the_running_requests():
    # a pool of 2 states (--state-pool 2, sglang-v1): the third request waits for a slot
    res, ev = go(open_trace([(0.0, 100, 5)] * 3), policy="sglang-v1", state_pool="2", capacity_bytes=3 * S + 10**7)
    assert steps_of(ev)[0].prefills == ((0, 0, 100), (1, 0, 100))
    assert res.summary["batch_size_max"] == 2 and res.requests["e2e_s"].notna().all()


def test_config_refusals():
    with pytest.raises(UsageError, match="--mode des"):
        SimConfig(scheduler="continuous", mode="sequential").validate()
    with pytest.raises(UsageError, match="--servers"):
        SimConfig(scheduler="continuous", servers=2).validate()
    with pytest.raises(UsageError, match="must be >= 1"):
        SimConfig(max_num_seqs=0).validate()


def test_step_time_of_one_request_is_its_prefill_time():
    for p, L in ((0, 1), (0, 8192), (1000, 5000)):
        assert TIMING.step_time_s(SPEC, [(p, L)], []) == TIMING.prefill_time_s(SPEC, p, L)
    assert TIMING.step_time_s(SPEC, [], [700]) == TIMING.decode_time_s(1)
    assert TIMING.step_time_s(SPEC, [(0, 100)], [50, 60]) >= TIMING.step_time_s(SPEC, [(0, 100)], [])


# ---------------------------------------------------------------------------------- properties


class Counter:
    def __init__(self):
        self.finished = {}
        self.steps = []

    def decode(self, request, t_start, t_end, start_pos, end_pos, seconds):
        self.finished[request.request_id] = self.finished.get(request.request_id, 0) + 1

    def step(self, t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted):
        self.steps.append((tokens, prefills, decodes, steps))


# budgets of >= 64 tokens: with 16-token steps sglang-v1 holds a state per step end, more than the
# 10-12 slots, and a lone request overshoots (counted in memory_overshoots, by design).
# prompts of 100-400 tokens and outputs of 50-200 against 1,100-1,600 tokens of KV room and 10-12
# state slots: memory runs out now and then (about one example in ten preempts), yet any one
# request fits alone with every state its preset admits (lmdeploy: a checkpoint and a frozen block
# per 64-token anchor of the prompt, all locked while the request runs)
request_specs = st.lists(
    st.tuples(st.floats(0, 0.5), st.integers(100, 400), st.integers(50, 200)), min_size=1, max_size=8
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=request_specs,
    budget=st.integers(64, 1200),
    seqs=st.integers(1, 5),
    policy=st.sampled_from(["sglang+", "marconi", "sglang-v1", "vllm-align", "lmdeploy", "vanilla"]),
    kv_room=st.integers(1100, 1600),
    slots=st.integers(10, 12),
)
def test_every_request_finishes_once_within_budget_and_memory(specs, budget, seqs, policy, kv_room, slots):
    trace = open_trace(specs)
    cap = slots * S + kv_room * K
    obs = Counter()
    cfg = SimConfig(
        policy=policy,
        capacity_bytes=cap,
        scheduler="continuous",
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        block_size=64,
        alpha=1.0,
    )
    sim = build(trace, cfg, observers=(obs,))
    res = run(sim)
    assert obs.finished == {i: 1 for i in range(len(specs))}
    for tokens, prefills, decodes, _ in obs.steps:
        assert tokens == sum(b - a for _, a, b in prefills) + len(decodes) <= budget
        assert len(prefills) + len(decodes) <= seqs
    assert res.summary["memory_overshoots"] == 0
    assert res.summary["peak_charged_bytes"] <= cap
    assert sim.tree.capacity_bytes == cap  # every charge given back
    sim.tree.check_invariants()
    assert list(res.requests["output_tokens"]) == [n for _, _, n in specs]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 400), st.integers(1, 30)), min_size=1, max_size=6),
    policy=st.sampled_from(["sglang+", "marconi", "sglang-v1", "lmdeploy", "vanilla"]),
)
def test_one_request_at_a_time_with_an_infinite_budget_equals_fcfs(turns, policy):
    # requests far apart, built from a few shared prefixes so the cache hits; vllm-align is left
    # out: it cuts even an unlimited step at the last full block (two steps, two overheads)
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=np.concatenate((toks(100 * p, 200), toks(10_000 * (i + 1), n))),
            output_tokens=toks(10_000 * (i + 1) + 5_000, m),
            arrival=1000.0 * i,
        )
        for i, (p, n, m) in enumerate(turns)
    ]
    trace = Trace("apart", reqs, closed_loop=False)
    base = dict(policy=policy, capacity_bytes=BIG, alpha=1.0, prefill_chunk_tokens=10**9)
    logs = []
    out = []
    for sched in ("fcfs", "continuous"):
        log = EventLog()
        out.append(
            simulate(trace, SimConfig(**base, scheduler=sched, max_num_batched_tokens=10**9), observers=(log,)).requests
        )
        logs.append([(e.request.request_id, e.position, e.phase) for e in log.events if isinstance(e, Admit)])
    fcfs, cont = out
    for col in ("hit_tokens", "queue_s", "prefill_s", "ttft_s", "state_hit"):
        assert list(fcfs[col]) == list(cont[col]), col
    assert logs[0] == logs[1]


def test_events_file_carries_the_steps_replay_needs(tmp_path):
    import json

    import pandas as pd
    from click.testing import CliRunner

    from sim.cli import main

    jl, pq = tmp_path / "ev.jsonl", tmp_path / "ev.parquet"
    for path in (jl, pq):
        res = CliRunner().invoke(
            main,
            [
                "run",
                "--trace",
                "synthetic:chat",
                "--sessions",
                "3",
                "--policy",
                "sglang-v1",
                "--scheduler",
                "continuous",
                "--max-num-batched-tokens",
                "512",
                "--events",
                str(path),
                "--no-progress",
            ],
        )
        assert res.exit_code == 0, res.output
        assert "continuous batching (512 tokens, 256 seqs per step)" in res.output
    rows = [json.loads(line) for line in jl.read_text().splitlines()]
    steps = [r for r in rows if r["event"] == "step"]
    assert steps and all(r["tokens"] <= 512 for r in steps)
    # every prompt token of every request is computed by exactly the prefill spans of the steps
    # (no preemption at 5GB: one pass each), from its hit to its prompt's end
    spans = {}
    for r in steps:
        for rid, a, b in r["prefills"]:
            spans.setdefault(rid, []).append((a, b))
    look = {r["request_id"]: r for r in rows if r["event"] == "lookup"}
    for rid, sp in spans.items():
        assert sp[0][0] == look[rid]["hit_tokens"] and sp[-1][1] == look[rid]["input_tokens"]
        assert all(b0 == a1 for (_, b0), (a1, _) in zip(sp, sp[1:]))
    assert {r["event"] for r in rows} >= {"arrive", "lookup", "step", "prefill", "decode", "admit"}
    table = pd.read_parquet(pq)
    assert (
        len(table) == len(rows)
        and json.loads(table[table["event"] == "step"]["prefills"].iloc[0]) == steps[0]["prefills"]
    )


def test_a_whole_prompt_hit_still_computes_its_last_token():
    # the same 64-token prompt twice (llama-7b: every KV token is reusable); the second request
    # hits all 64 tokens but runs one step computing token 63 (the logits), like an engine
    prompt = toks(0, 64)
    reqs = [
        Request(session_id=i, turn=0, input_tokens=prompt, output_tokens=toks(1000 + 10 * i, 3), arrival=10.0 * i)
        for i in range(2)
    ]
    res, ev = go(Trace("same", reqs, closed_loop=False), policy="sglang+", model="llama-7b")
    assert list(res.requests["hit_tokens"]) == [0, 64]
    assert [p for s in steps_of(ev) for p in s.prefills] == [(0, 0, 64), (1, 63, 64)]


class ContextTiming(type(TIMING)):
    """The default timing plus a KV-read term that grows with each decode's context, so decode
    steps differ along a run (as a calibrated hardware model's do)."""

    def step_time_s(self, spec, prefills, decode_contexts):
        return super().step_time_s(spec, prefills, decode_contexts) + 1e-6 * sum(decode_contexts)


def test_decode_steps_whose_time_varies_are_timed_one_by_one():
    timing = ContextTiming(TIMING.effective_tflops, TIMING.overhead_ms, TIMING.decode_ms_per_token)
    trace = open_trace([(0.0, 100, 150), (0.5, 80, 3)])  # the second arrives inside a decode run
    log = EventLog()
    res = simulate(
        trace, SimConfig(policy="sglang+", capacity_bytes=BIG, scheduler="continuous"), timing=timing, observers=(log,)
    )
    st_ = steps_of(log.events)
    for s in st_:  # every event's time is the sum of its steps' times, each context one longer
        want = sum(
            timing.step_time_s(SPEC, [(a, b) for _, a, b in s.prefills], [c + i for _, c in s.decodes])
            for i in range(s.steps)
        )
        assert s.seconds == pytest.approx(want, rel=1e-12)
        assert s.t_end - s.t_start == pytest.approx(s.seconds, rel=1e-12)
    assert max(s.steps for s in st_) > 1
    cut = [s for s in st_ if s.t_start < 0.5 < s.t_end]
    assert len(cut) == 1 and cut[0].decodes == ((0, cut[0].decodes[0][1]),)  # cut at the boundary after 0.5
    nxt = st_[st_.index(cut[0]) + 1]
    assert nxt.prefills == ((1, 0, 80),) and nxt.t_start - 0.5 < timing.decode_time_s(1) * 1.01
    # request 0: its prefill step, then 149 decode steps at contexts 100..248 (plus the shared step)
    assert list(res.requests["output_tokens"]) == [150, 3]
