"""The SSD (Mamba2) state loop in Gluon for Hopper (sm_90a): the recurrence of
``ssd._ssd_state_kernel`` with the layouts written out, for the overlapped 16-bit path.

Why: the Triton loop stores two tiles a chunk (the bf16 chunk-start state the output kernel reads,
and, at emitted boundaries, the fp32 state), and Triton converts each from the product's
accumulator layout to a coalescing one through shared memory, with barriers, on the serial path.
Here both are stored straight from the wgmma accumulator's registers (a thread holds pairs of
adjacent columns: every 32-byte sector of the fp32 state is written whole by one warp store), and
both stores are issued while the chunk's product runs.

Per chunk c of a (sequence, head) program (P = 64 rows of the state, N its columns):

    Bw = B diag-scaled by exp(gamma_last - gamma) dt     (registers, from the ring; bf16 into smem)
    S' = S exp(gamma_last) + X^T Bw                      (one wgmma, the decayed S its accumulator,
                                                          as Triton folds the loop's expression)
    hs[c] = S (bf16), hb[slot of c - 1] = S (fp32)       (while the product runs)

x and B tiles arrive by ``cp.async`` into a ring of ``RING`` stages; dt and gamma (from
``ssd._ssd_prep_kernel``) one chunk ahead in registers. With ``OVL`` it lets the output kernel
start beside it and releases its progress every ``SIG`` chunks (a thread barrier, then the count of
chunks whose start state is written, stored with a release at GPU scope), as the Triton loop does.

It takes one shape family only (``applies``): 16-bit inputs, P = ``GLUON_P`` (one program a head),
N in ``GLUON_N``, the prep kernel's dt and gamma. Everything else runs the Triton loop. ``gluon``
is None where this Triton has no Gluon.
"""

from __future__ import annotations

from kernels.state_gluon import gluon

if gluon is not None:
    from triton.experimental.gluon import language as ttgl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.language.extra.cuda import gdc_launch_dependents

    # the gated-delta loop's: its warp count and the Triton-version shims for cp.async and the
    # CTA barrier
    from kernels.state_gluon import _WARPS, _cp_async, _cta_barrier

    # a bulk tensor copy shared -> global: ``async_store`` from Triton 3.7 on (3.9 refuses the old
    # name), ``async_copy_shared_to_global`` in 3.6; the same arguments
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

#: the head dim this loop is written for (the accumulator's rows: one warpgroup's 64)
GLUON_P = 64
#: the state sizes it takes (the accumulator's instruction width)
GLUON_N = (64, 128)
#: stages of the x / B ring
RING = 3
#: warpgroups a program may run (``GLUON``'s value): 1, the whole state in one; 2, its columns split
#: between two (the Triton loop's 8 warps), the B scaling and the stores shared between them
GLUON_WARPGROUPS = (1, 2)


#: buffers of the fp32 boundary states on their way out by bulk copies (``TMA``): a copy is waited
#: for only two stores later, so the chunk's loop does not wait on the one it just issued
TMA_BUFFERS = 2


def boundary_descriptor(hb, P: int, N: int):
    """``TMA``'s descriptor of the boundary states ``hb`` ``[NB, H, P, N]`` (contiguous, fp32) as
    ``[NB * H * P, N]`` rows, a block one state, in the shared layout the loop stores it in."""
    layout = ttgl.NVMMASharedLayout.get_default_for([P, N], ttgl.float32)
    return GluonDescriptor.from_tensor(hb.view(-1, N), [P, N], layout)


def applies(P: int, N: int, dtype_bits: int, prep: bool) -> bool:
    """Whether a call's SSD state loop can run here (Gluon present, the shape family)."""
    return gluon is not None and dtype_bits == 16 and P == GLUON_P and N in GLUON_N and prep


