"""The time model's overlap form (``HardwareTiming.layer_form == "overlap"``, session 27): per layer
the fixed time, the larger of the weights read and the per-token terms, then the core; the
attention core as the causal kernel runs it; the keys and values read at the query heads too
(``kv_query_heads``); its fit (``sim.replay.calibration.fit_overlap``, ``fit_across(form=...)``)
and its file fields. Oracles: every price written out here from the spec's own fields, and tables
built from a known timing that the fit must give back. No GPU, no torch."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost import (
    LAYER_KINDS,
    HardwareTiming,
    act_gb,
    attn_run_b,
    gdn_chunks,
    get_model,
    kv_read_gb_per_layer_token,
    read_timing_file,
    timing_to_dict,
    weight_gb,
)
from sim.errors import UsageError
from sim.replay.calibration import Run, features, fit_across, fit_overlap, overlap_predict

from test_timing_carry import COUNTS, TERMS  # noqa: E402
from test_timing_carry import TRUE as ADDITIVE  # noqa: E402

# test_timing_carry's known timing in the overlap form, its weights read slower (so that short calls
# are bound by it: the max has two sides to take)
TRUE = replace(
    ADDITIVE,
    ms_per_weight_gb={"attention": 0.4, "gated_delta": 0.45, "mlp": 0.35},
    layer_form="overlap",
    kv_query_heads=True,
)
PRESETS = ("qwen3.5-9b", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b")


def layer_by_hand(t: HardwareTiming, spec, kind: str, p: int, L: int) -> float:
    """One layer's ms in the overlap form, from the spec's fields: fixed + max(weights read,
    per-token terms) + core."""
    n = L - p
    c = t.ms_per_tflop
    read = t.ms_per_weight_gb[kind] * weight_gb(spec)[kind]
    act = t.ms_per_act_gb[kind] * act_gb(spec)[kind] * n
    if kind == "attention":
        lin = c["attn_linear"] * spec.attn_layer_a * n * 1e-12 + act
        causal_b = 2.0 * spec.attn_heads * spec.attn_head_dim  # a causal kernel: L^2 - p^2 over 2 per head dim
        heads = spec.attn_kv_heads + (spec.attn_heads if spec.attn_heads > spec.attn_kv_heads else 0)
        kv = 2 * heads * spec.attn_head_dim * spec.kv_dtype_bytes * 1e-9 * L if n > 1 else 0.0
        core = c["attn_quadratic"] * causal_b * (L * L - p * p) * 1e-12 + t.ms_per_kv_gb * kv
    elif kind == "gated_delta":
        lin = c["gdn_linear"] * spec.linear_layer_a * n * 1e-12 + act
        core = c["gdn_chunk"] * spec.linear_chunk_flops * gdn_chunks(p, L) * 1e-12
    else:
        lin, core = c["mlp_linear"] * spec.mlp_layer_a * n * 1e-12 + act, 0.0
    return t.layer_call_ms[kind] + max(read, lin) + core


def call_by_hand(t: HardwareTiming, spec, p: int, L: int) -> float:
    n = {"attention": spec.n_attn, "gated_delta": spec.n_gdn + spec.n_mamba, "mlp": spec.n_mlp}
    return t.call_ms + sum(n[k] * layer_by_hand(t, spec, k, p, L) for k in LAYER_KINDS if n[k])


@pytest.mark.parametrize("name", ["qwen3.5-9b", "qwen3-next-80b-a3b", "marconi-7b", "nemotron-h-8b"])
@pytest.mark.parametrize("p,L", [(0, 1), (0, 16), (0, 700), (640, 1400), (0, 8192), (4096, 4113), (0, 33000)])
def test_a_prefill_is_priced_by_hand(name, p, L):
    spec = get_model(name)
    assert TRUE.prefill_time_s(spec, p, L) == pytest.approx(call_by_hand(TRUE, spec, p, L) * 1e-3, rel=1e-12)


def test_short_calls_read_the_weights_and_long_calls_compute():
    """qwen3.5-9b's MLP layers alone (0.2 GB of weights a layer): 16 and 32 tokens cost the same,
    the weights read; from 8,192 tokens the per-token terms, linear in the tokens."""
    spec = replace(get_model("qwen3.5-9b"), name="mlp-only", n_attn=0, n_gdn=0)
    t = TRUE
    ms = {n: t.prefill_time_s(spec, 0, n) * 1e3 for n in (16, 32, 8192, 16384)}
    fixed = t.call_ms + spec.n_mlp * (t.layer_call_ms["mlp"] + t.weights_read_ms(spec)["mlp"])
    assert ms[16] == ms[32] == pytest.approx(fixed)
    lin = t.work_parts(spec, 0, 8192, 0)[0]["mlp"]
    assert lin > t.weights_read_ms(spec)["mlp"]
    assert ms[8192] == pytest.approx(t.call_ms + spec.n_mlp * (t.layer_call_ms["mlp"] + lin))
    assert ms[16384] - ms[8192] == pytest.approx(ms[8192] - t.call_ms - spec.n_mlp * t.layer_call_ms["mlp"])


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(["qwen3.5-9b", "qwen3.5-27b", "qwen3.5-35b-a3b"]),
    st.integers(0, 20000),
    st.integers(1, 20000),
    st.sampled_from([1, 2, 4]),
)
def test_the_additive_form_prices_the_overlap_plus_the_smaller_of_read_and_compute(name, p, n, gpus):
    """Invariant: with the same terms (a causal preset, the keys and values at their own heads),
    additive - overlap = sum over layers of min(weights read, per-token terms), never negative."""
    spec = get_model(name)
    ov = replace(TRUE, kv_query_heads=False).with_gpus(gpus)
    add = replace(ov, layer_form="additive")
    lin, _ = ov.work_parts(spec, p, p + n, gdn_chunks(p, p + n))
    read = ov.weights_read_ms(spec)
    layers = {"attention": spec.n_attn, "gated_delta": spec.n_gdn, "mlp": spec.n_mlp}
    gap = sum(layers[k] * min(read[k], lin[k]) for k in LAYER_KINDS) * 1e-3
    diff = add.prefill_time_s(spec, p, p + n) - ov.prefill_time_s(spec, p, p + n)
    assert diff == pytest.approx(gap, rel=1e-9, abs=1e-15) and diff >= 0


def test_the_attention_core_runs_causal_whatever_the_flop_convention():
    """marconi-7b counts the paper's full square (``attn_causal=False``, twice a causal kernel's
    L^2 - p^2 FLOPs): the overlap form prices what the kernel runs, the same as the causal twin;
    the additive form (files fitted before) keeps the count's convention."""
    full = get_model("marconi-7b")
    causal = replace(full, attn_causal=True)
    assert full.attn_layer_b == 2 * causal.attn_layer_b and attn_run_b(full) == attn_run_b(causal)
    _, core_full = TRUE.work_parts(full, 0, 8192, 128)
    _, core_causal = TRUE.work_parts(causal, 0, 8192, 128)
    assert core_full["attention"] == core_causal["attention"]
    add = replace(TRUE, layer_form="additive", kv_query_heads=False)
    kv = add.ms_per_kv_gb * kv_read_gb_per_layer_token(full, False) * 8192
    quad = add.ms_per_tflop["attn_quadratic"] * 8192 * 8192 * 1e-12
    assert add.work_parts(full, 0, 8192, 128)[1]["attention"] == pytest.approx(quad * full.attn_layer_b + kv)
    assert add.work_parts(causal, 0, 8192, 128)[1]["attention"] == pytest.approx(quad * causal.attn_layer_b + kv)


