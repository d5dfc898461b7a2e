"""The hardware cost model's fit (``marconi replay --calibrate``): per-layer-type timings made by
a known HardwareTiming are fitted back to its terms; timings faster than the device's peak are
refused; the model's interface (prefill with splits, step_time_s, timing files)."""

import json

import numpy as np
import pytest

from sim.cost import HardwareTiming, TimingModel, default_timing, get_model, gdn_chunks, read_timing_file
from sim.errors import UsageError
from sim.replay.measure import _features, calibrate, nnls, request_table, write_timing
from sim.replay.records import RequestRecord

SPEC = get_model("qwen3.5-9b")
COUNTS = {"attention": 8, "gated_delta": 24, "mlp": 32}
TRUE = HardwareTiming(
    ms_per_tflop={"attn_linear": 2.0, "attn_quadratic": 4.0, "gdn_linear": 2.5, "gdn_chunk": 9.0, "mlp_linear": 1.6},
    layer_call_ms={"attention": 0.05, "gated_delta": 0.09, "mlp": 0.03},
    call_ms=0.4,
    decode_ms_per_token=5.0,
    peak_tflops=989.0,
)
CALLS = [
    [(0, 300)],
    [(128, 2000)],
    [(0, 5000)],
    [(1024, 9000)],
    [(0, 50)],
    [(0, 90), (90, 700)],
    [(3000, 3025)],
    [(0, 12000)],
    [(600, 650)],
    [(0, 100), (100, 4000)],
]


def per_type(segs, timing, counts):
    """Per-layer-type time of one call list under ``timing`` (the measurement a replay makes)."""
    terms = {
        "attention": ("attn_linear", "attn_quadratic"),
        "gated_delta": ("gdn_linear", "gdn_chunk"),
        "mlp": ("mlp_linear",),
    }
    out = {}
    for kind, ts in terms.items():
        f = _features(SPEC, kind, segs)
        per_layer = timing.layer_call_ms[kind] * f[0] + sum(
            timing.ms_per_tflop[t] * x * 1e-12 for t, x in zip(ts, f[1:])
        )
        out[kind] = per_layer * counts[kind]
    out["other"] = timing.call_ms * len(segs)
    return out


def records(timing, calls=CALLS):
    recs = []
    for i, segs in enumerate(calls):
        hit, n = segs[0][0], segs[-1][1]
        r = RequestRecord(i, n, 10, hit_tokens=hit, restored=hit > 0)
        r.suffix_segments = segs
        r.suffix_ms_by_type = per_type(segs, timing, COUNTS)
        r.suffix_ms = sum(r.suffix_ms_by_type.values())
        recs.append(r)
    return recs


def test_nnls_matches_a_hand_solution():
    A = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert np.allclose(nnls(A, np.array([1.0, 2.0, 3.0])), [1.0, 2.0])
    # the unconstrained solution has a negative entry: the best non-negative one drops it
    x = nnls(np.array([[1.0, 1.0], [1.0, 2.0]]), np.array([1.0, 0.0]))
    assert x[1] == 0 and x[0] == pytest.approx(0.5)


def test_fit_recovers_known_terms_and_the_model_reproduces_the_measurements():
    df = request_table(records(TRUE), SPEC, TRUE, COUNTS)
    t, info = calibrate(df, SPEC, TRUE, COUNTS, peak_tflops=989.0)
    for term, c in TRUE.ms_per_tflop.items():
        assert t.ms_per_tflop[term] == pytest.approx(c, rel=1e-6), term
    for kind, c in TRUE.layer_call_ms.items():
        assert t.layer_call_ms[kind] == pytest.approx(c, rel=1e-6, abs=1e-9), kind
    assert t.call_ms == pytest.approx(0.4)
    assert info["median_error"] < 1e-6 and info["p95_error"] < 1e-6
    # achieved fraction of peak: 1000 / (ms per TFLOP x peak), e.g. MLP 1.6 ms/TFLOP = 63 %
    assert info["fraction_of_peak"]["mlp_linear"] == pytest.approx(1e3 / (1.6 * 989))
    assert all(0 < f <= 1 for f in info["fraction_of_peak"].values())


