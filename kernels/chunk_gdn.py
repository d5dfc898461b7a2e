"""Chunked gated delta rule, forward only, emitting exactly resumable chunk-boundary states.

Math (per value head, C = 64 tokens per chunk, state S is K x V, gamma = chunk-local cumsum of g):
  L   = strict_tril(diag(beta) (K K^T o exp(gamma_i - gamma_j)))
  A   = (I + L)^-1                       (block forward substitution on 16 x 16 blocks)
  w   = A diag(beta exp(gamma)) K,   u = A diag(beta) V
  v'  = u - w S_c
  S  <- exp(gamma_last) S + K^T diag(exp(gamma_last - gamma)) v'
  O   = diag(exp(gamma)) Q S_c + tril(Q K^T o exp(gamma_i - gamma_j)) v'     (Q l2-normed, scaled)
(q and k l2-normalised when asked; the norms and the scale multiply fp32 matrix-product results.)

Four kernels, split where the work changes shape (the split FLA uses, written from the math):
  1. ``_solve_kernel`` (one program per chunk x value head, fully parallel, 2 warps): gate /
     beta, the chunk-local cumsum gamma, the ten 16 x 16 blocks of kkt in registers, A. On
     Hopper at the production shape ``kernels.solve_gluon`` computes the same (to fp32
     rounding) for two value heads a program: ``K K^T`` as one warpgroup product, then a
     column of A a thread, with no barrier in the substitution.
  2. ``_wu_kernel`` (same grid, 4 warps): w, u and the state update's row factors (key norm x
     decay to the chunk end: S += K^T diag(f) v', the decay applied to v' as FLA does).
  3. ``_state_kernel`` (one program per sequence x value head x V block, sequential over chunks):
     stores the chunk-start state h_c (input dtype, read by kernel 4), v' = u - w S, the state
     update, the boundary states (``state_dtype``, default fp32) and the final state (fp32).
     Two matrix products per chunk; its loads are pipelined (cp.async, 3 stages). On Hopper at
     the production shape (16-bit inputs, K = 128) ``kernels.state_gluon`` runs the same loop,
     to the same bits, with its stores taken straight from the products' layouts.
  4. ``_output_kernel`` (one program per chunk x value head x V block, fully parallel): O. Beside
     the Gluon loop it is launched programmatically dependent on it (``OVL``) and each program
     waits on the loop's progress counters for its chunk, so that it runs on the
     multiprocessors the loop leaves idle (docs/kernels.md).

Head dims K, V are compile-time constants (a model has one pair; ``kernels.warmup`` compiles
it). Any size in [1, 256] works: tiles are padded to the next power of two and loads / stores
are masked on the real size; at a power of two the column masks fold away, which keeps the
loads 16-byte vectors that Triton can pipeline. Inside a chunk the kernels address tiles with
32-bit offsets from one 64-bit base per chunk (no per-element 64-bit arithmetic: the earlier
version spilled registers in every kernel).
"""

from __future__ import annotations

import functools
import math
import operator
import os
import warnings
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels._common import (
    INTERPRET,
    MAX_HEAD_DIM,
    MIN_HEAD_DIM,
    SUPPORTED_DTYPES,  # noqa: F401
    ChunkMetadata,  # noqa: F401
    check_args,
    prepare_chunk_metadata,
    resolve_call,
)
from kernels._launch import raw_launcher
from kernels.fused_gluon import _gluon_fused_kernel
from kernels.solve_gluon import HEADS as SOLVE_HEADS
from kernels.solve_gluon import SOLVE_WARPS, _gluon_solve_kernel
from kernels.solve_gluon import applies as _gluon_solve_applies
from kernels.state_gluon import GLUON_K, PROG_SLOTS, _gluon_state_kernel
from kernels.state_gluon import applies as _gluon_applies

__all__ = [
    "chunk_gated_delta_rule",
    "prepare_chunk_metadata",
    "ChunkMetadata",
    "CONFIGS",
    "launch_params",
    "MAX_HEAD_DIM",
    "MIN_HEAD_DIM",
]

# Launch configurations (fixed, no autotuning: every new shape would otherwise re-benchmark
# the candidates, which dominates the cold start of a replay). ``BV`` is the V block of the
# state and output kernels; it is clamped to the padded V. Overridable for experiments, e.g.
# KERNELS_CONFIG_STATE="BV=32,num_warps=4,num_stages=2".
CONFIGS = {
    "solve": dict(num_warps=2, num_stages=1, TRANS=1, BKS=64, TF32M=0, GLUON=1),
    "wu": dict(num_warps=4, num_stages=1, BCV=128, KONCE=1),
    "state": dict(BV=16, num_warps=4, num_stages=3, VFAST=1, GLUON=1, SIG=16, FUSE=0),
    "out": dict(BV=128, num_warps=4, num_stages=2, OVL=1),
}


def _env_config(name: str) -> dict:
    """What ``KERNELS_CONFIG_<NAME>`` sets (``"BV=32,num_warps=4"``: ``{"BV": 32, "num_warps": 4}``)."""
    env = os.environ.get(f"KERNELS_CONFIG_{name.upper()}")
    cfg = {}
    if env:
        for item in env.split(","):
            key, val = item.split("=")
            cfg[key.strip()] = int(val)
    return cfg


def _config(name: str) -> dict:
    return {**CONFIGS[name], **_env_config(name)}


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(int(n)))


LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl")
#: launch-table keys the host reads and no kernel takes: ``GLUON`` of the state loop and of the
#: solve (1: the Gluon kernel where ``kernels.state_gluon`` / ``kernels.solve_gluon`` applies and
#: the device is Hopper; 0: the Triton kernel always) and the state loop's ``FUSE`` (1: the Gluon
#: loop and the output in one warp-specialised program, ``kernels.fused_gluon``, where the Gluon
#: loop runs; 0: the output as its own kernel)
HOST_KEYS = ("GLUON", "FUSE")


_CONFIG_ENVS = tuple(f"KERNELS_CONFIG_{name.upper()}" for name in CONFIGS)
_CONFIG_ENV_KEYS = tuple(map(os.environ.encodekey, _CONFIG_ENVS)) if hasattr(os.environ, "encodekey") else None


def launch_params(
    K: int,
    V: int,
    dtype: torch.dtype,
    input_precision: Optional[str] = None,
    wide_state: bool = False,
    gluon: bool = False,
) -> dict:
    """Compile-time parameters and launch options of the four kernels for head dims K, V and
    input ``dtype``: ``{"solve" | "wu" | "state" | "out": {name: value}}`` (``LAUNCH_OPTIONS``
    keys are launch options, the rest constexprs; ``BV`` of state / out sets their grids).
    ``wide_state``: the state loop's V block is ``STATE_BV_WIDE`` (``state_wide`` says when;
    16-bit inputs, and fp32 in tf32x3) unless ``KERNELS_CONFIG_STATE`` sets one. ``gluon``: the
    device runs the Gluon state loop (``gluon_device``); ``["state"]["GLUON"]`` says whether this
    shape takes it, ``["out"]["OVL"]`` whether the output kernel then runs beside it, and
    ``["state"]["FUSE"]`` whether the output runs inside the loop's program instead (opt-in).
    ``benchmarks/kernel_resources.py`` compiles from the same table. Built once per shape and
    ``KERNELS_CONFIG_*`` setting (a per-call cost otherwise); the result is shared: read only."""
    return _launch_params(int(K), int(V), dtype, input_precision, _config_envs(), bool(wide_state), bool(gluon))


#: os.environ's own mapping (encoded keys and values; the same dict for the life of the process:
#: ``os.environ[...] = ...`` writes into it), where the platform has one
_ENV_DATA = getattr(os.environ, "_data", None) if _CONFIG_ENV_KEYS is not None else None


def _config_envs() -> tuple:
    """The ``KERNELS_CONFIG_*`` values now (None where unset): four dict lookups in os.environ's
    own mapping, where four ``os.environ.get`` calls cost ~5 us of every call on a slow host."""
    if _ENV_DATA is not None:
        return tuple(map(_ENV_DATA.get, _CONFIG_ENV_KEYS))
    return tuple(map(os.environ.get, _CONFIG_ENVS))


#: the matrix products' precision for fp32 inputs unless the call's ``input_precision`` says: three
#: tf32 tensor-core products per product (the operands split into a tf32 head and its remainder).
#: On an H200 it ran 14x faster than IEEE FMA products (3.8 against 55 ms at 16/32 heads and 8K
#: tokens; Triton's FMA products hold whole operand rows in registers and spill 17-56 KB in every
#: kernel) with the same error against the per-token fp32 oracle (out 7.1e-8 against 8.2e-8, final
#: state 6.3e-7 against 6.6e-7, boundary states 1.8e-6 both; plain tf32: 1e-4 to 9e-4).
#: docs/results-kernels.md. The interpreter computes every product in fp32 whatever the setting.
FP32_PRECISION = "tf32x3"
FP32_PRECISIONS = (None, "ieee", "tf32", "tf32x3")

#: the output kernel's V block for fp32 inputs (16-bit inputs: ``CONFIGS["out"]["BV"]``, 128, a
#: whole head of 128: 20 % less time than 64 on an H200, docs/results-kernels.md)
OUT_BV_FP32 = 64

#: the state loop's V block where its programs fill the GPU at it (``state_wide``): half the
#: programs of the default 16, each reading a chunk's w and keys once for twice the columns
STATE_BV_WIDE = 32
#: ... when the programs at ``STATE_BV_WIDE`` are at least this share of the multiprocessors
STATE_WIDE_FILL = 0.75