def test_keys_and_values_read_at_the_query_heads():
    """qwen3-next-80b-a3b: 16 query heads over 2 key / value heads of 256 (bf16): 2 x (2 + 16) x
    256 x 2 bytes a token with the replay's copy, 2 x 2 x 256 x 2 without; marconi-7b (32 and 32):
    nothing copied."""
    s80 = get_model("qwen3-next-80b-a3b")
    assert (s80.attn_heads, s80.attn_kv_heads, s80.attn_head_dim, s80.kv_dtype_bytes) == (16, 2, 256, 2)
    assert kv_read_gb_per_layer_token(s80, True) == pytest.approx(2 * 18 * 256 * 2 * 1e-9)
    assert kv_read_gb_per_layer_token(s80, False) == pytest.approx(2 * 2 * 256 * 2 * 1e-9)
    m7 = get_model("marconi-7b")
    assert kv_read_gb_per_layer_token(m7, True) == kv_read_gb_per_layer_token(m7, False)


CALLS = [(0, n) for n in (1, 8, 40, 100, 300, 700, 1500, 3000, 6000, 12000, 24000)]
CALLS += [(p, p + n) for p in (1024, 4096, 9000) for n in (2, 17, 64, 333, 1500, 5000)]


def _runs(timing=TRUE):
    """Three presets' replays whose per-layer times are exactly ``layer_by_hand``'s."""
    from test_timing_carry import _table

    return [Run(get_model(m), COUNTS, _table(get_model(m), timing, CALLS, layer_by_hand), m) for m in PRESETS]


