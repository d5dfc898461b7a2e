"""Depthwise causal conv1d (width W, default 4) with per-boundary conv windows.

y[t, d] = act(bias[d] + sum_i weight[d, i] * x[t - (W - 1) + i, d]); inputs before a sequence's
first token come from ``conv_state[n, d, :]`` (the W-1 inputs before the call) or are zero.
For each emitted boundary b (same chunk metadata and boundary selection as
``chunk_gated_delta_rule``) the kernel stores the W-1 pre-conv inputs ``x[b-W+1 .. b-1]``, which is
exactly the conv state a later call resuming at b needs.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from kernels._common import ChunkMetadata, resolve_metadata
from kernels.chunk_plan import _env_config

__all__ = ["causal_conv1d"]


@triton.jit
def _xload(x, cs, src, rowm, d, md, bos, n, sxt, D, W: tl.constexpr, HAS_STATE: tl.constexpr, before):
    """Pre-conv inputs at token rows ``src`` (may reach before ``bos``) for channels ``d``; the
    inputs before ``bos`` from ``cs``, the incoming conv states transposed to ``[N, W-1, D]``
    (channels contiguous, as in x: the two loads share one register layout). ``before``: whether
    any row of ``src`` may lie before ``bos`` (a scalar: a sequence's first chunk, or a window
    within its first W - 1 tokens); only then is ``cs`` read. Read as ``[N, D, W-1]`` on every
    chunk, the gather cost each tap a layout conversion and a scalar load an element: a resumed
    gated-delta layer ran 11-21 % slower per chunk (sessions 20-24)."""
    inx = rowm & (src >= bos)
    val = tl.load(
        x + tl.where(inx, src, 0).to(tl.int64)[:, None] * sxt + d[None, :], mask=inx[:, None] & md[None, :], other=0.0
    ).to(tl.float32)
    if HAS_STATE:
        if before:
            j = (W - 1) + (src - bos)  # row in the state's W - 1 inputs
            ins = rowm & (src < bos) & (j >= 0)
            val += tl.load(
                cs + (n * (W - 1) + tl.where(ins, j, 0)).to(tl.int64)[:, None] * D + d[None, :],
                mask=ins[:, None] & md[None, :],
                other=0.0,
            ).to(tl.float32)
    return val


@triton.jit(do_not_specialize=["use_state"])
def _conv_kernel(
    x,
    wt,
    bias,
    cs_in,
    y,
    cs_out,
    cb,
    chunk_info,
    seq_info,
    store_slot,
    sxt,
    D,
    use_state,
    W: tl.constexpr,
    BD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_STATE: tl.constexpr,
    SILU: tl.constexpr,
    STORE_B: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_d = tl.program_id(1)
    n = tl.load(chunk_info + i_c * 4)
    tstart = tl.load(chunk_info + i_c * 4 + 1)
    lo = tl.load(chunk_info + i_c * 4 + 2)
    hi = tl.load(chunk_info + i_c * 4 + 3)
    bos = tl.load(seq_info + n * 4)
    eos = tl.load(seq_info + n * 4 + 1)
    d = i_d * BD + tl.arange(0, BD)
    md = d < D
    t = tstart + tl.arange(0, 64)
    m = (t >= lo) & (t < hi)
    acc = tl.zeros([64, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + d, mask=md, other=0.0).to(tl.float32)[None, :]
    # the chunk's taps reach before its sequence (its first chunk) and the call has a state to read
    # there (``use_state``: a runtime flag, so that a call from zeros runs the binary of one from a
    # state, ``ONE_BINARY``)
    early = (tstart - (W - 1) < bos) & (use_state != 0)
    for i in tl.static_range(W):
        xi = _xload(x, cs_in, t - (W - 1) + i, m, d, md, bos, n, sxt, D, W, HAS_STATE, early)
        wi = tl.load(wt + d * W + i, mask=md, other=0.0).to(tl.float32)
        acc += xi * wi[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tc = tl.where(m, t, 0).to(tl.int64)
    tl.store(y + tc[:, None] * D + d[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] & md[None, :])
    # window of the W-1 inputs before the chunk end ``hi``
    j = tl.arange(0, 4)
    jm = j < (W - 1)
    win = _xload(
        x, cs_in, hi - (W - 1) + j, jm, d, md, bos, n, sxt, D, W, HAS_STATE, (hi - (W - 1) < bos) & (use_state != 0)
    )
    widx = d[None, :] * (W - 1) + j[:, None]
    if STORE_B:
        slot = tl.load(store_slot + i_c)
        # full-shape boolean masks: triton 3.9's interpreter rejects a scalar & block mask
        ok = ((widx * 0 + slot) >= 0) & jm[:, None] & md[None, :]
        tl.store(cb + tl.maximum(slot, 0).to(tl.int64) * D * (W - 1) + widx, win.to(cb.dtype.element_ty), mask=ok)
    last = ((widx * 0 + hi) == eos) & jm[:, None] & md[None, :]
    tl.store(cs_out + n.to(tl.int64) * D * (W - 1) + widx, win.to(cs_out.dtype.element_ty), mask=last)


# One fixed launch configuration (no autotuning: a new shape must not re-benchmark candidates).
# 8 warps: compiled for sm_90a (``kernel_resources.py --conv``) 95 registers and one layout
# conversion from zeros, 102 from a conv state, no spills; at 4 warps 210 / 255 registers, five
# conversions, and the state's path spilled. ``ONE_BINARY`` (a host key): a call from zeros runs the
# binary of a call from a state (``HAS_STATE`` on, ``use_state`` 0 at run time: the state is never
# read) instead of its own. Its own (``ONE_BINARY=0``) is straight-line code, which ptxas schedules
# with a third of the tap and window loads interleaved with the silu's exponentials, each one's
# latency exposed (the SASS, session 26); the state's branches keep every x load ahead of the
# arithmetic. On the H200 the replay's gated-delta layers ran ~6 ns a token and layer slower from
# position 0 than from a state (session 25's probe: the conv 0.60 ms for three qwen3-next-80b-a3b
# layers of 8,192 tokens from 0, under 0.45 from a state), which every from-scratch prefill paid.
CONV_CONFIG = dict(BD=128, num_warps=8, ONE_BINARY=1)
#: ``CONV_CONFIG`` keys the host reads and the kernel does not take
CONV_HOST_KEYS = ("ONE_BINARY",)


def _conv_config() -> dict:
    """``CONV_CONFIG`` with ``KERNELS_CONFIG_CONV`` over it (experiments: "BD=64,num_warps=4")."""
    cfg = {**CONV_CONFIG, **_env_config("conv")}
    unknown = set(cfg) - {"BD", "num_warps", "num_stages", "maxnreg", *CONV_HOST_KEYS}
    if unknown:
        raise ValueError(f"KERNELS_CONFIG_CONV: unknown key(s) {sorted(unknown)}")
    return cfg


def causal_conv1d(
    x,
    weight,
    bias=None,
    *,
    conv_state=None,
    cu_seqlens=None,
    start_positions=None,
    activation: Optional[str] = "silu",
    boundary_conv_states=True,
    boundary_stride=1,
    boundary_indices=None,
    chunk_metadata: Optional[ChunkMetadata] = None,
):
    """x ``[B, T, D]`` (varlen: B == 1 with ``cu_seqlens``), weight ``[D, W]`` (W <= 5),
    conv_state ``[N, D, W-1]``. Returns ``(y [B, T, D], final_conv_state [N, D, W-1],
    boundary_conv_states [NB, D, W-1] or None)``; boundaries as in ``chunk_gated_delta_rule``."""
    B, T, D = x.shape
    W = weight.shape[-1]
    if weight.shape != (D, W) or not 2 <= W <= 5:
        raise ValueError("weight must be [D, W] with 2 <= W <= 5")
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"unknown activation {activation!r}")
    dev = x.device
    meta = resolve_metadata(B, T, dev, cu_seqlens, start_positions, boundary_stride, boundary_indices, chunk_metadata)
    N, TT, NT = meta.num_seqs, B * T, meta.num_chunks
    x2 = x.reshape(TT, D)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(TT, D, dtype=x.dtype, device=dev)
    cs_dtype = conv_state.dtype if conv_state is not None else x.dtype
    if conv_state is not None:
        if conv_state.shape != (N, D, W - 1):
            raise ValueError(f"conv_state must be {(N, D, W - 1)}")
        # [N, W-1, D] for the kernel's reads (channels contiguous, as in x); the returned states
        # keep [N, D, W-1]
        cs_in = conv_state.transpose(1, 2).contiguous()
    if meta.has_empty:
        if conv_state is not None:
            cs_out = conv_state.clone(memory_format=torch.contiguous_format)
        else:
            cs_out = torch.zeros(N, D, W - 1, dtype=cs_dtype, device=dev)
    else:
        cs_out = torch.empty(N, D, W - 1, dtype=cs_dtype, device=dev)
    store_b = bool(boundary_conv_states)
    cb = torch.empty(meta.num_boundaries, D, W - 1, dtype=cs_dtype, device=dev) if store_b else None
    if NT > 0:
        cfg = _conv_config()
        one = bool(cfg.pop("ONE_BINARY"))
        grid = lambda META: (NT, triton.cdiv(D, META["BD"]))  # noqa: E731
        _conv_kernel[grid](
            x2,
            weight.contiguous(),
            bias if bias is not None else x2,
            cs_in if conv_state is not None else x2,
            y,
            cs_out,
            cb if store_b else cs_out,
            meta.chunk_info,
            meta.seq_info,
            meta.store_slot,
            x2.stride(0),
            D,
            int(conv_state is not None),
            W=W,
            HAS_BIAS=bias is not None,
            HAS_STATE=one or conv_state is not None,
            SILU=activation in ("silu", "swish"),
            STORE_B=store_b and meta.num_boundaries > 0,
            **cfg,
        )
    return y.reshape(B, T, D), cs_out, cb