#: the w / u kernel reads the key tile once (``KONCE``) up to this padded K, for 16-bit inputs
KONCE_MAX_K = 128
#: ``PROG_SLOTS`` as the kernels read it
_PROG_SLOTS = tl.constexpr(PROG_SLOTS)

#: set when the Gluon state loop failed to compile (a Triton whose Gluon API moved on): the process
#: runs the Triton loop from then on (the generic path of ``chunk_gated_delta_rule``)
_GLUON_FAILED: list = []


@functools.lru_cache(maxsize=16)
def _gluon_capable(index: int) -> bool:
    return _gluon_state_kernel is not None and torch.cuda.get_device_capability(index) == (9, 0)


def gluon_device(device) -> bool:
    """Whether ``device`` runs the Gluon state loop (``kernels.state_gluon``): a Hopper GPU
    (compute capability 9.0, whose wgmma the loop issues), compiled Triton with Gluon, and no
    failed compile in this process. ``KERNELS_CONFIG_STATE=GLUON=0`` turns it off per shape."""
    if device.type != "cuda" or INTERPRET or _GLUON_FAILED:
        return False
    return _gluon_capable(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=16)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def state_wide(N: int, HV: int, V: int, device) -> bool:
    """Whether the state loop of a call over ``N`` sequences takes the wide V block: on a GPU
    where ``N * HV * ceil(V / STATE_BV_WIDE)`` programs fill ``STATE_WIDE_FILL`` of its
    multiprocessors. Measured on an H200 (132 SMs, K = V = 128, 32K tokens): at 32 value heads
    and one sequence (128 programs) 0.70 ms against 0.81 without boundary states and 0.85 against
    0.96 with a boundary every 512 tokens (1.10 against 1.09 with one at every chunk); at 8 value
    heads (32 programs) 0.68 against 0.56 (docs/results-kernels.md). Never on a CPU."""
    if device.type != "cuda" or INTERPRET:
        return False
    return N * HV * -(-V // STATE_BV_WIDE) >= STATE_WIDE_FILL * _multiprocessors(device.index or 0)


@functools.lru_cache(maxsize=64)
def _launch_params(
    K: int,
    V: int,
    dtype: torch.dtype,
    input_precision: Optional[str],
    envs: tuple,
    wide: bool = False,
    gluon: bool = False,
) -> dict:
    """``launch_params`` for one shape, one tuple of ``KERNELS_CONFIG_*`` values, the state
    block choice and the Gluon device flag (the cache key)."""
    BK, BVF = _pow2(K), _pow2(V)
    if input_precision not in FP32_PRECISIONS:
        raise ValueError(f"input_precision must be one of 'ieee', 'tf32', 'tf32x3' (or None), not {input_precision!r}")
    prec = (input_precision or FP32_PRECISION) if dtype == torch.float32 else "tf32"
    state, out = _config("state"), _config("out")
    if wide and (dtype != torch.float32 or prec == "tf32x3") and "BV" not in _env_config("state"):
        # fp32 inputs only in tf32x3: 14 % faster wide (3.27 against 3.79 ms at 16/32 heads, 8K
        # tokens on an H200) at IEEE's accuracy (relative errors against the fp32 oracle within
        # 7 % of IEEE's narrow run at 16/32 heads: 5.4e-7 / 6.8e-7 / 8.9e-7). Not with IEEE FMAs
        # (they spill more wide: 12.7 KB against 4.8) nor in plain tf32 (its three stages of fp32
        # tiles need 240.5 KB of shared memory wide; an H200 has 227)
        state["BV"] = STATE_BV_WIDE
    if dtype == torch.float32 and "BV" not in _env_config("out"):
        # fp32: 128 was 1.5-2.3 % slower than 64 in tf32x3 on an H200 (IEEE FMA products spill
        # more at 128: 44 KB against 36)
        out["BV"] = OUT_BV_FP32
    state["BV"] = min(state["BV"], BVF)
    out["BV"] = min(out["BV"], BVF)
    bits = torch.finfo(dtype).bits
    state["GLUON"] = int(
        gluon and bool(state["GLUON"]) and _gluon_applies(K, V, state["BV"], bits, state["num_warps"], state["VFAST"])
    )
    # the output overlapped with the Gluon loop (``OVL``): launched programmatically dependent on
    # it, its programs wait on per-(sequence, head, V block) progress counters that the loop
    # releases every ``SIG`` chunks (and at its last: each release is a barrier and a fence on the
    # loop's serial path), and run beside it on the multiprocessors it leaves idle
    # the output inside the loop's program (``FUSE``, ``kernels.fused_gluon``): no output kernel,
    # no chunk-start states or v' in memory
    state["FUSE"] = int(bool(state["FUSE"]) and bool(state["GLUON"]) and _gluon_fused_kernel is not None)
    ovl = int(bool(out["OVL"]) and bool(state["GLUON"]) and not state["FUSE"])
    out["OVL"] = state["OVL"] = ovl
    out["NVS"] = -(-V // state["BV"])
    if ovl:
        out["launch_pdl"] = True
    solve = _solve_config(K, BK, prec)
    solve["OVL"] = ovl
    # the Gluon solve (two value heads a program, one warpgroup): 16-bit inputs at K = 128
    # (its layouts are written for one warpgroup: a ``num_warps`` asked of the solve keeps Triton's)
    solve["GLUON"] = int(
        gluon
        and bool(solve["GLUON"])
        and _gluon_solve_applies(K, bits)
        and _env_config("solve").get("num_warps", SOLVE_WARPS) == SOLVE_WARPS
    )
    if solve["GLUON"]:
        solve["num_warps"] = SOLVE_WARPS
    return {
        "solve": solve,
        "wu": dict(K=K, V=V, BK=BK, BVF=BVF, BC=min(BK, BVF, 64), PREC=prec, **_wu_config(BVF, dtype, BK)),
        "state": dict(K=K, V=V, BK=BK, PREC=prec, **state),
        "out": dict(K=K, V=V, BK=BK, BC=min(BK, 64), PREC=prec, **out),
    }


def _solve_config(K: int, BK: int, prec: str) -> dict:
    """The solve kernel's launch table entry, its key column block ``BKS`` clamped to the padded K."""
    cfg = _config("solve")
    cfg["BKS"] = min(cfg["BKS"], BK)
    # the keys' transpose in registers: 1.5 % faster at K = 128 (H200); at 256 it spills (4 B)
    cfg["TRANS"] = int(bool(cfg["TRANS"]) and BK <= 128)
    # TF32M=1: the block inverse's merge products in tf32 where A is stored in 16 bits anyway (its
    # rounding, 2^-8 relative, is 8x tf32's input rounding), but for the two-term inner sums of
    # A20 and A31 (with those too it spills 48 B at bf16 / K = 128); never for fp32 inputs unless
    # their input_precision is tf32 (``prec`` is "tf32" for 16-bit inputs). On an H200 the solve
    # took 0.580 against 0.611 ms at 16/32 heads and 32K tokens, the call 1.2 % less (all merges
    # in tf32: 2.4 %, with the IEEE merges' errors to three digits). Off by default: spill-free in
    # triton 3.6 at head dims 64, 128 and 256, but 4 B spilled in triton 3.9 at 128 and 256
    # (every other mix tried spills in one of the two; docs/results-kernels.md, 2026-12-04 third session)
    cfg["TF32M"] = int(bool(cfg["TF32M"]) and prec == "tf32")
    return dict(K=K, BK=BK, PREC=prec, **cfg)


def _wu_config(BVF: int, dtype, BK: int) -> dict:
    """The w / u kernel's config, its u column block ``BCV`` clamped to the padded V (fp32 inputs:
    64: 128 was 2.5-3.1 % slower in their tf32x3 products on an H200)."""
    cfg = _config("wu")
    if dtype == torch.float32 and "BCV" not in _env_config("wu"):
        cfg["BCV"] = OUT_BV_FP32
    cfg["BCV"] = min(cfg["BCV"], BVF)
    cfg["KONCE"] = int(bool(cfg["KONCE"]) and dtype != torch.float32 and BK <= KONCE_MAX_K)
    return cfg


@triton.jit
def _load_gate_beta(
    g, beta, A_log_h, dt_bias_h, gbase, bbase, r, m, sgt, sbt, USE_GATE: tl.constexpr, BETA_SIGMOID: tl.constexpr
):
    gr = tl.load(gbase + r * sgt, mask=m, other=0.0).to(tl.float32)
    if USE_GATE:
        x = gr + dt_bias_h
        sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        gr = tl.where(m, -tl.exp(A_log_h) * sp, 0.0)
    b = tl.load(bbase + r * sbt, mask=m, other=0.0).to(tl.float32)
    if BETA_SIGMOID:
        b = tl.where(m, tl.sigmoid(b), 0.0)
    return gr, b


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


@triton.jit
def _sub_row(L, A, i, r):
    """Row ``i`` of (I + L)^-1 by forward substitution: e_i - sum_m L[i, m] A[m, :]."""
    li = tl.sum(tl.where(r[:, None] == i, L, 0.0), 0)
    row = -tl.sum(li[:, None] * A, 0) + tl.where(r == i, 1.0, 0.0)
    return tl.where(r[:, None] == i, row[None, :], A)


@triton.jit
def _inv16x4(L0, L1, L2, L3):
    """(I + L)^-1 of four strictly lower-triangular 16 x 16 blocks. One loop carries the four
    independent substitutions, so their reductions overlap: 15 dependent steps, not 60."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    A0, A1, A2, A3 = eye, eye, eye, eye
    for i in range(1, 16):
        A0 = _sub_row(L0, A0, i, r)
        A1 = _sub_row(L1, A1, i, r)
        A2 = _sub_row(L2, A2, i, r)
        A3 = _sub_row(L3, A3, i, r)
    return A0, A1, A2, A3


@triton.jit
def _mm(a, b, TF32: tl.constexpr):
    """A 16 x 16 product of the block inverse: tf32 tensor cores (TF32), else IEEE fp32 FMAs."""
    if TF32:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _rows16(
    kbase,
    skt,
    tstart,
    lo,
    hi,
    blk: tl.constexpr,
    oc,
    K: tl.constexpr,
    FULL: tl.constexpr,
    W: tl.constexpr,
    TRANS: tl.constexpr,
):
    """Key rows of 16-row block ``blk`` of a chunk, [16, W] and transposed [W, 16] (TRANS: the
    transpose of the rows in registers, else a second, transposed load)."""
    r = blk * 16 + tl.arange(0, 16)
    m = _inside(tstart, r, lo, hi)
    kr = tl.load(kbase + r[:, None] * skt + oc[None, :], mask=_rowmask(m, oc, K, FULL, W), other=0.0)
    if TRANS:
        kT = tl.trans(kr)
    else:
        kT = tl.load(kbase + r[None, :] * skt + oc[:, None], mask=_colmask(m, oc, K, FULL, W), other=0.0)
    return kr, kT


@triton.jit
def _scale_blk(P, gi, gj, bi, ri, rj, DIAG: tl.constexpr):
    """beta_i * (k_i . k_j) / (|k_i| |k_j|) * exp(gamma_i - gamma_j), strictly lower on the
    diagonal blocks."""
    r = tl.arange(0, 16)
    if DIAG:
        keep = r[:, None] > r[None, :]
    else:
        keep = r[:, None] >= 0
    d = tl.exp(tl.where(keep, gi[:, None] - gj[None, :], float("-inf")))
    return P * (bi * ri)[:, None] * rj[None, :] * d


@triton.jit
def _store_blk(base, X, bi: tl.constexpr, bj: tl.constexpr):
    r = tl.arange(0, 16)
    tl.store(base + (bi * 16 + r)[:, None] * 64 + (bj * 16 + r)[None, :], X.to(base.dtype.element_ty))


@triton.jit
def _gate16(
    g,
    beta,
    A_log_h,
    dt_bias_h,
    gbase,
    bbase,
    tstart,
    lo,
    hi,
    blk: tl.constexpr,
    sgt,
    sbt,
    USE_GATE: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
):
    r = blk * 16 + tl.arange(0, 16)
    m = _inside(tstart, r, lo, hi)
    return _load_gate_beta(g, beta, A_log_h, dt_bias_h, gbase, bbase, r, m, sgt, sbt, USE_GATE, BETA_SIGMOID)


@triton.jit
def _store16(base, x, blk: tl.constexpr, tstart, lo, hi, HV):
    r = blk * 16 + tl.arange(0, 16)
    tl.store(base + r * HV, x, mask=_inside(tstart, r, lo, hi))


# Runtime flags are kept out of Triton's "== 1" integer specialisation: one compiled kernel
# serves calls with and without l2norm / initial state / boundary states.
@triton.jit(do_not_specialize=["l2norm"])
def _solve_kernel(
    k,
    g,
    beta,
    A_log,
    dt_bias,
    a_out,
    gc_out,
    gl_out,
    prog,
    chunk_info,
    skt,
    skh,
    sgt,
    sgh,
    sbt,
    sbh,
    HV,
    GROUP,
    K: tl.constexpr,
    BK: tl.constexpr,
    BKS: tl.constexpr,
    TRANS: tl.constexpr,
    TF32M: tl.constexpr,
    OVL: tl.constexpr,
    USE_GATE: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
    l2norm,
    PREC: tl.constexpr,
):
    """Gate, chunk-local cumsum, L = strict_tril(diag(beta) K K^T o decay) as ten 16 x 16
    blocks in registers, and A = (I + L)^-1 (fp32, IEEE), stored in the input dtype."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // GROUP
    tstart, lo, hi = _chunk(chunk_info, i_c)
    A_log_h = 0.0
    dt_bias_h = 0.0
    if USE_GATE:
        A_log_h = tl.load(A_log + i_hv).to(tl.float32)
        dt_bias_h = tl.load(dt_bias + i_hv).to(tl.float32)
    t0 = tstart.to(tl.int64)
    gbase = g + t0 * sgt + i_hv * sgh
    bbase = beta + t0 * sbt + i_hv * sbh
    r16 = tl.arange(0, 16)
    g0, b0 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 0, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g1, b1 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 1, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g2, b2 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 2, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g3, b3 = _gate16(g, beta, A_log_h, dt_bias_h, gbase, bbase, tstart, lo, hi, 3, sgt, sbt, USE_GATE, BETA_SIGMOID)
    g0 = tl.cumsum(g0, 0)
    g1 = tl.cumsum(g1, 0) + tl.sum(tl.where(r16 == 15, g0, 0.0), 0)
    g2 = tl.cumsum(g2, 0) + tl.sum(tl.where(r16 == 15, g1, 0.0), 0)
    g3 = tl.cumsum(g3, 0) + tl.sum(tl.where(r16 == 15, g2, 0.0), 0)
    obase = gc_out + t0 * HV + i_hv
    _store16(obase, g0, 0, tstart, lo, hi, HV)
    _store16(obase, g1, 1, tstart, lo, hi, HV)
    _store16(obase, g2, 2, tstart, lo, hi, HV)
    _store16(obase, g3, 3, tstart, lo, hi, HV)
    tl.store(gl_out + i_c * HV + i_hv, tl.sum(tl.where(r16 == 15, g3, 0.0), 0))
    if OVL:
        # the overlapped output's progress counters of a sequence starting at this chunk, zero
        # before the state loop starts (the scratch is reused between calls)
        tl.store(prog + (i_c * HV + i_hv) * _PROG_SLOTS + r16, tl.zeros([16], dtype=tl.int32))

    # ---- the ten 16 x 16 blocks of K K^T and the key norms, over K blocks of BKS --------------
    kbase = k + t0 * skt + i_h * skh
    z = tl.zeros([16, 16], dtype=tl.float32)
    P00, P11, P22, P33, P10, P20, P21, P30, P31, P32 = z, z, z, z, z, z, z, z, z, z
    s0 = tl.zeros([16], dtype=tl.float32)
    s1, s2, s3 = s0, s0, s0
    for kb in tl.static_range(0, BK, BKS):
        oc = kb + tl.arange(0, BKS)
        k0, k0T = _rows16(kbase, skt, tstart, lo, hi, 0, oc, K, K == BK, BKS, TRANS)
        k1, k1T = _rows16(kbase, skt, tstart, lo, hi, 1, oc, K, K == BK, BKS, TRANS)
        k2, k2T = _rows16(kbase, skt, tstart, lo, hi, 2, oc, K, K == BK, BKS, TRANS)
        k3, k3T = _rows16(kbase, skt, tstart, lo, hi, 3, oc, K, K == BK, BKS, TRANS)
        f0, f1, f2, f3 = k0.to(tl.float32), k1.to(tl.float32), k2.to(tl.float32), k3.to(tl.float32)
        s0 += tl.sum(f0 * f0, 1)
        s1 += tl.sum(f1 * f1, 1)
        s2 += tl.sum(f2 * f2, 1)
        s3 += tl.sum(f3 * f3, 1)
        P00 = tl.dot(k0, k0T, P00, input_precision=PREC)
        P11 = tl.dot(k1, k1T, P11, input_precision=PREC)
        P22 = tl.dot(k2, k2T, P22, input_precision=PREC)
        P33 = tl.dot(k3, k3T, P33, input_precision=PREC)
        P10 = tl.dot(k1, k0T, P10, input_precision=PREC)
        P20 = tl.dot(k2, k0T, P20, input_precision=PREC)
        P21 = tl.dot(k2, k1T, P21, input_precision=PREC)
        P30 = tl.dot(k3, k0T, P30, input_precision=PREC)
        P31 = tl.dot(k3, k1T, P31, input_precision=PREC)
        P32 = tl.dot(k3, k2T, P32, input_precision=PREC)
    r0 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s0 + 1e-6), 1.0)
    r1 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s1 + 1e-6), 1.0)
    r2 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s2 + 1e-6), 1.0)
    r3 = tl.where(l2norm != 0, 1.0 / tl.sqrt(s3 + 1e-6), 1.0)
    L00 = _scale_blk(P00, g0, g0, b0, r0, r0, True)
    L11 = _scale_blk(P11, g1, g1, b1, r1, r1, True)
    L22 = _scale_blk(P22, g2, g2, b2, r2, r2, True)
    L33 = _scale_blk(P33, g3, g3, b3, r3, r3, True)
    L10 = _scale_blk(P10, g1, g0, b1, r1, r0, False)
    L20 = _scale_blk(P20, g2, g0, b2, r2, r0, False)
    L21 = _scale_blk(P21, g2, g1, b2, r2, r1, False)
    L30 = _scale_blk(P30, g3, g0, b3, r3, r0, False)
    L31 = _scale_blk(P31, g3, g1, b3, r3, r1, False)
    L32 = _scale_blk(P32, g3, g2, b3, r3, r2, False)

    # ---- A = (I + L)^-1 by block forward substitution ------------------------------------------
    # the diagonal blocks' inverses in fp32, then the merges (``TF32M``: their products in tf32)
    A00, A11, A22, A33 = _inv16x4(L00, L11, L22, L33)
    # (TF32M: every merge product in tf32 but the two-term inner sums of A20 and A31, which stay
    # IEEE: with those in tf32 too the kernel spills 48 B at 2 warps, bf16 / K = 128)
    A10 = -_mm(A11, _mm(L10, A00, TF32M), TF32M)
    A21 = -_mm(A22, _mm(L21, A11, TF32M), TF32M)
    A32 = -_mm(A33, _mm(L32, A22, TF32M), TF32M)
    A20 = -_mm(A22, _mm(L20, A00, False) + _mm(L21, A10, False), TF32M)
    A31 = -_mm(A33, _mm(L31, A11, False) + _mm(L32, A21, False), TF32M)
    A30 = -_mm(A33, _mm(L30, A00, TF32M) + _mm(L31, A10, TF32M) + _mm(L32, A20, TF32M), TF32M)
    base = a_out + (i_c * HV + i_hv).to(tl.int64) * 4096
    _store_blk(base, A00, 0, 0)
    _store_blk(base, A10, 1, 0)
    _store_blk(base, A11, 1, 1)
    _store_blk(base, A20, 2, 0)
    _store_blk(base, A21, 2, 1)
    _store_blk(base, A22, 2, 2)
    _store_blk(base, A30, 3, 0)
    _store_blk(base, A31, 3, 1)
    _store_blk(base, A32, 3, 2)
    _store_blk(base, A33, 3, 3)