def test_fit_refuses_terms_faster_than_the_peak():
    fast = HardwareTiming(dict(TRUE.ms_per_tflop, mlp_linear=0.5), TRUE.layer_call_ms, 0.4, 5.0)  # 2,000 TFLOP/s
    df = request_table(records(fast), SPEC, TRUE, COUNTS)
    with pytest.raises(UsageError, match="mlp_linear at 202% of the device's 989 TFLOP/s peak"):
        calibrate(df, SPEC, TRUE, COUNTS, peak_tflops=989.0)
    # with no peak known (a CPU) the same data fit without a bound
    t, _ = calibrate(df, SPEC, TRUE, COUNTS)
    assert t.ms_per_tflop["mlp_linear"] == pytest.approx(0.5, rel=1e-6)
    # and a timing file claiming such a term is refused when read
    with pytest.raises(UsageError, match="not physical"):
        HardwareTiming(fast.ms_per_tflop, TRUE.layer_call_ms, 0.4, 5.0, peak_tflops=989.0)


def test_calibrate_fits_the_host_term_from_the_host_issue_times():
    """``--calibrate`` on a queued GPU run (``host``): one depth (64 layer calls here), so the
    host term is all per layer call, the median of the issue times of the one-call prefills
    whose host did not wait (HOST_WAITED_MS); without ``host`` (a CPU, --measure wall) none."""
    recs = records(TRUE)
    for r, host in zip(recs, [20.0, 22.0, 45.0, 24.0, 26.0, 30.0, 21.0, 23.0, 25.0, 99.0]):
        r.suffix_host_ms = host  # 45 and 99 waited; the two split requests' (30, 99) are left out
    df = request_table(recs, SPEC, TRUE, COUNTS)
    t, info = calibrate(df, SPEC, TRUE, COUNTS, peak_tflops=989.0, host=True)
    assert t.host_ms_per_call == 0.0 and t.host_ms_per_layer == pytest.approx(23.0 / 64)
    assert info["host"]["depths"] == {64: dict(calls=7, median_ms=23.0)}
    assert t.ms_per_tflop == pytest.approx(calibrate(df, SPEC, TRUE, COUNTS, peak_tflops=989.0)[0].ms_per_tflop)
    assert not calibrate(df, SPEC, TRUE, COUNTS, peak_tflops=989.0)[0].has_host_term


def test_prefill_splits_and_step_time():
    p, L = 1000, 3000
    one = TRUE.prefill_time_s(SPEC, p, L)
    split = TRUE.prefill_time_s(SPEC, p, L, splits=1)
    # a split pays the whole model's per-call time again and one more (ragged) chunk
    extra = TRUE.fixed_ms(SPEC) + TRUE.ms_per_tflop["gdn_chunk"] * 24 * SPEC.gdn_chunk_flops * 1e-12
    assert (split - one) * 1e3 == pytest.approx(extra)
    assert TRUE.fixed_ms(SPEC) == pytest.approx(0.4 + 8 * 0.05 + 24 * 0.09 + 32 * 0.03)
    # the shared interface: one request alone is its prefill; an empty step costs nothing
    for t in (TRUE, default_timing("qwen3.5-9b"), default_timing("marconi-7b"), TimingModel(100.0, 5.0, 2.0)):
        spec = SPEC if t is not default_timing("marconi-7b") else get_model("marconi-7b")
        assert t.step_time_s(spec, [(p, L)], []) == pytest.approx(t.prefill_time_s(spec, p, L))
        assert t.step_time_s(spec, [], []) == 0.0
        both = t.step_time_s(spec, [(p, L), (0, 500)], [800, 1200])
        assert (
            both
            > t.step_time_s(spec, [(p, L)], [])
            + t.step_time_s(spec, [(0, 500)], [])
            - t.prefill_time_s(spec, 0, 0)
            - 1e-12
        )
    assert gdn_chunks(60, 70) == 2 and gdn_chunks(0, 64) == 1


def test_timing_file_round_trip(tmp_path):
    f = tmp_path / "t.json"
    write_timing(f, TRUE, SPEC, {"median_error": 0.01})
    back = read_timing_file(f)
    assert back == TRUE
    assert json.loads(f.read_text())["format"] == "marconi-timing/2"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(json.loads(f.read_text()), ms_per_tflop={"x": 1.0})))
    with pytest.raises(UsageError):
        read_timing_file(bad)


