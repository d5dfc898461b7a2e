import sys
import pandas as pd
from pathlib import Path

a, b = Path(sys.argv[1]), Path(sys.argv[2])
out = []
for d in sorted(p.name for p in a.iterdir() if p.is_dir()):
    if not (b / d / "requests.parquet").exists():
        out.append(f"{d}: MISSING in {b.name}")
        continue
    ra, rb = pd.read_parquet(a / d / "requests.parquet"), pd.read_parquet(b / d / "requests.parquet")
    same = ra.equals(rb)
    hits = ra.groupby("policy")["hit_tokens"].sum().to_dict() if "policy" in ra else ra["hit_tokens"].sum()
    hb = rb.groupby("policy")["hit_tokens"].sum().to_dict() if "policy" in rb else rb["hit_tokens"].sum()
    ndiff = "" if same else f" hit-diff-rows={(ra['hit_tokens'] != rb['hit_tokens']).sum()} hits {hits} vs {hb}"
    out.append(f"{d}: {'identical' if same else 'DIFFERENT'} ({len(ra)} rows){ndiff}")
print(" | ".join(out))
