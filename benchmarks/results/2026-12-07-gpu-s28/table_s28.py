"""Session 28's preset-matrix rows (H100, callH2/rows: make test-gpu's replay half at this session's code, the
no-copy suffix output and the recorded sleep of session 27 in) as one table, beside session 27's rows of the same
H100 (before those two fixes). Time columns scored with the committed overlap-form H100 timing
(sim/data/h100-timing.json); the time saved's error with its 95 % bootstrap interval over the hits
(sim.replay.calibration.saved_error). From the repository root:

    .venv/bin/python benchmarks/results/2026-12-07-gpu-s28/table_s28.py
"""

from __future__ import annotations

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
S27 = HERE.parent / "2026-12-07-gpu-s27" / "callB" / "rows"


def untimed_gap(run) -> float:
    """The validated hits' untimed gap, reference less suffix (each call's time outside its buckets), summed."""
    t = run.table
    v = t[t["validated"].astype(bool) & t["full_ms"].notna()]
    kinds = ("attention", "gated_delta", "mlp", "other")
    full = v["full_ms"] - sum(v[f"full_ms_{k}"] for k in kinds)
    suffix = v["suffix_ms"] - sum(v[f"suffix_ms_{k}"] for k in kinds)
    return float((full - suffix).sum())


def main() -> int:
    timing = read_timing_file(ROOT / "sim" / "data" / "h100-timing.json").with_gpus(1)
    before = {run.name: run for run, _, _ in tf.load_runs(S27)}
    print(
        "| row | hits (validated, KV) | failures | FLOPs saved executed / simulated | time error median / P95 (all "
        "prefills) | time saved error [95 %] | s27 (before the fixes) | untimed gap ms, s27 -> s28 | TFLOP/s timed "
        "(of peak) |"
    )
    print("|---|---|---:|---|---|---|---|---|---|")
    for run, _, _ in tf.load_runs(HERE / "callH2" / "rows"):
        s = json.loads((HERE / "callH2" / "rows" / run.name / "summary.json").read_text())["summary"]
        e = request_errors(run, timing)
        a = e["error"].abs().replace([np.inf, -np.inf], np.nan).dropna()
        err, lo, hi = saved_error(e)
        old = before.get(run.name)
        oerr, olo, ohi = saved_error(request_errors(old, timing)) if old is not None else (np.nan,) * 3
        gap = f"{untimed_gap(old):+.1f} -> {untimed_gap(run):+.1f}" if old is not None else "-"
        t = s.get("replay_tflops_timed") or float("nan")
        ex, si = s["measured_flops_saved"], s["simulated_flops_saved"]
        print(
            f"| {run.name} | {s['hits']} ({s['hits_validated']}, {s['kv_hits_validated']}) | {s['failures']} | "
            f"{ex:.4g} / {si:.4g} | {100 * a.median():.1f}% / {100 * a.quantile(0.95):.1f}% | "
            f"{100 * err:+.0f}% [{100 * lo:+.0f}, {100 * hi:+.0f}] | {100 * oerr:+.0f}% [{100 * olo:+.0f}, {100 * ohi:+.0f}] | "
            f"{gap} | {t:.0f} ({t / PEAK:.1%}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
