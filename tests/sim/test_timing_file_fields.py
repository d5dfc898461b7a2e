"""A timing file's bad field is one line naming that field (sim.cost.read_timing_file): a dict of
terms given as a string printed "'str' object has no attribute 'items'"; 0 GPUs read as "every
term must be non-negative", 2.5 GPUs as 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cost import read_timing_file
from sim.errors import UsageError

H100 = Path(__file__).resolve().parents[2] / "sim" / "data" / "h100-timing.json"


def _write(tmp_path, drop=(), **edits) -> Path:
    d = json.loads(H100.read_text())
    for k in drop:
        d.pop(k)
    d.update(edits)
    path = tmp_path / "timing.json"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize(
    "edits, drop, message",
    [
        ({"ms_per_tflop": "x"}, (), "bad field 'ms_per_tflop': 'x'"),
        ({"layer_call_ms": [1, 2]}, (), "bad field 'layer_call_ms': [1, 2]"),
        ({"covers": [1, 2]}, (), "bad field 'covers': [1, 2]"),
        ({"call_ms": "fast"}, (), "call_ms"),
        ({}, ("ms_per_tflop",), "missing field 'ms_per_tflop'"),
        ({}, ("decode_ms_per_token",), "missing field 'decode_ms_per_token'"),
        ({"gpus": 0}, (), "bad field 'gpus': 0"),
        ({"gpus": 2.5}, (), "bad field 'gpus': 2.5"),
        ({"gpus": -2}, (), "bad field 'gpus': -2"),
    ],
)
def test_bad_field_is_named(tmp_path, edits, drop, message):
    with pytest.raises(UsageError) as exc:
        read_timing_file(_write(tmp_path, drop, **edits))
    assert message in str(exc.value) and "object has no attribute" not in str(exc.value)


def test_one_line_format_fields(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "marconi-timing/1", "effective_tflops": 100, "decode_ms_per_token": 1}))
    with pytest.raises(UsageError, match="missing field 'overhead_ms'"):
        read_timing_file(path)
    path.write_text(
        json.dumps({"format": "marconi-timing/1", "effective_tflops": 100, "overhead_ms": 2, "decode_ms_per_token": 1})
    )
    t = read_timing_file(path)
    assert (t.effective_tflops, t.overhead_ms, t.decode_ms_per_token) == (100.0, 2.0, 1.0)


def test_good_file_reads_as_before(tmp_path):
    t = read_timing_file(_write(tmp_path, gpus=4))
    ref = read_timing_file(H100)
    assert t.gpus == 4 and ref.gpus == 1 and t.ms_per_tflop == ref.ms_per_tflop and t.device == "h100"
