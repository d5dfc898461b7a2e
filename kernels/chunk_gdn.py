"""Chunked gated delta rule, forward only, emitting exactly resumable chunk-boundary states.

Math (per value head, C = 64 tokens per chunk, state S is K x V, gamma = chunk-local cumsum of g):
  L   = strict_tril(diag(beta) (K K^T o exp(gamma_i - gamma_j)))
  A   = (I + L)^-1                       (block forward substitution on 16 x 16 blocks)
  w   = A diag(beta exp(gamma)) K,   u = A diag(beta) V
  P   = tril(Q K^T o exp(gamma_i - gamma_j))            (Q already l2-normalised and scaled)
  v'  = u - w S
  O   = diag(exp(gamma)) Q S + P v'  =  (diag(exp(gamma)) Q - P w) S + P u  =  Q' S + O_intra
  S  <- exp(gamma_last) S + (K o exp(gamma_last - gamma))^T v'

Two kernels:
  1. ``_intra_kernel`` (one program per chunk x value head, fully parallel): gate / beta, cumsum,
     kkt + solve, w, u, Q' and O_intra.
  2. ``_state_kernel`` (one program per sequence x value head x V block, sequential over chunks):
     v', the output O = Q' S + O_intra, the state update, the fp32 boundary stores and the final
     state. Folding the output into the state loop means no per-chunk state ``h`` ever goes
     through HBM unless the caller asked for it as a boundary state.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from kernels._common import (INTERPRET, ChunkMetadata, autotuned, prepare_chunk_metadata,
                             resolve_metadata)

__all__ = ["chunk_gated_delta_rule", "prepare_chunk_metadata", "ChunkMetadata"]


@triton.jit
def _l2n(x, USE: tl.constexpr):
    if USE:
        x = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    return x


@triton.jit
def _load_gate_beta(g, beta, A_log_h, dt_bias_h, tc, m, i_hv, sgt, sgh, sbt, sbh,
                    USE_GATE: tl.constexpr, BETA_SIGMOID: tl.constexpr):
    gr = tl.load(g + tc * sgt + i_hv * sgh, mask=m, other=0.).to(tl.float32)
    if USE_GATE:
        x = gr + dt_bias_h
        sp = tl.where(x > 20., x, tl.log(1. + tl.exp(tl.minimum(x, 20.))))
        gr = tl.where(m, -tl.exp(A_log_h) * sp, 0.)
    b = tl.load(beta + tc * sbt + i_hv * sbh, mask=m, other=0.).to(tl.float32)
    if BETA_SIGMOID:
        b = tl.where(m, tl.sigmoid(b), 0.)
    return gr, b


@triton.jit
def _load_rows(ptr, tc, m, i_h, st, sh, offs, NORM: tl.constexpr):
    x = tl.load(ptr + tc[:, None] * st + i_h * sh + offs[None, :], mask=m[:, None], other=0.)
    return _l2n(x.to(tl.float32), NORM)


@triton.jit
def _load_cols(ptr, tc, m, i_h, st, sh, offs, NORM: tl.constexpr):
    """Rows ``tc`` loaded transposed, as a [dim, rows] block (no register transpose: a
    register-transposed wgmma operand gave wrong results on an H200 with triton 3.6)."""
    x = tl.load(ptr + tc[None, :] * st + i_h * sh + offs[:, None], mask=m[None, :], other=0.)
    x = x.to(tl.float32)
    if NORM:
        x = x / tl.sqrt(tl.sum(x * x, 0) + 1e-6)[None, :]
    return x


@triton.jit
def _kkt_block(ki, kjT, gi, gj, bi, DIAG: tl.constexpr, PREC: tl.constexpr):
    r = tl.arange(0, 16)
    if DIAG:
        keep = r[:, None] > r[None, :]
    else:
        keep = r[:, None] >= 0
    d = tl.exp(tl.where(keep, gi[:, None] - gj[None, :], float("-inf")))
    return tl.dot(ki, kjT, input_precision=PREC) * bi[:, None] * d


@triton.jit
def _inv16(L):
    """(I + L)^-1 for a strictly lower-triangular 16 x 16 L, by forward substitution."""
    r = tl.arange(0, 16)
    A = tl.where(r[:, None] == r[None, :], 1., 0.)
    for i in range(1, 16):
        li = tl.sum(tl.where(r[:, None] == i, L, 0.), 0)          # L[i, m]
        row = -tl.sum(li[:, None] * A, 0) + tl.where(r == i, 1., 0.)
        A = tl.where(r[:, None] == i, row[None, :], A)
    return A


@triton.jit
def _store_blk(base, X, bi: tl.constexpr, bj: tl.constexpr):
    r = tl.arange(0, 16)
    tl.store(base + (bi * 16 + r)[:, None] * 64 + (bj * 16 + r)[None, :], X.to(base.dtype.element_ty))


@triton.jit
def _intra_body(q, k, v, g, beta, A_log, dt_bias, w_out, u_out, qp_out, oi_out, kd_out, gl_out,
                a_scr,
                chunk_info, scale, sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh,
                HV, GROUP, K: tl.constexpr, V: tl.constexpr,
                USE_GATE: tl.constexpr, BETA_SIGMOID: tl.constexpr, L2NORM: tl.constexpr,
                PREC: tl.constexpr):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // GROUP
    dt = w_out.dtype.element_ty
    tstart = tl.load(chunk_info + i_c * 4 + 1)
    lo = tl.load(chunk_info + i_c * 4 + 2)
    hi = tl.load(chunk_info + i_c * 4 + 3)
    A_log_h = 0.
    dt_bias_h = 0.
    if USE_GATE:
        A_log_h = tl.load(A_log + i_hv).to(tl.float32)
        dt_bias_h = tl.load(dt_bias + i_hv).to(tl.float32)
    oK = tl.arange(0, K)
    oV = tl.arange(0, V)
    r16 = tl.arange(0, 16)

    # ---- 16-row blocks: gate, cumsum, kkt blocks ---------------------------------------------
    t0 = tstart + r16
    m0 = (t0 >= lo) & (t0 < hi)
    t0 = tl.where(m0, t0, 0)
    t1 = tstart + 16 + r16
    m1 = (t1 >= lo) & (t1 < hi)
    t1 = tl.where(m1, t1, 0)
    t2 = tstart + 32 + r16
    m2 = (t2 >= lo) & (t2 < hi)
    t2 = tl.where(m2, t2, 0)
    t3 = tstart + 48 + r16
    m3 = (t3 >= lo) & (t3 < hi)
    t3 = tl.where(m3, t3, 0)
    g0, b0 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t0, m0, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g1, b1 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t1, m1, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g2, b2 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t2, m2, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g3, b3 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t3, m3, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g0 = tl.cumsum(g0, 0)
    g1 = tl.cumsum(g1, 0) + tl.sum(tl.where(r16 == 15, g0, 0.), 0)
    g2 = tl.cumsum(g2, 0) + tl.sum(tl.where(r16 == 15, g1, 0.), 0)
    g3 = tl.cumsum(g3, 0) + tl.sum(tl.where(r16 == 15, g2, 0.), 0)
    k0 = _load_rows(k, t0, m0, i_h, skt, skh, oK, L2NORM).to(dt)
    k1 = _load_rows(k, t1, m1, i_h, skt, skh, oK, L2NORM).to(dt)
    k2 = _load_rows(k, t2, m2, i_h, skt, skh, oK, L2NORM).to(dt)
    k3 = _load_rows(k, t3, m3, i_h, skt, skh, oK, L2NORM).to(dt)

    k0T = _load_cols(k, t0, m0, i_h, skt, skh, oK, L2NORM).to(dt)
    k1T = _load_cols(k, t1, m1, i_h, skt, skh, oK, L2NORM).to(dt)
    k2T = _load_cols(k, t2, m2, i_h, skt, skh, oK, L2NORM).to(dt)
    k3T = _load_cols(k, t3, m3, i_h, skt, skh, oK, L2NORM).to(dt)
    L00 = _kkt_block(k0, k0T, g0, g0, b0, True, PREC)
    L11 = _kkt_block(k1, k1T, g1, g1, b1, True, PREC)
    L22 = _kkt_block(k2, k2T, g2, g2, b2, True, PREC)
    L33 = _kkt_block(k3, k3T, g3, g3, b3, True, PREC)
    L10 = _kkt_block(k1, k0T, g1, g0, b1, False, PREC)
    L20 = _kkt_block(k2, k0T, g2, g0, b2, False, PREC)
    L21 = _kkt_block(k2, k1T, g2, g1, b2, False, PREC)
    L30 = _kkt_block(k3, k0T, g3, g0, b3, False, PREC)
    L31 = _kkt_block(k3, k1T, g3, g1, b3, False, PREC)
    L32 = _kkt_block(k3, k2T, g3, g2, b3, False, PREC)

    # ---- A = (I + L)^-1 by block forward substitution (fp32, IEEE) ----------------------------
    A00 = _inv16(L00)
    A11 = _inv16(L11)
    A22 = _inv16(L22)
    A33 = _inv16(L33)
    A10 = -tl.dot(A11, tl.dot(L10, A00, input_precision="ieee"), input_precision="ieee")
    A21 = -tl.dot(A22, tl.dot(L21, A11, input_precision="ieee"), input_precision="ieee")
    A32 = -tl.dot(A33, tl.dot(L32, A22, input_precision="ieee"), input_precision="ieee")
    A20 = -tl.dot(A22, tl.dot(L20, A00, input_precision="ieee")
                  + tl.dot(L21, A10, input_precision="ieee"), input_precision="ieee")
    A31 = -tl.dot(A33, tl.dot(L31, A11, input_precision="ieee")
                  + tl.dot(L32, A21, input_precision="ieee"), input_precision="ieee")
    A30 = -tl.dot(A33, tl.dot(L30, A00, input_precision="ieee")
                  + tl.dot(L31, A10, input_precision="ieee")
                  + tl.dot(L32, A20, input_precision="ieee"), input_precision="ieee")
    base = a_scr + (i_c * HV + i_hv).to(tl.int64) * 4096
    _store_blk(base, A00, 0, 0)
    _store_blk(base, A10, 1, 0)
    _store_blk(base, A11, 1, 1)
    _store_blk(base, A20, 2, 0)
    _store_blk(base, A21, 2, 1)
    _store_blk(base, A22, 2, 2)
    _store_blk(base, A30, 3, 0)
    _store_blk(base, A31, 3, 1)
    _store_blk(base, A32, 3, 2)
    _store_blk(base, A33, 3, 3)
    tl.debug_barrier()

    # ---- full 64-row chunk: w, u, Q', O_intra ----------------------------------------------------
    r64 = tl.arange(0, 64)
    t = tstart + r64
    m = (t >= lo) & (t < hi)
    t = tl.where(m, t, 0)
    A = tl.load(base + r64[:, None] * 64 + r64[None, :],
                mask=(r64[:, None] // 16) >= (r64[None, :] // 16), other=0.).to(dt)
    gr, bt = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t, m, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    gc = tl.cumsum(gr, 0)
    g_last = tl.sum(tl.where(r64 == 63, gc, 0.), 0)   # masked tail tokens carry g = 0
    tl.store(gl_out + i_c * HV + i_hv, g_last)
    eg = tl.exp(gc)
    kk = _load_rows(k, t, m, i_h, skt, skh, oK, L2NORM)
    w = tl.dot(A, (kk * (bt * eg)[:, None]).to(dt), input_precision=PREC)
    vv = tl.load(v + t[:, None] * svt + i_hv * svh + oV[None, :], mask=m[:, None], other=0.).to(tl.float32)
    u = tl.dot(A, (vv * bt[:, None]).to(dt), input_precision=PREC)
    qq = _load_rows(q, t, m, i_h, sqt, sqh, oK, L2NORM) * scale
    causal = r64[:, None] >= r64[None, :]
    kkT = _load_cols(k, t, m, i_h, skt, skh, oK, L2NORM)
    P = tl.dot(qq.to(dt), kkT.to(dt), input_precision=PREC)
    P = P * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], float("-inf")))
    Pd = P.to(dt)
    wd = w.to(dt)
    ud = u.to(dt)
    qp = qq * eg[:, None] - tl.dot(Pd, wd, input_precision=PREC)
    oi = tl.dot(Pd, ud, input_precision=PREC)
    rowK = (t[:, None] * HV + i_hv).to(tl.int64) * K + oK[None, :]
    rowV = (t[:, None] * HV + i_hv).to(tl.int64) * V + oV[None, :]
    tl.store(w_out + rowK, wd, mask=m[:, None])
    tl.store(qp_out + rowK, qp.to(dt), mask=m[:, None])
    tl.store(u_out + rowV, ud, mask=m[:, None])
    tl.store(oi_out + rowV, oi.to(dt), mask=m[:, None])
    # keys decayed to the chunk end, for the state update of the sequential kernel
    kdec = tl.where(m[:, None], kk * tl.exp(g_last - gc)[:, None], 0.)
    tl.store(kd_out + rowK, kdec.to(dt), mask=m[:, None])


@autotuned(
    configs=[triton.Config({}, num_warps=nw, num_stages=1) for nw in (4, 8)],
    key=["HV", "K", "V", "NT_BUCKET", "PREC"],
    fixed={},
)
def _intra_kernel(q, k, v, g, beta, A_log, dt_bias, w_out, u_out, qp_out, oi_out, kd_out, gl_out,
                  a_scr,
                  chunk_info, scale, sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, NT_BUCKET,
                  HV, GROUP, K: tl.constexpr, V: tl.constexpr,
                  USE_GATE: tl.constexpr, BETA_SIGMOID: tl.constexpr, L2NORM: tl.constexpr,
                  PREC: tl.constexpr):
    _intra_body(q, k, v, g, beta, A_log, dt_bias, w_out, u_out, qp_out, oi_out, kd_out, gl_out,
                a_scr,
                chunk_info, scale, sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh,
                HV, GROUP, K, V, USE_GATE, BETA_SIGMOID, L2NORM, PREC)


_intra_kernel, _INTRA_KW = _intra_kernel


@triton.jit
def _state_step(c, j, S, kd, w, u, qp, oi, gl, o, hb, store_slot, ts0, bos, eos, i_hv,
                oK, oV, r64, sidx, HV, K: tl.constexpr, V: tl.constexpr,
                STORE_B: tl.constexpr, PREC: tl.constexpr):
    dt = w.dtype.element_ty
    t = ts0 + j * 64 + r64
    m = (t >= bos) & (t < eos)
    t = tl.where(m, t, 0)
    rowK = (t[:, None] * HV + i_hv).to(tl.int64) * K + oK[None, :]
    rowV = (t[:, None] * HV + i_hv).to(tl.int64) * V + oV[None, :]
    w_c = tl.load(w + rowK, mask=m[:, None], other=0.)
    q_c = tl.load(qp + rowK, mask=m[:, None], other=0.)
    kdT = tl.load(kd + (t[None, :] * HV + i_hv).to(tl.int64) * K + oK[:, None], mask=m[None, :],
                  other=0.)
    u_c = tl.load(u + rowV, mask=m[:, None], other=0.).to(tl.float32)
    oi_c = tl.load(oi + rowV, mask=m[:, None], other=0.).to(tl.float32)
    g_last = tl.load(gl + c * HV + i_hv)
    Sd = S.to(dt)
    vn = u_c - tl.dot(w_c, Sd, input_precision=PREC)
    o_c = tl.dot(q_c, Sd, input_precision=PREC) + oi_c
    tl.store(o + rowV, o_c.to(o.dtype.element_ty), mask=m[:, None])
    S = S * tl.exp(g_last) + tl.dot(kdT, vn.to(dt), input_precision=PREC)
    if STORE_B:
        slot = tl.load(store_slot + c)
        tl.store(hb + (tl.maximum(slot, 0) * HV + i_hv).to(tl.int64) * K * V + sidx,
                 S.to(hb.dtype.element_ty), mask=(slot >= 0) & (sidx >= 0))
    return S


@autotuned(
    # KERNELS_STATE_CONFIGS="BV,num_warps,num_stages;..." overrides the list (validated configs)
    configs=[triton.Config({"BV": int(bv)}, num_warps=int(nw), num_stages=int(ns)) for bv, nw, ns in
             (c.split(",") for c in os.environ.get("KERNELS_STATE_CONFIGS",
                                                   "32,4,2;32,4,3;64,4,2;64,4,3").split(";"))],
    key=["HV", "K", "V", "NT_BUCKET", "N_BUCKET", "PREC", "STORE_B"],
    fixed={"BV": 32},
    prune=lambda configs, nargs, **kw: ([c for c in configs if c.kwargs["BV"] <= kw.get("V", nargs.get("V", 1 << 30))]
                                        or configs[:1]),
)
def _state_kernel(kd, w, u, qp, oi, gl, o, h0, ht, hb, seq_info, chunk_info, store_slot,
                  NT_BUCKET, N_BUCKET,
                  HV, GROUP, K: tl.constexpr, V: tl.constexpr,
                  BV: tl.constexpr, HAS_H0: tl.constexpr,
                  STORE_B: tl.constexpr, PREC: tl.constexpr, WHILE_LOOP: tl.constexpr):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    bos = tl.load(seq_info + i_n * 4)
    eos = tl.load(seq_info + i_n * 4 + 1)
    c0 = tl.load(seq_info + i_n * 4 + 2)
    c1 = tl.load(seq_info + i_n * 4 + 3)
    ts0 = tl.load(chunk_info + c0 * 4 + 1, mask=c0 < c1, other=0)   # first (virtual) token
    oK = tl.arange(0, K)
    oV = i_v * BV + tl.arange(0, BV)
    r64 = tl.arange(0, 64)
    sidx = (oK[:, None] * V + oV[None, :])
    S = tl.zeros([K, BV], dtype=tl.float32)
    if HAS_H0:
        S += tl.load(h0 + (i_n * HV + i_hv).to(tl.int64) * K * V + sidx).to(tl.float32)
    if WHILE_LOOP:
        # the interpreter keeps scalars as 1-element arrays, which range() cannot take
        c = c0
        while c < c1:
            S = _state_step(c, c - c0, S, kd, w, u, qp, oi, gl, o, hb, store_slot, ts0, bos, eos,
                            i_hv, oK, oV, r64, sidx, HV, K, V, STORE_B, PREC)
            c += 1
    else:
        for c in range(c0, c1):
            S = _state_step(c, c - c0, S, kd, w, u, qp, oi, gl, o, hb, store_slot, ts0, bos, eos,
                            i_hv, oK, oV, r64, sidx, HV, K, V, STORE_B, PREC)
    tl.store(ht + (i_n * HV + i_hv).to(tl.int64) * K * V + sidx, S)


_state_kernel, _STATE_KW = _state_kernel


def _rows(x: torch.Tensor, TT: int, heads: int, dim: Optional[int]):
    """Flatten [B, T, heads(, dim)] to [B*T, heads(, dim)] without copying when strides allow."""
    shape = (TT, heads) if dim is None else (TT, heads, dim)
    x = x.reshape(shape)
    if dim is not None and x.stride(2) != 1:
        x = x.contiguous()
    return x


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None,
                           start_positions=None, use_qk_l2norm=False, boundary_states=True,
                           state_dtype=torch.float32, boundary_stride=1, boundary_indices=None,
                           A_log=None, dt_bias=None, use_gate_in_kernel=False,
                           use_beta_sigmoid=False, chunk_metadata: Optional[ChunkMetadata] = None,
                           input_precision: Optional[str] = None):
    """Chunked gated-delta-rule forward.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g (natural-log decay, or the raw ``a`` when
    ``use_gate_in_kernel``) and beta (or its logit when ``use_beta_sigmoid``) ``[B, T, HV]``.
    Varlen: ``B == 1`` and ``cu_seqlens``. Batched inputs (B > 1) are treated as B sequences.

    Returns ``(o [B, T, HV, V], final_state [N, HV, K, V] fp32, boundary_states)`` where
    ``boundary_states`` is ``[NB, HV, K, V]`` in ``state_dtype`` (None when
    ``boundary_states=False``): the state after every emitted absolute 64-multiple position,
    sequence-major (sequence n owns rows ``meta.boundary_offsets[n]:[n+1]``, positions in
    ``meta.boundary_positions[n]``). With ``chunk_metadata`` given (see ``prepare_chunk_metadata``)
    the call does no device-to-host sync and the metadata's boundary selection is used.
    ``input_precision`` applies to fp32 inputs on GPU ("ieee" default, "tf32", "tf32x3").
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (B, T) or HV % H:
        raise ValueError(f"bad shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    if g.shape != (B, T, HV) or beta.shape != (B, T, HV):
        raise ValueError("g and beta must be [B, T, HV]")
    for d in (K, V):
        if d < 16 or d > 256 or d & (d - 1):
            raise ValueError("K and V must be powers of two in [16, 256]")
    if use_gate_in_kernel and (A_log is None or dt_bias is None):
        raise ValueError("use_gate_in_kernel needs A_log and dt_bias")
    dev = q.device
    dt = q.dtype
    if k.dtype != dt or v.dtype != dt:
        k, v = k.to(dt), v.to(dt)
    if scale is None:
        scale = K ** -0.5
    meta = resolve_metadata(B, T, dev, cu_seqlens, start_positions, boundary_stride,
                            boundary_indices, chunk_metadata)
    N, TT, NT = meta.num_seqs, B * T, meta.num_chunks
    if meta.total_tokens != TT:
        raise ValueError(f"metadata covers {meta.total_tokens} tokens, inputs have {TT}")
    if initial_state is not None and initial_state.shape != (N, HV, K, V):
        raise ValueError(f"initial_state must be {(N, HV, K, V)}")
    q2, k2 = _rows(q, TT, H, K), _rows(k, TT, H, K)
    v2 = _rows(v, TT, HV, V)
    g2, b2 = _rows(g, TT, HV, None), _rows(beta, TT, HV, None)
    store_b = bool(boundary_states)
    o = torch.empty(TT, HV, V, dtype=dt, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    hb = (torch.empty(meta.num_boundaries, HV, K, V, dtype=state_dtype, device=dev)
          if store_b else None)
    if dt == torch.float32:
        prec = input_precision or "ieee"
    else:
        prec = "tf32"
    if NT > 0:
        w = torch.empty(TT, HV, K, dtype=dt, device=dev)
        qp = torch.empty(TT, HV, K, dtype=dt, device=dev)
        u = torch.empty(TT, HV, V, dtype=dt, device=dev)
        oi = torch.empty(TT, HV, V, dtype=dt, device=dev)
        kd = torch.empty(TT, HV, K, dtype=dt, device=dev)
        glast = torch.empty(NT, HV, dtype=torch.float32, device=dev)
        a_scr = torch.empty(NT, HV, 64, 64, dtype=dt, device=dev)
        if use_gate_in_kernel:
            A_log_t = A_log.float().contiguous()
            dt_bias_t = dt_bias.float().contiguous()
        else:
            A_log_t = dt_bias_t = glast
        intra_kernel, intra_kw = _intra_kernel, _INTRA_KW
        forced_i = os.environ.get("KERNELS_FORCE_INTRA_CONFIG")   # "num_warps" (debug)
        if forced_i and not INTERPRET:
            intra_kernel, intra_kw = _intra_kernel.fn, dict(num_warps=int(forced_i), num_stages=1)
        intra_kernel[(NT, HV)](
            q2, k2, v2, g2, b2, A_log_t, dt_bias_t, w, u, qp, oi, kd, glast, a_scr, meta.chunk_info,
            float(scale), q2.stride(0), q2.stride(1), k2.stride(0), k2.stride(1), v2.stride(0),
            v2.stride(1), g2.stride(0), g2.stride(1), b2.stride(0), b2.stride(1), meta.bucket,
            HV=HV, GROUP=HV // H, K=K, V=V, USE_GATE=bool(use_gate_in_kernel),
            BETA_SIGMOID=bool(use_beta_sigmoid), L2NORM=bool(use_qk_l2norm), PREC=prec,
            **intra_kw)
    else:
        w = qp = u = oi = kd = glast = o
    h0 = initial_state.float().contiguous() if initial_state is not None else ht
    grid = lambda META: (N, HV, triton.cdiv(V, META["BV"]))   # noqa: E731
    state_kernel, state_kw = _state_kernel, _STATE_KW
    forced = os.environ.get("KERNELS_FORCE_STATE_CONFIG")   # "BV,num_warps,num_stages" (debug)
    if forced and not INTERPRET:
        bv, nw, ns = (int(x) for x in forced.split(","))
        state_kernel, state_kw = _state_kernel.fn, dict(BV=bv, num_warps=nw, num_stages=ns)
    if "BV" in state_kw:
        state_kw = dict(state_kw, BV=min(state_kw["BV"], V))
    if N > 0:
        state_kernel[grid](
            kd, w, u, qp, oi, glast, o, h0, ht, hb if store_b else ht, meta.seq_info,
            meta.chunk_info, meta.store_slot, meta.bucket,
            1 << max(0, N * HV - 1).bit_length(),
            HV=HV, GROUP=HV // H, K=K, V=V,
            HAS_H0=initial_state is not None, STORE_B=store_b and meta.num_boundaries > 0,
            PREC=prec, WHILE_LOOP=INTERPRET, **state_kw)
    return o.reshape(B, T, HV, V), ht, hb
