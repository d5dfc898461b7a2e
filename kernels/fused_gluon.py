"""The state loop and the output in one warp-specialised Gluon program for Hopper (sm_90a).

The four-kernel call writes every chunk-start state (bf16) and v' from the state loop only for the
output kernel to read them back: at 16/32 heads and 32K tokens 1.6 GB of round trips, a third of the
call's bytes (``docs/kernels.md``, "What the time at 16/32 heads is made of: bytes"). Here they stay
in shared memory. A program (sequence, value head, V block) runs two partitions:

- the **state partition** (the kernel's four warps, one warpgroup) is ``state_gluon``'s loop: the
  same products in the same order, so the final and boundary states have the same bits. It puts
  each chunk's start state (the first product's bf16 operand, which it writes anyway) and v' into
  one of ``NBUF`` shared buffers instead of global memory, and signals ``full``;
- the **output partition** (four more warps, a second warpgroup) loads the chunk's queries and
  keys by ``cp.async`` into a ring of its own, forms the scaled causal ``Q K^T`` and the norms
  while the state partition works, waits on ``full``, then computes ``o = (Q h) * rq e^gamma +
  P v'`` from the shared buffers and signals ``empty``.

So the output's work is off the state's serial path: the state partition waits only when it is
``NBUF`` chunks ahead of the output. The output is the output kernel's arithmetic (the same
products over the same operands); its bits can differ from the output kernel's in the last place
where the norms' sums are reduced in another order.

It takes the state loop's production shape (``state_gluon.applies``) and runs only where
``KERNELS_CONFIG_STATE=FUSE=1`` asks: on an H200 it is slower than the four kernels so far (3.27
against 2.35 ms at 16/32 heads and 32K tokens); with the output partition doing only the handshake
the call takes 1.76 ms, so the output partition's own per-chunk chain is the gap
(``docs/kernels.md``, "The output inside the loop, warp-specialised").
"""

from __future__ import annotations

from kernels.state_gluon import RING, gluon

if gluon is not None:
    from triton.experimental.gluon import language as ttgl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mbarrier
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from kernels.state_gluon import (
        _WARPS,
        _cp_async,
        _boundary_store,
        _chunk_rows,
        _cta_barrier,
        _finish,
        _initial_state,
        _prefetch,
        _program,
        _ring_load,
    )

#: shared buffers of chunk-start state and v' between the two partitions
NBUF = 2
#: registers a thread of the output partition gets (the state partition gets the rest)
OUT_REGS = 232