def test_fit_finds_a_launch_floor():
    """Per-layer times made by max(floor, call + FLOPs): many short calls sit on the floor, long
    calls above it; the fit recovers the floor and the device terms."""
    floored = HardwareTiming(
        TRUE.ms_per_tflop,
        TRUE.layer_call_ms,
        0.4,
        5.0,
        989.0,
        layer_floor_ms={"attention": 0.9, "gated_delta": 0.7, "mlp": 0.35},
    )
    calls = [[(h, h + n)] for h in (0, 500, 3000) for n in (5, 12, 20, 33, 47, 60)]
    calls += [[(0, n)] for n in (3000, 5000, 8000, 12000, 16000, 24000)] + [[(4000, 9000)], [(100, 7000)]]

    def per_type_floored(segs, t, counts):
        out = {}
        for kind, ts in {
            "attention": ("attn_linear", "attn_quadratic"),
            "gated_delta": ("gdn_linear", "gdn_chunk"),
            "mlp": ("mlp_linear",),
        }.items():
            f = _features(SPEC, kind, segs)
            work = t.layer_call_ms[kind] + sum(t.ms_per_tflop[x] * v * 1e-12 for x, v in zip(ts, f[1:]))
            out[kind] = max(t.layer_floor_ms[kind], work) * counts[kind]
        out["other"] = t.call_ms
        return out

    recs = []
    for i, segs in enumerate(calls):
        r = RequestRecord(i, segs[0][1], 10, hit_tokens=segs[0][0], restored=segs[0][0] > 0)
        r.suffix_segments = segs
        r.suffix_ms_by_type = per_type_floored(segs, floored, COUNTS)
        r.suffix_ms = sum(r.suffix_ms_by_type.values())
        recs.append(r)
    df = request_table(recs, SPEC, floored, COUNTS)
    t, info = calibrate(df, SPEC, floored, COUNTS, peak_tflops=989.0)
    for kind, h in floored.layer_floor_ms.items():
        assert t.layer_floor_ms[kind] == pytest.approx(h, rel=1e-6), kind
    assert t.ms_per_tflop["mlp_linear"] == pytest.approx(1.6, rel=1e-3)
    assert info["median_error"] < 1e-6
    # a short prefill is the floor of every layer, a long one is not
    assert floored.prefill_time_s(SPEC, 0, 10) * 1e3 == pytest.approx(0.4 + 8 * 0.9 + 24 * 0.7 + 32 * 0.35)


def test_simulator_charges_exact_alignment_splits():
    """The DES prefill time of each request is the model's prefill with one extra call per state
    admitted inside the computed part of the prompt off a 64-token boundary (what replay splits)."""
    from sim.config import SimConfig
    from sim.engine.drivers import run
    from sim.engine.events import EventLog
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace(
        "synthetic:chat:sessions=6,turns=3,prompt_tokens=300,user_tokens=40,output_tokens=30,prompts=2", TraceOptions()
    )
    for align in ("exact", "chunk"):
        log = EventLog()
        cfg = SimConfig(
            policy="marconi",
            model="qwen3.5-9b",
            capacity_bytes=10**12,
            alpha=0.5,
            state_alignment=align,
            mode="des",
            scheduler="fcfs",  # one prefill event per request (continuous batching times whole steps)
        )
        run(build(trace, cfg, timing=TRUE, observers=(log,)))
        admits = {}
        for ev in log.events:
            if type(ev).__name__ == "Admit":
                admits.setdefault(ev.request.request_id, []).append(ev.position)
        n_split = 0
        for ev in log.events:
            if type(ev).__name__ == "Prefill":
                rid = ev.request.request_id
                k = sum(1 for p in admits.get(rid, []) if ev.start_pos < p < ev.end_pos and p % 64)
                n_split += k
                assert ev.seconds == pytest.approx(TRUE.prefill_time_s(SPEC, ev.start_pos, ev.end_pos, splits=k))
        assert (n_split > 0) == (align == "exact")


def test_a_collinear_term_above_the_peak_is_pinned_not_refused():
    """Per-token and per-chunk terms grow together: data made with the per-token term above the
    peak (0.5 against a cap of 1.0 ms per TFLOP) fit within 1 % with it held at the peak and the
    per-chunk term taking the rest, so the fit pins it; a lone term cannot be made up for, and is
    refused (``test_fit_refuses_terms_faster_than_the_peak``)."""
    from sim.replay.measure import PIN_SLACK, _fit_kind

    tokens = np.array([100.0, 300, 640, 1000, 2050, 4000, 7000, 9000])
    chunked = np.ceil(tokens / 64) * 64
    Xs = np.stack([np.ones_like(tokens), tokens, chunked], axis=1)
    y = 50.0 + 0.5 * tokens + 3.0 * chunked
    x, bad, pinned = _fit_kind(Xs, y, 1.0, ("linear", "chunk"))
    assert not bad and pinned == ["linear"]
    assert x[1] == pytest.approx(1.0) and x[2] < 3.0  # held at the peak, its partner took the rest
    assert np.sqrt(np.mean(((Xs @ x - y) / y) ** 2)) < PIN_SLACK
    lone = np.stack([np.ones_like(tokens), tokens], axis=1)
    _, bad, _ = _fit_kind(lone, 50.0 + 0.5 * tokens, 1.0, ("linear",))
    assert [t for t, _ in bad] == ["linear"]


