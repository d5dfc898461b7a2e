"""Chunked SSD (Mamba2) forward, emitting exactly resumable fp32 states at chunk boundaries.

Math (per head h, head dim P, state dim N; B and C shared by the ``H // G`` heads of a group):

    dt_t = clamp(softplus(dt_raw_t + dt_bias_h), dt_min, dt_max)      (bias, softplus optional)
    h_t  = exp(dt_t A_h) h_{t-1} + dt_t x_t B_t^T                     (h: [P, N], A_h < 0)
    y_t  = h_t C_t + D_h x_t

In 64-token chunks aligned to absolute multiples of 64 (the grid of ``chunk_gated_delta_rule``:
``kernels._common.prepare_chunk_metadata``), with a = dt A and gamma its chunk-local cumsum:

    chunk state  s_c = X^T diag(exp(gamma_last - gamma) dt) B            (from a zero state)
    state pass   S_c = exp(gamma_last) S_{c-1} + s_c                      (serial over chunks)
    output       Y   = diag(exp(gamma)) C S_{c-1}^T + (C B^T o Lmask) diag(dt) X + D X,
                 Lmask_ij = exp(gamma_i - gamma_j) for i >= j, else 0

Two kernels (three with ``PREP``, the 16-bit default: ``_ssd_prep_kernel`` first computes every
chunk's dt and gamma in parallel, which kernel 1 then reads):
  1. ``_ssd_state_kernel`` (sequence x head x P block, serial over the sequence's chunks): per
     chunk dt and gamma (stored for kernel 2), the chunk-start state S_{c-1} (input dtype, read by
     kernel 2), s_c as one product and S_c; the state at every emitted boundary (``state_dtype``,
     fp32 by default) and the final state (fp32). Only the elementwise S update is serial: the
     product s_c reads inputs alone, so the loop's loads and products pipeline across chunks, and
     the chunk states never go through memory.
  2. ``_ssd_output_kernel`` (chunk x head x P block, parallel): Y. With ``OVL`` (16-bit inputs on
     Hopper on, the default there) it runs beside kernel 1: launched programmatically dependent on
     it, a 1-d chunk-major grid whose programs wait on per-(sequence, head) progress counters
     (zeroed by the prep kernel, raised by the loop after a CTA barrier every ``SIG`` chunks).

A ragged first chunk (a sequence starting at p with p % 64 != 0) has virtual rows in front of
the first token; they load dt = 0, so they add nothing and decay nothing. Resuming a call at an
emitted boundary b (``initial_state`` = the boundary state, ``start_positions`` = b) runs every
later chunk on the same rows with the same state, so it gives the uninterrupted run's bits.

State layout: ``[num_seqs or num_boundaries, H, P, N]`` fp32 (mamba_ssm's ``ssm_state`` layout,
``[batch, nheads, headdim, dstate]``). The conv windows at the same boundaries come from
``kernels.conv.causal_conv1d`` called with the same ``chunk_metadata``.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import ssd_fused_gluon, ssd_gluon
from kernels.state_gluon import GLUON_WARPS
from kernels._common import INTERPRET
from kernels.chunk_tiles import _after_cta_barrier, _await_chunk, _discard_lines, _last_waits_for_the_loop, _softplus
from kernels.ssd_args import ssd_call


__all__ = ["chunk_ssd", "SSD_CONFIGS"]

#: launch configurations (fixed: no autotuning), per kernel and input kind ("half": fp16 / bf16,
#: "fp32"). ``BP``: the P block of a program (clamped to the padded P; at most 32 where the padded
#: N is 256). The half state loop: BP 32, 8 warps, 3 stages, the fastest of ``ssd_bench --sweep``'s
#: eight at every length on the H200 (session 10, Nemotron-H 8B's layer H = 128, P = 64, N = 128,
#: G = 8, bf16, graphed: 0.349 / 0.691 / 2.902 ms at 4K / 8K / 32K tokens against 0.385 / 0.762 /
#: 3.177 for the earlier BP 64, 8 warps, 2 stages; docs/results-kernels.md): twice the programs
#: of BP 64 (mma.sync products, not wgmma, and still the x tile by cp.async), 115-128 registers
#: and no spills compiled for sm_90a on triton 3.6 and 3.9. The rest chosen by compiling for
#: sm_90a at that shape (not measured): none spills; fp32's output spills at BP 64 with tf32x3's
#: triple products. ``PREP`` (half inputs): each chunk's dt and gamma come from
#: ``_ssd_prep_kernel`` (chunk x head, parallel) ahead of the loop instead of being computed inside
#: it by each P block: the same bits, and 4.5-7 % off the call with the fp32 state at every 64
#: tokens on the H200 (session 16, ``ssd_bench --variant prep:...``, graphed: 2.804 -> 2.660 ms
#: marconi-7b and 2.891 -> 2.693 Nemotron-H 8B at 32K; 0.666 -> 0.635, 0.691 -> 0.646 at 8K); fp32
#: keeps the loop's own (not measured). ``FUSE`` (the output inside the loop) is off: 1.3-1.4x
#: slower. "half-ovl": 16-bit inputs where the output runs beside the loop (``OVL``, compute
#: capability 9.0 on): a P block of 64 (one loop program an SM at 128 heads, the rest of each SM
#: left to the output), 3 stages, a release every 4 chunks (``SIG``); on the H100 (session 17,
#: graphed, Nemotron-H 8B, fp32 state every 64 tokens) 3.191 -> 2.493 ms at 32K tokens, 0.727 ->
#: 0.622 at 8K, 0.368 -> 0.317 at 4K against "half"; 2 stages 2.674 / 0.675 / 0.344, a release every
#: 8 chunks slower at every length, the boundary states stored with the streaming hint level
#: (within 1 %; taken out). ``TMA_B`` (the boundary states stored by bulk tensor copies, Hopper):
#: 0 never, 1 always, 2 ("half-ovl"'s default) where at most one chunk in ``TMA_SPARSE_CHUNKS``
#: emits a state: on the H100 (session 19, ``ssd_bench --variant tma:...``, graphed, one run) the
#: call took 0.94x / 0.95x / 0.97x the plain stores' time at 4K / 8K / 32K tokens with a state
#: every 256 tokens (marconi-7b; Nemotron-H 8B 0.95x / 0.96x / 0.98x) and 1.03-1.05x with one
#: every 64 (a copy issued and waited for at every chunk). ``WS`` ("half-ovl"'s default, so Hopper's; ``WS=0``: the
#: two kernels): the loop and its output in one warp-specialised Gluon program (``kernels.ssd_fused_gluon``), no
#: chunk-start copies through memory, where the call fits it (16-bit, P = 64, N of 64 or 128; else the two kernels):
#: on the H100 (session 29, graphed, marconi-7b, a state every 64 tokens) 0.220 / 0.434 / 1.751 ms at 4K / 8K / 32K
#: tokens against 0.309 / 0.610 / 2.431 (0.66-0.75x the faster of mamba_ssm and FLA); the same states bit for bit,
#: a few outputs a rounding apart (``make test-gpu`` with it as the default: session 30).
#: ``KERNELS_CONFIG_SSD_STATE`` / ``KERNELS_CONFIG_SSD_OUT``
#: (e.g. "BP=32,num_warps=4,num_stages=3", and ``maxnreg``) override them.
TMA_NEVER, TMA_ALWAYS, TMA_SPARSE = 0, 1, 2  # ``TMA_B``'s values
#: ``TMA_SPARSE``: bulk copies where the call emits at most one boundary state per this many chunks
TMA_SPARSE_CHUNKS = 4
SSD_CONFIGS = {
    "state": {
        "half": dict(BP=32, num_warps=8, num_stages=3, FUSE=0, PREP=1, OVL=0, SIG=1, TMA_B=0, GLUON=0, WS=0),
        "half-ovl": dict(
            BP=64, num_warps=8, num_stages=3, FUSE=0, PREP=1, OVL=1, SIG=4, TMA_B=TMA_SPARSE, GLUON=0, WS=1
        ),
        "fp32": dict(BP=64, num_warps=8, num_stages=2, FUSE=0, PREP=0, OVL=0, SIG=1, TMA_B=0, GLUON=0, WS=0),
    },
    "out": {
        "half": dict(BP=64, num_warps=4, num_stages=2, DISCARD=0),
        "fp32": dict(BP=32, num_warps=8, num_stages=1, DISCARD=0),
    },
}


def _config(kernel: str, f32: bool, overlaps: bool = False) -> dict:
    """The launch configuration of ``kernel`` ("state" or "out"; the state loop's "half-ovl" for
    16-bit inputs where the output can run beside it), with the environment's override;
    ``maxnreg`` (a register cap, 0: none) only where set."""
    kind = "fp32" if f32 else ("half-ovl" if overlaps and "half-ovl" in SSD_CONFIGS[kernel] else "half")
    cfg = dict(SSD_CONFIGS[kernel][kind], maxnreg=0)
    env = os.environ.get(f"KERNELS_CONFIG_SSD_{kernel.upper()}")
    if env:
        for item in env.split(","):
            key, _, val = item.partition("=")
            if key.strip() not in cfg:
                raise ValueError(f"KERNELS_CONFIG_SSD_{kernel.upper()}: unknown key {key.strip()!r}")
            cfg[key.strip()] = int(val)
    if not cfg["maxnreg"]:
        del cfg["maxnreg"]
    return cfg


#: the matrix products' precision for fp32 inputs on a GPU unless the call says otherwise
FP32_PRECISION = "tf32x3"
_PRECISIONS = (None, "ieee", "tf32", "tf32x3")


@triton.jit
def _chunk_rows(chunk_info, i_c):
    """Token rows of chunk ``i_c`` (64, from its first virtual token), which are real, and the
    rows as safe int64 indices (0 where not real)."""
    ts = tl.load(chunk_info + i_c * 4 + 1)
    lo = tl.load(chunk_info + i_c * 4 + 2)
    hi = tl.load(chunk_info + i_c * 4 + 3)
    t = ts + tl.arange(0, 64)
    m = (t >= lo) & (t < hi)
    return m, tl.where(m, t, 0).to(tl.int64)


@triton.jit
def _chunk_dt(dt, dt_bias, A, tc, m, i_h, sdt, sdh, dt_min, dt_max, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
              CLAMP: tl.constexpr):  # fmt: skip
    """A chunk's step sizes (bias, softplus, clamp; 0 on rows that are not real) and the
    chunk-local cumsum of the log decay ``gamma``, both ``[64]`` fp32."""
    d = tl.load(dt + tc * sdt + i_h * sdh, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        d += tl.load(dt_bias + i_h).to(tl.float32)
    if SOFTPLUS:
        d = _softplus(d)
    if CLAMP:
        d = tl.minimum(tl.maximum(d, dt_min), dt_max)
    d = tl.where(m, d, 0.0)
    return d, tl.cumsum(d * tl.load(A + i_h).to(tl.float32), 0)


@triton.jit(do_not_specialize=["dt_min", "dt_max"])
def _ssd_prep_kernel(
    dt, dt_bias, A, gam_out, dt_out, chunk_info, seq_info, prog, sdt, sdh, dt_min, dt_max,
    H: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, OVL: tl.constexpr,
    NPS: tl.constexpr,
):  # fmt: skip
    """``PREP``: every chunk's dt and gamma (chunk x head, parallel), which the state loop and the
    output kernel then read, so that the serial loop holds no softplus or cumsum. With ``OVL`` the
    program of a sequence's first chunk also zeroes that (sequence, head)'s ``NPS`` progress
    counters, which the state loop then raises."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    m, tc = _chunk_rows(chunk_info, i_c)
    d, gam = _chunk_dt(dt, dt_bias, A, tc, m, i_h, sdt, sdh, dt_min, dt_max, HAS_BIAS, SOFTPLUS, CLAMP)
    r = tl.arange(0, 64)
    row = (i_c * H + i_h).to(tl.int64) * 64
    tl.store(gam_out + row + r, gam)
    tl.store(dt_out + row + r, d)
    if OVL:
        n = tl.load(chunk_info + i_c * 4)
        first = tl.load(seq_info + n * 4 + 2) == i_c
        tl.store(prog + (n * H + i_h) * NPS + r, r * 0, mask=(r < NPS) & first)


