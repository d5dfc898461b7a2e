"""JSON Lines files cut short (session 24's new-user hunt): a last row with no newline after it that
is not JSON says the file may be cut short, and how to run what is there."""

import json

import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace

ROWS = [
    {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
    {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
]
CUT = "; the file's last line, with no newline after it: the file is cut short? (--skip-bad-rows leaves it out)"


def test_mooncake_last_row_cut_short(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1])[:30])
    with pytest.raises(TraceError) as err:
        load_trace(f"mooncake:{f}", TraceOptions())
    assert str(err.value) == f"{f}:2: bad JSON: Unterminated string starting at (column 21){CUT}"
    trace = load_trace(f"mooncake:{f}", TraceOptions(skip_bad_rows=True))
    assert len(trace.requests) == 1 and trace.meta["skipped_rows"] == 1


def test_bad_row_followed_by_a_newline_has_no_hint(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1])[:30] + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(f"mooncake:{f}", TraceOptions())
    assert str(err.value) == f"{f}:2: bad JSON: Unterminated string starting at (column 21)"


def test_sharegpt_jsonl_last_record_cut_short(tmp_path):
    rec = {"id": "a", "conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]}
    f = tmp_path / "s.jsonl"
    f.write_text(json.dumps(rec) + "\n" + json.dumps(rec)[:60])
    opts = dict(cache_dir=str(tmp_path / "cache"), min_rounds=1, sessions=0, num_proc=1)
    with pytest.raises(TraceError) as err:
        load_trace(f"sharegpt:{f}", TraceOptions(**opts))
    # the column is where the cut string starts (it was 'Unterminated string starting at', no place)
    assert str(err.value) == f"{f}:2: bad JSON: Unterminated string starting at (column 58){CUT}"
    assert len(load_trace(f"sharegpt:{f}", TraceOptions(skip_bad_rows=True, **opts)).requests) == 1
    g = tmp_path / "t.jsonl"
    g.write_text(json.dumps(rec) + "\n  {bad\n" + json.dumps(rec) + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(f"sharegpt:{g}", TraceOptions(**opts))
    assert str(err.value) == f"{g}:2: bad JSON: Expecting property name enclosed in double quotes (column 4)"


def test_pretty_printed_rows_say_what_the_file_is(tmp_path):
    """`json.dump(row, f, indent=2)` per row: line 1 is a lone '{', and the error said only
    "Expecting property name enclosed in double quotes"; now it says the file is pretty-printed
    JSON and that a trace is JSON Lines."""
    f = tmp_path / "m.json"
    f.write_text("".join(json.dumps(r, indent=2) + "\n" for r in ROWS))
    with pytest.raises(TraceError) as err:
        load_trace(f"mooncake:{f}", TraceOptions())
    assert str(err.value) == (
        f"{f}:1: bad JSON: Expecting property name enclosed in double quotes (column 2); the file is pretty-printed "
        "JSON (an object over several lines): a mooncake trace is JSON Lines (one JSON object a line), e.g. `jq -c . FILE`"
    )
    rec = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    g = tmp_path / "s.json"
    g.write_text(json.dumps(rec, indent=2))
    opts = TraceOptions(cache_dir=str(tmp_path / "cache"), min_rounds=1, sessions=0, num_proc=1)
    with pytest.raises(
        TraceError, match=r"s\.json:1: bad JSON: .*; the file is pretty-printed JSON .*: a ShareGPT file"
    ):
        load_trace(f"sharegpt:{g}", opts)


def test_sharegpt_records_wrapped_in_an_object(tmp_path):
    """{"data": [records]}: 'missing field 'conversations'' said nothing of the list inside."""
    rec = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    g = tmp_path / "wrapped.json"
    g.write_text(json.dumps({"version": 2, "data": [rec, rec]}))
    opts = TraceOptions(cache_dir=str(tmp_path / "cache"), min_rounds=1, sessions=0, num_proc=1)
    with pytest.raises(TraceError) as err:
        load_trace(f"sharegpt:{g}", opts)
    assert str(err.value) == (
        f"{g}:1: missing field 'conversations' (or 'messages'); its 'data' holds 2 conversation records: a ShareGPT "
        "file is that list itself (a JSON array), or JSON Lines"
    )


def test_a_large_gzip_trace_shows_its_reading_bar(tmp_path, monkeypatch, capsys):
    """The reading bar came for files of PROGRESS_BYTES or more on disk, so a .gz holding 4 times
    that (10^6 Mooncake rows, 100 MB of text in a 26 MB .gz: 15 s) was read with nothing on the
    screen; a gzip file now counts about GZIP_RATIO times its size."""
    import gzip

    import traces.jsonl as jsonl

    rows = [{"timestamp": i, "input_length": 600, "output_length": 5, "hash_ids": [i, i + 1]} for i in range(200)]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    f = tmp_path / "m.jsonl.gz"
    f.write_bytes(gzip.compress(text))
    size = f.stat().st_size
    assert size * jsonl.GZIP_RATIO < len(text)  # this file compresses better than the ratio assumed
    monkeypatch.setattr(jsonl, "PROGRESS_BYTES", size * 2)  # the .gz under it, its text over it
    trace = load_trace(f"mooncake:{f}", TraceOptions(progress=True))
    assert len(trace.requests) == 200
    assert "reading m.jsonl.gz" in capsys.readouterr().err
    monkeypatch.setattr(jsonl, "PROGRESS_BYTES", size * jsonl.GZIP_RATIO + 1)  # under the threshold: no bar
    load_trace(f"mooncake:{f}", TraceOptions(progress=True))
    assert "reading" not in capsys.readouterr().err


def test_marconi_jsonl_without_requests_says_why(tmp_path):
    """'has no requests (after filtering)': an empty file, or every row skipped, is said as the
    hash-block traces say it."""
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"\xef\xbb\xbf\n  \n")
    with pytest.raises(TraceError) as err:
        load_trace(f"marconi-jsonl:{empty}", TraceOptions())
    assert str(err.value) == f"trace marconi-jsonl:{empty} has no requests: the file holds no rows"
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"session_id": 1}\n{"session_id": 2}\n')
    with pytest.raises(TraceError) as err:
        load_trace(f"marconi-jsonl:{bad}", TraceOptions(skip_bad_rows=True))
    assert (
        str(err.value)
        == f"trace marconi-jsonl:{bad} has no requests: all 2 of its rows are bad (skipped: --skip-bad-rows)"
    )
