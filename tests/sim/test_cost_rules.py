"""Hardware timing and calibration rules (sim/cost.py, sim/replay/measure.py) at their edges
(issue 44): chunk counts on and off the 64-token grid, split pricing under a timing whose launch
floors are non-zero (some above a layer's call time, some below), the per-sequence step term,
the one-rate model's decode read and overhead, timing-file validation field by field, and the
committed H200 timing refitted from the committed raw runs it came from.

Expected values are computed by hand in the test from the documented formulas, never by calling
the method under test on other arguments."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cost import (
    GDN_CHUNK,
    LAYER_KINDS,
    HardwareTiming,
    TimingModel,
    default_timing,
    gdn_chunks,
    get_model,
    read_timing_file,
    timing_to_dict,
)
from sim.errors import UsageError
from sim.replay import measure

ROOT = Path(__file__).resolve().parents[2]
SPEC = get_model("qwen3.5-9b")  # 8 attention, 24 gated-delta, 32 MLP layers
N = {"attention": 8, "gated_delta": 24, "mlp": 32}
# floors above the call time for attention and MLP, below it for gated delta
FLOORED = HardwareTiming(
    ms_per_tflop={"attn_linear": 2.0, "attn_quadratic": 4.0, "gdn_linear": 2.5, "gdn_chunk": 9.0, "mlp_linear": 1.6},
    layer_call_ms={"attention": 0.05, "gated_delta": 0.09, "mlp": 0.03},
    call_ms=0.4,
    decode_ms_per_token=5.0,
    peak_tflops=989.0,
    layer_floor_ms={"attention": 0.3, "gated_delta": 0.02, "mlp": 0.2},
    seq_ms={"attention": 0.011, "gated_delta": 0.007, "mlp": 0.003},
)


# ------------------------------------------------------------------------------ chunks


@pytest.mark.parametrize(
    "start,end,chunks",
    [
        (0, 0, 0),
        (10, 3, 0),
        (0, 1, 1),
        (0, 63, 1),
        (0, 64, 1),
        (0, 65, 2),
        (63, 64, 1),
        (63, 65, 2),
        (64, 128, 1),
        (64, 129, 2),
        (100, 300, 4),  # chunks 1, 2, 3, 4 (64-127 ... 256-319)
        (127, 129, 2),
        (5, 5, 0),
    ],
)
def test_gdn_chunks_counts_ragged_chunks_on_the_absolute_grid(start, end, chunks):
    assert gdn_chunks(start, end) == chunks
    # by brute force: the distinct 64-token chunks the positions fall in
    assert chunks == len({i // GDN_CHUNK for i in range(start, end)})


# ------------------------------------------------------------------------------ hand prices


def per_layer_work(timing, p, L, chunks):
    """Per-layer FLOP-term time (ms) of tokens [p, L) by kind, from the spec's coefficients."""
    c, n = timing.ms_per_tflop, L - p
    attn = c["attn_linear"] * SPEC.attn_layer_a * n + c["attn_quadratic"] * SPEC.attn_layer_b * (L * L - p * p)
    gdn = c["gdn_linear"] * SPEC.gdn_layer_a * n + c["gdn_chunk"] * SPEC.gdn_chunk_flops * chunks
    mlp = c["mlp_linear"] * SPEC.mlp_layer_a * n
    return {"attention": attn * 1e-12, "gated_delta": gdn * 1e-12, "mlp": mlp * 1e-12}


def call_by_hand(timing, work, seqs=1):
    return timing.call_ms + sum(
        N[k] * max(timing.layer_floor_ms[k], timing.layer_call_ms[k] + (seqs - 1) * timing.seq_ms[k] + work[k])
        for k in LAYER_KINDS
    )


def fixed_by_hand(timing):
    return timing.call_ms + sum(N[k] * max(timing.layer_floor_ms[k], timing.layer_call_ms[k]) for k in LAYER_KINDS)


@pytest.mark.parametrize("p,L", [(0, 7), (0, 64), (13, 77), (100, 3001), (4096, 9000)])
@pytest.mark.parametrize("splits", [0, 1, 3])
def test_split_pricing_under_non_zero_floors(p, L, splits):
    """A prefill in 1 + splits calls: the main call with one more ragged chunk per split, every
    layer at ``max(floor, call + work)``, plus each split-off call at the model's fixed time (every
    layer at the larger of its floor and its call time)."""
    chunks = gdn_chunks(p, L) + splits
    want = call_by_hand(FLOORED, per_layer_work(FLOORED, p, L, chunks)) + splits * fixed_by_hand(FLOORED)
    assert FLOORED.prefill_time_s(SPEC, p, L, splits) * 1e3 == pytest.approx(want, rel=1e-12)
    assert FLOORED.fixed_ms(SPEC) == pytest.approx(fixed_by_hand(FLOORED), rel=1e-12)


def test_a_short_prefill_is_launch_bound_and_a_long_one_compute_bound():
    short = FLOORED.work_tflop(SPEC, 0, 8, 1)
    long = FLOORED.work_tflop(SPEC, 0, 8000, gdn_chunks(0, 8000))
    # attention and MLP sit at their floors for 8 tokens, above them for 8,000
    for k in ("attention", "mlp"):
        assert FLOORED.layer_call_ms[k] + short[k] < FLOORED.layer_floor_ms[k]
        assert FLOORED.layer_call_ms[k] + long[k] > FLOORED.layer_floor_ms[k]
    t_short = FLOORED.prefill_time_s(SPEC, 0, 8) * 1e3
    assert t_short == pytest.approx(
        FLOORED.call_ms + 8 * 0.3 + 32 * 0.2 + 24 * (0.09 + short["gated_delta"]),
        rel=1e-12,
    )


