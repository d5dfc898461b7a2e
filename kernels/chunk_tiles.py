"""Triton device helpers the four stages of the chunked gated delta rule share: tile masks that
fold to compile-time constants at a power-of-two head dim, the chunk table's reads, the
progress-counter slot count of the overlapped output (``kernels.state_gluon.PROG_SLOTS``), the
overlapped output's two waits, the gate's softplus, a CTA barrier as inline assembly and the
output's drop of scratch lines from L2 (all shared with the SSD kernel, ``kernels.ssd``)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels.state_gluon import PROG_SLOTS

#: ``PROG_SLOTS`` as the kernels read it
_PROG_SLOTS = tl.constexpr(PROG_SLOTS)


#: softplus's threshold, torch's and mamba_ssm's: ``x`` itself above it
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)


@triton.jit
def _softplus(x):
    """``log(1 + e^x)`` in fp32 to a few ulps at every ``x`` (``x`` itself above 20, as torch's).
    ``log(1 + u)`` alone loses the bits of ``u`` that ``1 + u`` rounds away (17 % high at x = -15,
    0.1 % at -10); ``log(w) * u / (w - 1)`` with ``w = 1 + u`` puts them back (Goldberg's log1p),
    and ``u`` itself where ``w`` rounds to 1."""
    u = tl.exp(tl.minimum(x, SOFTPLUS_THRESHOLD))
    w = 1.0 + u
    lp = tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))
    return tl.where(x > SOFTPLUS_THRESHOLD, x, lp)


@triton.jit
def _after_cta_barrier(v):
    """``v`` as a ``[1]`` tensor once every thread of the program has reached this point
    (``bar.sync 0`` as inline assembly: ``tl.debug_barrier`` in the state loop stops Triton from
    pipelining its loads, sm_90a, triton 3.6: no cp.async left, 54 -> 16 KB of shared memory)."""
    return tl.inline_asm_elementwise(
        "bar.sync 0;\n mov.u32 $0, $1;", "=r,r", [tl.full([1], 0, tl.int32) + v], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _discard_lines(lines, go, ok):
    """``discard.global.L2`` of the 128-byte lines at the byte pointers ``lines`` (128-byte
    aligned) where ``ok``: their data dropped from L2 unwritten (scratch whose last reader is
    done). ``go``: a value from ``_after_cta_barrier``, which orders the drops after every
    thread's reads of the lines."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p discard.global.L2 [$1], 128; }\n mov.u32 $0, $3;",
        "=r,l,r,r",
        [lines, ok.to(tl.int32), go],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _await_chunk(pbase, i_c, NS: tl.constexpr):
    """An overlapped output program's wait: until each of the ``NS`` progress counters from
    ``pbase`` (one per state-loop program of its sequence and head) has counted past chunk ``i_c``
    (acquire, gpu scope: the loop released them after writing the chunk's start state)."""
    for j in tl.static_range(NS):
        while tl.atomic_add(pbase + j, 0, sem="acquire", scope="gpu") <= i_c:
            pass


@triton.jit
def _last_waits_for_the_loop():
    """The overlapped output grid's last program waits for the state loop it was launched
    dependent on to complete (its final and boundary states written), so that the output kernel's
    completion, which the next work on the stream waits for, implies the loop's."""
    if tl.program_id(0) == tl.num_programs(0) - 1:
        gdc_wait()


@triton.jit
def _rowmask(m, offs, D: tl.constexpr, FULL: tl.constexpr, W: tl.constexpr):
    """[rows, W] mask of a tile with columns ``offs`` (W of them): rows ``m``, columns below the
    head dim ``D``. FULL (every tile of the launch lies inside D) makes the column part a
    compile-time constant, so the loads stay 16-byte vectors (and can be pipelined). Full-shape
    boolean: triton 3.9's interpreter rejects scalar / broadcast masks."""
    if FULL:
        return m[:, None] & tl.full([1, W], 1, tl.int1)
    else:
        return m[:, None] & (offs < D)[None, :]


@triton.jit
def _dimmask(offs, D: tl.constexpr, FULL: tl.constexpr, W: tl.constexpr):
    """1-d ``offs < D``, a compile-time constant when FULL."""
    if FULL:
        return tl.full([W], 1, tl.int1)
    else:
        return offs < D


@triton.jit
def _colmask(m, offs, D: tl.constexpr, FULL: tl.constexpr, W: tl.constexpr):
    """The transposed layout of ``_rowmask``: [W, rows]."""
    if FULL:
        return tl.full([W, 1], 1, tl.int1) & m[None, :]
    else:
        return (offs < D)[:, None] & m[None, :]


@triton.jit
def _inside(tstart, r, lo, hi):
    """Which rows ``tstart + r`` are real tokens of the range [lo, hi)."""
    return (tstart + r >= lo) & (tstart + r < hi)


@triton.jit
def _chunk(chunk_info, i_c):
    """Chunk ``i_c``: its first (virtual) token and the real tokens [lo, hi) it holds."""
    tstart = tl.load(chunk_info + i_c * 4 + 1)
    lo = tl.load(chunk_info + i_c * 4 + 2)
    hi = tl.load(chunk_info + i_c * 4 + 3)
    return tstart, lo, hi