if gluon is not None:
    _RING = ttgl.constexpr(RING)
    _NBUF = ttgl.constexpr(NBUF)
    _OUT_REGS = ttgl.constexpr(OUT_REGS)

    @gluon.jit
    def _qk_load(qbuf, kbuf, stage, q, k, ts, ok, bos, eos, i_h, sqt, sqh, skt, skh, K: ttgl.constexpr, r, cols):
        """cp.async of one chunk's query and key rows (``[64, K]`` each) into ``stage``; rows
        outside the sequence (or past its last chunk) zero-filled."""
        m = ((ts + r >= bos) & (ts + r < eos) & ok)[:, None] & (cols[None, :] < K)
        t = ts.to(ttgl.int64)
        _cp_async(qbuf.index(stage), q + t * sqt + i_h * sqh + r[:, None] * sqt + cols[None, :], mask=m)
        _cp_async(kbuf.index(stage), k + t * skt + i_h * skh + r[:, None] * skt + cols[None, :], mask=m)
        async_copy.commit_group()

    @gluon.jit
    def _state_part(
        k, fd, w, u, gl, h0, ht, hb, store_slot, wbuf, kbuf, sbuf, nbuf, vbuf, full, empty,
        bos, eos, c0, c1, ts0, i_n, i_hv, i_v, i_h,
        skt: ttgl.constexpr, skh: ttgl.constexpr, HV: ttgl.constexpr, K: ttgl.constexpr, V: ttgl.constexpr,
        BK: ttgl.constexpr, BV: ttgl.constexpr, has_h0, STORE_B: ttgl.constexpr,
    ):  # fmt: skip
        """``state_gluon``'s loop, handing each chunk's start state and v' to the output partition."""
        ACC: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, 1], instr_shape=[16, BV, 16]
        )
        LOAD: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [2, 16], [_WARPS, 1], [1, 0])
        dt: ttgl.constexpr = w.dtype.element_ty
        oK = ttgl.arange(0, BK, layout=ttgl.SliceLayout(1, ACC))
        oV = i_v * BV + ttgl.arange(0, BV, layout=ttgl.SliceLayout(0, ACC))
        r_a = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, ACC))
        r_l = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, LOAD))
        oK_l = ttgl.arange(0, BK, layout=ttgl.SliceLayout(0, LOAD))
        sidx = oK[:, None] * V + oV[None, :]
        hoff, S = _initial_state(h0, has_h0, i_n, i_hv, HV, K, V, BK, BV, sidx, ACC)
        for j in ttgl.static_range(_RING - 1):
            _ring_load(wbuf, kbuf, j, w, k, ts0 + j * 64, c0 + j < c1, bos, eos, i_hv, i_h, skt, skh, HV, K, r_l, oK_l)
        u_c, f_c, g_c = _chunk_rows(u, fd, gl, c0, ts0, c0 < c1, bos, eos, i_hv, HV, V, r_a, oV)
        prev_slot = -1
        zero = ttgl.zeros([64, BV], ttgl.float32, ACC)
        for c in range(c0, c1):
            i = c - c0
            ts = ts0 + i * 64
            stage = i % _RING
            u_n, f_n, g_n, slot = _prefetch(
                wbuf, kbuf, w, k, u, fd, gl, store_slot, c, i, ts, c1, bos, eos, i_hv, i_h, skt, skh, HV, K, V,
                r_l, oK_l, r_a, oV,
            )  # fmt: skip
            b = i % _NBUF
            # the output partition is done with this buffer's previous chunk (NBUF chunks back;
            # the first NBUF waits pass: an mbarrier starts with its phase 1 complete)
            mbarrier.wait(empty.index(b), ((i // _NBUF) & 1) ^ 1)
            sb = sbuf.index(b)
            sb.store(S.to(dt))
            async_copy.wait_group(_RING - 1)
            fence_async_shared()
            acc = warpgroup_mma(wbuf.index(stage), sb, zero, use_acc=False, is_async=True)
            _boundary_store(hb, prev_slot, S, i_hv, HV, K, V, sidx, STORE_B)
            decayed = S * ttgl.exp(g_c)
            acc = warpgroup_mma_wait(0, deps=[acc])
            vn = u_c.to(ttgl.float32) - acc
            nbuf.index(b).store(vn.to(dt))
            vbuf.store((vn * f_c[:, None]).to(dt))
            fence_async_shared()
            # every thread's v' (and the chunk-start state before it) written: hand them over
            _cta_barrier()
            mbarrier.arrive(full.index(b))
            S = warpgroup_mma(kbuf.index(stage).permute([1, 0]), vbuf, decayed, is_async=True)
            S = warpgroup_mma_wait(0, deps=[S])
            prev_slot = slot
            u_c, f_c, g_c = u_n, f_n, g_n
        _finish(hb, ht, hoff, prev_slot, S, i_hv, HV, K, V, sidx, STORE_B)

    @gluon.jit
    def _gate_rows(gc, ts, bos, eos, i_hv, HV: ttgl.constexpr, r_p, c_p):
        """A chunk's gate cumsum, as the scores' rows and as their columns (0 outside the sequence)."""
        mr = (ts + r_p >= bos) & (ts + r_p < eos)
        mc = (ts + c_p >= bos) & (ts + c_p < eos)
        gr = ttgl.load(gc + (ts + r_p).to(ttgl.int64) * HV + i_hv, mask=mr, other=0.0)
        gcol = ttgl.load(gc + (ts + c_p).to(ttgl.int64) * HV + i_hv, mask=mc, other=0.0)
        return gr, gcol

    @gluon.jit
    def _norms(qs, ks, scale, l2norm, LOAD: ttgl.constexpr, ROWS: ttgl.constexpr, COLS: ttgl.constexpr):
        """The queries' row factors (1 / |q| where l2norm, times the scale) and the keys' (1 / |k|),
        from the chunk's shared tiles, in the scores' row and column layouts."""
        qf = qs.load(LOAD).to(ttgl.float32)
        kf = ks.load(LOAD).to(ttgl.float32)
        qsq = ttgl.sum(qf * qf, 1)
        ksq = ttgl.sum(kf * kf, 1)
        rq = ttgl.where(l2norm != 0, 1.0 / ttgl.sqrt(qsq + 1e-6), 1.0) * scale
        rk = ttgl.where(l2norm != 0, 1.0 / ttgl.sqrt(ksq + 1e-6), 1.0)
        return ttgl.convert_layout(rq, ROWS), ttgl.convert_layout(rk, COLS)

    @gluon.jit
    def _scores(qk, rq, rk, gr, gcol, causal, pbuf, dt: ttgl.constexpr, OROWS: ttgl.constexpr):
        """The causal, decayed, normalised ``Q K^T`` into ``pbuf`` (the next product's bf16 shared
        operand: a register operand made ptxas serialise the partition's products), and the rows'
        factor of ``Q h`` (rq e^gamma), as the output kernel forms them."""
        P = qk * rq[:, None] * rk[None, :] * ttgl.exp(ttgl.where(causal, gr[:, None] - gcol[None, :], float("-inf")))
        pbuf.store(P.to(dt))
        return ttgl.convert_layout(rq * ttgl.exp(gr), OROWS)

    @gluon.jit
    def _out_part(
        q, k, gc, o, qbuf, kbuf, pbuf, sbuf, nbuf, full, empty, scale, l2norm,
        bos, eos, c0, c1, ts0, i_hv, i_v, i_h,
        sqt: ttgl.constexpr, sqh: ttgl.constexpr, skt: ttgl.constexpr, skh: ttgl.constexpr,
        HV: ttgl.constexpr, K: ttgl.constexpr, V: ttgl.constexpr, BK: ttgl.constexpr, BV: ttgl.constexpr,
    ):  # fmt: skip
        """Each chunk's output from its queries and keys and the state partition's buffers,
        software-pipelined by one chunk: while chunk c's ``Q h`` and ``P v'`` run, chunk c+1's
        ``Q K^T`` runs; its norms are formed before any product is in flight (registers that
        in-flight products' accumulators might need made ptxas serialise them)."""
        ACC: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, 1], instr_shape=[16, BV, 16]
        )
        ACCP: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, 1], instr_shape=[16, 64, 16]
        )
        LOAD: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [2, 16], [_WARPS, 1], [1, 0])
        ROWS: ttgl.constexpr = ttgl.SliceLayout(1, ACCP)
        COLS: ttgl.constexpr = ttgl.SliceLayout(0, ACCP)
        OROWS: ttgl.constexpr = ttgl.SliceLayout(1, ACC)
        dt: ttgl.constexpr = o.dtype.element_ty
        r_l = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, LOAD))
        oK_l = ttgl.arange(0, BK, layout=ttgl.SliceLayout(0, LOAD))
        r_p = ttgl.arange(0, 64, layout=ROWS)
        c_p = ttgl.arange(0, 64, layout=COLS)
        r_o = ttgl.arange(0, 64, layout=OROWS)
        oV = i_v * BV + ttgl.arange(0, BV, layout=ttgl.SliceLayout(0, ACC))
        causal = r_p[:, None] >= c_p[None, :]
        zp = ttgl.zeros([64, 64], ttgl.float32, ACCP)
        zo = ttgl.zeros([64, BV], ttgl.float32, ACC)
        # prologue: chunk c0's scores; chunk c0 + 1's tiles and gate on their way
        _qk_load(qbuf, kbuf, 0, q, k, ts0, c0 < c1, bos, eos, i_h, sqt, sqh, skt, skh, K, r_l, oK_l)
        _qk_load(qbuf, kbuf, 1, q, k, ts0 + 64, c0 + 1 < c1, bos, eos, i_h, sqt, sqh, skt, skh, K, r_l, oK_l)
        gr, gcol = _gate_rows(gc, ts0, bos, eos, i_hv, HV, r_p, c_p)
        gr_n, gcol_n = _gate_rows(gc, ts0 + 64, bos, eos, i_hv, HV, r_p, c_p)
        async_copy.wait_group(1)
        rq, rk = _norms(qbuf.index(0), kbuf.index(0), scale, l2norm, LOAD, ROWS, COLS)
        fence_async_shared()
        qk = warpgroup_mma(qbuf.index(0), kbuf.index(0).permute([1, 0]), zp, use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(0, deps=[qk])
        rowf = _scores(qk, rq, rk, gr, gcol, causal, pbuf, dt, OROWS)
        for c in range(c0, c1):
            i = c - c0
            ts = ts0 + i * 64
            st = i % 2
            st1 = (i + 1) % 2
            async_copy.wait_group(0)  # chunk c + 1's tiles have landed
            rq, rk = _norms(qbuf.index(st1), kbuf.index(st1), scale, l2norm, LOAD, ROWS, COLS)
            fence_async_shared()
            qk = warpgroup_mma(qbuf.index(st1), kbuf.index(st1).permute([1, 0]), zp, use_acc=False, is_async=True)
            b = i % _NBUF
            mbarrier.wait(full.index(b), (i // _NBUF) & 1)
            oh = warpgroup_mma(qbuf.index(st), sbuf.index(b), zo, use_acc=False, is_async=True)
            pv = warpgroup_mma(pbuf, nbuf.index(b), zo, use_acc=False, is_async=True)
            gr_nn, gcol_nn = _gate_rows(gc, ts + 128, bos, eos, i_hv, HV, r_p, c_p)
            qk, oh, pv = warpgroup_mma_wait(0, deps=[qk, oh, pv])
            # every thread's products over this buffer (and this stage, and pbuf) complete
            _cta_barrier()
            mbarrier.arrive(empty.index(b))
            _qk_load(
                qbuf, kbuf, st, q, k, ts + 128, c + 2 < c1, bos, eos, i_h, sqt, sqh, skt, skh, K, r_l, oK_l,
            )  # fmt: skip
            m_o = (ts + r_o >= bos) & (ts + r_o < eos)
            ooff = ((ts + r_o).to(ttgl.int64) * HV + i_hv)[:, None] * V + oV[None, :]
            ttgl.store(o + ooff, (oh * rowf[:, None] + pv).to(dt), mask=m_o[:, None] & (oV[None, :] < V))
            rowf = _scores(qk, rq, rk, gr_n, gcol_n, causal, pbuf, dt, OROWS)
            gr_n, gcol_n = gr_nn, gcol_nn
        async_copy.wait_group(0)

    # the per-call flags stay runtime values: Triton specialises an int argument equal to 1 into
    # a constant, and a plan compiled at 1 would ignore a later call's 0 (``chunk_gdn._PER_CALL``)
    @gluon.jit(do_not_specialize=["l2norm", "has_h0"])
    def _gluon_fused_kernel(
        q, k, gc, fd, w, u, gl, o, h0, ht, hb, seq_info, chunk_info, store_slot, scale, l2norm, has_h0,
        sqt: ttgl.constexpr, sqh: ttgl.constexpr, skt: ttgl.constexpr, skh: ttgl.constexpr,
        HV: ttgl.constexpr, GROUP: ttgl.constexpr, K: ttgl.constexpr, V: ttgl.constexpr, BK: ttgl.constexpr,
        BV: ttgl.constexpr, STORE_B: ttgl.constexpr,
    ):  # fmt: skip
        dt: ttgl.constexpr = w.dtype.element_ty
        RING_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, BK], ttgl.bfloat16)
        S_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BK, BV], ttgl.bfloat16)
        V_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, BV], ttgl.bfloat16)
        i_n, i_hv, i_v, i_h, bos, eos, c0, c1, ts0 = _program(seq_info, chunk_info, HV, GROUP, V // BV)
        wbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, BK], RING_L)
        kbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, BK], RING_L)
        # the output partition's queries and keys: chunk c's and chunk c + 1's
        qbuf = ttgl.allocate_shared_memory(dt, [2, 64, BK], RING_L)
        k2buf = ttgl.allocate_shared_memory(dt, [2, 64, BK], RING_L)
        P_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, 64], ttgl.bfloat16)
        pbuf = ttgl.allocate_shared_memory(dt, [64, 64], P_L)
        sbuf = ttgl.allocate_shared_memory(dt, [_NBUF, BK, BV], S_L)
        nbuf = ttgl.allocate_shared_memory(dt, [_NBUF, 64, BV], V_L)
        vbuf = ttgl.allocate_shared_memory(dt, [64, BV], V_L)
        full = ttgl.allocate_shared_memory(ttgl.int64, [_NBUF, 1], mbarrier.MBarrierLayout())
        empty = ttgl.allocate_shared_memory(ttgl.int64, [_NBUF, 1], mbarrier.MBarrierLayout())
        for j in ttgl.static_range(_NBUF):
            mbarrier.init(full.index(j), count=1)
            mbarrier.init(empty.index(j), count=1)
        ttgl.warp_specialize(
            [
                (
                    _state_part,
                    (k, fd, w, u, gl, h0, ht, hb, store_slot, wbuf, kbuf, sbuf, nbuf, vbuf, full, empty,
                     bos, eos, c0, c1, ts0, i_n, i_hv, i_v, i_h, skt, skh, HV, K, V, BK, BV, has_h0, STORE_B),
                ),
                (
                    _out_part,
                    (q, k, gc, o, qbuf, k2buf, pbuf, sbuf, nbuf, full, empty, scale, l2norm,
                     bos, eos, c0, c1, ts0, i_hv, i_v, i_h, sqt, sqh, skt, skh, HV, K, V, BK, BV),
                ),
            ],
            [_WARPS],
            [_OUT_REGS],
        )  # fmt: skip

else:
    _gluon_fused_kernel = None
