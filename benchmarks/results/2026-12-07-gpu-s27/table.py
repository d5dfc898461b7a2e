"""The preset matrix's rows of session 27 (H100, callB/rows) as one table, the time columns scored with the
committed overlap-form timing (scores.csv, written by score_s27.py): python table.py (from this folder)."""

import glob
import json
import os

import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
PEAK = 989.0  # H100 SXM dense bf16 TFLOP/s (the catalogue's)
scores = pd.read_csv(os.path.join(HERE, "scores.csv"))
scores = scores[(scores["set"] == "s27 matrix") & (scores["timing"] == "s27 overlap")].set_index("run")
print(
    "| row | hits (validated, KV) | failures | FLOPs saved executed / simulated | time error median / P95 (all prefills) "
    "| time saved error | TFLOP/s timed (of peak) |"
)
print("|---|---|---:|---|---|---:|---|")
for f in sorted(glob.glob(os.path.join(HERE, "callB", "rows", "*", "summary.json"))):
    s = json.load(open(f))["summary"]
    name = os.path.basename(os.path.dirname(f))
    sc = scores.loc[name]
    ex, si = s["measured_flops_saved"], s["simulated_flops_saved"]
    t = s.get("replay_tflops_timed") or float("nan")
    print(
        f"| {name} | {s['hits']} ({s['hits_validated']}, {s['kv_hits_validated']}) | {s['failures']} | "
        f"{ex:.4g} / {si:.4g} | {sc['median']:.1f}% / {sc['p95']:.1f}% | {sc['saved']:+.0f}% | "
        f"{t:.0f} ({t / PEAK:.1%}) |"
    )
