"""Simulator throughput and memory on the largest ShareGPT trace the package holds.

Every conversation with >= 2 rounds (about 30,000 requests, tokenization cached), each policy,
``sequential`` and ``des`` mode and ``des`` with ``--scheduler continuous`` (row ``continuous``),
one process pinned to one core. Then the same trace grown 10x (repeated with fresh session ids and
token ids) to show how speed and memory scale. ``--default-trace`` times the `marconi run` default
trace (ShareGPT, 100 sessions) instead.

    python benchmarks/sim_bench.py [--repeat 3] [--grow 10] [--capacity 5GB] [--modes sequential,des,continuous]
    python benchmarks/sim_bench.py --smoke          # 2 sessions, one policy, once: does it run?

Prints requests/s (median of --repeat runs; wall clock, and CPU time of the process, which a machine
shared with other jobs inflates less) and the peak resident memory of a fresh child process per
configuration (so one run's garbage does not inflate the next one's figure).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

POLICIES = ["vllm+", "sglang+", "marconi"]


MODES = ["sequential", "des", "continuous"]  # continuous: des with --scheduler continuous


def _load(grow: int, sessions: int = 0):
    import numpy as np

    from traces.base import Request, Trace
    from traces.registry import TraceOptions, load_trace

    if os.environ.get("SIM_BENCH_DEFAULT_TRACE"):
        base = load_trace("sharegpt", TraceOptions())
    else:
        base = load_trace("sharegpt", TraceOptions(sessions=sessions, min_rounds=2))
    if grow == 1:
        return base
    # fresh session ids and token ids per copy: copies never share prefixes with each other.
    # Requests are views into per-trace token buffers; each copy shifts the buffers once and
    # re-creates the same views, so the grown trace is stored as compactly as the base one.
    vocab = 1 + max(int(max(r.input_tokens.max(initial=0), r.output_tokens.max(initial=0))) for r in base.requests)
    n_sess = 1 + max(r.session_id for r in base.requests)

    def locate(a):
        root = a if a.base is None else a.base
        offset = (a.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // a.itemsize
        return root, offset, len(a)

    reqs = []
    for k in range(grow):
        shifted: dict[int, np.ndarray] = {}

        def view(a):
            root, offset, n = locate(a)
            buf = shifted.get(id(root))
            if buf is None:
                buf = shifted[id(root)] = root + k * vocab
            return buf[offset : offset + n]

        for r in base.requests:
            reqs.append(
                Request(
                    r.session_id + k * n_sess,
                    r.turn,
                    view(r.input_tokens),
                    view(r.output_tokens),
                    think_time=r.think_time,
                )
            )
    return Trace(f"sharegpt-x{grow}", reqs)


def child(policy: str, mode: str, grow: int, capacity: str, alpha: float, sessions: int = 0) -> None:
    """Run one configuration and print a JSON line (runs in a fresh process)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    from sim.config import SimConfig, parse_size
    from sim.simulate import simulate

    trace = _load(grow, sessions)
    sched = "continuous" if mode == "continuous" else "fcfs"
    cfg = SimConfig(
        policy=policy,
        mode="des" if sched == "continuous" else mode,
        scheduler=sched,
        capacity_bytes=parse_size(capacity),
        alpha=alpha,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(trace, cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "policy": policy,
                "mode": mode,
                "grow": grow,
                "requests": len(trace.requests),
                "seconds": wall,
                "req_per_s": len(trace.requests) / wall,
                "cpu_req_per_s": len(trace.requests) / cpu,
                "peak_mb": peak_mb,
                "token_hit_rate": res.summary["token_hit_rate"],
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--grow", type=int, default=10)
    ap.add_argument("--capacity", default="5GB")
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--default-trace", action="store_true", help="the `marconi run` default trace (100 sessions)")
    ap.add_argument("--sessions", type=int, default=0, help="first N conversations (0 = all)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="smallest run: --sessions 2 --repeat 1 --grow 2 --policies marconi (checks that the script runs)",
    )
    ap.add_argument("--child", nargs=4, metavar=("POLICY", "MODE", "GROW", "CAPACITY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.sessions, args.repeat, args.grow, args.policies = 2, 1, 2, "marconi"
    if args.child:
        policy, mode, grow, capacity = args.child
        child(policy, mode, int(grow), capacity, args.alpha, args.sessions)
        return
    if args.default_trace:
        os.environ["SIM_BENCH_DEFAULT_TRACE"] = "1"  # children inherit it
    _load(1, args.sessions)  # tokenize once (cached on disk) before timing anything
    print(
        f"{'policy':8} {'mode':10} {'x':>3} {'requests':>9} {'req/s (median)':>15} {'CPU req/s':>10} {'peak MB':>8} "
        f"{'hit':>7}"
    )
    for grow in (1, args.grow):
        for policy in args.policies.split(","):
            for mode in args.modes.split(","):
                runs = []
                for _ in range(args.repeat if grow == 1 else 1):
                    cmd = [
                        sys.executable,
                        __file__,
                        "--alpha",
                        str(args.alpha),
                        "--sessions",
                        str(args.sessions),
                        "--child",
                        policy,
                        mode,
                        str(grow),
                        args.capacity,
                    ]
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                rate = statistics.median(r["req_per_s"] for r in runs)
                cpu_rate = statistics.median(r["cpu_req_per_s"] for r in runs)
                peak = max(r["peak_mb"] for r in runs)
                r0 = runs[0]
                print(
                    f"{policy:8} {mode:10} {grow:>3} {r0['requests']:>9} {rate:>15,.0f} {cpu_rate:>10,.0f} "
                    f"{peak:>8,.0f} {r0['token_hit_rate']:>7.2%}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
