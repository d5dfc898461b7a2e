"""Is `--alpha auto` robust? The paper's ShareGPT grid, tuned hit rate beside the best static alpha and SGLang+.

For every configuration (capacity 1,2,3,4,5,10 GB x 0.25,0.5,1,2,5,10 sessions/s, 100 sessions) it runs

- ``sglang+``;
- ``marconi --alpha auto --tuner replay`` as the artifact tunes (FLOPs objective, replay of the bootstrap
  window from the trace start, alphas only: ``--no-tuning-lru``), the "artifact tuner";
- ``marconi --alpha auto`` with the defaults (``--tuner duel``: shadow caches for SGLang+'s LRU and a few
  alphas on the live stream, the best over the trailing window adopted), the "robust tuner"; its choice
  column is the candidate in use at the end of the run;
- every static alpha of the grid (``marconi-oracle``'s runs): the best in hindsight and its alpha;

and prints one row per configuration (token hit rates in %) plus where each tuner falls below SGLang+,
and the simulator time of the robust tuner beside one static-alpha run.

    python benchmarks/tuning_report.py                 # sequential mode, corrected compat
    python benchmarks/tuning_report.py --mode des --workers 2
    python benchmarks/tuning_report.py --objective hit-rate --compat paper
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CAPACITIES_GB = (1, 2, 3, 4, 5, 10)
RATES = (0.25, 0.5, 1, 2, 5, 10)

_TRACE = None


def _trace(spec: str, sessions: int):
    global _TRACE
    if _TRACE is None:
        from traces.registry import TraceOptions, load_trace

        _TRACE = load_trace(spec, TraceOptions(sessions=sessions, progress=False))
    return _TRACE


def one_config(args) -> dict:
    from policies.tuning import parse_grid
    from sim.config import SimConfig
    from sim.engine import Simulation

    spec, sessions, cap_gb, rate, mode, compat, objective, grid, tuner = args
    trace = _trace(spec, sessions)
    base = SimConfig(policy="marconi", capacity_bytes=int(cap_gb * 1e9), sessions_per_second=rate, mode=mode,
                     compat=compat, tuning_workers=1, alpha_grid=grid)
    t0 = time.perf_counter()
    row = {"cap_gb": cap_gb, "rate": rate}
    row["sglang+"] = Simulation(trace, dataclasses.replace(base, policy="sglang+")).run().summary["token_hit_rate"]
    art = Simulation(trace, dataclasses.replace(base, alpha="auto", tuner="replay", tuning_lru=False,
                                                tuning_objective=objective or "flops")).run().summary
    t1 = time.perf_counter()
    rob = Simulation(trace, dataclasses.replace(base, alpha="auto", tuner=tuner, tuning_objective=objective)).run().summary
    row["robust_s"] = time.perf_counter() - t1
    row["artifact"], row["artifact_choice"] = art["token_hit_rate"], art.get("tuned_choice")
    row["robust"], row["robust_choice"] = rob["token_hit_rate"], rob.get("tuned_choice")
    row["tuned_at"] = rob.get("tuned_at_request")
    best_a, best, static_s = None, -1.0, 0.0
    grid_alphas = parse_grid(grid)
    for a in grid_alphas:
        t1 = time.perf_counter()
        h = Simulation(trace, dataclasses.replace(base, alpha=a)).run().summary["token_hit_rate"]
        static_s += time.perf_counter() - t1
        if h > best:
            best_a, best = a, h
    row["static"], row["static_alpha"] = best, best_a
    row["static_s"] = static_s / len(grid_alphas)
    row["seconds"] = time.perf_counter() - t0
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="sharegpt")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--mode", default="sequential", choices=["sequential", "des"])
    ap.add_argument("--compat", default="corrected", choices=["corrected", "paper", "paper-fixed"])
    ap.add_argument("--objective", default=None, choices=["flops", "hit-rate"],
                    help="both tuners' objective [default: flops for the artifact tuner, the robust tuner's own]")
    ap.add_argument("--tuner", default=None, choices=["duel", "replay"],
                    help="the robust tuner [default: marconi's default for the compat mode]")
    ap.add_argument("--alpha-grid", default="0:2:0.1")
    ap.add_argument("--capacities", default=",".join(map(str, CAPACITIES_GB)))
    ap.add_argument("--rates", default=",".join(map(str, RATES)))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    caps = [float(x) for x in a.capacities.split(",")]
    rates = [float(x) for x in a.rates.split(",")]
    jobs = [(a.trace, a.sessions, c, r, a.mode, a.compat, a.objective, a.alpha_grid, a.tuner) for c in caps for r in rates]
    t0 = time.perf_counter()
    if a.workers <= 1:
        rows = [one_config(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=a.workers) as ex:
            rows = list(ex.map(one_config, jobs))
    print(f"trace {a.trace} ({a.sessions} sessions), mode {a.mode}, compat {a.compat}, objective "
          f"{a.objective or 'default'}, robust tuner {a.tuner or 'default'}; "
          f"token hit rate %")
    head = f"{'cap':>4} {'sps':>5} | {'sglang+':>7} | {'artifact tuner':>16} | {'robust tuner':>16} | {'best static':>14}"
    print(head)
    print("-" * len(head))
    lose_art, lose_rob = [], []
    for r in rows:
        flag_a = " <" if r["artifact"] < r["sglang+"] - 1e-12 else "  "
        flag_r = " <" if r["robust"] < r["sglang+"] - 1e-12 else "  "
        if flag_a.strip():
            lose_art.append(r)
        if flag_r.strip():
            lose_rob.append(r)
        print(f"{r['cap_gb']:>4g} {r['rate']:>5g} | {r['sglang+'] * 100:7.2f} | "
              f"{r['artifact'] * 100:6.2f} a={r['artifact_choice'] or '-':>4}{flag_a} | "
              f"{r['robust'] * 100:6.2f} a={r['robust_choice'] or '-':>4}{flag_r} | "
              f"{r['static'] * 100:6.2f} a={r['static_alpha']:g}")
    n = len(rows)
    mean = lambda k: sum(r[k] for r in rows) / n * 100  # noqa: E731
    print("-" * len(head))
    print(f"mean: sglang+ {mean('sglang+'):.2f}  artifact tuner {mean('artifact'):.2f}  robust tuner {mean('robust'):.2f}  "
          f"best static {mean('static'):.2f}")
    print(f"below sglang+: artifact tuner {len(lose_art)}/{n}, robust tuner {len(lose_rob)}/{n} "
          f"(worst {min((r['robust'] - r['sglang+'] for r in rows), default=0) * 100:+.2f} pp)")
    if lose_rob:
        print("robust tuner below sglang+ at (GB, sps): " + ", ".join(f"({r['cap_gb']:g}, {r['rate']:g})" for r in lose_rob))
    print(f"simulator time per run: robust tuner {sum(r['robust_s'] for r in rows) / n:.2f}s, "
          f"one static alpha {sum(r['static_s'] for r in rows) / n:.2f}s")
    print(f"wall time {time.perf_counter() - t0:.1f}s on {a.workers} worker(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
