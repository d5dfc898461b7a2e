"""Targeted mutation run over the lines this change added to sim/cache/tree.py (every site, not a sample)."""

import sys
import subprocess
import time
import os
import json
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import mutation as M

root = Path("/tmp/h7/tmut/repo")
rel = "sim/cache/tree.py"
lines = set(range(400, 455)) | set(range(717, 734)) | {629, 690, 795, 851}
muts = [m for m in M.list_mutants(root, "tree", [rel]) if m.line in lines]
print(len(muts), "mutants", flush=True)
src = (root / rel).read_text()
env = {**os.environ, "PYTHONPATH": str(root), "TRITON_INTERPRET": "1", "MARCONI_CACHE_DIR": "/tmp/h7/tmut/cache"}
tests = sys.argv[1:] or ["tests/sim/cache"]
res = []
try:
    for m in muts:
        (root / rel).write_text(M.apply(src, m))
        t = time.time()
        p = subprocess.run(
            ["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0", *tests],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        st = "caught" if p.returncode != 0 else "survived"
        res.append((m.where, m.kind, m.original, m.replacement, st))
        print(f"{st:8s} {time.time() - t:5.1f}s {m.where} [{m.kind}] {m.original!r} -> {m.replacement!r}", flush=True)
finally:
    (root / rel).write_text(src)
print(sum(r[-1] == "caught" for r in res), "/", len(res), "caught")
json.dump(res, open("/tmp/h7/tmut/result.json", "w"), indent=1)
