"""Hash-block traces as users bring them (session 24's new-user hunt): a Bailian file read as
Mooncake (and the reverse) says which spec reads it."""

import json

import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bailian_file_read_as_mooncake_names_bailian(tmp_path):
    # 33 tokens in 16-token blocks: 3 ids (Mooncake's 512-token blocks would be 1)
    f = _write(
        tmp_path / "b.jsonl",
        [
            {
                "chat_id": 1,
                "parent_chat_id": -1,
                "turn": 1,
                "timestamp": 0.5,
                "input_length": 33,
                "output_length": 4,
                "type": "text",
                "hash_ids": [0, 1, 2],
            }
        ],
    )
    with pytest.raises(TraceError) as err:
        load_trace(f"mooncake:{f}", TraceOptions())
    assert str(err.value) == (
        f"{f}:1: 3 hash_ids for input_length 33 (expected ceil(33/512) = 1): 16-token blocks, a Bailian "
        f"trace? --trace bailian:{f}"
    )
    trace = load_trace(f"bailian:{f}", TraceOptions())  # the spec it names reads it
    assert trace.requests[0].input_len == 33 and len(trace.requests[0].input_tokens) == 3


def test_mooncake_file_read_as_bailian_names_mooncake(tmp_path):
    f = _write(
        tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 1025, "output_length": 3, "hash_ids": [7, 8, 9]}]
    )
    with pytest.raises(TraceError, match=r"expected ceil\(1025/16\) = 65\): 512-token blocks, a Mooncake trace\?"):
        load_trace(f"bailian:{f}", TraceOptions())


def test_count_that_fits_neither_block_has_no_hint(tmp_path):
    f = _write(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [1, 2, 3]}])
    with pytest.raises(TraceError) as err:
        load_trace(f"mooncake:{f}", TraceOptions())
    assert str(err.value).endswith("3 hash_ids for input_length 100 (expected ceil(100/512) = 1)")
