"""The state loop in Gluon for Hopper (sm_90a): the same recurrence, the same products in the same
order and the same bits as ``chunk_gdn._state_kernel``, with the layouts written out.

Why a second implementation of one kernel: the Triton loop converts every tile it stores (the
chunk-start state, v', the boundary state) from the wgmma accumulator's layout to a coalescing one
through shared memory, with barriers, on the serial path (``docs/kernels.md``). Here

- the boundary state (fp32) is stored straight from the accumulator's registers: a thread holds
  pairs of adjacent columns, so every 32-byte sector is written whole, with no conversion;
- the chunk-start state is read back from the shared-memory copy that the first product takes as
  its operand anyway, and stored while that product runs;
- v' goes through its own shared-memory tile beside the scaled copy the second product reads
  (where that pays: with boundary states, or at the narrow V block), and is stored while the second
  product runs;
- w and the key tiles arrive by ``cp.async`` into a ring of ``RING`` stages, u, the row factors
  and the chunk-end gate one chunk ahead in registers.

With ``OVL`` it lets the output kernel start beside it (``griddepcontrol.launch_dependents``) and
releases its progress every ``SIG`` chunks: a thread barrier, then the count of chunks written,
stored with a release at GPU scope into ``prog`` (the output acquires it before reading them).

It takes the production shape only (``applies``): 16-bit inputs, K = ``GLUON_K``, V a multiple of
the V block, four warps (one warpgroup), the 1-d grid of ``VFAST``. Everything else, fp32 inputs
and the interpreter run the Triton loop. ``gluon`` is None where this Triton has no Gluon.
"""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as ttgl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.language.extra.cuda import gdc_launch_dependents
except ImportError:  # a Triton without Gluon: the Triton loop runs everywhere
    gluon = None

#: the key head dim this loop is written for (its load layout spans 128 columns)
GLUON_K = 128
#: the V blocks it takes (the accumulator's instruction width)
GLUON_BV = (16, 32, 64)
#: warps: one warpgroup, which every layout below assumes
GLUON_WARPS = 4
#: stages of the w / key ring (H200, 16/32 heads, 32K tokens: 3 was 0.5 % faster than 2)
RING = 3
#: progress counters a (sequence, value head) has in the overlapped output's ``prog`` buffer: one
#: per V block, at most 256 / 16
PROG_SLOTS = 16


def applies(K: int, V: int, BV: int, dtype_bits: int, num_warps: int, vfast: int) -> bool:
    """Whether a call's state loop can run here (Gluon present, the production shape)."""
    return (
        gluon is not None
        and dtype_bits == 16
        and K == GLUON_K
        and BV in GLUON_BV
        and V % BV == 0
        and num_warps == GLUON_WARPS
        and bool(vfast)
    )