def test_a_pinned_term_is_held_at_its_gemm_twins_rate_where_that_fits():
    """A per-token term the data cannot separate from its partner is held at the rate measured for
    the same work (``pin_at``: the MLP's GEMM rate) when the data fit as well there, and at the
    peak only when they do not."""
    from sim.replay.measure import PIN_SLACK, _fit_kind

    tokens = np.array([100.0, 300, 640, 1000, 2050, 4000, 7000, 9000])
    chunked = np.ceil(tokens / 64) * 64
    Xs = np.stack([np.ones_like(tokens), tokens, chunked], axis=1)
    y = 50.0 + 0.5 * tokens + 3.0 * chunked
    x, bad, pinned = _fit_kind(Xs, y, 1.0, ("linear", "chunk"), pin_at={"linear": 1.6})
    assert not bad and pinned == ["linear"] and x[1] == pytest.approx(1.6)
    assert np.sqrt(np.mean(((Xs @ x - y) / y) ** 2)) < PIN_SLACK
    # a rate the data cannot take (the whole time is 3.5 per token): back to the peak
    x, bad, pinned = _fit_kind(Xs, y, 1.0, ("linear", "chunk"), pin_at={"linear": 30.0})
    assert not bad and pinned == ["linear"] and x[1] == pytest.approx(1.0)


def test_pinning_is_judged_on_the_rms_of_the_relative_residuals():
    """A lone per-token term 2 % faster than the peak (0.98 against 1.0 ms per TFLOP) over a 1 s
    call constant: held at the peak, the constant refits to 987.87 and the RMS relative residual
    grows from 0 to 1.10 %, just past ``PIN_SLACK`` (1 %), so the term is refused, not pinned.
    Worked here without the module's helpers: the residual is ``fit / y - 1`` per call."""
    from sim.replay.measure import PIN_SLACK, _fit_kind

    tokens = np.array([100.0, 300, 640, 1000, 2050, 4000, 7000, 9000])
    X = np.stack([np.ones_like(tokens), tokens], axis=1)
    y = 1000.0 + 0.98 * tokens
    x, bad, pinned = _fit_kind(X, y, 1.0, ("linear",))
    assert [t for t, _ in bad] == ["linear"] and pinned == []
    assert bad[0][1] == pytest.approx(1e3 / 0.98)
    # the held fit, by hand: slope at the peak, constant = argmin of the relative residuals
    held_c = np.sum((y - tokens) / y**2) / np.sum(1.0 / y**2)
    r = (held_c + tokens) / y - 1.0
    worse = float(np.sqrt(np.mean(r**2)))
    assert worse == pytest.approx(0.01097, abs=5e-5) and worse > PIN_SLACK
    assert x[1] == pytest.approx(1.0) and x[0] == pytest.approx(held_c, rel=1e-9)


def test_sub_millisecond_prefills_count_in_the_fit_error():
    """The fit's error is taken over every timed prefill with a positive time, sub-millisecond
    ones too (a small model's calls on a GPU: replay-tiny's take 0.05-0.6 ms on the H100): a
    timing 100x faster than TRUE, its ten calls 0.047-3.6 ms, six of them under 1 ms, fitted back
    exactly, all ten counted (mutation run, session 17: ``suffix_ms > 0`` -> ``> 1`` survived)."""
    fast = HardwareTiming(
        ms_per_tflop={k: v / 100 for k, v in TRUE.ms_per_tflop.items()},
        layer_call_ms={k: v / 100 for k, v in TRUE.layer_call_ms.items()},
        call_ms=TRUE.call_ms / 100,
        decode_ms_per_token=5.0,
        peak_tflops=1e6,
    )
    recs = records(fast)
    assert sum(r.suffix_ms < 1.0 for r in recs) == 6 and min(r.suffix_ms for r in recs) > 0.04
    t, info = calibrate(request_table(recs, SPEC, fast, COUNTS), SPEC, fast, COUNTS, peak_tflops=1e6)
    assert info["requests"] == 10 and info["median_error"] < 1e-9


