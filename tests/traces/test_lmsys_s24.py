"""LMSys-Chat-1M rows saved as JSON (session 24's new-user hunt): ``datasets``' ``to_json`` writes
JSON Lines, and a JSON array or a .gz of either is what users hand around; ``lmsys:PATH`` read
only parquet ('cannot read parquet file X: Parquet magic bytes not found in footer')."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


def _rows(n=3, rounds=4):
    out = []
    for k in range(n):
        conv = []
        for i in range(rounds):
            conv.append({"role": "user", "content": f"question {i} of chat {k}"})
            conv.append({"role": "assistant", "content": f"answer {i}"})
        out.append({"conversation_id": f"c{k}", "model": "vicuna-13b", "conversation": conv, "turn": rounds})
    return out


def _opts(tmp_path, **kw):
    return TraceOptions(cache_dir=str(tmp_path / "cache"), sessions=0, min_rounds=2, num_proc=1, **kw)


def _tokens(trace):
    return [(r.session_id, r.input_tokens.tolist(), r.output_tokens.tolist()) for r in trace.requests]


@pytest.fixture
def parquet_trace(tmp_path):
    f = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(_rows()), f)
    trace = load_trace(f"lmsys:{f}", _opts(tmp_path))
    assert trace.n_sessions == 3 and len(trace.requests) == 12  # 3 chats of 4 rounds
    return _tokens(trace)


@pytest.mark.parametrize("form", ["jsonl", "json", "jsonl.gz", "folder"])
def test_json_rows_read_as_parquet_rows(tmp_path, parquet_trace, form):
    rows = _rows()
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    if form == "jsonl":
        f = tmp_path / "rows.jsonl"
        f.write_text(lines)
    elif form == "json":
        f = tmp_path / "rows.json"
        f.write_text(json.dumps(rows, indent=1))
    elif form == "jsonl.gz":
        f = tmp_path / "rows.jsonl.gz"
        f.write_bytes(gzip.compress(lines.encode()))
    else:  # a folder of JSON Lines shards, read in path order
        f = tmp_path / "shards"
        f.mkdir()
        (f / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
        (f / "part-1.jsonl").write_text(json.dumps(rows[2]) + "\n")
        (f / "dataset_info.json").write_text('{"features": {}}')  # metadata beside the rows: not read
        (f / ".cache").mkdir()
        (f / ".cache" / "x.jsonl").write_text("{}\n")
    trace = load_trace(f"lmsys:{f}", _opts(tmp_path))
    assert _tokens(trace) == parquet_trace
    assert trace.meta["conversation_ids"] == ["c0", "c1", "c2"]


def test_bad_json_row_is_named_or_skipped(tmp_path):
    rows = _rows()
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(rows[0]) + "\n{not json\n" + json.dumps(rows[1]) + "\n")
    with pytest.raises(TraceError, match=r"rows\.jsonl:2: bad JSON"):
        load_trace(f"lmsys:{f}", _opts(tmp_path))
    trace = load_trace(f"lmsys:{f}", _opts(tmp_path, skip_bad_rows=True))
    assert trace.meta["conversation_ids"] == ["c0", "c1"] and trace.meta["skipped_rows"] == 1
    g = tmp_path / "msg.jsonl"
    g.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "conversation": "hello"}) + "\n")
    with pytest.raises(TraceError, match=r"msg\.jsonl:2: 'conversation' is not a list of messages"):
        load_trace(f"lmsys:{g}", _opts(tmp_path))


def test_folder_without_rows_names_both_kinds(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(TraceError, match=r"no \.parquet \(or \.json / \.jsonl\) files under"):
        load_trace(f"lmsys:{tmp_path}", _opts(tmp_path))


def test_sharegpt_and_lmsys_files_swapped_name_the_other_spec(tmp_path):
    rows = _rows(1)
    lm = tmp_path / "lm.jsonl"
    lm.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(f"sharegpt:{lm}", _opts(tmp_path))
    assert str(err.value) == (
        f"{lm}:1: missing field 'conversations' (or 'messages'); its 'conversation' is LMSys-Chat-1M's: "
        "--trace lmsys:PATH reads it"
    )
    sg = tmp_path / "sg.jsonl"
    sg.write_text(json.dumps({"id": "a", "conversations": [{"from": "human", "value": "hi"}]}) + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(f"lmsys:{sg}", _opts(tmp_path))
    assert (
        str(err.value) == f"{sg}:1: no 'conversation', but ShareGPT's 'conversations': --trace sharegpt:PATH reads it"
    )
