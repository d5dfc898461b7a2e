"""Every rule of ``--scheduler continuous`` (sim/engine/batching.py, docs/batching.md) pinned at its
edges and off the convenient values (issue 44): the slots and KV each preset's running request is
charged, the token budget and the running-request limit at budgets that are not multiples of
anything, arrivals that cut a coasted decode run between step boundaries, the run-length rule, the
KV of a cut run given back, a lone request too large to fit, and the same presets under ``fcfs``
(which charges nothing for running requests).

Expected values are worked out by hand from the rules in docs/batching.md, not read back from the
code (the slot table is the document's: SGLang no_buffer 1, extra_buffer 3, vLLM 2, LMDeploy 2,
the others 1; none on a model without recurrent layers)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from sim.config import SimConfig
from sim.cost import default_timing, get_model
from sim.engine.batching import VARIABLE_RUN, Chunk, ContinuousEngine, Seq, StepBatch
from sim.engine.drivers import run
from sim.engine.events import EventLog, Step
from sim.simulate import build, simulate
from traces.base import Request, Trace

BIG = 10**13
SPEC = get_model("marconi-7b")
TIMING = default_timing("marconi-7b")
S, K = SPEC.state_bytes(), SPEC.kv_bytes_per_token()

# (policy, extra config) -> state slots a running request holds (docs/batching.md, "Memory")
SLOTS = [
    ("vanilla", {}, 1),  # no caching, but a running request still has its working state
    ("sglang+", {}, 1),
    ("marconi", {}, 1),
    ("vllm+", {}, 1),
    ("sglang", {}, 3),  # auto = extra_buffer: working slot + two ping-pong track buffers
    ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}, 1),
    ("sglang", {"mamba_radix_cache_strategy": "extra_buffer_lazy"}, 3),
    ("sglang-0.5.9-no-buffer", {}, 1),
    ("sglang-0.5.9-extra-buffer", {}, 3),
    ("vllm", {}, 1),  # one block per Mamba group; a second only in a step entering a new block
    ("vllm-0.11-align", {"block_size": 64}, 2),
    ("vllm-0.11-all", {"block_size": 64}, 2),
    ("lmdeploy", {}, 2),
    ("lmdeploy-0.16-pytorch", {}, 2),
    ("trtllm", {"periodic_snapshot_interval": 64}, 1),
    ("trtllm-1.2-interval", {}, 1),
]


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int64)


def request(i, n_in, n_out, t=0.0):
    return Request(
        session_id=i,
        turn=0,
        input_tokens=toks(10_000 * (i + 1), n_in),
        output_tokens=toks(10_000 * (i + 1) + 5_000, n_out),
        arrival=t,
    )


def open_trace(specs):
    return Trace("tiny", [request(i, n, m, t) for i, (t, n, m) in enumerate(specs)], closed_loop=False)


def engine_for(trace, **cfg):
    """A built simulation and its engine, not started: the test drives ``schedule`` itself."""
    sim = build(trace, SimConfig(**{"capacity_bytes": BIG, "scheduler": "continuous", **cfg}))
    env = simpy.Environment()
    noop = lambda *a: None  # noqa: E731
    return sim, ContinuousEngine(sim, env, noop, noop, noop)


def go(trace, timing=None, **cfg):
    log = EventLog()
    conf = SimConfig(**{"capacity_bytes": BIG, "scheduler": "continuous", **cfg})
    sim = build(trace, conf, observers=(log,), **({"timing": timing} if timing is not None else {}))
    res = run(sim)
    return sim, res, [e for e in log.events if isinstance(e, Step)]


# ------------------------------------------------------------------------------ slots and budget


@pytest.mark.parametrize(
    "policy,extra,slots", SLOTS, ids=[f"{p}-{'-'.join(map(str, e.values()))}" for p, e, _ in SLOTS]
)
def test_a_running_request_is_charged_its_presets_slots_and_its_chunk(policy, extra, slots):
    """A 333-token prompt and a 77-token one under a 200-token budget: each request the first step
    admits holds ``slots`` state slots and the KV of its chunk, the chunks fit the budget, and the
    cache's capacity is lowered by exactly that (presets that cut chunks on a grid cut them there;
    a preset that cuts nothing gives the first request the whole budget)."""
    trace = open_trace([(0.0, 333, 5), (0.0, 77, 5)])
    sim, eng = engine_for(trace, policy=policy, max_num_batched_tokens=200, **extra)
    cap = sim.tree.capacity_bytes
    for r in trace.requests:
        eng.arrive(r)
    batch = eng.schedule()
    prefills = batch.prefills
    assert batch.decodes == [] and batch.preempted == []
    assert batch.tokens == sum(c.end - c.start for c in prefills) and not batch.empty
    chunks = [(c.seq.req.request_id, c.start, c.end) for c in prefills]
    assert chunks[0][:2] == (0, 0) and sum(b - a for _, a, b in chunks) <= 200
    if policy not in ("vllm", "vllm-0.11-align", "trtllm"):
        assert chunks == [(0, 0, 200)] and [w.req.request_id for w in eng.waiting] == [1]
    assert [s.req.request_id for s in eng.running] == [c[0] for c in chunks]
    for s, a, b in prefills:
        assert (s.held_states, s.held_kv) == (slots, b - a)
    n = sum(b - a for _, a, b in chunks)
    st = sim.tree.state_bytes  # the preset's charge for a state (vllm: padded pages, EngineRules.state_bytes)
    assert st == S or policy == "vllm"
    assert sim.tree.capacity_bytes == cap - len(chunks) * slots * st - n * K
    assert eng.held_bytes == len(chunks) * slots * st + n * K


@pytest.mark.parametrize("policy", ["vanilla", "sglang", "vllm", "lmdeploy", "marconi"])
def test_no_state_slots_on_a_model_without_recurrent_layers(policy):
    trace = open_trace([(0.0, 129, 3)])
    sim, eng = engine_for(trace, policy=policy, model="llama-7b")
    cap = sim.tree.capacity_bytes
    eng.arrive(trace.requests[0])
    eng.schedule()
    s = eng.running[0]
    # vLLM runs the whole prompt in one step (no Mamba layers: no block-aligned split; it was cut
    # at 128) and allocates its KV in whole 16-token blocks: 9 of them
    n = 144 if policy == "vllm" else 129
    assert (s.held_states, s.held_kv) == (0, n)
    assert sim.tree.capacity_bytes == cap - n * sim.spec.kv_bytes_per_token()


@pytest.mark.parametrize(
    "policy,extra,slots", SLOTS, ids=[f"{p}-{'-'.join(map(str, e.values()))}" for p, e, _ in SLOTS]
)
def test_every_charge_is_given_back_and_fcfs_charges_nothing(policy, extra, slots):
    """Three requests (two sharing a prefix) through both schedulers: continuous gives back every
    charge (the cache's capacity is the configured one again); fcfs never lowers it."""
    base = toks(7, 150)
    reqs = [
        Request(session_id=0, turn=0, input_tokens=base, output_tokens=toks(900, 7), arrival=0.0),
        Request(
            session_id=1,
            turn=0,
            input_tokens=np.concatenate([base, toks(500, 61)]),
            output_tokens=toks(950, 4),
            arrival=0.001,
        ),
        Request(session_id=2, turn=0, input_tokens=toks(3000, 90), output_tokens=toks(3100, 9), arrival=0.002),
    ]
    trace = Trace("shared", reqs, closed_loop=False)
    cap = 40 * S + 5000 * K
    peaks = {}
    for sched in ("continuous", "fcfs"):
        conf = SimConfig(policy=policy, capacity_bytes=cap, scheduler=sched, max_num_batched_tokens=97, **extra)
        sim = build(trace, conf)
        start = sim.tree.capacity_bytes  # cap, floored to whole blocks where the engine's memory is (vllm)
        assert start == cap or policy == "vllm"
        holds = []
        orig = sim.tree._hold
        sim.tree._hold = lambda kv, st, orig=orig, holds=holds: (holds.append((kv, st)), orig(kv, st))[1]
        res = run(sim)
        assert list(res.requests["output_tokens"]) == [7, 4, 9]
        assert sim.tree.capacity_bytes == start
        peaks[sched] = (holds, res.summary)
    holds, summary = peaks["continuous"]
    assert sum(kv for kv, _ in holds) == 0 and sum(st for _, st in holds) == 0
    assert max(st for _, st in holds) == slots  # each admission charges the preset's slots at once
    assert summary["memory_overshoots"] == 0 and summary["preemptions"] == 0
    holds, summary = peaks["fcfs"]
    assert holds == [] and summary["memory_overshoots"] == 0 and summary["preemptions"] == 0


def test_a_decode_spends_one_token_of_the_budget_and_a_chunk_takes_the_rest():
    """Budget 333 (no multiple of anything): request 0 decodes, so request 1's first chunk is 332
    tokens, then 332 again (0 still decoding), then the 336 left of its 1,000 (0 done after 3
    tokens: the whole budget... of which 336 are needed)."""
    trace = open_trace([(0.0, 50, 4), (0.0, 1000, 2)])
    _, res, steps = go(trace, policy="sglang+", max_num_batched_tokens=333, max_num_seqs=8)
    assert steps[0].prefills == ((0, 0, 50), (1, 0, 283))
    assert steps[1].prefills == ((1, 283, 615),) and steps[1].decodes == ((0, 50),)
    assert steps[2].prefills == ((1, 615, 947),) and steps[2].decodes == ((0, 51),)
    assert steps[3].prefills == ((1, 947, 1000),) and steps[3].decodes == ((0, 52),)
    assert all(s.tokens <= 333 for s in steps)
    assert [s.tokens for s in steps[:4]] == [333, 333, 333, 54]


def test_the_running_request_limit_holds_the_third_request_until_one_finishes():
    trace = open_trace([(0.0, 40, 3), (0.0, 40, 6), (0.0, 40, 2)])
    _, res, steps = go(trace, policy="sglang+", max_num_seqs=2)
    assert steps[0].prefills == ((0, 0, 40), (1, 0, 40))
    assert all(len(s.prefills) + len(s.decodes) <= 2 for s in steps)
    first = next(s for s in steps if any(p[0] == 2 for p in s.prefills))
    done0 = next(s for s in steps if any(d[0] == 0 for d in s.decodes) and s.decodes[0][1] + s.steps >= 42)
    assert first.t_start == pytest.approx(done0.t_end)
    assert list(res.requests["output_tokens"]) == [3, 6, 2]


def test_a_full_engine_coasts_even_with_requests_waiting():
    """With the running-request limit reached, a waiting request cannot be scheduled, so the
    decodes go as one run (``steps`` > 1); with room, each step is scheduled alone."""
    trace = open_trace([(0.0, 30, 9), (0.0, 30, 3)])
    _, _, steps = go(trace, policy="sglang+", max_num_seqs=1)
    assert steps[1].decodes == ((0, 30),) and steps[1].steps == 8
    # a request that waits for memory while the engine has a free seat: one step at a time
    trace = open_trace([(0.0, 100, 6), (0.0, 100, 2)])
    _, res, steps = go(trace, policy="sglang+", capacity_bytes=2 * S + 150 * K, max_num_seqs=4)
    assert steps[0].prefills == ((0, 0, 100),)  # the second does not fit beside it: it waits
    waiting = [s for s in steps if s.decodes and all(d[0] == 0 for d in s.decodes)]
    assert waiting and all(s.steps == 1 for s in waiting)
    assert list(res.requests["output_tokens"]) == [6, 2]


def test_one_output_token_is_never_a_run_and_two_are():
    trace = open_trace([(0.0, 30, 2)])
    _, _, steps = go(trace, policy="sglang+")
    assert [(len(s.prefills), len(s.decodes), s.steps) for s in steps] == [(1, 0, 1), (0, 1, 1)]
    trace = open_trace([(0.0, 30, 3)])
    _, _, steps = go(trace, policy="sglang+")
    assert [(len(s.prefills), len(s.decodes), s.steps) for s in steps] == [(1, 0, 1), (0, 1, 2)]


# ------------------------------------------------------------------------------ cut runs


@pytest.mark.parametrize("frac", [0.37, 2.5, 6.93, 11.01])
def test_an_arrival_cuts_a_coasted_run_at_the_next_step_boundary(frac):
    """Request 0 decodes 40 tokens as one run of identical memory-bound steps of ``dt``; request 1
    arrives ``frac`` steps into the run (never on a boundary): the run ends after ``floor(frac) +
    1`` steps, exactly at that boundary, request 1's prefill starts there, and the KV of the steps
    not run is given back (the cache's capacity is whole again at the end)."""
    dt = TIMING.decode_time_s(1)
    first = TIMING.step_time_s(SPEC, [(0, 60)], [])
    t_arr = first + frac * dt
    trace = open_trace([(0.0, 60, 40), (t_arr, 25, 2)])
    cap = 10 * S + 10**6 * K
    sim, res, steps = go(trace, policy="sglang+", capacity_bytes=cap)
    cut = steps[1]
    done = int(frac) + 1
    assert cut.decodes == ((0, 60),) and cut.steps == done
    assert cut.t_start == pytest.approx(first, rel=1e-12)
    assert cut.t_end == pytest.approx(first + done * dt, rel=1e-12)
    assert cut.seconds == pytest.approx(done * dt, rel=1e-12)
    nxt = steps[2]
    assert nxt.prefills == ((1, 0, 25),) and nxt.decodes == ((0, 60 + done),)
    assert nxt.t_start == pytest.approx(cut.t_end, rel=1e-12)
    assert sum(s.steps for s in steps if any(d[0] == 0 for d in s.decodes)) == 39
    assert sim.tree.capacity_bytes == cap
    assert list(res.requests["output_tokens"]) == [40, 2]


class ContextTiming(type(TIMING)):
    """Decode steps that grow with the context (as a calibrated model's do): each step differs."""

    def step_time_s(self, spec, prefills, decode_contexts):
        return super().step_time_s(spec, prefills, decode_contexts) + 1e-5 * sum(decode_contexts)


@pytest.mark.parametrize("after", [0.4, 3.6, 9.2])
def test_an_arrival_cuts_a_run_whose_steps_vary_at_the_next_of_its_own_boundaries(after):
    timing = ContextTiming(TIMING.effective_tflops, TIMING.overhead_ms, TIMING.decode_ms_per_token)
    first = timing.step_time_s(SPEC, [(0, 80)], [])
    ends = np.cumsum([timing.step_time_s(SPEC, [], [80 + i]) for i in range(VARIABLE_RUN)])
    i = int(after)
    t_arr = first + ends[i - 1] + (after - i) * (ends[i] - ends[i - 1]) if i else first + after * ends[0]
    trace = open_trace([(0.0, 80, 30), (t_arr, 10, 2)])
    cap = 10 * S + 10**6 * K
    sim, res, steps = go(trace, timing=timing, policy="sglang+", capacity_bytes=cap)
    cut = steps[1]
    assert cut.steps == i + 1
    assert cut.t_end == pytest.approx(first + ends[i], rel=1e-12)
    assert steps[2].prefills == ((1, 0, 10),) and steps[2].t_start == pytest.approx(cut.t_end, rel=1e-12)
    assert sim.tree.capacity_bytes == cap


def test_a_run_longer_than_the_variable_limit_is_timed_in_pieces_of_that_many_steps():
    timing = ContextTiming(TIMING.effective_tflops, TIMING.overhead_ms, TIMING.decode_ms_per_token)
    n_out = VARIABLE_RUN + 30
    _, res, steps = go(open_trace([(0.0, 20, n_out)]), timing=timing, policy="sglang+")
    assert [s.steps for s in steps] == [1, VARIABLE_RUN, n_out - 1 - VARIABLE_RUN]
    assert steps[2].decodes == ((0, 20 + VARIABLE_RUN),)
    for s in steps[1:]:
        want = sum(timing.step_time_s(SPEC, [], [s.decodes[0][1] + i]) for i in range(s.steps))
        assert s.seconds == pytest.approx(want, rel=1e-12)


def test_a_coasted_run_charges_its_whole_kv_at_its_start():
    """The run's KV is charged when it starts (docs/batching.md, "Simplifications"): the peak
    seen is the prompt plus every output token but the last, of a run nothing cuts."""
    trace = open_trace([(0.0, 64, 17)])
    _, res, _ = go(trace, policy="vanilla", capacity_bytes=10 * S + 10**6 * K)
    # vanilla caches nothing: the request holds 1 slot and 64 + 16 tokens of KV at its peak
    assert res.summary["peak_charged_bytes"] == S + (64 + 16) * K


# ------------------------------------------------------------------------------ too large to fit


def test_a_request_too_large_to_fit_alone_runs_anyway_and_is_counted():
    """Room for one state and 100 tokens of KV; a 130-token prompt alone: admitted by force (one
    overshoot) instead of waiting forever; it finishes, and every charge is given back."""
    cap = S + 100 * K
    sim, res, steps = go(open_trace([(0.0, 130, 1)]), policy="vanilla", capacity_bytes=cap)
    assert steps[0].prefills == ((0, 0, 130),)
    assert res.summary["memory_overshoots"] == 1
    assert list(res.requests["output_tokens"]) == [1]
    assert sim.tree.capacity_bytes == cap


def test_a_published_chunk_without_room_stays_its_requests_by_force():
    """SGLang publishes every chunk (``publishes_chunks``). Room for one state and 100 tokens of
    KV; a lone 300-token prompt in 128-token chunks, 3 output tokens: every charge is forced, one
    overshoot each: the three chunks and the two decode tokens, the chunks ending at 128 and 256
    whose insert finds no room (their KV stays the request's), and the prompt's end: 8. It
    finishes and leaves nothing in the cache (its end does not fit either). SGLang itself aborts
    such a prompt at arrival (``input_limit``, docs/presets-engines.md rule 18): that is turned off
    here to drive the scheduler's forced charges."""
    from policies.sglang_current import SglangAdmission

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "input_limit", lambda self, kv_pool_tokens: None)
        sim, res, steps = go(
            open_trace([(0.0, 300, 3)]), policy="sglang", capacity_bytes=S + 100 * K, prefill_chunk_tokens=128
        )
    assert [s.prefills for s in steps if s.prefills] == [((0, 0, 128),), ((0, 128, 256),), ((0, 256, 300),)]
    assert res.summary["memory_overshoots"] == 8
    assert list(res.requests["output_tokens"]) == [3]
    assert (sim.tree.kv_tokens, sim.tree.n_states) == (0, 0)


