"""Session 25's mutation run on the trace loaders: one test per surviving mutant that was no
equivalent, each with exact values on a hand-made file of a few records."""

from __future__ import annotations

import json

import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace

from tests.traces.test_marconi_jsonl import _row


def _opts(tmp_path, **kw):
    kw.setdefault("min_rounds", 1)
    kw.setdefault("sessions", 0)
    return TraceOptions(cache_dir=str(tmp_path / "cache"), num_proc=1, **kw)


def _conv(cid: str, n_rounds: int) -> dict:
    msgs = []
    for i in range(n_rounds):
        msgs += [{"from": "human", "value": f"question {i} of {cid}"}, {"from": "gpt", "value": f"answer {i}"}]
    return {"id": cid, "conversations": msgs}


# --------------------------------------------------------------------------- sharegpt
def test_sharegpt_none_selected_names_the_most_rounds(tmp_path):
    """sharegpt.py:397 (``read[1] = max(...)`` dropped): the line said "the most is 0"."""
    f = tmp_path / "few.json"
    f.write_text(json.dumps([_conv("a", 1), _conv("b", 3), _conv("c", 2)]))
    with pytest.raises(TraceError) as exc:
        load_trace(f"sharegpt:{f}", _opts(tmp_path, min_rounds=5))
    assert "none of its 3 conversations has 5 or more rounds (a round: a message and its reply; the most is 3)" in str(
        exc.value
    )


def test_sharegpt_cut_file_counts_its_complete_records(tmp_path):
    """sharegpt.py:434 (``stats.get(0, "records")``): the count of complete records before the cut
    (the CLI's note) was the string "records"."""
    text = json.dumps([_conv("a", 2), _conv("b", 1), _conv("c", 2)], indent=1)
    f = tmp_path / "cut.json"
    f.write_text(text[: text.index('"c"') + 5])  # stops inside record c
    tr = load_trace(f"sharegpt:{f}", _opts(tmp_path))
    assert tr.meta["conversation_ids"] == ["a", "b"]
    assert tr.meta["truncated_after_records"] == 2


# --------------------------------------------------------------------------- lmsys
def _lmsys_rows(n: int, rounds: int = 2) -> list[dict]:
    out = []
    for k in range(n):
        conv = []
        for i in range(rounds):
            conv += [{"role": "user", "content": f"question {i} of chat {k}"}, {"role": "assistant", "content": "ok"}]
        out.append({"conversation_id": f"c{k}", "conversation": conv, "turn": rounds})
    return out


def test_lmsys_sessions_keeps_exactly_that_many(tmp_path):
    """lmsys.py:173 (``kept = 1``): --sessions 2 kept one conversation."""
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in _lmsys_rows(4)))
    tr = load_trace(f"lmsys:{f}", _opts(tmp_path, sessions=2))
    assert tr.meta["conversation_ids"] == ["c0", "c1"] and tr.n_sessions == 2 and len(tr.requests) == 4


def test_lmsys_none_selected_says_which_filter(tmp_path):
    """lmsys.py:208 (``not short``): rounds too few read as "mostly non-ASCII", and the reverse."""
    russian = {"conversation_id": "r", "conversation": [{"role": "user", "content": "привет"}], "turn": 3}
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in [*_lmsys_rows(2, rounds=1), russian]))
    with pytest.raises(TraceError) as exc:
        load_trace(f"lmsys:{f}", _opts(tmp_path, min_rounds=2))
    assert str(exc.value).endswith(
        "has no requests: none of its 3 conversations has 2 or more rounds and at most 50% non-ASCII text "
        "(2 have fewer rounds, the most 3: lower --min-rounds)"
    )
    f.write_text(json.dumps(russian) + "\n")
    with pytest.raises(TraceError) as exc:
        load_trace(f"lmsys:{f}", _opts(tmp_path, min_rounds=2))
    assert str(exc.value).endswith("has no requests: each of its 1 conversations is more than 50% non-ASCII text")


