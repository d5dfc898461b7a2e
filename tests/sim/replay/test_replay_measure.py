"""Replay measurements: the calibration fit, timing files, the time-model comparison."""

import json

import numpy as np
import pytest

from sim.cost import TimingModel, get_model
from sim.errors import UsageError
from sim.replay.measure import fit_linear, read_timing, write_timing


def test_fit_recovers_a_known_overhead_and_throughput():
    rng = np.random.default_rng(0)
    flops = rng.uniform(1e9, 1e13, 200)
    ms = 2.5 + flops * 1e3 / (300e12)
    a, tflops = fit_linear(flops, ms * rng.uniform(0.99, 1.01, 200))
    assert abs(a - 2.5) < 0.1 and abs(tflops - 300) < 6


def test_fit_needs_two_sizes():
    with pytest.raises(UsageError):
        fit_linear([1e9], [1.0])


def test_timing_file_round_trip_and_bad_files(tmp_path):
    spec = get_model("qwen3.5-9b")
    t = TimingModel(123.0, 4.5, 7.0, source="x")
    p = tmp_path / "t.json"
    write_timing(p, t, spec, {"requests": 3})
    back = read_timing(p)
    assert (back.effective_tflops, back.overhead_ms, back.decode_ms_per_token) == (123.0, 4.5, 7.0)
    (tmp_path / "bad.json").write_text("{")
    for bad in (tmp_path / "bad.json", tmp_path / "missing.json"):
        with pytest.raises(UsageError):
            read_timing(bad)
    (tmp_path / "other.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(UsageError):
        read_timing(tmp_path / "other.json")


def test_roofline_is_the_slower_of_compute_and_weight_reads():
    from sim.replay.measure import roofline_ms

    # 1 TFLOP at 1 PFLOP/s = 1 ms; 1 GB at 1 TB/s = 1 ms; 1 PFLOP = 1 s
    got = roofline_ms([1e12, 1e15, 0.0], 1e9, 1e15, 1e12)
    assert got.tolist() == pytest.approx([1.0, 1000.0, 1.0])


def test_replayed_weight_bytes_follow_the_layers_replayed():
    from sim.cost import get_model
    from sim.replay.measure import model_counts, replayed_weight_bytes

    spec = get_model("qwen3.5-9b")
    full = replayed_weight_bytes(spec, model_counts(spec))
    # qwen3.5-9b: ~9e9 parameters, ~2e9 of them in the embedding and LM head (not replayed), bf16
    assert 13e9 < full < 15e9
    half = replayed_weight_bytes(spec, {"attention": 4, "gated_delta": 12, "mlp": 16})
    assert half == pytest.approx(full / 2)
    assert replayed_weight_bytes(spec, {"attention": 0, "gated_delta": 0, "mlp": 0}) == 0


def test_an_empty_request_table_has_the_columns_of_a_full_one():
    """No request replayed (an engine preset aborting every prompt): the table has every column a
    replayed one has, the shadow replay's too where ``--validate shadow`` ran, so the summary reads
    an empty table (mutation run, session 23: the stub's shadow columns survived)."""
    from sim.cost import default_timing, get_model
    from sim.replay.measure import request_table
    from sim.replay.records import RequestRecord

    spec, counts = get_model("replay-tiny"), {"attention": 1, "gated_delta": 3, "mlp": 4}
    timing = default_timing("replay-tiny")
    full = request_table([RequestRecord(0, 100, 0)], spec, timing, counts)
    empty = request_table([], spec, timing, counts)
    assert len(empty) == 0 and list(empty.columns) == list(full.columns)
    assert not any(c.startswith("shadow_") for c in empty.columns)
    with_shadow = request_table([], spec, timing, counts, shadow=[])
    shadowed = request_table([RequestRecord(0, 100, 0)], spec, timing, counts, shadow=[])
    assert len(with_shadow) == 0 and list(with_shadow.columns) == list(shadowed.columns)
    assert {"shadow_validated", "shadow_failed"} <= set(with_shadow.columns)