def test_a_request_that_does_not_fit_beside_a_running_one_waits_instead_of_overshooting():
    cap = 2 * S + 150 * K
    sim, res, steps = go(open_trace([(0.0, 100, 3), (0.0, 100, 3)]), policy="vanilla", capacity_bytes=cap)
    assert steps[0].prefills == ((0, 0, 100),)
    assert res.summary["memory_overshoots"] == 0 and res.summary["preemptions"] == 0
    later = next(s for s in steps if any(p[0] == 1 for p in s.prefills))
    assert later.prefills == ((1, 0, 100),)
    assert sim.tree.capacity_bytes == cap


def test_ttft_of_a_prefill_that_waited_counts_from_its_first_step_not_its_arrival():
    """Request 1 arrives during request 0's prefill step and waits for it: its prefill time is
    its own step's time (it started in that step), its queueing time the wait before it."""
    p0 = TIMING.step_time_s(SPEC, [(0, 500)], [])
    trace = open_trace([(0.0, 500, 1), (p0 / 3, 70, 1)])
    _, res, steps = go(trace, policy="sglang+")
    p1 = TIMING.step_time_s(SPEC, [(0, 70)], [])
    assert steps[1].prefills == ((1, 0, 70),)
    assert res.requests["prefill_s"].iloc[1] == pytest.approx(p1, rel=1e-12)
    assert res.requests["ttft_s"].iloc[1] == pytest.approx(p0 + p1 - p0 / 3, rel=1e-12)
    assert res.requests["queue_s"].iloc[1] == pytest.approx(p0 - p0 / 3, rel=1e-12)


