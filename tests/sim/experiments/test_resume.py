"""Resume: an interrupted sweep, rerun, gives the complete set of rows exactly once."""

from __future__ import annotations

import signal
import time

import pandas as pd

from sim.experiments.store import RUNTIME_COLUMNS, load_results, row_files

from .conftest import marconi, marconi_popen

GRID = ["--policy", "vllm+,sglang+,marconi", "--alpha", "0,1", "--capacity", "100MB,300MB,1GB",
        "--no-progress"]


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


def test_killed_sweep_resumes(tmp_path, trace_files):
    """SIGINT, then SIGKILL, a real sweep process mid-run; reruns finish the set, each row once."""
    out = tmp_path / "res"
    args = ["sweep", "--out", out, "--trace", ",".join(trace_files), *GRID, "--sessions-per-second", "1,2",
            "--seed", "0:1", "--workers", "1"]
    total = 2 * 2 * 2 * 3 * 4  # traces x rates x seeds x capacities x (vllm+, sglang+, marconi x 2 alphas)
    for sig in (signal.SIGINT, signal.SIGKILL):
        n0 = len(row_files(out)) if out.exists() else 0
        proc = marconi_popen(*args)
        deadline = time.monotonic() + 60
        while len(row_files(out)) < n0 + 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        n1 = len(row_files(out))
        assert n0 + 3 <= n1 < total, "the sweep should have been stopped part-way"
        if sig == signal.SIGINT:
            assert proc.returncode == 130
    done = _stamps(out)
    p = marconi(*args)
    assert f"already done: {len(done)}, to run: {total - len(done)}" in p.stdout
    rows = _rows(out)
    assert len(rows) == total and rows["config_id"].is_unique
    assert {k: v for k, v in _stamps(out).items() if k in done} == done
    assert set(rows["trace"]) == set(trace_files)
