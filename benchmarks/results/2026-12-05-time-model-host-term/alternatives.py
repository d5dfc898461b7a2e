"""The host-bound pricing rules weighed for the host term, scored on the committed campaign runs.

    .venv/bin/python benchmarks/results/2026-12-05-time-model-host-term/alternatives.py > alternatives.txt

Every rule is fitted on the fit runs only (names starting with ``fit``) and prices only the
host-bound prefills (the others keep the device model, the committed timing's): per run the
median / P95 of the absolute relative error over all timed prefills.

* none: the device model (what the headline left out);
* max-issue (the one kept): ``max(device, host issue)``, the host issue line fitted to the host
  issue times of the calls whose host did not wait (``sim.replay.measure.fit_host_depths``);
* max-measured: ``max(device, H)``, H's line fitted the same way to the host-bound calls'
  measured times instead;
* sum-gap: ``device + G``, G's line fitted to the host-bound calls' measured minus modelled time.
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing_fit  # noqa: E402
from sim.cost import read_timing_file  # noqa: E402
from sim.replay.calibration import request_errors  # noqa: E402
from sim.replay.measure import fit_host_depths, host_issue_times  # noqa: E402

DIRS = [
    ROOT / "benchmarks/results/2026-12-04-timing-campaign-h200/after-moe-fix",
    ROOT / "benchmarks/results/2026-12-02-replay-calibration-h200/session3/fit-and-sequential-400",
]
base = read_timing_file(Path(__file__).with_name("h200-timing-before.json"))
rows, issue = [], {}
for d in DIRS:
    for run, _, _ in timing_fit.load_runs(d):
        e = request_errors(run, base)
        e["lc"] = sum(run.counts.values())
        e["calls"] = (
            1 + run.table.loc[run.table["suffix_ms"].notna() & (run.table["suffix_ms"] > 0), "splits"].to_numpy()
        )
        rows.append(e)
        if run.name.startswith("fit"):
            issue.setdefault(e["lc"].iloc[0], []).extend(host_issue_times(run.table).tolist())
E = pd.concat(rows, ignore_index=True)
fit = E[E["run"].str.startswith("fit") & E["host_bound"]]


def by_depth(values: pd.Series) -> dict:
    return {int(k): v.to_numpy() for k, v in values.groupby(fit["lc"])}


lines = {
    "max-issue": fit_host_depths(issue)[:2],
    "max-measured": fit_host_depths(by_depth(fit["measured_ms"]))[:2],
    "sum-gap": fit_host_depths(by_depth((fit["measured_ms"] - fit["modelled_ms"]).clip(lower=0)))[:2],
}
out = {}
for name in ("none", "max-issue", "max-measured", "sum-gap"):
    if name == "none":
        pred = E["modelled_ms"]
    else:
        c, k = lines[name]
        h = (c + k * E["lc"]) * E["calls"]
        pred = E["modelled_ms"] + h if name == "sum-gap" else np.maximum(E["modelled_ms"], h)
        pred = pred.where(E["host_bound"], E["modelled_ms"])
    err = ((pred - E["measured_ms"]) / E["measured_ms"]).abs()
    g = err.groupby(E["run"])
    out[name] = (g.median() * 100).round(1).astype(str) + "% / " + (g.quantile(0.95) * 100).round(1).astype(str) + "%"
table = pd.DataFrame(out)
table.insert(0, "held_out", ["" if r.startswith("fit") else "yes" for r in table.index])
pd.set_option("display.width", 200)
print(table.to_string())
for name, (c, k) in lines.items():
    print(f"{name}: {c:.3f} ms per call + {k:.4f} ms per layer call")
