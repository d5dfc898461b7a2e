"""``--scheduler continuous`` replay (sim/replay/stepper.py, sim/replay/steps.py): the batched
forward of one engine step equals per-sequence forwards (outputs, end states, KV); a continuous
replay of a small chat trace executes every step, validates every hit and reports step times; a
preemption replays and finishes; the step rows and their modelled-vs-measured errors."""

import pytest

torch = pytest.importorskip("torch")

from sim.cost import get_model  # noqa: E402
from sim.replay.checks import rel_error  # noqa: E402
from sim.replay.model import HybridModel, ReplayShape  # noqa: E402


@pytest.fixture(scope="module")
def whole_tiny():
    """replay-tiny at its full depth: attention (grouped heads), gated delta and MLP layers."""
    return HybridModel(ReplayShape.from_spec(get_model("replay-tiny")), device="cpu", dtype=torch.float32, seed=3)


@pytest.mark.parametrize("kernel", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_batched_forward_equals_per_segment_forwards(whole_tiny, kernel):
    """Both gated-delta backends: the Triton kernels (the interpreter here, compiled on a GPU) take
    the varlen batch with one initial state per sequence as the plain-torch twin does."""
    m = twin = whole_tiny
    if kernel == "triton":  # one gated-delta layer: the interpreter takes seconds per kernel call
        pytest.importorskip("triton")
        shape = ReplayShape(hidden=32, layers=1, k_heads=1, v_heads=2, head_k_dim=16, head_v_dim=16, vocab_rows=512)
        m = HybridModel(shape, device="cpu", dtype=torch.float32, seed=3, kernel="triton")
        twin = HybridModel(shape, device="cpu", dtype=torch.float32, seed=3, kernel="torch")
    g = torch.Generator().manual_seed(0)
    # four sequences: a chunk from scratch [0, 70), a chunk [100, 140) after a 100-token prefix
    # (ragged first chunk), and two decode tokens at contexts 64 and 130 (one on a chunk boundary)
    specs = [(0, 70), (100, 40), (64, 1), (130, 1)]
    prefixes, starts_state = [], []
    for p, _ in specs:
        toks = torch.randint(0, 10_000, (p + 200,), generator=g)
        st = twin.run(toks[:p], None, 0)[0] if p else None  # the same weights, plain torch
        prefixes.append(toks)
        starts_state.append(st)
    ref_x, ref_states, ref_outs = [], [], []
    for (p, n), toks, st in zip(specs, prefixes, starts_state):
        x, fin, outs = m.forward_segment(m.embed(toks[p : p + n]), st, p, [], keep_outputs=True)
        ref_x.append(x)
        ref_states.append(fin)
        ref_outs.append(outs)
    cu = [0]
    for _, n in specs:
        cu.append(cu[-1] + n)
    tokens = torch.cat([toks[p : p + n] for (p, n), toks in zip(specs, prefixes)])
    zero = m.zero_state()
    rec0 = torch.stack([(st or zero).rec for st in starts_state], dim=1)  # [L, N, Hv, K, V]
    conv0 = torch.stack([(st or zero).conv for st in starts_state], dim=1)
    kv = [None if st is None else st.kv for st in starts_state]
    before = [None if k is None else k.clone() for k in kv]
    out = m.forward_batch(tokens, cu, [p for p, _ in specs], rec0, conv0, kv, keep_outputs=True)
    for i, ((p, n), ref) in enumerate(zip(specs, ref_states)):
        a, b = cu[i], cu[i + 1]
        assert rel_error(out.x[a:b], ref_x[i]) < 1e-5
        for lo, lr in zip(out.outs, ref_outs[i]):
            assert rel_error(lo[a:b], lr) < 1e-5
        st = out.state(i, p + n)
        assert rel_error(st.rec, ref.rec) < 1e-5 and rel_error(st.conv, ref.conv) < 1e-5
        if ref.kv is not None:
            assert st.kv.shape == ref.kv.shape and rel_error(st.kv, ref.kv) < 1e-5
        if before[i] is not None:  # a prefix without room is copied, never written in place
            assert torch.equal(kv[i], before[i])


def test_batched_forward_writes_a_buffer_with_room_in_place(whole_tiny):
    m = whole_tiny
    toks = torch.arange(90)
    st = m.run(toks[:80], None, 0)[0]
    buf = torch.zeros(st.kv.shape[0], 2, 100, *st.kv.shape[3:])
    buf[:, :, :80] = st.kv
    out = m.forward_batch(toks[80:90], [0, 10], [80], st.rec[:, None], st.conv[:, None], [buf])
    ref = m.run(toks[:90], None, 0)[0]
    assert out.kv[0].data_ptr() == buf.data_ptr() and rel_error(buf[:, :, :90], ref.kv) < 1e-5


def test_batched_forward_refuses_empty_sequences(whole_tiny):
    with pytest.raises(ValueError):
        whole_tiny.forward_batch(torch.arange(3), [0, 3, 3], [0, 5])


# ---- continuous replay -----------------------------------------------------------------------

import numpy as np  # noqa: E402

from sim.config import SimConfig  # noqa: E402
from sim.replay.session import ReplaySettings, run_replay  # noqa: E402
from sim.replay.steps import step_table, with_model  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces.base import Request, Trace  # noqa: E402
from traces.registry import TraceOptions, load_trace  # noqa: E402

# sessions overlapping in time (1,000 a second: all arrive within a step or two under the H200 timing):
# steps batch several requests' chunks and decodes
CHAT = "synthetic:chat:sessions=4,turns=3,prompt_tokens=300,user_tokens=20,output_tokens=10,prompts=2"


def replay_continuous(trace, **cfg):
    events = []

    def after(name, sim, replayer):
        events.append(name)

    config = SimConfig(
        **{"policy": "marconi", "model": "replay-tiny", "scheduler": "continuous", "sessions_per_second": 1000.0, **cfg}
    )
    settings = ReplaySettings(device="cpu", dtype="fp32", coast_steps=10**6, check_steps=3)
    return run_replay(trace, config, settings, build=build, after_event=after), events


def test_continuous_replay_executes_every_step_and_validates_every_hit():
    trace = load_trace(CHAT, TraceOptions())
    res, events = replay_continuous(trace)
    s = res.summary
    assert s["failures"] == 0 and s["hits"] > 0 and s["hits_validated"] == s["hits"]
    assert s["step_events"] == events.count("step") > 0
    # no cap reached: every simulated step (coasted runs included) executed and timed
    assert s["steps_executed"] == s["steps_simulated"] == res.sim_result.summary["steps"]
    assert s["steps_coasted_untimed"] == 0 and s["steps_cross_checked"] == 3 and s["step_check_failures"] == 0
    df = res.steps
    assert len(df) == s["steps_executed"]
    assert (df["measured_ms"] > 0).all() and (df["modelled_ms"] > 0).all()
    assert (df["n_seqs"] > 1).any()  # requests share steps
    assert ((df["n_prefill_seqs"] > 0) & (df["n_decode"] > 0)).any()  # chunks and decodes in one batch
    assert (df["tokens"] == df["prefill_tokens"] + df["n_decode"]).all()
    assert df["work_tflop_gated_delta"].gt(0).all() and np.isfinite(s["step_time_error"]["median"])


def test_coasted_runs_are_timed_up_to_the_cap_and_computed_in_full():
    trace = load_trace(CHAT, TraceOptions())
    config = SimConfig(policy="marconi", model="replay-tiny", scheduler="continuous", sessions_per_second=0.5)
    settings = ReplaySettings(device="cpu", dtype="fp32", coast_steps=2)
    res = run_replay(trace, config, settings, build=build)
    s = res.summary
    ks = res.steps.groupby("event")["steps_in_event"].first()
    assert (ks > 2).any()  # some runs coasted past the cap
    assert s["steps_executed"] == int(np.minimum(ks, 2).sum()) and s["failures"] == 0
    assert s["steps_executed"] + s["steps_coasted_untimed"] == s["steps_simulated"]


def preempting_trace():
    """Two 100-token prompts of 50 output tokens each, arriving together, and a capacity with room
    for 2 state slots and 230 tokens of KV: the newer request is preempted mid-decode
    (tests/sim/engine/test_batching.py), recomputes its prompt + generated tokens and finishes."""
    from sim.cost import get_model

    spec = get_model("replay-tiny")
    S, K = spec.state_bytes(), spec.kv_bytes_per_token()
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=np.arange(10_000 * (i + 1), 10_000 * (i + 1) + 100),
            output_tokens=np.arange(10_000 * (i + 1) + 5_000, 10_000 * (i + 1) + 5_050),
            arrival=0.0,
        )
        for i in range(2)
    ]
    return Trace("tiny", reqs, closed_loop=False), 2 * S + 230 * K