def test_fit_across_in_the_overlap_form_recovers_known_terms():
    """Tables built from a known overlap-form timing (calls on both sides of each layer's crossing,
    three presets' widths) give that timing back, every term; the additive fit of the same tables
    cannot (it misprices them)."""
    t, info = fit_across(_runs(), TRUE, peak_tflops=989.0, bandwidth_tbs=3.35, form="overlap")
    assert (t.layer_form, t.kv_query_heads, info["form"]) == ("overlap", True, "overlap")
    for k in LAYER_KINDS:
        assert t.layer_call_ms[k] == pytest.approx(TRUE.layer_call_ms[k], rel=1e-6, abs=1e-9)
        assert t.ms_per_weight_gb[k] == pytest.approx(TRUE.ms_per_weight_gb[k], rel=1e-6)
        assert t.ms_per_act_gb[k] == pytest.approx(TRUE.ms_per_act_gb[k], rel=1e-6)
        assert info["terms"][k]["p95_error"] < 1e-6
    assert t.ms_per_tflop == pytest.approx(TERMS, rel=1e-6)
    assert t.ms_per_kv_gb == pytest.approx(1.2, rel=1e-6)
    add, info_add = fit_across(_runs(), TRUE, peak_tflops=989.0, bandwidth_tbs=3.35)
    assert add.layer_form == "additive" and not add.kv_query_heads
    assert max(v["p95_error"] for v in info_add["terms"].values()) > 0.01


def test_fit_across_refuses_an_unknown_form():
    with pytest.raises(UsageError, match="form must be one of additive, overlap, not 'max'"):
        fit_across(_runs(), TRUE, form="max")


def test_fit_overlap_holds_its_bounds_and_keeps_the_least_residual():
    """Noise-free MLP calls of a known form whose weights read is faster than the bound asked:
    the fit holds the read at the bound (the device's bandwidth) and refits the rest around it,
    and the residual it returns is the true (max-form) one of the terms it returns."""
    spec = get_model("qwen3.5-9b")
    X = np.array([features(spec, "mlp", p, L, "overlap") for p, L in CALLS])
    truth = np.array([0.01, 0.2, 1.5, 1.5])  # 0.2 ms a GB: 5 TB/s, over an H100's 3.35
    y = overlap_predict(X, truth, "mlp")
    lo = np.array([0.0, 1 / 3.35, 1e3 / 989.0, 0.0])
    c, cost = fit_overlap(X, y, "mlp", lo, truth)
    assert c[1] == pytest.approx(1 / 3.35) and all(c >= lo)
    assert cost == pytest.approx(float(np.sum(((overlap_predict(X, c, "mlp") - y) / y) ** 2)))
    # unbounded from a start 1.7x off: the truth back (one preset's FLOP and activation columns are
    # collinear, both per token: their sum is what is known)
    free, free_cost = fit_overlap(X, y, "mlp", np.zeros(4), truth * 1.7)
    assert free[:2] == pytest.approx(truth[:2], rel=1e-6) and free_cost < 1e-20
    assert overlap_predict(X, free, "mlp") == pytest.approx(y, rel=1e-9)


