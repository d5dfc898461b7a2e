"""The peer backends' GPU check (issue 24 parts 3 and 4), one command for the H200 run, under ~8
minutes of GPU time: the peer tests (``pytest -m gpu``), the launch-path and state-grid GPU tests,
the kernels' host time (direct vs Triton's launch path), the kernel benchmark with its FLA and
FlashQLA columns and host overheads, and a short replay on every backend, one after another.

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    python benchmarks/peer_check.py [--out DIR] [--dry-run]

A step that fails is reported and the next one still runs; the exit code is 1 if any failed.
``--dry-run`` prints the commands without running them (no GPU needed). Where FLA or FlashQLA is
not installed (or FlashQLA's GPU is not sm90 / sm100 / sm120) its tests skip with the reason,
its benchmark column is left out with a ``#`` line, and its replay exits 2 with one line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAT = "synthetic:chat:sessions=4,turns=3,prompt_tokens=2000,user_tokens=200,output_tokens=100,prompts=2"


def steps(out: Path) -> list[tuple[str, dict, list[str]]]:
    """``(name, extra environment, argv)`` of each step."""
    py = sys.executable
    replay = [
        py,
        "-c",
        "from sim.cli import main; main()",
        "replay",
        "--model",
        "qwen3.5-9b",
        "--trace",
        CHAT,
        "--layers",
        "4",
    ]
    replay += ["--no-progress", "--format", "json"]
    return [
        (
            "peer tests",
            {},
            [
                py,
                "-m",
                "pytest",
                "-m",
                "gpu",
                "-q",
                "-s",
                "-p",
                "no:cacheprovider",
                "tests/sim/replay/test_replay_peers_gpu.py",
            ],
        ),
        (
            "peer adapters (CPU tests, on this machine too)",
            {},
            [py, "-m", "pytest", "-q", "tests/sim/replay/test_replay_peers.py"],
        ),
        (
            "kernel launch path and state-grid variant (GPU tests)",
            {},
            [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
            + ["tests/kernels/test_launch.py", "tests/kernels/test_state_variants.py"],
        ),
        (
            "kernel host time: direct launches vs Triton's launch path",
            {},
            [py, "benchmarks/kernel_host_probe.py", "--shapes", "16/32,4/8", "--T", "32768,8192,4096"]
            + ["--calls", "60", "--top", "12"],
        ),
        (
            "kernel benchmark: ours / FLA / FlashQLA, host overhead",
            {"FLA_DISABLE_BACKEND_DISPATCH": "1"},
            [py, "benchmarks/kernel_bench.py", "--shapes", "16/32,4/8", "--T", "32768,8192,4096", "--rep", "100"]
            + ["--json", str(out / "kernel_bench_peers.json")],
        ),
        *[
            (f"replay --kernel {k}", {}, [*replay, "--kernel", k, "--out", str(out / f"replay-{k}"), "--force"])
            for k in ("ours", "fla", "flashqla")
        ],
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default="results/peer-check", help="folder for the benchmark JSON and the replays' outputs"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    failed = []
    env0 = dict(os.environ)
    env0["PYTHONPATH"] = os.pathsep.join(p for p in (env0.get("PYTHONPATH", ""), str(ROOT)) if p)
    for name, extra, cmd in steps(out):
        line = " ".join([*(f"{k}={v}" for k, v in extra.items()), *map(shlex.quote, cmd)])
        print(f"## {name}\n$ {line}", flush=True)
        if args.dry_run:
            continue
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT, env={**env0, **extra}).returncode
        print(f"## {name}: exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
        if rc not in (0, 5):  # 5: pytest collected nothing to run
            failed.append(name)
    if failed:
        print(f"## failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