def test_a_mamba2_presets_linear_layers_are_fitted_on_their_flops():
    """A Mamba2 preset replays Mamba2 layers in the gated-delta slot, priced by the timing at the
    Mamba2 layer's FLOPs (``HardwareTiming.work_tflop``). The fit's features used the gated-delta
    layer's FLOPs, 0 on such a preset: its layers were fitted as a per-call time alone (a
    tiny Nemotron-H config on the CPU: gdn_linear 0, that term's fit error 42 % median, 61 % P95)
    and a RuntimeWarning (a division by zero) reached the user."""
    import warnings

    from sim.cost import LAYER_KINDS
    from sim.replay.steps import step_features

    spec = get_model("marconi-7b")
    assert spec.n_gdn == 0 and spec.mamba_layer_a > 0
    counts = {"attention": 4, "gated_delta": 24, "mlp": 28}
    recs = []
    for i, segs in enumerate(CALLS):
        hit, n = segs[0][0], segs[-1][1]
        r = RequestRecord(i, n, 10, hit_tokens=hit, restored=hit > 0)
        r.suffix_segments = segs
        r.suffix_ms_by_type = {
            k: counts[k]
            * sum(TRUE.layer_call_ms[k] + TRUE.work_tflop(spec, s, e, gdn_chunks(s, e))[k] for s, e in segs)
            for k in LAYER_KINDS
        }
        r.suffix_ms_by_type["other"] = TRUE.call_ms * len(segs)
        r.suffix_ms = sum(r.suffix_ms_by_type.values())
        recs.append(r)
    df = request_table(recs, spec, TRUE, counts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by zero on the way
        t, info = calibrate(df, spec, TRUE, counts, peak_tflops=989.0)
    assert t.ms_per_tflop["gdn_linear"] == pytest.approx(2.5, rel=1e-6)
    assert t.layer_call_ms["gated_delta"] == pytest.approx(0.09, rel=1e-6)
    assert info["terms"]["gated_delta"]["median_error"] < 1e-6 and info["p95_error"] < 1e-6
    # the step features price the same work: the Mamba2 layers' FLOPs in the gated-delta terms
    f = step_features(spec, [(0, 1000)], [500])
    ms = sum(TRUE.ms_per_tflop[x] * (f[f"tflop_{x}"] + f[f"decode_tflop_{x}"]) for x in ("gdn_linear", "gdn_chunk"))
    want = (
        TRUE.work_tflop(spec, 0, 1000, gdn_chunks(0, 1000))["gated_delta"]
        + TRUE.work_tflop(spec, 500, 501, 1)["gated_delta"]
    )
    assert f["work_tflop_gated_delta"] == pytest.approx(spec.mamba_layer_a * 1001 * 1e-12)
    assert ms == pytest.approx(want, rel=1e-9) and ms > 0


def test_replayed_weight_bytes_count_a_mamba2_models_linear_layers():
    """The roofline's weight reads (benchmarks/replay_bench.py) of the replayed layers: a Mamba2
    preset's Mamba2 layers are read too (they were left out: n_gdn is 0 there)."""
    from sim.cost import weight_gb
    from sim.replay.measure import replayed_weight_bytes

    for name, counts in (("marconi-7b", {"attention": 1, "gated_delta": 3, "mlp": 4}), ("qwen3.5-9b", COUNTS)):
        spec = get_model(name)
        per_layer = weight_gb(spec)  # GB a layer reads per call at 2 bytes a parameter
        want = sum(counts[k] * per_layer[k] for k in counts) * 1e9
        assert replayed_weight_bytes(spec, counts) == pytest.approx(want, rel=1e-12), name


def test_a_mamba2_presets_modelled_times_share_the_overhead_by_all_its_mixer_layers():
    """marconi-7b's default timing is a one-rate TimingModel: a replay at full depth prices a
    prefill (and a step) as the simulator does. Its per-call overhead was shared by the replayed
    attention and gated-delta layers only, leaving out the Mamba2 ones: 53.7 ms against the
    simulator's 69.0 ms for 1,000 tokens."""
    from sim.replay.measure import model_counts, modelled_ms
    from sim.replay.steps import modelled_step_ms

    spec = get_model("marconi-7b")
    timing = default_timing("marconi-7b")
    assert isinstance(timing, TimingModel) and spec.n_mamba and not spec.n_gdn
    full = model_counts(spec)
    assert modelled_ms(spec, timing, full, 0, 1000) == pytest.approx(timing.prefill_time_s(spec, 0, 1000) * 1e3)
    assert modelled_ms(spec, timing, full, 256, 1000) == pytest.approx(timing.prefill_time_s(spec, 256, 1000) * 1e3)
    for pre, ctx in (([(0, 1000)], [300, 500]), ([(128, 900)], [])):
        want = timing.step_time_s(spec, pre, ctx) * 1e3
        assert modelled_step_ms(spec, timing, full, pre, ctx) == pytest.approx(want, rel=1e-9)