def test_the_form_survives_a_timing_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(timing_to_dict(TRUE)))
    back = read_timing_file(path)
    assert back == TRUE and back.layer_form == "overlap" and back.kv_query_heads
    d = timing_to_dict(replace(TRUE, layer_form="additive", kv_query_heads=False))
    assert "layer_form" not in d and "kv_query_heads" not in d  # an additive file reads as before


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("layer_form", "max", "layer_form must be one of additive, overlap, not 'max'"),
        ("kv_query_heads", "yes", "bad field 'kv_query_heads'"),
    ],
)
def test_a_bad_form_field_is_one_line(tmp_path, field, value, message):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(timing_to_dict(TRUE), **{field: value})))
    with pytest.raises(UsageError, match=message):
        read_timing_file(path)


def test_the_seeded_restarts_reach_the_optimum_a_poor_start_misses(monkeypatch):
    """From a start whose weights read is far too fast, the alternation alone settles on a marking
    that is not the truth's (every call compute-bound); the seeded restarts around the start reach
    the truth (mutation run, session 27: the restarts dropped survived)."""
    from sim.replay import calibration

    spec = get_model("qwen3.5-9b")
    calls = [(0, n) for n in (1, 8, 40, 100, 300, 700, 1500, 3000, 6000, 12000, 24000)]
    X = np.array([features(spec, "mlp", p, L, "overlap") for p, L in calls])
    truth = np.array([0.01, 0.35, 1.5, 1.5])
    y = overlap_predict(X, truth, "mlp")
    start = np.array([3.12549347e-03, 3.56213925e-03, 4.93603436e00, 5.94268780e-01])
    c, cost = fit_overlap(X, y, "mlp", np.zeros(4), start)
    assert cost < 1e-20 and overlap_predict(X, c, "mlp") == pytest.approx(y, rel=1e-9)
    monkeypatch.setattr(calibration, "OVERLAP_STARTS", 0)
    _, alone = fit_overlap(X, y, "mlp", np.zeros(4), start)
    assert alone > 0.1


@pytest.mark.parametrize("form", ["additive", "overlap"])
def test_a_call_without_a_core_prices_none(form):
    """``call_ms_for(spec, work)`` (no ``core``): the per-token work alone, as with a zero core."""
    spec, t = get_model("qwen3.5-9b"), replace(TRUE, layer_form=form)
    work, _ = t.work_parts(spec, 0, 3000, gdn_chunks(0, 3000))
    zero = dict.fromkeys(LAYER_KINDS, 0.0)
    assert t.call_ms_for(spec, work) == t.call_ms_for(spec, work, 1, zero)
    assert t.call_ms_for(spec, zero) == pytest.approx(t.fixed_ms(spec))


