"""The preset matrix's rows of session 26 (H100) as one table: python table.py (from this folder)."""

import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PEAK = 989.0  # H100 SXM dense bf16 TFLOP/s (the catalogue's)
print(
    "| row | hits (validated, KV) | failures | FLOPs saved executed / simulated | time error median / P95 (all prefills) "
    "| saved measured / modelled ms | check ms taken out | TFLOP/s timed (of peak) |"
)
print("|---|---|---:|---|---|---|---:|---|")
for f in sorted(glob.glob(os.path.join(HERE, "call*", "rows*", "*", "summary.json"))):
    s = json.load(open(f))["summary"]
    name = os.path.basename(os.path.dirname(f))
    import pandas as pd

    df = pd.read_parquet(os.path.join(os.path.dirname(f), "requests.parquet"))
    chk = df.loc[df.hit_tokens > 0, "full_ms_check"].sum()
    ex, si = s["measured_flops_saved"], s["simulated_flops_saved"]
    t = s.get("replay_tflops_timed") or float("nan")
    print(
        f"| {name} | {s['hits']} ({s['hits_validated']}, {s['kv_hits_validated']}) | {s['failures']} | "
        f"{ex:.4g} / {si:.4g} | {s['time_model_median_error']:.1%} / {s['time_model_p95_error']:.1%} | "
        f"{s['measured_ms_saved_validated']:.1f} / {s['modelled_ms_saved_validated']:.1f} | {chk:.1f} | "
        f"{t:.0f} ({t / PEAK:.1%}) |"
    )