if gluon is not None:
    # the module's ints as the constexprs a Gluon kernel may read
    _WARPS = ttgl.constexpr(GLUON_WARPS)
    _RING = ttgl.constexpr(RING)
    _PROG_SLOTS = ttgl.constexpr(PROG_SLOTS)
    # cp.async global -> shared: ``async_load`` from Triton 3.7 on (3.9 refuses the old name),
    # ``async_copy_global_to_shared`` in 3.6; the same arguments
    _cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    # a barrier among the program's threads: ``thread_barrier`` in 3.6, ``barrier`` in 3.9
    _cta_barrier = getattr(ttgl, "thread_barrier", None) or ttgl.barrier

    @gluon.jit
    def _ring_load(wbuf, kbuf, stage, w, k, ts, ok, bos, eos, i_hv, i_h, skt, skh, HV, K: ttgl.constexpr, r, cols):
        """cp.async of one chunk's w rows and key rows (``[64, K]`` each) into ring ``stage``;
        rows outside the sequence (or past its last chunk: ``ok`` false) are zero-filled."""
        m = ((ts + r >= bos) & (ts + r < eos) & ok)[:, None] & (cols[None, :] < K)
        row0 = ts.to(ttgl.int64) * HV + i_hv
        _cp_async(wbuf.index(stage), w + row0 * K + r[:, None] * (HV * K) + cols[None, :], mask=m)
        kp = k + ts.to(ttgl.int64) * skt + i_h * skh + r[:, None] * skt + cols[None, :]
        _cp_async(kbuf.index(stage), kp, mask=m)
        async_copy.commit_group()

    @gluon.jit
    def _chunk_rows(u, fd, gl, c, ts, ok, bos, eos, i_hv, HV, V: ttgl.constexpr, r, oV):
        """One chunk's u block, row factors and chunk-end gate, in the accumulator's layout."""
        m = (ts + r >= bos) & (ts + r < eos) & ok
        row0 = ts.to(ttgl.int64) * HV + i_hv
        u_c = ttgl.load(
            u + row0 * V + r[:, None] * (HV * V) + oV[None, :], mask=m[:, None] & (oV[None, :] < V), other=0.0
        )
        f = ttgl.load(fd + row0 + r * HV, mask=m, other=0.0)
        g_last = ttgl.load(gl + c * HV + i_hv, mask=ok, other=0.0)
        return u_c, f, g_last

    @gluon.jit
    def _prefetch(
        wbuf, kbuf, w, k, u, fd, gl, store_slot, c, i, ts, c1, bos, eos, i_hv, i_h, skt, skh, HV,
        K: ttgl.constexpr, V: ttgl.constexpr, r_l, oK_l, r_a, oV,
    ):  # fmt: skip
        """At the top of chunk c (the loop's ``i``-th, first token ``ts``): chunk c + RING - 1's w
        / key tiles into the ring, chunk c + 1's u block, row factors and chunk-end gate, and the
        slot chunk c's end state is stored in (negative: none)."""
        _ring_load(
            wbuf, kbuf, (i + _RING - 1) % _RING, w, k, ts + (_RING - 1) * 64, c + _RING - 1 < c1, bos, eos, i_hv, i_h,
            skt, skh, HV, K, r_l, oK_l,
        )  # fmt: skip
        u_n, f_n, g_n = _chunk_rows(u, fd, gl, c + 1, ts + 64, c + 1 < c1, bos, eos, i_hv, HV, V, r_a, oV)
        return u_n, f_n, g_n, ttgl.load(store_slot + c)

    @gluon.jit
    def _boundary_store(hb, slot, S, i_hv, HV, K: ttgl.constexpr, V: ttgl.constexpr, sidx, STORE_B: ttgl.constexpr):
        """The state S (fp32, straight from the accumulator's registers) into boundary slot
        ``slot`` where the call stores boundary states and the slot is one (>= 0)."""
        if STORE_B:
            if slot >= 0:
                ttgl.store(hb + (slot * HV + i_hv).to(ttgl.int64) * (K * V) + sidx, S)

    @gluon.jit
    def _finish(
        hb, ht, hoff, prev_slot, S, i_hv, HV, K: ttgl.constexpr, V: ttgl.constexpr, sidx, STORE_B: ttgl.constexpr
    ):
        """After the last chunk: the ring drained, the last boundary state and the final state."""
        async_copy.wait_group(0)
        _boundary_store(hb, prev_slot, S, i_hv, HV, K, V, sidx, STORE_B)
        ttgl.store(ht + hoff + sidx, S)

    @gluon.jit
    def _program(seq_info, chunk_info, HV: ttgl.constexpr, GROUP: ttgl.constexpr, NV: ttgl.constexpr):
        """A program of the 1-d ``VFAST`` grid: its sequence, value head, V block and key head, the
        sequence's token range and chunk range, and its first (virtual) token."""
        pid = ttgl.program_id(0)
        i_n = pid // (NV * HV)
        i_hv = (pid // NV) % HV
        i_v = pid % NV
        bos = ttgl.load(seq_info + i_n * 4)
        eos = ttgl.load(seq_info + i_n * 4 + 1)
        c0 = ttgl.load(seq_info + i_n * 4 + 2)
        c1 = ttgl.load(seq_info + i_n * 4 + 3)
        ts0 = ttgl.load(chunk_info + c0 * 4 + 1, mask=c0 < c1, other=0)
        return i_n, i_hv, i_v, i_hv // GROUP, bos, eos, c0, c1, ts0

    @gluon.jit
    def _initial_state(
        h0, has_h0, i_n, i_hv, HV: ttgl.constexpr, K: ttgl.constexpr, V: ttgl.constexpr, BK: ttgl.constexpr,
        BV: ttgl.constexpr, sidx, ACC: ttgl.constexpr,
    ):  # fmt: skip
        """The offset of the (sequence, head) state and its initial value (zeros without ``h0``)."""
        hoff = (i_n * HV + i_hv).to(ttgl.int64) * (K * V)
        S = ttgl.load(h0 + hoff + sidx, mask=(ttgl.full([BK, BV], 0, ttgl.int32, ACC) + has_h0) != 0, other=0.0)
        return hoff, S

    # the per-call flags stay runtime values: Triton specialises an int argument equal to 1 into
    # a constant, and a plan compiled at 1 would ignore a later call's 0 (``chunk_gdn._PER_CALL``)
    @gluon.jit(do_not_specialize=["has_h0"])
    def _gluon_state_kernel(
        k, fd, w, u, gl, h_out, vn_out, h0, ht, hb, seq_info, chunk_info, store_slot,
        skt: ttgl.constexpr, skh: ttgl.constexpr, HV: ttgl.constexpr, GROUP: ttgl.constexpr,
        K: ttgl.constexpr, V: ttgl.constexpr, BK: ttgl.constexpr, BV: ttgl.constexpr,
        has_h0, prog, STORE_B: ttgl.constexpr, OVL: ttgl.constexpr, SIG: ttgl.constexpr,
    ):  # fmt: skip
        ACC: ttgl.constexpr = ttgl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, 1], instr_shape=[16, BV, 16]
        )
        # 16 bytes a thread: [64, 128] 16-bit tiles for cp.async, [*, BV] tiles for stores
        LOAD: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [2, 16], [_WARPS, 1], [1, 0])
        STORE: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [32 // (BV // 8), BV // 8], [_WARPS, 1], [1, 0])
        dt: ttgl.constexpr = w.dtype.element_ty
        RING_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, BK], ttgl.bfloat16)
        S_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BK, BV], ttgl.bfloat16)
        V_L: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([64, BV], ttgl.bfloat16)
        # v' through shared memory where it measured faster (H200: with boundary states at both
        # head counts, without them only at the narrow block)
        V_SMEM: ttgl.constexpr = STORE_B or BV <= 16
        i_n, i_hv, i_v, i_h, bos, eos, c0, c1, ts0 = _program(seq_info, chunk_info, HV, GROUP, V // BV)
        if OVL:
            # the output kernel (launched programmatically dependent) may start once every program
            # of this loop is resident: it waits on ``prog`` for the chunks it reads
            gdc_launch_dependents()
            pslot = (c0 * HV + i_hv) * _PROG_SLOTS + i_v
        # index vectors in the accumulator's layout (state [BK, BV], chunk rows [64, BV]), the
        # load layout and the store layout
        oK = ttgl.arange(0, BK, layout=ttgl.SliceLayout(1, ACC))
        oV = i_v * BV + ttgl.arange(0, BV, layout=ttgl.SliceLayout(0, ACC))
        r_a = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, ACC))
        r_l = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, LOAD))
        oK_l = ttgl.arange(0, BK, layout=ttgl.SliceLayout(0, LOAD))
        oK_s = ttgl.arange(0, BK, layout=ttgl.SliceLayout(1, STORE))
        oV_s = i_v * BV + ttgl.arange(0, BV, layout=ttgl.SliceLayout(0, STORE))
        r_s = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, STORE))
        sidx = oK[:, None] * V + oV[None, :]
        sidx_s = oK_s[:, None] * V + oV_s[None, :]
        hoff, S = _initial_state(h0, has_h0, i_n, i_hv, HV, K, V, BK, BV, sidx, ACC)
        wbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, BK], RING_L)
        kbuf = ttgl.allocate_shared_memory(dt, [_RING, 64, BK], RING_L)
        sbuf = ttgl.allocate_shared_memory(dt, [BK, BV], S_L)  # the first product's operand
        vbuf = ttgl.allocate_shared_memory(dt, [64, BV], V_L)  # the second product's operand
        if V_SMEM:
            nbuf = ttgl.allocate_shared_memory(dt, [64, BV], V_L)  # v' on its way out
        for j in ttgl.static_range(_RING - 1):
            _ring_load(wbuf, kbuf, j, w, k, ts0 + j * 64, c0 + j < c1, bos, eos, i_hv, i_h, skt, skh, HV, K, r_l, oK_l)
        u_c, f_c, g_c = _chunk_rows(u, fd, gl, c0, ts0, c0 < c1, bos, eos, i_hv, HV, V, r_a, oV)
        prev_slot = -1  # the slot of the previous chunk's end: its state is S at this chunk's start
        zero = ttgl.zeros([64, BV], ttgl.float32, ACC)
        for c in range(c0, c1):
            i = c - c0
            ts = ts0 + i * 64
            stage = i % _RING
            u_n, f_n, g_n, slot = _prefetch(
                wbuf, kbuf, w, k, u, fd, gl, store_slot, c, i, ts, c1, bos, eos, i_hv, i_h, skt, skh, HV, K, V,
                r_l, oK_l, r_a, oV,
            )  # fmt: skip
            sbuf.store(S.to(dt))
            async_copy.wait_group(_RING - 1)  # this chunk's w / key tiles have landed
            fence_async_shared()
            acc = warpgroup_mma(wbuf.index(stage), sbuf, zero, use_acc=False, is_async=True)
            # while w S runs: the chunk-start state from its shared copy, the previous chunk's
            # boundary state from the registers
            ttgl.store(h_out + (c * HV + i_hv).to(ttgl.int64) * (K * V) + sidx_s, sbuf.load(STORE))
            _boundary_store(hb, prev_slot, S, i_hv, HV, K, V, sidx, STORE_B)
            decayed = S * ttgl.exp(g_c)
            acc = warpgroup_mma_wait(0, deps=[acc])
            vn = u_c.to(ttgl.float32) - acc
            if V_SMEM:
                nbuf.store(vn.to(dt))
            else:
                m_a = (ts + r_a >= bos) & (ts + r_a < eos)
                voff = (ts.to(ttgl.int64) * HV + i_hv) * V + r_a[:, None] * (HV * V) + oV[None, :]
                ttgl.store(vn_out + voff, vn.to(dt), mask=m_a[:, None] & (oV[None, :] < V))
            vbuf.store((vn * f_c[:, None]).to(dt))
            fence_async_shared()
            S = warpgroup_mma(kbuf.index(stage).permute([1, 0]), vbuf, decayed, is_async=True)
            if V_SMEM:
                m_s = (ts + r_s >= bos) & (ts + r_s < eos)
                voff_s = (ts.to(ttgl.int64) * HV + i_hv) * V + r_s[:, None] * (HV * V) + oV_s[None, :]
                ttgl.store(vn_out + voff_s, nbuf.load(STORE), mask=m_s[:, None] & (oV_s[None, :] < V))
            S = warpgroup_mma_wait(0, deps=[S])
            if OVL:
                if ((i + 1) % SIG == 0) | (c + 1 == c1):
                    # every SIG chunks and at the last: this program's chunk-start states and v'
                    # up to chunk c are written (all threads past the barrier; the release orders
                    # them before the count the output kernel acquires)
                    _cta_barrier()
                    ttgl.atomic_xchg(prog + pslot, c + 1, sem="release", scope="gpu")
            prev_slot = slot
            u_c, f_c, g_c = u_n, f_n, g_n
        _finish(hb, ht, hoff, prev_slot, S, i_hv, HV, K, V, sidx, STORE_B)

else:
    _gluon_state_kernel = None
