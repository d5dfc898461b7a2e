"""The two replay checks: exact prefix-hash bookkeeping, and numerics (restore + suffix prefill
against a from-scratch prefill) with a tolerance that fits the dtype. Needs torch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Relative error allowed between a restored run and a from-scratch run (row-wise, see rel_error):
# (recurrent states, outputs and conv windows). The two runs chunk the prompt differently (a
# restore at an unaligned position starts a ragged chunk), so in half precision A, w, u and the
# next layers' projections round differently, ~0.4 % per bf16 rounding. Outputs (normalised per
# head) and conv windows stay within ~2.5 % at 24 qwen3.5-9b layers on ShareGPT; a recurrent state
# is a decayed sum over the whole prefix of bf16 products and its per-head error measured 2.2 %
# (min) / 2.9 % (median) / 7.7 % (max) over 1,231 restores (H200, benchmarks/replay_bench.py).
# A wrong state (another position, a corrupted head) is off by far more.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (3e-2, 1e-2), torch.bfloat16: (1.5e-1, 5e-2)}


def tolerance_for(dtype: torch.dtype) -> tuple[float, float]:
    """``(recurrent-state tolerance, output and conv-window tolerance)`` of ``dtype``."""
    return TOLERANCE[dtype]


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Worst row-wise relative error ``max_rows ||a - b|| / ||b||`` (rows: the last dimension;
    for a state ``[..., K, V]`` pass it flattened per head). A row-wise norm does not dilute one
    bad token or head among many good ones, and does not flag single near-zero elements."""
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0
    a = a.float().reshape(-1, a.shape[-1])
    b = b.float().reshape(-1, b.shape[-1])
    num = torch.linalg.vector_norm(a - b, dim=-1)
    den = torch.linalg.vector_norm(b, dim=-1)
    scale = den.max().clamp_min(1e-30)
    # rows whose reference is (near) zero are measured against the largest row instead
    den = torch.where(den > 1e-3 * scale, den, scale)
    return float((num / den).max())


def state_error(rec_a, conv_a, rec_b, conv_b) -> tuple[float, float]:
    """Worst relative error over layers and heads of recurrent states ``[L, Hv, K, V]`` (each
    head's K x V matrix is one row) and conv windows ``[L, conv_dim, W-1]`` (each layer one row)."""
    L = rec_a.shape[0]
    rec = rel_error(rec_a.reshape(L * rec_a.shape[1], -1), rec_b.reshape(L * rec_b.shape[1], -1))
    conv = rel_error(conv_a.reshape(L, -1), conv_b.reshape(L, -1))
    return rec, conv


@dataclass
class Failure:
    """One failed check, reported with request id, checkpoint id and both positions."""

    kind: str          # "hash" | "kv-hash" (bookkeeping) | "numerics" | "kv-numerics" | "missing"
    request: int
    checkpoint: int
    stored_position: int
    hit_position: int
    detail: str = ""

    def message(self) -> str:
        return (f"{self.kind} check failed: request {self.request}, checkpoint {self.checkpoint}, "
                f"stored position {self.stored_position}, hit position {self.hit_position}"
                + (f": {self.detail}" if self.detail else ""))
