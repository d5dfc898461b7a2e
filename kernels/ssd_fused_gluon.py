"""The SSD (Mamba2) state loop and its output in one warp-specialised Gluon program for Hopper
(sm_90a): the default of 16-bit calls on Hopper where the call fits it (``KERNELS_CONFIG_SSD_STATE=WS=0``: the
two kernels).

Why: the overlapped call (``ssd_gluon`` or the Triton loop, the output kernel beside it) writes
each chunk's start state in bf16 for the output kernel to read back, and reads x twice. At
marconi-7b's layer and 32K tokens that is 2.1 GB of round trip and 0.5 GB of x, about 45 % of the
call's bytes with the fp32 state at every 64 tokens, and the call is bound by its bytes
(``docs/kernels.md``, "Tried in session 28"). Here the start state stays in shared memory.

A program (sequence, head; P = ``GLUON_P`` rows of the state) runs two partitions:

- the **state partition** (the kernel's four warps, one warpgroup) is ``ssd_gluon``'s loop at one
  warpgroup, the same products in the same order, so the final and boundary states have its bits
  (which are the Triton loop's). It puts each chunk's start state (bf16, the output's operand) into
  one of ``NBUF`` shared buffers instead of global memory and signals ``full``;
- the **output partition** (four more warps) loads the chunk's C, B and x rows by ``cp.async`` into
  a ring of its own (from L2: the state partition has just read x and B), forms the masked ``C B^T``
  a chunk ahead, waits on ``full``, then computes ``y = diag(exp gamma) C S^T + (C B^T o L) diag(dt)
  X + D X``, signals ``empty`` and stores y.

So the output's work is off the state's serial path: the state partition waits only when it is
``NBUF`` chunks ahead of the output. The output is the output kernel's arithmetic; it adds the two
products' results instead of accumulating the second onto the first, so its bits can differ from
the output kernel's in the last place (the states' cannot).

It takes ``ssd_gluon``'s shape family (``ssd_gluon.applies``): 16-bit inputs, P = 64, N of 64 or 128,
the prep kernel's dt and gamma, on compute capability 9.0; ``ssd.chunk_ssd`` runs the two-kernel
call elsewhere.
"""

from __future__ import annotations

from kernels.ssd_gluon import RING
from kernels.state_gluon import gluon

if gluon is not None:
    from triton.experimental.gluon import language as ttgl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mbarrier
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from kernels.ssd_gluon import _issue_product, _ring_ahead, _ring_start, _sequence, _state_start
    from kernels.state_gluon import _WARPS, _cp_async, _cta_barrier

#: shared buffers of chunk-start states between the two partitions
NBUF = 2
#: stages of the output partition's C / B / x ring (chunk c's and chunk c + 1's)
OUT_RING = 2
#: registers a thread of the output partition gets (the state partition gets the rest)
OUT_REGS = 232