if gluon is not None:
    _RING = ttgl.constexpr(RING)

    @gluon.jit
    def _ring_load(xbuf, bbuf, stage, x, Bm, ts, ok, bos, eos, i_h, grp, sxt, sxh, sbt, sbg, rx, oP, rb, oN):
        """cp.async of one chunk's x rows ``[64, P]`` and B rows ``[64, N]`` into ring ``stage``;
        rows outside the sequence (or past its last chunk: ``ok`` false) are zero-filled."""
        mx = (ts + rx >= bos) & (ts + rx < eos) & ok
        tx = (ts + rx).to(ttgl.int64)
        _cp_async(
            xbuf.index(stage), x + tx[:, None] * sxt + i_h * sxh + oP[None, :], mask=mx[:, None] & (oP[None, :] >= 0)
        )
        mb = (ts + rb >= bos) & (ts + rb < eos) & ok
        tb = (ts + rb).to(ttgl.int64)
        _cp_async(
            bbuf.index(stage), Bm + tb[:, None] * sbt + grp * sbg + oN[None, :], mask=mb[:, None] & (oN[None, :] >= 0)
        )
        async_copy.commit_group()

    _TMA_BUFFERS = ttgl.constexpr(TMA_BUFFERS)

    @gluon.jit
    def _bulk_store(obuf, desc, nout, S, row):
        """Hand the fp32 state ``S`` (the accumulator's registers) to the copy engine for rows
        ``row ..`` of the boundary states: wait until the copy issued ``TMA_BUFFERS`` stores ago has
        read its buffer (every thread past a barrier), write the buffer, fence it for the async
        proxy, issue; returns the count of copies issued."""
        k = nout % _TMA_BUFFERS
        tma.store_wait(_TMA_BUFFERS - 1)
        _cta_barrier()
        obuf.index(k).store(S)
        fence_async_shared()
        _cta_barrier()
        _tma_store(desc, [row, 0], obuf.index(k))
        return nout + 1

    @gluon.jit
    def _chunk_gates(gam, dtc, c, ok, i_h, H, r):
        """One chunk's step sizes and gamma (as the prep kernel stored them) and its last gamma."""
        row = (c * H + i_h).to(ttgl.int64) * 64
        d = ttgl.load(dtc + row + r, mask=(r >= 0) & ok, other=0.0)
        g = ttgl.load(gam + row + r, mask=(r >= 0) & ok, other=0.0)
        last = ttgl.load(gam + row + 63, mask=ok, other=0.0)
        return d, g, last

    @gluon.jit
    def _sequence(seq_info, chunk_info, i_n):
        """Sequence ``i_n``'s first token, its end, its chunk range and its first chunk's first
        (virtual) token."""
        bos = ttgl.load(seq_info + i_n * 4)
        eos = ttgl.load(seq_info + i_n * 4 + 1)
        c0 = ttgl.load(seq_info + i_n * 4 + 2)
        c1 = ttgl.load(seq_info + i_n * 4 + 3)
        ts0 = ttgl.load(chunk_info + c0 * 4 + 1, mask=c0 < c1, other=0)
        return bos, eos, c0, c1, ts0

    @gluon.jit
    def _state_start(
        h0, has_h0, i_n, i_h, H: ttgl.constexpr, P: ttgl.constexpr, N: ttgl.constexpr, ACC: ttgl.constexpr,
        XL: ttgl.constexpr, BL: ttgl.constexpr,
    ):  # fmt: skip
        """The index vectors (the state ``[P, N]`` in the accumulator's layout, the rings' rows),
        the (sequence, head)'s state offset and its initial state (zeros without ``has_h0``)."""
        oP_a = ttgl.arange(0, P, layout=ttgl.SliceLayout(1, ACC))
        oN_a = ttgl.arange(0, N, layout=ttgl.SliceLayout(0, ACC))
        sidx = oP_a[:, None] * N + oN_a[None, :]
        rx = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, XL))
        oP = ttgl.arange(0, P, layout=ttgl.SliceLayout(0, XL))
        rb = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, BL))
        oN = ttgl.arange(0, N, layout=ttgl.SliceLayout(0, BL))
        sbase = (i_n * H + i_h).to(ttgl.int64) * (P * N)
        S = ttgl.load(h0 + sbase + sidx, mask=(ttgl.full([P, N], 0, ttgl.int32, ACC) + has_h0) != 0, other=0.0)
        return sidx, rx, oP, rb, oN, sbase, S

    @gluon.jit
    def _ring_start(
        xbuf, bbuf, x, Bm, gam, dtc, c0, c1, ts0, bos, eos, i_h, grp, sxt, sxh, sbt, sbg, H, rx, oP, rb, oN
    ):
        """The ring's first ``RING - 1`` chunks on their way, and the first chunk's gates."""
        for j in ttgl.static_range(_RING - 1):
            _ring_load(
                xbuf, bbuf, j, x, Bm, ts0 + j * 64, c0 + j < c1, bos, eos, i_h, grp, sxt, sxh, sbt, sbg, rx, oP, rb, oN
            )  # fmt: skip
        return _chunk_gates(gam, dtc, c0, c0 < c1, i_h, H, rb)

    @gluon.jit
    def _ring_ahead(
        xbuf, bbuf, x, Bm, gam, dtc, store_slot, c, i, ts, c1, bos, eos, i_h, grp, sxt, sxh, sbt, sbg, H, rx, oP, rb, oN
    ):  # fmt: skip
        """At chunk ``c`` (the program's ``i``-th, from token ``ts``): chunk ``c + RING - 1``'s rows on
        their way into the ring, chunk ``c + 1``'s gates, and the boundary slot of chunk ``c``'s end."""
        _ring_load(
            xbuf, bbuf, (i + _RING - 1) % _RING, x, Bm, ts + (_RING - 1) * 64, c + _RING - 1 < c1, bos, eos, i_h,
            grp, sxt, sxh, sbt, sbg, rx, oP, rb, oN,
        )  # fmt: skip
        d_n, g_n, last_n = _chunk_gates(gam, dtc, c + 1, c + 1 < c1, i_h, H, rb)
        slot = ttgl.load(store_slot + c)
        return d_n, g_n, last_n, slot

    @gluon.jit
    def _issue_product(xbuf, bbuf, wbuf, stage, S, d_c, g_c, last_c, BL: ttgl.constexpr, dt: ttgl.constexpr):
        """Once ring ``stage``'s tiles have landed: B scaled by each row's decay to the chunk's end
        x dt (as the Triton loop rounds it) into ``wbuf``, and ``S exp(gamma_last) + X^T Bw`` issued
        on wgmma, the decayed state its accumulator (Triton folds ``S * e + dot`` so too); returns
        the product's token."""
        async_copy.wait_group(_RING - 1)
        wgt = ttgl.exp(last_c - g_c) * d_c
        bw = bbuf.index(stage).load(BL).to(ttgl.float32) * wgt[:, None]
        wbuf.store(bw.to(dt))
        fence_async_shared()
        return warpgroup_mma(xbuf.index(stage).permute([1, 0]), wbuf, S * ttgl.exp(last_c), is_async=True)

    @gluon.jit(do_not_specialize=["has_h0"])
    def _gluon_ssd_state_kernel(
        x, Bm, gam, dtc, hs, h0, ht, hb, hb_desc, seq_info, chunk_info, store_slot, sxt, sxh, sbt, sbg, has_h0,
        prog, H: ttgl.constexpr, GROUP: ttgl.constexpr, P: ttgl.constexpr, N: ttgl.constexpr,
        STORE_B: ttgl.constexpr, OVL: ttgl.constexpr, SIG: ttgl.constexpr, WG: ttgl.constexpr = 1,
        TMA: ttgl.constexpr = False,
    ):  # fmt: skip
        # WG warpgroups: each holds the state's rows whole and N / WG of its columns
        ACC: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, WG], instr_shape=[16, N // WG, 16]
        )
        # 16 bytes a thread: the x ring's [64, P] rows and the B ring's [64, N] rows
        XL: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [32 // (P // 8), P // 8], [_WARPS * WG, 1], [1, 0])
        BL: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [32 // (N // 8), N // 8], [_WARPS * WG, 1], [1, 0])
        dt: ttgl.constexpr = x.dtype.element_ty
        X_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, P], dt)
        B_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, N], dt)
        i_n = ttgl.program_id(0)
        i_h = ttgl.program_id(1)
        grp = i_h // GROUP
        bos, eos, c0, c1, ts0 = _sequence(seq_info, chunk_info, i_n)
        if OVL:
            # the output kernel (launched programmatically dependent) may start once every program
            # of this loop is resident; it waits on ``prog`` for the chunks it reads
            gdc_launch_dependents()
        pslot = i_n * H + i_h  # the (sequence, head)'s one progress counter (one P block)
        sidx, rx, oP, rb, oN, sbase, S = _state_start(h0, has_h0, i_n, i_h, H, P, N, ACC, XL, BL)
        xbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, P], X_L)
        bbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, N], B_L)
        wbuf = ttgl.allocate_shared_memory(dt, [64, N], B_L)  # the product's B operand, scaled
        if TMA:
            # the fp32 boundary states' way out: a ring of TMA_BUFFERS the copy engine reads
            obuf = ttgl.allocate_shared_memory(ttgl.float32, [_TMA_BUFFERS, P, N], hb_desc.layout)
        nout = 0  # boundary states handed to the copy engine
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
            # while X^T Bw runs: the chunk-start state (bf16, for the output kernel) and the previous
            # chunk's boundary state (fp32), both from the registers
            ttgl.store(hs + (c * H + i_h).to(ttgl.int64) * (P * N) + sidx, S.to(dt))
            if STORE_B:
                if prev_slot >= 0:
                    if TMA:
                        nout = _bulk_store(obuf, hb_desc, nout, S, (prev_slot * H + i_h) * P)
                    else:
                        ttgl.store(hb + (prev_slot * H + i_h).to(ttgl.int64) * (P * N) + sidx, S)
            S = warpgroup_mma_wait(0, deps=[acc])
            if OVL:
                if ((i + 1) % SIG == 0) | (c + 1 == c1):
                    # every SIG chunks and at the last: this program's chunk-start states up to
                    # chunk c are written (all threads past the barrier; the release orders them
                    # before the count the output kernel acquires)
                    _cta_barrier()
                    ttgl.atomic_xchg(prog + pslot, c + 1, sem="release", scope="gpu")
            prev_slot = slot
            d_c, g_c, last_c = d_n, g_n, last_n
        async_copy.wait_group(0)
        if STORE_B:
            if prev_slot >= 0:
                ttgl.store(hb + (prev_slot * H + i_h).to(ttgl.int64) * (P * N) + sidx, S)
        if TMA:
            tma.store_wait(0)  # the copies read their buffers before the program's shared memory goes
        ttgl.store(ht + sbase + sidx, S)

else:
    _gluon_ssd_state_kernel = None