def test_a_split_costs_more_than_the_same_tokens_in_one_call_by_at_least_the_fixed_time():
    one = FLOORED.prefill_time_s(SPEC, 100, 2000, 0)
    two = FLOORED.prefill_time_s(SPEC, 100, 2000, 1)
    assert two - one >= FLOORED.fixed_ms(SPEC) * 1e-3 - 1e-15
    # a FLOPs-only model ignores splits
    flat = TimingModel(300.0, 7.0, 4.0)
    assert flat.prefill_time_s(SPEC, 100, 2000, 5) == flat.prefill_time_s(SPEC, 100, 2000)


@pytest.mark.parametrize(
    "prefills,contexts",
    [
        ([(0, 37)], []),
        ([], [511]),
        ([(64, 129)], [100, 7000]),
        ([(0, 300), (5, 6)], [1, 2, 3]),
        ([], [0, 1]),
    ],
)
def test_a_step_is_one_call_with_each_further_sequence_charged_per_layer(prefills, contexts):
    work = dict.fromkeys(LAYER_KINDS, 0.0)
    for p, L in prefills:
        for k, v in per_layer_work(FLOORED, p, L, gdn_chunks(p, L)).items():
            work[k] += v
    for c in contexts:
        for k, v in per_layer_work(FLOORED, c, c + 1, 1).items():
            work[k] += v
    want = call_by_hand(FLOORED, work, len(prefills) + len(contexts))
    assert FLOORED.step_time_s(SPEC, prefills, contexts) * 1e3 == pytest.approx(want, rel=1e-12)


def test_an_empty_step_costs_nothing_and_a_lone_prefill_step_is_its_prefill():
    assert FLOORED.step_time_s(SPEC, [], []) == 0.0
    for p, L in ((0, 1), (63, 200), (1000, 1065)):
        assert FLOORED.step_time_s(SPEC, [(p, L)], []) == pytest.approx(FLOORED.prefill_time_s(SPEC, p, L), rel=1e-12)


def test_tensor_parallel_divides_the_flop_terms_only():
    two = FLOORED.with_gpus(2)
    assert two.gpus == 2 and two.source == FLOORED.source
    w1, w2 = FLOORED.work_tflop(SPEC, 0, 5000, 79), two.work_tflop(SPEC, 0, 5000, 79)
    for k in LAYER_KINDS:
        assert w2[k] == pytest.approx(w1[k] / 2, rel=1e-12)
    assert two.fixed_ms(SPEC) == FLOORED.fixed_ms(SPEC)
    assert two.effective_tflops == pytest.approx(2 * FLOORED.effective_tflops)
    assert FLOORED.with_gpus(3, "x").source == "x"


def test_a_hardware_timing_prices_fcfs_decode_tokens_with_the_all_reduces():
    """``decode_time_s(n)`` (the fcfs scheduler's decode) is n tokens at ``decode_ms_per_token``
    plus, under tensor parallel, one call's and one token's all-reduce each: by hand, 5 ms a token,
    0.25 ms a call and 0.125 ms a token of all-reduce (mutation survivor: n / (...) for n x (...))."""
    assert FLOORED.decode_time_s(0) == 0.0
    assert FLOORED.decode_time_s(1) == pytest.approx(5.0e-3, rel=1e-12)
    assert FLOORED.decode_time_s(7) == pytest.approx(35.0e-3, rel=1e-12)
    tp = replace(FLOORED, comm_ms_per_call=0.25, comm_ms_per_token=0.125)
    assert tp.decode_time_s(3) == pytest.approx(3 * 5.375e-3, rel=1e-12)


def test_the_one_rate_model_step():
    """Overhead once per step with prefill work, never for decode-only steps; decode-only steps
    take the weights' read, a step with both the larger of compute and that read."""
    t = TimingModel(200.0, 6.0, 9.0)
    inv = 1 / 200e12
    assert t.step_time_s(SPEC, [], []) == 0.0
    assert t.step_time_s(SPEC, [], [10]) == pytest.approx(9e-3)
    assert t.step_time_s(SPEC, [], [10, 20, 30]) == pytest.approx(9e-3)  # memory-bound: read once
    small = t.step_time_s(SPEC, [(0, 5)], [40])
    assert small == pytest.approx(max(6e-3 + (SPEC.prefill_flops(0, 5) + SPEC.decode_flops(1, 40)) * inv, 9e-3))
    assert small == pytest.approx(9e-3)
    big = t.step_time_s(SPEC, [(0, 20000), (7, 900)], [40, 41])
    want = 6e-3 + (SPEC.prefill_flops(0, 20000) + SPEC.prefill_flops(7, 900) + SPEC.decode_flops(2, 81)) * inv
    assert big == pytest.approx(want, rel=1e-12) and big > 9e-3
    assert t.decode_time_s(3) == pytest.approx(27e-3)


def test_decode_flops_are_the_sum_of_one_token_prefills():
    for ctxs in ([0], [1, 2], [700, 5, 4096]):
        by_hand = sum(SPEC.prefill_flops(c, c + 1) for c in ctxs)
        assert SPEC.decode_flops(len(ctxs), sum(ctxs)) == pytest.approx(by_hand, rel=1e-12)
    assert SPEC.prefill_flops(10, 10) == 0.0 and SPEC.prefill_flops(11, 10) == 0.0
    assert SPEC.prefill_flops(3, 4) > 0
    assert SPEC.node_flops(100, 300) == pytest.approx(SPEC.flops(300) - SPEC.flops(100), rel=1e-12)


# ------------------------------------------------------------------------------ validation


