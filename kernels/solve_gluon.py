"""The solve kernel in Gluon for Hopper (sm_90a): a chunk's gate cumsum, the key norms,
L = strict_tril(diag(beta) K K^T o decay) and A = (I + L)^-1, for two value heads a program.

Why a second implementation: ``chunk_gdn._solve_kernel`` inverts the four 16 x 16 diagonal blocks
by a forward substitution whose every step reduces across threads (eight barriers a step, 15
steps) and merges them with 16 fp32 products; at two warps and 255 registers it took 0.61 ms at
16/32 heads and 32K tokens on an H200, a quarter of the call (``docs/kernels.md``). Here

- ``K K^T`` is one warpgroup product from the key tile in shared memory (both value heads of a
  pair share it where they share a key head), and the key norms are its diagonal;
- L goes to shared memory, and each thread then owns one column of one head's A and runs the
  forward substitution of the whole 64 x 64 lower-triangular system down that column:
  ``A[i, c] = delta_ic - sum_{m < i} L[i, m] A[m, c]``, the rows of L read as broadcasts, every
  sum inside the thread. The sum over ``m < i`` is written as a masked sum over all 64 rows with
  ``-0.0`` where ``m >= i`` (``x + -0.0`` is ``x`` in IEEE arithmetic), so the compiler drops
  the masked terms and the thread does the triangle's 2016 multiply-adds, no barrier;
- 128 threads: two heads of 64 columns.

The substitution is IEEE fp32 arithmetic, as the Triton kernel's inverse and merges are (no tf32);
the order of the sums differs from the block inverse's, so A agrees with it to fp32 rounding
before both store it in 16 bits. It takes the production shape only (``applies``): 16-bit inputs, K =
``GLUON_K``.
"""

from __future__ import annotations

from kernels.state_gluon import GLUON_K, PROG_SLOTS, gluon

if gluon is not None:
    from triton.experimental.gluon import language as ttgl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from kernels.state_gluon import _cp_async

#: value heads a program solves (one per pair of warps)
HEADS = 2
#: warps: one warpgroup (the K K^T product), a column of A per thread
SOLVE_WARPS = 4


def applies(K: int, dtype_bits: int) -> bool:
    """Whether a call's solve can run here (Gluon present, the production shape)."""
    return gluon is not None and dtype_bits == 16 and K == GLUON_K


