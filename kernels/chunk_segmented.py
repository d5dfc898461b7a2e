"""Stage 3 split across the GPU: the chunk-parallel ("segmented") state pass, opt-in.

The serial state loop runs one program per sequence x value head x V block and walks every chunk
of its sequence; at few heads (4/8 on an H200: 32-64 programs on 132 multiprocessors) most of the
GPU idles. Per chunk the state update is linear in the incoming state S (K x V):

    S' = A_c S + B_c,   A_c = exp(g_last) I - K_d^T W (K x K),   B_c = K_d^T U

(``v' = U - W S``, ``S' = exp(g_last) S + K_d^T v'``: the serial loop's own form). So a run of
chunks composes to ``S_end = P S_start + Z`` with ``P`` the product of its ``A_c`` and ``Z`` its
end state from a zero start. Each sequence is cut into segments of ``SEG`` chunks at absolute
chunk positions (a segment starts where the absolute chunk number is a multiple of ``SEG``, so a
call that starts mid-sequence cuts where the uninterrupted call cut), and:

1. ``_segment_kernel``, every segment at once: its ``Z`` (the loop from zero with the chunks' U)
   and its ``P`` (the same loop from the identity with U = 0), as one grid whose column blocks
   cover V columns of ``Z`` and K columns of ``P``; nothing but the two end states is stored;
2. ``_combine_kernel``, serial over a sequence's segments only: ``S_in(j+1) = P_j S_in(j) + Z_j``
   from the sequence's initial state (fp32, products in tf32x3 on a GPU);
3. the state kernel itself (the Triton loop, or the Gluon loop where it runs), every segment at
   once as a sequence of its own from ``S_in(j)``: the chunk-start states and v' for the output
   kernel, the boundary states at their slots, and each segment's end state (the last segment's
   is the final state). Where the Gluon loop runs the output overlaps it (``OVL``) with the
   segments as its sequences (``SegmentTables.chunk``).

Three times the loop's products over more programs. The bits differ from the serial loop's (the
state entering a segment comes from ``P S + Z`` instead of chunk-by-chunk updates), within its
tolerance; the default call never runs this. A call resumed from an emitted boundary state is
therefore not bit-equal to the uninterrupted segmented call either: its first segment starts at
the resume point, so the ``P`` and ``Z`` of the segment it resumes in cover fewer chunks, and the
state entering the next segment is rounded differently (equal within the tolerance; a resume at a
segment start reproduces the uninterrupted call's later segments only up to that rounding too,
since the emitted state is the loop's, not the combine's).

Opt-in: ``chunk_gated_delta_rule(..., state_segments=n)`` or ``KERNELS_CONFIG_STATE=SEG=n``
(chunks per segment; 0: the serial loop), ``state_segments="auto"``: ``auto_segments``'s rule.
"""

from __future__ import annotations

import functools
import math
import weakref

import numpy as np
import torch
import triton
import triton.language as tl

from kernels._common import CHUNK, INTERPRET, upload
from kernels.chunk_plan import LAUNCH_OPTIONS, _carve
from kernels.chunk_tiles import _colmask, _dimmask, _inside, _rowmask

#: the combine's products: fp32 state by fp32 transition (three tf32 products on a GPU: fp32's
#: accuracy; the interpreter multiplies in fp32 whatever the setting)
COMBINE_PRECISION = "tf32x3"
#: the combine kernel's V block, key block and warps (compiled for sm_90a at K = V = 128: no
#: spills; a whole 128 x 128 transition tile at 4 warps spilled 548 bytes)
COMBINE_BV, COMBINE_KB = 32, 32
COMBINE_OPTIONS = dict(num_warps=8, num_stages=2)


def combine_constexprs(HV: int, K: int, V: int) -> dict:
    """The combine kernel's compile-time arguments at these head counts and dims."""
    BK = max(16, triton.next_power_of_2(K))
    return dict(
        HV=HV, K=K, V=V, BK=BK, BV=min(COMBINE_BV, max(16, triton.next_power_of_2(V))), KB=min(COMBINE_KB, BK),
        PREC=COMBINE_PRECISION, WHILE_LOOP=INTERPRET,
    )  # fmt: skip