def test_fcfs_and_continuous_agree_on_a_lone_request_for_every_caching_kind():
    """One request alone, unlimited budget: the same TTFT under both schedulers, caching or not."""
    trace = open_trace([(0.0, 211, 3)])
    for policy in ("vanilla", "marconi", "sglang+"):
        out = [
            simulate(
                trace,
                SimConfig(
                    policy=policy,
                    capacity_bytes=BIG,
                    scheduler=sched,
                    max_num_batched_tokens=10**9,
                    prefill_chunk_tokens=10**9,
                ),
            ).requests["ttft_s"]
            for sched in ("fcfs", "continuous")
        ]
        assert list(out[0]) == list(out[1]), policy


def _two_hits_on_a_prompt():
    """Request 0's 64-token prompt, then requests 1 and 2 extending it by 36 tokens each."""
    prefix = toks(7, 64)
    reqs = [Request(session_id=0, turn=0, input_tokens=prefix, output_tokens=toks(900, 1), arrival=0.0)]
    for i in (1, 2):
        reqs.append(
            Request(
                session_id=i,
                turn=0,
                input_tokens=np.concatenate([prefix, toks(1000 * i, 36)]),
                output_tokens=toks(5000 * i, 50),
                arrival=1.0,
            )
        )
    return reqs


