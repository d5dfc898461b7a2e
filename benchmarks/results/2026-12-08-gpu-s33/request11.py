"""The Mooncake rows' time saved with and without request 11 (an 87,169-token prompt whose hit is one 512-token
block), from the matrix's kept rows: python benchmarks/results/2026-12-08-gpu-s33/request11.py > request11.txt.
A first pair's time is twice the alternated mean less its ``*_again_ms``."""

import glob
from pathlib import Path

import pandas as pd

d = Path(__file__).resolve().parent / "packH2" / "rows"
HEAD = (
    "| row | hits | saved measured / modelled ms (error) "
    "| request 11: full ms, saved pair 1 / pair 2 / modelled ms | without request 11 (error) |"
)
print(HEAD)
print("|---|---:|---|---|---|")
for p in sorted(glob.glob(str(d / "*-mooncake-*" / "requests.parquet"))):
    name = Path(p).parent.name
    df = pd.read_parquet(p)
    h = df[df.validated]
    meas, mod = h.full_ms - h.suffix_ms, h.modelled_full_ms - h.modelled_ms
    r = h[h.request == 11]
    if len(r):
        r = r.iloc[0]
        s1, f1 = 2 * r.suffix_ms - r.suffix_again_ms, 2 * r.full_ms - r.full_again_ms
        pair2, modelled = r.full_again_ms - r.suffix_again_ms, r.modelled_full_ms - r.modelled_ms
        r11 = f"{r.full_ms:.0f}, {f1 - s1:+.1f} / {pair2:+.1f} / {modelled:.1f}"
        k = h.request != 11
        wo = f"{meas[k].sum():.1f} / {mod[k].sum():.1f} ({100 * (mod[k].sum() / meas[k].sum() - 1):+.1f} %)"
    else:
        r11, wo = "not a hit", "-"
    err = 100 * (mod.sum() / meas.sum() - 1)
    print(f"| {name} | {len(h)} | {meas.sum():.1f} / {mod.sum():.1f} ({err:+.1f} %) | {r11} | {wo} |")