if gluon is not None:
    _HEADS = ttgl.constexpr(HEADS)
    _NW = ttgl.constexpr(SOLVE_WARPS)
    _PROG_C = ttgl.constexpr(PROG_SLOTS)

    @gluon.jit
    def _add(a, b):
        return a + b

    @gluon.jit
    def _softplus(x):
        """``kernels.chunk_tiles._softplus`` in Gluon: ``log(1 + e^x)`` to a few ulps (Goldberg's
        log1p), ``x`` itself above 20."""
        u = ttgl.exp(ttgl.minimum(x, 20.0))
        w = 1.0 + u
        lp = ttgl.where(w == 1.0, u, ttgl.log(w) * (u / ttgl.where(w == 1.0, 1.0, w - 1.0)))
        return ttgl.where(x > 20.0, x, lp)

    @gluon.jit
    def _keys(kbuf, k, t0, tstart, lo, hi, i_h, skt, skh, K: ttgl.constexpr, BK: ttgl.constexpr, LOAD: ttgl.constexpr):
        """cp.async of the chunk's key rows of key head ``i_h`` (``[64, BK]``) into ``kbuf``;
        rows outside the sequence zero-filled."""
        r = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, LOAD))
        cols = ttgl.arange(0, BK, layout=ttgl.SliceLayout(0, LOAD))
        m = ((tstart + r >= lo) & (tstart + r < hi))[:, None] & (cols[None, :] < K)
        _cp_async(kbuf, k + t0 * skt + i_h * skh + r[:, None] * skt + cols[None, :], mask=m)
        async_copy.commit_group()

    @gluon.jit
    def _gates(
        g, beta, A_log, dt_bias, gc_out, gl_out, i_c, i_hv, ok, t0, tstart, lo, hi, r,
        sgt, sgh, sbt, sbh, HV, USE_GATE: ttgl.constexpr, BETA_SIGMOID: ttgl.constexpr,
        ROWS: ttgl.constexpr, COLS: ttgl.constexpr,
    ):  # fmt: skip
        """One head's gate (through softplus where ``USE_GATE``), its chunk-local cumsum (stored,
        with the chunk-end value) and beta (through a sigmoid where ``BETA_SIGMOID``), over the
        chunk's 64 rows in ``r``'s layout (one warp's: the scan runs inside it), returned as the
        scores' rows and columns; rows outside the sequence contribute 0."""
        m = (tstart + r >= lo) & (tstart + r < hi) & ok
        gr = ttgl.load(g + t0 * sgt + i_hv * sgh + r * sgt, mask=m, other=0.0).to(ttgl.float32)
        if USE_GATE:
            A_log_h = ttgl.load(A_log + i_hv, mask=ok, other=0.0).to(ttgl.float32)
            dt_bias_h = ttgl.load(dt_bias + i_hv, mask=ok, other=0.0).to(ttgl.float32)
            gr = ttgl.where(m, -ttgl.exp(A_log_h) * _softplus(gr + dt_bias_h), 0.0)
        b = ttgl.load(beta + t0 * sbt + i_hv * sbh + r * sbt, mask=m, other=0.0).to(ttgl.float32)
        if BETA_SIGMOID:
            b = ttgl.where(m, 1 / (1 + ttgl.exp(-b)), 0.0)
        gc = ttgl.associative_scan(gr, 0, _add)
        ttgl.store(gc_out + (t0 + r) * HV + i_hv, gc, mask=m)
        ttgl.store(gl_out + i_c * HV + i_hv, ttgl.sum(ttgl.where(r == 63, gc, 0.0), 0), mask=ok)
        return ttgl.convert_layout(gc, ROWS), ttgl.convert_layout(gc, COLS), ttgl.convert_layout(b, ROWS)

    @gluon.jit
    def _key_norms(G, eye, l2norm):
        """1 / |k_i| from the diagonal of ``K K^T`` (1 without l2norm), in its rows' layout."""
        return ttgl.where(l2norm != 0, 1.0 / ttgl.sqrt(ttgl.sum(ttgl.where(eye, G, 0.0), 1) + 1e-6), 1.0)

    @gluon.jit
    def _scaled(G, rk, rk_c, gc, gc_c, b, r, c):
        """beta_i (k_i . k_j) / (|k_i| |k_j|) exp(gamma_i - gamma_j), strictly lower (i > j)."""
        d = ttgl.exp(ttgl.where(r[:, None] > c[None, :], gc[:, None] - gc_c[None, :], float("-inf")))
        return G * (b * rk)[:, None] * rk_c[None, :] * d

    # the per-call flags stay runtime values: Triton specialises an int argument equal to 1 into
    # a constant, and a plan compiled at 1 would ignore a later call's 0 (``chunk_gdn._PER_CALL``)
    @gluon.jit(do_not_specialize=["l2norm"])
    def _gluon_solve_kernel(
        k, g, beta, A_log, dt_bias, a_out, gc_out, gl_out, prog, chunk_info,
        skt, skh, sgt, sgh, sbt, sbh, HV, GROUP,
        K: ttgl.constexpr, BK: ttgl.constexpr, OVL: ttgl.constexpr, USE_GATE: ttgl.constexpr,
        BETA_SIGMOID: ttgl.constexpr, PAIR: ttgl.constexpr, l2norm,
    ):  # fmt: skip
        """Program (chunk, pair of value heads 2p and 2p + 1). ``PAIR``: both heads read one
        key head (GROUP even), so one ``K K^T`` serves both."""
        dt: ttgl.constexpr = a_out.dtype.element_ty
        ACCP: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_NW, 1], instr_shape=[16, 64, 16]
        )
        ROWS: ttgl.constexpr = ttgl.SliceLayout(1, ACCP)
        COLS: ttgl.constexpr = ttgl.SliceLayout(0, ACCP)
        LOAD: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [2, 16], [_NW, 1], [1, 0])
        # [head, row m, column c]: a thread holds one head's column, all 64 rows
        COL3: ttgl.constexpr = ttgl.BlockedLayout([1, 64, 1], [1, 1, 32], [_HEADS, 1, _NW // _HEADS], [1, 2, 0])
        LROW: ttgl.constexpr = ttgl.SliceLayout(2, COL3)  # [head, m]: a thread holds its head's 64
        OUTC: ttgl.constexpr = ttgl.SliceLayout(1, COL3)  # [head, c]: one value a thread
        i_c = ttgl.program_id(0)
        i_hv0 = ttgl.program_id(1) * _HEADS
        i_hv1 = i_hv0 + 1
        ok1 = i_hv1 < HV
        i_hv1 = ttgl.minimum(i_hv1, HV - 1)
        tstart = ttgl.load(chunk_info + i_c * 4 + 1)
        lo = ttgl.load(chunk_info + i_c * 4 + 2)
        hi = ttgl.load(chunk_info + i_c * 4 + 3)
        t0 = tstart.to(ttgl.int64)
        KL: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, BK], ttgl.bfloat16)
        kbuf0 = ttgl.allocate_shared_memory(dt, [64, BK], KL)
        _keys(kbuf0, k, t0, tstart, lo, hi, i_hv0 // GROUP, skt, skh, K, BK, LOAD)
        if not PAIR:
            kbuf1 = ttgl.allocate_shared_memory(dt, [64, BK], KL)
            _keys(kbuf1, k, t0, tstart, lo, hi, i_hv1 // GROUP, skt, skh, K, BK, LOAD)
        r = ttgl.arange(0, 64, layout=ROWS)
        c = ttgl.arange(0, 64, layout=COLS)
        GL: ttgl.constexpr = ttgl.BlockedLayout([2], [32], [_NW], [0])
        r_g = ttgl.arange(0, 64, layout=GL)
        gc0, gc0_c, b0 = _gates(
            g, beta, A_log, dt_bias, gc_out, gl_out, i_c, i_hv0, i_hv0 < HV, t0, tstart, lo, hi, r_g,
            sgt, sgh, sbt, sbh, HV, USE_GATE, BETA_SIGMOID, ROWS, COLS,
        )  # fmt: skip
        gc1, gc1_c, b1 = _gates(
            g, beta, A_log, dt_bias, gc_out, gl_out, i_c, i_hv1, ok1, t0, tstart, lo, hi, r_g,
            sgt, sgh, sbt, sbh, HV, USE_GATE, BETA_SIGMOID, ROWS, COLS,
        )  # fmt: skip
        if OVL:
            # the overlapped output's progress counters of a sequence starting at this chunk, zero
            # before the state loop starts (the scratch is reused between calls)
            PL: ttgl.constexpr = ttgl.BlockedLayout([1], [32], [_NW], [0])
            o16 = ttgl.arange(0, _PROG_C, layout=PL)
            z16 = ttgl.zeros([_PROG_C], ttgl.int32, PL)
            ttgl.store(prog + (i_c * HV + i_hv0) * _PROG_C + o16, z16)
            ttgl.store(prog + (i_c * HV + i_hv1) * _PROG_C + o16, z16, mask=(o16 >= 0) & ok1)
        # ---- K K^T, the key norms (its diagonal), L -----------------------------------------
        zp = ttgl.zeros([64, 64], ttgl.float32, ACCP)
        eye = r[:, None] == c[None, :]
        async_copy.wait_group(0)
        fence_async_shared()
        G0 = warpgroup_mma(kbuf0, kbuf0.permute([1, 0]), zp, use_acc=False, is_async=True)
        G0 = warpgroup_mma_wait(0, deps=[G0])
        rk0 = _key_norms(G0, eye, l2norm)
        rk0_c = ttgl.convert_layout(rk0, COLS)
        if PAIR:
            G1 = G0
            rk1 = rk0
            rk1_c = rk0_c
        else:
            G1 = warpgroup_mma(kbuf1, kbuf1.permute([1, 0]), zp, use_acc=False, is_async=True)
            G1 = warpgroup_mma_wait(0, deps=[G1])
            rk1 = _key_norms(G1, eye, l2norm)
            rk1_c = ttgl.convert_layout(rk1, COLS)
        L0 = _scaled(G0, rk0, rk0_c, gc0, gc0_c, b0, r, c)
        L1 = _scaled(G1, rk1, rk1_c, gc1, gc1_c, b1, r, c)
        # L as rows (i, head): step i of the substitution reads one [head, m] slab
        LS: ttgl.constexpr = ttgl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        lbuf = ttgl.allocate_shared_memory(ttgl.float32, [64 * _HEADS, 64], LS)
        lbuf.store(ttgl.reshape(ttgl.permute(ttgl.join(L0, L1), [0, 2, 1]), [64 * _HEADS, 64]))
        # ---- (I + L)^-1, a column a thread ------------------------------------------------
        m3 = ttgl.arange(0, 64, layout=ttgl.SliceLayout(0, LROW))[None, :, None]
        c3 = ttgl.arange(0, 64, layout=ttgl.SliceLayout(0, OUTC))[None, None, :]
        X = ttgl.where(m3 == c3, 1.0, 0.0) + ttgl.zeros([_HEADS, 64, 64], ttgl.float32, COL3)
        for i in ttgl.static_range(1, 64):
            lrow = lbuf.slice(i * _HEADS, _HEADS).load(LROW)
            s = ttgl.sum(ttgl.where(m3 < i, lrow[:, :, None] * X, -0.0), 1)
            X = ttgl.where(m3 == i, X - s[:, None, :], X)
        h3 = ttgl.expand_dims(ttgl.arange(0, _HEADS, layout=ttgl.SliceLayout(1, OUTC))[:, None], 1)
        i_hv3 = i_hv0 + h3
        ok3 = (i_hv3 < HV) & (m3 >= 0) & (c3 >= 0)
        aoff = (i_c * HV + i_hv3).to(ttgl.int64) * 4096 + m3 * 64 + c3
        ttgl.store(a_out + aoff, X.to(dt), mask=ok3)

else:
    _gluon_solve_kernel = None
