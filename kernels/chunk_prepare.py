"""Stage 2 of the chunked gated delta rule, the prepare step (``_wu_kernel``, FLA's
``prepare_wy_repr``; same grid as the solve, 4 warps): ``w = A diag(beta exp(gamma)) K``, ``u =
A diag(beta) V`` and the state update's row factors (key norm x decay to the chunk end)."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.chunk_tiles import _chunk, _inside, _rowmask


@triton.jit(do_not_specialize=["l2norm"])
def _wu_kernel(
    k,
    v,
    beta,
    a_in,
    gc,
    gl,
    w_out,
    u_out,
    fd_out,
    chunk_info,
    skt,
    skh,
    svt,
    svh,
    sbt,
    sbh,
    HV,
    GROUP,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BVF: tl.constexpr,
    BC: tl.constexpr,
    BCV: tl.constexpr,
    KONCE: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
    l2norm,
    PREC: tl.constexpr,
):
    """w = A diag(beta exp(gamma)) K, u = A diag(beta) V, and the row factors of the state
    update, rk exp(gamma_last - gamma) (key norm and decay to the chunk end), for the state
    kernel."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // GROUP
    dt = w_out.dtype.element_ty
    tstart, lo, hi = _chunk(chunk_info, i_c)
    r64 = tl.arange(0, 64)
    m = _inside(tstart, r64, lo, hi)
    t0 = tstart.to(tl.int64)
    obase = t0 * HV + i_hv  # row of token tstart in [TT, HV] tensors
    kbase = k + t0 * skt + i_h * skh
    vbase = v + t0 * svt + i_hv * svh
    gam = tl.load(gc + obase + r64 * HV, mask=m, other=0.0)
    g_last = tl.load(gl + i_c * HV + i_hv)
    bt = tl.load(beta + t0 * sbt + i_hv * sbh + r64 * sbt, mask=m, other=0.0).to(tl.float32)
    if BETA_SIGMOID:
        bt = tl.where(m, tl.sigmoid(bt), 0.0)
    A = tl.load(
        a_in + (i_c * HV + i_hv).to(tl.int64) * 4096 + r64[:, None] * 64 + r64[None, :],
        mask=(r64[:, None] // 16) >= (r64[None, :] // 16),
        other=0.0,
    )
    if KONCE:
        # the key tile read once, for its norms and for w (16-bit inputs up to K = 128)
        oc = tl.arange(0, BK)
        mk = _rowmask(m, oc, K, K == BK, BK)
        kc = tl.load(kbase + r64[:, None] * skt + oc[None, :], mask=mk, other=0.0).to(tl.float32)
        ksq = tl.sum(kc * kc, 1)
    else:
        ksq = tl.zeros([64], dtype=tl.float32)
        for kb in tl.static_range(0, BK, BC):
            ob = kb + tl.arange(0, BC)
            kt = tl.load(kbase + r64[:, None] * skt + ob[None, :], mask=_rowmask(m, ob, K, K == BK, BC), other=0.0)
            kt = kt.to(tl.float32)
            ksq += tl.sum(kt * kt, 1)
    rk = tl.where(l2norm != 0, 1.0 / tl.sqrt(ksq + 1e-6), 1.0)
    fk = bt * tl.exp(gam) * rk
    # the state update's row factors: S += K^T diag(fd) v' (key norm, decay to the chunk end)
    tl.store(fd_out + obase + r64 * HV, rk * tl.exp(g_last - gam), mask=m)
    if KONCE:
        wv = tl.dot(A, (kc * fk[:, None]).to(dt), input_precision=PREC)
        tl.store(w_out + obase * K + r64[:, None] * (HV * K) + oc[None, :], wv.to(dt), mask=mk)
    else:
        # the second pass: column blocks of at most 64 keep the live fp32 tiles small
        for kb in tl.static_range(0, BK, BC):
            oc = kb + tl.arange(0, BC)
            mk = _rowmask(m, oc, K, K == BK, BC)
            kc = tl.load(kbase + r64[:, None] * skt + oc[None, :], mask=mk, other=0.0).to(tl.float32)
            wv = tl.dot(A, (kc * fk[:, None]).to(dt), input_precision=PREC)
            off = r64[:, None] * (HV * K) + oc[None, :]
            tl.store(w_out + obase * K + off, wv.to(dt), mask=mk)
    for vb in tl.static_range(0, BVF, BCV):
        oc = vb + tl.arange(0, BCV)
        mv = _rowmask(m, oc, V, V == BVF, BCV)
        vv = tl.load(vbase + r64[:, None] * svt + oc[None, :], mask=mv, other=0.0).to(tl.float32)
        uv = tl.dot(A, (vv * bt[:, None]).to(dt), input_precision=PREC)
        tl.store(u_out + obase * V + r64[:, None] * (HV * V) + oc[None, :], uv.to(dt), mask=mv)