def test_preempted_request_replays_and_finishes():
    trace, capacity = preempting_trace()
    res, _ = replay_continuous(trace, policy="sglang+", capacity_bytes=capacity)
    assert res.sim_result.summary["preemptions"] == 1
    s = res.summary
    assert s["failures"] == 0 and s["step_preempted_dropped"] == 1
    assert s["steps_executed"] == s["steps_simulated"]
    again = [p for ps in res.steps["prefills"] for p in ps if p[0] == 1]
    assert len(again) == 2 and again[1][1] == 0  # from scratch the second time


def test_step_rows_error_for_another_timing_model():
    from sim.cost import TimingModel, get_model
    from sim.replay.steps import ExecutedStep, modelled_step_ms

    spec = get_model("qwen3.5-9b")
    counts = {"attention": 1, "gated_delta": 3, "mlp": 4}
    steps = [
        ExecutedStep(0, 0, 1, 0.0, ((0, 0, 500),), ((1, 700),), measured_ms=10.0),
        ExecutedStep(1, 0, 3, 1.0, (), ((1, 701), (2, 64)), measured_ms=4.0),
    ]
    t1 = TimingModel(400.0, 10.0, 5.0)
    df = step_table(steps, spec, t1, counts)
    assert list(df["tokens"]) == [501, 2] and list(df["n_seqs"]) == [2, 2]
    assert list(df["context_sum"]) == [700, 765] and list(df["gdn_chunks"]) == [9, 2]
    # the decode row: memory-bound, the weights' read shared by the 4 replayed of 32 mixer layers
    assert df["modelled_ms"][1] == pytest.approx(5.0 * 4 / 32)
    t2 = TimingModel(200.0, 20.0, 10.0)
    df2 = with_model(df, spec, t2, counts)
    assert df2["modelled_ms"][1] == pytest.approx(2 * df["modelled_ms"][1])
    assert df2["error"][0] == pytest.approx((df2["modelled_ms"][0] - 10.0) / 10.0)
    assert df2["modelled_ms"][0] == pytest.approx(modelled_step_ms(spec, t2, counts, [(0, 500)], [700]))
    # features: per layer of each kind, prefill and decode terms apart
    assert df["tflop_mlp_linear"][0] == pytest.approx(spec.mlp_layer_a * 500 * 1e-12)
    assert df["decode_tflop_mlp_linear"][0] == pytest.approx(spec.mlp_layer_a * 1e-12)
    assert df["work_tflop_mlp"][0] == pytest.approx(spec.mlp_layer_a * 501 * 1e-12)


