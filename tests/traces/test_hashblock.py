import json
import math

import numpy as np
import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


MOONCAKE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 1024, "output_length": 513, "hash_ids": [0, 1]},
    {"timestamp": 2500, "input_length": 600, "output_length": 0, "hash_ids": [0, 3]},
]


def test_mooncake_small(tmp_path):
    p = _write(tmp_path / "m.jsonl", MOONCAKE)
    tr = load_trace(f"mooncake:{p}", TraceOptions(time_scale=2.0))
    assert tr.block_tokens == 512 and not tr.closed_loop
    assert len(tr.requests) == 3 and tr.n_sessions == 3
    r0, r1, r2 = tr.requests
    assert r0.input_tokens.tolist() == [0, 1, 2] and r0.input_len == 1100 and r0.output_len == 10
    assert [r.arrival for r in tr.requests] == [0.0, 1.0, 5.0]  # ms -> s, times time_scale
    # outputs: ceil(len / 512) fresh negative symbols, unique across the trace
    assert r0.output_tokens.tolist() == [-1]
    assert r1.output_tokens.tolist() == [-2, -3]
    assert r2.output_tokens.tolist() == []
    assert tr.input_tokens_total() == 1100 + 1024 + 600
    assert tr.output_tokens_total() == 10 + 513 + 0
    assert tr.meta["t0"] == 0.0
    # arrivals count from the first timestamp, which the trace keeps in seconds (meta t0)
    later = [dict(row, timestamp=row["timestamp"] + 1500) for row in MOONCAKE]
    tr = load_trace(f"mooncake:{_write(tmp_path / 'late.jsonl', later)}", TraceOptions(time_scale=2.0))
    assert [r.arrival for r in tr.requests] == [0.0, 1.0, 5.0] and tr.meta["t0"] == pytest.approx(1.5)


BAILIAN = [
    {
        "chat_id": 10,
        "parent_chat_id": -1,
        "timestamp": 1.0,
        "input_length": 40,
        "output_length": 20,
        "type": "text",
        "turn": 1,
        "hash_ids": [5, 6, 7],
    },
    {
        "chat_id": 11,
        "parent_chat_id": -1,
        "timestamp": 1.5,
        "input_length": 16,
        "output_length": 1,
        "type": "image",
        "turn": 1,
        "hash_ids": [5],
    },
    {
        "chat_id": 12,
        "parent_chat_id": 10,
        "timestamp": 3.0,
        "input_length": 70,
        "output_length": 33,
        "type": "text",
        "turn": 2,
        "hash_ids": [5, 6, 7, 8, 9],
    },
    {
        "chat_id": 13,
        "parent_chat_id": 99,
        "timestamp": 4.0,
        "input_length": 1,
        "output_length": 0,
        "type": "file",
        "turn": 3,
        "hash_ids": [1],
    },
    {
        "chat_id": 14,
        "parent_chat_id": 12,
        "timestamp": 4.0,
        "input_length": 100,
        "output_length": 2,
        "type": "text",
        "turn": 3,
        "hash_ids": [5, 6, 7, 8, 9, 10, 11],
    },
]


def test_bailian_sessions(tmp_path):
    p = _write(tmp_path / "b.jsonl", BAILIAN)
    tr = load_trace(f"bailian:{p}", TraceOptions())
    assert tr.block_tokens == 16 and len(tr.requests) == 5
    assert [r.session_id for r in tr.requests] == [0, 1, 0, 2, 0]
    assert [r.turn for r in tr.requests] == [1, 1, 2, 3, 3]
    assert [r.arrival for r in tr.requests] == [0.0, 0.5, 2.0, 3.0, 3.0]
    assert [len(r.output_tokens) for r in tr.requests] == [2, 1, 3, 0, 1]
    outs = np.concatenate([r.output_tokens for r in tr.requests])
    assert len(set(outs.tolist())) == len(outs) and (outs < 0).all()
    assert tr.meta["types"] == {"text": 3, "image": 1, "file": 1}
    assert [r.turn for r in tr.sessions()[0]] == [1, 2, 3]


