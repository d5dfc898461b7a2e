"""`marconi advise` rules at their edges (sim/experiments/advise/space.py, search.py; issue 44): a
study interrupted before, during and after its first trial resumes to the very study an
uninterrupted run makes; holdouts other than 0.5 split where the rounding says; the printed `marconi
run` lines reproduce the prediction at capacities that do not round cleanly."""

from __future__ import annotations

import json
import os
import shlex
import signal

import pytest

from sim.cost import get_model
from sim.errors import UsageError
from sim.experiments.advise import search
from sim.experiments.advise.search import Evaluator, Problem, open_study, run_study, split_ranges
from sim.experiments.advise.space import build_space, parse_gpu_memory

from .conftest import synthetic_trace, write_marconi_jsonl

optuna = pytest.importorskip("optuna")

TINY = get_model("replay-tiny")


@pytest.fixture(scope="module")
def chat_spec(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("chat") / "t.jsonl"
    return f"marconi-jsonl:{write_marconi_jsonl(synthetic_trace(sessions=4, turns=2), path)}"


def cli(*args):
    from click.testing import CliRunner

    from sim.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def trials(study) -> list:
    return [(t.number, t.params, t.value, t.state.name) for t in study.get_trials(deepcopy=False)]


# ------------------------------------------------------------------------------ holdouts


@pytest.mark.parametrize(
    "n,holdout,tuned,held",
    [
        (7, 0.3, "0:5", "5:"),  # 7 x 0.7 = 4.9 -> 5 (rounded, not truncated)
        (10, 0.25, "0:8", "8:"),  # 7.5 -> 8
        (6, 0.25, "0:4", "4:"),  # 4.5 -> 4 (round half to even)
        (3, 0.5, "0:2", "2:"),  # 1.5 -> 2
        (9, 0.1, "0:8", "8:"),  # 8.1 -> 8
        (2, 0.5, "0:1", "1:"),
        (100, 0.99, "0:1", "1:"),
        (100, 0.01, "0:99", "99:"),
    ],
)
def test_split_ranges_rounds_the_tuned_part(n, holdout, tuned, held):
    assert split_ranges(n, holdout) == (tuned, held)


@pytest.mark.parametrize("n,holdout", [(2, 0.1), (2, 0.9), (10, 0.04), (10, 0.96), (1, 0.5)])
def test_a_holdout_that_empties_a_part_is_one_line(n, holdout):
    with pytest.raises(UsageError, match=f"--holdout {holdout:g} of {n} sessions leaves a part without"):
        split_ranges(n, holdout)


@pytest.mark.parametrize("holdout", [0.0, 1.0, -0.2, 1.5])
def test_a_holdout_outside_the_open_interval_is_refused(holdout):
    with pytest.raises(UsageError, match=r"--holdout must be in \(0, 1\)"):
        split_ranges(10, holdout)


# ------------------------------------------------------------------------------ interrupts


def problem(spec, **kw):
    return Problem({"trace": spec}, "sglang", "replay-tiny", "2MB", **kw)


def reference(tmp_path, spec, n):
    """The study an uninterrupted run makes (the same seed)."""
    p = problem(spec)
    sp = build_space("sglang", TINY, parse_gpu_memory(p.gpu_memory))
    study, new = open_study(tmp_path / "ref", p, "maximize")
    assert new
    with Evaluator("local", 1) as ev:
        rep = run_study(study, sp, p, {"trace": spec}, n, ev, progress=False)
    assert rep.ran == n and not rep.interrupted
    return trials(study), sp, p


def resume(tmp_path, name, sp, p, spec, n):
    study, new = open_study(tmp_path / name, p, "maximize")
    assert not new
    with Evaluator("local", 1) as ev:
        rep = run_study(study, sp, p, {"trace": spec}, n, ev, progress=False)
    return study, rep


@pytest.mark.parametrize("at_call", [1, 2])
def test_an_interrupt_before_a_trial_finishes_resumes_to_the_same_study(tmp_path, chat_spec, monkeypatch, at_call):
    """``at_call`` 1: the interrupt comes while the first trial (today's defaults, enqueued) runs;
    2: after the first trial is told, while the second runs. The interrupted trial is left RUNNING
    and rerun with its own parameters; the finished ones are not run again; the resumed study
    equals the uninterrupted one."""
    n = 4
    ref, sp, p = reference(tmp_path, chat_spec, n)
    real = Evaluator.map
    calls = []

    def flaky(self, tasks):
        calls.append(len(tasks))
        if len(calls) == at_call:
            raise KeyboardInterrupt
        return real(self, tasks)

    monkeypatch.setattr(Evaluator, "map", flaky)
    study, new = open_study(tmp_path / "cut", p, "maximize")
    with Evaluator("local", 1) as ev:
        rep = run_study(study, sp, p, {"trace": chat_spec}, n, ev, progress=False)
    assert rep.interrupted and rep.ran == at_call - 1
    assert [t[3] for t in trials(study)] == ["COMPLETE"] * (at_call - 1) + ["RUNNING"]
    assert trials(study)[0][1] == ref[0][1]  # the first trial is today's defaults either way
    calls.clear()
    monkeypatch.setattr(Evaluator, "map", real)
    study, rep = resume(tmp_path, "cut", sp, p, chat_spec, n)
    assert (rep.kept, rep.resumed, rep.ran, rep.interrupted) == (at_call - 1, 1, n - at_call + 1, False)
    assert trials(study) == ref


def test_an_interrupt_while_the_first_result_is_written_keeps_it(tmp_path, chat_spec, monkeypatch):
    """SIGINT arrives inside the journal write of the first trial's result: the write completes
    (the signal is held back), then the study stops; the trial is kept COMPLETE and the resume runs
    only the rest."""
    n = 3
    ref, sp, p = reference(tmp_path, chat_spec, n)
    study, _ = open_study(tmp_path / "mid", p, "maximize")
    real_tell = type(study).tell
    told = []

    def tell(self, trial, *a, **kw):
        if not told:
            os.kill(os.getpid(), signal.SIGINT)  # delivered now: the guard must hold it
        told.append(trial)
        return real_tell(self, trial, *a, **kw)

    monkeypatch.setattr(type(study), "tell", tell)
    with Evaluator("local", 1) as ev:
        rep = run_study(study, sp, p, {"trace": chat_spec}, n, ev, progress=False)
    monkeypatch.setattr(type(study), "tell", real_tell)
    assert rep.interrupted
    assert [t[3] for t in trials(study)] == ["COMPLETE"]
    assert trials(study)[0] == ref[0]
    study, rep = resume(tmp_path, "mid", sp, p, chat_spec, n)
    assert (rep.kept, rep.resumed, rep.ran) == (1, 0, n - 1)
    assert trials(study) == ref


def test_an_interrupt_after_the_budget_is_spent_changes_nothing(tmp_path, chat_spec):
    n = 2
    ref, sp, p = reference(tmp_path, chat_spec, n)
    study, rep = resume(tmp_path, "ref", sp, p, chat_spec, n)
    assert (rep.kept, rep.ran, rep.resumed) == (n, 0, 0) and trials(study) == ref
    # a larger budget continues the same study where it stopped
    study, rep = resume(tmp_path, "ref", sp, p, chat_spec, n + 1)
    assert rep.ran == 1 and trials(study)[:n] == ref


# ------------------------------------------------------------------------------ reproduce lines


def run_json(line: str) -> dict:
    words = shlex.split(line)
    assert words[:2] == ["marconi", "run"]
    res = cli(*words[1:])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    return row


@pytest.mark.parametrize("gpu_memory,holdout", [("2345679B", "0.3"), ("2.2MB", "0.75")])
def test_the_run_lines_reproduce_the_prediction_at_an_awkward_capacity(tmp_path, gpu_memory, holdout):
    """A memory that is no round number of bytes and a holdout other than 0.5 (7 sessions): the
    printed `marconi run` lines (tuned and held-out part, recommendation and defaults) give exactly
    the predicted metrics, and they size the cache the search simulated (--capacity to the byte,
    or the engine's --gpu-memory)."""
    spec = f"marconi-jsonl:{write_marconi_jsonl(synthetic_trace(sessions=7, turns=2), tmp_path / 't.jsonl')}"
    res = cli(
        "advise",
        "--trace",
        spec,
        "--for",
        "sglang",
        "--model",
        "replay-tiny",
        "--gpu-memory",
        gpu_memory,
        "--trials",
        "3",
        "--holdout",
        holdout,
        "--workers",
        "1",
        "--out",
        tmp_path / "adv",
        "--no-progress",
        "--format",
        "json",
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    k = {"0.3": 5, "0.75": 2}[holdout]  # 7 x 0.7 = 4.9 -> 5; 7 x 0.25 = 1.75 -> 2
    assert data["parts"] == [f"0:{k}", f"{k}:"]
    cap = data["cache_bytes"]
    for who in ("recommended", "defaults"):
        for part, line in (("tuned", "marconi_run"), ("held_out", "marconi_run_held_out")):
            words = shlex.split(data[who][line])
            if "--capacity" in words:  # the cache the search simulated, to the byte
                assert int(words[words.index("--capacity") + 1]) == int(cap)
            else:  # or the engine's own memory knob, which sizes the same cache
                assert "--gpu-memory" in words
            assert words[words.index("--session-range") + 1] == ("0:" if part == "tuned" else "") + (
                f"{k}" if part == "tuned" else f"{k}:"
            )
            row = run_json(data[who][line])
            for key in ("token_hit_rate", "ttft_p95_ms", "ttft_p50_ms", "request_hit_rate", "evictions"):
                assert row[key] == data[who][part][key], (who, part, key)


def test_run_line_writes_floats_that_read_back_exactly():
    assert search._word(0.1 + 0.2) == "0.30000000000000004"
    assert float(search._word(1 / 3)) == 1 / 3
    assert search._word(7) == "7" and search._word("x") == "x"


def test_a_study_gives_back_the_ctrl_c_handler_and_never_runs_past_its_budget(tmp_path, chat_spec):
    """After run_study (finished or interrupted) SIGINT is handled as before it; with more workers
    than trials left, only the trials left are asked (3 trials, 2 at a time: 2 + 1, not 2 + 2)."""
    p = problem(chat_spec)
    sp = build_space("sglang", TINY, parse_gpu_memory(p.gpu_memory))
    before = signal.getsignal(signal.SIGINT)
    study, _ = open_study(tmp_path / "w", p, "maximize")
    with Evaluator("local", 1) as ev:
        ev.workers = 2  # asks two trials a round; runs them in this process
        rep = run_study(study, sp, p, {"trace": chat_spec}, 3, ev, progress=False)
    assert signal.getsignal(signal.SIGINT) is before
    assert rep.ran == 3 and len(study.get_trials()) == 3


def test_run_line_spells_a_non_default_switch():
    """A --x/--no-x switch away from its default is on the line (the line must rebuild the task's
    SimConfig); at its default it is left out."""
    from sim.config import SimConfig
    from sim.experiments.grid import make_task

    task = make_task(
        {"trace": "synthetic:chat", "sessions": 2}, policy="vllm", enable_mamba_shared_prefix_checkpoint=True
    )
    words = shlex.split(search.run_line(task))
    assert "--enable-mamba-shared-prefix-checkpoint" in words
    assert SimConfig().enable_mamba_shared_prefix_checkpoint is False
    plain = shlex.split(search.run_line(make_task({"trace": "synthetic:chat", "sessions": 2}, policy="vllm")))
    assert not any("shared-prefix-checkpoint" in w for w in plain)


def test_pick_best_breaks_ties_by_the_other_metric_then_the_earlier_trial():
    from types import SimpleNamespace as Row

    rows = [
        Row(number=0, value=50.0, metrics={"token_hit_rate": 0.2, "ttft_p95_ms": 50.0}),
        Row(number=1, value=40.0, metrics={"token_hit_rate": 0.1, "ttft_p95_ms": 40.0}),
        Row(number=2, value=40.0, metrics={"token_hit_rate": 0.3, "ttft_p95_ms": 40.0}),
        Row(number=3, value=40.0, metrics={"token_hit_rate": 0.3, "ttft_p95_ms": 40.0}),
    ]
    assert search.pick_best(rows, "ttft-p95").number == 2  # lowest TTFT, then most hits, then first
    hits = [
        Row(number=0, value=0.5, metrics={"ttft_p95_ms": 30.0}),
        Row(number=1, value=0.6, metrics={"ttft_p95_ms": 90.0}),
        Row(number=2, value=0.6, metrics={"ttft_p95_ms": 80.0}),
        Row(number=3, value=0.6, metrics={"ttft_p95_ms": 80.0}),
    ]
    assert search.pick_best(hits, "token-hit").number == 2  # most hits, then lowest TTFT, then first


@pytest.mark.parametrize("objective,direction", [("token-hit", "maximize"), ("ttft-p95", "minimize")])
def test_the_progress_bar_shows_the_best_value_so_far_and_on_resume(tmp_path, chat_spec, capsys, objective, direction):
    """The bar counts the trials and shows the best objective value: the highest hit rate or the
    lowest TTFT, after a fresh run and on a resume of the finished study (read from the journal)."""
    # trtllm: its default takes no snapshot (no hit), the sampled intervals do: the values differ
    p = Problem({"trace": chat_spec}, "trtllm", "replay-tiny", "2MB", objective=objective)
    sp = build_space("trtllm", TINY, parse_gpu_memory(p.gpu_memory))
    study, _ = open_study(tmp_path / objective, p, direction)
    with Evaluator("local", 1) as ev:
        run_study(study, sp, p, {"trace": chat_spec}, 3, ev, progress=True)
    values = [t.value for t in study.get_trials() if t.value is not None]
    assert len(set(values)) > 1
    best = max(values) if direction == "maximize" else min(values)
    err = capsys.readouterr().err.replace("\r", "\n")
    assert "3/3" in err and f"best {objective} {search._fmt(objective, best)}" in err.splitlines()[-1] + err
    study, _ = open_study(tmp_path / objective, p, direction)
    with Evaluator("local", 1) as ev:
        run_study(study, sp, p, {"trace": chat_spec}, 3, ev, progress=True)
    err = capsys.readouterr().err.replace("\r", "\n")
    shown = [ln for ln in err.splitlines() if f"best {objective}" in ln]
    assert shown and all(f"best {objective} {search._fmt(objective, best)}" in ln for ln in shown)


def test_best_value_of_a_resumed_study_is_the_direction_s_best():
    """The progress bar's "best" after a resume: the lowest value of a minimising study, the
    highest of a maximising one; none before any trial completed (search._best_value)."""
    from optuna.trial import TrialState, create_trial

    trials = [create_trial(value=v, state=TrialState.COMPLETE) for v in (3.5, 1.25, 2.0)]
    assert search._best_value(trials, "minimize") == 1.25
    assert search._best_value(trials, "maximize") == 3.5
    assert search._best_value([], "minimize") is None


class _FakeRay:
    """An in-process stand-in for the ``ray`` module: records what the Evaluator hands it."""

    def __init__(self):
        self.inits, self.submitted, self.got, self.down = [], [], 0, 0
        self._up = False

    def is_initialized(self):
        return self._up

    def init(self, **kw):
        self._up = True
        self.inits.append(kw)

    def remote(self, **opts):
        fake = self

        def wrap(fn):
            class Remote:
                @staticmethod
                def remote(task):
                    fake.submitted.append(task)
                    try:
                        return fn(task)
                    except Exception as exc:  # noqa: BLE001 - as Ray hands a task's error back
                        return exc

            return Remote

        return wrap

    def get(self, ref):
        self.got += 1
        if isinstance(ref, Exception):
            raise ref
        return ref

    def shutdown(self):
        self.down += 1
        self._up = False


def test_ray_engine_sends_every_task_to_ray_and_ends_the_ray_it_started(monkeypatch):
    """--engine ray: each trial is submitted to Ray and its result fetched from it (not run in this
    process by the local path), in order; a Ray the Evaluator started is shut down on exit, and a
    worker's error comes back as that trial's result."""
    import sys

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(search, "execute", lambda t: {"task": t} if t != "bad" else 1 / 0)
    with Evaluator(engine="ray", workers=2) as ev:
        out = ev.map(["a", "b", "bad"])
    assert fake.submitted == ["a", "b", "bad"] and fake.got == 3
    assert out[:2] == [{"task": "a"}, {"task": "b"}] and isinstance(out[2], ZeroDivisionError)
    assert fake.inits == [dict(num_cpus=2, include_dashboard=False, log_to_driver=False)]
    assert fake.down == 1