def test_executor_starts_from_the_restored_state_and_catches_up_where_it_is_not(whole_tiny):
    from sim.replay.stepper import StepExecutor

    m = whole_tiny
    toks = np.arange(1000, 1400)
    ex = StepExecutor(m, lambda rid: (toks, 300), coast_steps=1)
    t = torch.as_tensor(toks)
    at128 = m.run(t[:128], None, 0)[0]
    # request 0 restored at 128, first chunk there; request 1 restored at 128 too but (a whole-
    # prompt hit) its chunk recomputes token 127: the executor goes back and catches up untimed
    ex.lookup(0, 128, at128)
    ex.lookup(1, 128, at128)
    ex.step(0.0, 1.0, 1.0, 1, ((0, 128, 300), (1, 127, 300)), (), 173 + 173, ())
    ex.step(1.0, 2.0, 1.0, 3, (), ((0, 300), (1, 300)), 2, ())  # a coasted run of 3: 1 timed
    ref = m.run(t[:303], None, 0)[0]
    for rid in (0, 1):
        r = ex.running[rid]
        assert r.pos == 303
        assert rel_error(torch.stack([ex.rec[l][r.slot] for l in range(m.shape.layers)]), ref.rec) < 1e-5
        assert rel_error(r.kv[:, :, :303], ref.kv) < 1e-5
    assert ex.catchup_tokens == 127 and ex.coasted_untimed_tokens == 4
    assert [(e.event, e.index, e.steps_in_event) for e in ex.close()] == [(0, 0, 1), (1, 0, 3)]
    ex.done(0)
    ex.step(2.0, 3.0, 1.0, 1, (), ((1, 303),), 1, (0,))  # finished and preempted ids are freed
    assert set(ex.running) == {1} and len(ex.free) == ex._cap - 1


