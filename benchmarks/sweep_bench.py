"""Wall time of the paper's ShareGPT grid through `marconi sweep`'s engine.

Grid: ShareGPT (100 sessions) x capacities 1,2,3,4,5,10 GB x session rates 0.25,0.5,1,2,5,10 x
policies vllm+, sglang+, marconi (alpha auto once the tuner exists, else --alpha) = 108
configurations. Target: under 10 minutes on 2 cores (CI's machine).

    python benchmarks/sweep_bench.py [--workers 2] [--alpha auto|0.5] [--engine local|ray] [--out DIR]
    python benchmarks/sweep_bench.py --smoke    # 2 sessions, 1 GB, 1 session/s: does it run?

The trace is tokenized (or read from the trace cache) once before the clock starts; that time is
reported apart. A fresh temp folder is used unless --out is given (then finished rows are skipped,
so pass an empty folder to time the whole grid).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

CAPACITIES_GB = [1, 2, 3, 4, 5, 10]
RATES = [0.25, 0.5, 1, 2, 5, 10]
POLICIES = ["vllm+", "sglang+", "marconi"]
TARGET_S = 600


def auto_alpha_available() -> bool:
    import numpy as np

    from sim.config import SimConfig
    from sim.errors import UsageError
    from sim.simulate import build
    from traces.base import Request, Trace

    tiny = Trace("probe", [Request(0, 0, np.arange(8), np.arange(2), arrival=0.0)], closed_loop=False)
    try:
        build(tiny, SimConfig(policy="marconi", alpha="auto", capacity_bytes=10**9))
        return True
    except UsageError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--alpha", default=None, help="marconi's alpha (default: auto when available, else 0)")
    ap.add_argument("--engine", default="local", choices=["local", "ray"])
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="smallest grid: --sessions 2, 1 GB, 1 session/s, 1 worker")
    args = ap.parse_args()
    capacities, rates = CAPACITIES_GB, RATES
    if args.smoke:
        args.sessions, args.workers, capacities, rates = 2, 1, [1], [1]

    from sim.experiments.grid import expand_grid
    from sim.experiments.runners import _load_trace, run_sweep
    from sim.experiments.store import load_results

    alpha = args.alpha
    if alpha is None:
        alpha = "auto" if auto_alpha_available() else "0"
    alpha_val = alpha if alpha == "auto" else float(alpha)
    trace_kwargs = {"trace": "sharegpt", "sessions": args.sessions}
    t0 = time.perf_counter()
    trace, _ = _load_trace(trace_kwargs)  # fills the on-disk trace cache the workers read
    prep = time.perf_counter() - t0
    tasks = expand_grid(
        {k: [v] for k, v in trace_kwargs.items()},
        {
            "policy": POLICIES,
            "capacity_bytes": [c * 10**9 for c in capacities],
            "sessions_per_second": [float(r) for r in rates],
            "alpha": [alpha_val],
        },
    )
    out = args.out or tempfile.mkdtemp(prefix="sweep-bench-")
    print(
        f"ShareGPT grid: {len(tasks)} configurations ({len(trace.requests)} requests, "
        f"{trace.input_tokens_total():,} input tokens), marconi alpha={alpha}, {args.workers} workers "
        f"({args.engine}), {os.cpu_count()} cores; trace ready in {prep:.1f} s"
    )
    rep = run_sweep(tasks, out, engine=args.engine, workers=args.workers, progress=True)
    rows = load_results(out)
    sim_s = rows["wall_s"].sum()
    print(
        f"wall time: {rep.wall_s:.1f} s for {rep.ran} configurations ({rep.skipped} already done, "
        f"{len(rep.failed)} failed); {sim_s:.1f} s of simulation summed over workers; "
        f"slowest config {rows['wall_s'].max():.1f} s"
    )
    for policy, g in rows.groupby("policy"):
        print(
            f"  {policy:<8} mean token hit rate {g['token_hit_rate'].mean() * 100:6.2f}%  "
            f"sim time {g['wall_s'].sum():7.1f} s"
        )
    verdict = "PASS" if rep.wall_s < TARGET_S and not rep.failed else "FAIL"
    print(f"{verdict}: {rep.wall_s:.1f} s (target < {TARGET_S} s on 2 cores); results in {out}")


if __name__ == "__main__":
    main()