@pytest.mark.parametrize("form", ["additive", "overlap"])
def test_the_resumed_term_comes_back_from_pairs_in_either_form(form):
    """``fit_resume`` on suffix / reference pairs built from a known timing (in its own form) plus
    a known extra per resumed chunk gives that extra back: in the overlap form a compute-bound
    call hides its weights read, so its fixed part is not ``layer_fixed_ms`` (session 27 review:
    the additive fixed part gave 0.0019 for 0.002, 0 for 5e-5)."""
    from sim.replay.calibration import fit_resume

    spec, held = get_model("qwen3.5-9b"), 0.002
    t = replace(TRUE, layer_form=form)

    def layer(k, p, L):
        lin, core = t.work_parts(spec, p, L, gdn_chunks(p, L))
        read = t.weights_read_ms(spec)[k]
        return t.layer_call_ms[k] + (max(read, lin[k]) if form == "overlap" else read + lin[k]) + core[k]

    rows = []
    for p in (1024, 2048, 4096):
        for L in (p + 2048, p + 8192, p + 16384):
            row = dict(request=len(rows), input_tokens=L, hit_tokens=p, restored=True, validated=True, splits=0)
            row.update(segments=[[p, L]], kernel_calls=1, suffix_host_bound=False, full_host_bound=False)
            for k in LAYER_KINDS:
                extra = held * gdn_chunks(p, L) if k == "gated_delta" else 0.0
                row[f"suffix_ms_{k}"] = (layer(k, p, L) + extra) * COUNTS[k]
                row[f"full_ms_{k}"] = layer(k, 0, L) * COUNTS[k]
            rows.append(row)
    got, info = fit_resume([Run(spec, COUNTS, pd.DataFrame(rows), "pairs")], t)
    assert got == pytest.approx(held, rel=1e-6) and info["pairs"] == 9


def test_the_per_sequence_fit_takes_a_one_preset_additive_timing_only():
    """``steps.fit_seq_ms`` prices a step's residual additively without per-GB terms (what
    ``--calibrate`` fits): an overlap-form or cross-preset timing is refused, not misfitted
    (session 27 review: the overlap H100 file gave {.006, .022, .028} for {0, .012, .014})."""
    from sim.replay.steps import fit_seq_ms, seq_fittable

    one = replace(
        TRUE,
        layer_form="additive",
        kv_query_heads=False,
        ms_per_weight_gb=dict.fromkeys(LAYER_KINDS, 0.0),
        ms_per_act_gb=dict.fromkeys(LAYER_KINDS, 0.0),
        ms_per_kv_gb=0.0,
    )
    assert seq_fittable(one)
    for bad in (
        TRUE,
        replace(one, layer_form="overlap"),
        replace(one, ms_per_kv_gb=1.0),
        replace(one, ms_per_act_gb=dict(one.ms_per_act_gb, mlp=1.0)),
        replace(one, ms_per_weight_gb=dict(one.ms_per_weight_gb, attention=0.3)),
    ):
        assert not seq_fittable(bad)
        with pytest.raises(ValueError, match="one-preset additive timing"):
            fit_seq_ms(pd.DataFrame(), get_model("qwen3.5-9b"), bad, COUNTS)
    from pathlib import Path

    assert not seq_fittable(read_timing_file(Path(__file__).resolve().parents[3] / "sim" / "data" / "h100-timing.json"))


def test_the_length_report_finds_the_form_that_made_the_runs():
    """``timing_fit.length_report``: per kind and call length, the median modelled / measured
    per-layer time of the one-call prefills, fit and held-out runs apart. Runs made by a known
    overlap-form timing: exactly 1 under it in every bin; under the same terms summed (the additive
    form) above 1 where the weights read and the per-token terms are both there to add."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import timing_fit
    finally:
        sys.path.remove(str(root / "benchmarks"))
    runs = [(r, {}, None) for r in _runs()]
    got = timing_fit.length_report(runs, TRUE, fit_prefix="qwen3.5-9b")
    assert list(got["length"][:3]) == ["<512", "512-4k", "4k+"] and len(got) == 9
    per_bin = {"<512": 17, "512-4k": 6, "4k+": 6}  # CALLS' new tokens: 1-333 (5 + 3 x 4), 700-3000, 5000+
    for row in got.itertuples(index=False):
        assert row[2] == per_bin[row.length] and row[4] == 2 * per_bin[row.length]  # one fit run, two held out
    assert got["fit modelled/measured"].to_numpy() == pytest.approx(1.0, rel=1e-9)
    assert got["held-out modelled/measured"].to_numpy() == pytest.approx(1.0, rel=1e-9)
    summed = timing_fit.length_report(runs, replace(TRUE, layer_form="additive"), fit_prefix="qwen3.5-9b")
    assert (summed["held-out modelled/measured"] > 1.0).all()