def test_executor_grows_each_requests_kv_as_it_runs_not_to_its_whole_length(whole_tiny):
    """A running request's KV buffer covers the tokens computed, grown by half its length at a
    step past it (never past prompt + response): a buffer of the whole length from the first step
    ran an H100 out of memory under continuous batching (marconi-7b, Mooncake, 20 GB). The states
    and KV stay those of a from-scratch run; the peak (with the old buffer held while it is copied
    into the grown one) and the live bytes are counted, and the memory plan's ``StepSizer`` fed
    the same events holds the same lengths after every step."""
    from types import SimpleNamespace

    from sim.replay.stepper import FIRST_SLOTS, KV_GROWTH, StepExecutor, StepSizer, slot_bytes

    m = whole_tiny
    toks = np.arange(2000, 3000)  # 1,000 tokens: a 600-token prompt and its response
    ex = StepExecutor(m, lambda rid: (toks, 600), coast_steps=1)
    per_token = m.shape.kv_bytes_per_token(m.dtype)
    pool = FIRST_SLOTS * slot_bytes(m.shape, m.dtype)
    sz = StepSizer(lambda rid: 1000, per_token, slot_bytes(m.shape, m.dtype), coast_steps=1)

    def step(prefills, decodes, preempted=()):
        ex.step(0.0, 1.0, 1.0, 1, prefills, decodes, 1, preempted)
        sz.step(0.0, 1.0, 1.0, 1, prefills, decodes, 1, preempted)
        assert sz.length == {rid: r.kv.shape[2] for rid, r in ex.running.items()}
        assert sz.peak_bytes == ex.peak_bytes

    for rid in (0, 1):
        ex.lookup(rid, 0, None)
        sz.lookup(SimpleNamespace(request_id=rid), 0.0, None, 0, 600)
    step(((0, 0, 200),), ())
    r = ex.running[0]
    assert r.kv.shape[2] == 200 and ex.kv_bytes == 200 * per_token  # the chunk's end, nothing more
    step(((0, 200, 250),), ())
    assert r.kv.shape[2] == 200 + int(200 * KV_GROWTH) == 300  # half again: fewer copies over a decode run
    step(((0, 250, 600),), ())
    assert r.kv.shape[2] == 600  # a chunk past the growth: its end
    for i in range(3):  # decodes up to the whole length (1,001: prompt, response and one)
        step((), ((0, 600 + i),))
    assert r.kv.shape[2] == 900 and r.pos == 603
    ref = m.run(torch.as_tensor(toks[:603]), None, 0)[0]
    assert rel_error(r.kv[:, :, :603], ref.kv) < 1e-5
    assert rel_error(torch.stack([ex.rec[l][r.slot] for l in range(m.shape.layers)]), ref.rec) < 1e-5
    step(((1, 0, 990),), ((0, 603),), preempted=(0,))  # said preempted while it runs in the step: kept
    assert ex.running[1].kv.shape[2] == 990 and ex.kv_bytes == (900 + 990) * per_token
    step((), ((1, 990),))
    assert ex.running[1].kv.shape[2] == 1001  # capped at the whole length
    # at its most while request 1's 990 positions were copied into its 1,001: both held at once
    assert ex.peak_bytes == (900 + 990 + 1001) * per_token + pool
    ex.done(0)
    sz.decode(SimpleNamespace(request_id=0), 0.0, 1.0, 600, 1000, 1.0)
    assert ex.kv_bytes == 1001 * per_token and ex.counts()["step_peak_bytes"] == ex.peak_bytes
    assert sz.kv_tokens == 1001 and list(sz.length) == [1]


def test_the_state_pool_doubling_counts_both_pools_at_its_peak(whole_tiny):
    """The ninth running request doubles the executor's state pool (``FIRST_SLOTS`` = 8 to 16):
    the old pool is held while its slots are copied into the new one, so the peak is 24 slots
    and the KV buffers of that moment, and ``StepSizer`` fed the same events counts the same."""
    from types import SimpleNamespace

    from sim.replay.stepper import FIRST_SLOTS, StepExecutor, StepSizer, slot_bytes

    m = whole_tiny
    toks = np.arange(2000, 2040)
    per_token, slot = m.shape.kv_bytes_per_token(m.dtype), slot_bytes(m.shape, m.dtype)
    ex = StepExecutor(m, lambda rid: (toks, 30), coast_steps=1)
    sz = StepSizer(lambda rid: 40, per_token, slot, coast_steps=1)
    assert FIRST_SLOTS == 8 and ex.peak_bytes == sz.peak_bytes == 8 * slot
    prefills = tuple((rid, 0, 10) for rid in range(9))
    for rid in range(9):
        ex.lookup(rid, 0, None)
        sz.lookup(SimpleNamespace(request_id=rid), 0.0, None, 0, 30)
    ex.step(0.0, 1.0, 1.0, 1, prefills, (), 90, ())
    sz.step(0.0, 1.0, 1.0, 1, prefills, (), 90, ())
    assert ex._cap == sz.slots == 16
    # the step's requests all start (``_at``: a slot each, an empty buffer) before any buffer
    # grows, so the doubling held both pools and no KV yet; after the step 16 slots and 90 tokens
    assert ex.peak_bytes == sz.peak_bytes == (8 + 16) * slot
    assert ex.kv_bytes == 90 * per_token and ex.peak_bytes > 16 * slot + 90 * per_token


