"""Ctrl-C is one line and exit 130 wherever it lands: an interrupt that arrives while a thread waits
on a future's lock can leave the lock unheld, and the lock's release then raises RuntimeError
("cannot release un-acquired lock") with the interrupt as its context (seen once in CI in
``test_advise.py::test_ctrl_c_keeps_finished_trials_and_the_rerun_finishes``). ``interrupted``
recognises both; the advisor's pool, its study loop, the sweep and the CLI treat both as Ctrl-C."""

import pytest

from sim.errors import interrupted
from sim.experiments.advise.search import Evaluator


def _lock_release_error():
    """The error CPython raises in that case: RuntimeError, the interrupt as its context."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot release un-acquired lock")  # noqa: B904 - the context is the point
    except RuntimeError as exc:
        return exc


def test_interrupted_sees_the_interrupt_and_its_aftermath_only():
    assert interrupted(KeyboardInterrupt())
    assert interrupted(_lock_release_error())
    assert not interrupted(RuntimeError("other"))
    assert not interrupted(None)
    a, b = RuntimeError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a  # a cycle ends the walk
    assert not interrupted(a)


class _Future:
    def __init__(self, exc=None):
        self.exc, self.cancelled = exc, False

    def exception(self):
        if self.exc is not None:
            raise self.exc
        return None

    def result(self):
        return "done"

    def cancel(self):
        self.cancelled = True


class _Pool:
    def __init__(self, futures):
        self.futures = iter(futures)

    def submit(self, fn, task):
        return next(self.futures)


def test_the_advisors_pool_turns_an_interrupted_wait_into_ctrl_c():
    futures = [_Future(), _Future(_lock_release_error()), _Future()]
    ev = Evaluator(workers=2)
    ev._pool = _Pool(futures)
    with pytest.raises(KeyboardInterrupt):
        ev.map(["t0", "t1", "t2"])
    assert all(f.cancelled for f in futures)
    # any other error is not a Ctrl-C: it propagates as it is
    ev._pool = _Pool([_Future(RuntimeError("broken pool"))])
    with pytest.raises(RuntimeError, match="broken pool"):
        ev.map(["t0"])
    ev._pool = _Pool([_Future(), _Future()])
    assert ev.map(["t0", "t1"]) == ["done", "done"]


def test_the_cli_turns_an_interrupted_wait_into_one_line_and_130():
    import click
    from click.testing import CliRunner

    from sim.cli import Main

    @click.group(cls=Main)
    def cli():
        pass

    @cli.command()
    def waits():
        raise _lock_release_error()

    @cli.command()
    def breaks():
        raise RuntimeError("broken")

    res = CliRunner().invoke(cli, ["waits"])
    assert res.exit_code == 130 and res.output.strip().splitlines() == ["Interrupted."], res.output
    res = CliRunner().invoke(cli, ["breaks"])
    assert res.exit_code == 1 and isinstance(res.exception, RuntimeError)  # not a Ctrl-C: left as it is