def test_a_preempted_request_gives_back_the_lock_on_its_hit():
    """Requests 1 and 2 both hit request 0's cached 64-token prompt (their lookups lock it) and
    prefill in 40-token steps; memory runs out while the newer one still holds its lock: it is
    preempted, which must unlock what it held (it locks again when it is looked up anew). At the
    end no node is locked and every charge is back."""
    cap = 4 * S + 120 * K
    sim, res, steps = go(
        Trace("lk", _two_hits_on_a_prompt(), closed_loop=False),
        policy="sglang-v1",
        capacity_bytes=cap,
        max_num_batched_tokens=40,
    )
    assert res.summary["preemptions"] == 1 and list(res.requests["hit_tokens"]) == [0, 64, 64]
    assert [s.preempted for s in steps if s.preempted] == [(2,)]
    assert sum(n.lock for n in sim.tree.iter_nodes() if n is not sim.tree.root) == 0
    sim.tree.check_invariants()
    assert sim.tree.capacity_bytes == cap


def test_batch_size_and_step_token_statistics_count_prefills_and_decodes():
    """Steps of the budget test: (2 prefills), then 3 steps of (1 prefill + 1 decode), then the
    decodes of request 1 alone: the batch-size histogram weighs each step by its steps."""
    trace = open_trace([(0.0, 50, 4), (0.0, 1000, 2)])
    _, res, steps = go(trace, policy="sglang+", max_num_batched_tokens=333, max_num_seqs=8)
    sizes = [len(s.prefills) + len(s.decodes) for s in steps for _ in range(s.steps)]
    assert sizes[:4] == [2, 2, 2, 2] and res.summary["batch_size_max"] == 2
    assert res.summary["batch_size_mean"] == pytest.approx(sum(sizes) / len(sizes))
    assert res.summary["step_tokens_max"] == 333 and res.summary["steps"] == len(sizes)