def _case_trace(case):
    """The traces of the sizing test: hits and coasted decode runs (a chat trace), a preemption,
    whole-prompt hits (a prompt asked again: the executor recomputes its last token, a catch-up)."""
    if case == "preempted":
        trace, capacity = preempting_trace()
        return trace, dict(policy="sglang+", sessions_per_second=1000.0, capacity_bytes=capacity)
    if case == "whole-prompt":
        prompt = np.arange(20_000, 20_300)
        reqs = [
            Request(
                session_id=i,
                turn=0,
                input_tokens=prompt,
                output_tokens=np.arange(30_000 + 100 * i, 30_000 + 100 * i + 12),
                arrival=float(i),
            )
            for i in range(4)
        ]
        return Trace("again", reqs, closed_loop=False), dict(policy="marconi")
    return load_trace(CHAT, TraceOptions()), dict(policy="marconi", sessions_per_second=0.5)


@pytest.mark.parametrize("case", ["hits-coasted", "preempted", "whole-prompt"])
def test_memory_plan_sizes_the_executor_as_it_runs(case):
    """``simulated_plan`` plans a continuous replay's running requests on the simulation's events
    alone (``StepSizer``: no model). Run beside the real replay on the same events, it holds what
    the step executor holds after every event (each running request's position and KV buffer
    length, the state pool's slots), through hits, catch-ups, coasted decode runs and a
    preemption; its peak is the executor's ``step_peak_bytes`` to the byte, and the plan adds the
    open flights' bound."""
    from sim.cost import get_model
    from sim.replay.observer import ReplayObserver
    from sim.replay.pipeline import FLIGHT_BYTES, simulated_plan
    from sim.replay.stepper import StepSizer, slot_bytes

    trace, extra = _case_trace(case)
    config = SimConfig(model="replay-tiny", scheduler="continuous", **extra)
    settings = ReplaySettings(device="cpu", dtype="fp32", coast_steps=2)
    spec = get_model("replay-tiny")
    shape = ReplayShape.from_spec(spec)
    whole = {
        r.request_id: r.n_input_tokens(trace.block_tokens) + r.n_output_tokens(trace.block_tokens)
        for r in trace.requests
    }
    sizer = StepSizer(whole.__getitem__, shape.kv_bytes_per_token(torch.float32), slot_bytes(shape, torch.float32), 2)
    compared = []

    def beside(trace, config, timing=None, observers=()):
        return build(trace, config, timing=timing, observers=(sizer, *observers))  # the sizer first

    def after(name, sim, replayer):
        ex = next(o for o in sim.observers if isinstance(o, ReplayObserver)).stepper
        assert sizer.pos == {rid: r.pos for rid, r in ex.running.items()}, name
        assert sizer.length == {rid: r.kv.shape[2] for rid, r in ex.running.items()}, name
        assert sizer.slots == ex._cap and sizer.peak_bytes == ex.peak_bytes, name
        compared.append(name)

    res = run_replay(trace, config, settings, build=beside, after_event=after)
    s = res.summary
    assert s["failures"] == 0 and s["hits_validated"] == s["hits"]
    assert compared.count("step") == s["step_events"] > 0
    if case == "preempted":
        assert s["step_preempted_dropped"] == 1
    elif case == "whole-prompt":
        assert s["hits"] >= 2 and s["step_catchup_tokens"] > 0
    else:
        assert s["hits"] > 0 and s["steps_coasted_untimed"] > 0
    plan = simulated_plan(trace, config, settings, spec, shape, torch.float32, simulate=build, timing=res.timing)
    assert plan.running_bytes - FLIGHT_BYTES == s["step_peak_bytes"] == sizer.peak_bytes > 0
    # and the store from the tree's occupancy: at least what the store allocated (its pool grown
    # by chunks), within 10 % (each checkpoint's partial last page is what it adds)
    assert s["store_peak_bytes"] <= s["store_device_bytes"] <= plan.store_bytes <= 1.1 * s["store_device_bytes"]
