"""The resumed-call term of the time model (issue 41, session 17): a prefill from a restored
state runs its gated-delta layers slower per kernel chunk than the same prompt from scratch (H200:
+4.1 us a chunk and layer on qwen3-next-80b-a3b, +5.2 on qwen3.5-27b, over the same request's
from-scratch reference; attention and MLP 1.0x). ``HardwareTiming.gdn_resume_ms_per_chunk``
prices it in ``prefill_time_s`` and, for each prefill that starts from a state, in
``step_time_s`` (session 19: one rule, ``resume_ms``); ``calibration.fit_resume`` takes it from suffix / reference
pairs; a timing file without it loads with 0. Exact values on hand-made tables."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from sim.cost import LAYER_KINDS, HardwareTiming, gdn_chunks, get_model, read_timing_file, timing_to_dict
from sim.errors import UsageError
from sim.replay.calibration import RESUME_MIN_CHUNKS, Run, features, fit_across, fit_resume, resume_extras
from sim.replay.measure import replayed_spec
from test_timing_carry import COUNTS, TRUE

KINDS = ("attention", "gated_delta", "mlp")


def timing(**kw) -> HardwareTiming:
    return HardwareTiming(
        {"attn_linear": 2.0, "attn_quadratic": 4.0, "gdn_linear": 1.5, "gdn_chunk": 30.0, "mlp_linear": 1.5},
        {"attention": 0.2, "gated_delta": 0.1, "mlp": 0.03},
        0.025,
        4.0,
        989.0,
        1,
        **kw,
    )


def test_a_resumed_prefill_pays_the_term_per_chunk_and_gated_delta_layer():
    spec = get_model("replay-tiny")  # 3 gated-delta layers, 1 attention, 4 MLPs
    t0, t1 = timing(), timing(gdn_resume_ms_per_chunk=0.004)
    assert t1.prefill_time_s(spec, 0, 1024) == t0.prefill_time_s(spec, 0, 1024)  # from scratch: none
    assert gdn_chunks(512, 1024) == 8
    extra = t1.prefill_time_s(spec, 512, 1024) - t0.prefill_time_s(spec, 512, 1024)
    assert extra == pytest.approx(3 * 8 * 0.004e-3, rel=1e-9)  # 96 us
    # a split adds its ragged chunk, also resumed
    extra = t1.prefill_time_s(spec, 512, 1024, 1) - t0.prefill_time_s(spec, 512, 1024, 1)
    assert extra == pytest.approx(3 * 9 * 0.004e-3, rel=1e-9)
    # from a state at 1 (a hit of one token) too; on 2 GPUs (tensor parallel) half of it; a call
    # with no tokens resumes nothing (mutation run, session 17: p > 0 -> p > 1, L > p -> L >= p and
    # / gpus -> * gpus survived)
    extra = t1.prefill_time_s(spec, 1, 1024) - t0.prefill_time_s(spec, 1, 1024)
    assert gdn_chunks(1, 1024) == 16 and extra == pytest.approx(3 * 16 * 0.004e-3, rel=1e-9)
    t2, t20 = replace(t1, gpus=2), replace(t0, gpus=2)
    extra = t2.prefill_time_s(spec, 512, 1024) - t20.prefill_time_s(spec, 512, 1024)
    assert extra == pytest.approx(3 * 8 * 0.004e-3 / 2, rel=1e-9)
    assert t1.prefill_time_s(spec, 512, 512, 1) == t0.prefill_time_s(spec, 512, 512, 1)
    # a step: each prefill from a state pays it as its prefill would (a request alone in a step
    # is its prefill), one from scratch and the decodes (their own fitted terms) do not
    assert t1.step_time_s(spec, [(512, 1024)], []) == pytest.approx(t1.prefill_time_s(spec, 512, 1024), rel=1e-12)
    extra = t1.step_time_s(spec, [(512, 1024), (0, 300), (64, 200)], [700, 90])
    extra -= t0.step_time_s(spec, [(512, 1024), (0, 300), (64, 200)], [700, 90])
    assert gdn_chunks(64, 200) == 3 and extra == pytest.approx(3 * (8 + 3) * 0.004e-3, rel=1e-9)
    assert t1.step_time_s(spec, [(0, 300)], [700]) == t0.step_time_s(spec, [(0, 300)], [700])
    assert t1.step_time_s(spec, [], [700, 5]) == t0.step_time_s(spec, [], [700, 5])
    assert t1.step_time_s(dense := replace(spec, n_gdn=0, n_attn=4), [(512, 1024)], []) == t0.step_time_s(
        dense, [(512, 1024)], []
    )
    # a model without gated-delta layers does not pay it
    dense = replace(spec, n_gdn=0, n_attn=4)
    assert t1.prefill_time_s(dense, 512, 1024) == t0.prefill_time_s(dense, 512, 1024)


def test_timing_files_with_and_without_the_term(tmp_path):
    d0 = timing_to_dict(timing())
    assert "gdn_resume_ms_per_chunk" not in d0  # written only when fitted: an old file's keys
    d1 = timing_to_dict(timing(gdn_resume_ms_per_chunk=0.0048))
    assert d1["gdn_resume_ms_per_chunk"] == 0.0048
    p0, p1 = tmp_path / "old.json", tmp_path / "new.json"
    p0.write_text(json.dumps(d0))
    p1.write_text(json.dumps(d1))
    assert read_timing_file(p0).gdn_resume_ms_per_chunk == 0.0  # an old file loads, without the term
    assert read_timing_file(p1) == timing(gdn_resume_ms_per_chunk=0.0048)
    p1.write_text(json.dumps(dict(d1, gdn_resume_ms_per_chunk=-0.001)))
    with pytest.raises(UsageError, match="gdn_resume_ms_per_chunk must be a finite number >= 0"):
        read_timing_file(p1)
    with pytest.raises(UsageError, match="non-negative"):
        timing(gdn_resume_ms_per_chunk=-1.0)


def pair(hit, n_in, s_per_layer, f_per_layer, k=2, **kw):
    row = dict(
        request=0,
        hit_tokens=hit,
        input_tokens=n_in,
        restored=True,
        validated=True,
        kernel_calls=1,
        suffix_ms_gated_delta=s_per_layer * k,
        full_ms_gated_delta=f_per_layer * k,
        suffix_host_bound=False,
        full_host_bound=False,
    )
    row.update(kw)
    return row


def test_the_term_is_the_median_extra_of_suffix_reference_pairs():
    spec = get_model("qwen3-next-80b-a3b")
    counts = {"attention": 0, "gated_delta": 2, "mlp": 0}
    t = timing()
    F = t.layer_fixed_ms(replayed_spec(spec, counts))["gated_delta"]
    hit, n_in = 512, 512 + 64 * 20  # 20 chunks resumed, 28 from scratch
    c, c0 = gdn_chunks(hit, n_in), gdn_chunks(0, n_in)
    assert (c, c0) == (20, 28)
    rows = []
    for e in (0.004, 0.006, 0.005):  # per chunk: the reference's 10 us a chunk, the suffix's 10 + e
        rows.append(pair(hit, n_in, F + c * (0.010 + e), F + c0 * 0.010))
    # left out: under RESUME_MIN_CHUNKS chunks, not validated, host-bound either way, two calls
    short = 512 + 64 * (RESUME_MIN_CHUNKS - 1)
    rows.append(pair(hit, short, F + 1.0, F + 0.1))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, validated=False))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, suffix_host_bound=True))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, full_host_bound=True))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, kernel_calls=2))
    run = Run(spec, counts, pd.DataFrame(rows), "pairs")
    assert resume_extras(run, t).tolist() == pytest.approx([0.004, 0.006, 0.005], rel=1e-9)
    term, info = fit_resume([run], t)
    assert term == pytest.approx(0.005, rel=1e-9) and info["pairs"] == 3
    # a suffix faster per chunk than its reference: never a negative term
    fast = Run(spec, counts, pd.DataFrame([pair(hit, n_in, F + c * 0.008, F + c0 * 0.010)]), "fast")
    assert fit_resume([fast], t)[0] == 0.0
    # no pairs (a table from before the per-layer columns, or no gated-delta layer replayed): 0
    assert fit_resume([Run(spec, {"attention": 1, "gated_delta": 0, "mlp": 1}, run.table)], t) == (0.0, {"pairs": 0})


# test_timing_carry.py's timing with every shape term, each layer kind's per-layer time its
# features' dot product with these coefficients, and its layer counts
SHAPED, LAYERS = TRUE, COUNTS


def _per_layer(spec, kind, p, L, resumed_extra=0.0) -> float:
    t, c = SHAPED, SHAPED.ms_per_tflop
    coefs = [t.layer_call_ms[kind], t.ms_per_weight_gb[kind]] + {
        "attention": [c["attn_linear"], c["attn_quadratic"], t.ms_per_act_gb[kind], t.ms_per_kv_gb],
        "gated_delta": [c["gdn_linear"], c["gdn_chunk"], t.ms_per_act_gb[kind]],
        "mlp": [c["mlp_linear"], t.ms_per_act_gb[kind]],
    }[kind]
    v = float(np.dot(features(spec, kind, p, L), coefs))
    return v + (resumed_extra * gdn_chunks(p, L) if kind == "gated_delta" and p > 0 else 0.0)


def _resumed_table(spec, calls, extra) -> pd.DataFrame:
    """One-call prefills timed exactly by SHAPED, a resumed one's gated-delta layers ``extra`` ms
    slower per chunk; a resumed call of >= RESUME_MIN_CHUNKS chunks validated, with its
    from-scratch reference timed beside (a pair)."""
    rows = []
    for p, L in calls:
        row = dict(request=len(rows), input_tokens=L, hit_tokens=p, restored=p > 0, validated=False, splits=0)
        row.update(segments=[[p, L]], suffix_host_bound=False, full_host_bound=False, kernel_calls=1)
        row.update(suffix_ms_other=0.02, full_ms_other=float("nan"), full_ms=float("nan"))
        for k in LAYER_KINDS:
            row[f"suffix_ms_{k}"] = _per_layer(spec, k, p, L, extra) * LAYERS[k]
            row[f"full_ms_{k}"] = float("nan")
        row["suffix_ms"] = sum(row[f"suffix_ms_{k}"] for k in LAYER_KINDS) + 0.02
        if p > 0 and gdn_chunks(p, L) >= RESUME_MIN_CHUNKS:
            row.update(validated=True, full_ms_other=0.02)
            for k in LAYER_KINDS:
                row[f"full_ms_{k}"] = _per_layer(spec, k, 0, L) * LAYERS[k]
            row["full_ms"] = sum(row[f"full_ms_{k}"] for k in LAYER_KINDS) + 0.02
        rows.append(row)
    return pd.DataFrame(rows)


def test_fit_across_with_resume_takes_the_term_out_of_the_gated_delta_calls_only():
    """``fit_across(resume=True)``: the term from the pairs (a first fit's fixed times), then the
    gated-delta terms fitted with each resumed call's term (its chunks x the term) taken out of
    its time; attention and MLP times are left as measured. Three presets' tables whose resumed
    calls pay 5 us a chunk and gated-delta layer: without --resume the fit folds it into the
    chunk term (20.0 -> 20.8 ms per TFLOP); with it the chunk term is 20.0 within 0.1 % and the
    term 4.93 us (the first fit's fixed time is a little off), attention and MLP exact either way
    (mutation run, session 17: the correction applied to every kind but the gated-delta one, or
    to none, survived)."""
    calls = [(0, 2000), (2000, 2031), (0, 700), (640, 1400), (0, 6000), (6000, 6600), (12000, 12017), (0, 131)]
    calls += [(p, p + n) for p in (0, 1024, 4096, 9000) for n in (1, 17, 64, 333, 1500)]
    calls += [(p, p + 64 * c) for p in (512, 1024) for c in (16, 24, 40)]  # pairs: >= 16 chunks
    models = ("qwen3.5-9b", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b")
    runs = [Run(get_model(m), LAYERS, _resumed_table(get_model(m), calls, 0.005), m) for m in models]
    plain, plain_info = fit_across(runs, SHAPED, peak_tflops=989.0)
    t, info = fit_across(runs, SHAPED, peak_tflops=989.0, resume=True)
    assert plain.gdn_resume_ms_per_chunk == 0.0 and "resume" not in plain_info
    assert plain.ms_per_tflop["gdn_chunk"] > 20.6
    assert info["resume"]["pairs"] == 27
    assert t.gdn_resume_ms_per_chunk == pytest.approx(0.005, rel=0.02)
    assert t.ms_per_tflop["gdn_chunk"] == pytest.approx(20.0, rel=1e-3)
    assert t.ms_per_tflop["gdn_linear"] == pytest.approx(1.8, rel=1e-3)
    for k, term in (("attention", "attn_linear"), ("attention", "attn_quadratic"), ("mlp", "mlp_linear")):
        assert t.ms_per_tflop[term] == pytest.approx(SHAPED.ms_per_tflop[term], rel=1e-9)
        assert t.layer_call_ms[k] == pytest.approx(SHAPED.layer_call_ms[k], rel=1e-9)
    # without resumed calls' pairs the term is 0 and the fit is the plain one
    none = [Run(r.spec, r.counts, r.table.assign(validated=False), r.name) for r in runs]
    t0, info0 = fit_across(none, SHAPED, peak_tflops=989.0, resume=True)
    assert t0.gdn_resume_ms_per_chunk == 0.0 and info0["resume"] == {"pairs": 0}
    assert t0.ms_per_tflop == fit_across(none, SHAPED, peak_tflops=989.0)[0].ms_per_tflop
    # ``drop_resume``: the same fit (the term taken out of the resumed calls), the term not priced
    # (runs measured before the conv fix: their resumed calls carried an extra the kernels no longer
    # have); the term's value kept in the info
    d, dinfo = fit_across(runs, SHAPED, peak_tflops=989.0, resume=True, drop_resume=True)
    assert d.gdn_resume_ms_per_chunk == 0.0 and dinfo["resume"]["dropped"] is True
    assert dinfo["resume"]["median"] == t.gdn_resume_ms_per_chunk
    assert d.ms_per_tflop == t.ms_per_tflop and d.layer_call_ms == t.layer_call_ms
    assert "dropped" not in info["resume"]


def test_replay_calibrate_fits_the_resumed_call_term_as_the_committed_file_does():
    """``marconi replay --calibrate`` (``calibration.calibrate_run``) on one run whose resumed calls
    pay 5 us a chunk and gated-delta layer: the term from its pairs, the fit again around it
    (the chunk term back to SHAPED's 20 ms a TFLOP within 1 %, where the plain fit folds the term
    into it: 27.6),
    the timing priced with it reproducing the run better; a run without pairs gives the plain
    fit."""
    from sim.replay import measure
    from sim.replay.calibration import calibrate_run

    calls = [(0, 2000), (2000, 2031), (0, 700), (640, 1400), (0, 6000), (6000, 6600), (12000, 12017), (0, 131)]
    calls += [(p, p + n) for p in (0, 1024, 4096, 9000) for n in (1, 17, 64, 333, 1500)]
    calls += [(p, p + 64 * c) for p in (512, 1024) for c in (16, 24, 40)]  # pairs: >= 16 chunks
    spec = get_model("qwen3.5-9b")
    df = _resumed_table(spec, calls, 0.005)
    plain, plain_info = measure.calibrate(df, spec, SHAPED, LAYERS, peak_tflops=989.0)
    t, info = calibrate_run(df, spec, SHAPED, LAYERS, peak_tflops=989.0)
    assert plain.gdn_resume_ms_per_chunk == 0.0 and plain.ms_per_tflop["gdn_chunk"] > 27.0
    assert info["resume"]["pairs"] == 9
    assert t.gdn_resume_ms_per_chunk == pytest.approx(0.005, rel=0.02)
    assert t.ms_per_tflop["gdn_chunk"] == pytest.approx(20.0, rel=0.01)
    for term in ("attn_linear", "attn_quadratic", "mlp_linear"):
        assert t.ms_per_tflop[term] == pytest.approx(plain.ms_per_tflop[term], rel=1e-9)
    # the run reproduced better: median 2.4 % -> 0.3 %, P95 4.5 % -> 3.7 %
    assert info["median_error"] < plain_info["median_error"] / 5 and info["p95_error"] < plain_info["p95_error"]
    # no pairs: the plain fit, and it says so
    t0, info0 = calibrate_run(df.assign(validated=False), spec, SHAPED, LAYERS, peak_tflops=989.0)
    assert t0.gdn_resume_ms_per_chunk == 0.0 and info0["resume"] == {"pairs": 0}
    assert (
        t0.ms_per_tflop
        == measure.calibrate(df.assign(validated=False), spec, SHAPED, LAYERS, peak_tflops=989.0)[0].ms_per_tflop
    )


def test_replay_calibrate_of_a_model_without_gated_delta_layers_fits_no_term():
    """A preset whose linear layers are not gated-delta ones (here a dense attention model's
    layers alone) gets ``measure.calibrate``'s plain fit: no term, no resume report."""
    from sim.replay import measure
    from sim.replay.calibration import calibrate_run

    calls = [(0, 2000), (2000, 2031), (0, 700), (640, 1400), (0, 6000), (6000, 6600), (0, 131)]
    calls += [(p, p + n) for p in (0, 1024, 4096) for n in (17, 64, 333, 1500)]
    calls += [(p, p + 64 * c) for p in (512, 1024) for c in (16, 24, 40)]
    df = _resumed_table(get_model("qwen3.5-9b"), calls, 0.005)
    dense, counts = get_model("llama-7b"), {"attention": 8, "gated_delta": 0, "mlp": 32}
    assert dense.n_gdn == 0
    t, info = calibrate_run(df, dense, SHAPED, counts)  # (no peak: the times are another model's)
    assert t.gdn_resume_ms_per_chunk == 0.0 and "resume" not in info
    assert t == measure.calibrate(df, dense, SHAPED, counts)[0]


def test_calibrate_takes_the_term_out_of_calls_resumed_from_a_one_token_hit():
    """A state at position 1 is a resumed call too (``p > 0``): with the term given,
    ``measure.calibrate`` takes it out of such calls before fitting, so a run whose resumed calls
    all start at token 1 gets the chunk term back (mutation run, session 19: ``p > 0 -> p > 1``
    survived)."""
    from sim.replay import measure

    calls = [(0, 2000), (0, 700), (0, 6000), (0, 131), (0, 4000), (0, 9000)]
    calls += [(1, 1 + n) for n in (17, 64, 333, 1500, 3000, 64 * 16, 64 * 40)]
    spec = get_model("qwen3.5-9b")
    df = _resumed_table(spec, calls, 0.005)
    plain, _ = measure.calibrate(df, spec, SHAPED, LAYERS, peak_tflops=989.0)
    t, _ = measure.calibrate(df, spec, SHAPED, LAYERS, peak_tflops=989.0, resume_ms_per_chunk=0.005)
    assert plain.ms_per_tflop["gdn_chunk"] > 24.0
    assert t.ms_per_tflop["gdn_chunk"] == pytest.approx(20.0, rel=0.01) and t.gdn_resume_ms_per_chunk == 0.005
