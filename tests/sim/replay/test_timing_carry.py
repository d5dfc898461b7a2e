"""The time model that carries across presets (issue 41 item 3): the shape terms, the fit across
several presets' replays (``sim.replay.calibration.fit_across``), what a replay compares with
(``replay_timing``) and the MoE width replay runs. No GPU, no torch."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from sim.cost import (
    LAYER_KINDS,
    MODELS,
    HardwareTiming,
    act_gb,
    calibrated_file,
    get_model,
    kv_gb_per_layer_token,
    read_timing_file,
    scale_timing,
    timing_to_dict,
    weight_gb,
)
from sim.errors import UsageError
from sim.gpus import get_gpu
from sim.replay import calibration
from sim.replay.calibration import NOT_COMPARED, Run, features, fit_across, replay_timing

COUNTS = {"attention": 1, "gated_delta": 3, "mlp": 4}
TERMS = {"attn_linear": 2.0, "attn_quadratic": 5.0, "gdn_linear": 1.8, "gdn_chunk": 20.0, "mlp_linear": 1.5}
TRUE = HardwareTiming(
    dict(TERMS),
    {"attention": 0.05, "gated_delta": 0.03, "mlp": 0.01},
    0.02,
    4.0,
    989.0,
    ms_per_weight_gb={"attention": 0.4, "gated_delta": 0.25, "mlp": 0.2},
    ms_per_act_gb={"attention": 3.0, "gated_delta": 4.0, "mlp": 1.5},
    ms_per_kv_gb=1.2,
)


def _table(spec, timing, calls, layer=None) -> pd.DataFrame:
    """A replay's request table whose per-layer times are exactly ``timing``'s (no host gaps):
    the additive form's terms over ``features``, or ``layer(timing, spec, kind, p, L)``."""
    rows = []
    for p, L in calls:
        row = dict(
            request=len(rows),
            input_tokens=L,
            hit_tokens=p,
            restored=p > 0,
            validated=False,
            splits=0,
            segments=[[p, L]],
            suffix_host_bound=False,
            full_host_bound=False,
            full_ms=float("nan"),
            full_ms_other=float("nan"),
            suffix_ms_other=0.02,
        )
        total = 0.0
        for k in LAYER_KINDS:
            per = layer(timing, spec, k, p, L) if layer else float(np.dot(features(spec, k, p, L), _coefs(timing, k)))
            row[f"suffix_ms_{k}"] = per * COUNTS[k]
            total += per * COUNTS[k]
        row["suffix_ms"] = total + 0.02
        rows.append(row)
    return pd.DataFrame(rows)


def _coefs(t: HardwareTiming, kind: str) -> list[float]:
    c = t.ms_per_tflop
    base = [t.layer_call_ms[kind], t.ms_per_weight_gb[kind]]
    if kind == "attention":
        return base + [c["attn_linear"], c["attn_quadratic"], t.ms_per_act_gb[kind], t.ms_per_kv_gb]
    if kind == "gated_delta":
        return base + [c["gdn_linear"], c["gdn_chunk"], t.ms_per_act_gb[kind]]
    return base + [c["mlp_linear"], t.ms_per_act_gb[kind]]


CALLS = [(0, 2000), (2000, 2031), (0, 700), (640, 1400), (0, 6000), (6000, 6600), (12000, 12017), (0, 131)]
CALLS += [(p, p + n) for p in (0, 1024, 4096, 9000) for n in (1, 17, 64, 333, 1500)]


