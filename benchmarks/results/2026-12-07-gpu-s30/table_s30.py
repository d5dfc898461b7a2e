"""Session 30's preset-matrix rows (H100, callG/rows: make test-gpu's replay half with the fused SSD program as the
Hopper default) beside session 28's rows of the same kind of H100 (the two SSD kernels then). Time columns scored
with the committed H100 timing (sim/data/h100-timing.json), as session 28's table. From the repository root:

    .venv/bin/python benchmarks/results/2026-12-07-gpu-s30/table_s30.py

Another session's rows beside these (session 31: the stall retime's first GPU run):

    .venv/bin/python benchmarks/results/2026-12-07-gpu-s30/table_s30.py \
        --rows benchmarks/results/2026-12-07-gpu-s31/callA/rows --before benchmarks/results/2026-12-07-gpu-s30/callG/rows
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing_fit as tf  # noqa: E402
from sim.cost import read_timing_file  # noqa: E402
from sim.replay.calibration import request_errors, saved_error  # noqa: E402

PEAK = 989.0  # H100 SXM dense bf16 TFLOP/s (the catalogue's)
S28 = HERE.parent / "2026-12-07-gpu-s28" / "callH2" / "rows"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, default=HERE / "callG" / "rows", help="the rows scored")
    ap.add_argument("--before", type=Path, default=S28, help="the earlier rows beside them")
    args = ap.parse_args()
    rows, earlier = args.rows, args.before
    timing = read_timing_file(ROOT / "sim" / "data" / "h100-timing.json").with_gpus(1)
    before = {run.name: run for run, _, _ in tf.load_runs(earlier)}
    old_tflops = {
        p.name: json.loads((p / "summary.json").read_text())["summary"].get("replay_tflops_timed")
        for p in earlier.iterdir()
    }
    print(
        "| row | hits (validated, KV) | failures | FLOPs saved executed / simulated | time error median / P95 (all "
        "prefills) | time saved error [95 %] | before: time saved error | TFLOP/s timed before -> now (of peak) "
        "| timed again (suffixes + references) |"
    )
    print("|---|---|---:|---|---|---|---|---|---|")
    for run, _, _ in tf.load_runs(rows):
        s = json.loads((rows / run.name / "summary.json").read_text())["summary"]
        e = request_errors(run, timing)
        a = e["error"].abs().replace([np.inf, -np.inf], np.nan).dropna()
        err, lo, hi = saved_error(e)
        old = before.get(run.name)
        oerr, olo, ohi = saved_error(request_errors(old, timing)) if old is not None else (np.nan,) * 3
        t = s.get("replay_tflops_timed") or float("nan")
        ot = old_tflops.get(run.name) or float("nan")
        ex, si = s["measured_flops_saved"], s["simulated_flops_saved"]
        print(
            f"| {run.name} | {s['hits']} ({s['hits_validated']}, {s['kv_hits_validated']}) | {s['failures']} | "
            f"{ex:.4g} / {si:.4g} | {100 * a.median():.1f}% / {100 * a.quantile(0.95):.1f}% | "
            f"{100 * err:+.0f}% [{100 * lo:+.0f}, {100 * hi:+.0f}] | {100 * oerr:+.0f}% [{100 * olo:+.0f}, {100 * ohi:+.0f}] | "
            f"{ot:.0f} -> {t:.0f} ({t / PEAK:.1%}) | {s.get('retimed_prefills', 0)} + {s.get('retimed_references', 0)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
