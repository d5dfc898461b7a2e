"""Why the preset matrix's Mooncake rows miss the time saved by 5-50 % while their per-request errors are 1-3 %
(session 30, CPU; reads callG/rows). A Mooncake hit is 512 tokens of a 1K-87K-token prompt, so the time it saves
is 1-50 % of each call: a small difference of two large measured times. Per layer type, the reference's time over
the suffix's, divided by the token ratio N / (N - hit) (prompts over 4K tokens, medians): 1.0 where the two calls
run at one speed per token (attention's work grows with the square of the length: about 0.97 expected there).
From the repository root:

    .venv/bin/python benchmarks/results/2026-12-07-gpu-s30/saved_share.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

ROWS = Path(__file__).resolve().parent / "callG" / "rows"
KINDS = ("mlp", "gated_delta", "attention")


def main() -> None:
    print(
        "| row | hits over 4K tokens | saved share of the reference, median | reference / suffix per token: mlp, "
        "linear, attention | measured / modelled saved, all hits |"
    )
    print("|---|---:|---:|---|---:|")
    for row in sorted(p.name for p in ROWS.iterdir() if "mooncake" in p.name):
        t = pd.read_parquet(ROWS / row / "requests.parquet")
        v = t[t["validated"].astype(bool)]
        modelled = float((v["modelled_full_ms"] - v["modelled_ms"]).sum())
        measured = float((v["full_ms"] - v["suffix_ms"]).sum())
        long = v[v["input_tokens"] > 4000]
        ratio = long["input_tokens"] / (long["input_tokens"] - long["hit_tokens"])
        per = [float(np.median(long[f"full_ms_{k}"] / long[f"suffix_ms_{k}"] / ratio)) for k in KINDS]
        share = float(np.median(long["hit_tokens"] / long["input_tokens"]))
        print(
            f"| {row} | {len(long)} | {share:.1%} | {' / '.join(f'{p:.4f}' for p in per)} | "
            f"{measured:.1f} / {modelled:.1f} ms |"
        )


if __name__ == "__main__":
    main()