if gluon is not None:
    _RING = ttgl.constexpr(RING)
    _NBUF = ttgl.constexpr(NBUF)
    _OUT_RING = ttgl.constexpr(OUT_RING)
    _OUT_REGS = ttgl.constexpr(OUT_REGS)

    @gluon.jit
    def _state_part(
        x, Bm, gam, dtc, h0, ht, hb, store_slot, xbuf, bbuf, wbuf, sbuf, full, empty,
        bos, eos, c0, c1, ts0, i_n, i_h, grp, sxt, sxh, sbt, sbg, has_h0,
        H: ttgl.constexpr, P: ttgl.constexpr, N: ttgl.constexpr, STORE_B: ttgl.constexpr,
    ):  # fmt: skip
        """``ssd_gluon``'s loop at one warpgroup, handing each chunk's start state to the output
        partition through ``sbuf`` instead of global memory."""
        ACC: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, 1], instr_shape=[16, N, 16]
        )
        XL: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [32 // (P // 8), P // 8], [_WARPS, 1], [1, 0])
        BL: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [32 // (N // 8), N // 8], [_WARPS, 1], [1, 0])
        dt: ttgl.constexpr = x.dtype.element_ty
        sidx, rx, oP, rb, oN, sbase, S = _state_start(h0, has_h0, i_n, i_h, H, P, N, ACC, XL, BL)
        d_c, g_c, last_c = _ring_start(
            xbuf, bbuf, x, Bm, gam, dtc, c0, c1, ts0, bos, eos, i_h, grp, sxt, sxh, sbt, sbg, H, rx, oP, rb, oN
        )  # fmt: skip
        prev_slot = -1  # the slot of the previous chunk's end: its state is S at this chunk's start
        for c in range(c0, c1):
            i = c - c0
            ts = ts0 + i * 64
            stage = i % _RING
            d_n, g_n, last_n, slot = _ring_ahead(
                xbuf, bbuf, x, Bm, gam, dtc, store_slot, c, i, ts, c1, bos, eos, i_h, grp, sxt, sxh, sbt, sbg, H,
                rx, oP, rb, oN,
            )  # fmt: skip
            acc = _issue_product(xbuf, bbuf, wbuf, stage, S, d_c, g_c, last_c, BL, dt)
            # while X^T Bw runs: the chunk-start state to the output partition (once it is done with
            # this buffer's chunk NBUF back; the first NBUF waits pass: an mbarrier starts with its
            # phase 1 complete) and the previous chunk's boundary state (fp32) to memory
            b = i % _NBUF
            mbarrier.wait(empty.index(b), ((i // _NBUF) & 1) ^ 1)
            sbuf.index(b).store(S.to(dt))
            fence_async_shared()
            _cta_barrier()  # every thread's part of the state written: hand it over
            mbarrier.arrive(full.index(b))
            if STORE_B:
                if prev_slot >= 0:
                    ttgl.store(hb + (prev_slot * H + i_h).to(ttgl.int64) * (P * N) + sidx, S)
            S = warpgroup_mma_wait(0, deps=[acc])
            prev_slot = slot
            d_c, g_c, last_c = d_n, g_n, last_n
        async_copy.wait_group(0)
        if STORE_B:
            if prev_slot >= 0:
                ttgl.store(hb + (prev_slot * H + i_h).to(ttgl.int64) * (P * N) + sidx, S)
        ttgl.store(ht + sbase + sidx, S)

    @gluon.jit
    def _out_load(cbuf, bbuf, xbuf, stage, x, Bm, Cm, ts, ok, bos, eos, i_h, grp,
                  sxt, sxh, sbt, sbg, sct, scg, rx, oP, rb, oN):  # fmt: skip
        """cp.async of one chunk's C and B rows ``[64, N]`` and x rows ``[64, P]`` into the output
        partition's ring ``stage``; rows outside the sequence (or past its last chunk: ``ok``
        false) are zero-filled."""
        mb = ((ts + rb >= bos) & (ts + rb < eos) & ok)[:, None] & (oN[None, :] >= 0)
        tb = (ts + rb).to(ttgl.int64)[:, None]
        _cp_async(cbuf.index(stage), Cm + tb * sct + grp * scg + oN[None, :], mask=mb)
        _cp_async(bbuf.index(stage), Bm + tb * sbt + grp * sbg + oN[None, :], mask=mb)
        mx = ((ts + rx >= bos) & (ts + rx < eos) & ok)[:, None] & (oP[None, :] >= 0)
        _cp_async(xbuf.index(stage), x + (ts + rx).to(ttgl.int64)[:, None] * sxt + i_h * sxh + oP[None, :], mask=mx)
        async_copy.commit_group()

    @gluon.jit
    def _out_gates(gam, dtc, c, ok, i_h, H, r_p, c_p):
        """One chunk's gamma as the scores' rows and as their columns, and its step sizes as the
        columns (as the prep kernel stored them; 0 past the sequence's last chunk)."""
        row = (c * H + i_h).to(ttgl.int64) * 64
        gr = ttgl.load(gam + row + r_p, mask=(r_p >= 0) & ok, other=0.0)
        gcol = ttgl.load(gam + row + c_p, mask=(c_p >= 0) & ok, other=0.0)
        dcol = ttgl.load(dtc + row + c_p, mask=(c_p >= 0) & ok, other=0.0)
        return gr, gcol, dcol

    @gluon.jit
    def _scores(cb, gr, gcol, dcol, causal, pbuf, dt: ttgl.constexpr):
        """``C B^T`` masked by the segment sum and scaled by the columns' dt, as the output kernel
        forms it, into ``pbuf`` (the next product's bf16 shared operand)."""
        Lm = ttgl.where(causal, ttgl.exp(ttgl.where(causal, gr[:, None] - gcol[None, :], 0.0)), 0.0) * dcol[None, :]
        pbuf.store((cb * Lm).to(dt))
        fence_async_shared()

    @gluon.jit
    def _out_part(
        x, Bm, Cm, Dv, gam, dtc, y, cbuf, obuf, xbuf, pbuf, sbuf, full, empty,
        bos, eos, c0, c1, ts0, i_h, grp, sxt, sxh, sbt, sbg, sct, scg,
        H: ttgl.constexpr, P: ttgl.constexpr, N: ttgl.constexpr, HAS_D: ttgl.constexpr, D_PER_P: ttgl.constexpr,
    ):  # fmt: skip
        """Each chunk's output rows from its C, B and x rows and the state partition's buffers,
        software-pipelined by one chunk: while chunk c's ``C S^T`` and ``(C B^T o L) X`` run, chunk
        c + 1's ``C B^T`` runs."""
        # P = 64: the scores [64, 64] and the output rows [64, P] share one accumulator layout
        ACC: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, 1], instr_shape=[16, P, 16]
        )
        ROWS: ttgl.constexpr = ttgl.SliceLayout(1, ACC)
        COLS: ttgl.constexpr = ttgl.SliceLayout(0, ACC)
        XL: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [32 // (P // 8), P // 8], [_WARPS, 1], [1, 0])
        BL: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [32 // (N // 8), N // 8], [_WARPS, 1], [1, 0])
        dt: ttgl.constexpr = y.dtype.element_ty
        rx = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, XL))
        oP = ttgl.arange(0, P, layout=ttgl.SliceLayout(0, XL))
        rb = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, BL))
        oN = ttgl.arange(0, N, layout=ttgl.SliceLayout(0, BL))
        r_p = ttgl.arange(0, 64, layout=ROWS)
        c_p = ttgl.arange(0, 64, layout=COLS)
        oP_a = ttgl.arange(0, P, layout=COLS)
        causal = r_p[:, None] >= c_p[None, :]
        zero = ttgl.zeros([64, P], ttgl.float32, ACC)
        if HAS_D:
            if D_PER_P:
                dv = ttgl.load(Dv + i_h * P + oP_a).to(ttgl.float32)
            else:
                dv = ttgl.load(Dv + i_h + oP_a * 0).to(ttgl.float32)
        # prologue: chunk c0's scores; chunk c0 + 1's rows on their way
        _out_load(cbuf, obuf, xbuf, 0, x, Bm, Cm, ts0, c0 < c1, bos, eos, i_h, grp, sxt, sxh, sbt, sbg, sct, scg,
                  rx, oP, rb, oN)  # fmt: skip
        _out_load(cbuf, obuf, xbuf, 1, x, Bm, Cm, ts0 + 64, c0 + 1 < c1, bos, eos, i_h, grp, sxt, sxh, sbt, sbg,
                  sct, scg, rx, oP, rb, oN)  # fmt: skip
        gr, gcol, dcol = _out_gates(gam, dtc, c0, c0 < c1, i_h, H, r_p, c_p)
        async_copy.wait_group(1)
        fence_async_shared()
        cb = warpgroup_mma(cbuf.index(0), obuf.index(0).permute([1, 0]), zero, use_acc=False, is_async=True)
        cb = warpgroup_mma_wait(0, deps=[cb])
        _scores(cb, gr, gcol, dcol, causal, pbuf, dt)
        for c in range(c0, c1):
            i = c - c0
            ts = ts0 + i * 64
            st = i % _OUT_RING
            st1 = (i + 1) % _OUT_RING
            async_copy.wait_group(0)  # chunk c + 1's rows have landed
            fence_async_shared()
            cbn = warpgroup_mma(cbuf.index(st1), obuf.index(st1).permute([1, 0]), zero, use_acc=False, is_async=True)
            # chunk c + 1's gates (for its scores, at the end of this step), loaded while the
            # products run: only the rows' gamma is carried from step to step (registers: the
            # columns' vectors are 16 a thread each)
            gr_n, gcol_n, dcol_n = _out_gates(gam, dtc, c + 1, c + 1 < c1, i_h, H, r_p, c_p)
            b = i % _NBUF
            mbarrier.wait(full.index(b), (i // _NBUF) & 1)
            # C [64, N] by the chunk-start state's transpose [N, P]
            oh = warpgroup_mma(cbuf.index(st), sbuf.index(b).permute([1, 0]), zero, use_acc=False, is_async=True)
            pv = warpgroup_mma(pbuf, xbuf.index(st), zero, use_acc=False, is_async=True)
            cbn, oh, pv = warpgroup_mma_wait(0, deps=[cbn, oh, pv])
            yv = oh * ttgl.exp(gr)[:, None] + pv
            if HAS_D:
                yv += xbuf.index(st).load(ACC).to(ttgl.float32) * dv[None, :]
            # every thread's reads of this buffer, this stage and pbuf done: hand the buffer back,
            # refill the stage with chunk c + 2's rows
            _cta_barrier()
            mbarrier.arrive(empty.index(b))
            _out_load(cbuf, obuf, xbuf, st, x, Bm, Cm, ts + 128, c + 2 < c1, bos, eos, i_h, grp, sxt, sxh, sbt, sbg,
                      sct, scg, rx, oP, rb, oN)  # fmt: skip
            m_o = (ts + r_p >= bos) & (ts + r_p < eos)
            yoff = (ts + r_p).to(ttgl.int64)[:, None] * (H * P) + i_h * P + oP_a[None, :]
            ttgl.store(y + yoff, yv.to(dt), mask=m_o[:, None] & (oP_a[None, :] < P))
            _scores(cbn, gr_n, gcol_n, dcol_n, causal, pbuf, dt)
            gr = gr_n
        async_copy.wait_group(0)

    @gluon.jit(do_not_specialize=["has_h0"])
    def _gluon_ssd_fused_kernel(
        x, Bm, Cm, Dv, gam, dtc, y, h0, ht, hb, seq_info, chunk_info, store_slot,
        sxt, sxh, sbt, sbg, sct, scg, has_h0,
        H: ttgl.constexpr, GROUP: ttgl.constexpr, P: ttgl.constexpr, N: ttgl.constexpr,
        STORE_B: ttgl.constexpr, HAS_D: ttgl.constexpr, D_PER_P: ttgl.constexpr,
    ):  # fmt: skip
        dt: ttgl.constexpr = x.dtype.element_ty
        X_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, P], dt)
        B_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, N], dt)
        S_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([P, N], dt)
        P_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, 64], dt)
        i_n = ttgl.program_id(0)
        i_h = ttgl.program_id(1)
        grp = i_h // GROUP
        bos, eos, c0, c1, ts0 = _sequence(seq_info, chunk_info, i_n)
        # the state partition's ring and scaled B
        xbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, P], X_L)
        bbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, N], B_L)
        wbuf = ttgl.allocate_shared_memory(dt, [64, N], B_L)
        # the handed-over chunk-start states
        sbuf = ttgl.allocate_shared_memory(dt, [_NBUF, P, N], S_L)
        # the output partition's ring (C, B, x) and masked scores
        ocbuf = ttgl.allocate_shared_memory(dt, [_OUT_RING, 64, N], B_L)
        obbuf = ttgl.allocate_shared_memory(dt, [_OUT_RING, 64, N], B_L)
        oxbuf = ttgl.allocate_shared_memory(dt, [_OUT_RING, 64, P], X_L)
        pbuf = ttgl.allocate_shared_memory(dt, [64, 64], P_L)
        full = ttgl.allocate_shared_memory(ttgl.int64, [_NBUF, 1], mbarrier.MBarrierLayout())
        empty = ttgl.allocate_shared_memory(ttgl.int64, [_NBUF, 1], mbarrier.MBarrierLayout())
        for j in ttgl.static_range(_NBUF):
            mbarrier.init(full.index(j), count=1)
            mbarrier.init(empty.index(j), count=1)
        ttgl.warp_specialize(
            [
                (
                    _state_part,
                    (x, Bm, gam, dtc, h0, ht, hb, store_slot, xbuf, bbuf, wbuf, sbuf, full, empty,
                     bos, eos, c0, c1, ts0, i_n, i_h, grp, sxt, sxh, sbt, sbg, has_h0, H, P, N, STORE_B),
                ),
                (
                    _out_part,
                    (x, Bm, Cm, Dv, gam, dtc, y, ocbuf, obbuf, oxbuf, pbuf, sbuf, full, empty,
                     bos, eos, c0, c1, ts0, i_h, grp, sxt, sxh, sbt, sbg, sct, scg, H, P, N, HAS_D, D_PER_P),
                ),
            ],
            [_WARPS],
            [_OUT_REGS],
        )  # fmt: skip

else:
    _gluon_ssd_fused_kernel = None
