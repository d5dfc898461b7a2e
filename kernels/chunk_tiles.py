"""Triton device helpers the four stages of the chunked gated delta rule share: tile masks that
fold to compile-time constants at a power-of-two head dim, the chunk table's reads, and the
progress-counter slot count of the overlapped output (``kernels.state_gluon.PROG_SLOTS``)."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.state_gluon import PROG_SLOTS

#: ``PROG_SLOTS`` as the kernels read it
_PROG_SLOTS = tl.constexpr(PROG_SLOTS)


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
