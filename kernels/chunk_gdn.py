"""Chunked gated delta rule, forward only, emitting exactly resumable chunk-boundary states.

Math (per value head, C = 64 tokens per chunk, state S is K x V, gamma = chunk-local cumsum of g):
  L   = strict_tril(diag(beta) (K K^T o exp(gamma_i - gamma_j)))
  A   = (I + L)^-1                       (block forward substitution on 16 x 16 blocks)
  w   = A diag(beta exp(gamma)) K,   u = A diag(beta) V
  v'  = u - w S_c
  S  <- exp(gamma_last) S + (K o exp(gamma_last - gamma))^T v'
  O   = diag(exp(gamma)) Q S_c + tril(Q K^T o exp(gamma_i - gamma_j)) v'     (Q l2-normed, scaled)
(q and k l2-normalised when asked; the norms and the scale multiply fp32 matrix-product results.)

Three kernels, split where the work changes shape (the split FLA uses, written from the math):
  1. ``_prep_kernel`` (one program per chunk x value head, fully parallel): gate / beta, the
     chunk-local cumsum gamma, kkt + solve, w and u.
  2. ``_state_kernel`` (one program per sequence x value head x V block, sequential over chunks):
     stores the chunk-start state h_c (input dtype, read by kernel 3), v' = u - w S, the state
     update, the boundary states (``state_dtype``, default fp32) and the final state (fp32).
     Two matrix products per chunk.
  3. ``_output_kernel`` (one program per chunk x value head x V block, fully parallel): O.

Head dims K, V may be any size in [16, 256]: tiles are padded to the next power of two and every
load / store is masked on the real size.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from kernels._common import INTERPRET, ChunkMetadata, prepare_chunk_metadata, resolve_metadata

__all__ = ["chunk_gated_delta_rule", "prepare_chunk_metadata", "ChunkMetadata", "CONFIGS",
           "MAX_HEAD_DIM", "MIN_HEAD_DIM"]

MIN_HEAD_DIM, MAX_HEAD_DIM = 1, 256

# Launch configurations (fixed, no autotuning: every new shape would otherwise re-benchmark
# the candidates, which dominates the cold start of a replay). ``BV`` is the V block of the
# state and output kernels; it is clamped to the padded V. Overridable for experiments, e.g.
# KERNELS_CONFIG_STATE="BV=32,num_warps=4,num_stages=2".
CONFIGS = {
    "prep": dict(num_warps=4, num_stages=1),
    "state": dict(BV=32, num_warps=4, num_stages=2),
    "out": dict(BV=64, num_warps=4, num_stages=2),
}


def _config(name: str) -> dict:
    env = os.environ.get(f"KERNELS_CONFIG_{name.upper()}")
    cfg = dict(CONFIGS[name])
    if env:
        for item in env.split(","):
            key, val = item.split("=")
            cfg[key.strip()] = int(val)
    return cfg


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(int(n)))


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
def _load_rows(ptr, tc, m, i_h, st, sh, offs, D):
    """Rows ``tc`` as a [rows, BD] fp32 block (columns past ``D`` are zero)."""
    return tl.load(ptr + tc[:, None] * st + i_h * sh + offs[None, :],
                   mask=m[:, None] & (offs < D)[None, :], other=0.).to(tl.float32)


@triton.jit
def _load_cols(ptr, tc, m, i_h, st, sh, offs, D):
    """Rows ``tc`` loaded transposed, as a [BD, rows] block (no register transpose: a
    register-transposed wgmma operand gave wrong results on an H200 with triton 3.6)."""
    return tl.load(ptr + tc[None, :] * st + i_h * sh + offs[:, None],
                   mask=m[None, :] & (offs < D)[:, None], other=0.).to(tl.float32)


@triton.jit
def _rnorm(x, axis: tl.constexpr, l2norm):
    """1 / ||x|| along ``axis`` (the l2norm of the math, eps 1e-6 under the root), or 1.

    The kernels never round an l2-normalised (or scaled) q / k to the input dtype: the raw
    half-precision rows go into the matrix products and these factors are applied to the fp32
    results. When q.k cancels (|q.k| << |q||k|) a rounded normalised copy would carry a
    relative error of 2^-9 |q||k| / |q.k| (bf16) into the output."""
    n = 1. / tl.sqrt(tl.sum(x * x, axis) + 1e-6)
    return tl.where(l2norm != 0, n, 1.)


@triton.jit
def _kkt_block(ki, kjT, gi, gj, bi, ri, rj, DIAG: tl.constexpr, PREC: tl.constexpr):
    r = tl.arange(0, 16)
    if DIAG:
        keep = r[:, None] > r[None, :]
    else:
        keep = r[:, None] >= 0
    d = tl.exp(tl.where(keep, gi[:, None] - gj[None, :], float("-inf")))
    return tl.dot(ki, kjT, input_precision=PREC) * (bi * ri)[:, None] * rj[None, :] * d


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
def _rows16(tstart, lo, hi, blk: tl.constexpr):
    t = tstart + blk * 16 + tl.arange(0, 16)
    m = (t >= lo) & (t < hi)
    return tl.where(m, t, 0), m


# Runtime flags are kept out of Triton's "== 1" integer specialisation: one compiled kernel
# serves calls with and without l2norm / initial state / boundary states.
@triton.jit(do_not_specialize=["l2norm"])
def _prep_kernel(k, v, g, beta, A_log, dt_bias, w_out, u_out, kd_out, gc_out, gl_out, a_scr,
                 chunk_info,
                 skt, skh, svt, svh, sgt, sgh, sbt, sbh,
                 HV, GROUP, K, V, BK: tl.constexpr, BVF: tl.constexpr, BC: tl.constexpr,
                 USE_GATE: tl.constexpr, BETA_SIGMOID: tl.constexpr, l2norm,
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
    oK = tl.arange(0, BK)
    r16 = tl.arange(0, 16)

    # ---- 16-row blocks: gate, cumsum, kkt blocks ---------------------------------------------
    t0, m0 = _rows16(tstart, lo, hi, 0)
    t1, m1 = _rows16(tstart, lo, hi, 1)
    t2, m2 = _rows16(tstart, lo, hi, 2)
    t3, m3 = _rows16(tstart, lo, hi, 3)
    g0, b0 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t0, m0, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g1, b1 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t1, m1, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g2, b2 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t2, m2, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g3, b3 = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t3, m3, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    g0 = tl.cumsum(g0, 0)
    g1 = tl.cumsum(g1, 0) + tl.sum(tl.where(r16 == 15, g0, 0.), 0)
    g2 = tl.cumsum(g2, 0) + tl.sum(tl.where(r16 == 15, g1, 0.), 0)
    g3 = tl.cumsum(g3, 0) + tl.sum(tl.where(r16 == 15, g2, 0.), 0)
    k0 = _load_rows(k, t0, m0, i_h, skt, skh, oK, K)
    k1 = _load_rows(k, t1, m1, i_h, skt, skh, oK, K)
    k2 = _load_rows(k, t2, m2, i_h, skt, skh, oK, K)
    k3 = _load_rows(k, t3, m3, i_h, skt, skh, oK, K)
    r0, r1 = _rnorm(k0, 1, l2norm), _rnorm(k1, 1, l2norm)
    r2, r3 = _rnorm(k2, 1, l2norm), _rnorm(k3, 1, l2norm)
    k0, k1, k2, k3 = k0.to(dt), k1.to(dt), k2.to(dt), k3.to(dt)
    k0T = _load_cols(k, t0, m0, i_h, skt, skh, oK, K).to(dt)
    k1T = _load_cols(k, t1, m1, i_h, skt, skh, oK, K).to(dt)
    k2T = _load_cols(k, t2, m2, i_h, skt, skh, oK, K).to(dt)
    k3T = _load_cols(k, t3, m3, i_h, skt, skh, oK, K).to(dt)
    L00 = _kkt_block(k0, k0T, g0, g0, b0, r0, r0, True, PREC)
    L11 = _kkt_block(k1, k1T, g1, g1, b1, r1, r1, True, PREC)
    L22 = _kkt_block(k2, k2T, g2, g2, b2, r2, r2, True, PREC)
    L33 = _kkt_block(k3, k3T, g3, g3, b3, r3, r3, True, PREC)
    L10 = _kkt_block(k1, k0T, g1, g0, b1, r1, r0, False, PREC)
    L20 = _kkt_block(k2, k0T, g2, g0, b2, r2, r0, False, PREC)
    L21 = _kkt_block(k2, k1T, g2, g1, b2, r2, r1, False, PREC)
    L30 = _kkt_block(k3, k0T, g3, g0, b3, r3, r0, False, PREC)
    L31 = _kkt_block(k3, k1T, g3, g1, b3, r3, r1, False, PREC)
    L32 = _kkt_block(k3, k2T, g3, g2, b3, r3, r2, False, PREC)

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

    # ---- full 64-row chunk: gamma, w, u ---------------------------------------------------------
    r64 = tl.arange(0, 64)
    t = tstart + r64
    m = (t >= lo) & (t < hi)
    t = tl.where(m, t, 0)
    A = tl.load(base + r64[:, None] * 64 + r64[None, :],
                mask=(r64[:, None] // 16) >= (r64[None, :] // 16), other=0.).to(dt)
    gr, bt = _load_gate_beta(g, beta, A_log_h, dt_bias_h, t, m, i_hv, sgt, sgh, sbt, sbh, USE_GATE, BETA_SIGMOID)
    gc = tl.cumsum(gr, 0)
    g_last = tl.sum(tl.where(r64 == 63, gc, 0.), 0)          # masked tail tokens carry g = 0
    tl.store(gl_out + i_c * HV + i_hv, g_last)
    tl.store(gc_out + t.to(tl.int64) * HV + i_hv, gc, mask=m)
    # w and u in column blocks of at most 64 (keeps the live fp32 tiles small: no spills)
    ksq = tl.zeros([64], dtype=tl.float32)
    for kb in tl.static_range(0, BK, BC):
        kc = _load_rows(k, t, m, i_h, skt, skh, kb + tl.arange(0, BC), K)
        ksq += tl.sum(kc * kc, 1)
    rk = tl.where(l2norm != 0, 1. / tl.sqrt(ksq + 1e-6), 1.)
    fk = bt * tl.exp(gc) * rk
    fd = rk * tl.exp(g_last - gc)        # keys decayed to the chunk end, for the state update
    row = (t[:, None] * HV + i_hv).to(tl.int64)
    for kb in tl.static_range(0, BK, BC):
        oc = kb + tl.arange(0, BC)
        kc = _load_rows(k, t, m, i_h, skt, skh, oc, K)
        w = tl.dot(A, (kc * fk[:, None]).to(dt), input_precision=PREC)
        mk = m[:, None] & (oc < K)[None, :]
        tl.store(w_out + row * K + oc[None, :], w.to(dt), mask=mk)
        tl.store(kd_out + row * K + oc[None, :], (kc * fd[:, None]).to(dt), mask=mk)
    for vb in tl.static_range(0, BVF, BC):
        oc = vb + tl.arange(0, BC)
        vv = tl.load(v + t[:, None] * svt + i_hv * svh + oc[None, :],
                     mask=m[:, None] & (oc < V)[None, :], other=0.).to(tl.float32)
        u = tl.dot(A, (vv * bt[:, None]).to(dt), input_precision=PREC)
        tl.store(u_out + row * V + oc[None, :], u.to(dt), mask=m[:, None] & (oc < V)[None, :])


@triton.jit
def _state_step(c, j, S, kd, w, u, gl, h_out, vn_out, hb, store_slot, ts0, bos, eos, i_hv,
                oK, oV, mKV, r64, sidx, HV, K, V, store_b, PREC: tl.constexpr):
    dt = w.dtype.element_ty
    # chunk-start state for the output kernel (always in the input dtype, like FLA's h)
    tl.store(h_out + (c * HV + i_hv).to(tl.int64) * K * V + sidx, S.to(dt), mask=mKV)
    t = ts0 + j * 64 + r64
    m = (t >= bos) & (t < eos)
    t = tl.where(m, t, 0)
    row = (t[:, None] * HV + i_hv).to(tl.int64)
    mV = oV < V
    w_c = tl.load(w + row * K + oK[None, :], mask=m[:, None] & (oK < K)[None, :], other=0.)
    u_c = tl.load(u + row * V + oV[None, :], mask=m[:, None] & mV[None, :], other=0.)
    Sd = S.to(dt)
    vn = u_c.to(tl.float32) - tl.dot(w_c, Sd, input_precision=PREC)
    vnd = vn.to(dt)
    tl.store(vn_out + row * V + oV[None, :], vnd, mask=m[:, None] & mV[None, :])
    g_last = tl.load(gl + c * HV + i_hv)
    # decayed (and l2-normed) keys from the prep kernel, loaded as [K, 64]
    kdT = tl.load(kd + (t[None, :] * HV + i_hv).to(tl.int64) * K + oK[:, None],
                  mask=m[None, :] & (oK < K)[:, None], other=0.)
    S = S * tl.exp(g_last) + tl.dot(kdT, vnd, input_precision=PREC)
    # boundary state; a runtime flag (not constexpr) so calls with and without boundaries share
    # one compiled kernel. Full-shape boolean mask: triton 3.9's interpreter rejects scalar masks.
    slot = tl.load(store_slot + c)
    slot = tl.where(store_b != 0, slot, -1)
    ok = ((sidx * 0 + slot) >= 0) & mKV
    tl.store(hb + (tl.maximum(slot, 0) * HV + i_hv).to(tl.int64) * K * V + sidx,
             S.to(hb.dtype.element_ty), mask=ok)
    return S


@triton.jit(do_not_specialize=["has_h0", "store_b"])
def _state_kernel(kd, w, u, gl, h_out, vn_out, h0, ht, hb, seq_info, chunk_info, store_slot,
                  HV, K, V, BK: tl.constexpr, BV: tl.constexpr,
                  has_h0, store_b, PREC: tl.constexpr, WHILE_LOOP: tl.constexpr):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    bos = tl.load(seq_info + i_n * 4)
    eos = tl.load(seq_info + i_n * 4 + 1)
    c0 = tl.load(seq_info + i_n * 4 + 2)
    c1 = tl.load(seq_info + i_n * 4 + 3)
    ts0 = tl.load(chunk_info + c0 * 4 + 1, mask=c0 < c1, other=0)   # first (virtual) token
    oK = tl.arange(0, BK)
    oV = i_v * BV + tl.arange(0, BV)
    r64 = tl.arange(0, 64)
    sidx = oK[:, None] * V + oV[None, :]
    mKV = (oK < K)[:, None] & (oV < V)[None, :]
    # masked load instead of a constexpr branch: one compiled kernel with or without h0
    S = tl.load(h0 + (i_n * HV + i_hv).to(tl.int64) * K * V + sidx,
                mask=mKV & ((sidx * 0 + has_h0) != 0), other=0.).to(tl.float32)
    if WHILE_LOOP:
        # the interpreter keeps scalars as 1-element arrays, which range() cannot take
        c = c0
        while c < c1:
            S = _state_step(c, c - c0, S, kd, w, u, gl, h_out, vn_out, hb, store_slot, ts0,
                            bos, eos, i_hv, oK, oV, mKV, r64, sidx, HV, K, V, store_b, PREC)
            c += 1
    else:
        for c in range(c0, c1):
            S = _state_step(c, c - c0, S, kd, w, u, gl, h_out, vn_out, hb, store_slot, ts0,
                            bos, eos, i_hv, oK, oV, mKV, r64, sidx, HV, K, V, store_b, PREC)
    tl.store(ht + (i_n * HV + i_hv).to(tl.int64) * K * V + sidx, S, mask=mKV)


@triton.jit(do_not_specialize=["l2norm"])
def _output_kernel(q, k, gc, h, vn, o, chunk_info, scale, sqt, sqh, skt, skh,
                   HV, GROUP, K, V, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
                   l2norm, PREC: tl.constexpr):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // GROUP
    dt = vn.dtype.element_ty
    tstart = tl.load(chunk_info + i_c * 4 + 1)
    lo = tl.load(chunk_info + i_c * 4 + 2)
    hi = tl.load(chunk_info + i_c * 4 + 3)
    r64 = tl.arange(0, 64)
    t = tstart + r64
    m = (t >= lo) & (t < hi)
    t = tl.where(m, t, 0)
    oV = i_v * BV + tl.arange(0, BV)
    mV = oV < V
    gam = tl.load(gc + t.to(tl.int64) * HV + i_hv, mask=m, other=0.)
    # Q K^T and Q h over K blocks of at most 64; the l2norm and the scale are applied to the
    # fp32 products afterwards, never to rounded copies of q / k
    qsq = tl.zeros([64], dtype=tl.float32)
    ksq = tl.zeros([64], dtype=tl.float32)
    P = tl.zeros([64, 64], dtype=tl.float32)
    qh = tl.zeros([64, BV], dtype=tl.float32)
    hbase = h + (i_c * HV + i_hv).to(tl.int64) * K * V
    for kb in tl.static_range(0, BK, BC):
        oc = kb + tl.arange(0, BC)
        qc = _load_rows(q, t, m, i_h, sqt, sqh, oc, K)
        kc = _load_cols(k, t, m, i_h, skt, skh, oc, K)
        qsq += tl.sum(qc * qc, 1)
        ksq += tl.sum(kc * kc, 0)
        hc = tl.load(hbase + oc[:, None] * V + oV[None, :], mask=(oc < K)[:, None] & mV[None, :],
                     other=0.)
        P += tl.dot(qc.to(dt), kc.to(dt), input_precision=PREC)
        qh += tl.dot(qc.to(dt), hc.to(dt), input_precision=PREC)
    rq = tl.where(l2norm != 0, 1. / tl.sqrt(qsq + 1e-6), 1.) * scale
    rk = tl.where(l2norm != 0, 1. / tl.sqrt(ksq + 1e-6), 1.)
    causal = r64[:, None] >= r64[None, :]
    P = P * rq[:, None] * rk[None, :] * tl.exp(
        tl.where(causal, gam[:, None] - gam[None, :], float("-inf")))
    row = (t[:, None] * HV + i_hv).to(tl.int64) * V + oV[None, :]
    vc = tl.load(vn + row, mask=m[:, None] & mV[None, :], other=0.)
    acc = qh * (rq * tl.exp(gam))[:, None]
    acc += tl.dot(P.to(dt), vc.to(dt), input_precision=PREC)
    tl.store(o + row, acc.to(o.dtype.element_ty), mask=m[:, None] & mV[None, :])


def _rows(x: torch.Tensor, TT: int, heads: int, dim: Optional[int]):
    """Flatten [B, T, heads(, dim)] to [B*T, heads(, dim)] without copying when strides allow."""
    shape = (TT, heads) if dim is None else (TT, heads, dim)
    x = x.reshape(shape)
    if dim is not None and x.stride(2) != 1:
        x = x.contiguous()
    return x


SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_args(q, k, v, g, beta):
    """Raise ValueError for anything the kernels cannot run (one clear line)."""
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-d [B, T, heads, dim]; got q{tuple(q.shape)} "
                         f"v{tuple(v.shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (B, T) or H == 0 or HV % H:
        raise ValueError(f"bad shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} "
                         f"(need k == q, v [B, T, HV, V] with HV a multiple of H)")
    if g.shape != (B, T, HV) or beta.shape != (B, T, HV):
        raise ValueError(f"g and beta must be [B, T, HV] = {(B, T, HV)}; got "
                         f"g{tuple(g.shape)} beta{tuple(beta.shape)}")
    for name, d in (("K", K), ("V", V)):
        if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
            raise ValueError(f"head dim {name}={d} is not supported (need "
                             f"{MIN_HEAD_DIM} <= {name} <= {MAX_HEAD_DIM})")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q dtype {q.dtype} is not supported (float32, float16, bfloat16)")
    if not (q.device == k.device == v.device == g.device == beta.device):
        raise ValueError("q, k, v, g, beta must be on one device")


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None,
                           start_positions=None, use_qk_l2norm=False, boundary_states=True,
                           state_dtype=torch.float32, boundary_stride=1, boundary_indices=None,
                           A_log=None, dt_bias=None, use_gate_in_kernel=False,
                           use_beta_sigmoid=False, chunk_metadata: Optional[ChunkMetadata] = None,
                           input_precision: Optional[str] = None):
    """Chunked gated-delta-rule forward.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g (natural-log decay, or the raw ``a`` when
    ``use_gate_in_kernel``) and beta (or its logit when ``use_beta_sigmoid``) ``[B, T, HV]``.
    K and V may be any size up to 256. Varlen: ``B == 1`` and ``cu_seqlens``. Batched inputs
    (B > 1) are treated as B sequences.

    Returns ``(o [B, T, HV, V], final_state [N, HV, K, V] fp32, boundary_states)`` where
    ``boundary_states`` is ``[NB, HV, K, V]`` in ``state_dtype`` (None when
    ``boundary_states=False``): the state after every emitted absolute 64-multiple position,
    sequence-major (sequence n owns rows ``meta.boundary_offsets[n]:[n+1]``, positions in
    ``meta.boundary_positions[n]``). With ``chunk_metadata`` given (see ``prepare_chunk_metadata``)
    the call does no device-to-host sync and the metadata's boundary selection is used.
    ``input_precision`` applies to fp32 inputs on GPU ("ieee" default, "tf32", "tf32x3").
    """
    check_args(q, k, v, g, beta)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
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
    if initial_state is not None and tuple(initial_state.shape) != (N, HV, K, V):
        raise ValueError(f"initial_state must be {(N, HV, K, V)}, got {tuple(initial_state.shape)}")
    q2, k2 = _rows(q, TT, H, K), _rows(k, TT, H, K)
    v2 = _rows(v, TT, HV, V)
    g2, b2 = _rows(g, TT, HV, None), _rows(beta, TT, HV, None)
    store_b = bool(boundary_states)
    o = torch.empty(TT, HV, V, dtype=dt, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    hb = (torch.empty(meta.num_boundaries, HV, K, V, dtype=state_dtype, device=dev)
          if store_b else None)
    prec = (input_precision or "ieee") if dt == torch.float32 else "tf32"
    BK, BVF = _pow2(K), _pow2(V)
    common = dict(HV=HV, GROUP=HV // H, K=K, V=V, BK=BK, l2norm=int(bool(use_qk_l2norm)),
                  PREC=prec)
    h0 = initial_state.float().contiguous() if initial_state is not None else ht
    if NT == 0:
        if N > 0:
            ht.copy_(h0) if initial_state is not None else ht.zero_()
        return o.reshape(B, T, HV, V), ht, hb
    w = torch.empty(TT, HV, K, dtype=dt, device=dev)
    kd = torch.empty(TT, HV, K, dtype=dt, device=dev)
    u = torch.empty(TT, HV, V, dtype=dt, device=dev)
    vn = torch.empty(TT, HV, V, dtype=dt, device=dev)
    gcum = torch.empty(TT, HV, dtype=torch.float32, device=dev)
    glast = torch.empty(NT, HV, dtype=torch.float32, device=dev)
    a_scr = torch.empty(NT, HV, 64, 64, dtype=dt, device=dev)
    hbuf = torch.empty(NT, HV, K, V, dtype=dt, device=dev)
    if use_gate_in_kernel:
        A_log_t, dt_bias_t = A_log.float().contiguous(), dt_bias.float().contiguous()
    else:
        A_log_t = dt_bias_t = glast
    _prep_kernel[(NT, HV)](
        k2, v2, g2, b2, A_log_t, dt_bias_t, w, u, kd, gcum, glast, a_scr, meta.chunk_info,
        k2.stride(0), k2.stride(1), v2.stride(0), v2.stride(1), g2.stride(0), g2.stride(1),
        b2.stride(0), b2.stride(1), BVF=BVF, BC=min(BK, BVF, 64), USE_GATE=bool(use_gate_in_kernel),
        BETA_SIGMOID=bool(use_beta_sigmoid), **common, **_config("prep"))
    sc = _config("state")
    sc["BV"] = min(sc["BV"], BVF)
    _state_kernel[(N, HV, triton.cdiv(V, sc["BV"]))](
        kd, w, u, glast, hbuf, vn, h0, ht, hb if store_b else ht, meta.seq_info,
        meta.chunk_info, meta.store_slot, HV=HV, K=K, V=V, BK=BK, PREC=prec,
        has_h0=int(initial_state is not None),
        store_b=int(store_b and meta.num_boundaries > 0), WHILE_LOOP=INTERPRET, **sc)
    oc = _config("out")
    oc["BV"] = min(oc["BV"], BVF)
    _output_kernel[(NT, HV, triton.cdiv(V, oc["BV"]))](
        q2, k2, gcum, hbuf, vn, o, meta.chunk_info, float(scale), q2.stride(0), q2.stride(1),
        k2.stride(0), k2.stride(1), BC=min(BK, 64), **common, **oc)
    return o.reshape(B, T, HV, V), ht, hb
