"""The time model's fit with the weights-read term free and held at the datasheet bandwidth, side by
side on every run (fit and held-out): run from benchmarks/results,

    python 2026-12-07-timing-bandwidth-s25/compare.py h100   (the s20 campaign + the s24 matrix rows)
    python 2026-12-07-timing-bandwidth-s25/compare.py h200   (the 2026-12-04 campaign)
"""

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parents[2]))

import pandas as pd  # noqa: E402
import timing_fit as tf  # noqa: E402

R = HERE.parent
held = Path(tempfile.mkdtemp())
for rows in (R / "2026-12-07-gpu-s24/callA/rows", R / "2026-12-07-gpu-s24/callB/rowsB"):
    for d in rows.iterdir():
        (held / d.name).symlink_to(d)
DIRS = {
    "h100": [R / "2026-12-06-gpu-s20/campaign", R / "2026-12-06-gpu-s20/fulldepth", held],
    "h200": [
        R / "2026-12-04-timing-campaign-h200/after-moe-fix",
        R / "2026-12-02-replay-calibration-h200/session3/fit-and-sequential-400",
    ],
}[sys.argv[1]]
out = {}
for cap in (False, True):
    runs, base, timing, info = tf.fit(DIRS, "fit", "torch 2.11.0+cu130, triton 3.6.0", True, cap)
    r = tf.report(runs, base, timing)
    cols = ["held_out", "after all", "after saved"] + (["after steps"] if "after steps" in r else [])
    out[cap] = r.set_index("run")[cols]
    print("held" if cap else "free", "per-weight-GB ms:", {k: round(v, 4) for k, v in timing.ms_per_weight_gb.items()})
df = out[False].join(out[True].drop(columns=["held_out"]), lsuffix=" free", rsuffix=" held")
pd.set_option("display.width", 250)
print(df.to_string())
held_out = df["held_out"] == "yes"
for c in ("after all free", "after all held"):
    v = df.loc[held_out, c].str.split(" / ").str[0].str.rstrip("%").astype(float)
    print(f"{c}: held-out runs {len(v)}, mean of medians {v.mean():.1f} %, at or over 10 %: {(v >= 10).sum()}")
