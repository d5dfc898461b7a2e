"""The local process pool and a real local Ray give the same rows; each trace loads once per worker."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.experiments.grid import expand_grid
from sim.experiments.runners import run_sweep
from sim.experiments.store import RUNTIME_COLUMNS, load_results, row_files


def _grid(trace_files):
    return expand_grid(
        {"trace": trace_files},
        {
            "policy": ["vllm+", "sglang+", "marconi"],
            "capacity_bytes": [10**8, 3 * 10**8],
            "alpha": [0.0, 2.0],
            "sessions_per_second": [1.0],
        },
    )


def _comparable(out) -> pd.DataFrame:
    df = load_results(out).sort_values("config_id").reset_index(drop=True)
    return df[[c for c in df.columns if c not in RUNTIME_COLUMNS]]


def _loads_per_worker(out) -> pd.Series:
    df = load_results(out)
    return df[df["trace_load_s"] > 0].groupby(["worker_pid", "trace"]).size()


def test_local_pool_rows_match_inline_run(tmp_path, trace_files):
    tasks = _grid(trace_files)
    a = run_sweep(tasks, tmp_path / "inline", workers=1, progress=False)
    b = run_sweep(tasks, tmp_path / "pool", workers=2, progress=False)
    assert a.ran == b.ran == len(tasks) == 16 and not a.failed and not b.failed
    pd.testing.assert_frame_equal(_comparable(tmp_path / "inline"), _comparable(tmp_path / "pool"))
    assert (_loads_per_worker(tmp_path / "pool") == 1).all()
    assert load_results(tmp_path / "pool")["worker_pid"].nunique() == 2


def test_ray_engine_matches_local_engine(tmp_path, trace_files):
    ray = pytest.importorskip("ray")
    tasks = _grid(trace_files)
    run_sweep(tasks, tmp_path / "local", engine="local", workers=2, progress=False, save_requests=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rep = run_sweep(tasks, tmp_path / "ray", engine="ray", progress=False, save_requests=True)
    finally:
        ray.shutdown()
    assert rep.ran == len(tasks) and not rep.failed
    local, remote = _comparable(tmp_path / "local"), _comparable(tmp_path / "ray")
    assert len(remote) == len(tasks)
    pd.testing.assert_frame_equal(local, remote)
    assert (_loads_per_worker(tmp_path / "ray") == 1).all()
    for kind in ("_requests", "_occupancy"):
        for f in row_files(tmp_path / "local" / kind):
            pd.testing.assert_frame_equal(pd.read_parquet(f), pd.read_parquet(tmp_path / "ray" / kind / f.name))
