"""What round 6 left (docs/bad-input.md, round 7): ``sweep`` and ``advise`` load their traces in
workers and did not say a ``--session-range`` past the trace's end, which ``run``, ``replay`` and
``traces stats`` say on stderr. Through the real CLI in process, on a 2-session synthetic trace."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from refusals import one_line

SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
PAST = "note: --session-range 0:5: the trace has 2 sessions; running sessions 0:2 (2 sessions)"


def sweep(out, *extra, policy="sglang+", workers="1"):
    """``sweep`` of ``policy`` on the small trace into ``out``, then ``extra``."""
    return ["sweep", *SMALL, "--policy", policy, "--out", str(out), "--workers", workers, *extra]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sweep_says_a_session_range_past_the_trace(runner, tmp_path, workers):
    """sweep --session-range 0:5 on a 2-session trace ran the 2 sessions without a word (the
    workers load the trace); the note is said once, in the parent, as ``run`` says it."""
    res = runner.invoke(main, sweep(tmp_path / "sw", "--session-range", "0:5", workers=workers))
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == PAST
    assert "ran 1 configuration" in res.stdout


def test_sweep_says_each_range_past_the_trace_once_and_no_other(runner, tmp_path):
    """A session-range axis: each value past the end is said once (over the policy axis too), the
    others not at all."""
    args = sweep(tmp_path / "sw", "--session-range", "0:1,1:7,0:5", policy="sglang+,vllm+")
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert res.stderr.strip().splitlines() == [
        "note: --session-range 1:7: the trace has 2 sessions; running sessions 1:2 (1 session)",
        PAST,
    ]
    # a rerun runs nothing and says nothing
    res = runner.invoke(main, args)
    assert res.exit_code == 0 and res.stderr == "", res.output


@pytest.mark.parametrize("session_range", ["0:2", "1:", ""])
def test_sweep_within_the_trace_says_nothing(runner, tmp_path, session_range):
    extra = ["--session-range", session_range] if session_range else []
    res = runner.invoke(main, sweep(tmp_path / "sw", *extra))
    assert res.exit_code == 0, res.output
    assert res.stderr == ""


def test_sweep_a_range_past_every_session_still_fails_as_before(runner, tmp_path):
    """A range that keeps no session is the run's error (exit 2 in process), not a note."""
    res = runner.invoke(main, sweep(tmp_path / "sw", "--session-range", "5:9"))
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("Error: synthetic:chat:sessions=2,turns=2 sglang+ cap=5GB sps=1 [")
    assert err.endswith("]: --session-range 5:9: the trace has only 2 sessions")


ADVISE = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", *SMALL, "--trials", "1", "--workers", "1"]


@pytest.mark.parametrize("session_range, note", [("0:5", PAST), ("0:2", "")])
def test_advise_says_a_session_range_past_the_trace(runner, tmp_path, session_range, note):
    """advise --session-range 0:5 on a 2-session trace tuned on the 2 sessions without a word."""
    out = tmp_path / "adv"
    res = runner.invoke(main, [*ADVISE, "--session-range", session_range, "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == note
    assert json.loads(res.stdout)["trials"] == 1


def test_advise_a_range_past_every_session_is_refused_in_one_line(runner, tmp_path):
    """No session left: refused before any trial, as ``run`` refuses it, and no folder is left."""
    out = tmp_path / "adv"
    res = runner.invoke(main, [*ADVISE, "--session-range", "5:9", "--out", str(out)])
    one_line(res, "--session-range 5:9: the trace has only 2 sessions")
    assert not out.exists()