# --------------------------------------------------------------------------- swebench
def _swe_messages(first_obs) -> list[dict]:
    """A system prompt, the task, then four steps; the first step's observation is ``first_obs``."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "the task"}]
    for i, obs in enumerate([first_obs, "o1", "o2", "o3"]):
        msgs += [{"role": "assistant", "content": f"act {i}"}, {"role": "user", "content": obs}]
    return msgs


def test_swebench_text_parts_collapse_like_a_string(tmp_path, qwen):
    """swebench.py:162 (images counted from 1): an elided observation given as a list of text parts
    became "Old environment output: (2 lines omitted) (1 images omitted)"; it is the same request as
    the same text given as a string."""
    traces = []
    for name, obs in [("str", "line one\nline two"), ("parts", [{"type": "text", "text": "line one\nline two"}])]:
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"messages": _swe_messages(obs)}))
        traces.append(load_trace(f"swebench:{f}", _opts(tmp_path, keep_observations=1)))
    a, b = traces
    assert [r.input_tokens.tolist() for r in a.requests] == [r.input_tokens.tolist() for r in b.requests]
    last = qwen._qwen.decode(b.requests[3].input_tokens.tolist())  # step 3: observations 0 and 1 elided
    assert "<|im_start|>user\nOld environment output: (2 lines omitted)<|im_end|>\n" in last
    assert "images omitted" not in last and last.count("lines omitted") == 2


def test_swebench_huge_number_names_the_error(tmp_path):
    """swebench.py:287 (``_first_line`` returning None): "bad JSON: None" for a 5,000-digit number,
    in a .traj file and on a JSON Lines line."""
    big = "1" * 5000
    f = tmp_path / "big.traj"
    f.write_text('{"history": [{"role": "user", "content": "x", "n": ' + big + "}]}")
    with pytest.raises(TraceError, match=r"big\.traj: bad JSON: Exceeds the limit \(4300 digits\) for integer string"):
        load_trace(f"swebench:{f}", _opts(tmp_path))
    g = tmp_path / "rows.jsonl"
    g.write_text(json.dumps({"messages": _swe_messages("o")}) + '\n{"n": ' + big + "}\n")
    with pytest.raises(TraceError, match=r"rows\.jsonl:2: bad JSON: Exceeds the limit \(4300 digits\)"):
        load_trace(f"swebench:{g}", _opts(tmp_path))


def test_swebench_json_array_of_step_trajectories(tmp_path):
    """swebench.py:406 (``isinstance(list, x.get("trajectory"))``): a JSON array of trajectories
    that have only ``trajectory`` steps (response / observation) was a TypeError."""
    one = {"trajectory": [{"response": f"r{i}", "observation": f"o{i}"} for i in range(3)]}
    f = tmp_path / "steps.json"
    f.write_text(json.dumps([one, {"trajectory": one["trajectory"][:2]}]))
    tr = load_trace(f"swebench:{f}", _opts(tmp_path))
    assert [len(v) for v in tr.sessions().values()] == [3, 2]


# --------------------------------------------------------------------------- jsonl (the JSON Lines reader)
def _bad_first_row(tmp_path, first_line: str) -> str:
    f = tmp_path / "t.jsonl"
    f.write_text(first_line + "\n")
    with pytest.raises(TraceError) as exc:
        load_trace(f"marconi-jsonl:{f}", _opts(tmp_path))
    return str(exc.value).removeprefix(f"{f}:")


def test_jsonl_csv_hint_for_tabs_not_for_plain_text(tmp_path):
    """jsonl.py:66 (``"\\t" not in text``): a tab-separated header lost its hint, and a line of
    plain words was called CSV."""
    lines = "a marconi-jsonl trace is JSON Lines (one JSON object a line)"
    assert _bad_first_row(tmp_path, "session_id\tturn_id\tts") == (
        f"1: bad JSON: Expecting value (column 1); the file looks like CSV: {lines}"
    )
    assert _bad_first_row(tmp_path, "hello") == "1: bad JSON: Expecting value (column 1)"


def test_jsonl_bad_row_without_hint_ends_at_its_column(tmp_path):
    """jsonl.py:68 (``return None``): a bad first row that is no CSV or array ended "(column 18)None"."""
    assert _bad_first_row(tmp_path, '{"session_id": 1,}') == (
        "1: bad JSON: Expecting property name enclosed in double quotes (column 18)"
    )


class _Bar:
    """tqdm's stand-in: records what the reader sets the bar to."""

    made: list = []

    def __init__(self, total=None, **kw):
        self.total, self.n, self.updates, self.closed = total, 0, [], False
        _Bar.made.append(self)

    def update(self, k):
        self.n += k
        self.updates.append(k)

    def close(self):
        self.closed = True


def test_jsonl_progress_bar_counts_characters_every_20000_lines(tmp_path, monkeypatch):
    """jsonl.py:92-93 (the bar updated on every other line than each 20,000th; ``done + bar.n``): the
    bar moves by the characters read, once every 20,000 lines."""
    import tqdm

    from traces import jsonl

    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    monkeypatch.setattr(jsonl, "PROGRESS_BYTES", 1)
    monkeypatch.setattr(_Bar, "made", [])
    f = tmp_path / "rows.jsonl"
    f.write_text("{}\n" * 45_000)  # 3 characters a line
    rows = list(jsonl.JsonlReader(f, progress=True))
    assert len(rows) == 45_000
    (bar,) = _Bar.made
    assert bar.total == 135_000 and bar.updates == [60_000, 60_000] and bar.n == 120_000 and bar.closed


# --------------------------------------------------------------------------- marconi-jsonl
def _marconi_row(sid, turn, ts, inp, out) -> str:
    return json.dumps(_row(sid, turn, ts, inp, out))


