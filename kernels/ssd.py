"""Chunked SSD (Mamba2) forward, emitting exactly resumable fp32 states at chunk boundaries.

Math (per head h, head dim P, state dim N; B and C shared by the ``H // G`` heads of a group):

    dt_t = clamp(softplus(dt_raw_t + dt_bias_h), dt_min, dt_max)      (bias, softplus optional)
    h_t  = exp(dt_t A_h) h_{t-1} + dt_t x_t B_t^T                     (h: [P, N], A_h < 0)
    y_t  = h_t C_t + D_h x_t

In 64-token chunks aligned to absolute multiples of 64 (the grid of ``chunk_gated_delta_rule``:
``kernels._common.prepare_chunk_metadata``), with a = dt A and gamma its chunk-local cumsum:

    chunk state  s_c = X^T diag(exp(gamma_last - gamma) dt) B            (from a zero state)
    state pass   S_c = exp(gamma_last) S_{c-1} + s_c                      (serial over chunks)
    output       Y   = diag(exp(gamma)) C S_{c-1}^T + (C B^T o Lmask) diag(dt) X + D X,
                 Lmask_ij = exp(gamma_i - gamma_j) for i >= j, else 0

Three kernels:
  1. ``_ssd_chunk_kernel`` (chunk x head x P block, parallel): dt, gamma (stored for kernel 3)
     and the chunk's own state s_c (fp32).
  2. ``_ssd_pass_kernel`` (sequence x head x state block, serial over the sequence's chunks):
     stores each chunk's start state S_{c-1} (input dtype, read by kernel 3), the state at every
     emitted boundary (``state_dtype``, fp32 by default) and the final state (fp32). The serial
     step is elementwise (a scalar decay a chunk), so it is memory bound, not latency bound.
  3. ``_ssd_output_kernel`` (chunk x head x P block, parallel): Y.

A ragged first chunk (a sequence starting at p with p % 64 != 0) has virtual rows in front of
the first token; they load dt = 0, so they add nothing and decay nothing. Resuming a call at an
emitted boundary b (``initial_state`` = the boundary state, ``start_positions`` = b) runs every
later chunk on the same rows with the same state, so it gives the uninterrupted run's bits.

State layout: ``[num_seqs or num_boundaries, H, P, N]`` fp32 (mamba_ssm's ``ssm_state`` layout,
``[batch, nheads, headdim, dstate]``). The conv windows at the same boundaries come from
``kernels.conv.causal_conv1d`` called with the same ``chunk_metadata``.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from kernels._common import INTERPRET, ChunkMetadata
from kernels.ssd_args import check_ssd_args, resolve_ssd_call

__all__ = ["chunk_ssd", "SSD_CONFIGS"]

#: launch configurations (fixed: no autotuning). ``BP``: the P block of kernels 1 and 3 (clamped
#: to the padded P; 32 where the padded N is 256); ``BS``: the state elements a pass program owns.
SSD_CONFIGS = {
    "chunk": dict(BP=64, num_warps=4, num_stages=2),
    "pass": dict(BS=1024, num_warps=4),
    "out": dict(BP=64, num_warps=4, num_stages=2),
}

#: the matrix products' precision for fp32 inputs on a GPU unless the call says otherwise
FP32_PRECISION = "tf32x3"
_PRECISIONS = (None, "ieee", "tf32", "tf32x3")


@triton.jit
def _chunk_rows(chunk_info, i_c):
    """Token rows of chunk ``i_c`` (64, from its first virtual token), which are real, and the
    rows as safe int64 indices (0 where not real)."""
    ts = tl.load(chunk_info + i_c * 4 + 1)
    lo = tl.load(chunk_info + i_c * 4 + 2)
    hi = tl.load(chunk_info + i_c * 4 + 3)
    t = ts + tl.arange(0, 64)
    m = (t >= lo) & (t < hi)
    return m, tl.where(m, t, 0).to(tl.int64)


@triton.jit(do_not_specialize=["dt_min", "dt_max"])
def _ssd_chunk_kernel(
    x,
    dt,
    dt_bias,
    A,
    Bm,
    gam_out,
    dt_out,
    cs_out,
    chunk_info,
    sxt,
    sxh,
    sdt,
    sdh,
    sbt,
    sbg,
    dt_min,
    dt_max,
    H: tl.constexpr,
    GROUP: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    CLAMP: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    i_p = tl.program_id(2)
    m, tc = _chunk_rows(chunk_info, i_c)
    r = tl.arange(0, 64)
    d = tl.load(dt + tc * sdt + i_h * sdh, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        d += tl.load(dt_bias + i_h).to(tl.float32)
    if SOFTPLUS:
        # log(1 + e^x), x itself above 20 as torch's softplus; e^x where 1 + e^x rounds to 1
        e = tl.exp(tl.minimum(d, 20.0))
        d = tl.where(d > 20.0, d, tl.where(d < -15.0, e, tl.log(1.0 + e)))
    if CLAMP:
        d = tl.minimum(tl.maximum(d, dt_min), dt_max)
    d = tl.where(m, d, 0.0)
    gam = tl.cumsum(d * tl.load(A + i_h).to(tl.float32), 0)
    row = (i_c * H + i_h).to(tl.int64) * 64
    first = (r * 0 + i_p) == 0  # a full-shape mask (triton 3.9's interpreter)
    tl.store(gam_out + row + r, gam, mask=first)
    tl.store(dt_out + row + r, d, mask=first)
    last = tl.sum(tl.where(r == 63, gam, 0.0), 0)
    wgt = tl.exp(last - gam) * d  # decay to the chunk's end x dt
    oP = i_p * BP + tl.arange(0, BP)
    oN = tl.arange(0, BN)
    X = tl.load(x + tc[:, None] * sxt + i_h * sxh + oP[None, :], mask=m[:, None] & (oP < P)[None, :], other=0.0)
    Bt = tl.load(
        Bm + tc[:, None] * sbt + (i_h // GROUP) * sbg + oN[None, :], mask=m[:, None] & (oN < N)[None, :], other=0.0
    )
    Xw = (X.to(tl.float32) * wgt[:, None]).to(DOT)
    s = tl.dot(tl.trans(Xw), Bt.to(DOT), input_precision=PREC)  # [BP, BN]
    sidx = (i_c * H + i_h).to(tl.int64) * (P * N) + oP[:, None] * N + oN[None, :]
    tl.store(cs_out + sidx, s, mask=(oP < P)[:, None] & (oN < N)[None, :])


@triton.jit
def _ssd_pass_step(
    c, S, i_h, o, mo, gam, cs, hs, hb, store_slot, H: tl.constexpr, PN: tl.constexpr, STORE_B: tl.constexpr
):
    base = (c * H + i_h).to(tl.int64) * PN
    tl.store(hs + base + o, S.to(hs.dtype.element_ty), mask=mo)
    decay = tl.exp(tl.load(gam + (c * H + i_h).to(tl.int64) * 64 + 63))
    S = S * decay + tl.load(cs + base + o, mask=mo, other=0.0)
    if STORE_B:
        slot = tl.load(store_slot + c)
        ok = ((o * 0 + slot) >= 0) & mo  # full-shape mask (triton 3.9's interpreter)
        tl.store(hb + (tl.maximum(slot, 0) * H + i_h).to(tl.int64) * PN + o, S.to(hb.dtype.element_ty), mask=ok)
    return S


@triton.jit(do_not_specialize=["has_h0"])
def _ssd_pass_kernel(
    gam,
    cs,
    hs,
    h0,
    ht,
    hb,
    seq_info,
    store_slot,
    has_h0,
    H: tl.constexpr,
    PN: tl.constexpr,
    BS: tl.constexpr,
    STORE_B: tl.constexpr,
    WHILE_LOOP: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    i_s = tl.program_id(2)
    c0 = tl.load(seq_info + i_n * 4 + 2)
    c1 = tl.load(seq_info + i_n * 4 + 3)
    o = i_s * BS + tl.arange(0, BS)
    mo = o < PN
    sbase = (i_n * H + i_h).to(tl.int64) * PN
    S = tl.load(h0 + sbase + o, mask=mo & ((o * 0 + has_h0) != 0), other=0.0).to(tl.float32)
    if WHILE_LOOP:
        # the interpreter keeps scalars as 1-element arrays, which range() cannot take
        c = c0
        while c < c1:
            S = _ssd_pass_step(c, S, i_h, o, mo, gam, cs, hs, hb, store_slot, H, PN, STORE_B)
            c += 1
    else:
        for c in range(c0, c1):
            S = _ssd_pass_step(c, S, i_h, o, mo, gam, cs, hs, hb, store_slot, H, PN, STORE_B)
    tl.store(ht + sbase + o, S, mask=mo)


@triton.jit
def _ssd_output_kernel(
    x,
    Bm,
    Cm,
    Dv,
    gam,
    dtc,
    hs,
    y,
    chunk_info,
    sxt,
    sxh,
    sbt,
    sbg,
    sct,
    scg,
    H: tl.constexpr,
    GROUP: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    HAS_D: tl.constexpr,
    D_PER_P: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    i_p = tl.program_id(2)
    m, tc = _chunk_rows(chunk_info, i_c)
    r = tl.arange(0, 64)
    row = (i_c * H + i_h).to(tl.int64) * 64
    g = tl.load(gam + row + r)
    d = tl.load(dtc + row + r)
    oP = i_p * BP + tl.arange(0, BP)
    mP = oP < P
    oN = tl.arange(0, BN)
    mN = oN < N
    grp = i_h // GROUP
    Ct = tl.load(Cm + tc[:, None] * sct + grp * scg + oN[None, :], mask=m[:, None] & mN[None, :], other=0.0).to(DOT)
    Bt = tl.load(Bm + tc[:, None] * sbt + grp * sbg + oN[None, :], mask=m[:, None] & mN[None, :], other=0.0).to(DOT)
    Sp = tl.load(
        hs + (i_c * H + i_h).to(tl.int64) * (P * N) + oP[:, None] * N + oN[None, :],
        mask=mP[:, None] & mN[None, :],
        other=0.0,
    ).to(DOT)
    # the incoming state's part, decayed to each row
    acc = tl.dot(Ct, tl.trans(Sp), input_precision=PREC) * tl.exp(g)[:, None]  # [64, BP]
    CB = tl.dot(Ct, tl.trans(Bt), input_precision=PREC)  # [64, 64]
    causal = r[:, None] >= r[None, :]
    Lm = tl.where(causal, tl.exp(tl.where(causal, g[:, None] - g[None, :], 0.0)), 0.0) * d[None, :]
    X = tl.load(x + tc[:, None] * sxt + i_h * sxh + oP[None, :], mask=m[:, None] & mP[None, :], other=0.0)
    acc += tl.dot((CB * Lm).to(DOT), X.to(DOT), input_precision=PREC)
    if HAS_D:
        if D_PER_P:
            dv = tl.load(Dv + i_h * P + oP, mask=mP, other=0.0).to(tl.float32)
            acc += X.to(tl.float32) * dv[None, :]
        else:
            acc += X.to(tl.float32) * tl.load(Dv + i_h).to(tl.float32)
    tl.store(
        y + tc[:, None] * (H * P) + i_h * P + oP[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] & mP[None, :]
    )


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _rows(t: torch.Tensor, TT: int) -> torch.Tensor:
    """``[B, T, a, b]`` as ``[TT, a, b]`` (a view where possible) with a unit last stride."""
    r = t.reshape(TT, *t.shape[2:])
    if r.stride(-1) != 1:
        r = r.contiguous()
    return r


def chunk_ssd(
    x,
    dt,
    A,
    B,
    C,
    *,
    D=None,
    dt_bias=None,
    dt_softplus: bool = True,
    dt_limit=(0.0, float("inf")),
    initial_state=None,
    cu_seqlens=None,
    start_positions=None,
    boundary_states: bool = True,
    state_dtype=torch.float32,
    boundary_stride: int = 1,
    boundary_indices=None,
    chunk_metadata: Optional[ChunkMetadata] = None,
    input_precision: Optional[str] = None,
):
    """Chunked SSD (Mamba2) forward.

    x ``[Bsz, T, H, P]``; dt (raw, before bias and softplus) ``[Bsz, T, H]``; A ``[H]`` (negative,
    ``-exp(A_log)``); B, C ``[Bsz, T, G, N]`` with ``H % G == 0``; D ``[H]`` or ``[H, P]``; dt_bias
    ``[H]``; ``dt_limit`` clamps dt after the softplus. Varlen: ``Bsz == 1`` with ``cu_seqlens``;
    ``start_positions`` the absolute position of each sequence's first token (chunks are aligned to
    absolute multiples of 64). ``initial_state`` ``[S, H, P, N]`` (S sequences).

    Returns ``(y [Bsz, T, H, P] in x's dtype, final_state [S, H, P, N] fp32, boundary_states
    [NB, H, P, N] in state_dtype or None)``: the boundary states as ``chunk_gated_delta_rule``'s
    (every emitted absolute 64-multiple, sequence-major; ``boundary_stride`` / ``boundary_indices``
    or the metadata's selection). ``input_precision`` ("ieee", "tf32", "tf32x3": the default) sets
    the products' precision for fp32 inputs on a GPU.
    """
    check_ssd_args(x, dt, A, B, C, D, dt_bias, state_dtype=state_dtype)
    if input_precision not in _PRECISIONS:
        raise ValueError(f"input_precision must be one of 'ieee', 'tf32', 'tf32x3' (or None), not {input_precision!r}")
    meta = resolve_ssd_call(
        x,
        B,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        start_positions=start_positions,
        boundary_stride=boundary_stride,
        boundary_indices=boundary_indices,
        chunk_metadata=chunk_metadata,
    )
    Bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    dev, dtype, f32 = x.device, x.dtype, torch.float32
    S, TT, NT = meta.num_seqs, Bsz * T, meta.num_chunks
    y = torch.empty(Bsz, T, H, P, dtype=dtype, device=dev)
    ht = torch.empty(S, H, P, N, dtype=f32, device=dev)
    store_b = bool(boundary_states)
    hb = torch.empty(meta.num_boundaries, H, P, N, dtype=state_dtype, device=dev) if store_b else None
    if NT == 0:
        if initial_state is not None:
            ht.copy_(initial_state)
        else:
            ht.zero_()
        return y, ht, hb
    B, C = B.to(dtype), C.to(dtype)
    x2, B2, C2 = _rows(x, TT), _rows(B, TT), _rows(C, TT)
    dt2 = dt.reshape(TT, H)
    A32 = A.float().contiguous()
    bias = dt_bias.float().contiguous() if dt_bias is not None else A32
    Dv = D.float().contiguous() if D is not None else A32
    h0 = initial_state.float().contiguous() if initial_state is not None else ht
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi != float("inf")
    gam = torch.empty(NT, H, 64, dtype=f32, device=dev)
    dtc = torch.empty(NT, H, 64, dtype=f32, device=dev)
    cs = torch.empty(NT, H, P, N, dtype=f32, device=dev)
    # chunk-start states in the products' input dtype (fp32 for fp32 inputs)
    hs = torch.empty(NT, H, P, N, dtype=dtype, device=dev)
    BN = max(16, _pow2(N))
    BPmax = 32 if BN >= 256 else 64
    Pp = max(16, _pow2(P))
    prec = (input_precision or FP32_PRECISION) if dtype == f32 else "tf32"
    # the interpreter multiplies bf16 operands' bit patterns (triton-lang/triton#11584): its
    # products take fp32 operands there (the GPU multiplies bf16 on tensor cores)
    dot = tl.float32 if (dtype == f32 or (INTERPRET and dtype == torch.bfloat16)) else (
        tl.bfloat16 if dtype == torch.bfloat16 else tl.float16
    )  # fmt: skip
    cfg = dict(SSD_CONFIGS["chunk"])
    BP = min(cfg.pop("BP"), Pp, BPmax)
    _ssd_chunk_kernel[(NT, H, triton.cdiv(P, BP))](
        x2, dt2, bias, A32, B2, gam, dtc, cs, meta.chunk_info,
        x2.stride(0), x2.stride(1), dt2.stride(0), dt2.stride(1), B2.stride(0), B2.stride(1), lo, hi,
        H=H, GROUP=H // G, P=P, N=N, BP=BP, BN=BN, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
        CLAMP=clamp, DOT=dot, PREC=prec, **cfg,
    )  # fmt: skip
    cfg = dict(SSD_CONFIGS["pass"])
    BS = min(cfg.pop("BS"), _pow2(P * N))
    store = store_b and meta.num_boundaries > 0
    _ssd_pass_kernel[(S, H, triton.cdiv(P * N, BS))](
        gam, cs, hs, h0, ht, hb if store else ht, meta.seq_info, meta.store_slot, int(initial_state is not None),
        H=H, PN=P * N, BS=BS, STORE_B=store, WHILE_LOOP=INTERPRET, **cfg,
    )  # fmt: skip
    cfg = dict(SSD_CONFIGS["out"])
    BP = min(cfg.pop("BP"), Pp, BPmax)
    _ssd_output_kernel[(NT, H, triton.cdiv(P, BP))](
        x2, B2, C2, Dv, gam, dtc, hs, y, meta.chunk_info,
        x2.stride(0), x2.stride(1), B2.stride(0), B2.stride(1), C2.stride(0), C2.stride(1),
        H=H, GROUP=H // G, P=P, N=N, BP=BP, BN=BN, HAS_D=D is not None, D_PER_P=D is not None and D.dim() == 2,
        DOT=dot, PREC=prec, **cfg,
    )  # fmt: skip
    return y, ht, hb
