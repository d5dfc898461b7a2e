"""The local process pool and a real local Ray give the same rows; each trace loads once per worker."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

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


def _caught(sig: int) -> bool:
    """Whether this process catches ``sig`` below Python (its handler, not the default action)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    raise AssertionError("no SigCgt line in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status")
def test_ray_engine_matches_local_engine(tmp_path, trace_files):
    ray = pytest.importorskip("ray")
    tasks = _grid(trace_files)
    run_sweep(tasks, tmp_path / "local", engine="local", workers=2, progress=False, save_requests=True)
    # the sweep starts its own Ray, as `marconi sweep --engine ray` does, with the CLI's stop handlers
    # installed: they are ours again below Python once the sweep has shut its Ray down (ray.shutdown
    # leaves SIGTERM at its default action there, so a SIGTERM as the sweep ends killed it outright)
    stops = (signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, lambda signum, frame: None) for s in stops}
    try:
        assert not ray.is_initialized() and all(_caught(s) for s in stops)
        rep = run_sweep(tasks, tmp_path / "ray", engine="ray", workers=2, progress=False, save_requests=True)
        assert not ray.is_initialized()  # a Ray the sweep started goes down with it
        assert [_caught(s) for s in stops] == [True, True]
    finally:
        ray.shutdown()
        for s, handler in before.items():
            signal.signal(s, handler)
    assert rep.ran == len(tasks) and not rep.failed
    local, remote = _comparable(tmp_path / "local"), _comparable(tmp_path / "ray")
    assert len(remote) == len(tasks)
    pd.testing.assert_frame_equal(local, remote)
    assert (_loads_per_worker(tmp_path / "ray") == 1).all()
    for kind in ("_requests", "_occupancy"):
        for f in row_files(tmp_path / "local" / kind):
            pd.testing.assert_frame_equal(pd.read_parquet(f), pd.read_parquet(tmp_path / "ray" / kind / f.name))


def test_a_rows_numbers_stay_numbers_and_its_nested_values_are_json_text(trace_files):
    """A sweep row is the run's summary: each number as the run gives it (a parquet column of
    numbers, not of text), and only a nested value (marconi-oracle's hit rate per alpha) as JSON
    text, which reads back to the run's own."""
    import json

    from sim.experiments.grid import make_task
    from sim.experiments.runners import _load_trace, execute
    from sim.simulate import simulate

    task = make_task({"trace": trace_files[0]}, policy="marconi-oracle", capacity_bytes=10**8, alpha_grid="0,1")
    row = execute(task)["row"]
    want = simulate(_load_trace(task.trace_kwargs)[0], task.config).summary.to_dict()
    assert json.loads(row["oracle_hit_rates"]) == want["oracle_hit_rates"] and len(want["oracle_hit_rates"]) == 2
    for key in ("token_hit_rate", "request_hit_rate", "ttft_p50_ms", "requests", "evictions", "tuned_alpha"):
        assert row[key] == want[key] and not isinstance(row[key], str), key


def test_run_sweep_takes_a_text_path_and_makes_its_parent_folders(tmp_path, trace_files):
    """``run_sweep(tasks, "a/b/c")``: the out folder as text, its parents made as needed (a library
    caller, not only the CLI, which makes the folder first)."""
    tasks = expand_grid({"trace": trace_files[:1]}, {"policy": ["sglang+"], "capacity_bytes": [10**8]})
    out = tmp_path / "a" / "b" / "c"
    rep = run_sweep(tasks, str(out), workers=1, progress=False)
    assert rep.ran == 1 and not rep.failed
    assert len(row_files(out)) == 1 and len(load_results(out)) == 1
    # one worker: run here, in this process (no pool to start)
    assert list(load_results(out)["worker_pid"]) == [os.getpid()]
    # the folder is made before anything runs: there even when nothing does (--limit 0)
    empty = tmp_path / "d" / "e"
    rep = run_sweep(tasks, str(empty), workers=1, progress=False, limit=0)
    assert (rep.total, rep.skipped, rep.ran) == (1, 0, 0) and empty.is_dir() and not any(empty.iterdir())


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_signal_while_the_pool_starts_stops_the_sweep_as_that_signal(tmp_path, trace_files, monkeypatch, sig, code):
    """A signal that lands while the worker pool starts (noted, then raised once the cleanup is armed)
    stops the sweep as that signal stops it: SIGTERM exits 143 and SIGHUP 129 (their stop is
    recorded), Ctrl-C 130; no row is written, no worker is left, and every handler the sweep swapped
    while the pool started is back as it was."""
    import sim.errors as errors
    import sim.experiments.runners as runners

    monkeypatch.setattr(errors, "_STOPPED_BY", [signal.SIGINT])
    workers = {}

    class Starting(runners.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            os.kill(os.getpid(), sig)

        def submit(self, *args, **kwargs):
            fut = super().submit(*args, **kwargs)
            workers.update(self._processes or {})
            return fut

    monkeypatch.setattr(runners, "ProcessPoolExecutor", Starting)
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in stops}
    tasks = _grid(trace_files)
    rep = run_sweep(tasks, tmp_path / "o", workers=2, progress=False)
    assert rep.interrupted and rep.ran == 0 and not row_files(tmp_path / "o")
    assert errors.stop_exit_code() == code
    assert {s: signal.getsignal(s) for s in stops} == before
    assert workers and not any(p.is_alive() for p in workers.values())