class ThresholdTiming(type(TIMING)):
    """Decode steps cost the weights' read until a context reaches 120 tokens, then 1 ms more."""

    def step_time_s(self, spec, prefills, decode_contexts):
        extra = 1e-3 if any(c >= 120 for c in decode_contexts) else 0.0
        return super().step_time_s(spec, prefills, decode_contexts) + extra


def test_a_run_whose_last_step_costs_the_same_as_its_first_is_one_event():
    """Contexts 20..118 (99 decode steps of a 100-token output): the run's last step (context 118)
    costs what its first does, so the 99 steps are one event of equal steps (not pieces of
    VARIABLE_RUN); a longer output crosses the threshold and is timed step by step."""
    timing = ThresholdTiming(TIMING.effective_tflops, TIMING.overhead_ms, TIMING.decode_ms_per_token)
    _, _, steps = go(open_trace([(0.0, 20, 100)]), timing=timing, policy="sglang+")
    assert [s.steps for s in steps] == [1, 99]
    assert steps[1].seconds == pytest.approx(99 * TIMING.decode_time_s(1), rel=1e-12)
    _, _, steps = go(open_trace([(0.0, 20, 103)]), timing=timing, policy="sglang+")
    assert [s.steps for s in steps] == [1, VARIABLE_RUN, 102 - VARIABLE_RUN]
    assert sum(s.seconds for s in steps[1:]) == pytest.approx(102 * TIMING.decode_time_s(1) + 2e-3, rel=1e-9)


