"""Replay measurements: the calibration fit, timing files, the time-model comparison."""

import json

import numpy as np
import pytest

from sim.cost import TimingModel, default_timing, get_model
from sim.errors import UsageError
from sim.replay.measure import (calibrate, fit_linear, modelled_ms, read_timing, replayed_spec,
                                request_table, write_timing)
from sim.replay.records import RequestRecord


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


def test_calibration_reproduces_measurements_made_by_its_own_model():
    """Requests 'measured' with a known timing are fitted back to it, and the whole-model file
    scales the overhead by the layer count (32 layers of which 24 gated-delta, 4 replayed)."""
    spec = get_model("qwen3.5-9b")
    true = TimingModel(200.0, 8.0, 1.0)
    recs = []
    for i, (hit, n) in enumerate([(0, 300), (128, 2000), (0, 5000), (1024, 9000), (0, 50)]):
        r = RequestRecord(i, n, 10, hit_tokens=hit, restored=hit > 0)
        r.suffix_segments = [(hit, n)]
        r.suffix_ms = modelled_ms(spec, true, 4, hit, n)
        recs.append(r)
    df = request_table(recs, spec, default_timing("qwen3.5-9b"), 4)
    t, info = calibrate(df, spec, default_timing("qwen3.5-9b"), 4)
    assert abs(t.effective_tflops - 200) < 1 and abs(t.overhead_ms - 8.0) < 0.05
    assert info["median_error"] < 1e-3
    df2 = request_table(recs, spec, t, 4)
    assert df2["model_error"].abs().max() < 1e-3
    assert replayed_spec(spec, 4).n_gdn == 4 and replayed_spec(spec, 4).n_attn == 0
