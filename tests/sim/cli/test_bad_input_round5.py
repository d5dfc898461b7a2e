"""The fifth round of bad inputs (a new user bringing their own model, GPU and traces), through the
real CLI in a forked process (tests/forked_cli.py): every refusal is one line on stderr and exit 2,
never a traceback, and nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from forked_cli import shared_forks

ROOT = Path(__file__).resolve().parents[3]
# what these commands load (no torch: none of them replays); the same list as the sweep tests'
PRELOAD = ("numpy", "pandas", "pyarrow", "simpy", "tqdm", "matplotlib.pyplot", "sim.simulate", "sim.analysis.plot")
SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]


def marconi(*args, cwd: Path | None = None) -> tuple[int, str, str]:
    """``marconi ARGS`` forked from the test process's fork server: (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rc, out, err = shared_forks(env, PRELOAD).run(["marconi", *map(str, args)], timeout=120, cwd=cwd or Path.cwd())
    assert rc is not None, f"marconi {args} ran past its timeout"
    return rc, out, err


def one_line(result: tuple[int, str, str], message: str) -> None:
    rc, out, err = result
    assert rc == 2, (rc, out, err)
    text = err.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert text.startswith(f"Error: {message}"), text


ADVISE = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", "--trials", "1", "--workers", "1", "--no-progress"]


@pytest.mark.parametrize(
    "args, flag",
    [
        (ADVISE + ["--sessions-per-second", "5"], "--sessions-per-second"),
        (ADVISE + ["--arrival", "poisson"], "--arrival"),
        (["run", "--policy", "sglang+", "--no-progress", "--arrival", "poisson"], "--arrival"),
        (["sweep", "--policy", "sglang+", "--no-progress", "--arrival", "poisson"], "--arrival"),
    ],
    ids=["advise-rate", "advise-arrival", "run-arrival", "sweep-arrival"],
)
def test_arrival_options_on_a_timestamped_trace_are_refused(tmp_path, args, flag):
    """A Mooncake trace's requests arrive at its own times: advise took --sessions-per-second and
    printed `marconi run ... --sessions-per-second 5` lines that `marconi run` refuses; --arrival
    poisson changed nothing in run, sweep or advise."""
    out = tmp_path / "o"
    result = marconi(*args, "--trace", "mooncake:sample", "--out", out)
    one_line(result, f"{flag} does nothing for mooncake traces (their requests arrive at the trace's own times")
    assert not out.exists()