def test_marconi_jsonl_one_input_token_is_a_request_none_is_refused(tmp_path):
    """marconi_jsonl.py:36 (``n_in == 1``): a one-token prompt was refused, and an empty one read."""
    f = tmp_path / "t.jsonl"
    f.write_text(_marconi_row(0, 0, 0.0, [7], [8, 9]) + "\n" + _marconi_row(1, 0, 1.0, [], [5]) + "\n")
    with pytest.raises(TraceError) as exc:
        load_trace(f"marconi-jsonl:{f}", _opts(tmp_path))
    assert str(exc.value) == f"{f}:2: num_input_tokens 0: a request needs at least one input token"
    tr = load_trace(f"marconi-jsonl:{f}", _opts(tmp_path, skip_bad_rows=True))
    assert [(r.input_tokens.tolist(), r.output_tokens.tolist()) for r in tr.requests] == [([7], [8, 9])]
    assert tr.meta["skipped_rows"] == 1


def test_marconi_jsonl_one_bad_row_and_nothing_else(tmp_path):
    """marconi_jsonl.py:74 (``n == 0``): one skipped row was "all 1 of its rows are bad"."""
    f = tmp_path / "one.jsonl"
    f.write_text('{"session_id": 1}\n')
    with pytest.raises(TraceError) as exc:
        load_trace(f"marconi-jsonl:{f}", _opts(tmp_path, skip_bad_rows=True))
    assert str(exc.value) == f"trace marconi-jsonl:{f} has no requests: its only row is bad (skipped: --skip-bad-rows)"


# --------------------------------------------------------------------------- sessions (--session-range)
def test_session_range_parsed_start_left_out_is_zero():
    """sessions.py:22 (``else 1``): ":2" kept sessions 1:2, not the first two."""
    from traces.sessions import parse_session_range

    assert parse_session_range(":2") == (0, 2)
    assert parse_session_range(" 3 : ") == (3, None)


@pytest.mark.parametrize("text", ["-1:2", "-1:", "2:2", "3:1"])
def test_session_range_refuses_a_negative_start_or_an_empty_slice(text):
    """sessions.py:26 (``and`` for ``or``): -1:2 and 3:1 were taken (a negative start, a stop
    before the start) and -1: too."""
    from traces.sessions import parse_session_range

    with pytest.raises(TraceError) as exc:
        parse_session_range(text)
    assert str(exc.value) == f"--session-range {text!r}: need 0 <= START < STOP"


def _small_trace(closed_loop: bool = True):
    import numpy as np

    from traces.base import Request, Trace

    def req(sid, turn):
        return Request(sid, turn, np.array([sid, turn]), np.array([1]), think_time=1.0 + turn, arrival=float(turn))

    # sessions in order of first appearance: 5, 9, 7
    reqs = [req(5, 0), req(9, 0), req(5, 1), req(7, 0), req(9, 1), req(7, 1)]
    return Trace("t", reqs, block_tokens=2, closed_loop=closed_loop, meta={"source": "x"})


def test_select_sessions_keeps_a_slice_by_first_appearance():
    """sessions.py:36-43: START:STOP counts sessions in order of first appearance, STOP exclusive."""
    from traces.sessions import select_sessions

    tr = select_sessions(_small_trace(), "1:")
    assert [(r.session_id, r.turn) for r in tr.requests] == [(9, 0), (7, 0), (9, 1), (7, 1)]  # file order
    assert tr.name == "t" and tr.block_tokens == 2 and tr.closed_loop
    assert tr.meta == {"source": "x", "session_range": "1:", "sessions_total": 3}
    tr = select_sessions(_small_trace(closed_loop=False), "0:2")
    assert [(r.session_id, r.turn) for r in tr.requests] == [(5, 0), (9, 0), (5, 1), (9, 1)]
    assert not tr.closed_loop
    with pytest.raises(TraceError) as exc:
        select_sessions(_small_trace(), "3:5")
    assert str(exc.value) == "--session-range 3:5: the trace has only 3 sessions"


# --------------------------------------------------------------------------- arrivals
def test_session_starts_default_seed_is_zero_and_no_sessions_is_empty():
    """arrivals.py:18 (the default ``seed`` 1): Poisson starts drawn without a seed are seed 0's."""
    import numpy as np

    from traces.arrivals import session_starts

    gaps = np.random.default_rng(0).exponential(0.5, size=4)
    expected = [0.0, *np.cumsum(gaps[:-1]).tolist()]
    assert session_starts(4, 2.0, poisson=True).tolist() == expected
    assert session_starts(4, 2.0, poisson=True, seed=0).tolist() == expected
    assert session_starts(0, 2.0).tolist() == [] and session_starts(0, 2.0, poisson=True).tolist() == []
    with pytest.raises(TraceError) as exc:
        session_starts(-1, 2.0)
    assert str(exc.value) == "number of sessions must be >= 0"
