"""Resume: an interrupted sweep, rerun, gives the complete set of rows exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pandas as pd

from sim.experiments.store import RUNTIME_COLUMNS, load_results, row_files

from .conftest import ROOT, marconi

GRID = ["--policy", "vllm+,sglang+,marconi", "--alpha", "0,1", "--capacity", "100MB,300MB,1GB", "--no-progress"]


def _rows(out) -> pd.DataFrame:
    return load_results(out).sort_values("config_id").reset_index(drop=True)


def _stamps(out) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in row_files(out)}


def test_resume_after_partial_run_completes_exactly_once(tmp_path, trace_files):
    out, ref = tmp_path / "res", tmp_path / "ref"
    args = ["--trace", trace_files[0], *GRID, "--workers", "2"]
    first = marconi("sweep", "--out", out, *args, "--limit", "5")
    assert "ran 5 configurations" in first.stdout
    before = _stamps(out)
    assert len(before) == 5
    again = marconi("sweep", "--out", out, *args)
    assert "already done: 5, to run: 7" in again.stdout and "ran 7 configurations" in again.stdout
    after = _stamps(out)
    assert len(after) == 12
    assert {k: after[k] for k in before} == before  # the first five were not rewritten
    assert "ran 0 configurations" in marconi("sweep", "--out", out, *args).stdout
    assert _stamps(out) == after
    # the same rows as one uninterrupted sweep
    marconi("sweep", "--out", ref, *args)
    a, b = _rows(out), _rows(ref)
    assert a["config_id"].is_unique and list(a["config_id"]) == list(b["config_id"])
    cols = [c for c in a.columns if c not in RUNTIME_COLUMNS]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_missing_detail_file_makes_its_configuration_run_again(tmp_path, trace_files):
    from sim.experiments.grid import expand_grid
    from sim.experiments.runners import run_sweep
    from sim.experiments.store import _detail_paths, row_path

    out = tmp_path / "res"
    tasks = expand_grid({"trace": trace_files[:1]}, {"policy": ["vllm+", "marconi"], "capacity_bytes": [10**9]})
    rep = run_sweep(tasks, out, workers=1, save_requests=True, progress=False)
    assert rep.ran == 2 and not rep.failed
    req, occ = _detail_paths(out, tasks[0].config_id)
    rows_before = {t.config_id: row_path(out, t.config_id).stat().st_mtime_ns for t in tasks}
    req.unlink()
    rep = run_sweep(tasks, out, workers=1, save_requests=True, progress=False)
    assert (rep.skipped, rep.ran) == (1, 1)
    assert req.exists() and occ.exists()
    # the row marks completion and is written once; the other configuration is untouched
    assert {t.config_id: row_path(out, t.config_id).stat().st_mtime_ns for t in tasks} == rows_before
    # without --save-requests a missing detail file does not matter
    occ.unlink()
    rep = run_sweep(tasks, out, workers=1, save_requests=False, progress=False)
    assert (rep.skipped, rep.ran) == (2, 0)


# `marconi sweep ...` in a subprocess whose run_sweep signals its own process right after the N-th
# row is written: the interruption lands at a known point, not wherever a timer happens to.
SELF_SIGNAL = """
import os, sys
import sim.experiments.runners as runners
sig, after = int(sys.argv[1]), int(sys.argv[2])
real = runners.run_sweep

def run_sweep(*args, **kwargs):
    done = 0

    def on_result(task, result):
        nonlocal done
        done += 1
        if done == after:
            os.kill(os.getpid(), sig)

    return real(*args, **{**kwargs, "on_result": on_result})

runners.run_sweep = run_sweep
from sim.cli import main
sys.argv = ["marconi", *sys.argv[3:]]
main()
"""


def _sweep_signalled(sig, after, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", SELF_SIGNAL, str(int(sig)), str(after), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_killed_sweep_resumes(tmp_path, trace_files):
    """SIGINT, then SIGKILL, a real sweep process right after its 3rd new row; reruns finish the
    set, each row once."""
    out = tmp_path / "res"
    args = [
        "sweep",
        "--out",
        out,
        "--trace",
        ",".join(trace_files),
        *GRID,
        "--time-scale",  # the artifact's JSONL traces are open loop: their arrival times stretch
        "1,2",
        "--max-num-seqs",  # two engine sizes (--seed drew nothing under uniform arrivals)
        "255:256",
        "--workers",
        "1",
    ]
    total = 2 * 2 * 2 * 3 * 4  # traces x time scales x engine sizes x capacities x (vllm+, sglang+, marconi x 2 alphas)
    for sig in (signal.SIGINT, signal.SIGKILL):
        n0 = len(row_files(out)) if out.exists() else 0
        proc = _sweep_signalled(sig, 3, *args)
        assert len(row_files(out)) == n0 + 3, proc.stderr
        if sig == signal.SIGINT:
            assert proc.returncode == 130 and "interrupted: rerun the same command" in proc.stderr
        else:
            assert proc.returncode == -signal.SIGKILL
        assert not list(out.glob(".tmp-*"))  # no temp file left by a write
    done = _stamps(out)
    assert len(done) == 6
    p = marconi(*args)
    assert f"already done: 6, to run: {total - 6}" in p.stdout
    rows = _rows(out)
    assert len(rows) == total and rows["config_id"].is_unique
    assert {k: v for k, v in _stamps(out).items() if k in done} == done
    assert set(rows["trace"]) == set(trace_files)
