"""Bad trace rows through the real CLI: one line naming FILE:LINE and exit 2, never a traceback,
an OverflowError or an out-of-memory kill (issue 12)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import traces.base
from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


@pytest.fixture(scope="module")
def main():
    from sim.cli import main as marconi_main

    return marconi_main


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _moon(ts=0, il=600, ol=10, hashes=(0, 1)):
    return {"timestamp": ts, "input_length": il, "output_length": ol, "hash_ids": list(hashes)}


def _mj(ts=0.0, inp=(1, 2), out=(3,), sid=0, turn=0):
    return {
        "session_id": sid,
        "turn_id": turn,
        "ts": ts,
        "num_input_tokens": len(inp),
        "num_output_tokens": len(out),
        "input_tokens": list(inp),
        "output_tokens": list(out),
    }


def _stats(main, spec):
    res = CliRunner().invoke(main, ["traces", "stats", spec, "--format", "json"])
    return res.exit_code, res.output.strip()


BIG = 10**30
HASH_HINT = ": ids are only compared for equality, so number them 0, 1, 2, ... (in order of first appearance, say)"

CASES = [
    # (format, bad row as JSON text, message after FILE:LINE)
    (
        "mooncake",
        json.dumps(_moon(ol=10**12)),
        "1,000,000,000,600 tokens in one request, more than the limit of 10,000,000 (max_request_tokens)",
    ),
    ("mooncake", json.dumps(_moon(hashes=(0, BIG))), "hash_ids holds 1.000e+30, out of range [0, 2^63-1]" + HASH_HINT),
    ("mooncake", json.dumps(_moon(hashes=(0, -3))), "hash_ids holds -3, out of range [0, 2^63-1]" + HASH_HINT),
    ("mooncake", json.dumps(_moon(il=BIG)), "input_length 1.000e+30 out of range [0, 2^63-1]"),
    (
        "mooncake",
        '{"timestamp": NaN, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}',
        "timestamp nan is not a finite number",
    ),
    (
        "mooncake",
        '{"timestamp": Infinity, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}',
        "timestamp inf is not a finite number",
    ),
    ("mooncake", json.dumps(_moon(ts=10**400)), "timestamp an integer of 1329 bits is not a finite number"),
    (
        "bailian",
        json.dumps(
            {
                "chat_id": BIG,
                "parent_chat_id": -1,
                "timestamp": 1.0,
                "input_length": 16,
                "output_length": 1,
                "type": "text",
                "turn": 1,
                "hash_ids": [5],
            }
        ),
        "chat_id 1.000e+30 out of range [-2^63, 2^63-1]",
    ),
    ("marconi-jsonl", json.dumps(_mj(inp=(1, BIG))), "input_tokens holds 1.000e+30, out of range [0, 2^31-1]"),
    ("marconi-jsonl", json.dumps(_mj(out=(-7,))), "output_tokens holds -7, out of range [0, 2^31-1]"),
    ("marconi-jsonl", json.dumps(_mj(turn=BIG)), "turn_id 1.000e+30 out of range [-2^63, 2^63-1]"),
    ("marconi-jsonl", json.dumps(_mj()).replace('"ts": 0.0', '"ts": -Infinity'), "ts -inf is not a finite number"),
    ("marconi-jsonl", json.dumps(_mj()).replace('"ts": 0.0', '"ts": NaN'), "ts nan is not a finite number"),
]


@pytest.mark.parametrize("kind, bad, message", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_row_one_line_with_file_and_line(main, tmp_path, kind, bad, message):
    good = {
        "mooncake": json.dumps(_moon()),
        "marconi-jsonl": json.dumps(_mj()),
        "bailian": json.dumps(
            {
                "chat_id": 1,
                "parent_chat_id": -1,
                "timestamp": 0.0,
                "input_length": 16,
                "output_length": 1,
                "type": "text",
                "turn": 1,
                "hash_ids": [5],
            }
        ),
    }[kind]
    path = _write(tmp_path / "t.jsonl", [good, "", bad])  # the bad row is on line 3
    code, out = _stats(main, f"{kind}:{path}")
    assert code == 2
    assert out == f"Error: {path}:3: {message}"


def test_arrival_beyond_a_float(main, tmp_path):
    path = _write(tmp_path / "t.jsonl", [_moon(ts=-(10**308)), _moon(ts=10**308)])
    code, out = _stats(main, f"mooncake:{path}")
    assert code == 2 and out.startswith(f"Error: {path}:2: timestamp ") and "gives an arrival beyond a float" in out


def test_directory_is_reported_as_a_directory(main, tmp_path):
    for spec in ("mooncake", "bailian", "marconi-jsonl"):
        code, out = _stats(main, f"{spec}:{tmp_path}")
        assert code == 2 and out == f"Error: {spec} path is a directory, not a file: {tmp_path}"
    code, out = _stats(main, f"sharegpt:{tmp_path}")  # a folder is read as shards: here, none
    assert code == 2 and out.startswith(f"Error: no .json or .jsonl files under {tmp_path}")
    code, out = _stats(main, f"mooncake:{tmp_path / 'absent.jsonl'}")
    assert code == 2 and out == f"Error: mooncake file not found: {tmp_path / 'absent.jsonl'}"


def test_request_token_limit_counts_input_plus_output(tmp_path):
    path = _write(tmp_path / "m.jsonl", [_moon(il=1000, ol=24), _moon(ts=1, il=1000, ol=25)])
    with pytest.raises(TraceError, match=r"m.jsonl:2: 1,025 tokens in one request, more than the limit of 1,024"):
        load_trace(f"mooncake:{path}", TraceOptions(max_request_tokens=1024))
    tr = load_trace(f"mooncake:{path}", TraceOptions(max_request_tokens=1024, skip_bad_rows=True))
    assert len(tr.requests) == 1 and tr.meta["skipped_rows"] == 1
    mj = _write(tmp_path / "j.jsonl", [_mj(inp=(1, 2, 3), out=(4,))])
    with pytest.raises(TraceError, match=r"j.jsonl:1: 4 tokens in one request, more than the limit of 3"):
        load_trace(f"marconi-jsonl:{mj}", TraceOptions(max_request_tokens=3))
    with pytest.raises(TraceError, match=r"max_request_tokens \(MARCONI_MAX_REQUEST_TOKENS\) must be an integer >= 1"):
        load_trace(f"marconi-jsonl:{mj}", TraceOptions(max_request_tokens=0))


def test_request_token_limit_from_the_environment(main, tmp_path):
    path = _write(tmp_path / "m.jsonl", [_moon(il=1000, ol=24), _moon(ts=1, il=1000, ol=25)])
    res = CliRunner().invoke(main, ["traces", "stats", f"mooncake:{path}"], env={"MARCONI_MAX_REQUEST_TOKENS": "1024"})
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"Error: {path}:2: 1,025 tokens in one request, more than the limit of 1,024 (max_request_tokens)"
    )
    res = CliRunner().invoke(main, ["traces", "stats", f"mooncake:{path}"], env={"MARCONI_MAX_REQUEST_TOKENS": "lots"})
    assert res.exit_code == 2 and res.output.strip() == (
        "Error: max_request_tokens (MARCONI_MAX_REQUEST_TOKENS) must be an integer >= 1 (got 'lots')"
    )
    assert CliRunner().invoke(main, ["traces", "stats", f"mooncake:{path}"]).exit_code == 0


@pytest.mark.parametrize("kind", ["mooncake", "marconi-jsonl"])
def test_trace_larger_than_memory_stops_at_the_row(main, tmp_path, monkeypatch, kind):
    """Rows within the per-request limit whose sum would not fit: stopped before the buffer is
    built, naming the row where the total and a run's as much again cross the memory available
    (here set to 800 bytes = 100 int64 symbols: row 2 holds 80, 640 bytes, 1,280 with a run's)."""
    monkeypatch.setattr(traces.base, "available_memory", lambda: 800)
    if kind == "mooncake":  # 20 input + 20 output blocks = 40 symbols a row
        rows = [_moon(ts=i, il=512 * 20, ol=512 * 20, hashes=range(20 * i, 20 * i + 20)) for i in range(4)]
    else:  # 40 new tokens a row (separate sessions)
        rows = [_mj(ts=float(i), sid=i, inp=range(30), out=range(10)) for i in range(4)]
    path = _write(tmp_path / "t.jsonl", rows)
    code, out = _stats(main, f"{kind}:{path}")
    assert code == 2
    assert out == (
        f"Error: {path}:2: the trace would need 640 bytes for its symbols up to this row, and a run of it "
        "about as much again (1,280 bytes in all), more than the 800 bytes of memory available"
    )
    # skipping bad rows does not skip this: the trace would be silently cut short
    res = CliRunner().invoke(main, ["traces", "stats", f"{kind}:{path}", "--skip-bad-rows"])
    assert res.exit_code == 2 and f"{path}:2: the trace would need" in res.output


def test_hash_block_buffers_int32_when_ids_fit(tmp_path):
    small = _write(tmp_path / "s.jsonl", [_moon(hashes=(0, 2**31 - 1))])
    wide = _write(tmp_path / "w.jsonl", [_moon(hashes=(0, 2**31))])
    for path, dtype in ((small, np.int32), (wide, np.int64)):
        tr = load_trace(f"mooncake:{path}")
        r = tr.requests[0]
        assert r.input_tokens.dtype == dtype and r.output_tokens.dtype == dtype
        assert r.input_tokens.tolist()[1] in (2**31 - 1, 2**31) and r.output_tokens.tolist() == [-1]


def test_a_trace_that_fits_but_whose_run_would_not_stops_at_the_row(tmp_path, monkeypatch):
    """The buffer alone fitting was enough: a 50 MB Mooncake file spelled out with
    --hash-block-tokens (16.5 GB of symbols) was built in 20 GB available and its run filled the
    machine. 1,000 bytes available: row 1's 40 symbols (320 bytes) and a run's as much again fit,
    rows 1-2 (640 bytes, 1,280 with the run) do not, though their buffer alone would."""
    monkeypatch.setattr(traces.base, "available_memory", lambda: 1000)
    rows = [_moon(ts=i, il=512 * 20, ol=512 * 20, hashes=range(20 * i, 20 * i + 20)) for i in range(2)]
    one = _write(tmp_path / "one.jsonl", rows[:1])
    assert len(load_trace(f"mooncake:{one}", TraceOptions()).requests) == 1
    two = _write(tmp_path / "two.jsonl", rows)
    with pytest.raises(TraceError, match=r"two\.jsonl:2: the trace would need 640 bytes .* \(1,280 bytes in all\)"):
        load_trace(f"mooncake:{two}", TraceOptions())
