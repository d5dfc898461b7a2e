"""Session 19: the prefills session 17 measured on an H100 (../2026-12-06-gpu-s17/last-reprice.csv,
4 layers, 60 requests a run) priced three ways: the committed H200 timing as it is (what that CSV
holds: reproduced here to 1e-9 before anything else), the H200 timing carried to the H100 by
the datasheets as ``marconi run --gpu h100`` and now ``marconi replay`` on an H100 price it
(``sim.replay.calibration.replay_timing``), and the same with the fitted per-GB terms also scaled
by the bandwidth ratio (a candidate, not adopted), and session 17's candidate with the resumed-call
term (``../2026-12-06-time41/h200-timing-resume.json``, committed as ``sim/data/h200-timing.json``
in session 19) carried the same way. The CSV does not record a call's splits: each
row takes the split count (0-2) that reproduces its recorded H200 price.

    .venv/bin/python benchmarks/results/2026-12-06-gpu-s19/reprice_h100.py
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from sim.cost import get_model, read_timing_file, scale_timing  # noqa: E402
from sim.gpus import get_gpu  # noqa: E402
from sim.replay.calibration import replay_timing  # noqa: E402
from sim.replay.measure import call_model_ms, replayed_spec  # noqa: E402

RES = ROOT / "benchmarks" / "results"
df = pd.read_csv(RES / "2026-12-06-gpu-s17" / "last-reprice.csv")
kept = RES / "2026-12-04-timing-campaign-h200" / "after-moe-fix"
# the layers a 4-layer replay of each preset runs (the same pattern for both)
counts = {m: json.loads((kept / f"mooncake-{m}" / "summary.json").read_text())["summary"]["layers_replayed"]
          for m in ("qwen3-next-80b-a3b", "qwen3.5-27b")}  # fmt: skip
# the committed timing before session 19 (what the CSV was priced with), and the resume candidate
# that session 19 committed in its place (sim/data/h200-timing.json since)
h200 = replace(read_timing_file(ROOT / "tests" / "data" / "h200-timing-2026-12-04.json"), gpus=1)
resume = replace(read_timing_file(RES / "2026-12-06-time41" / "h200-timing-resume.json"), gpus=1)
resume_h100 = scale_timing(resume, get_gpu("h200"), get_gpu("h100"))


def gb_scaled(t):
    bw = get_gpu("h200").hbm_bytes_per_s / get_gpu("h100").hbm_bytes_per_s
    s = scale_timing(t, get_gpu("h200"), get_gpu("h100"))
    return replace(
        s,
        ms_per_weight_gb={k: v * bw for k, v in t.ms_per_weight_gb.items()},
        ms_per_act_gb={k: v * bw for k, v in t.ms_per_act_gb.items()},
        ms_per_kv_gb=t.ms_per_kv_gb * bw,
    )


rows = []
for run, g in df.groupby("run", sort=True):
    m = g["model"].iloc[0]
    rs = replayed_spec(get_model(m), counts[m])
    h100 = scale_timing(h200, get_gpu("h200"), get_gpu("h100"))  # as replay_timing carries it
    _, note = replay_timing(None, get_model(m), "bf16", "cuda", "NVIDIA H100 80GB HBM3")
    splits = []
    for h, n, rec in zip(g.hit, g.tokens, g.modelled_ms):
        s = min(range(3), key=lambda k: abs(h200.prefill_time_s(rs, int(h), int(n), k) * 1e3 - rec))
        assert abs(h200.prefill_time_s(rs, int(h), int(n), s) * 1e3 - rec) <= 1e-9 * rec, (run, h, n)
        splits.append(s)
    for name, t in (
        ("H200 as is", h200),
        ("H200 -> H100, datasheets", h100),
        ("... GB terms too", gb_scaled(h200)),
        ("resume file -> H100", resume_h100),
    ):
        dev = [t.prefill_time_s(rs, int(h), int(n), s) * 1e3 for h, n, s in zip(g.hit, g.tokens, splits)]
        priced = np.array([call_model_ms(t, rs, d, s, bool(b)) for d, s, b in zip(dev, splits, g.host_bound)])
        e = (priced - g.measured_ms.values) / g.measured_ms.values
        rows.append((run, name, len(g), np.median(np.abs(e)), np.quantile(np.abs(e), 0.95), np.median(e)))
print(f"replay's line on an H100: {note}\n")
print("| run (H100, 4 layers) | timing | prefills | median abs error | P95 | median signed |")
print("|---|---|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1%} | {r[4]:.1%} | {r[5]:+.1%} |")
