"""Trace files in UTF-16 / UTF-32 (session 24's new-user hunt): Windows PowerShell's `>` writes
UTF-16 with a byte-order mark; a Mooncake file so written was "bad JSON: Expecting value (column 1);
the file looks like CSV", and the text loaders said "not UTF-8 text". Now every loader names the
encoding and the conversion."""

import gzip
import json

import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace

MOONCAKE = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}]
SHAREGPT = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]


def _opts(tmp_path):
    return TraceOptions(cache_dir=str(tmp_path / "cache"), min_rounds=1, sessions=0, num_proc=1)


@pytest.mark.parametrize(
    ("encoding", "name"),
    [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16LE"), ("utf-16-be", None), ("utf-32", "UTF-32")],
)
@pytest.mark.parametrize("kind", ["mooncake", "marconi-jsonl", "sharegpt", "lmsys", "swebench"])
def test_wide_text_is_named(tmp_path, kind, encoding, name):
    rows = SHAREGPT if kind in ("sharegpt", "lmsys", "swebench") else MOONCAKE
    f = tmp_path / "t.jsonl"
    f.write_bytes("".join(json.dumps(r) + "\n" for r in rows).encode(encoding))
    with pytest.raises(TraceError) as err:
        load_trace(f"{kind}:{f}", _opts(tmp_path))
    if name is None:  # big-endian without a mark starts with a NUL byte: not told apart, still one line
        assert "\n" not in str(err.value)
        return
    windows = " (what Windows PowerShell's '>' writes)" if name.startswith("UTF-16") else ""
    assert str(err.value) == (
        f"cannot read {f}: it is {name} text{windows}; convert it to UTF-8, e.g. iconv -f {name.lower()} -t utf-8"
    )


def test_wide_text_inside_gzip(tmp_path):
    f = tmp_path / "t.jsonl.gz"
    f.write_bytes(gzip.compress((json.dumps(MOONCAKE[0]) + "\n").encode("utf-16")))
    with pytest.raises(TraceError, match=r"it is UTF-16 text"):
        load_trace(f"mooncake:{f}", TraceOptions())


def test_utf8_with_and_without_mark_still_reads(tmp_path):
    for i, bom in enumerate((b"", b"\xef\xbb\xbf")):
        f = tmp_path / f"m{i}.jsonl"
        f.write_bytes(bom + (json.dumps(MOONCAKE[0]) + "\n").encode())
        assert len(load_trace(f"mooncake:{f}", TraceOptions()).requests) == 1
