"""Session 27: the H100 time model in the overlap form, scored on every clean measurement (CPU).
From the repository root:

    .venv/bin/python benchmarks/results/2026-12-07-gpu-s27/score_s27.py

Fits (``benchmarks/timing_fit.py`` over this session's campaign, callA/campaign, and its full-depth
fit runs, callD/fulldepth, both measured after session 26's two fixes): the additive form and the
overlap form (``--form``). Scores each of them and the file committed before this session
(``git show a29914a:sim/data/h100-timing.json``, additive, fitted on the session-20 campaign) on: the
campaign's held-out runs (qwen3-next-80b-a3b, qwen3.5-27b on Mooncake, the agent trace, ShareGPT
60:100, continuous batching), the 24 preset-matrix rows of session 26 (callC/rowsC, callE/rowsS) and
the 24 of this session (callB/rows; same code but the tidy a29914a). Score: per-request prefill
error over all prefills, median / P95 (%), and the time saved's error (modelled over measured,
minus 1, %), as ``timing_fit.py``'s ``after all`` / ``after saved``. Writes ``scores.csv`` and the
two fitted files (``fit-additive.json``, ``fit-overlap.json``) here; prints the tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing_fit as tf  # noqa: E402
from sim.cost import read_timing_file, timing_to_dict  # noqa: E402
from sim.replay.calibration import request_errors  # noqa: E402

VERSIONS = "torch 2.11.0+cu130, triton 3.6.0"
S26 = ROOT / "benchmarks" / "results" / "2026-12-07-gpu-s26"
SETS = {
    "held-out": HERE / "callA" / "campaign",
    "s26 matrix": [S26 / "callC" / "rowsC", S26 / "callE" / "rowsS"],
    "s27 matrix": HERE / "callB" / "rows",
}


KINDS = ("attention", "gated_delta", "mlp", "other")


def bucket_saved(run) -> float:
    """The time the validated hits saved, over the marked buckets alone (each layer kind and
    "other", the check out): the reference's buckets less the suffix's. The calls' untimed gap
    (their time outside every bucket) left out of both."""
    t = run.table
    if "full_ms_attention" not in t:
        return np.nan
    h = t[t["validated"].astype(bool) & t["full_ms"].notna()]
    return float(sum((h[f"full_ms_{k}"] - h[f"suffix_ms_{k}"]).sum() for k in KINDS if f"full_ms_{k}" in h))


def score(run, timing) -> dict:
    e = request_errors(run, timing)
    saved = e["saved_ms"].sum()
    a = e["error"].abs().replace([np.inf, -np.inf], np.nan).dropna()
    modelled = e["modelled_saved_ms"].sum()
    buckets = bucket_saved(run)
    return dict(
        median=100 * a.median(),
        p95=100 * a.quantile(0.95),
        saved=100 * (modelled / saved - 1) if saved > 0 else np.nan,
        saved_buckets=100 * (modelled / buckets - 1) if buckets > 0 else np.nan,
    )


def markdown(df: pd.DataFrame) -> str:
    cols = [df.index.name or ""] + [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for i, row in df.iterrows():
        lines.append("| " + " | ".join([str(i)] + [str(v) for v in row]) + " |")
    return "\n".join(lines)


def print_scores(sets: dict, timings: dict, committed: str, out_csv: Path) -> None:
    """Score every run of ``sets`` (group -> folder or folders; a missing folder is skipped, the
    held-out group's fit runs left out) under each of ``timings`` (name -> timing); write the rows
    to ``out_csv`` and print per group the median / P95 / saved table and its summary, then the
    ``committed`` timing's time saved against the calls and against their buckets."""
    rows = []
    for group, roots in sets.items():
        for root in roots if isinstance(roots, list) else [roots]:
            if not root.is_dir():
                continue
            for run, _, _ in tf.load_runs(root):
                if group == "held-out" and (run.name.startswith("fit") or run.name.startswith("fit-")):
                    continue
                for name, t in timings.items():
                    rows.append(dict(set=group, run=run.name, timing=name, **score(run, t.with_gpus(1))))
    df = pd.DataFrame(rows)
    df.to_csv(out_csv, index=False)
    pd.set_option("display.width", 250)
    for group in sets:
        g = df[df["set"] == group]
        wide = g.pivot_table(index="run", columns="timing", values=["median", "p95", "saved"], sort=False)
        cells = {
            t: wide["median"][t].map("{:.1f}".format)
            + " / "
            + wide["p95"][t].map("{:.1f}".format)
            + " / "
            + wide["saved"][t].map("{:+.0f}".format)
            for t in timings
        }
        print(f"\n## {group}: median / P95 / saved (%)\n")
        print(markdown(pd.DataFrame(cells)))
        s = g.groupby("timing", sort=False).agg(
            med_mean=("median", "mean"),
            med_max=("median", "max"),
            p95_max=("p95", "max"),
            saved_absmax=("saved", lambda x: x.abs().max()),
            ok=("median", lambda x: int(((x < 10) & (g.loc[x.index, "p95"] < 20)).sum())),
            rows=("median", "size"),
        )
        print()
        print(markdown(s.round(1)))
    g = df[df["timing"] == committed]
    print("\n## the committed overlap timing: time saved against the measured calls and against their buckets (%)\n")
    print(markdown(g.set_index("run")[["set", "saved", "saved_buckets"]].round(1)))


def main() -> int:
    timings = {}
    old = subprocess.run(
        ["git", "show", "a29914a:sim/data/h100-timing.json"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    (HERE / ".before.json").write_text(old)
    timings["before (s20 additive)"] = read_timing_file(HERE / ".before.json")
    (HERE / ".before.json").unlink()
    for form in ("additive", "overlap"):
        _, _, t, info = tf.fit(
            [HERE / "callA" / "campaign", HERE / "callD" / "fulldepth"], "fit", VERSIONS, True, True, False, form
        )
        d = timing_to_dict(t)
        (HERE / f"fit-{form}.json").write_text(
            json.dumps(dict(d, versions=info["versions"], fit=info), indent=2, default=float) + "\n"
        )
        timings[f"s27 {form}"] = t
    print_scores(SETS, timings, "s27 overlap", HERE / "scores.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
