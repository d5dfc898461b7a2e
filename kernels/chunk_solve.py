"""Stage 1 of the chunked gated delta rule, the solve (``_solve_kernel``; one program per chunk x
value head, fully parallel, 2 warps): gate and beta, the chunk-local cumsum gamma, the ten 16 x 16
blocks of ``diag(beta) K K^T o decay`` in registers, and ``A = (I + L)^-1`` by block forward
substitution. On Hopper at the production shape ``kernels.solve_gluon`` computes the same."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.chunk_tiles import _PROG_SLOTS, _chunk, _colmask, _inside, _rowmask, _softplus


@triton.jit
def _load_gate_beta(
    g, beta, A_log_h, dt_bias_h, gbase, bbase, r, m, sgt, sbt, USE_GATE: tl.constexpr, BETA_SIGMOID: tl.constexpr
):
    gr = tl.load(gbase + r * sgt, mask=m, other=0.0).to(tl.float32)
    if USE_GATE:
        gr = tl.where(m, -tl.exp(A_log_h) * _softplus(gr + dt_bias_h), 0.0)
    b = tl.load(bbase + r * sbt, mask=m, other=0.0).to(tl.float32)
    if BETA_SIGMOID:
        b = tl.where(m, tl.sigmoid(b), 0.0)
    return gr, b


@triton.jit
def _sub_row(L, A, i, r):
    """Row ``i`` of (I + L)^-1 by forward substitution: e_i - sum_m L[i, m] A[m, :]."""
    li = tl.sum(tl.where(r[:, None] == i, L, 0.0), 0)
    row = -tl.sum(li[:, None] * A, 0) + tl.where(r == i, 1.0, 0.0)
    return tl.where(r[:, None] == i, row[None, :], A)


@triton.jit
def _inv16x4(L0, L1, L2, L3):
    """(I + L)^-1 of four strictly lower-triangular 16 x 16 blocks. One loop carries the four
    independent substitutions, so their reductions overlap: 15 dependent steps, not 60."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    A0, A1, A2, A3 = eye, eye, eye, eye
    for i in range(1, 16):
        A0 = _sub_row(L0, A0, i, r)
        A1 = _sub_row(L1, A1, i, r)
        A2 = _sub_row(L2, A2, i, r)
        A3 = _sub_row(L3, A3, i, r)
    return A0, A1, A2, A3


@triton.jit
def _mm(a, b, TF32: tl.constexpr):
    """A 16 x 16 product of the block inverse: tf32 tensor cores (TF32), else IEEE fp32 FMAs."""
    if TF32:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _rows16(
    kbase,
    skt,
    tstart,
    lo,
    hi,
    blk: tl.constexpr,
    oc,
    K: tl.constexpr,
    FULL: tl.constexpr,
    W: tl.constexpr,
    TRANS: tl.constexpr,
):
    """Key rows of 16-row block ``blk`` of a chunk, [16, W] and transposed [W, 16] (TRANS: the
    transpose of the rows in registers, else a second, transposed load)."""
    r = blk * 16 + tl.arange(0, 16)
    m = _inside(tstart, r, lo, hi)
    kr = tl.load(kbase + r[:, None] * skt + oc[None, :], mask=_rowmask(m, oc, K, FULL, W), other=0.0)
    if TRANS:
        kT = tl.trans(kr)
    else:
        kT = tl.load(kbase + r[None, :] * skt + oc[:, None], mask=_colmask(m, oc, K, FULL, W), other=0.0)
    return kr, kT


@triton.jit
def _scale_blk(P, gi, gj, bi, ri, rj, DIAG: tl.constexpr):
    """beta_i * (k_i . k_j) / (|k_i| |k_j|) * exp(gamma_i - gamma_j), strictly lower on the
    diagonal blocks."""
    r = tl.arange(0, 16)
    if DIAG:
        keep = r[:, None] > r[None, :]
    else:
        keep = r[:, None] >= 0
    d = tl.exp(tl.where(keep, gi[:, None] - gj[None, :], float("-inf")))
    return P * (bi * ri)[:, None] * rj[None, :] * d


