"""The replay checks. Needs torch.

* bookkeeping: the stored position and prefix hash (and the KV pages' keys) against the prompt;
* integrity (``--validate exact``, the default, and ``shadow``): every state, conv window and KV
  page is digested bit for bit when the kernels produce it, and a restore must return exactly those
  bits (``digest``). The replay is deterministic, so any difference is an error of the store path:
  a snapshot in lower precision, a corrupted or reused slot, a layer never written, a KV block that
  is not the one written. A 1 % error of one head of one layer is as visible as a 100 % one;
* numerics (every mode): restore + suffix prefill against one unsplit from-scratch prefill, within a
  tolerance that fits the dtype (``TOLERANCE``). The two runs chunk the prompt differently, so in
  bf16 this sees only gross errors (a state one token off: error ~3); ``shadow`` adds an fp32 replay
  of the same event stream checked at fp32 tolerance (a 0.5 % error of a state is seen there).

Modes: ``VALIDATE_MODES``; docs/replay.md explains what each sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VALIDATE_MODES = ("exact", "shadow", "tolerance")

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
    return float(rel_error_t(a, b))


def rel_error_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``rel_error`` as a 0-d fp32 tensor on the tensors' device (no host sync: a check that
    compares layer by layer inside a timed call reads the result once, at its end)."""
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=a.device)
    a = a.float().reshape(-1, a.shape[-1])
    b = b.float().reshape(-1, b.shape[-1])
    num = torch.linalg.vector_norm(a - b, dim=-1)
    den = torch.linalg.vector_norm(b, dim=-1)
    scale = den.max().clamp_min(1e-30)
    # rows whose reference is (near) zero are measured against the largest row instead
    den = torch.where(den > 1e-3 * scale, den, scale)
    return (num / den).max()


_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MULT: dict = {}
_ODD = 0x9E3779B97F4A7C15 - (1 << 64)  # an odd 64-bit constant (golden ratio), as a signed int


def _multipliers(m: int, device) -> torch.Tensor:
    key = (m, str(device))
    w = _MULT.get(key)
    if w is None:
        # odd weights: a change d != 0 of one element changes the sum by d * w != 0 (mod 2^64)
        w = (torch.arange(m, dtype=torch.int64, device=device) * 2 + 1) * _ODD
        _MULT[key] = w
    return w


def digest(t: torch.Tensor, rows: int = 1) -> torch.Tensor:
    """Bit-level digest of ``t``: its elements' raw bits (not their values: -0.0 and 0.0 differ)
    weighted by odd 64-bit multipliers and summed with wrap-around, one int64 per row of the first
    ``rows`` dimensions (e.g. per layer and head of a state ``[L, Hv, K, V]`` with ``rows=2``).
    Any change of a single element changes its row's digest; computed on the tensor's device."""
    lead = tuple(t.shape[:rows]) if rows else ()
    bits = t.contiguous().view(_INT_OF[t.element_size()]).reshape(*lead, -1)
    if bits.shape[-1] == 0:
        return torch.zeros(lead, dtype=torch.int64, device=t.device)
    w = _multipliers(bits.shape[-1], t.device)
    return (bits.to(torch.int64) * w).sum(-1)


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

    # "hash" | "kv-hash" (bookkeeping) | "integrity" | "kv-integrity" (exact bits) | "numerics" |
    # "kv-numerics" (tolerance) | "missing"; a failure of the fp32 shadow replay has "shadow-" before
    kind: str
    request: int
    checkpoint: int
    stored_position: int
    hit_position: int
    detail: str = ""

    def message(self) -> str:
        return (
            f"{self.kind} check failed: request {self.request}, checkpoint {self.checkpoint}, "
            f"stored position {self.stored_position}, hit position {self.hit_position}"
            + (f": {self.detail}" if self.detail else "")
        )
