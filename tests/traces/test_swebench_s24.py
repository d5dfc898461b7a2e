"""SWE-agent trajectory files as users bring them (session 24's new-user hunt): a .jsonl dataset
that starts with a UTF-8 byte-order mark, and trajectories saved as one JSON array in a .json file."""

import json
from pathlib import Path

import pytest

from traces.base import TraceError

from traces.registry import TraceOptions, load_trace

FIXTURES = Path(__file__).parent / "swebench_fixtures"
TRAJS = [FIXTURES / "demo_0x__humanevalfix-0.traj", FIXTURES / "fc__marshmallow-1867.traj"]


def _opts(tmp_path):
    return TraceOptions(cache_dir=str(tmp_path / "cache"), sessions=0)


def _tokens(trace):
    return [(r.session_id, r.input_tokens.tolist(), r.output_tokens.tolist()) for r in trace.requests]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The two fixture trajectories as a plain .jsonl dataset (one a line)."""
    tmp = tmp_path_factory.mktemp("ref")
    f = tmp / "plain.jsonl"
    f.write_text("".join(json.dumps(json.loads(p.read_text())) + "\n" for p in TRAJS))
    trace = load_trace(f"swebench:{f}", _opts(tmp))
    assert trace.n_sessions == 2 and len(trace.requests) == 16
    return _tokens(trace)


def test_jsonl_dataset_with_byte_order_mark(tmp_path, reference):
    """A BOM before row 1 (what Windows tools write first) stopped the load: 'f.jsonl:1: bad JSON:
    Unexpected UTF-8 BOM'; .traj files and the other loaders' JSONL already skipped it."""
    f = tmp_path / "bom.jsonl"
    rows = "".join(json.dumps(json.loads(p.read_text())) + "\r\n" for p in TRAJS)
    f.write_bytes(b"\xef\xbb\xbf" + rows.encode())
    assert _tokens(load_trace(f"swebench:{f}", _opts(tmp_path))) == reference


def test_json_array_of_trajectories(tmp_path, reference):
    """Trajectories saved together as one JSON array in a .json file are one session each (the
    array was read as one trajectory's message list: 'message 0 has no 'role'')."""
    f = tmp_path / "all.json"
    f.write_text(json.dumps([json.loads(p.read_text()) for p in TRAJS]))
    trace = load_trace(f"swebench:{f}", _opts(tmp_path))
    assert _tokens(trace) == reference
    assert trace.meta["trajectories"] == [f"{f}: trajectory 0", f"{f}: trajectory 1"]


def test_bare_message_list_is_still_one_trajectory(tmp_path):
    """A top-level list of messages (each with a role) stays one trajectory, not a list of them."""
    history = json.loads(TRAJS[1].read_text())["history"]
    f = tmp_path / "one.json"
    f.write_text(json.dumps(history))
    trace = load_trace(f"swebench:{f}", _opts(tmp_path))
    assert trace.n_sessions == 1 and trace.meta["trajectories"] == [str(f)]


def test_tokenizing_shows_a_progress_bar(tmp_path, monkeypatch, capsys, reference):
    """A folder of long trajectories tokenized for minutes (about 4 MB of text a second) with
    nothing on the screen; with progress on, a bar counts the trajectories (after PROGRESS_DELAY
    seconds, so a short load shows none), and the trace is the same with or without it."""
    import traces.swebench as swebench

    folder = tmp_path / "trajs"
    folder.mkdir()
    for p in TRAJS:
        (folder / p.name).write_text(p.read_text())
    monkeypatch.setattr(swebench, "PROGRESS_DELAY", 0)
    quiet = load_trace(f"swebench:{folder}", TraceOptions(use_cache=False, sessions=0, progress=False))
    assert "tokenizing" not in capsys.readouterr().err
    shown = load_trace(f"swebench:{folder}", TraceOptions(use_cache=False, sessions=0, progress=True))
    err = capsys.readouterr().err
    assert f"tokenizing swebench:{folder}" in err
    assert _tokens(shown) == _tokens(quiet) == reference


def test_no_request_says_why(tmp_path):
    """'has no requests (after filtering)' named no filter: now the cap, the bad rows or the empty
    file, whichever it is."""
    folder = tmp_path / "trajs"
    folder.mkdir()
    for p in TRAJS:
        (folder / p.name).write_text(p.read_text())
    with pytest.raises(TraceError) as err:
        load_trace(f"swebench:{folder}", TraceOptions(use_cache=False, max_tokens=10))
    assert str(err.value) == (
        f"trace swebench:{folder} has no requests: none of the 2 trajectories read makes a request within "
        "--max-tokens 10 (the first request is longer, or there is no step)"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{"b": 2}\n')
    with pytest.raises(TraceError) as err:
        load_trace(f"swebench:{bad}", TraceOptions(use_cache=False, skip_bad_rows=True))
    assert str(err.value) == (
        f"trace swebench:{bad} has no requests: all 2 of its trajectories are bad (skipped: --skip-bad-rows)"
    )
    mark = tmp_path / "mark.jsonl"
    mark.write_bytes(b"\xef\xbb\xbf\n\n")  # a byte-order mark alone was 'bad JSON: Expecting value'
    with pytest.raises(TraceError) as err:
        load_trace(f"swebench:{mark}", TraceOptions(use_cache=False))
    assert str(err.value) == f"trace swebench:{mark} has no requests: it holds no trajectories"