def test_a_rows_times_are_its_own_simulation_and_its_trace_load(trace_files):
    """``wall_s`` is the simulation's seconds and ``trace_load_s`` the trace's loading, each within
    the call's own time; a trace already held by the worker costs 0 to load."""
    import time

    from sim.experiments.grid import make_task
    from sim.experiments.runners import _TRACES, execute

    task = make_task({"trace": trace_files[1], "time_scale": 3.0}, policy="sglang+", capacity_bytes=10**8)
    _TRACES.clear()
    t0 = time.perf_counter()
    first = execute(task)["row"]
    elapsed = time.perf_counter() - t0
    assert 0 < first["wall_s"] < elapsed and 0 < first["trace_load_s"] < elapsed
    assert first["wall_s"] + first["trace_load_s"] <= elapsed
    t0 = time.perf_counter()
    again = execute(task)["row"]
    assert again["trace_load_s"] == 0.0 and 0 < again["wall_s"] < time.perf_counter() - t0


@pytest.mark.parametrize(
    "knobs,words",
    [
        ({"policy": "marconi", "alpha": 0.5}, "marconi alpha=0.5"),
        ({"policy": "marconi", "alpha": "auto"}, "marconi alpha=auto"),
        ({"policy": "sglang+", "alpha": 2.0}, "sglang+"),  # no alpha: none named
    ],
)
def test_describe_names_a_configuration_as_failures_and_refusals_print_it(knobs, words):
    from sim.experiments.grid import make_task
    from sim.experiments.runners import describe

    task = make_task({"trace": "synthetic:chat"}, capacity_bytes=2 * 10**8, sessions_per_second=0.5, **knobs)
    assert describe(task) == f"synthetic:chat {words} cap=0.2GB sps=0.5 [{task.config_id}]"


def test_a_worker_holds_the_last_four_traces_it_used(trace_files):
    """``TRACE_CACHE_SIZE`` traces per worker, the least recently used one dropped first."""
    from sim.experiments.runners import TRACE_CACHE_SIZE, _load_trace, _TRACES, loaded_trace_keys

    assert TRACE_CACHE_SIZE == 4
    _TRACES.clear()
    kw = [{"trace": trace_files[0], "time_scale": float(s)} for s in (1, 2, 3, 4, 5)]
    for k in kw[:4]:
        assert _load_trace(k)[1] > 0
    assert _load_trace(kw[0])[1] == 0.0  # used again: now the most recent
    _load_trace(kw[4])  # a fifth: the least recently used (the second) goes
    assert len(loaded_trace_keys()) == 4
    assert _load_trace(kw[0])[1] == 0.0 and _load_trace(kw[2])[1] == 0.0
    assert _load_trace(kw[1])[1] > 0  # loaded again
    _TRACES.clear()


def test_a_finished_pool_sweep_returns_after_its_workers_have_exited(tmp_path, trace_files, monkeypatch):
    """``run_sweep`` with a pool returns once every worker process has exited (shut down and
    joined), not while they are still winding down."""
    import sim.experiments.runners as runners

    workers = {}

    class Recording(runners.ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            fut = super().submit(*args, **kwargs)
            workers.update(self._processes or {})
            return fut

    monkeypatch.setattr(runners, "ProcessPoolExecutor", Recording)
    tasks = expand_grid({"trace": trace_files[:1]}, {"policy": ["sglang+", "vllm+"], "capacity_bytes": [10**8]})
    rep = run_sweep(tasks, tmp_path / "o", workers=2, progress=False)
    assert rep.ran == 2 and len(workers) == 2
    assert [p.exitcode for p in workers.values()] == [0, 0]