def test_hardware_timing_refuses_unphysical_and_negative_terms():
    ok = dict(ms_per_tflop=dict(FLOORED.ms_per_tflop), layer_call_ms=dict(FLOORED.layer_call_ms), call_ms=0.4)
    # exactly the peak is allowed; a hair above it is not
    at_peak = dict(ok["ms_per_tflop"], mlp_linear=1e3 / 989.0)
    HardwareTiming(at_peak, ok["layer_call_ms"], 0.4, 5.0, 989.0)
    with pytest.raises(UsageError, match="mlp_linear .* peak"):
        HardwareTiming(dict(at_peak, mlp_linear=1e3 / 989.0 * 0.999), ok["layer_call_ms"], 0.4, 5.0, 989.0)
    # an unknown peak bounds nothing; a zero term is not "above the peak"
    HardwareTiming(dict(at_peak, mlp_linear=0.001), ok["layer_call_ms"], 0.4, 5.0, 0.0)
    HardwareTiming(dict(at_peak, gdn_chunk=0.0), ok["layer_call_ms"], 0.4, 5.0, 989.0)
    for bad in (
        dict(call_ms=-1e-9),
        dict(decode_ms_per_token=-1.0),
        dict(gpus=0),
        dict(layer_floor_ms=dict(FLOORED.layer_floor_ms, mlp=-0.1)),
        dict(seq_ms=dict(FLOORED.seq_ms, attention=-0.1)),
        dict(layer_call_ms=dict(FLOORED.layer_call_ms, gated_delta=-0.1)),
        dict(ms_per_tflop=dict(FLOORED.ms_per_tflop, attn_quadratic=-4.0)),
        dict(seq_ms={"attention": 0.0, "mlp": 0.0}),
        dict(ms_per_tflop={k: v for k, v in FLOORED.ms_per_tflop.items() if k != "gdn_chunk"}),
    ):
        with pytest.raises(UsageError):
            replace(FLOORED, **bad)
    with pytest.raises(UsageError):
        TimingModel(0.0, 1.0, 1.0)
    with pytest.raises(UsageError):
        TimingModel(1.0, -1.0, 1.0)
    with pytest.raises(UsageError):
        TimingModel(1.0, 1.0, -1.0)
    TimingModel(1.0, 0.0, 0.0)  # zero times are allowed


def test_fraction_of_peak_and_effective_rate():
    f = FLOORED.fraction_of_peak()
    assert f["mlp_linear"] == pytest.approx(1e3 / (1.6 * 989.0))
    assert replace(FLOORED, peak_tflops=0.0).fraction_of_peak()["mlp_linear"] is None
    zero = replace(FLOORED, ms_per_tflop=dict(FLOORED.ms_per_tflop, gdn_chunk=0.0), peak_tflops=989.0)
    assert zero.fraction_of_peak()["gdn_chunk"] is None
    assert FLOORED.effective_tflops == pytest.approx(1e3 / 1.6)
    no_mlp = replace(FLOORED, ms_per_tflop=dict(FLOORED.ms_per_tflop, mlp_linear=0.0))
    assert no_mlp.effective_tflops == pytest.approx(1e3 / 2.5)  # falls back to the GDN rate
    none = replace(no_mlp, ms_per_tflop=dict(no_mlp.ms_per_tflop, gdn_linear=0.0))
    assert none.effective_tflops == math.inf
    assert FLOORED.overhead_ms == FLOORED.call_ms


