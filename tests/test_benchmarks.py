"""Every script in benchmarks/ still runs (issue 20: two of them stopped parsing and nothing
noticed): each at its smallest size, or `--help` where it needs a GPU or minutes. The figures they
print are not checked here (they are measurements); only that the script runs to the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> (arguments of its smallest run, text its output must contain)
SMALLEST = {
    "sim_bench.py": (["--smoke"], "marconi"),
    "sweep_bench.py": (["--smoke"], "wall time"),
    "tuning_report.py": (
        ["--sessions", "2", "--capacities", "1", "--rates", "1", "--alpha-grid", "0:1:1", "--workers", "1"],
        "below sglang+",
    ),
    "trace_memory.py": (["--trace", "synthetic:chat", "--sessions", "2"], "cached load"),
    "mutation.py": (["--list", "-m", "cost", "--per-module", "2"], "cost"),
    "validation_sensitivity.py": (
        ["--dtype", "fp32", "--scales", "0.01", "--prompt", "70", "--kernel", "torch"],
        "caught",
    ),
    # host issue vs device time per call shape (a GPU's figures; on a CPU a smoke run)
    "replay_cost_probe.py": (
        ["--model", "replay-tiny", "--device", "cpu", "--small", "--reps", "1", "--suffixes", "25", "--prefixes", "0"],
        "device ms",
    ),
    # need a GPU (kernel_bench, kernel_host_probe, replay_bench) or compile kernels for minutes (kernel_resources is run
    # by tests/kernels/test_resources.py): their command line at least
    "kernel_bench.py": (["--help"], "usage"),
    "replay_bench.py": (["--help"], "usage"),
    "kernel_resources.py": (["--help"], "usage"),
    "kernel_host_probe.py": (["--help"], "usage"),
    # the peer backends' GPU check: its commands (the run needs a GPU and the peers)
    "peer_check.py": (["--dry-run"], "kernel_bench.py"),
    # needs an LMDeploy checkout and its dependencies (fetched outside CI)
    "differential_lmdeploy.py": (["--help"], "usage"),
}


def test_every_benchmark_is_listed():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(SMALLEST)


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_size(script, tmp_path):
    args, expect = SMALLEST[script]
    if script == "sweep_bench.py":
        args = [*args, "--out", str(tmp_path / "results")]  # not a folder of its own under /tmp
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)  # kernel_resources refuses the interpreter even for --help
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expect in proc.stdout, proc.stdout[-2000:]
