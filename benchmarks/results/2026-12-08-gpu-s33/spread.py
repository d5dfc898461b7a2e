"""The Mooncake rows' measured time saved with its spread (``sim.replay.measure.saved_spread``: each alternated hit's
two pairs, in quadrature) beside the modelled saving, from the matrix's kept rows:
python benchmarks/results/2026-12-08-gpu-s33/spread.py > spread.txt (another session's rows: the folder as
the first argument)."""

import glob
import sys
from pathlib import Path

import pandas as pd

from sim.replay.measure import saved_spread

d = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "packH2" / "rows"
print("| row | saved measured +/- spread ms | modelled ms | (modelled - measured) / spread |")
print("|---|---|---:|---:|")
for p in sorted(glob.glob(str(d / "*-mooncake-*" / "requests.parquet"))):
    df = pd.read_parquet(p)
    v = df[df.validated & df.full_ms.notna() & df.suffix_ms.notna()]
    m, mod, sp = (v.full_ms - v.suffix_ms).sum(), (v.modelled_full_ms - v.modelled_ms).sum(), saved_spread(v)
    print(f"| {Path(p).parent.name} | {m:.1f} +/- {sp:.1f} | {mod:.1f} | {(mod - m) / sp:+.1f} |")