def write(tmp_path, d, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("field", ["call_ms", "decode_ms_per_token"])
@pytest.mark.parametrize("value", [-0.001, "nan", float("inf"), True, None, "x"])
def test_a_bad_time_in_a_hardware_file_is_one_line_naming_the_field(tmp_path, field, value):
    d = dict(timing_to_dict(FLOORED), **{field: value})
    path = write(tmp_path, d)
    text = path.read_text().replace("Infinity", "1e999")  # json writes inf as Infinity; also refused
    path.write_text(text)
    with pytest.raises(UsageError, match=field):
        read_timing_file(path)


@pytest.mark.parametrize("group", ["ms_per_tflop", "layer_call_ms", "layer_floor_ms", "seq_ms"])
@pytest.mark.parametrize("value", [-1.0, "nan", False, None])
def test_a_bad_term_in_a_hardware_file_names_its_group_and_key(tmp_path, group, value):
    d = timing_to_dict(FLOORED)
    key = next(iter(d[group]))
    d[group][key] = value
    with pytest.raises(UsageError, match=f"{group}.{key}"):
        read_timing_file(write(tmp_path, d))


@pytest.mark.parametrize(
    "field,value,ok",
    [
        ("effective_tflops", 0.0, False),
        ("effective_tflops", 1e-9, True),
        ("overhead_ms", 0.0, True),
        ("overhead_ms", -1e-9, False),
        ("decode_ms_per_token", 0.0, True),
        ("decode_ms_per_token", "inf", False),
    ],
)
def test_one_rate_file_bounds(tmp_path, field, value, ok):
    d = dict(timing_to_dict(TimingModel(100.0, 5.0, 3.0, source="s")), **{field: value})
    path = write(tmp_path, d)
    if ok:
        t = read_timing_file(path)
        assert getattr(t, field) == float(value)
    else:
        with pytest.raises(UsageError, match=field):
            read_timing_file(path)


def test_timing_files_round_trip_and_are_held_to_their_model(tmp_path):
    for t in (FLOORED, TimingModel(123.0, 4.5, 6.7, source="hand")):
        d = dict(timing_to_dict(t), model="qwen3.5-9b")
        back = read_timing_file(write(tmp_path, d), model="qwen3.5-9b")
        assert back == t and back.source == t.source
        with pytest.raises(UsageError, match="calibrated for qwen3.5-9b, not llama-7b"):
            read_timing_file(write(tmp_path, d), model="llama-7b")
        read_timing_file(write(tmp_path, timing_to_dict(t)), model="llama-7b")  # no model named: any
    # a hardware file from before floors and per-sequence times: both default to zero
    d = timing_to_dict(FLOORED)
    del d["layer_floor_ms"], d["seq_ms"]
    old = read_timing_file(write(tmp_path, d))
    assert old.layer_floor_ms == dict.fromkeys(LAYER_KINDS, 0.0) and old.seq_ms == dict.fromkeys(LAYER_KINDS, 0.0)
    # a file without a GPU count prices one GPU (mutation survivor: a default of 0 refused it)
    d = timing_to_dict(FLOORED.with_gpus(2))
    assert d["gpus"] == 2 and read_timing_file(write(tmp_path, d)).gpus == 2
    del d["gpus"]
    assert read_timing_file(write(tmp_path, d)).gpus == 1
    for bad in ({"format": "marconi-timing/3"}, [1, 2], {"format": "marconi-timing/2"}):
        with pytest.raises(UsageError):
            read_timing_file(write(tmp_path, bad))
    with pytest.raises(UsageError, match="cannot read"):
        read_timing_file(tmp_path / "absent.json")
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(UsageError, match="not JSON"):
        read_timing_file(tmp_path / "x.json")


def test_write_timing_replaces_atomically_and_keeps_the_model(tmp_path):
    path = tmp_path / "sub" / "t.json"
    measure.write_timing(path, FLOORED, SPEC, {"median_error": 0.01})
    d = json.loads(path.read_text())
    assert d["model"] == "qwen3.5-9b" and d["fit"] == {"median_error": 0.01}
    assert measure.read_timing(path, model="qwen3.5-9b") == FLOORED
    assert not list(path.parent.glob(".tmp-*"))


# ------------------------------------------------------------------------------ measure


def test_modelled_ms_of_the_one_rate_model_shares_its_overhead_by_mixer_layer():
    t = TimingModel(250.0, 8.0, 4.0)
    counts = {"attention": 2, "gated_delta": 6, "mlp": 8}
    r = measure.replayed_spec(SPEC, counts)
    share = (2 + 6) / (8 + 24)
    want = 8.0 * share + r.prefill_flops(100, 900) * 1e3 / 250e12
    assert measure.modelled_ms(SPEC, t, counts, 100, 900) == pytest.approx(want, rel=1e-12)
    # an int: that many gated-delta layers alone
    r6 = measure.replayed_spec(SPEC, 6)
    assert (r6.n_attn, r6.n_gdn, r6.n_mlp, r6.n_mamba) == (0, 6, 0, 0)
    # a hardware model prices the replayed layers with its splits
    want = FLOORED.prefill_time_s(r, 100, 900, 2) * 1e3
    assert measure.modelled_ms(SPEC, FLOORED, counts, 100, 900, 2) == pytest.approx(want, rel=1e-12)


def test_fit_linear_edges():
    flops = np.array([1e12, 2e12, 4e12])
    ms = 3.0 + flops / 500e12 * 1e3
    over, tflops = measure.fit_linear(flops, ms)
    assert over == pytest.approx(3.0) and tflops == pytest.approx(500.0)
    # non-finite and non-positive times are dropped; what is left must still have two sizes
    with pytest.raises(UsageError, match="two timed requests"):
        measure.fit_linear(np.array([1e12, 2e12, 3e12]), np.array([4.0, float("nan"), -1.0]))
    with pytest.raises(UsageError, match="two timed requests"):
        measure.fit_linear(np.array([1e12, 1e12]), np.array([4.0, 5.0]))
    with pytest.raises(UsageError, match="does not grow"):
        measure.fit_linear(np.array([1e12, 2e12, 3e12]), np.array([5.0, 4.0, 3.0]))


def test_device_peak_matches_by_name_fragment_and_dtype():
    assert measure.device_peak("NVIDIA H200", "bf16") == 989.0
    assert measure.device_peak("NVIDIA H200", "fp32") == 67.0
    assert measure.device_peak("NVIDIA A100-SXM4-40GB", "fp16") == 312.0
    assert measure.device_peak("NVIDIA H200", "fp8") == 0.0
    assert measure.device_peak("", "bf16") == 0.0 and measure.device_peak(None, "bf16") == 0.0


def test_timed_calls_keep_device_bound_suffixes_and_validated_references_only():
    nan = float("nan")
    row = dict(
        segments=[[0, 100]],
        hit_tokens=0,
        validated=False,
        input_tokens=100,
        suffix_host_bound=False,
        full_host_bound=False,
        **{f"suffix_ms_{k}": 1.0 for k in LAYER_KINDS + ("other",)},
        **{f"full_ms_{k}": nan for k in LAYER_KINDS + ("other",)},
    )
    hit = dict(row, segments=[[64, 300]], hit_tokens=64, validated=True, input_tokens=300)
    hit.update({f"full_ms_{k}": 2.0 for k in LAYER_KINDS + ("other",)})
    held = dict(hit, suffix_host_bound=True, full_host_bound=True)
    unvalidated = dict(hit, validated=False)
    untimed = dict(row, **{f"suffix_ms_{k}": nan for k in LAYER_KINDS})
    got = measure.timed_calls(pd.DataFrame([row, hit, held, unvalidated, untimed]))
    assert [segs for segs, _ in got] == [[(0, 100)], [(64, 300)], [(0, 300)], [(64, 300)]]
    assert got[2][1]["mlp"] == 2.0


# ------------------------------------------------------------------------------ the committed fit


CAMPAIGN = ROOT / "benchmarks" / "results" / "2026-12-04-timing-campaign-h200" / "after-moe-fix"
FULL_DEPTH = (
    ROOT / "benchmarks" / "results" / "2026-12-02-replay-calibration-h200" / "session3" / "fit-and-sequential-400"
)


@pytest.mark.skipif(
    not (CAMPAIGN.is_dir() and FULL_DEPTH.is_dir()), reason="the committed H200 campaign runs are absent"
)
def test_the_committed_h200_timing_is_refitted_exactly_from_its_raw_runs():
    """``sim/data/h200-timing.json`` is ``benchmarks/timing_fit.py`` over the committed raw runs it
    names (the 2026-12-04 campaign's fit runs on four presets and the 2026-12-02 qwen3.5-9b
    full-depth fit runs): refitted here, every term, the source and the coverage come back."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import timing_fit
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    committed = read_timing_file(ROOT / "sim" / "data" / "h200-timing.json")
    raw = json.loads((ROOT / "sim" / "data" / "h200-timing.json").read_text())
    _, _, t, info = timing_fit.fit(
        [CAMPAIGN, FULL_DEPTH], versions=raw["versions"], resume=True, drop_resume=True, form="additive"
    )
    assert t.layer_form == committed.layer_form == "additive" and not committed.kv_query_heads
    for group in ("ms_per_tflop", "layer_call_ms", "ms_per_weight_gb", "ms_per_act_gb", "seq_ms"):
        assert getattr(t, group) == pytest.approx(getattr(committed, group), rel=1e-9, abs=1e-12), group
    assert t.ms_per_kv_gb == pytest.approx(committed.ms_per_kv_gb, rel=1e-9)
    assert t.call_ms == pytest.approx(committed.call_ms, rel=1e-9)
    # the resumed-call term: fitted from 51 resumed / from-scratch pairs (``timing_fit.py --resume``), 4.8 us
    # a chunk and layer, taken out of those calls and not priced (``--drop-resume``: the runs' resumed
    # calls carried the conv's state read, fixed in e855240; on the H200 after the fix a resumed layer
    # runs 0.94-0.96x its reference per token, session 25)
    assert t.gdn_resume_ms_per_chunk == committed.gdn_resume_ms_per_chunk == 0.0
    assert raw["fit"]["resume"]["pairs"] == 51 and raw["fit"]["resume"]["dropped"] is True
    assert raw["fit"]["resume"]["median"] == pytest.approx(0.00479, rel=1e-3)
    assert "--drop-resume" in committed.source
    # the host term: the host issue times' medians at 8 and 64 layer calls (issue 41 item 3)
    assert (t.host_ms_per_call, t.host_ms_per_layer) == pytest.approx(
        (committed.host_ms_per_call, committed.host_ms_per_layer), rel=1e-9
    )
    assert committed.has_host_term and json.loads(json.dumps(info["host"])) == raw["fit"]["host"]
    assert (t.source, t.dtype, t.device, t.covers) == (
        committed.source,
        committed.dtype,
        committed.device,
        committed.covers,
    )
    assert info["runs"] == raw["fit"]["runs"] and len(info["runs"]) == 14
    for k in LAYER_KINDS:
        assert info["terms"][k]["calls"] == raw["fit"]["terms"][k]["calls"] > 100
    # every FLOP term at a share of the peak, but the gated-delta chunk term: with the resumed-call
    # term beside it the fit gives it none (0 ms a TFLOP: "not known")
    frac = t.fraction_of_peak()
    assert frac["gdn_chunk"] is None and t.ms_per_tflop["gdn_chunk"] == 0.0
    assert all(0 < f <= 1.0 for k, f in frac.items() if k != "gdn_chunk")
    # every layer reads its weights no faster than the H200's 4.8 TB/s (the MLP's free fit read
    # them at 5.6 TB/s; the weights-read column is held at the bandwidth, session 25)
    assert min(t.ms_per_weight_gb.values()) >= 1 / 4.8 * (1 - 1e-12)
    assert t.ms_per_weight_gb["mlp"] == pytest.approx(1 / 4.8, rel=1e-12)


H100_RUNS = ROOT / "benchmarks" / "results" / "2026-12-07-gpu-s27"
H100_FOLDERS = [H100_RUNS / "callA" / "campaign", H100_RUNS / "callD" / "fulldepth"]


def _timing_fit():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import timing_fit
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return timing_fit


@pytest.mark.skipif(not all(d.is_dir() for d in H100_FOLDERS), reason="the committed H100 campaign runs are absent")
def test_the_committed_h100_timing_is_refitted_exactly_from_its_raw_runs():
    """``sim/data/h100-timing.json`` is ``benchmarks/timing_fit.py --resume`` (the overlap form, its
    default) over the H100 campaign of session 27 (the four fit presets at 4 layers with prompts to
    86K tokens, qwen3.5-9b at full depth; measured after both fixes of the from-scratch times): it
    names the H100 as its device, and what the runs cannot show (per-sequence step times, decode)
    is the H200 file's carried to the H100 by the datasheets (decode at the bandwidth ratio 4.8 /
    3.35), said in its source."""
    path = ROOT / "sim" / "data" / "h100-timing.json"
    committed, raw = read_timing_file(path), json.loads(path.read_text())
    _, base, t, info = _timing_fit().fit(H100_FOLDERS, versions=raw["versions"], resume=True)
    assert t.layer_form == committed.layer_form == "overlap" and t.kv_query_heads and committed.kv_query_heads
    assert "layer form 'overlap'" in t.source and raw["fit"]["form"] == "overlap"
    # resumed calls ran no dearer a chunk than their references once the conv was fixed (e855240):
    # the pairs' median is below 0, so no term is priced
    assert t.gdn_resume_ms_per_chunk == 0.0 and raw["fit"]["resume"]["pairs"] == 56
    assert raw["fit"]["resume"]["q75"] < 0
    for group in ("ms_per_tflop", "layer_call_ms", "ms_per_weight_gb", "ms_per_act_gb", "seq_ms"):
        assert getattr(t, group) == pytest.approx(getattr(committed, group), rel=1e-9, abs=1e-12), group
    assert (t.ms_per_kv_gb, t.call_ms, t.gdn_resume_ms_per_chunk) == pytest.approx(
        (committed.ms_per_kv_gb, committed.call_ms, committed.gdn_resume_ms_per_chunk), rel=1e-9
    )
    assert (t.host_ms_per_call, t.host_ms_per_layer) == pytest.approx(
        (committed.host_ms_per_call, committed.host_ms_per_layer), rel=1e-9
    )
    assert (t.source, t.dtype, t.device, t.covers) == (committed.source, "bf16", "h100", committed.covers)
    assert info["runs"] == raw["fit"]["runs"]
    # the weights read no faster than the H100's 3.35 TB/s (the MLP's free fit: 4.05 TB/s)
    assert min(t.ms_per_weight_gb.values()) >= 1 / 3.35 * (1 - 1e-12)
    h200 = read_timing_file(ROOT / "sim" / "data" / "h200-timing.json")
    assert t.decode_ms_per_token == pytest.approx(h200.decode_ms_per_token * 4.8 / 3.35, rel=1e-12)
    assert base.decode_ms_per_token == t.decode_ms_per_token and t.seq_ms == h200.seq_ms
    assert "NVIDIA H100 80GB HBM3" in t.source and "carried to h100 by the datasheets" in t.source
    # the full-depth runs give the host term its second depth (64 layer calls beside the campaign's 8)
    assert "qwen3.5-9b full-depth fit runs" in t.source and t.covers["host_layer_calls"] == [8, 64]
    assert t.host_ms_per_call > 0 and t.host_ms_per_layer > 0


@pytest.mark.skipif(not H100_FOLDERS[0].is_dir(), reason="the committed H100 campaign runs are absent")
def test_a_campaign_without_full_depth_runs_says_so():
    """The campaign's 4-layer runs alone (8 layer calls a call, the replayed depth's threshold):
    the source does not claim full-depth runs, and the host term covers 8 layer calls only."""
    _, _, t, _ = _timing_fit().fit([H100_FOLDERS[0]])
    assert "full-depth" not in t.source and t.device == "h100"
    assert "carried to h100 by the datasheets (decode at the memory-bandwidth ratio)" in t.source
    assert t.covers["host_layer_calls"] == [8, 8]


@pytest.mark.skipif(not H100_FOLDERS[0].is_dir(), reason="the committed H100 campaign runs are absent")
def test_a_campaign_on_a_gpu_the_catalogue_lacks_is_refused(tmp_path):
    import shutil

    run = tmp_path / "fit1-qwen3.5-9b"
    shutil.copytree(H100_FOLDERS[0] / run.name, run)
    s = json.loads((run / "summary.json").read_text())
    s["settings"]["device_name"] = "Some Future GPU"
    (run / "summary.json").write_text(json.dumps(s))
    with pytest.raises(UsageError, match="'Some Future GPU' is not in the GPU catalogue"):
        _timing_fit().fit([tmp_path], resume=True)


def test_without_a_committed_file_the_default_timing_is_the_documented_estimate(monkeypatch):
    """40 % of 989 TFLOP/s per GPU, a 10 ms overhead, decode = the active bf16 weights read at 60 %
    of 4.8 TB/s per GPU."""
    import sim.cost as cost

    monkeypatch.setattr(cost, "H200_TIMING_FILE", ROOT / "absent-timing.json")
    for name, g in (("qwen3.5-9b", 1), ("qwen3-next-80b-a3b", 2), ("qwen3.5-122b-a10b", 4)):
        t = cost.default_timing(name)
        spec = get_model(name)
        assert isinstance(t, TimingModel) and t.overhead_ms == 10.0
        assert t.effective_tflops == pytest.approx(round(g * 989.0 * 0.4, 1))
        assert t.decode_ms_per_token == pytest.approx(round(spec.active_params() * 2 / (g * 4.8e12 * 0.6) * 1e3, 2))
    m7 = cost.default_timing("marconi-7b")
    assert cost.default_timing("llama-7b") == m7 and m7.overhead_ms == 17.8 and m7.decode_ms_per_token == 12.0


def test_replay_tiny_is_the_toy_qwen_layout():
    t = get_model("replay-tiny")
    assert (t.n_attn, t.n_gdn, t.n_mlp, t.d_model) == (1, 3, 4, 32)
    # 2 query heads over 1 KV head of 16: 64 bytes of fp32 K and V a token (mutation survivor)
    assert (t.attn_heads, t.attn_kv_heads, t.attn_head_dim) == (2, 1, 16) and t.kv_bytes_per_token() == 64
    assert t.mlp_active_params == 3 * 32 * 64 and t.mlp_layer_a == 2 * 3 * 32 * 64
    assert t.nominal_active_params == float(t.active_params())


def test_default_timing_is_the_committed_file_scaled_to_the_presets_gpus():
    committed = read_timing_file(ROOT / "sim" / "data" / "h200-timing.json")
    assert default_timing("qwen3.5-9b") == committed
    big = default_timing("qwen3.5-397b-a17b")
    assert big.gpus == 8 and "8x H200" in big.source
    assert big == replace(committed, gpus=8)
    assert default_timing("qwen3-next-80b-a3b").gpus == 2


# ------------------------------------------------------------------------------ the replay summary


def _records():
    """Three requests on 2 attention, 6 gated-delta and 8 MLP replayed layers: a miss, a validated
    hit with its from-scratch reference timed, and a hit whose prefill the host held up."""
    from sim.replay.records import RequestRecord

    by = {"attention": 2.0, "gated_delta": 3.0, "mlp": 4.0, "other": 0.5}
    miss = RequestRecord(0, 300, 10, suffix_segments=[(0, 300)], suffix_ms=9.5, suffix_ms_by_type=dict(by))
    miss.suffix_slack_ms = 2.0
    hit = RequestRecord(1, 500, 10, hit_tokens=200, restored=True, validated=True, integrity_checked=True)
    hit.suffix_segments, hit.suffix_ms, hit.full_ms = [(200, 500)], 6.0, 15.0
    hit.suffix_ms_by_type = {k: v / 2 for k, v in by.items()}
    hit.full_ms_by_type = {k: 2 * v for k, v in by.items()}
    hit.max_rec_error, hit.max_kv_error = 0.01, 0.03
    hit.suffix_slack_ms = hit.full_slack_ms = 3.0
    held = RequestRecord(2, 400, 10, hit_tokens=100, restored=True, suffix_segments=[(100, 250), (250, 400)])
    held.suffix_ms, held.suffix_slack_ms = 30.0, 0.1  # host-bound: under HOST_BOUND_MARGIN_MS
    held.suffix_ms_by_type = dict(by)
    return [miss, hit, held]


COUNTS_R = {"attention": 2, "gated_delta": 6, "mlp": 8}


def test_request_table_and_summary_by_hand():
    from sim.replay.checks import Failure

    df = measure.request_table(_records(), SPEC, FLOORED, COUNTS_R)
    assert list(df["splits"]) == [0, 0, 1] and list(df["kernel_calls"]) == [1, 1, 2]
    assert list(df["suffix_host_bound"]) == [False, False, True]
    # the whole model's time from the replayed layers: 8/2 attention, 24/6 gated delta, 32/8 MLP
    assert df["measured_model_ms"].iloc[0] == pytest.approx(2.0 * 4 + 3.0 * 4 + 4.0 * 4 + 0.5)
    assert df["modelled_ms"].iloc[1] == pytest.approx(measure.modelled_ms(SPEC, FLOORED, COUNTS_R, 200, 500))
    assert df["modelled_ms"].iloc[2] == pytest.approx(measure.modelled_ms(SPEC, FLOORED, COUNTS_R, 100, 400, 1))
    assert df["model_error"].iloc[0] == pytest.approx((df["modelled_ms"].iloc[0] - 9.5) / 9.5)
    assert df["simulated_flops"].iloc[1] == pytest.approx(SPEC.prefill_flops(200, 500))
    fails = [
        Failure("kv-integrity", 1, 3, 200, 200),
        Failure("integrity", 2, 4, 1, 1),
        Failure("shadow-integrity", 2, 4, 1, 1),
    ]
    s = measure.summary(df, failures=fails, store_peak_bytes=123, wall_s=2.0, counts=COUNTS_R, spec=SPEC)
    assert (s["requests"], s["input_tokens"], s["hits"], s["hit_tokens"]) == (3, 1200, 2, 300)
    assert (s["hits_validated"], s["failures"], s["kv_failures"], s["integrity_failures"]) == (1, 3, 1, 2)
    assert s["integrity_checked"] == 1 and s["host_bound_prefills"] == 1 and s["splits"] == 1
    assert s["max_restore_error"] == pytest.approx(0.03) and s["max_rec_error"] == pytest.approx(0.01)
    assert s["measured_ms_with_cache"] == pytest.approx(45.5)
    assert s["measured_ms_without_cache"] == pytest.approx(15.0) and s["requests_full_measured"] == 1
    assert s["measured_ms_saved_validated"] == pytest.approx(9.0)
    full, part = df["modelled_full_ms"].iloc[1], df["modelled_ms"].iloc[1]
    assert s["modelled_ms_saved_validated"] == pytest.approx(full - part)
    saved = sum(df["executed_full_flops"] - df["executed_flops"])
    assert s["measured_flops_saved"] == pytest.approx(saved) and saved > 0
    assert s["simulated_flops_saved"] == pytest.approx(
        SPEC.flops(500) - SPEC.prefill_flops(200, 500) + SPEC.flops(400) - SPEC.prefill_flops(100, 400)
    )
    # the error statistics leave the host-bound prefill out; the _all P95 keeps it
    errs = df["model_error"].abs()
    assert s["time_model_median_error"] == pytest.approx(float(errs.iloc[:2].median()))
    assert s["time_model_p95_error_all"] == pytest.approx(float(errs.quantile(0.95)))
    assert s["measured_ms_by_layer_type"]["attention"] == pytest.approx(2.0 + 1.0 + 2.0)
    assert s["measured_model_ms_by_layer_type"]["gated_delta"] == pytest.approx((3.0 + 1.5 + 3.0) * 4)
    # "other" is what the layer marks leave of the prefills' 45.5 ms (the marks' own 0.5 + 0.25 + 0.5
    # and the rest: the parts add to the total, session 23), unscaled
    by = s["measured_ms_by_layer_type"]
    assert sum(by.values()) == pytest.approx(45.5) and by["other"] == pytest.approx(45.5 - 5.0 - 7.5 - by["mlp"])
    assert by["other"] > 0.5 + 0.25 + 0.5
    assert s["measured_model_ms_by_layer_type"]["other"] == pytest.approx(by["other"])
    # prefills re-timed below their marks (outran_sleep): "other" keeps the marks' own
    short = df.assign(suffix_ms=df["suffix_ms"] * 0.1)
    s2 = measure.summary(short, failures=fails, store_peak_bytes=123, wall_s=2.0, counts=COUNTS_R, spec=SPEC)
    assert s2["measured_ms_by_layer_type"]["other"] == pytest.approx(0.5 + 0.25 + 0.5)
    assert s["replay_tflops_timed"] == pytest.approx(s["replay_flops_executed"] / 45.5e-3 / 1e12)
    wall = s["replay_flops_executed"] + df["replay_full_flops"].iloc[1]
    assert s["replay_tflops_wall"] == pytest.approx(wall / 2.0 / 1e12)
    assert s["restore_errors"]["kv"]["max"] == pytest.approx(0.03)
    assert s["tokens_per_s"] == pytest.approx(600.0)
    # no time, no rate; an empty table
    z = measure.summary(df.iloc[:0], failures=0, store_peak_bytes=0, wall_s=0.0)
    assert z["requests"] == 0 and z["failures"] == 0 and z["tokens_per_s"] != z["tokens_per_s"]
    # its sums are 0, not made up (mutation run, session 17: measured_ms_with_cache's 0.0 -> 1.0 survived)
    sums = ("measured_ms_with_cache", "measured_ms_without_cache", "measured_flops_saved", "simulated_flops_saved")
    sums += ("padding_flops_saved", "replay_flops_executed", "replay_flops_simulated", "hit_tokens", "retimed_prefills")
    sums += ("retimed_references",)
    assert all(z[k] == 0 for k in sums), {k: z[k] for k in sums}
    # rows, none validated: every error statistic is 0, none is made up
    nv = measure.summary(df.iloc[[0, 2]], failures=[], store_peak_bytes=0, wall_s=1.0)
    for key in ("max_restore_error", "max_rec_error", "max_conv_error", "max_out_error", "max_kv_error"):
        assert nv[key] == 0.0, key
    assert nv["restore_errors"] == {} and nv["hits_validated"] == 0 and nv["measured_ms_saved_validated"] == 0.0


def test_batch_summary_by_hand():
    from types import SimpleNamespace as C

    calls = [
        C(kind="suffix", segments=[(0, 100), (50, 80)], ms=2.0, slack_ms=5.0),
        C(kind="suffix", segments=[(10, 20)], ms=1.0, slack_ms=0.1),
        C(kind="reference", segments=[(0, 300)], ms=4.0, slack_ms=float("nan")),
    ]
    b = measure.batch_summary(calls, SPEC, COUNTS_R, wall_s=10.0, peak_tflops=989.0, flushes={"full": 2})
    from sim.replay.flops import replayed_flops

    f = [replayed_flops(SPEC, COUNTS_R, c.segments) for c in calls]
    suf = b["batch_calls"]["suffix"]
    assert (suf["calls"], suf["sequences"], suf["tokens"], suf["ms"]) == (2, 3, 140, 3.0)
    assert suf["sequences_per_call"] == 1.5 and suf["tokens_per_call"] == 70
    assert suf["tflops"] == pytest.approx((f[0] + f[1]) / 3e-3 / 1e12)
    assert suf["peak_share"] == pytest.approx(suf["tflops"] / 989.0)
    assert b["batch_calls"]["reference"]["tokens"] == 300
    assert b["batch_calls_host_bound"] == 1 and b["batch_flushes"] == {"full": 2}
    assert b["replay_tflops_timed"] == pytest.approx(sum(f) / 7e-3 / 1e12)
    assert b["replay_tflops_wall"] == pytest.approx(sum(f) / 10.0 / 1e12)
    assert b["replay_peak_share_wall"] == pytest.approx(b["replay_tflops_wall"] / 989.0)
    nopeak = measure.batch_summary(calls, SPEC, COUNTS_R, wall_s=0.0)
    assert nopeak["replay_peak_share_timed"] == 0.0 and nopeak["batch_calls"]["suffix"]["peak_share"] == 0.0
    assert nopeak["replay_tflops_wall"] != nopeak["replay_tflops_wall"]


def test_batch_summary_rates_sub_millisecond_calls():
    """Timed calls of 0.2 and 0.3 ms (a small model's on a GPU) have a TFLOP/s, not NaN (mutation
    run, session 17: ``ms_all > 0`` -> ``> 1`` survived)."""
    from types import SimpleNamespace as C

    from sim.replay.flops import replayed_flops

    calls = [
        C(kind="suffix", segments=[(0, 64)], ms=0.2, slack_ms=5.0),
        C(kind="suffix", segments=[(0, 32)], ms=0.3, slack_ms=5.0),
    ]
    b = measure.batch_summary(calls, SPEC, COUNTS_R, wall_s=1.0, peak_tflops=989.0)
    f = sum(replayed_flops(SPEC, COUNTS_R, c.segments) for c in calls)
    assert f > 0 and b["replay_tflops_timed"] == pytest.approx(f / 0.5e-3 / 1e12)
    assert b["batch_calls"]["suffix"]["tflops"] == pytest.approx(f / 0.5e-3 / 1e12)


def test_a_mamba1_layer_by_hand():
    """Jamba 1.5 Mini's Mamba1 layer (d_model 4096, d_inner 8192, d_state 16, dt_rank 256, conv 4):
    in_proj 4096 x 16384, x_proj 8192 x (256 + 2 x 16), dt_proj 256 x 8192, out_proj 8192 x 4096
    (the published checkpoint's matrices), 2 FLOPs a weight, plus the conv and the scan
    (a mutation survivor: a wrong projection width went unseen by the config-vs-preset tests)."""
    m = get_model("jamba-1.5-mini")
    params = 4096 * 16384 + 8192 * (256 + 32) + 256 * 8192 + 8192 * 4096
    assert params == 105_119_744
    assert m.mamba_layer_a == 2.0 * params + 2.0 * 8192 * 4 + 8.0 * 8192 * 16 + 5.0 * 8192


def test_a_one_rate_step_pays_the_all_reduce_of_every_token_it_runs():
    """TimingModel under tensor parallel: one all-reduce time per call and per token the step
    runs, prefill tokens and decode tokens alike (mutation survivor: decodes were subtracted)."""
    from sim.cost import TimingModel

    spec = get_model("qwen3.5-9b")
    base = TimingModel(100.0, 5.0, 0.001)
    tp = replace(base, comm_ms_per_call=0.5, comm_ms_per_token=0.01)
    prefills, decodes = [(100, 400), (0, 200)], [1000, 2000, 3000]
    extra = (0.5 + (300 + 200 + 3) * 0.01) * 1e-3
    assert tp.step_time_s(spec, prefills, decodes) == pytest.approx(base.step_time_s(spec, prefills, decodes) + extra)


def test_a_hardware_timed_step_pays_the_all_reduce_of_every_token_it_runs():
    """HardwareTiming under tensor parallel, as TimingModel above: one all-reduce time per call
    and per token of the step (mutation -m cost --seed 5 survivor L943: tokens / per-token)."""
    from sim.cost import read_timing_file

    spec = get_model("qwen3.5-9b")
    base = read_timing_file(Path(__file__).resolve().parents[2] / "sim" / "data" / "h200-timing.json")
    tp = replace(base, comm_ms_per_call=0.5, comm_ms_per_token=0.01)
    prefills, decodes = [(100, 400), (0, 200)], [1000, 2000, 3000]
    extra = (0.5 + (300 + 200 + 3) * 0.01) * 1e-3
    assert tp.step_time_s(spec, prefills, decodes) == pytest.approx(base.step_time_s(spec, prefills, decodes) + extra)


def test_a_timing_that_records_no_model_widths_says_nothing_of_them():
    """``coverage_note`` with ``covers`` naming prompt lengths only: no d_model range, so no word
    on d_model (mutation -m cost --seed 5 survivor L862: a default range of (0, 1))."""
    from sim.cost import read_timing_file

    base = read_timing_file(Path(__file__).resolve().parents[2] / "sim" / "data" / "h200-timing.json")
    t = replace(base, covers={"max_tokens": 1000})
    spec = get_model("qwen3.5-9b")
    assert t.coverage_note(spec) == ""
    assert t.coverage_note(spec, max_tokens=2000).endswith(": prompts up to 2,000 tokens (fitted up to 1,000)")