#: ``auto_segments``: segment only where the serial loop's programs fill less than this share of
#: the multiprocessors ...
AUTO_FILL = 0.5
#: ... and then aim at this many programs per multiprocessor in passes 1 and 3 ...
AUTO_PROGRAMS_PER_SM = 4
#: ... with segments of at least this many chunks (shorter ones spend their time on P and the
#: serial combine: on the H200 at 4/8 heads, segments of 8 and 16 chunks lost to the serial loop
#: at every length, 32 won at 8K and 32K tokens) ...
AUTO_MIN_SEG = 32
#: ... and only where that cuts the longest sequence into at least this many segments (at 4K
#: tokens two segments of 32 chunks took 0.130 ms against the serial loop's 0.113)
AUTO_MIN_SEGMENTS = 4


def auto_segments(num_seqs: int, HV: int, V: int, BV: int, max_chunks: int, multiprocessors: int) -> int:
    """Chunks per segment by the rule docs/kernels.md gives (0: the serial loop): segment only
    where the serial loop's ``num_seqs * HV * ceil(V / BV)`` programs fill less than ``AUTO_FILL``
    of the multiprocessors, into segments that bring the programs to about ``AUTO_PROGRAMS_PER_SM``
    a multiprocessor, of at least ``AUTO_MIN_SEG`` chunks, and only where that leaves at least
    ``AUTO_MIN_SEGMENTS`` segments in the longest sequence. Fitted to the H200 runs of session 10
    (docs/results-kernels.md, graphed, fp32 states at every boundary, K = V = 128): at 4/8 heads
    it picks 57 chunks at 32K tokens (0.757 ms against the serial 0.819), 32 at 8K (0.200 against
    0.214) and the serial loop at 4K (0.113; segments of 16: 0.112, of 32: 0.130); at 16/32 heads
    (128 programs) the serial loop, which was faster than every segment size measured (2.02 ms
    against 2.85 or more at 32K). Nothing calls it unless asked (``state_segments="auto"``)."""
    programs = num_seqs * HV * -(-V // BV)
    if programs <= 0 or programs >= AUTO_FILL * multiprocessors:
        return 0
    pieces = -(-AUTO_PROGRAMS_PER_SM * multiprocessors // programs)
    seg = max(AUTO_MIN_SEG, -(-max_chunks // pieces))
    return seg if -(-max_chunks // seg) >= AUTO_MIN_SEGMENTS else 0


def env_segments(config: dict) -> int:
    """``KERNELS_CONFIG_STATE``'s ``SEG`` (the state launch table entry ``config``), 0 if unset."""
    return int(config.get("SEG", 0))


def check_segments(value) -> None:
    """A ``state_segments`` the call can take: None, "auto" or an int >= 0 (one-line ValueError)."""
    if value is None or value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"state_segments must be None, 'auto' or an int >= 0 (chunks per segment), got {value!r}")


class SegmentTables:
    """One chunk metadata cut into segments of ``seg`` chunks (host and device int32 tables).

    ``info`` ``[NS, 4]``: the segment's sequence bounds (bos, eos) and chunk range [c0, c1) in the
    metadata's chunk table (the state kernel's ``seq_info`` layout: a segment runs as a sequence);
    ``seq_segs`` ``[N, 2]``: each sequence's segment range; ``last`` ``[N]``: its last segment.
    An empty sequence has one empty segment (its state passes through)."""

    __slots__ = ("num", "info", "chunk", "seq_segs", "last", "host_info", "host_chunk", "host_seq_segs", "seg")

    def __init__(self, meta, seg: int, device):
        cu = np.asarray(meta.cu_seqlens, dtype=np.int64)
        bos, eos = cu[:-1], cu[1:]
        N = len(bos)
        lens = eos - bos
        st = np.asarray(meta.start_positions, dtype=np.int64)
        rag = st % CHUNK
        nc = np.where(lens == 0, 0, (lens + rag + CHUNK - 1) // CHUNK)  # as prepare_chunk_metadata
        c_end = np.cumsum(nc)
        c0 = c_end - nc
        NT = int(c_end[-1]) if N else 0
        seq = np.repeat(np.arange(N, dtype=np.int64), nc)
        local = np.arange(NT, dtype=np.int64) - c0[seq]
        absolute = st[seq] // CHUNK + local  # the chunk's absolute number (its first position // 64)
        starts = np.flatnonzero((local == 0) | (absolute % seg == 0))
        ends = np.append(starts[1:], NT)  # a sequence's chunks are followed by the next one's
        empty = np.flatnonzero(nc == 0)
        s_seq = np.concatenate([seq[starts], empty])
        s_c0 = np.concatenate([starts, c0[empty]])
        s_c1 = np.concatenate([ends, c0[empty]])
        order = np.argsort(s_seq, kind="stable")  # sequence-major, chunk order inside a sequence
        s_seq, s_c0, s_c1 = s_seq[order], s_c0[order], s_c1[order]
        counts = np.bincount(s_seq, minlength=N)
        s_end = np.cumsum(counts)
        self.num = int(s_end[-1]) if N else 0
        self.seg = seg
        self.host_info = np.stack([bos[s_seq], eos[s_seq], s_c0, s_c1], axis=1).astype(np.int32)
        self.host_seq_segs = np.stack([s_end - counts, s_end], axis=1).astype(np.int32)
        # the metadata's chunk table with each chunk's segment in the sequence column: what the
        # overlapped output reads to find its loop program's progress counters
        ts = bos[seq] + local * CHUNK - rag[seq]
        chunk_seg = np.repeat(np.arange(self.num, dtype=np.int64), s_c1 - s_c0)
        self.host_chunk = np.stack(
            [chunk_seg, ts, np.maximum(ts, bos[seq]), np.minimum(ts + CHUNK, eos[seq])], axis=1
        ).astype(np.int32)
        pad = np.zeros(-2 * N % 4, dtype=np.int32)  # every table on a 16-byte boundary
        parts = (
            self.host_info.reshape(-1),
            self.host_chunk.reshape(-1),
            self.host_seq_segs.reshape(-1),
            pad,
            s_end - 1,
        )
        buf = upload(np.concatenate(parts).astype(np.int32), device, torch.int32)
        a, b, c = 4 * self.num, 4 * (self.num + NT), 4 * (self.num + NT) + 2 * N
        self.info = buf[:a].view(-1, 4)
        self.chunk = buf[a:b].view(-1, 4)
        self.seq_segs = buf[b:c].view(-1, 2)
        self.last = buf[c + len(pad) :].to(torch.int64)  # index_select's index


#: tables by (id of the metadata, seg): (weak reference to the metadata, tables). Built once per
#: metadata, so a CUDA graph captured after a first call uploads nothing.
_TABLES: dict = {}
_MAX_TABLES = 64


def segment_tables(meta, seg: int, device) -> SegmentTables:
    key = (id(meta), seg, str(device))
    hit = _TABLES.get(key)
    if hit is not None and hit[0]() is meta:
        return hit[1]
    tables = SegmentTables(meta, seg, device)
    if len(_TABLES) >= _MAX_TABLES:
        _TABLES.clear()
    _TABLES[key] = (weakref.ref(meta), tables)
    return tables


@triton.jit
def _segment_step(
    c, ts, S, k, fd, w, u, gl, bos, eos, i_hv, i_h, skt, skh, oK, col, r64, ucol,
    HV, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One chunk of the loop without stores: ``S <- exp(g_last) S + K^T diag(f) (U - W S)``, U's
    columns ``col`` where ``ucol`` (a [64, BV] mask; all off for the transition's columns)."""
    dt = w.dtype.element_ty
    m = _inside(ts, r64, bos, eos)
    row0 = ts.to(tl.int64) * HV + i_hv
    w_c = tl.load(w + row0 * K + r64[:, None] * (HV * K) + oK[None, :], mask=_rowmask(m, oK, K, K == BK, BK), other=0.0)
    u_c = tl.load(u + row0 * V + r64[:, None] * (HV * V) + col[None, :], mask=m[:, None] & ucol, other=0.0)
    kT = tl.load(
        k + ts.to(tl.int64) * skt + i_h * skh + r64[None, :] * skt + oK[:, None],
        mask=_colmask(m, oK, K, K == BK, BK),
        other=0.0,
    )
    f = tl.load(fd + row0 + r64 * HV, mask=m, other=0.0)
    g_last = tl.load(gl + c * HV + i_hv)
    vn = u_c.to(tl.float32) - tl.dot(w_c, S.to(dt), input_precision=PREC)
    return S * tl.exp(g_last) + tl.dot(kT, (vn * f[:, None]).to(dt), input_precision=PREC)


@triton.jit
def _segment_kernel(
    k, fd, w, u, gl, chunk_info, seg_info, Z, P,
    skt: tl.constexpr, skh: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC: tl.constexpr, WHILE_LOOP: tl.constexpr,
):  # fmt: skip
    """Pass 1: one program per segment x value head x column block, the first ``ceil(V / BV)``
    blocks the zero-start end state ``Z`` ([NS, HV, K, V]), the next ``ceil(K / BV)`` the
    transition ``P`` ([NS, HV, K, K]: the loop from the identity, U = 0)."""
    NVV: tl.constexpr = (V + BV - 1) // BV
    NVK: tl.constexpr = (K + BV - 1) // BV
    pid = tl.program_id(0)
    i_s = pid // ((NVV + NVK) * HV)
    i_hv = (pid // (NVV + NVK)) % HV
    i_v = pid % (NVV + NVK)
    i_h = i_hv // GROUP
    bos = tl.load(seg_info + i_s * 4)
    eos = tl.load(seg_info + i_s * 4 + 1)
    c0 = tl.load(seg_info + i_s * 4 + 2)
    c1 = tl.load(seg_info + i_s * 4 + 3)
    ts0 = tl.load(chunk_info + c0 * 4 + 1, mask=c0 < c1, other=0)
    oK = tl.arange(0, BK)
    r64 = tl.arange(0, 64)
    # full-shape masks (triton 3.9's interpreter rejects scalar ones): which columns are Z's
    is_z = (tl.zeros([BK, BV], tl.int32) + i_v) < NVV
    col = tl.where(i_v < NVV, i_v, i_v - NVV) * BV + tl.arange(0, BV)
    ncol = tl.where(i_v < NVV, V, K)
    mcol = col < ncol
    mK = _dimmask(oK, K, K == BK, BK)
    ucol = ((tl.zeros([64, BV], tl.int32) + i_v) < NVV) & mcol[None, :]
    S = ((oK[:, None] == col[None, :]) & mcol[None, :] & ~is_z).to(tl.float32)
    if WHILE_LOOP:
        c = c0
        while c < c1:
            S = _segment_step(
                c, ts0 + (c - c0) * 64, S, k, fd, w, u, gl, bos, eos, i_hv, i_h, skt, skh, oK, col, r64, ucol,
                HV, K, V, BK, PREC,
            )  # fmt: skip
            c += 1
    else:
        for c in range(c0, c1):
            S = _segment_step(
                c, ts0 + (c - c0) * 64, S, k, fd, w, u, gl, bos, eos, i_hv, i_h, skt, skh, oK, col, r64, ucol,
                HV, K, V, BK, PREC,
            )  # fmt: skip
    base = (i_s * HV + i_hv).to(tl.int64)
    mkc = mK[:, None] & mcol[None, :]
    tl.store(Z + base * (K * V) + oK[:, None] * V + col[None, :], S, mask=mkc & is_z)
    tl.store(P + base * (K * K) + oK[:, None] * K + col[None, :], S, mask=mkc & ~is_z)


@triton.jit(do_not_specialize=["has_h0"])
def _combine_kernel(
    Z, P, h0, sin, seq_segs, has_h0,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
    PREC: tl.constexpr, WHILE_LOOP: tl.constexpr,
):  # fmt: skip
    """Pass 2: one program per sequence x value head x V block, serial over the sequence's
    segments: ``S_in(j + 1) = P_j S_in(j) + Z_j`` (fp32), each entering state stored in ``sin``.
    The product runs over K in blocks of ``KB``, reading ``S_in(j)`` back from ``sin`` (after a
    barrier: other threads stored it), so neither a whole ``P_j`` nor the state stays in
    registers (the whole tile spilled 548 bytes at K = 128 compiled for sm_90a)."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0)
    i_n = pid // (NV * HV)
    i_hv = (pid // NV) % HV
    i_v = pid % NV
    s0 = tl.load(seq_segs + i_n * 2)
    s1 = tl.load(seq_segs + i_n * 2 + 1)
    oK = tl.arange(0, BK)
    oV = i_v * BV + tl.arange(0, BV)
    oB = tl.arange(0, KB)
    mK = _dimmask(oK, K, K == BK, BK)
    mV = _dimmask(oV, V, V % BV == 0, BV)
    mKV = mK[:, None] & mV[None, :]
    sidx = oK[:, None] * V + oV[None, :]
    S = tl.load(
        h0 + (i_n * HV + i_hv).to(tl.int64) * (K * V) + sidx,
        mask=mKV & ((tl.zeros([BK, BV], tl.int32) + has_h0) != 0),
        other=0.0,
    )
    tl.store(sin + (s0 * HV + i_hv).to(tl.int64) * (K * V) + sidx, S, mask=mKV)
    if WHILE_LOOP:
        j = s0
        while j + 1 < s1:
            _combine_step(Z, P, sin, j, i_hv, oK, oV, oB, mK, mV, mKV, sidx, HV, K, V, BK, KB, PREC)
            j += 1
    else:
        for j in range(s0, s1 - 1):
            _combine_step(Z, P, sin, j, i_hv, oK, oV, oB, mK, mV, mKV, sidx, HV, K, V, BK, KB, PREC)


@triton.jit
def _combine_step(
    Z, P, sin, j, i_hv, oK, oV, oB, mK, mV, mKV, sidx,
    HV, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``sin[j + 1] = P_j sin[j] + Z_j`` for one V block."""
    tl.debug_barrier()  # sin[j] was stored by the program's other threads
    base = (j * HV + i_hv).to(tl.int64)
    acc = tl.load(Z + base * (K * V) + sidx, mask=mKV, other=0.0)
    for kb in tl.static_range(0, BK, KB):
        rows = kb + oB
        mB = rows < K
        Pb = tl.load(P + base * (K * K) + oK[:, None] * K + rows[None, :], mask=mK[:, None] & mB[None, :], other=0.0)
        Sb = tl.load(sin + base * (K * V) + rows[:, None] * V + oV[None, :], mask=mB[:, None] & mV[None, :], other=0.0)
        acc += tl.dot(Pb, Sb, input_precision=PREC)
    tl.store(sin + (base + HV) * (K * V) + sidx, acc, mask=mKV)


def _launch(fn, grid, vals: dict, opts: dict, record: list, role: str):
    """``fn`` on ``grid`` with its arguments by name from ``vals``; ``(role, fn, grid, args, compiled
    kernel)`` appended to ``record`` (what ``chunk_segmented_launch.bind`` makes a binding of)."""
    args = [vals[n] for n in fn.arg_names]
    record.append((role, fn, tuple(grid) + (1,) * (3 - len(grid)), args, fn[grid](*args, **opts)))


def _opts(entry: dict) -> dict:
    """The launch options of a launch table entry."""
    return {key: val for key, val in entry.items() if key in LAUNCH_OPTIONS}


def segmented_table(lp: dict) -> dict:
    """The launch table ``lp`` for the segmented pass: no fused loop (``FUSE``: pass 3 is the
    plain loop); the overlapped output (``OVL``) as ``lp`` has it, with the segments as its
    sequences (``SegmentTables.chunk``)."""
    return {**lp, "state": {**lp["state"], "FUSE": 0}}


def pass_layout(NS: int, HV: int, K: int, V: int) -> tuple[tuple, int]:
    """Byte offsets of the passes' fp32 buffers Z, P and the entering states ``sin`` in one
    buffer (each 256-byte aligned), and its length (the segments' end states are a tensor of
    their own: the final states are gathered from it)."""
    return _pass_layout(NS, HV, K, V)


@functools.lru_cache(maxsize=64)
def _pass_layout(NS, HV, K, V):
    offs, n = _carve([4 * NS * HV * K * V, 4 * NS * HV * K * K, 4 * NS * HV * K * V])
    return tuple(offs), n


def launches(lp, fns, grids, shared: dict, tables: SegmentTables, *, N, HV, K, V, dev, h0, has_h0, ht) -> list:
    """Solve, w / u, the three passes, the output (``lp``: ``segmented_table``'s; ``fns`` and
    ``grids``: its kernels and grids with pass 3's grid over the segments), then each sequence's
    final state gathered from its last segment into ``ht``. Returns what ran, launch by launch
    (``_launch``'s records)."""
    record: list = []
    solve_fn, wu_fn, state_fn, out_fn = fns
    _launch(solve_fn, grids[0], {**shared, **lp["solve"]}, _opts(lp["solve"]), record, "solve")
    _launch(wu_fn, grids[1], {**shared, **lp["wu"]}, _opts(lp["wu"]), record, "wu")
    NS = tables.num
    st = lp["state"]
    BK, BV = st["BK"], st["BV"]
    offs, nbytes = pass_layout(NS, HV, K, V)
    buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    Z, P, sin = (
        buf[off : off + 4 * math.prod(shape)].view(torch.float32).view(shape)
        for off, shape in zip(offs, ((NS, HV, K, V), (NS, HV, K, K), (NS, HV, K, V)))
    )
    seg_ht = torch.empty(NS, HV, K, V, dtype=torch.float32, device=dev)
    nvv, nvk = -(-V // BV), -(-K // BV)
    state_opts = _opts(st)
    _launch(
        _segment_kernel,
        (NS * HV * (nvv + nvk),),
        {**shared, "seg_info": tables.info, "Z": Z, "P": P, "K": K, "V": V, "BK": BK, "BV": BV, "PREC": st["PREC"]},
        state_opts,
        record,
        "segment",
    )
    cc = combine_constexprs(HV, K, V)
    _launch(
        _combine_kernel,
        (N * HV * -(-V // cc["BV"]),),
        {**cc, "Z": Z, "P": P, "h0": h0, "sin": sin, "seq_segs": tables.seq_segs, "has_h0": has_h0},
        COMBINE_OPTIONS,
        record,
        "combine",
    )
    _launch(
        state_fn,
        grids[2],
        {**shared, **st, "seq_info": tables.info, "h0": sin, "ht": seg_ht, "has_h0": 1},
        state_opts,
        record,
        "state",
    )
    # the output reads its chunks' segments (the overlapped output's progress counters are kept
    # per loop program, at its segment's first chunk; without ``OVL`` it reads only the tokens)
    _launch(
        out_fn,
        grids[3],
        {**shared, **lp["out"], "chunk_info": tables.chunk, "seq_info": tables.info},
        _opts(lp["out"]),
        record,
        "out",
    )
    if N:
        torch.index_select(seg_ht, 0, tables.last, out=ht)
    return record


def scratch_bytes(num_segments: int, HV: int, K: int, V: int) -> int:
    """fp32 bytes the passes allocate besides the call's scratch (Z, P, entering and end states)."""
    return 4 * num_segments * HV * K * (3 * V + K)


__all__ = ["auto_segments", "segment_tables", "launches", "segmented_table", "scratch_bytes"]