def _steps_with_chunks(chunker) -> list:
    """The steps of a 1,000-token prompt (2 output tokens) and a 20-token one (3) arriving together
    under ``sglang+`` with a 128-token budget, each chunk cut by ``chunker`` (an admission's
    ``schedule_chunk``)."""
    trace = open_trace([(0.0, 1000, 2), (0.0, 20, 3)])
    conf = SimConfig(policy="sglang+", capacity_bytes=BIG, scheduler="continuous", max_num_batched_tokens=128)
    log = EventLog()
    sim = build(trace, conf, observers=(log,))
    sim.admission.schedule_chunk = chunker
    run(sim)
    return [e for e in log.events if isinstance(e, Step)]


def test_a_partial_prefill_that_takes_the_whole_budget_delays_a_later_decode():
    """Chunks cut on a 100-token grid (as an engine that cuts at snapshot points): request 0's first
    chunk is 0-100 and leaves 28 of the 128-token budget, which admits request 1 (20 tokens). In the
    next step request 0's chunk takes the whole budget (100-228: no grid point inside), so request
    1's decode waits, as vLLM v1 serves running requests in order; no step exceeds the budget."""

    def grid(start, end, budget, step_budget, ctx):
        n = min(budget, end - start)
        nxt = (start // 100 + 1) * 100
        return nxt - start if start < 100 and nxt < start + n else n

    steps = _steps_with_chunks(grid)
    assert steps[0].prefills == ((0, 0, 100), (1, 0, 20))
    assert steps[1].prefills == ((0, 100, 228),) and steps[1].decodes == ()
    assert all(s.tokens <= 128 for s in steps)


def test_a_chunk_that_leaves_one_token_of_the_budget_lets_a_later_decode_run():
    """The edge of the rule above: request 0's second chunk is cut one token short of the budget
    (100-227 of 128), so the one token left is request 1's decode, in the same step (the fast path
    stops only when nothing is left)."""

    def short(start, end, budget, step_budget, ctx):
        n = min(budget, end - start)
        if start < 100:
            return min(n, 100 - start)
        return n - 1 if start == 100 else n

    steps = _steps_with_chunks(short)
    assert steps[0].prefills == ((0, 0, 100), (1, 0, 20))
    assert steps[1].prefills == ((0, 100, 227),) and steps[1].decodes == ((1, 20),)
    assert steps[1].tokens == 128 and all(s.tokens <= 128 for s in steps)


def test_a_preempted_request_re_prefilled_in_two_chunks_past_its_prompt_inserts_its_prompt_once():
    """Chunks cut at token 105 (a grid point); request 1 is preempted while decoding (its memory
    runs out, as in test_batching.py's preemption case) and recomputes its prompt plus the tokens
    it had generated in two chunks that both end past its 100-token prompt (0-105, 105-116): the
    prompt's KV is handed to the cache once, so every charge is given back and no lock is left."""
    trace = open_trace([(0.0, 100, 50), (0.0, 100, 50)])
    cap = 2 * S + 230 * K
    log = EventLog()
    conf = SimConfig(policy="sglang-v1", capacity_bytes=cap, scheduler="continuous")
    sim = build(trace, conf, observers=(log,))

    def grid(start, end, budget, step_budget, ctx):
        n = min(budget, end - start)
        return 105 - start if start < 105 < start + n else n

    sim.admission.schedule_chunk = grid
    res = run(sim)
    chunks = [p for e in log.events if isinstance(e, Step) for p in e.prefills if p[0] == 1]
    assert res.summary["preemptions"] >= 1 and chunks[-2:] == [(1, 0, 105), (1, 105, 116)]
    assert list(res.requests["output_tokens"]) == [50, 50]
    assert sim.tree.capacity_bytes == cap
    assert sum(n.lock for n in sim.tree.iter_nodes() if n is not sim.tree.root) == 0
    sim.tree.check_invariants()


# ------------------------------------------------------------------------------ the typed edges


def test_a_seq_owns_its_progress_and_its_preemption():
    """A lookup starts the prefill after the hit (a whole-prompt hit recomputes the last token),
    chunks advance it and record where they ended, the token sampled at the prompt's end and each
    decode run count towards ``n_out``, and a preemption starts over from the prompt plus the
    tokens generated so far; charges add and give back."""
    from types import SimpleNamespace

    s = Seq(Request(session_id=0, turn=0, input_tokens=toks(0, 10), output_tokens=toks(50, 4)), None, 10, 4)
    s.target = 10
    s.looked_up(SimpleNamespace(hit_tokens=10))
    assert s.pos == 9 and s.prefilling
    s.looked_up(SimpleNamespace(hit_tokens=4))
    assert s.pos == 4
    s.prefilled(7)
    s.prefilled(10)
    assert (s.pos, s.step_ends, s.prefilling) == (10, [7, 10], False)
    s.sampled()
    s.decoded_run(2)
    assert (s.pos, s.decoded, s.finished) == (12, 3, False)
    s.decoded_run(1)
    s.sampled()  # never past n_out
    assert s.decoded == 4 and s.finished
    s.charge(5, 2)
    s.charge(-1, 0)
    assert (s.held_kv, s.held_states) == (4, 2)
    s.inserted = s.prompt_in = True
    s.published = 64
    s.preempt()
    assert (s.f, s.pos, s.target, s.step_ends, s.inserted) == (None, 0, 14, [], False)
    # the re-prefill's prompt insert decides anew whether the end carries the prompt's state
    # (Simulation.end_state): a stale True would drop it, and nothing is published yet
    assert (s.prompt_in, s.published) == (False, 0)
    assert (s.held_kv, s.held_states) == (4, 2)  # the engine gives the memory back, not the Seq


def test_a_step_batch_counts_its_tokens():
    a = Seq(Request(session_id=0, turn=0, input_tokens=toks(0, 9), output_tokens=toks(50, 2)), None, 9, 2)
    b = Seq(Request(session_id=1, turn=0, input_tokens=toks(0, 9), output_tokens=toks(50, 2)), None, 9, 2)
    batch = StepBatch()
    assert batch.empty and batch.tokens == 0
    batch.prefills.append(Chunk(a, 3, 9))
    batch.decodes.append(b)
    batch.preempted.append(7)
    assert not batch.empty and batch.tokens == 7
    assert [(c.seq, c.start, c.end) for c in batch.prefills] == [(a, 3, 9)]


def test_the_tuner_sees_a_request_once_however_often_it_is_looked_up():
    """The trace above (request 2 preempted, looked up again): the tuner's before-hook runs at a
    request's first lookup only, its after-hook when the request ends (mutation survivor of the
    first-lookup test in ``ContinuousEngine._lookup``)."""
    from sim.engine.batching import run_continuous

    reqs = _two_hits_on_a_prompt()
    conf = SimConfig(
        policy="sglang-v1", capacity_bytes=4 * S + 120 * K, scheduler="continuous", max_num_batched_tokens=40
    )
    sim = build(Trace("lk", reqs, closed_loop=False), conf)
    before, after = [], []
    run_continuous(
        sim,
        simpy.Environment(),
        None,
        (np.array([0.0, 1.0, 1.0]), reqs),
        lambda s, r, t: before.append(r.request_id),
        lambda s, r, t: after.append(r.request_id),
        lambda s: None,
    )
    assert sim.rec.preemptions == 1
    assert before == [0, 1, 2] and sorted(after) == [0, 1, 2]


def test_a_coasted_run_ends_when_its_shortest_request_finishes():
    """Two requests decode together with 2 and 8 tokens left: one run of 2 steps, then the longer
    one alone for 7 (mutation survivor: the run's length is the smallest remainder, not the
    largest)."""
    _, res, steps = go(open_trace([(0.0, 30, 3), (0.0, 30, 9)]), policy="sglang+", max_num_seqs=2)
    assert steps[0].prefills == ((0, 0, 30), (1, 0, 30))
    assert (steps[1].steps, steps[1].decodes) == (2, ((0, 30), (1, 30)))
    assert (steps[2].steps, steps[2].decodes) == (6, ((1, 32),))
    assert list(res.requests["output_tokens"]) == [3, 9]


def test_a_sessions_next_turn_arrives_after_its_last_one_finished():
    """Closed loop: two sessions of two turns; each second turn arrives ``think_time`` after its
    first turn's last token, and all four requests finish (mutation survivor: a finished request
    that never signals its session leaves the later turns unserved)."""
    reqs = []
    for sid in (0, 1):
        base = toks(100 * (sid + 1), 40)
        reqs.append(Request(session_id=sid, turn=0, input_tokens=base, output_tokens=toks(900 + sid, 3)))
        reqs.append(
            Request(
                session_id=sid,
                turn=1,
                input_tokens=np.concatenate([base, toks(700 + 10 * sid, 20)]),
                output_tokens=toks(950 + sid, 2),
                think_time=0.5,
            )
        )
    sim, res, steps = go(Trace("cl", reqs, closed_loop=True), policy="sglang+")
    rec = sim.rec
    assert rec.done.all() and list(res.requests["output_tokens"]) == [3, 2, 3, 2]
    for first, second in ((0, 1), (2, 3)):
        assert rec.arrival[second] == pytest.approx(rec.finish[first] + 0.5)


def test_the_tuner_sees_a_waiting_request_once_though_it_is_matched_on_every_pass():
    """SGLang matches a waiting request again each time it tries to admit it
    (``rematches_waiting``: ``_unlook`` gives the lookup back while it waits for memory), so
    request 1, refused while request 0 holds the memory, is looked up again before it is first
    scheduled: the tuner's before-hook still runs once for it (mutation survivor
    ``s.tuned = True`` dropped in ``ContinuousEngine._lookup``: the preemption case above never
    looks a request up twice before it is scheduled)."""
    from sim.engine.batching import run_continuous

    reqs = [request(0, 300, 40), request(1, 300, 40)]
    conf = SimConfig(policy="sglang", capacity_bytes=3 * S + 400 * K, scheduler="continuous")
    sim = build(Trace("w", reqs, closed_loop=False), conf)
    looked = []
    lookup = sim.lookup
    sim.lookup = lambda r, t, **kw: (looked.append(r.request_id), lookup(r, t, **kw))[1]
    before, after = [], []
    run_continuous(
        sim,
        simpy.Environment(),
        None,
        (np.array([0.0, 0.0]), reqs),
        lambda s, r, t: before.append(r.request_id),
        lambda s, r, t: after.append(r.request_id),
        lambda s: None,
    )
    assert looked.count(1) >= 2  # matched again after waiting
    assert before == [0, 1] and sorted(after) == [0, 1]


@pytest.mark.parametrize("policy", ["sglang+", "marconi"])
def test_a_request_served_one_by_one_for_lack_of_room_holds_its_one_slot(policy):
    """test_batching.py's preemption trace (two 100-token prompts, 50 tokens each, room for 2
    slots and 230 tokens): at the step that finds no room for both decodes the engine goes request
    by request (``_reserve``), preempting the newer one. A preset whose KV is charged per token
    (``kv_unit`` 1) takes no second state slot there (vLLM's new-block slot is ``kv_unit``'s
    alone): the request left running holds its one slot at every step, and the engine's charge is
    its slots and tokens (mutation survivor: ``_enters`` charging one on a per-token preset)."""
    sim, eng = engine_for(open_trace([(0.0, 100, 50), (0.0, 100, 50)]), policy=policy, capacity_bytes=2 * S + 230 * K)
    for r in sim.trace.requests:
        eng.arrive(r)
    preempted = []
    while eng.running or eng.waiting:
        batch = eng.schedule()
        preempted += batch.preempted
        assert all(s.held_states == 1 for s in eng.running), [s.held_states for s in eng.running]
        assert eng.held_bytes == sum(s.held_states * S + s.held_kv * K for s in eng.running)
        eng._apply(batch, 1, 0.0, 0.0)
    assert preempted == [1]


def test_a_preemption_in_a_step_that_runs_nothing_is_reported_once_with_the_next_step(monkeypatch):
    """A pass that preempts but schedules nothing (no step to report it with) carries its
    preempted ids to the next step that runs, and only to that one. No tight-memory run of seven
    presets was found to make such a pass (400 random traces), so one is planted: the first pass
    returns an empty batch that preempted request 7 (mutation survivor: the carried ids were
    reported again with every later step)."""
    planted = [True]
    real = ContinuousEngine.schedule

    def schedule(self):
        if planted[0]:
            planted[0] = False
            batch = StepBatch()
            batch.preempted.append(7)
            return batch
        return real(self)

    monkeypatch.setattr(ContinuousEngine, "schedule", schedule)
    _, res, steps = go(open_trace([(0.0, 30, 3), (0.0, 30, 9)]), policy="sglang+", max_num_seqs=2)
    assert [s.preempted for s in steps] == [(7,)] + [()] * (len(steps) - 1)
    assert len(steps) > 2 and res.summary["preemptions"] == 1