@triton.jit
def _store_blk(base, X, bi: tl.constexpr, bj: tl.constexpr):
    r = tl.arange(0, 16)
    tl.store(base + (bi * 16 + r)[:, None] * 64 + (bj * 16 + r)[None, :], X.to(base.dtype.element_ty))


@triton.jit
def _gate16(
    g,
    beta,
    A_log_h,
    dt_bias_h,
    gbase,
    bbase,
    tstart,
    lo,
    hi,
    blk: tl.constexpr,
    sgt,
    sbt,
    USE_GATE: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
):
    r = blk * 16 + tl.arange(0, 16)
    m = _inside(tstart, r, lo, hi)
    return _load_gate_beta(g, beta, A_log_h, dt_bias_h, gbase, bbase, r, m, sgt, sbt, USE_GATE, BETA_SIGMOID)


@triton.jit
def _store16(base, x, blk: tl.constexpr, tstart, lo, hi, HV):
    r = blk * 16 + tl.arange(0, 16)
    tl.store(base + r * HV, x, mask=_inside(tstart, r, lo, hi))


# Runtime flags are kept out of Triton's "== 1" integer specialisation: one compiled kernel
# serves calls with and without l2norm / initial state / boundary states.
@triton.jit(do_not_specialize=["l2norm"])
def _solve_kernel(
    k,
    g,
    beta,
    A_log,
    dt_bias,
    a_out,
    gc_out,
    gl_out,
    prog,
    chunk_info,
    skt,
    skh,
    sgt,
    sgh,
    sbt,
    sbh,
    HV,
    GROUP,
    K: tl.constexpr,
    BK: tl.constexpr,
    BKS: tl.constexpr,
    TRANS: tl.constexpr,
    TF32M: tl.constexpr,
    OVL: tl.constexpr,
    USE_GATE: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
    l2norm,
    PREC: tl.constexpr,
):
    """Gate, chunk-local cumsum, L = strict_tril(diag(beta) K K^T o decay) as ten 16 x 16
    blocks in registers, and A = (I + L)^-1 (fp32, IEEE), stored in the input dtype."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // GROUP
    tstart, lo, hi = _chunk(chunk_info, i_c)
    A_log_h = 0.0
    dt_bias_h = 0.0
    if USE_GATE:
        A_log_h = tl.load(A_log + i_hv).to(tl.float32)
        dt_bias_h = tl.load(dt_bias + i_hv).to(tl.float32)
    t0 = tstart.to(tl.int64)
    gbase = g + t0 * sgt + i_hv * sgh
    bbase = beta + t0 * sbt + i_hv * sbh
    r16 = tl.arange(0, 16)
    g0, b0 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 0, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g1, b1 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 1, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g2, b2 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 2, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g3, b3 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 3, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g0 = tl.cumsum(g0, 0)
    g1 = tl.cumsum(g1, 0) + tl.sum(tl.where(r16 == 15, g0, 0.0), 0)
    g2 = tl.cumsum(g2, 0) + tl.sum(tl.where(r16 == 15, g1, 0.0), 0)
    g3 = tl.cumsum(g3, 0) + tl.sum(tl.where(r16 == 15, g2, 0.0), 0)
    obase = gc_out + t0 * HV + i_hv
    _store16(obase, g0, 0, tstart, lo, hi, HV)
    _store16(obase, g1, 1, tstart, lo, hi, HV)
    _store16(obase, g2, 2, tstart, lo, hi, HV)
    _store16(obase, g3, 3, tstart, lo, hi, HV)
    tl.store(gl_out + i_c * HV + i_hv, tl.sum(tl.where(r16 == 15, g3, 0.0), 0))
    if OVL:
        # the overlapped output's progress counters of a sequence starting at this chunk, zero
        # before the state loop starts (the scratch is reused between calls)
        tl.store(prog + (i_c * HV + i_hv) * _PROG_SLOTS + r16, tl.zeros([16], dtype=tl.int32))

    # ---- the ten 16 x 16 blocks of K K^T and the key norms, over K blocks of BKS --------------
    kbase = k + t0 * skt + i_h * skh
    z = tl.zeros([16, 16], dtype=tl.float32)
    P00, P11, P22, P33, P10, P20, P21, P30, P31, P32 = z, z, z, z, z, z, z, z, z, z
    s0 = tl.zeros([16], dtype=tl.float32)
    s1, s2, s3 = s0, s0, s0
    for kb in tl.static_range(0, BK, BKS):
        oc = kb + tl.arange(0, BKS)
        k0, k0T = _rows16(kbase, skt, tstart, lo, hi, 0, oc, K, K == BK, BKS, TRANS)
        k1, k1T = _rows16(kbase, skt, tstart, lo, hi, 1, oc, K, K == BK, BKS, TRANS)
        k2, k2T = _rows16(kbase, skt, tstart, lo, hi, 2, oc, K, K == BK, BKS, TRANS)
        k3, k3T = _rows16(kbase, skt, tstart, lo, hi, 3, oc, K, K == BK, BKS, TRANS)
        f0, f1, f2, f3 = k0.to(tl.float32), k1.to(tl.float32), k2.to(tl.float32), k3.to(tl.float32)
        s0 += tl.sum(f0 * f0, 1)
        s1 += tl.sum(f1 * f1, 1)
        s2 += tl.sum(f2 * f2, 1)
        s3 += tl.sum(f3 * f3, 1)
        P00 = tl.dot(k0, k0T, P00, input_precision=PREC)
        P11 = tl.dot(k1, k1T, P11, input_precision=PREC)
        P22 = tl.dot(k2, k2T, P22, input_precision=PREC)
        P33 = tl.dot(k3, k3T, P33, input_precision=PREC)
        P10 = tl.dot(k1, k0T, P10, input_precision=PREC)
        P20 = tl.dot(k2, k0T, P20, input_precision=PREC)
        P21 = tl.dot(k2, k1T, P21, input_precision=PREC)
        P30 = tl.dot(k3, k0T, P30, input_precision=PREC)
        P31 = tl.dot(k3, k1T, P31, input_precision=PREC)
        P32 = tl.dot(k3, k2T, P32, input_precision=PREC)
    r0 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s0 + 1e-6), 1.0)
    r1 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s1 + 1e-6), 1.0)
    r2 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s2 + 1e-6), 1.0)
    r3 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s3 + 1e-6), 1.0)
    L00 = _scale_blk(P00, g0, g0, b0, r0, r0, True)
    L11 = _scale_blk(P11, g1, g1, b1, r1, r1, True)
    L22 = _scale_blk(P22, g2, g2, b2, r2, r2, True)
    L33 = _scale_blk(P33, g3, g3, b3, r3, r3, True)
    L10 = _scale_blk(P10, g1, g0, b1, r1, r0, False)
    L20 = _scale_blk(P20, g2, g0, b2, r2, r0, False)
    L21 = _scale_blk(P21, g2, g1, b2, r2, r1, False)
    L30 = _scale_blk(P30, g3, g0, b3, r3, r0, False)
    L31 = _scale_blk(P31, g3, g1, b3, r3, r1, False)
    L32 = _scale_blk(P32, g3, g2, b3, r3, r2, False)

    # ---- A = (I + L)^-1 by block forward substitution ------------------------------------------
    # the diagonal blocks' inverses in fp32, then the merges (``TF32M``: their products in tf32)
    A00, A11, A22, A33 = _inv16x4(L00, L11, L22, L33)
    # (TF32M: every merge product in tf32 but the two-term inner sums of A20 and A31, which stay
    # IEEE: with those in tf32 too the kernel spills 48 B at 2 warps, bf16 / K = 128)
    A10 = -_mm(A11, _mm(L10, A00, TF32M), TF32M)
    A21 = -_mm(A22, _mm(L21, A11, TF32M), TF32M)
    A32 = -_mm(A33, _mm(L32, A22, TF32M), TF32M)
    A20 = -_mm(A22, _mm(L20, A00, False) + _mm(L21, A10, False), TF32M)
    A31 = -_mm(A33, _mm(L31, A11, False) + _mm(L32, A21, False), TF32M)
    A30 = -_mm(A33, _mm(L30, A00, TF32M) + _mm(L31, A10, TF32M) + _mm(L32, A20, TF32M), TF32M)
    base = a_out + (i_c * HV + i_hv).to(tl.int64) * 4096
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
