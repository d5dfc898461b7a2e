"""Session 29: fingerprints of the Gluon SSD kernels' PTX (sm_90a, no GPU), line information left out,
to show a refactor of their source changes nothing they compile to. From the repository root, with the
kernels at one revision and then another (same Triton):

    TRITON_CACHE_DIR=$(mktemp -d) .venv/bin/python benchmarks/results/2026-12-07-refactor-ptx-s29/ptx_fingerprint.py

Prints ``dtype kernel sha256[:16] length`` per kernel (``benchmarks/kernel_resources.py --ssd``'s Gluon rows).
The PTX's ``.loc`` / ``.file`` lines, comments, ``$L__tmp`` labels and debug sections carry source lines and
are dropped (a source line moved changes only those).
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import kernel_resources as kr  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

NAMES = ("ssd-state-gluon", "ssd-state-gluon-wg2", "ssd-state-gluon-wg2-tma", "ssd-fused-gluon")
LINE_INFO = re.compile(r"\s*(\.loc|\.file|//|\$L__tmp\d+:)")


def main() -> int:
    for dtype in ("bf16", "fp16"):
        for name, fn, consts, opts in kr.ssd_specs(dtype):
            if name not in NAMES:
                continue
            sig, cst, attrs = kr._signature(fn, consts, dtype)
            src = GluonASTSource(fn=fn, signature=sig, constexprs=cst, attrs=attrs)
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(opts)).asm["ptx"]
            ptx = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
            body = "\n".join(line for line in ptx.splitlines() if not LINE_INFO.match(line))
            print(dtype, name, hashlib.sha256(body.encode()).hexdigest()[:16], len(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
