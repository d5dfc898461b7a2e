"""Session 19: the continuous-batching step tables the repository keeps, priced with the timing
committed before session 19, with the resumed-call file while steps leave its term out, and with
the file as steps now price it (a prefill from a state pays its resumed chunks' extra).

    .venv/bin/python benchmarks/results/2026-12-06-gpu-s19/steps_resume.py
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from sim.cost import get_model, read_timing_file  # noqa: E402
from sim.replay import steps  # noqa: E402

before = read_timing_file(ROOT / "tests" / "data" / "h200-timing-2026-12-04.json")
now = read_timing_file(ROOT / "sim" / "data" / "h200-timing.json")
nine = ROOT / "tests" / "data" / "h200-2026-12-02" / "marconi-exact-continuous"
moon = (
    ROOT / "benchmarks" / "results" / "2026-12-04-timing-campaign-h200" / "after-moe-fix" / "cont-mooncake-qwen3.5-27b"
)
cases = [
    # the 9b at full depth; the per-sequence term was fitted on the first half of these steps
    ("qwen3.5-9b, full depth, ShareGPT (2026-12-02, 2nd half)", "qwen3.5-9b",
     {"attention": 8, "gated_delta": 24, "mlp": 32}, nine / "steps.parquet", True),
    ("qwen3.5-27b, 4 layers, Mooncake (2026-12-04)", "qwen3.5-27b",
     json.loads((moon / "summary.json").read_text())["summary"]["layers_replayed"], moon / "steps.parquet", False),
]  # fmt: skip
print("| steps | timing | median | P95 |\n|---|---|---:|---:|")
for name, model, counts, path, half in cases:
    st = pd.read_parquet(path)
    if half:
        st = st.sort_values(["event", "index"]).iloc[len(st) // 2 :]
    for label, t in (
        ("committed before", before),
        ("resume file, steps without its term", replace(now, gdn_resume_ms_per_chunk=0.0)),
        ("resume file, steps with it (now)", now),
    ):
        e = steps.error_stats(steps.with_model(st, get_model(model), t, counts))
        print(f"| {name} | {label} | {e['median']:.1%} | {e['p95']:.1%} |")