def _runs(names=("qwen3.5-9b", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b")):
    return [Run(get_model(m), COUNTS, _table(get_model(m), TRUE, CALLS), m) for m in names]


def test_fit_across_recovers_known_terms_exactly():
    """Independent oracle: tables built from a known timing's per-layer terms give that timing
    back (every term, within rounding), with its coverage recorded."""
    t, info = fit_across(_runs(), TRUE, peak_tflops=989.0, device="h200", dtype="bf16")
    for k in LAYER_KINDS:
        assert t.layer_call_ms[k] == pytest.approx(TRUE.layer_call_ms[k], rel=1e-6, abs=1e-9)
        assert t.ms_per_weight_gb[k] == pytest.approx(TRUE.ms_per_weight_gb[k], rel=1e-6)
        assert t.ms_per_act_gb[k] == pytest.approx(TRUE.ms_per_act_gb[k], rel=1e-6)
    assert t.ms_per_tflop == pytest.approx(TRUE.ms_per_tflop, rel=1e-6)
    assert t.ms_per_kv_gb == pytest.approx(1.2, rel=1e-6)
    assert t.call_ms == pytest.approx(0.02)
    assert t.covers == {
        "models": ["qwen3.5-122b-a10b", "qwen3.5-35b-a3b", "qwen3.5-9b"],
        "d_model": [2048, 4096],
        "max_tokens": 12017,
    }
    assert (t.device, t.dtype, t.gpus) == ("h200", "bf16", 1)
    assert all(v["median_error"] < 1e-6 for v in info["terms"].values())
    # what timing_fit.py prints: each FLOP term's share of the peak (mutation run, session 25)
    assert info["fraction_of_peak"] == t.fraction_of_peak()
    assert info["fraction_of_peak"]["mlp_linear"] == pytest.approx(1e3 / (TERMS["mlp_linear"] * 989.0))


def test_fit_across_holds_a_term_faster_than_the_peak_at_the_peak():
    fast = replace(TRUE, peak_tflops=0.0, ms_per_tflop=dict(TERMS, mlp_linear=0.5))  # 2,000 TFLOP/s
    runs = [Run(get_model(m), COUNTS, _table(get_model(m), fast, CALLS), m) for m in ("qwen3.5-9b", "qwen3.5-27b")]
    t, _ = fit_across(runs, TRUE, peak_tflops=989.0)
    assert t.ms_per_tflop["mlp_linear"] == pytest.approx(1e3 / 989.0)
    assert all(f <= 1.0 + 1e-9 for f in t.fraction_of_peak().values())


def test_fit_across_holds_a_weight_read_faster_than_the_bandwidth_at_the_bandwidth():
    """``bandwidth_tbs``: a layer's weights are read no faster than the memory's bandwidth. Tables
    whose MLP reads its weights at 10 TB/s (0.1 ms a GB) fit at 1 / 4.8 ms a GB on an H200's
    4.8 TB/s, the MLP's other terms refitted around it; the kinds that read slower than the
    bandwidth come back exact, and without the option the fast read is fitted as measured."""
    fast = replace(TRUE, ms_per_weight_gb=dict(TRUE.ms_per_weight_gb, mlp=0.1))
    runs = [Run(get_model(m), COUNTS, _table(get_model(m), fast, CALLS), m) for m in ("qwen3.5-9b", "qwen3.5-27b")]
    t, info = fit_across(runs, TRUE, peak_tflops=989.0, bandwidth_tbs=4.8)
    assert t.ms_per_weight_gb["mlp"] == pytest.approx(1 / 4.8, rel=1e-12)
    assert t.ms_per_weight_gb["attention"] == pytest.approx(0.4, rel=1e-6)
    assert t.ms_per_weight_gb["gated_delta"] == pytest.approx(0.25, rel=1e-6)
    assert t.layer_call_ms["mlp"] < TRUE.layer_call_ms["mlp"]  # the fixed time gave way to the read
    assert info["terms"]["mlp"]["median_error"] > 1e-6 > info["terms"]["attention"]["median_error"]
    free, _ = fit_across(runs, TRUE, peak_tflops=989.0)
    assert free.ms_per_weight_gb["mlp"] == pytest.approx(0.1, rel=1e-6)


def test_fit_across_without_a_peak_holds_no_term():
    """No ``peak_tflops`` (a device not in the catalogue, a base without one): no cap, so a term
    faster than any device (2,000 TFLOP/s) is fitted as measured, every term exact (mutation run,
    session 17: the default peak 0 -> 1 TFLOP/s survived)."""
    fast = replace(TRUE, peak_tflops=0.0, ms_per_tflop=dict(TERMS, mlp_linear=0.5))
    runs = [Run(get_model(m), COUNTS, _table(get_model(m), fast, CALLS), m) for m in ("qwen3.5-9b", "qwen3.5-27b")]
    t, _ = fit_across(runs, fast)
    assert t.ms_per_tflop == pytest.approx(dict(TERMS, mlp_linear=0.5), rel=1e-6)
    assert t.peak_tflops == 0.0


def test_a_kind_no_run_replayed_keeps_the_bases_call_time_and_no_shape_terms():
    """Runs without attention layers (``counts`` 0: a replay of the gated-delta and MLP layers
    alone) leave attention's fixed time the base's and its activation and KV-read terms 0, not
    made up (mutation run, session 17: the KV term's start 0.0 -> 1.0 survived)."""
    counts = dict(COUNTS, attention=0)
    runs = [Run(get_model(m), counts, _table(get_model(m), TRUE, CALLS), m) for m in ("qwen3.5-9b", "qwen3.5-27b")]
    t, info = fit_across(runs, TRUE, peak_tflops=989.0)
    assert "attention" not in info["terms"] and set(info["terms"]) == {"gated_delta", "mlp"}
    assert t.ms_per_kv_gb == 0.0 and t.ms_per_act_gb["attention"] == 0.0 and t.ms_per_weight_gb["attention"] == 0.0
    assert t.layer_call_ms["attention"] == TRUE.layer_call_ms["attention"]
    assert t.ms_per_tflop["gdn_chunk"] == pytest.approx(TERMS["gdn_chunk"], rel=1e-6)


def test_a_fit_across_presets_carries_to_a_preset_it_did_not_see():
    """Fitted on three presets, the model prices a fourth (other widths, MoE) as the true one."""
    t, _ = fit_across(_runs(), TRUE, peak_tflops=989.0)
    spec = get_model("qwen3-next-80b-a3b")
    for p, L in ((0, 5000), (4096, 4300), (20000, 20033)):
        assert t.prefill_time_s(spec, p, L) == pytest.approx(TRUE.prefill_time_s(spec, p, L), rel=1e-6)


def test_the_shape_terms_by_hand():
    """One layer of each kind at 2,000 new tokens over a 1,000-token prefix: its weights read once,
    its activations per new token, (attention) the context's KV, per GPU under tensor parallel."""
    spec = get_model("qwen3.5-27b")
    only = HardwareTiming(
        dict.fromkeys(TERMS, 0.0),
        dict.fromkeys(LAYER_KINDS, 0.0),
        0.0,
        0.0,
        ms_per_weight_gb={"attention": 1.0, "gated_delta": 0.0, "mlp": 0.0},
        ms_per_act_gb={"attention": 0.0, "gated_delta": 0.0, "mlp": 2.0},
        ms_per_kv_gb=3.0,
    )
    w = only.work_tflop(spec, 1000, 3000, 32)
    assert w["mlp"] == pytest.approx(2.0 * spec.mlp_layer_a * 1e-9 / spec.d_model * 2000)
    assert w["attention"] == pytest.approx(3.0 * kv_gb_per_layer_token(spec) * 3000)
    assert kv_gb_per_layer_token(spec) == 2 * 4 * 256 * 2 * 1e-9  # 4 KV heads of 256, bf16
    assert only.layer_fixed_ms(spec)["attention"] == pytest.approx(weight_gb(spec)["attention"])
    assert act_gb(spec)["mlp"] == pytest.approx(weight_gb(spec)["mlp"] / spec.d_model)
    # a decode (one new token) is not bound by its context: one-token attention splits it
    assert only.work_tflop(spec, 3000, 3001, 1)["attention"] == 0.0
    two = replace(only, gpus=2)
    assert two.work_tflop(spec, 1000, 3000, 32)["attention"] == pytest.approx(w["attention"] / 2)
    assert two.layer_fixed_ms(spec)["attention"] == pytest.approx(weight_gb(spec)["attention"] / 2)


def test_the_shape_terms_survive_a_timing_file(tmp_path):
    t, _ = fit_across(_runs(), TRUE, peak_tflops=989.0, device="h200", dtype="bf16")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(timing_to_dict(t)))
    back = read_timing_file(path)
    assert back == t and (back.dtype, back.device, back.covers) == ("bf16", "h200", t.covers)
    bad = dict(timing_to_dict(t), ms_per_kv_gb=-1.0)
    path.write_text(json.dumps(bad))
    with pytest.raises(UsageError, match="ms_per_kv_gb"):
        read_timing_file(path)


def test_coverage_note_names_what_lies_outside():
    t, _ = fit_across(_runs(), TRUE, peak_tflops=989.0)
    assert t.coverage_note(get_model("qwen3.5-9b"), 5000) == ""
    note = t.coverage_note(get_model("qwen3.5-27b"), 40_000)
    assert "d_model 5120 (fitted 2048-4096)" in note and "40,000 tokens (fitted up to 12,017)" in note
    assert "\n" not in note


# ------------------------------------------------------------------ what a replay compares with


def _fitted(**kw):
    return replace(TRUE, device="h200", dtype="bf16", **kw)


def test_replay_timing_runs_the_preset_on_one_gpu():
    spec = get_model("qwen3-next-80b-a3b")
    t, note = replay_timing(_fitted(gpus=2, comm_ms_per_call=0.1), spec, "bf16", "cuda", "NVIDIA H200")
    assert (t.gpus, t.comm_ms_per_call, note) == (1, 0.0, "")
    d, _ = replay_timing(None, spec, "bf16", "cuda", "NVIDIA H200")  # the preset's default: 2 GPUs
    assert d.gpus == 1


def test_replay_timing_on_a_cpu_or_another_gpu_is_not_compared():
    spec = get_model("replay-tiny")
    for kind, name in (("cpu", ""), ("cuda", "NVIDIA A100-SXM4-80GB")):
        _, note = replay_timing(_fitted(), spec, "bf16", kind, name)
        assert note.startswith(NOT_COMPARED), (kind, note)
    # a file calibrated on the CPU (no GPU named) is the user's choice: compared
    assert replay_timing(replace(TRUE, device=""), spec, "fp32", "cpu")[1] == ""
    # the default (an H200 file) on a CPU
    assert replay_timing(None, spec, "fp32", "cpu")[1].startswith(NOT_COMPARED)


def test_replay_timing_on_another_catalogue_gpu_prices_it_by_the_datasheet():
    """The default timing on a B200 (no committed B200 calibration): the H200 fit carried to the
    B200 as ``marconi run --gpu b200`` carries it (compute terms at the same share of the peak, the
    per-layer call times at the bandwidth ratio 4.8 / 7.7), at one GPU, compared and said; a
    GPU the catalogue does not know stays "not compared", the dtype rule still holds."""
    spec = get_model("qwen3-next-80b-a3b")
    h200, _ = replay_timing(None, spec, "bf16", "cuda", "NVIDIA H200")
    t, note = replay_timing(None, spec, "bf16", "cuda", "NVIDIA B200")
    assert (t.device, t.uncalibrated, t.gpus) == ("b200", True, 1)
    assert note.startswith("uncalibrated for GPU b200: the h200 calibration scaled by the datasheets")
    assert "--calibrate FILE" in note and not note.startswith(NOT_COMPARED)
    for kind, ms in h200.ms_per_tflop.items():  # the same share of a 2250 TFLOP/s peak
        assert t.ms_per_tflop[kind] == pytest.approx(ms * 989 / 2250, rel=1e-12)
    for kind, ms in h200.layer_call_ms.items():
        assert t.layer_call_ms[kind] == pytest.approx(ms * 4.8 / 7.7, rel=1e-12)
    # one GPU's decode (the weights read at the bandwidth ratio), not a group's share of it
    assert t.decode_ms_per_token == pytest.approx(h200.decode_ms_per_token * 4.8 / 7.7, rel=1e-12)
    assert (t.comm_ms_per_call, t.comm_ms_per_token) == (0.0, 0.0)
    assert t.prefill_time_s(spec, 0, 4096) < h200.prefill_time_s(spec, 0, 4096)
    assert replay_timing(None, spec, "bf16", "cuda", "NVIDIA H200")[1] == ""  # its own device
    _, other = replay_timing(None, spec, "bf16", "cuda", "Some Future GPU")
    assert other.startswith(NOT_COMPARED)
    with pytest.raises(UsageError, match="fitted in bf16"):
        replay_timing(None, spec, "fp32", "cuda", "NVIDIA B200")


def test_replay_timing_on_an_h100_is_its_committed_calibration():
    """An H100 has its own committed fit (``sim/data/h100-timing.json``, ``benchmarks/timing_fit.py``
    over an H100 campaign): a replay there is compared with it, as calibrated (no note), at one GPU,
    and its terms are the file's, not the H200's carried by the datasheets."""
    spec = get_model("qwen3-next-80b-a3b")
    own = calibrated_file("h100")
    assert own is not None and own.device == "h100"
    t, note = replay_timing(None, spec, "bf16", "cuda", "NVIDIA H100 80GB HBM3")
    assert note == "" and (t.device, t.uncalibrated, t.gpus) == ("h100", False, 1)
    assert t.ms_per_tflop == own.ms_per_tflop and t.layer_call_ms == own.layer_call_ms
    assert t.gdn_resume_ms_per_chunk == own.gdn_resume_ms_per_chunk == 0.0  # fitted, taken out, not priced
    carried = scale_timing(calibrated_file("h200"), get_gpu("h200"), get_gpu("h100"))
    assert t.layer_call_ms != carried.layer_call_ms
    # what the H100 runs could not show is the H200 file's, carried by the datasheets
    assert own.seq_ms == carried.seq_ms
    assert own.decode_ms_per_token == pytest.approx(carried.decode_ms_per_token, rel=1e-12)
    # the PCIe H100 is another catalogue entry: carried from the H200, said
    _, pcie = replay_timing(None, spec, "bf16", "cuda", "NVIDIA H100 PCIe")
    assert pcie.startswith("uncalibrated for GPU h100-pcie")


def test_replay_timing_refuses_the_default_in_another_dtype():
    spec = get_model("qwen3.5-9b")
    with pytest.raises(UsageError, match="fitted in bf16.*--timing FILE"):
        replay_timing(None, spec, "fp32", "cuda", "NVIDIA H200")
    t, note = replay_timing(_fitted(), spec, "fp32", "cuda", "NVIDIA H200")  # given: compared, said
    assert note == "the timing was fitted in bf16, this replay runs fp32"


def test_replay_timing_says_when_the_preset_is_outside_the_fit():
    t, _ = fit_across(_runs(), _fitted(), peak_tflops=989.0)
    _, note = replay_timing(t, get_model("qwen3.5-27b"), "bf16", "cuda", "NVIDIA H200", 30_000)
    assert "outside the shapes" in note and "d_model 5120" in note


# ------------------------------------------------------------------ the width a MoE is replayed at


def test_mlp_width_is_tile_aligned_and_keeps_the_work():
    """A MoE's active width (routed + shared experts + router) is replayed as one dense SwiGLU of
    a 64-multiple width: within 0.6 % of the preset's MLP work (an odd width ran 2.5-3.7x slower
    than its FLOPs on the H200); dense presets keep theirs."""
    torch = pytest.importorskip("torch")
    del torch
    from sim.replay.model import MLP_WIDTH_ALIGN, MLP_WIDTH_MIN_ALIGNED, ReplayShape, mlp_width

    for name, spec in MODELS.items():
        if not (spec.n_mlp and spec.mlp_active_params):
            continue
        w = mlp_width(spec.mlp_active_params, spec.d_model)
        exact = spec.mlp_active_params / (3 * spec.d_model)
        if exact < MLP_WIDTH_MIN_ALIGNED:  # toy presets keep theirs
            assert w == round(exact), name
            continue
        assert w % MLP_WIDTH_ALIGN == 0 and abs(w / exact - 1) < 0.006, name
    assert mlp_width(3 * 4096 * 12288, 4096) == 12288  # qwen3.5-9b: as it was
    assert ReplayShape.from_spec(get_model("qwen3-next-80b-a3b"), 4).mlp_inter == 5824  # not 5,803
    assert mlp_width(3 * 64 * 42, 64) == 42 and mlp_width(3 * 8 * 5, 8) == 5  # toy widths kept


def test_marconi_run_says_when_the_model_is_outside_the_committed_fit():
    """The committed H200 file covers hidden sizes 2048-4096: a qwen3.5-27b run (5120) says so in its
    header; a qwen3.5-9b run (4096) says nothing."""
    from click.testing import CliRunner

    from sim.cli import main

    args = ["run", "--sessions", "2", "--no-progress", "--policy", "marconi", "--alpha", "0"]
    out = CliRunner().invoke(main, [*args, "--model", "qwen3.5-27b"])
    assert out.exit_code == 0, out.output
    head = out.output.splitlines()[0]
    assert "qwen3.5-27b lies outside the shapes the timing file was fitted on" in head
    assert "d_model 5120 (fitted 2048-4096)" in head
    inside = CliRunner().invoke(main, [*args, "--model", "qwen3.5-9b"])
    assert inside.exit_code == 0 and "outside the shapes" not in inside.output


def test_request_errors_score_every_timed_request_and_the_time_saved():
    """``request_errors`` (benchmarks/timing_fit.py's table): one row per request with a measured
    time, error 0 against the timing that made the table; a validated hit's saved time is its
    from-scratch reference less its suffix, modelled the same way; unvalidated ones have none."""
    from sim.replay.calibration import request_errors

    spec = get_model("qwen3.5-9b")
    table = _table(spec, TRUE, CALLS)
    full = _table(spec, TRUE, [(0, L) for _, L in CALLS])["suffix_ms"].to_numpy()
    table["validated"] = table["hit_tokens"] > 0
    table["full_ms"] = np.where(table["validated"], full, np.nan)
    table.loc[0, "suffix_ms"] = float("nan")  # an untimed request is left out
    e = request_errors(Run(spec, COUNTS, table, "r"), TRUE)
    assert len(e) == len(CALLS) - 1 and (e["tokens"] == [L for _, L in CALLS[1:]]).all()
    assert np.abs(e["error"]).max() < 1e-9
    val = e["hit"] > 0
    assert val.any() and (~val).any()
    assert np.allclose(e.loc[val, "saved_ms"], e.loc[val, "modelled_saved_ms"], rtol=1e-9)
    assert (e.loc[val, "saved_ms"] > 0).all() and e.loc[~val, "saved_ms"].isna().all()


def test_a_timing_file_without_the_optional_terms_reads_them_as_zero(tmp_path):
    """A marconi-timing/2 file written before floors, step terms and shape terms existed: each of
    them 0 (an old file prices as it did), not some other default (mutation survivor)."""
    d = timing_to_dict(TRUE)
    for key in ("layer_floor_ms", "seq_ms", "ms_per_weight_gb", "ms_per_act_gb", "ms_per_kv_gb", "dtype", "covers"):
        d.pop(key, None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    t = read_timing_file(path)
    for group in ("layer_floor_ms", "seq_ms", "ms_per_weight_gb", "ms_per_act_gb"):
        assert getattr(t, group) == dict.fromkeys(LAYER_KINDS, 0.0), group
    assert (t.ms_per_kv_gb, t.dtype, t.covers) == (0.0, "", {})


def test_fit_across_takes_the_call_time_from_the_runs_not_from_the_base():
    """The call's own time (``call_ms``) is the median of the timed calls' "other" time per
    segment: a base timing with another call time does not leak into the fit (mutation -m
    host_term --seed 1 survivor calibration.py L197)."""

    t, _ = fit_across(_runs(), replace(TRUE, call_ms=0.5), peak_tflops=989.0)
    assert t.call_ms == pytest.approx(0.02)


def test_the_kv_read_feature_is_zero_for_a_one_token_call_and_the_whole_context_above():
    """``features``' last attention column: the context's keys and values read, L tokens of KV a
    layer for a call of two tokens or more, none for a one-token call (mutation -m host_term
    --seed 1 survivor calibration.py L86)."""
    spec = get_model("qwen3.5-9b")
    per = kv_gb_per_layer_token(spec)
    assert per > 0
    assert features(spec, "attention", 4096, 4097)[-1] == 0.0
    assert features(spec, "attention", 4096, 4098)[-1] == pytest.approx(per * 4098)
    assert features(spec, "attention", 0, 2)[-1] == pytest.approx(per * 2)


def test_request_errors_take_a_table_without_host_times_as_device_bound():
    """A request table kept before replay recorded host times (no ``suffix_host_bound`` column)
    is scored as device-bound: each request's priced time is its device time."""
    spec = get_model("qwen3.5-9b")
    table = _table(spec, TRUE, CALLS[:4]).drop(columns=["suffix_host_bound"])
    e = calibration.request_errors(Run(spec, COUNTS, table, "old"), TRUE)
    assert len(e) == 4 and not e["host_bound"].any()
    assert (e["modelled_call_ms"] == e["modelled_ms"]).all()