@triton.jit
def _out_tile(Ct, Bt, Sp, X, g, d, Dv, i_h, oP, mP, P: tl.constexpr, HAS_D: tl.constexpr, D_PER_P: tl.constexpr,
              DOT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """A chunk's output rows ``[64, BP]`` from C, B (``[64, BN]``), the chunk-start state ``Sp``
    (``[BP, BN]``; all three in ``DOT``), the x tile, gamma and dt (``[64]``)."""
    r = tl.arange(0, 64)
    # the incoming state's part, decayed to each row
    acc = tl.dot(Ct, tl.trans(Sp), input_precision=PREC) * tl.exp(g)[:, None]
    CB = tl.dot(Ct, tl.trans(Bt), input_precision=PREC)  # [64, 64]
    causal = r[:, None] >= r[None, :]
    Lm = tl.where(causal, tl.exp(tl.where(causal, g[:, None] - g[None, :], 0.0)), 0.0) * d[None, :]
    acc += tl.dot((CB * Lm).to(DOT), X.to(DOT), input_precision=PREC)
    if HAS_D:
        if D_PER_P:
            dv = tl.load(Dv + i_h * P + oP, mask=mP, other=0.0).to(tl.float32)
            acc += X.to(tl.float32) * dv[None, :]
        else:
            acc += X.to(tl.float32) * tl.load(Dv + i_h).to(tl.float32)
    return acc


@triton.jit
def _ssd_state_step(
    c, ts, bos, eos, S, x, dt, dt_bias, A, Bm, Cm, Dv, y, gam_out, dt_out, hs, hb, hb_desc, store_slot, i_h, i_p, oP, oN,
    sidx, mPN, sxt, sxh, sdt, sdh, sbt, sbg, sct, scg, dt_min, dt_max,
    H: tl.constexpr, GROUP: tl.constexpr, P: tl.constexpr, N: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, STORE_B: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
    FUSE: tl.constexpr, HAS_D: tl.constexpr, D_PER_P: tl.constexpr, PREP: tl.constexpr, OVL: tl.constexpr,
    prog_slot, signal, TMA_B: tl.constexpr,
):  # fmt: skip
    # the chunk's rows from its first (virtual) token ``ts``: affine in the chunk index, so that the
    # loop's loads can be issued ahead (a row table read per chunk would serialise them)
    r = tl.arange(0, 64)
    t = ts + r
    m = (t >= bos) & (t < eos)
    tc = tl.where(m, t, 0).to(tl.int64)
    row = (c * H + i_h).to(tl.int64)
    if PREP:
        # the step sizes and gamma as ``_ssd_prep_kernel`` stored them
        d = tl.load(dt_out + row * 64 + r)
        gam = tl.load(gam_out + row * 64 + r)
    else:
        # the step sizes and the chunk-local cumsum of the log decay (every P block computes them;
        # the first stores them for the output kernel)
        d, gam = _chunk_dt(dt, dt_bias, A, tc, m, i_h, sdt, sdh, dt_min, dt_max, HAS_BIAS, SOFTPLUS, CLAMP)
    if not FUSE:
        if not PREP:
            first = (r * 0 + i_p) == 0  # a full-shape mask (triton 3.9's interpreter)
            tl.store(gam_out + row * 64 + r, gam, mask=first)
            tl.store(dt_out + row * 64 + r, d, mask=first)
        # the chunk-start state, read by the output kernel
        tl.store(hs + row * (P * N) + sidx, S.to(hs.dtype.element_ty), mask=mPN)
        if OVL:
            if signal:
                # the chunk-start states up to this chunk's are written (every thread past the
                # barrier; the release orders their stores before the count the output kernel
                # acquires)
                tl.atomic_xchg(prog_slot + tl.arange(0, 1), _after_cta_barrier(c + 1), sem="release", scope="gpu")
    last = tl.sum(tl.where(r == 63, gam, 0.0), 0)
    wgt = tl.exp(last - gam) * d  # decay to the chunk's end x dt
    X = tl.load(x + tc[:, None] * sxt + i_h * sxh + oP[None, :], mask=m[:, None] & (oP < P)[None, :], other=0.0)
    Bt = tl.load(
        Bm + tc[:, None] * sbt + (i_h // GROUP) * sbg + oN[None, :], mask=m[:, None] & (oN < N)[None, :], other=0.0
    )
    Bw = (Bt.to(tl.float32) * wgt[:, None]).to(DOT)
    if FUSE:
        # the chunk's output from the chunk-start state in registers (the state rounded to the
        # input dtype as the output kernel reads it from memory: the same operands)
        mP = oP < P
        Ct = tl.load(
            Cm + tc[:, None] * sct + (i_h // GROUP) * scg + oN[None, :], mask=m[:, None] & (oN < N)[None, :], other=0.0
        ).to(DOT)
        acc = _out_tile(
            Ct, Bt.to(DOT), S.to(x.dtype.element_ty).to(DOT), X, gam, d, Dv, i_h, oP, mP, P, HAS_D, D_PER_P, DOT, PREC
        )
        tl.store(
            y + tc[:, None] * (H * P) + i_h * P + oP[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] & mP[None, :]
        )
    # the chunk's own state (from zero) joins the decayed incoming one
    S = S * tl.exp(last) + tl.dot(tl.trans(X.to(DOT)), Bw, input_precision=PREC)
    if STORE_B:
        slot = tl.load(store_slot + c)
        if TMA_B:
            # ``TMA_B``: the boundary state goes from the product's register layout to shared memory
            # and out by one bulk tensor copy (``[P, N]`` rows of ``hb`` seen as ``[NB * H * P, N]``),
            # only at chunks that end on an emitted boundary; the plain store below converts the
            # layout through shared memory first and is issued at every chunk, masked
            if slot >= 0:
                hb_desc.store([(slot * H + i_h) * P, 0], S.to(hb.dtype.element_ty))
        else:
            ok = ((sidx * 0 + slot) >= 0) & mPN  # full-shape mask (triton 3.9's interpreter)
            tl.store(
                hb + (tl.maximum(slot, 0) * H + i_h).to(tl.int64) * (P * N) + sidx, S.to(hb.dtype.element_ty), mask=ok
            )
    return S


@triton.jit(do_not_specialize=["has_h0", "dt_min", "dt_max"])
def _ssd_state_kernel(
    x, dt, dt_bias, A, Bm, Cm, Dv, y, gam_out, dt_out, hs, h0, ht, hb, hb_desc, seq_info, chunk_info, store_slot,
    sxt, sxh, sdt, sdh, sbt, sbg, sct, scg, dt_min, dt_max, has_h0,
    H: tl.constexpr, GROUP: tl.constexpr, P: tl.constexpr, N: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, STORE_B: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, WHILE_LOOP: tl.constexpr, FUSE: tl.constexpr, HAS_D: tl.constexpr,
    D_PER_P: tl.constexpr, PREP: tl.constexpr, prog, OVL: tl.constexpr, SIG: tl.constexpr, NPS: tl.constexpr,
    TMA_B: tl.constexpr,
):  # fmt: skip
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    i_p = tl.program_id(2)
    if OVL:
        # the output kernel (launched programmatically dependent) may start once every program of
        # this loop is resident; it waits on ``prog`` for the chunks it reads
        gdc_launch_dependents()
    prog_slot = prog + (i_n * H + i_h) * NPS + i_p
    bos = tl.load(seq_info + i_n * 4)
    eos = tl.load(seq_info + i_n * 4 + 1)
    c0 = tl.load(seq_info + i_n * 4 + 2)
    c1 = tl.load(seq_info + i_n * 4 + 3)
    ts0 = tl.load(chunk_info + c0 * 4 + 1, mask=c0 < c1, other=0)  # first (virtual) token
    oP = i_p * BP + tl.arange(0, BP)
    oN = tl.arange(0, BN)
    sidx = oP[:, None] * N + oN[None, :]
    mPN = (oP < P)[:, None] & (oN < N)[None, :]
    sbase = (i_n * H + i_h).to(tl.int64) * (P * N)
    S = tl.load(h0 + sbase + sidx, mask=mPN & ((sidx * 0 + has_h0) != 0), other=0.0).to(tl.float32)
    if WHILE_LOOP:
        # the interpreter keeps scalars as 1-element arrays, which range() cannot take
        c = c0
        while c < c1:
            S = _ssd_state_step(
                c, ts0 + (c - c0) * 64, bos, eos, S, x, dt, dt_bias, A, Bm, Cm, Dv, y, gam_out, dt_out, hs, hb,
                hb_desc, store_slot, i_h, i_p, oP, oN, sidx, mPN, sxt, sxh, sdt, sdh, sbt, sbg, sct, scg, dt_min, dt_max, H,
                GROUP, P, N, HAS_BIAS, SOFTPLUS, CLAMP, STORE_B, DOT, PREC, FUSE, HAS_D, D_PER_P, PREP, OVL, prog_slot,
                ((c - c0 + 1) % SIG == 0) | (c + 1 == c1), TMA_B,
            )  # fmt: skip
            c += 1
    else:
        for c in range(c0, c1):
            S = _ssd_state_step(
                c, ts0 + (c - c0) * 64, bos, eos, S, x, dt, dt_bias, A, Bm, Cm, Dv, y, gam_out, dt_out, hs, hb,
                hb_desc, store_slot, i_h, i_p, oP, oN, sidx, mPN, sxt, sxh, sdt, sdh, sbt, sbg, sct, scg, dt_min, dt_max, H,
                GROUP, P, N, HAS_BIAS, SOFTPLUS, CLAMP, STORE_B, DOT, PREC, FUSE, HAS_D, D_PER_P, PREP, OVL, prog_slot,
                ((c - c0 + 1) % SIG == 0) | (c + 1 == c1), TMA_B,
            )  # fmt: skip
    tl.store(ht + sbase + sidx, S, mask=mPN)


@triton.jit
def _ssd_output_kernel(
    x,
    Bm,
    Cm,
    Dv,
    gam,
    dtc,
    hs,
    y,
    chunk_info,
    sxt,
    sxh,
    sbt,
    sbg,
    sct,
    scg,
    H: tl.constexpr,
    GROUP: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    HAS_D: tl.constexpr,
    D_PER_P: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
    seq_info,
    prog,
    OVL: tl.constexpr,
    NPS: tl.constexpr,
    NPO: tl.constexpr,
    DISCARD: tl.constexpr,
    LINES: tl.constexpr,
):
    if OVL:
        # a 1-d grid, chunk-major (the loop's programs advance through the chunks together), each
        # program waiting until every loop program of its (sequence, head) has written this
        # chunk's start state
        pid = tl.program_id(0)
        i_c = pid // (H * NPO)
        i_h = (pid // NPO) % H
        i_p = pid % NPO
        _await_chunk(prog + (tl.load(chunk_info + i_c * 4) * H + i_h) * NPS, i_c, NPS)
    else:
        i_c = tl.program_id(0)
        i_h = tl.program_id(1)
        i_p = tl.program_id(2)
    m, tc = _chunk_rows(chunk_info, i_c)
    r = tl.arange(0, 64)
    row = (i_c * H + i_h).to(tl.int64) * 64
    g = tl.load(gam + row + r)
    d = tl.load(dtc + row + r)
    oP = i_p * BP + tl.arange(0, BP)
    mP = oP < P
    oN = tl.arange(0, BN)
    mN = oN < N
    grp = i_h // GROUP
    Ct = tl.load(Cm + tc[:, None] * sct + grp * scg + oN[None, :], mask=m[:, None] & mN[None, :], other=0.0).to(DOT)
    Bt = tl.load(Bm + tc[:, None] * sbt + grp * sbg + oN[None, :], mask=m[:, None] & mN[None, :], other=0.0).to(DOT)
    mPN = mP[:, None] & mN[None, :]
    sp = hs + (i_c * H + i_h).to(tl.int64) * (P * N) + oP[:, None] * N + oN[None, :]
    if OVL:  # from L2: the overlapped loop writes it while this kernel runs
        Sp = tl.load(sp, mask=mPN, other=0.0, cache_modifier=".cg").to(DOT)
    else:
        Sp = tl.load(sp, mask=mPN, other=0.0).to(DOT)
    X = tl.load(x + tc[:, None] * sxt + i_h * sxh + oP[None, :], mask=m[:, None] & mP[None, :], other=0.0)
    acc = _out_tile(Ct, Bt, Sp, X, g, d, Dv, i_h, oP, mP, P, HAS_D, D_PER_P, DOT, PREC)
    tl.store(
        y + tc[:, None] * (H * P) + i_h * P + oP[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] & mP[None, :]
    )
    if DISCARD:
        # ``DISCARD``: this program was the chunk-start copy's only reader; once every thread is
        # past its use, its ``LINES`` 128-byte L2 lines are dropped unwritten (scratch: a dirty
        # line written back to memory is bandwidth the loop's state writes want)
        go = _after_cta_barrier(0)
        lines = (hs + (i_c * H + i_h).to(tl.int64) * (P * N)).to(tl.pointer_type(tl.int8))
        _discard_lines(lines + tl.arange(0, LINES).to(tl.int64) * 128, go, tl.full([1], 1, tl.int32))
    if OVL:
        _last_waits_for_the_loop()


def _overlaps(dev: torch.device) -> bool:
    """Whether the output kernel can run beside the state loop on ``dev`` (``OVL``): programmatic
    dependent launch, compute capability 9.0 on, never in the interpreter."""
    return not INTERPRET and dev.type == "cuda" and _capability(dev.index)[0] >= 9


@functools.lru_cache(maxsize=None)
def _capability(index) -> tuple:
    return torch.cuda.get_device_capability(index)


#: exceptions of Gluon SSD loops that failed to compile in this process (then the Triton loop runs)
_GLUON_FAILED: list = []


def _gluon_fits(dev: torch.device, x2: torch.Tensor, B2: torch.Tensor, P: int, N: int) -> bool:
    """Whether the Gluon state loop (``kernels.ssd_gluon``) can take this call: a Hopper GPU
    (compute capability 9.0: wgmma), Gluon present and its shape family, no failed compile in this
    process, and x / B rows whose 16-byte pieces are aligned (its ``cp.async`` copies 16 bytes a
    thread)."""
    if INTERPRET or dev.type != "cuda" or _GLUON_FAILED or _capability(dev.index)[0] != 9:
        return False
    if not ssd_gluon.applies(P, N, x2.element_size() * 8, True):
        return False
    return all(t.data_ptr() % 16 == 0 and t.stride(0) % 8 == 0 and t.stride(1) % 8 == 0 for t in (x2, B2))


def _fused_fits(dev: torch.device, x2: torch.Tensor, B2: torch.Tensor, C2: torch.Tensor, P: int, N: int) -> bool:
    """Whether the fused Gluon program (``WS``) can take this call: the Gluon loop's conditions for x
    and B, and C's rows aligned as B's (its output partition copies C by ``cp.async`` too)."""
    return _gluon_fits(dev, x2, B2, P, N) and _gluon_fits(dev, x2, C2, P, N)


def _compiled(what: str, instead: str, launch) -> bool:
    """Run ``launch`` (a Gluon program's launch); False where it raised: one warning naming
    ``what`` and the error's last line (``instead`` runs from then on: the failure is remembered in
    ``_GLUON_FAILED``, which turns the Gluon programs off for the process)."""
    try:
        launch()
    except Exception as exc:  # noqa: BLE001 - any compile error of a Gluon program: fall back
        first = (str(exc).strip().splitlines() or [""])[-1]
        warnings.warn(f"{what} did not compile ({type(exc).__name__}: {first}); {instead}", stacklevel=4)
        _GLUON_FAILED.append(exc)
        return False
    return True


def _fused_gluon(x2, B2, C2, Dv, gam, dtc, y, h0, ht, hb, meta, has_h0: int, **consts) -> bool:
    """Launch the warp-specialised Gluon program of the state loop and its output (``WS``,
    ``kernels.ssd_fused_gluon``; one program a sequence and head); False where it did not compile
    (a warning, and the two-kernel call runs from then on)."""

    def launch():
        ssd_fused_gluon._gluon_ssd_fused_kernel[(meta.num_seqs, consts["H"])](
            x2, B2, C2, Dv, gam, dtc, y, h0, ht, hb, meta.seq_info, meta.chunk_info, meta.store_slot,
            x2.stride(0), x2.stride(1), B2.stride(0), B2.stride(1), C2.stride(0), C2.stride(1), has_h0,
            **consts, num_warps=GLUON_WARPS,
        )  # fmt: skip

    return _compiled("the fused Gluon SSD program", "using the two kernels", launch)


def _gluon_loop(x2, B2, gam, dtc, hs, h0, ht, hb, meta, has_h0: int, prog, **consts) -> bool:
    """Launch the Gluon state loop (one program a sequence and head); False where it did not
    compile (a warning, and the Triton loop runs from then on). ``TMA``: the boundary states by
    bulk copies from a ring of shared buffers (``hb`` contiguous fp32)."""

    def launch():
        desc = ssd_gluon.boundary_descriptor(hb, consts["P"], consts["N"]) if consts["TMA"] else None
        ssd_gluon._gluon_ssd_state_kernel[(meta.num_seqs, consts["H"])](
            x2, B2, gam, dtc, hs, h0, ht, hb, desc, meta.seq_info, meta.chunk_info, meta.store_slot,
            x2.stride(0), x2.stride(1), B2.stride(0), B2.stride(1), has_h0, prog,
            **consts, num_warps=GLUON_WARPS * consts["WG"],
        )  # fmt: skip

    return _compiled("the Gluon SSD loop", "using the Triton loop", launch)


def _discarded_lines(dev: torch.device, npo: int, nbytes: int) -> int:
    """``DISCARD``'s 128-byte lines a chunk-start copy of ``nbytes`` drops after its read, 0 where
    it does not apply: the interpreter, a device without ``discard.global.L2`` (CUDA compute
    capability 8.0 on), a copy read by more than one output program (``npo`` P blocks), or one that
    is not a power-of-two count of whole lines (a line shared with the next copy)."""
    if INTERPRET or dev.type != "cuda" or npo != 1 or _capability(dev.index)[0] < 8:
        return 0
    return _whole_lines(nbytes)


def _whole_lines(nbytes: int) -> int:
    """The 128-byte lines of a copy of ``nbytes``, 0 where they are not a power-of-two count of
    whole lines."""
    lines = nbytes // 128
    return lines if lines * 128 == nbytes and lines == _pow2(lines) else 0


def _boundary_descriptor(hb: torch.Tensor, BP: int, BN: int, P: int, N: int):
    """``TMA_B``'s descriptor of the boundary states ``hb`` ``[NB, H, P, N]`` as ``[NB * H * P, N]``
    rows, a block one program's state (``[P, N]``); None where a block is not exactly one state
    (a P block under P, N not a power of two: a block would cross into the next state). Rows of a
    power-of-two N >= 16 are whole 16-byte multiples, as the copy engine needs; ``hb`` is made
    contiguous by the caller."""
    if BP != P or BN != N:
        return None
    return TensorDescriptor.from_tensor(hb.view(-1, N), [BP, BN])


def _bulk_boundaries(mode: int, num_boundaries: int, num_chunks: int) -> bool:
    """Whether ``TMA_B`` ``mode`` stores a call's ``num_boundaries`` states over ``num_chunks``
    chunks by bulk copies (``TMA_SPARSE``: one state per ``TMA_SPARSE_CHUNKS`` chunks or fewer)."""
    if mode == TMA_SPARSE:
        return 0 < num_boundaries and num_boundaries * TMA_SPARSE_CHUNKS <= num_chunks
    if mode not in (TMA_NEVER, TMA_ALWAYS):
        raise ValueError(f"KERNELS_CONFIG_SSD_STATE: TMA_B is {mode}, not 0, 1 or 2")
    return mode == TMA_ALWAYS


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _rows(t: torch.Tensor, TT: int) -> torch.Tensor:
    """``[B, T, a, b]`` as ``[TT, a, b]`` (a view where possible) with a unit last stride."""
    r = t.reshape(TT, *t.shape[2:])
    if r.stride(-1) != 1:
        r = r.contiguous()
    return r


def chunk_ssd(x, dt, A, B, C, **options):
    """Chunked SSD (Mamba2) forward.

    Keyword options (``kernels.ssd_args.ssd_call``, shared with ``kernels.torch_ssd``): ``D=None,
    dt_bias=None, dt_softplus=True, dt_limit=(0.0, inf), initial_state=None, cu_seqlens=None,
    start_positions=None, boundary_states=True, state_dtype=torch.float32, boundary_stride=1,
    boundary_indices=None, chunk_metadata=None, input_precision=None``.

    x ``[Bsz, T, H, P]``; dt (raw, before bias and softplus) ``[Bsz, T, H]``; A ``[H]`` (negative,
    ``-exp(A_log)``); B, C ``[Bsz, T, G, N]`` with ``H % G == 0``; D ``[H]`` or ``[H, P]``; dt_bias
    ``[H]``; ``dt_limit`` clamps dt after the softplus. Varlen: ``Bsz == 1`` with ``cu_seqlens``;
    ``start_positions`` the absolute position of each sequence's first token (chunks are aligned to
    absolute multiples of 64). ``initial_state`` ``[S, H, P, N]`` (S sequences).

    Returns ``(y [Bsz, T, H, P] in x's dtype, final_state [S, H, P, N] fp32, boundary_states
    [NB, H, P, N] in state_dtype or None)``: the boundary states as ``chunk_gated_delta_rule``'s
    (every emitted absolute 64-multiple, sequence-major; ``boundary_stride`` / ``boundary_indices``
    or the metadata's selection). ``input_precision`` ("ieee", "tf32", "tf32x3": the default) sets
    the products' precision for fp32 inputs on a GPU.
    """
    c = ssd_call(x, dt, A, B, C, **options, precisions=_PRECISIONS)
    D, dt_bias, dt_softplus, dt_limit = c.D, c.dt_bias, c.dt_softplus, c.dt_limit
    initial_state, state_dtype, input_precision, meta = c.initial_state, c.state_dtype, c.input_precision, c.meta
    boundary_states = c.boundary_states
    Bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    dev, dtype, f32 = x.device, x.dtype, torch.float32
    S, TT, NT = meta.num_seqs, Bsz * T, meta.num_chunks
    y = torch.empty(Bsz, T, H, P, dtype=dtype, device=dev)
    ht = torch.empty(S, H, P, N, dtype=f32, device=dev)
    store_b = bool(boundary_states)
    hb = torch.empty(meta.num_boundaries, H, P, N, dtype=state_dtype, device=dev) if store_b else None
    if NT == 0:
        if initial_state is not None:
            ht.copy_(initial_state)
        else:
            ht.zero_()
        return y, ht, hb
    B, C = B.to(dtype), C.to(dtype)
    x2, B2, C2 = _rows(x, TT), _rows(B, TT), _rows(C, TT)
    dt2 = dt.reshape(TT, H)
    A32 = A.float().contiguous()
    bias = dt_bias.float().contiguous() if dt_bias is not None else A32
    Dv = D.float().contiguous() if D is not None else A32
    h0 = initial_state.float().contiguous() if initial_state is not None else ht
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi != float("inf")
    BN = max(16, _pow2(N))
    Pp = max(16, _pow2(P))
    f32_in = dtype == f32
    prec = (input_precision or FP32_PRECISION) if f32_in else "tf32"
    # the interpreter multiplies bf16 operands' bit patterns (triton-lang/triton#11584): its
    # products take fp32 operands there (the GPU multiplies bf16 on tensor cores)
    dot = tl.float32 if (f32_in or (INTERPRET and dtype == torch.bfloat16)) else (
        tl.bfloat16 if dtype == torch.bfloat16 else tl.float16
    )  # fmt: skip
    overlaps = _overlaps(dev)
    cfg = _config("state", f32_in, overlaps)
    BP = min(cfg.pop("BP"), Pp, 32 if BN >= 256 else Pp)
    fuse = bool(cfg.pop("FUSE"))
    prep = bool(cfg.pop("PREP")) and not fuse
    ovl = bool(cfg.pop("OVL")) and prep and overlaps
    sig = max(1, cfg.pop("SIG"))
    tma_b = _bulk_boundaries(cfg.pop("TMA_B"), meta.num_boundaries, NT)
    wg = cfg.pop("GLUON", 0)
    if wg and wg not in ssd_gluon.GLUON_WARPGROUPS:
        raise ValueError(f"KERNELS_CONFIG_SSD_STATE: GLUON={wg}, expected 0 or one of {ssd_gluon.GLUON_WARPGROUPS}")
    glu = bool(wg) and ovl and BP == P and _gluon_fits(dev, x2, B2, P, N)
    # ``WS``: the loop and its output in one warp-specialised Gluon program (no chunk-start copies)
    ws = bool(cfg.pop("WS", 0)) and ovl and _fused_fits(dev, x2, B2, C2, P, N)
    nps = triton.cdiv(P, BP)
    store = store_b and meta.num_boundaries > 0
    # scratch of the output kernel: each chunk's gamma and dt, its start state in the input dtype
    # (not made where the output is computed inside the loop, ``FUSE``)
    gam = torch.empty(0 if fuse else NT * H * 64, dtype=f32, device=dev)
    dtc = torch.empty_like(gam)
    hs = torch.empty(0 if fuse or ws else NT * H * P * N, dtype=dtype, device=dev)
    has_d, d_per_p = D is not None, D is not None and D.dim() == 2
    if ws:
        ovl = False  # one program: no progress counters, no dependent launch
    # the overlapped output's progress counters: per (sequence, head) one per loop program
    prog = torch.empty(S * H * nps, dtype=torch.int32, device=dev) if ovl else ht
    if prep:
        _ssd_prep_kernel[(NT, H)](
            dt2, bias, A32, gam, dtc, meta.chunk_info, meta.seq_info, prog, dt2.stride(0), dt2.stride(1), lo, hi,
            H=H, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp, OVL=ovl, NPS=nps,
        )  # fmt: skip
    if ws:
        ws = _fused_gluon(
            x2, B2, C2, Dv, gam, dtc, y, h0, ht, hb if store else ht, meta, int(initial_state is not None),
            H=H, GROUP=H // G, P=P, N=N, STORE_B=store, HAS_D=has_d, D_PER_P=d_per_p,
        )  # fmt: skip
        if ws:
            return y, ht, hb
        # it did not compile: the two-kernel call, the loop beside nothing (``ovl`` was given up)
        hs = torch.empty(NT * H * P * N, dtype=dtype, device=dev)
        glu = False
    if glu:
        glu = _gluon_loop(
            x2, B2, gam, dtc, hs, h0, ht, hb if store else ht, meta, int(initial_state is not None), prog,
            H=H, GROUP=H // G, P=P, N=N, STORE_B=store, OVL=ovl, SIG=sig, WG=wg, TMA=tma_b and store,
        )  # fmt: skip
    hb_desc = _boundary_descriptor(hb, BP, BN, P, N) if tma_b and store and (INTERPRET or overlaps) else None
    if not glu:
        _ssd_state_kernel[(S, H, nps)](
            x2, dt2, bias, A32, B2, C2, Dv, y, gam, dtc, hs, h0, ht, hb if store else ht, hb_desc, meta.seq_info,
            meta.chunk_info,
            meta.store_slot, x2.stride(0), x2.stride(1), dt2.stride(0), dt2.stride(1), B2.stride(0), B2.stride(1),
            C2.stride(0), C2.stride(1), lo, hi, int(initial_state is not None),
            H=H, GROUP=H // G, P=P, N=N, BP=BP, BN=BN, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
            CLAMP=clamp, STORE_B=store, DOT=dot, PREC=prec, WHILE_LOOP=INTERPRET, FUSE=fuse, HAS_D=has_d,
            D_PER_P=d_per_p, PREP=prep, prog=prog, OVL=ovl, SIG=sig, NPS=nps, TMA_B=hb_desc is not None, **cfg,
        )  # fmt: skip
    if fuse:
        return y, ht, hb
    cfg = _config("out", f32_in)
    BP = min(cfg.pop("BP"), Pp, 32 if BN >= 256 else Pp)
    npo = triton.cdiv(P, BP)
    lines = _discarded_lines(dev, npo, P * N * hs.element_size()) if cfg.pop("DISCARD") else 0
    _ssd_output_kernel[(NT * H * npo, 1, 1) if ovl else (NT, H, npo)](
        x2, B2, C2, Dv, gam, dtc, hs, y, meta.chunk_info,
        x2.stride(0), x2.stride(1), B2.stride(0), B2.stride(1), C2.stride(0), C2.stride(1),
        H=H, GROUP=H // G, P=P, N=N, BP=BP, BN=BN, HAS_D=has_d, D_PER_P=d_per_p, DOT=dot, PREC=prec,
        seq_info=meta.seq_info, prog=prog, OVL=ovl, NPS=nps, NPO=npo, DISCARD=lines > 0, LINES=max(lines, 1),
        **({"launch_pdl": True} if ovl else {}), **cfg,
    )  # fmt: skip
    return y, ht, hb
