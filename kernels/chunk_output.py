"""Stage 4 of the chunked gated delta rule, the output (``_output_kernel``; one program per chunk
x value head x V block, fully parallel): ``O = diag(exp(gamma)) Q S_c + tril(Q K^T o decay) v'``.
Beside the Gluon state loop it runs overlapped with it (``OVL``), each program waiting on the
loop's progress counters for its chunk (docs/kernels.md)."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.chunk_tiles import (
    _PROG_SLOTS,
    _after_cta_barrier,
    _await_chunk,
    _chunk,
    _colmask,
    _dimmask,
    _discard_lines,
    _inside,
    _last_waits_for_the_loop,
    _rowmask,
)


@triton.jit(do_not_specialize=["l2norm"])
def _output_kernel(
    q,
    k,
    gc,
    h,
    vn,
    o,
    chunk_info,
    seq_info,
    prog,
    scale,
    sqt,
    sqh,
    skt,
    skh,
    HV,
    GROUP,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    NVS: tl.constexpr,
    OVL: tl.constexpr,
    l2norm,
    PREC: tl.constexpr,
    DISCARD: tl.constexpr,
):
    if OVL:
        # a 1-d grid, chunk-major (a chunk's programs of every head are adjacent: the loop's
        # programs advance through the chunks together), and the programs wait until the loop's
        # programs of their head have released this chunk
        NVO: tl.constexpr = (V + BV - 1) // BV
        pid = tl.program_id(0)
        i_c = pid // (HV * NVO)
        i_hv = (pid // NVO) % HV
        i_v = pid % NVO
        c0 = tl.load(seq_info + tl.load(chunk_info + i_c * 4) * 4 + 2)
        _await_chunk(prog + (c0 * HV + i_hv) * _PROG_SLOTS, i_c, NVS)
    else:
        i_c = tl.program_id(0)
        i_hv = tl.program_id(1)
        i_v = tl.program_id(2)
    i_h = i_hv // GROUP
    dt = vn.dtype.element_ty
    tstart, lo, hi = _chunk(chunk_info, i_c)
    r64 = tl.arange(0, 64)
    m = _inside(tstart, r64, lo, hi)
    t0 = tstart.to(tl.int64)
    row0 = t0 * HV + i_hv
    oV = i_v * BV + tl.arange(0, BV)
    mV = _rowmask(m, oV, V, V % BV == 0, BV)
    gam = tl.load(gc + row0 + r64 * HV, mask=m, other=0.0)
    qbase = q + t0 * sqt + i_h * sqh
    kbase = k + t0 * skt + i_h * skh
    hbase = h + (i_c * HV + i_hv).to(tl.int64) * (K * V)
    # Q K^T and Q h over K blocks of at most 64; the l2norm and the scale are applied to the
    # fp32 products afterwards, never to rounded copies of q / k
    qsq = tl.zeros([64], dtype=tl.float32)
    ksq = tl.zeros([64], dtype=tl.float32)
    P = tl.zeros([64, 64], dtype=tl.float32)
    qh = tl.zeros([64, BV], dtype=tl.float32)
    for kb in tl.static_range(0, BK, BC):
        oc = kb + tl.arange(0, BC)
        qc = tl.load(qbase + r64[:, None] * sqt + oc[None, :], mask=_rowmask(m, oc, K, K == BK, BC), other=0.0)
        kc = tl.load(kbase + r64[None, :] * skt + oc[:, None], mask=_colmask(m, oc, K, K == BK, BC), other=0.0)
        hc = tl.load(
            hbase + oc[:, None] * V + oV[None, :],
            mask=_dimmask(oc, K, K == BK, BC)[:, None] & _dimmask(oV, V, V % BV == 0, BV)[None, :],
            other=0.0,
            cache_modifier=".cg",  # L2: the overlapped loop writes it while this kernel runs
        )
        qf = qc.to(tl.float32)
        kf = kc.to(tl.float32)
        qsq += tl.sum(qf * qf, 1)
        ksq += tl.sum(kf * kf, 0)
        P += tl.dot(qc.to(dt), kc.to(dt), input_precision=PREC)
        qh += tl.dot(qc.to(dt), hc, input_precision=PREC)
    rq = tl.where(l2norm != 0, 1.0 / tl.sqrt(qsq + 1e-6), 1.0) * scale
    rk = tl.where(l2norm != 0, 1.0 / tl.sqrt(ksq + 1e-6), 1.0)
    causal = r64[:, None] >= r64[None, :]
    P = P * rq[:, None] * rk[None, :] * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], float("-inf")))
    off = r64[:, None] * (HV * V) + oV[None, :]
    vc = tl.load(vn + row0 * V + off, mask=mV, other=0.0, cache_modifier=".cg")
    acc = qh * (rq * tl.exp(gam))[:, None]
    acc += tl.dot(P.to(dt), vc, input_precision=PREC)
    tl.store(o + row0 * V + off, acc.to(o.dtype.element_ty), mask=mV)
    if DISCARD:
        # ``DISCARD`` (opt-in; a V block of the whole V, whole 128-byte rows): this program was the
        # only reader of its chunk-start state and of its rows of v'; once every thread is past
        # their use, their L2 lines are dropped unwritten (scratch: a dirty line written back is
        # bandwidth the loop's state writes want). Rows outside the sequence are another chunk's.
        ES: tl.constexpr = h.dtype.element_ty.primitive_bitwidth // 8
        LPR: tl.constexpr = V * ES // 128
        go = _after_cta_barrier(0)
        hl = hbase.to(tl.pointer_type(tl.int8)) + tl.arange(0, K * LPR).to(tl.int64) * 128
        _discard_lines(hl, go, tl.full([1], 1, tl.int32))
        j = tl.arange(0, 64 * LPR)
        rows = j // LPR
        vrow = (row0 + rows.to(tl.int64) * HV) * V * ES + (j % LPR) * 128
        _discard_lines(vn.to(tl.pointer_type(tl.int8)) + vrow, go, _inside(tstart, rows, lo, hi))
    if OVL:
        _last_waits_for_the_loop()