@triton.jit(do_not_specialize=["l2norm"])
def _wu_kernel(
    k,
    v,
    beta,
    a_in,
    gc,
    gl,
    w_out,
    u_out,
    fd_out,
    chunk_info,
    skt,
    skh,
    svt,
    svh,
    sbt,
    sbh,
    HV,
    GROUP,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BVF: tl.constexpr,
    BC: tl.constexpr,
    BCV: tl.constexpr,
    KONCE: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
    l2norm,
    PREC: tl.constexpr,
):
    """w = A diag(beta exp(gamma)) K, u = A diag(beta) V, and the row factors of the state
    update, rk exp(gamma_last - gamma) (key norm and decay to the chunk end), for the state
    kernel."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // GROUP
    dt = w_out.dtype.element_ty
    tstart, lo, hi = _chunk(chunk_info, i_c)
    r64 = tl.arange(0, 64)
    m = _inside(tstart, r64, lo, hi)
    t0 = tstart.to(tl.int64)
    obase = t0 * HV + i_hv  # row of token tstart in [TT, HV] tensors
    kbase = k + t0 * skt + i_h * skh
    vbase = v + t0 * svt + i_hv * svh
    gam = tl.load(gc + obase + r64 * HV, mask=m, other=0.0)
    g_last = tl.load(gl + i_c * HV + i_hv)
    bt = tl.load(beta + t0 * sbt + i_hv * sbh + r64 * sbt, mask=m, other=0.0).to(tl.float32)
    if BETA_SIGMOID:
        bt = tl.where(m, tl.sigmoid(bt), 0.0)
    A = tl.load(
        a_in + (i_c * HV + i_hv).to(tl.int64) * 4096 + r64[:, None] * 64 + r64[None, :],
        mask=(r64[:, None] // 16) >= (r64[None, :] // 16),
        other=0.0,
    )
    if KONCE:
        # the key tile read once, for its norms and for w (16-bit inputs up to K = 128)
        oc = tl.arange(0, BK)
        mk = _rowmask(m, oc, K, K == BK, BK)
        kc = tl.load(kbase + r64[:, None] * skt + oc[None, :], mask=mk, other=0.0).to(tl.float32)
        ksq = tl.sum(kc * kc, 1)
    else:
        ksq = tl.zeros([64], dtype=tl.float32)
        for kb in tl.static_range(0, BK, BC):
            ob = kb + tl.arange(0, BC)
            kt = tl.load(kbase + r64[:, None] * skt + ob[None, :], mask=_rowmask(m, ob, K, K == BK, BC), other=0.0)
            kt = kt.to(tl.float32)
            ksq += tl.sum(kt * kt, 1)
    rk = tl.where(l2norm != 0, 1.0 / tl.sqrt(ksq + 1e-6), 1.0)
    fk = bt * tl.exp(gam) * rk
    # the state update's row factors: S += K^T diag(fd) v' (key norm, decay to the chunk end)
    tl.store(fd_out + obase + r64 * HV, rk * tl.exp(g_last - gam), mask=m)
    if KONCE:
        wv = tl.dot(A, (kc * fk[:, None]).to(dt), input_precision=PREC)
        tl.store(w_out + obase * K + r64[:, None] * (HV * K) + oc[None, :], wv.to(dt), mask=mk)
    else:
        # the second pass: column blocks of at most 64 keep the live fp32 tiles small
        for kb in tl.static_range(0, BK, BC):
            oc = kb + tl.arange(0, BC)
            mk = _rowmask(m, oc, K, K == BK, BC)
            kc = tl.load(kbase + r64[:, None] * skt + oc[None, :], mask=mk, other=0.0).to(tl.float32)
            wv = tl.dot(A, (kc * fk[:, None]).to(dt), input_precision=PREC)
            off = r64[:, None] * (HV * K) + oc[None, :]
            tl.store(w_out + obase * K + off, wv.to(dt), mask=mk)
    for vb in tl.static_range(0, BVF, BCV):
        oc = vb + tl.arange(0, BCV)
        mv = _rowmask(m, oc, V, V == BVF, BCV)
        vv = tl.load(vbase + r64[:, None] * svt + oc[None, :], mask=mv, other=0.0).to(tl.float32)
        uv = tl.dot(A, (vv * bt[:, None]).to(dt), input_precision=PREC)
        tl.store(u_out + obase * V + r64[:, None] * (HV * V) + oc[None, :], uv.to(dt), mask=mv)


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


@triton.jit(do_not_specialize=["l2norm"])
def _output_kernel(
    q,
    k,
    gc,
    h,
    vn,
    o,
    chunk_info,
    seq_info,
    prog,
    scale,
    sqt,
    sqh,
    skt,
    skh,
    HV,
    GROUP,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    NVS: tl.constexpr,
    OVL: tl.constexpr,
    l2norm,
    PREC: tl.constexpr,
):
    if OVL:
        # a 1-d grid, chunk-major (a chunk's programs of every head are adjacent: the loop's
        # programs advance through the chunks together), and the programs wait until the loop's
        # programs of their head have released this chunk
        NVO: tl.constexpr = (V + BV - 1) // BV
        pid = tl.program_id(0)
        i_c = pid // (HV * NVO)
        i_hv = (pid // NVO) % HV
        i_v = pid % NVO
        c0 = tl.load(seq_info + tl.load(chunk_info + i_c * 4) * 4 + 2)
        pbase = prog + (c0 * HV + i_hv) * _PROG_SLOTS
        for j in tl.static_range(NVS):
            while tl.atomic_add(pbase + j, 0, sem="acquire", scope="gpu") <= i_c:
                pass
    else:
        i_c = tl.program_id(0)
        i_hv = tl.program_id(1)
        i_v = tl.program_id(2)
    i_h = i_hv // GROUP
    dt = vn.dtype.element_ty
    tstart, lo, hi = _chunk(chunk_info, i_c)
    r64 = tl.arange(0, 64)
    m = _inside(tstart, r64, lo, hi)
    t0 = tstart.to(tl.int64)
    row0 = t0 * HV + i_hv
    oV = i_v * BV + tl.arange(0, BV)
    mV = _rowmask(m, oV, V, V % BV == 0, BV)
    gam = tl.load(gc + row0 + r64 * HV, mask=m, other=0.0)
    qbase = q + t0 * sqt + i_h * sqh
    kbase = k + t0 * skt + i_h * skh
    hbase = h + (i_c * HV + i_hv).to(tl.int64) * (K * V)
    # Q K^T and Q h over K blocks of at most 64; the l2norm and the scale are applied to the
    # fp32 products afterwards, never to rounded copies of q / k
    qsq = tl.zeros([64], dtype=tl.float32)
    ksq = tl.zeros([64], dtype=tl.float32)
    P = tl.zeros([64, 64], dtype=tl.float32)
    qh = tl.zeros([64, BV], dtype=tl.float32)
    for kb in tl.static_range(0, BK, BC):
        oc = kb + tl.arange(0, BC)
        qc = tl.load(qbase + r64[:, None] * sqt + oc[None, :], mask=_rowmask(m, oc, K, K == BK, BC), other=0.0)
        kc = tl.load(kbase + r64[None, :] * skt + oc[:, None], mask=_colmask(m, oc, K, K == BK, BC), other=0.0)
        hc = tl.load(
            hbase + oc[:, None] * V + oV[None, :],
            mask=_dimmask(oc, K, K == BK, BC)[:, None] & _dimmask(oV, V, V % BV == 0, BV)[None, :],
            other=0.0,
            cache_modifier=".cg",  # L2: the overlapped loop writes it while this kernel runs
        )
        qf = qc.to(tl.float32)
        kf = kc.to(tl.float32)
        qsq += tl.sum(qf * qf, 1)
        ksq += tl.sum(kf * kf, 0)
        P += tl.dot(qc.to(dt), kc.to(dt), input_precision=PREC)
        qh += tl.dot(qc.to(dt), hc, input_precision=PREC)
    rq = tl.where(l2norm != 0, 1.0 / tl.sqrt(qsq + 1e-6), 1.0) * scale
    rk = tl.where(l2norm != 0, 1.0 / tl.sqrt(ksq + 1e-6), 1.0)
    causal = r64[:, None] >= r64[None, :]
    P = P * rq[:, None] * rk[None, :] * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], float("-inf")))
    off = r64[:, None] * (HV * V) + oV[None, :]
    vc = tl.load(vn + row0 * V + off, mask=mV, other=0.0, cache_modifier=".cg")
    acc = qh * (rq * tl.exp(gam))[:, None]
    acc += tl.dot(P.to(dt), vc, input_precision=PREC)
    tl.store(o + row0 * V + off, acc.to(o.dtype.element_ty), mask=mV)
    if OVL:
        # the grid's last program waits for the loop to complete (its final and boundary states
        # written), so that this kernel's completion, which the next work on the stream waits
        # for, implies the loop's
        if tl.program_id(0) == tl.num_programs(0) - 1:
            gdc_wait()


# ---- host path ---------------------------------------------------------------------------------
# A call's host time was ~200-500 us, most of it Triton's generic launch path run four times
# (argument binding and specialisation, cache-key hashing, launch metadata), ten scratch
# allocations and the argument bookkeeping. The first call of a "plan" (launch table, device,
# dtypes, head counts, strides, pointer alignments: all that Triton specialises a compiled kernel
# on) goes through Triton and keeps the four compiled kernels with their argument lists; later
# calls of the plan (one sequence batch, metadata prepared) gather each kernel's arguments from the
# per-call values (addresses, flags, scale) and the plan's fixed ones with one ``itemgetter`` and
# call Triton's C launcher directly (``_launch.raw_launcher``; ``ck.run`` where its form is not
# known). Scratch is one byte buffer: the kernels get addresses into it (Triton's launcher takes
# an int as a pointer). ``KERNELS_LAUNCH=triton`` turns the direct path off.

#: why a bf16 call is refused in the interpreter: its ``tl.dot`` multiplies bf16 operands' bit
#: patterns (outputs near 1e10 for values near 1; fp16 and fp32 are right)
INTERPRETER_BF16 = (
    "the Triton interpreter (TRITON_INTERPRET=1) computes bf16 matrix products wrongly "
    "(triton-lang/triton#11584); on a CPU pass fp16 or fp32 inputs"
)

#: byte offsets into the scratch buffer are multiples of this
_SCRATCH_ALIGN = 256
_DIRECT = os.environ.get("KERNELS_LAUNCH", "direct") != "triton"
_PLANS: dict = {}
_MAX_PLANS = 64
_RUNTIME: list = []  # [get_current_stream, knobs.runtime], resolved on first use
_KERNEL_KEYS = ("solve", "wu", "state", "out")
#: the arguments that change from call to call; every other argument is fixed by the plan key
_PER_CALL_ORDER = tuple(
    "q k v g beta A_log dt_bias a_out a_in gc_out gc gl_out gl w_out w u_out u fd_out fd h_out h vn_out vn prog o "
    "h0 ht hb has_h0 chunk_info seq_info store_slot scale l2norm".split()
)
_PER_CALL = frozenset(_PER_CALL_ORDER)
_PER_CALL_GETTER = operator.itemgetter(*_PER_CALL_ORDER)


#: the four kernels in launch order (their ``launch_params`` keys: ``_KERNEL_KEYS``)
_KERNELS = (_solve_kernel, _wu_kernel, _state_kernel, _output_kernel)
#: ... with the Gluon state loop (``launch_params(...)["state"]["GLUON"]``)
_KERNELS_GLUON = (_solve_kernel, _wu_kernel, _gluon_state_kernel, _output_kernel)
#: ... with the output inside the Gluon loop's program (``["state"]["FUSE"]``): three launches
_KERNELS_FUSED = (_solve_kernel, _wu_kernel, _gluon_fused_kernel)
#: each table with the Gluon solve first (``["solve"]["GLUON"]``)
_WITH_GLUON_SOLVE = {t: (_gluon_solve_kernel,) + t[1:] for t in (_KERNELS, _KERNELS_GLUON, _KERNELS_FUSED)}
#: the kernels whose compile failure falls back to the Triton table
_GLUON_KERNELS = tuple(fn for fn in (_gluon_solve_kernel, _gluon_state_kernel, _gluon_fused_kernel) if fn is not None)


def _kernel_fns(lp) -> tuple:
    """The kernels a launch table runs, in launch order (``_KERNEL_KEYS``' first ones)."""
    fns = (_KERNELS_FUSED if lp["state"]["FUSE"] else _KERNELS_GLUON) if lp["state"]["GLUON"] else _KERNELS
    return _WITH_GLUON_SOLVE[fns] if lp["solve"]["GLUON"] else fns


def _grids(lp, N, NT, HV, V) -> tuple:
    """Launch grids of the four kernels (plain integer ceilings: ``triton.cdiv`` is a constexpr
    function in triton 3.6, a few microseconds a call on the host path)."""
    nv_state = -(-V // lp["state"]["BV"])
    state = (N * HV * nv_state, 1, 1) if lp["state"]["VFAST"] else (N, HV, nv_state)
    solve = (NT, -(-HV // SOLVE_HEADS), 1) if lp["solve"]["GLUON"] else (NT, HV, 1)
    return (solve, (NT, HV, 1), state, _out_grid(lp["out"], NT, HV, V))


def _out_grid(out, NT, HV, V) -> tuple:
    """The output kernel's grid: 1-d and chunk-major where it overlaps the loop (``OVL``)."""
    nv_out = -(-V // out["BV"])
    return (NT * HV * nv_out, 1, 1) if out["OVL"] else (NT, HV, nv_out)


def _carve(sizes) -> tuple[list, int]:
    """Offsets of consecutive tensors of ``sizes`` bytes in one buffer, and its length."""
    offs, n = [], 0
    for size in sizes:
        offs.append(n)
        n += size + (-size % _SCRATCH_ALIGN)
    return offs, n


def _scratch_shapes(TT, NT, HV, K, V) -> tuple:
    """Shapes of the scratch tensors: input dtype (w, u, v', A, chunk-start states) and 4-byte
    (row factors, gate cumsum, chunk-end gate: fp32; the overlapped output's progress counters:
    int32), in the order ``_call_tuple`` takes them."""
    half = ((TT, HV, K), (TT, HV, V), (TT, HV, V), (NT, HV, 64, 64), (NT, HV, K, V))
    return half, ((TT, HV), (TT, HV), (NT, HV), (NT, HV, PROG_SLOTS))


@functools.lru_cache(maxsize=256)
def _scratch_layout(TT, NT, HV, K, V, itemsize: int) -> tuple[tuple, int]:
    """Byte offsets of ``_scratch_shapes`` (input dtype of ``itemsize`` bytes, then 4-byte) in one
    scratch buffer, and its length in bytes."""
    half, f32 = _scratch_shapes(TT, NT, HV, K, V)
    offs, n = _carve([math.prod(x) * itemsize for x in half] + [math.prod(x) * 4 for x in f32])
    return tuple(offs), n  # cached: immutable


def _call_tuple(inputs, gate, scratch, states, meta, scale, l2norm: int, has_h0: int) -> tuple:
    """The per-call arguments in ``_PER_CALL_ORDER`` (the direct path's form): ``inputs`` (q, k,
    v, g, beta), ``gate`` (A_log, dt_bias), ``scratch`` (w, u, v', A, chunk-start states, row
    factors, gate cumsum, chunk-end gate, progress counters; a writer's ``*_out`` and its readers'
    name are one buffer), ``states`` (o, h0, ht, hb; h0 and hb stand in
    with ht when absent), ``meta`` (the metadata's chunk_info, seq_info, store_slot): tensors, or
    device addresses on the direct path."""
    return (*inputs, *gate, *_scratch_args(*scratch), *states, has_h0, *meta, float(scale), l2norm)


def _scratch_args(w, u, vn, A, hbuf, fd, gcum, glast, prog) -> tuple:
    """The scratch buffers in ``_PER_CALL_ORDER``'s 17 places (a writer's ``*_out`` and its
    readers' name are one buffer)."""
    return (A, A, gcum, gcum, glast, glast, w, w, u, u, fd, fd, hbuf, hbuf, vn, vn, prog)


def _call_args(*args) -> dict:
    """``_call_tuple``'s values by name (Triton's launch path binds arguments by name)."""
    return dict(zip(_PER_CALL_ORDER, _call_tuple(*args)))


def _runtime():
    if not _RUNTIME:
        from triton import knobs
        from triton.runtime.driver import driver

        _RUNTIME.extend([driver.active.get_current_stream, knobs.runtime])
    return _RUNTIME


def _hooks_active(rt) -> bool:
    """A launch hook is installed (a profiler): it wants Triton's launch metadata, so use its path."""
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook  # no generator: this runs every call
    return bool(getattr(enter, "calls", enter is not None)) or bool(getattr(exit_, "calls", exit_ is not None))


def _addresses(q, k, v, g, beta, h0=None, a_log=None, dt_bias=None) -> tuple:
    """The device addresses of a call's inputs (0 for None), read once: the plan key takes their
    alignment, the direct path's launches the addresses themselves."""
    return tuple(0 if t is None else t.data_ptr() for t in (q, k, v, g, beta, h0, a_log, dt_bias))


def _plan_key(lp, dev, dt, hb_dtype, H, HV, use_gate, beta_sig, q, k, v, g, beta, ptrs) -> tuple:
    """Everything the four compiled kernels of a one-batch call depend on: the launch table
    (constexprs and launch options, by identity), device, dtypes (``hb_dtype`` None: no boundary
    stores, the state loop's ``STORE_B``), head counts (Triton specialises ints on == 1 and
    divisibility by 16; the state loop takes them as constants), the strides the kernels take
    (one batch: the batch stride is never read), and the 16-byte alignment of every pointer that is not a fresh
    allocation (scratch and outputs always are): ``ptrs``, from ``_addresses``."""
    return (
        id(lp), dev.index, dt, hb_dtype, H, HV, bool(use_gate), bool(beta_sig),
        q.stride()[1:], k.stride()[1:], v.stride()[1:], g.stride()[1:], beta.stride()[1:], g.dtype, beta.dtype,
        *(p % 16 == 0 for p in ptrs),
    )  # fmt: skip


class _Plan:
    """One plan: per kernel, its launch function (``raw_launcher``, or ``ck.run`` bound to the
    kernel) and an ``itemgetter`` that picks the kernel's arguments, in order, out of the per-call
    values (``_PER_CALL_ORDER``) followed by the plan's fixed values (``fixed``)."""

    __slots__ = ("launches", "getters", "fixed", "lp")

    def __init__(self, launches, getters, fixed, lp):
        self.launches, self.getters, self.fixed, self.lp = launches, getters, fixed, lp


def _run_launch(ck):
    """``launch(gx, gy, gz, stream, args)`` through Triton's launcher wrapper ``ck.run``."""
    run, fn, meta = ck.run, ck.function, ck.packed_metadata

    def launch(gx, gy, gz, stream, args):
        run(gx, gy, gz, stream, fn, meta, None, None, None, *args)

    return launch


def _remember_plan(compiled, fns, lists, lp, key) -> None:
    if not all(hasattr(ck, "run") and hasattr(ck, "function") and hasattr(ck, "packed_metadata") for ck in compiled):
        return
    index = {name: i for i, name in enumerate(_PER_CALL_ORDER)}
    fixed, getters = [], []
    for fn, args in zip(fns, lists):
        picks = []
        for name, arg in zip(fn.arg_names, args):
            if name in index:
                picks.append(index[name])
            elif torch.is_tensor(arg):  # a buffer missing from _PER_CALL: never cache it
                return
            else:
                picks.append(len(_PER_CALL_ORDER) + len(fixed))
                fixed.append(arg)
        getters.append(operator.itemgetter(*picks))
    launches = tuple(raw_launcher(ck) or _run_launch(ck) for ck in compiled)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = _Plan(launches, tuple(getters), tuple(fixed), lp)


#: byte alignment of a caller's ``workspace`` on a GPU (the scratch layout aligns every tensor to it)
WORKSPACE_ALIGN = 256


def workspace_bytes(q, v, chunk_metadata: ChunkMetadata) -> int:
    """Bytes of scratch one call of ``chunk_gated_delta_rule`` on these inputs and metadata uses:
    the least ``numel`` of a ``workspace`` (uint8) that a caller keeps and passes to every call, so
    that a call allocates no scratch of its own."""
    B, T = q.shape[0], q.shape[1]
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    return _scratch_layout(B * T, chunk_metadata.num_chunks, HV, K, V, q.element_size())[1]


def _device_index(dev) -> int:
    """``Tensor.get_device()`` of a tensor on ``dev`` (-1 on a CPU)."""
    return -1 if dev.type == "cpu" else dev.index


def _workspace_align(dev) -> int:
    """The byte alignment a caller's workspace needs: a GPU's allocations are 512-byte aligned, a
    CPU's (the interpreter's) 64."""
    return WORKSPACE_ALIGN if dev.type == "cuda" else 16


def _fits(t, shape, dtype, index: int, align: int) -> bool:
    """Whether a caller's buffer can be written as is: ``shape``, ``dtype``, on the device of
    ``Tensor.get_device()`` ``index``, contiguous, its address ``align``-byte aligned (the compiled
    kernels take outputs and scratch as aligned fresh allocations). The one rule of both paths:
    ``_given`` says what is wrong where it fails, the bound call falls back to it."""
    return (
        t.shape == shape
        and t.dtype == dtype
        and t.get_device() == index
        and t.is_contiguous()
        and not t.data_ptr() % align
    )


def _given(name: str, t, shape: tuple, dtype, dev, align: int = 16):
    """A caller's preallocated buffer, checked (``_fits``); one-line ValueError naming it."""
    if _fits(t, shape, dtype, _device_index(dev), align):
        return t
    if t.shape != shape or t.dtype != dtype or t.device != dev:
        raise ValueError(f"{name} must be {shape} {dtype} on {dev}, got {tuple(t.shape)} {t.dtype} on {t.device}")
    if not t.is_contiguous() or t.data_ptr() % align:
        raise ValueError(f"{name} must be contiguous and {align}-byte aligned (a fresh allocation is)")
    return t


def _buffers(
    out, final_state_out, boundary_out, workspace, *, B, T, N, NB, HV, K, V, dt, state_dtype, store_b, dev, nbytes
):
    """``(o [B*T, HV, V], ht, hb or None, scratch uint8 [nbytes])``: the caller's buffers where
    given (checked: ``out`` [B, T, HV, V] in the inputs' dtype, ``final_state_out`` [N, HV, K, V]
    fp32, ``boundary_out`` [NB, HV, K, V] in ``state_dtype``, ``workspace`` uint8 of at least
    ``nbytes``), fresh allocations otherwise."""
    if out is None:
        o = torch.empty(B * T, HV, V, dtype=dt, device=dev)
    else:
        o = _given("out", out, (B, T, HV, V), dt, dev).view(B * T, HV, V)
    if final_state_out is None:
        ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    else:
        ht = _given("final_state_out", final_state_out, (N, HV, K, V), torch.float32, dev)
    hb = None
    if store_b:
        if boundary_out is None:
            hb = torch.empty(NB, HV, K, V, dtype=state_dtype, device=dev)
        else:
            hb = _given("boundary_out", boundary_out, (NB, HV, K, V), state_dtype, dev)
    if workspace is None:
        return o, ht, hb, torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if workspace.dim() != 1 or workspace.numel() < nbytes:
        raise ValueError(
            f"workspace must be 1-d uint8 with at least {nbytes} elements (kernels.workspace_bytes), "
            f"got {tuple(workspace.shape)}"
        )
    return o, ht, hb, _given("workspace", workspace, tuple(workspace.shape), torch.uint8, dev, _workspace_align(dev))


def _fp32_vector(x, dev) -> bool:
    return x is not None and x.dtype == torch.float32 and x.is_contiguous() and x.device == dev


def _direct_call(
    q, k, v, g, beta, scale, initial_state, store_b, state_dtype, meta, l2norm, lp, gate, beta_sig, given,
    input_precision=None,
):  # fmt: skip
    """The call on a remembered plan, launched directly; None where no plan applies. ``gate``:
    (A_log, dt_bias) fp32 for the in-kernel gate, or None; ``given``: the caller's buffers
    (out, final_state_out, boundary_out, workspace; each None or a tensor); ``lp``: the launch
    table for this call's shapes and ``input_precision``. Binds the call to ``meta``
    (``_Bound``) so that the next call of this layout on it skips the launch table and plan key."""
    H, HV = q.shape[2], v.shape[2]
    dt, dev = q.dtype, q.device
    # None: the state loop compiled without boundary stores (``STORE_B``)
    hb_dtype = state_dtype if store_b and meta.num_boundaries > 0 else None
    a_log, dt_bias = gate if gate is not None else (None, None)
    # every address read once: the plan key's alignments and the launches' arguments (Triton's
    # launcher takes an int as is; a tensor costs it a data_ptr call and a driver query per kernel)
    ptrs = _addresses(q, k, v, g, beta, initial_state, a_log, dt_bias)
    key = _plan_key(lp, dev, dt, hb_dtype, H, HV, gate is not None, beta_sig, q, k, v, g, beta, ptrs)
    plan = _PLANS.get(key)
    rt = _runtime()
    if plan is None or plan.lp is not lp or _hooks_active(rt[1]):
        return None
    options = _bound_key(scale, l2norm, store_b, state_dtype, gate is not None, beta_sig, dt, input_precision)
    bound = _Bound(plan, options, q, k, v, g, beta, scale, store_b, state_dtype, meta, l2norm)
    if all(p % 16 == 0 for p in ptrs):  # the bound check takes every pointer as aligned
        meta.calls[options] = bound
    return bound.launch(rt, ptrs, initial_state is not None, given)


def _bound_key(scale: float, l2norm: int, store_b: bool, state_dtype, use_gate: bool, beta_sig: bool, dtype,
               input_precision) -> tuple:  # fmt: skip
    """The key of a bound call in ``ChunkMetadata.calls``: the call's options and everything that
    picks its launch table besides what the bound call checks itself (shapes, device): the
    inputs' dtype, the fp32 precision, the ``KERNELS_CONFIG_*`` values now, and whether a Gluon
    compile has failed in this process (the table then has no Gluon kernels). A few hundred
    nanoseconds, where building the table and the plan key costs a call several microseconds."""
    return (
        scale, l2norm, store_b, state_dtype, use_gate, beta_sig, dtype, input_precision, _config_envs(),
        bool(_GLUON_FAILED),
    )  # fmt: skip


class _Bound:
    """A call layout bound to one chunk metadata (``ChunkMetadata.calls``, keyed by
    ``_bound_key``): the plan, grids, scratch layout and launch values fixed for every call of
    this layout on the metadata, as a model step's layers make them. ``run`` checks that a call
    has the bound layout (shapes, strides, dtypes, device, aligned addresses: with the key,
    everything the launch table and plan key hold) and launches it; None sends the call to the
    full path instead."""

    __slots__ = (
        "plan", "lp", "options", "layout", "dtypes", "dev", "index", "h0_shape", "grids", "nbytes", "out_shapes",
        "state_dtype", "store_b", "store", "scratch_offs", "fd_off", "tail", "empties", "ws_align",
    )  # fmt: skip

    def __init__(self, plan, options, q, k, v, g, beta, scale, store_b, state_dtype, meta, l2norm):
        _, T, _, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        N, NT = meta.num_seqs, meta.num_chunks
        self.plan, self.lp, self.options = plan, plan.lp, options
        self.dtypes = (q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
        self.dev = q.device
        self.index = q.get_device()  # -1 on a CPU (the stand-in tests), the CUDA index otherwise
        self.ws_align = _workspace_align(self.dev)
        # what ``run`` compares a call's inputs with, in one tuple: shapes, strides, dtypes, devices
        self.layout = (
            q.shape, k.shape, v.shape, g.shape, beta.shape, q.stride(), k.stride(), v.stride(), g.stride(),
            beta.stride(), *self.dtypes, *(self.index,) * 5,
        )  # fmt: skip
        self.h0_shape = (N, HV, K, V)
        self.grids = _grids(self.lp, N, NT, HV, V)
        offs, self.nbytes = _scratch_layout(T, NT, HV, K, V, q.element_size())
        # the scratch tensors' offsets in their 17 argument places, and the chunk-end factors' (the
        # stand-in for absent gate parameters: any fp32 buffer, never read)
        self.scratch_offs, self.fd_off = _scratch_args(*offs), offs[5]
        self.out_shapes = ((1, T, HV, V), (N, HV, K, V), (meta.num_boundaries, HV, K, V))
        # ``store_b``: the call returns boundary states; ``store``: it has any to store
        self.state_dtype, self.store_b, self.store = state_dtype, store_b, store_b and meta.num_boundaries > 0
        # empty tensors of the outputs' and the scratch's dtypes on the device: ``new_empty`` of
        # one allocates without parsing a dtype and a device (H200 host: 3.1 us a tensor against
        # 4.9 for ``torch.empty(shape, dtype=, device=)``, medians of 15 runs; the CPU shows no
        # difference)
        self.empties = tuple(
            torch.empty(0, dtype=t, device=self.dev) for t in (q.dtype, torch.float32, state_dtype, torch.uint8)
        )
        # the per-call values after has_h0 (metadata addresses, scale, l2norm), then the plan's own
        self.tail = (
            meta.chunk_info.data_ptr(), meta.seq_info.data_ptr(), meta.store_slot.data_ptr(), float(scale), l2norm,
        ) + plan.fixed  # fmt: skip

    def run(self, q, k, v, g, beta, initial_state, gate, given):
        """The call if it has the bound layout (launched; ``(o, ht, hb)``), else None."""
        if (
            q.shape, k.shape, v.shape, g.shape, beta.shape, q.stride(), k.stride(), v.stride(), g.stride(),
            beta.stride(), q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype, q.get_device(), k.get_device(),
            v.get_device(), g.get_device(), beta.get_device(),
        ) != self.layout:  # fmt: skip
            return None
        h0 = 0
        if initial_state is not None:
            if not (
                initial_state.dtype == torch.float32
                and initial_state.is_contiguous()
                and initial_state.get_device() == self.index
                and initial_state.shape == self.h0_shape
            ):
                return None
            h0 = initial_state.data_ptr()
        a, d = 0, 0
        if gate is not None:
            a_log, dt_bias, index = gate[0], gate[1], self.index
            if not (
                a_log is not None
                and dt_bias is not None
                and a_log.dtype == dt_bias.dtype == torch.float32
                and a_log.is_contiguous()
                and dt_bias.is_contiguous()
                and a_log.get_device() == dt_bias.get_device() == index
            ):
                return None
            a, d = a_log.data_ptr(), dt_bias.data_ptr()
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), h0, a, d)
        rt = _runtime()
        if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | h0 | a | d) & 15 or _hooks_active(rt[1]):
            return None
        return self.launch(rt, ptrs, initial_state is not None, given)

    def _given(self, given) -> tuple:
        """The caller's four buffers where all are given and fit this layout (``_fits``), else
        four Nones (``_buffers`` then allocates the missing ones, or says in one line what is
        wrong with one)."""
        out, final_state_out, boundary_out, workspace = given
        index, (o_shape, ht_shape, hb_shape) = self.index, self.out_shapes
        if (
            out is not None
            and final_state_out is not None
            and workspace is not None
            and _fits(out, o_shape, self.dtypes[0], index, 16)
            and _fits(final_state_out, ht_shape, torch.float32, index, 16)
            and workspace.dim() == 1
            and workspace.numel() >= self.nbytes
            and _fits(workspace, workspace.shape, torch.uint8, index, self.ws_align)
        ):
            if not self.store_b:
                return out, final_state_out, None, workspace
            if boundary_out is not None and _fits(boundary_out, hb_shape, self.state_dtype, index, 16):
                return out, final_state_out, boundary_out, workspace
        return None, None, None, None

    def launch(self, rt, ptrs, has_h0: bool, given):
        """Allocate (or check the caller's buffers), then the plan's launches on the current
        stream. ``ptrs``: the addresses of q, k, v, g, beta, the initial state, A_log, dt_bias
        (0: absent)."""
        dev, (o_shape, ht_shape, hb_shape) = self.dev, self.out_shapes
        if given is None:  # the common call: ``_buffers``'s fresh allocations, without its call and checks
            e_o, e_f32, e_state, e_u8 = self.empties
            o = e_o.new_empty(o_shape)
            ht = e_f32.new_empty(ht_shape)
            hb = e_state.new_empty(hb_shape) if self.store_b else None
            scratch = e_u8.new_empty(self.nbytes)
        else:
            o, ht, hb, scratch = self._given(given)
        if o is None:
            o, ht, hb, scratch = _buffers(
                *given, B=1, T=o_shape[1], N=ht_shape[0], NB=hb_shape[0], HV=o_shape[2], K=ht_shape[2],
                V=o_shape[3], dt=self.dtypes[0], state_dtype=self.state_dtype, store_b=self.store_b, dev=dev,
                nbytes=self.nbytes,
            )  # fmt: skip
            o = given[0] if given[0] is not None else o.view(o_shape)
        # ``scratch`` lives until the launches are issued: no allocation (another thread's on this
        # stream) can take its block before them
        base = scratch.data_ptr()
        ht_ptr = ht.data_ptr()
        fd = base + self.fd_off
        vals = (
            ptrs[:5]
            + ((ptrs[6], ptrs[7]) if ptrs[6] else (fd, fd))
            + tuple(map(base.__add__, self.scratch_offs))
            + (o.data_ptr(), ptrs[5] or ht_ptr, ht_ptr, hb.data_ptr() if self.store else ht_ptr, int(has_h0))
            + self.tail
        )
        stream = rt[0](dev.index)
        plan = self.plan
        for launch, grid, getter in zip(plan.launches, self.grids, plan.getters):
            launch(*grid, stream, getter(vals))
        return o, ht, hb


#: the Gluon kernels copy query / key rows by ``cp.async`` in 16-byte pieces: a row must start on
#: a 16-byte boundary, which they can only prove where the pointer is 16-byte aligned and the
#: token and head strides are multiples of this many elements (Triton's integer specialisation)
GLUON_STRIDE = 16


def _rows(x: torch.Tensor, TT: int, heads: int, dim: Optional[int], aligned: bool = False):
    """Flatten [B, T, heads(, dim)] to [B*T, heads(, dim)] without copying when strides allow.
    ``aligned``: also copy where the rows' starts are not provably 16-byte aligned (pointer or
    token / head stride; ``GLUON_STRIDE``), which the Gluon kernels cannot compile for (a padded
    fused-projection row, say): one copy of this input instead of the process falling back to the
    Triton kernels for good."""
    shape = (TT, heads) if dim is None else (TT, heads, dim)
    x = x.reshape(shape)
    if dim is not None and x.stride(2) != 1:
        x = x.contiguous()
    elif (
        dim is not None and aligned and (x.stride(0) % GLUON_STRIDE or x.stride(1) % GLUON_STRIDE or x.data_ptr() % 16)
    ):
        x = x.clone(memory_format=torch.contiguous_format)  # a fresh allocation: aligned (contiguous() may not copy)
    return x


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    cu_seqlens=None,
    start_positions=None,
    use_qk_l2norm=False,
    boundary_states=True,
    state_dtype=torch.float32,
    boundary_stride=1,
    boundary_indices=None,
    A_log=None,
    dt_bias=None,
    use_gate_in_kernel=False,
    use_beta_sigmoid=False,
    chunk_metadata: Optional[ChunkMetadata] = None,
    input_precision: Optional[str] = None,
    out=None,
    final_state_out=None,
    boundary_out=None,
    workspace=None,
):
    """Chunked gated-delta-rule forward.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g (natural-log decay, or the raw ``a`` when
    ``use_gate_in_kernel``) and beta (or its logit when ``use_beta_sigmoid``) ``[B, T, HV]``.
    K and V may be any size up to 256. Varlen: ``B == 1`` and ``cu_seqlens``. Batched inputs
    (B > 1) are treated as B sequences.

    Returns ``(o [B, T, HV, V], final_state [N, HV, K, V] fp32, boundary_states)`` where
    ``boundary_states`` is ``[NB, HV, K, V]`` in ``state_dtype`` (None when
    ``boundary_states=False``): the state after every emitted absolute 64-multiple position,
    sequence-major (sequence n owns rows ``meta.boundary_offsets[n]:[n+1]``, positions in
    ``meta.boundary_positions[n]``). With ``chunk_metadata`` given (see ``prepare_chunk_metadata``)
    the call does no device-to-host sync and the metadata's boundary selection is used.
    ``input_precision`` applies to fp32 inputs on GPU: "tf32x3" (the default, ``FP32_PRECISION``:
    fp32's accuracy on tensor cores), "ieee" (FMA products, 14x slower on an H200), "tf32".

    Preallocated buffers (a caller that keeps them allocates nothing per call): ``out`` ``[B, T,
    HV, V]`` in q's dtype, ``final_state_out`` ``[N, HV, K, V]`` fp32, ``boundary_out`` ``[NB, HV,
    K, V]`` in ``state_dtype``, each contiguous and 16-byte aligned, returned as given (written);
    ``workspace``: 1-d uint8 of at least ``workspace_bytes(q, v, chunk_metadata)`` elements,
    256-byte aligned, the call's scratch (free again when the call's kernels have run on its
    stream). A wrong buffer is a one-line ValueError.
    """
    given = (
        None
        if out is None and final_state_out is None and boundary_out is None and workspace is None
        else (out, final_state_out, boundary_out, workspace)
    )
    if _DIRECT and chunk_metadata is not None and chunk_metadata.calls:
        # a layout this metadata has run before (the model step's earlier layers): its bound call
        # checks the layout and launches, instead of the checks, launch table and plan key below
        bound = chunk_metadata.calls.get(
            _bound_key(
                q.shape[-1] ** -0.5 if scale is None else scale, int(bool(use_qk_l2norm)), bool(boundary_states),
                state_dtype, bool(use_gate_in_kernel), bool(use_beta_sigmoid), q.dtype, input_precision,
            )
        )  # fmt: skip
        if bound is not None:
            res = bound.run(q, k, v, g, beta, initial_state, (A_log, dt_bias) if use_gate_in_kernel else None, given)
            if res is not None:
                return res
    check_args(q, k, v, g, beta, state_dtype=state_dtype)
    if INTERPRET and q.dtype == torch.bfloat16:
        raise ValueError(INTERPRETER_BF16)
    if (
        _DIRECT
        and chunk_metadata is not None
        and q.is_cuda
        and not INTERPRET
        and (not use_gate_in_kernel or (_fp32_vector(A_log, q.device) and _fp32_vector(dt_bias, q.device)))
        and chunk_metadata.chunk_info.device == q.device  # the direct path passes bare addresses
        and q.shape[0] == 1
        and chunk_metadata.num_chunks > 0
        and chunk_metadata.total_tokens == q.shape[1]
        and k.dtype == v.dtype == q.dtype
        and q.stride(3) == k.stride(3) == v.stride(3) == 1
        and (
            initial_state is None
            or (
                initial_state.dtype == torch.float32
                and initial_state.is_contiguous()
                and initial_state.device == q.device
                and tuple(initial_state.shape) == (chunk_metadata.num_seqs, v.shape[2], q.shape[3], v.shape[3])
            )
        )
    ):
        K, HV, V = q.shape[3], v.shape[2], v.shape[3]
        res = _direct_call(
            q, k, v, g, beta, K**-0.5 if scale is None else scale, initial_state, bool(boundary_states), state_dtype,
            chunk_metadata, int(bool(use_qk_l2norm)),
            launch_params(
                K, V, q.dtype, input_precision, state_wide(chunk_metadata.num_seqs, HV, V, q.device),
                gluon_device(q.device),
            ),
            (A_log, dt_bias) if use_gate_in_kernel else None, bool(use_beta_sigmoid), given, input_precision,
        )  # fmt: skip
        if res is not None:
            return res
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    meta = resolve_call(
        q,
        v,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        start_positions=start_positions,
        boundary_stride=boundary_stride,
        boundary_indices=boundary_indices,
        chunk_metadata=chunk_metadata,
        use_gate_in_kernel=use_gate_in_kernel,
        A_log=A_log,
        dt_bias=dt_bias,
    )
    dev = q.device
    dt = q.dtype
    if k.dtype != dt or v.dtype != dt:
        k, v = k.to(dt), v.to(dt)
    if scale is None:
        scale = K**-0.5
    N, TT, NT = meta.num_seqs, B * T, meta.num_chunks
    # the queries and keys the Gluon kernels copy by cp.async (solve and loop: keys; the fused loop:
    # queries too) on rows they can prove aligned
    aligned = K == GLUON_K and torch.finfo(dt).bits == 16 and gluon_device(dev)
    q2, k2 = _rows(q, TT, H, K, aligned), _rows(k, TT, H, K, aligned)
    v2 = _rows(v, TT, HV, V)
    g2, b2 = _rows(g, TT, HV, None), _rows(beta, TT, HV, None)
    store_b = bool(boundary_states)
    offs, nbytes = _scratch_layout(TT, NT, HV, K, V, q.element_size())
    o, ht, hb, scratch = _buffers(
        out, final_state_out, boundary_out, workspace, B=B, T=T, N=N, NB=meta.num_boundaries, HV=HV, K=K, V=V,
        dt=dt, state_dtype=state_dtype, store_b=store_b, dev=dev, nbytes=nbytes,
    )  # fmt: skip
    h0 = initial_state.float().contiguous() if initial_state is not None else ht
    if NT == 0:
        if N > 0:
            ht.copy_(h0) if initial_state is not None else ht.zero_()
        return (o.reshape(B, T, HV, V) if out is None else out), ht, hb
    if use_gate_in_kernel:
        A_log_t, dt_bias_t = A_log.float().contiguous(), dt_bias.float().contiguous()
    wide = state_wide(N, HV, V, dev)
    lp = launch_params(K, V, dt, input_precision, wide, gluon_device(dev))
    half_shapes, f32_shapes = _scratch_shapes(TT, NT, HV, K, V)
    w, u, vn, A, hbuf, fd, gcum, glast, prog = (
        scratch[off : off + math.prod(shape) * t.itemsize].view(t).view(shape)
        for off, shape, t in zip(offs, half_shapes + f32_shapes, (dt,) * 5 + (torch.float32,) * 3 + (torch.int32,))
    )
    if not use_gate_in_kernel:
        A_log_t = dt_bias_t = fd  # never read; any fp32 tensor stands in
    store = store_b and meta.num_boundaries > 0
    hb_arg = hb if store else ht
    # runtime arguments, by the names the four kernels share (a name is one buffer in all of them)
    shared = dict(
        _call_args(
            (q2, k2, v2, g2, b2),
            (A_log_t, dt_bias_t),
            (w, u, vn, A, hbuf, fd, gcum, glast, prog),
            (o, h0, ht, hb_arg),
            (meta.chunk_info, meta.seq_info, meta.store_slot),
            scale,
            int(bool(use_qk_l2norm)),
            int(initial_state is not None),
        ),
        STORE_B=store,
        HV=HV,
        GROUP=HV // H,
        PAIR=(HV // H) % 2 == 0,  # the Gluon solve's two value heads share a key head
        skt=k2.stride(0),
        skh=k2.stride(1),
        sqt=q2.stride(0),
        sqh=q2.stride(1),
        svt=v2.stride(0),
        svh=v2.stride(1),
        sgt=g2.stride(0),
        sgh=g2.stride(1),
        sbt=b2.stride(0),
        sbh=b2.stride(1),
        USE_GATE=bool(use_gate_in_kernel),
        BETA_SIGMOID=bool(use_beta_sigmoid),
        WHILE_LOOP=INTERPRET,
    )
    fns = _kernel_fns(lp)
    compiled, lists = [], []
    grids = _grids(lp, N, NT, HV, V)
    fallback = False  # a Gluon kernel failed to compile
    i = 0
    while i < len(fns):  # where a Gluon kernel falls back, the table changes and i restarts
        fn, grid, name = fns[i], grids[i], _KERNEL_KEYS[i]
        i += 1
        vals = {**shared, **lp[name]}
        opts = {key: val for key, val in lp[name].items() if key in LAUNCH_OPTIONS}
        args = [vals[n] for n in fn.arg_names]
        try:
            ck = fn[grid](*args, **opts)
        except Exception as exc:  # noqa: BLE001 - any compile error of a Gluon kernel: fall back
            if fn not in _GLUON_KERNELS:
                raise
            # a Triton whose Gluon API differs from the one these kernels were written for: warn
            # once and never try Gluon again here
            first = (str(exc).strip().splitlines() or [""])[-1]
            what = "solve" if fn is _gluon_solve_kernel else "state loop"
            warnings.warn(
                f"the Gluon {what} did not compile ({type(exc).__name__}: {first}); using the Triton kernels",
                stacklevel=2,
            )
            _GLUON_FAILED.append(exc)
            # the call again from its first kernel on the table without Gluon, so that it has the
            # bits of every later call (a Gluon solve that ran before a failed Gluon loop would
            # not: its A differs in the last place); every kernel writes only scratch and
            # outputs, so what ran is overwritten. The output runs after the loop (``OVL`` 0)
            lp, fns, fallback = launch_params(K, V, dt, input_precision, wide, False), _KERNELS, True
            grids, compiled, lists, i = _grids(lp, N, NT, HV, V), [], [], 0
            continue
        lists.append(args)
        compiled.append(ck)
    # remembered only where the kernels saw the 4-d inputs themselves: their token / head strides
    # (what the key holds) and their addresses (not a copy, ``_rows``: the key holds the inputs'
    # alignment, and a kernel compiled for an aligned copy must not get the unaligned input)
    same_strides = all(
        x2.stride() == x.stride()[1 : 1 + x2.dim()] and x2.data_ptr() == x.data_ptr()
        for x2, x in ((q2, q), (k2, k), (v2, v), (g2, g), (b2, beta))
    )
    if _DIRECT and dev.type == "cuda" and not INTERPRET and B == 1 and same_strides and not fallback:
        _remember_plan(
            compiled,
            fns,
            lists,
            lp,
            _plan_key(
                lp,
                dev,
                dt,
                state_dtype if store else None,
                H,
                HV,
                use_gate_in_kernel,
                use_beta_sigmoid,
                q,
                k,
                v,
                g,
                beta,
                _addresses(
                    q,
                    k,
                    v,
                    g,
                    beta,
                    initial_state,
                    A_log_t if use_gate_in_kernel else None,
                    dt_bias_t if use_gate_in_kernel else None,
                ),
            ),
        )
    return (o.reshape(B, T, HV, V) if out is None else out), ht, hb
