"""Session 28: the H200 time model in the overlap form, scored on every clean measurement (CPU).
From the repository root:

    .venv/bin/python benchmarks/results/2026-12-07-gpu-s28/next/score_s28.py

Fits (``benchmarks/timing_fit.py`` over this session's H200 campaign, call2/campaign, and its
full-depth fit runs, call2/fulldepth): the additive form and the overlap form (``--form``). Scores
each of them and the H200 file committed before this session (``git show b1c66c2:sim/data/h200-timing.json``,
additive, fitted on the 2026-12-04 campaign) on the campaign's held-out runs (qwen3-next-80b-a3b,
qwen3.5-27b on Mooncake, the agent trace, ShareGPT 60:100, continuous batching) and this session's
preset-matrix rows (call3/rows). Score: per-request prefill error over all prefills, median / P95
(%), and the time saved's error (modelled over measured, minus 1, %). Writes ``scores.csv`` and the
two fitted files (``fit-additive.json``, ``fit-overlap.json``) here; prints the tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]  # next/ of a results folder
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing_fit as tf  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks" / "results" / "2026-12-07-gpu-s27"))
from score_s27 import print_scores  # noqa: E402  (session 27's scoring and tables, the same rules)
from sim.cost import read_timing_file, timing_to_dict  # noqa: E402

VERSIONS = "torch 2.11.0+cu130, triton 3.6.0"
SETS = {
    "held-out": HERE / "call2" / "campaign",
    "s28 matrix": HERE / "call3" / "rows",
}


def main() -> int:
    timings = {}
    old = subprocess.run(
        ["git", "show", "b1c66c2:sim/data/h200-timing.json"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    (HERE / ".before.json").write_text(old)
    timings["before (s25 additive)"] = read_timing_file(HERE / ".before.json")
    (HERE / ".before.json").unlink()
    for form in ("additive", "overlap"):
        _, _, t, info = tf.fit(
            [HERE / "call2" / "campaign", HERE / "call2" / "fulldepth"], "fit", VERSIONS, True, True, False, form
        )
        d = timing_to_dict(t)
        (HERE / f"fit-{form}.json").write_text(
            json.dumps(dict(d, versions=info["versions"], fit=info), indent=2, default=float) + "\n"
        )
        timings[f"s28 {form}"] = t
    print_scores(SETS, timings, "s28 overlap", HERE / "scores.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
