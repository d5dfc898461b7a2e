"""Shared fixtures: a tiny synthetic trace (marconi-jsonl, built here from traces.base requests)
and a helper running the `marconi` CLI in a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from forked_cli import shared_forks
from traces.base import Request, Trace

ROOT = Path(__file__).resolve().parents[3]


def synthetic_trace(sessions: int = 6, turns: int = 4, system: int = 700, seed: int = 0) -> Trace:
    """Sessions sharing a system prompt; each turn's input is the whole history plus a new user
    message, so later turns hit the cache. Open loop (arrival in seconds)."""
    rng = np.random.default_rng(seed)
    sys_prompt = rng.integers(0, 50_000, size=system)
    reqs = []
    for s in range(sessions):
        history = sys_prompt.copy()
        for t in range(turns):
            user = rng.integers(0, 50_000, size=int(rng.integers(50, 400)))
            out = rng.integers(0, 50_000, size=int(rng.integers(20, 200)))
            inp = np.concatenate([history, user])
            reqs.append(
                Request(session_id=s, turn=t, input_tokens=inp, output_tokens=out, arrival=float(s * 0.5 + t * 3.0))
            )
            history = np.concatenate([inp, out])
    reqs.sort(key=lambda r: (r.arrival, r.session_id))
    return Trace("synthetic-test", reqs, closed_loop=False)


def write_marconi_jsonl(trace: Trace, path: Path) -> Path:
    with open(path, "w") as f:
        for r in trace.requests:
            f.write(
                json.dumps(
                    {
                        "session_id": r.session_id,
                        "turn_id": r.turn,
                        "ts": r.arrival,
                        "num_input_tokens": len(r.input_tokens),
                        "num_output_tokens": len(r.output_tokens),
                        "input_tokens": r.input_tokens.tolist(),
                        "output_tokens": r.output_tokens.tolist(),
                    }
                )
                + "\n"
            )
    return path


@pytest.fixture(scope="session")
def trace_files(tmp_path_factory) -> list[str]:
    """Two trace specs (different seeds) of the synthetic workload."""
    d = tmp_path_factory.mktemp("traces")
    return [f"marconi-jsonl:{write_marconi_jsonl(synthetic_trace(seed=s), d / f'syn{s}.jsonl')}" for s in (0, 1)]


# what the sweeps and plots these tests run load (no torch: none of them replays)
SWEEP_MODULES = (
    "numpy",
    "pandas",
    "pyarrow",
    "simpy",
    "tqdm",
    "matplotlib.pyplot",
    "sim.simulate",
    "sim.analysis.plot",
)


def marconi(*args, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a process of its own: forked from tests/cli_forkserver.py (the CLI and its
    heavy imports loaded once per test process), or with ``kw`` (``subprocess.run``'s) a fresh
    ``python -c 'from sim.cli import main; main()' ...``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = ["marconi", *map(str, args)]
    if kw:
        proc = subprocess.run(
            [sys.executable, "-c", "from sim.cli import main; main()", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            **kw,
        )
    else:
        rc, out, err = shared_forks(env, SWEEP_MODULES).run(argv, timeout=timeout, cwd=Path.cwd())
        if rc is None:
            raise subprocess.TimeoutExpired(argv, timeout, out, err)
        proc = subprocess.CompletedProcess(argv, rc, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"marconi {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def marconi_popen(*args, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", "from sim.cli import main; main()", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )
