"""What the suffix's copy (fixed in 9eb03c6, after these rows were measured) did to the Mooncake rows' time saved
(CPU): python benchmarks/results/2026-12-07-gpu-s27/gap_estimate.py (from the repository root).

Per validated hit, the suffix call's time outside every marked bucket less its reference's scaled to the suffix's
tokens (the "extra gap"), against the copy's size (4 mixer-layer outputs of the suffix's tokens x hidden x 2 bytes,
read and written, at 3 TB/s): the ratio is the same on every preset (hidden 2,048-5,120), as a copy of
hidden x tokens would be. Then each row's time saved error under the committed timing with the extra gap taken out
of its suffix calls: a prediction of the fix, to be checked by the next device session's rows."""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing_fit as tf  # noqa: E402
from sim.cost import get_model, read_timing_file  # noqa: E402
from sim.replay.calibration import request_errors  # noqa: E402

KINDS = ("attention", "gated_delta", "mlp", "other")
T = read_timing_file(ROOT / "sim" / "data" / "h100-timing.json").with_gpus(1)
ROOTS = {
    "s27": ROOT / "benchmarks/results/2026-12-07-gpu-s27/callB/rows",
    "s26": ROOT / "benchmarks/results/2026-12-07-gpu-s26/callC/rowsC",
}


def saved_error(e) -> float:
    return 100 * (e["modelled_saved_ms"].sum() / e["saved_ms"].sum() - 1)


print(
    "| rows | row | hits | extra gap, median ms | copy estimate, median ms | ratio | saved error | without the extra gap |"
)
print("|---|---|---:|---:|---:|---:|---:|---:|")
for label, root in ROOTS.items():
    for run, _, _ in tf.load_runs(root):
        if "mooncake" not in run.name:
            continue
        t = run.table
        ok = t["validated"].astype(bool) & t["full_ms"].notna()
        sgap = t["suffix_ms"] - sum(t[f"suffix_ms_{k}"] for k in KINDS)
        fgap = t["full_ms"] - sum(t[f"full_ms_{k}"] for k in KINDS)
        ns = t["input_tokens"] - t["hit_tokens"]
        extra = (sgap - fgap * ns / t["input_tokens"]).where(ok, 0.0).clip(lower=0).fillna(0.0)
        copy = 4 * ns * get_model(run.spec.name).d_model * 2 * 2 / 3.0e12 * 1e3
        ratio = float(np.median(extra[ok] / copy[ok]))
        e0 = request_errors(run, T)
        e1 = request_errors(replace(run, table=t.assign(suffix_ms=t["suffix_ms"] - extra)), T)
        print(
            f"| {label} | {run.name} | {int(ok.sum())} | {extra[ok].median():.3f} | {copy[ok].median():.3f} | "
            f"{ratio:.2f} | {saved_error(e0):+.1f} % | {saved_error(e1):+.1f} % |"
        )