@pytest.mark.parametrize(
    "row, message",
    [
        ('{"timestamp": 0, "input_length": 5', r"m\.jsonl:2: bad JSON"),
        ({"timestamp": 0, "input_length": 5, "hash_ids": [0]}, r"m\.jsonl:2: missing field 'output_length'"),
        (
            {"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []},
            r"m\.jsonl:2: negative input_length -5",
        ),
        (
            {"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [0, 1]},
            r"m\.jsonl:2: 2 hash_ids for input_length 1025 \(expected ceil\(1025/512\) = 3\)",
        ),
        (
            {"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [0]},
            r"m\.jsonl:2: timestamp -1 goes backwards \(previous 0\): rows must be in time order, sort the file by "
            r"timestamp$",
        ),
        (
            {"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": ["a"]},
            r"m\.jsonl:2: field 'hash_ids' must be a list of integers",
        ),
    ],
)
def test_mooncake_bad_rows(tmp_path, row, message):
    p = _write(tmp_path / "m.jsonl", [MOONCAKE[0], row, MOONCAKE[1]])
    with pytest.raises(TraceError, match=message):
        load_trace(f"mooncake:{p}", TraceOptions())
    tr = load_trace(f"mooncake:{p}", TraceOptions(skip_bad_rows=True))
    assert len(tr.requests) == 2 and tr.meta["skipped_rows"] == 1


def test_bailian_missing_field_and_empty(tmp_path):
    row = dict(BAILIAN[0])
    del row["parent_chat_id"]
    p = _write(tmp_path / "b.jsonl", [row])
    with pytest.raises(TraceError, match=r"b\.jsonl:1: missing field 'parent_chat_id'"):
        load_trace(f"bailian:{p}", TraceOptions())
    with pytest.raises(TraceError, match="has no requests"):
        load_trace(f"bailian:{p}", TraceOptions(skip_bad_rows=True))
    with pytest.raises(TraceError, match="mooncake file not found"):
        load_trace(f"mooncake:{tmp_path / 'none.jsonl'}", TraceOptions())


@pytest.mark.parametrize(
    "spec, n, n_in, duration",
    [
        ("mooncake:sample", 300, 4_269_971, 102.0),
        ("mooncake:sample-synthetic", 300, 3_853_165, 86.79),
    ],
)
def test_bundled_mooncake_samples(spec, n, n_in, duration, tmp_path, monkeypatch):
    """The first 300 rows of either public trace ship in traces/data/ (figures from the rows, summed
    with json); the short name works from any folder and never needs ../shared."""
    monkeypatch.chdir(tmp_path)
    tr = load_trace(spec, TraceOptions())
    assert len(tr.requests) == n and tr.meta["skipped_rows"] == 0
    assert tr.input_tokens_total() == n_in
    assert tr.requests[-1].arrival == pytest.approx(duration)


def test_a_local_file_named_sample_wins_over_the_bundled_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample").write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n')
    tr = load_trace("mooncake:sample", TraceOptions())
    assert len(tr.requests) == 1 and tr.input_tokens_total() == 600


@pytest.mark.parametrize(
    "name, n, n_in, duration",
    [
        ("mooncake_conversation_trace.jsonl", 12031, 144_793_823, 3536.999),
        ("mooncake_synthetic_trace.jsonl", 3993, 61_194_628, 1022.025),
    ],
)
def test_real_mooncake(shared_dir, name, n, n_in, duration):
    tr = load_trace(f"mooncake:{shared_dir / 'traces' / name}", TraceOptions())
    assert len(tr.requests) == n and tr.meta["skipped_rows"] == 0
    assert tr.input_tokens_total() == n_in
    assert tr.requests[-1].arrival == pytest.approx(duration)
    assert all(len(r.input_tokens) == math.ceil(r.input_len / 512) for r in tr.requests)


def test_a_gzip_file_is_read_by_its_content_not_its_name(tmp_path):
    """A gzip file named like a plain one (``trace.jsonl``) is read as gzip (it was 'bad JSON:
    Expecting value (column 1)' on row 1), a plain file named ``.gz`` as plain text (it was
    'Not a gzipped file'), and another compression is one line saying to decompress it."""
    import gzip

    text = "".join(json.dumps(r) + "\n" for r in MOONCAKE)
    for name, data in (("gz.jsonl", gzip.compress(text.encode())), ("plain.jsonl.gz", text.encode())):
        p = tmp_path / name
        p.write_bytes(data)
        tr = load_trace(f"mooncake:{p}", TraceOptions())
        assert [r.input_tokens.tolist() for r in tr.requests] == [[0, 1, 2], [0, 1], [0, 3]]
        assert [r.input_len for r in tr.requests] == [1100, 1024, 600]
    for magic, kind in ((b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz"), (b"BZh91AY", "bzip2")):
        p = tmp_path / f"t.{kind}"
        p.write_bytes(magic + b"\x00" * 32)
        with pytest.raises(TraceError, match=rf"cannot read .*t\.{kind}: it is {kind}-compressed; decompress it first"):
            load_trace(f"mooncake:{p}", TraceOptions())


def test_bad_json_at_the_end_of_a_line_names_its_column(tmp_path):
    """A row cut short: the error is at the end of its text (column 36), not at 'column 1' of the
    line after (the newline was parsed with the row)."""
    p = _write(tmp_path / "m.jsonl", [MOONCAKE[0], '{"timestamp": 9, "input_length": 15'])
    with pytest.raises(TraceError, match=r"m\.jsonl:2: bad JSON: Expecting ',' delimiter \(column 36\)$"):
        load_trace(f"mooncake:{p}", TraceOptions())


@pytest.mark.parametrize("bad, shown", [(-1, "-1"), (2**64 - 1, "1.845e+19")])
def test_a_64_bit_hash_id_says_how_to_number_them(tmp_path, bad, shown):
    """A user's own hashes (Python's hash(), a signed or unsigned 64-bit digest) are out of the
    ids' range: the error says they only need to be equal where the blocks are."""
    p = _write(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, bad]}])
    with pytest.raises(TraceError) as exc:
        load_trace(f"mooncake:{p}", TraceOptions())
    assert str(exc.value) == (
        f"{p}:1: hash_ids holds {shown}, out of range [0, 2^63-1]: ids are only compared for equality, so number "
        "them 0, 1, 2, ... (in order of first appearance, say)"
    )


def test_a_trace_left_with_no_request_says_why(tmp_path):
    """An empty file and a file whose rows were all skipped said 'has no requests (after
    filtering)', though nothing filters these traces: now which of the two it is."""
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n \n")
    with pytest.raises(TraceError, match=r"e\.jsonl has no requests: the file holds no rows$"):
        load_trace(f"mooncake:{empty}", TraceOptions())
    bad = {"timestamp": 0, "input_length": 5, "hash_ids": [0]}
    for n, why in ((1, "its only row is bad"), (2, "all 2 of its rows are bad")):
        p = _write(tmp_path / f"b{n}.jsonl", [bad] * n)
        with pytest.raises(TraceError, match=rf"b{n}\.jsonl has no requests: {why} \(skipped: --skip-bad-rows\)$"):
            load_trace(f"mooncake:{p}", TraceOptions(skip_bad_rows=True))
