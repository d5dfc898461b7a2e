"""Stage 3 of the chunked gated delta rule, the state loop (``_state_kernel``; one program per
sequence x value head x V block, sequential over chunks): the chunk-start states for the output,
``v' = u - w S``, the state update, the boundary states and the final state. On Hopper at the
production shape ``kernels.state_gluon`` runs the same loop to the same bits."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.chunk_tiles import _colmask, _dimmask, _inside, _rowmask


@triton.jit
def _state_step(
    c,
    ts,
    S,
    k,
    fd,
    w,
    u,
    gl,
    h_out,
    vn_out,
    hb,
    store_slot,
    bos,
    eos,
    i_hv,
    i_h,
    skt,
    skh,
    oK,
    oV,
    r64,
    sidx,
    mKV,
    HV,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    STORE_B: tl.constexpr,
    PREC: tl.constexpr,
):
    dt = w.dtype.element_ty
    # chunk-start state for the output kernel (always in the input dtype, like FLA's h)
    tl.store(h_out + (c * HV + i_hv).to(tl.int64) * (K * V) + sidx, S.to(dt), mask=mKV)
    m = _inside(ts, r64, bos, eos)
    row0 = ts.to(tl.int64) * HV + i_hv  # scalar: row of token ts in [TT, HV, .]
    mw = _rowmask(m, oK, K, K == BK, BK)
    mu = _rowmask(m, oV, V, V % BV == 0, BV)
    w_c = tl.load(w + row0 * K + r64[:, None] * (HV * K) + oK[None, :], mask=mw, other=0.0)
    uoff = r64[:, None] * (HV * V) + oV[None, :]
    u_c = tl.load(u + row0 * V + uoff, mask=mu, other=0.0)
    # raw keys as [K, 64] (shared by the GROUP value heads of a key head: L2 hits) and the row
    # factors key norm x decay to the chunk end, applied to v' (64 x BV) rather than the keys
    kT = tl.load(
        k + ts.to(tl.int64) * skt + i_h * skh + r64[None, :] * skt + oK[:, None],
        mask=_colmask(m, oK, K, K == BK, BK),
        other=0.0,
    )
    f = tl.load(fd + row0 + r64 * HV, mask=m, other=0.0)
    g_last = tl.load(gl + c * HV + i_hv)
    vn = u_c.to(tl.float32) - tl.dot(w_c, S.to(dt), input_precision=PREC)
    tl.store(vn_out + row0 * V + uoff, vn.to(dt), mask=mu)
    S = S * tl.exp(g_last) + tl.dot(kT, (vn * f[:, None]).to(dt), input_precision=PREC)
    if STORE_B:
        # the boundary state, where the chunk's end has a slot. Compile-time: a call without
        # boundaries runs a loop without this code (its layout conversion through shared memory,
        # address and mask cost 0.1-0.3 ms at 32K tokens even with every store masked off).
        # Full-shape boolean mask: triton 3.9's interpreter rejects scalar masks.
        slot = tl.load(store_slot + c)
        ok = ((tl.zeros([BK, BV], tl.int32) + slot) >= 0) & mKV
        tl.store(
            hb + (tl.maximum(slot, 0) * HV + i_hv).to(tl.int64) * (K * V) + sidx, S.to(hb.dtype.element_ty), mask=ok
        )
    return S


@triton.jit
def _state_program(HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, VFAST: tl.constexpr):
    """(sequence, value head, V block) of this program. VFAST: a 1-d grid with the V blocks of a
    head adjacent in launch order (they read the same chunk's w and keys), else the 3-d grid
    (sequence, head, V block)."""
    if VFAST:
        NV: tl.constexpr = (V + BV - 1) // BV
        pid = tl.program_id(0)
        return pid // (NV * HV), (pid // NV) % HV, pid % NV
    else:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit(do_not_specialize=["has_h0"])
def _state_kernel(
    k,
    fd,
    w,
    u,
    gl,
    h_out,
    vn_out,
    h0,
    ht,
    hb,
    seq_info,
    chunk_info,
    store_slot,
    skt: tl.constexpr,
    skh: tl.constexpr,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    has_h0,
    STORE_B: tl.constexpr,
    PREC: tl.constexpr,
    WHILE_LOOP: tl.constexpr,
    VFAST: tl.constexpr,
):
    # head counts and the keys' strides are compile-time (a model has one layout): the w / u /
    # key tile offsets fold into constants (H200, BV 32: 151 registers instead of 192)
    i_n, i_hv, i_v = _state_program(HV, V, BV, VFAST)
    i_h = i_hv // GROUP
    bos = tl.load(seq_info + i_n * 4)
    eos = tl.load(seq_info + i_n * 4 + 1)
    c0 = tl.load(seq_info + i_n * 4 + 2)
    c1 = tl.load(seq_info + i_n * 4 + 3)
    ts0 = tl.load(chunk_info + c0 * 4 + 1, mask=c0 < c1, other=0)  # first (virtual) token
    oK = tl.arange(0, BK)
    oV = i_v * BV + tl.arange(0, BV)
    r64 = tl.arange(0, 64)
    sidx = oK[:, None] * V + oV[None, :]
    mKV = _dimmask(oK, K, K == BK, BK)[:, None] & _dimmask(oV, V, V % BV == 0, BV)[None, :]
    # masked load instead of a constexpr branch: one compiled kernel with or without h0
    S = tl.load(
        h0 + (i_n * HV + i_hv).to(tl.int64) * (K * V) + sidx,
        mask=mKV & ((tl.zeros([BK, BV], tl.int32) + has_h0) != 0),
        other=0.0,
    ).to(tl.float32)
    if WHILE_LOOP:
        # the interpreter keeps scalars as 1-element arrays, which range() cannot take
        c = c0
        while c < c1:
            S = _state_step(
                c,
                ts0 + (c - c0) * 64,
                S,
                k,
                fd,
                w,
                u,
                gl,
                h_out,
                vn_out,
                hb,
                store_slot,
                bos,
                eos,
                i_hv,
                i_h,
                skt,
                skh,
                oK,
                oV,
                r64,
                sidx,
                mKV,
                HV,
                K,
                V,
                BK,
                BV,
                STORE_B,
                PREC,
            )
            c += 1
    else:
        for c in range(c0, c1):
            S = _state_step(
                c,
                ts0 + (c - c0) * 64,
                S,
                k,
                fd,
                w,
                u,
                gl,
                h_out,
                vn_out,
                hb,
                store_slot,
                bos,
                eos,
                i_hv,
                i_h,
                skt,
                skh,
                oK,
                oV,
                r64,
                sidx,
                mKV,
                HV,
                K,
                V,
                BK,
                BV,
                STORE_B,
                PREC,
            )
    tl.store(ht + (i_n * HV + i_hv).to(tl.int64) * (K * V) + sidx, S, mask=mKV)
