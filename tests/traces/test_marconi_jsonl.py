import gzip
import json

import numpy as np
import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


def _row(sid, turn, ts, inp, out):
    return {
        "session_id": sid,
        "turn_id": turn,
        "ts": ts,
        "num_input_tokens": len(inp),
        "num_output_tokens": len(out),
        "input_tokens": inp,
        "output_tokens": out,
    }


ROWS = [
    _row(0, 0, 0.0, [1, 2, 3], [4, 5]),
    _row(1, 0, 0.5, [1, 2, 9], [8]),
    _row(0, 1, 2.0, [1, 2, 3, 4, 5, 6], [7]),
    _row(1, 1, 2.5, [1, 2, 7], [6]),  # does not extend its history: a new chain
]


def _write(path, rows, gz=False):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_load_small(tmp_path, gz):
    p = _write(tmp_path / ("t.jsonl.gz" if gz else "t.jsonl"), ROWS, gz)
    tr = load_trace(f"marconi-jsonl:{p}", TraceOptions())
    assert not tr.closed_loop and tr.block_tokens == 1
    assert len(tr.requests) == 4 and tr.n_sessions == 2
    assert [(r.session_id, r.turn, r.arrival) for r in tr.requests] == [
        (0, 0, 0.0),
        (1, 0, 0.5),
        (0, 1, 2.0),
        (1, 1, 2.5),
    ]
    assert [r.input_tokens.tolist() for r in tr.requests] == [row["input_tokens"] for row in ROWS]
    assert [r.output_tokens.tolist() for r in tr.requests] == [row["output_tokens"] for row in ROWS]
    assert tr.input_tokens_total() == 15 and tr.output_tokens_total() == 5
    r0, _, r2, _ = tr.requests
    assert np.shares_memory(r0.input_tokens, r2.input_tokens)  # history stored once


@pytest.mark.parametrize(
    "row, message",
    [
        ("not json", r"t\.jsonl:2: bad JSON"),
        ({k: v for k, v in ROWS[1].items() if k != "ts"}, r"t\.jsonl:2: missing field 'ts'"),
        ({**ROWS[1], "num_input_tokens": -3}, r"t\.jsonl:2: negative num_input_tokens -3"),
        ({**ROWS[1], "num_input_tokens": 4}, r"t\.jsonl:2: num_input_tokens 4 but 3 input_tokens"),
        (
            {**ROWS[1], "ts": -1.0},
            r"t\.jsonl:2: ts -1.0 goes backwards \(previous 0.0\): rows must be in time order, sort the file by ts$",
        ),
    ],
)
def test_bad_rows(tmp_path, row, message):
    p = _write(tmp_path / "t.jsonl", [ROWS[0], row, ROWS[2]])
    with pytest.raises(TraceError, match=message):
        load_trace(f"marconi-jsonl:{p}", TraceOptions())
    tr = load_trace(f"marconi-jsonl:{p}", TraceOptions(skip_bad_rows=True))
    assert len(tr.requests) == 2 and tr.meta["skipped_rows"] == 1


@pytest.mark.parametrize(
    "name, n, sessions, n_in, n_out",
    [
        ("tiny_chat.jsonl.gz", 240, 40, 455_595, 75_141),
        ("tiny_agent.jsonl.gz", 168, 12, 942_186, 14_259),
    ],
)
def test_golden_traces(shared_dir, name, n, sessions, n_in, n_out):
    tr = load_trace(f"marconi-jsonl:{shared_dir / 'golden' / name}", TraceOptions())
    assert len(tr.requests) == n and tr.n_sessions == sessions
    assert tr.input_tokens_total() == n_in and tr.output_tokens_total() == n_out
