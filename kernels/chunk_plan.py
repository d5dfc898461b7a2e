"""Launch planning of the chunked gated delta rule: the four kernels' launch configurations
(``CONFIGS``, ``KERNELS_CONFIG_*``), the launch table of a shape (``launch_params``: constexprs,
launch options, the Gluon choices), which kernels a table runs and their grids, the scratch
layout, and the per-call argument names. Host code only: no launches, no process state but the
caches and ``_GLUON_FAILED``."""

from __future__ import annotations

import functools
import inspect
import math
import os
from typing import Optional

import torch
import triton

from kernels._common import INTERPRET
from kernels.chunk_output import _output_kernel
from kernels.chunk_prepare import _wu_kernel
from kernels.chunk_solve import _solve_kernel
from kernels.chunk_state import _state_kernel
from kernels.fused_gluon import _gluon_fused_kernel
from kernels.solve_gluon import HEADS as SOLVE_HEADS
from kernels.solve_gluon import SOLVE_WARPS, _gluon_solve_kernel
from kernels.solve_gluon import applies as _gluon_solve_applies
from kernels.state_gluon import PROG_SLOTS, _gluon_state_kernel
from kernels.state_gluon import applies as _gluon_applies

# Launch configurations (fixed, no autotuning: every new shape would otherwise re-benchmark
# the candidates, which dominates the cold start of a replay). ``BV`` is the V block of the
# state and output kernels; it is clamped to the padded V. Overridable for experiments, e.g.
# KERNELS_CONFIG_STATE="BV=32,num_warps=4,num_stages=2".
CONFIGS = {
    "solve": dict(num_warps=2, num_stages=1, TRANS=1, BKS=64, TF32M=0, GLUON=1),
    "wu": dict(num_warps=4, num_stages=1, BCV=128, KONCE=1),
    "state": dict(BV=16, num_warps=4, num_stages=3, VFAST=1, GLUON=1, SIG=16, FUSE=0),
    "out": dict(BV=128, num_warps=4, num_stages=2, OVL=1, DISCARD=0),
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
    # the output dropping its scratch's L2 lines after their one read (``DISCARD``, opt-in), on a GPU
    out["DISCARD"] = int(bool(out["DISCARD"]) and gluon and discard_applies(K, V, out["BV"], bits))
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


def discard_applies(K: int, V: int, BV: int, bits: int) -> bool:
    """Whether the output kernel can drop its chunk-start state's and v' rows' L2 lines after its
    read (``DISCARD``): one program reads a whole V (its block ``BV``), K and V are powers of two
    (no padding) and a row is whole 128-byte lines in ``bits``-bit elements."""
    return BV == V == _pow2(V) and K == _pow2(K) and (V * bits // 8) % 128 == 0


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


#: byte offsets into the scratch buffer are multiples of this
_SCRATCH_ALIGN = 256
_KERNEL_KEYS = ("solve", "wu", "state", "out")

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

#: the kernel arguments a plan fixes (its key holds them): the head counts and the inputs' token /
#: head strides
PLAN_FIXED = frozenset({"HV", "GROUP"} | {f"s{x}{d}" for x in "qkvgb" for d in "th"})


def _runtime_args(fn) -> tuple:
    """``fn``'s arguments that are not compile-time constants, in its signature's order (a compiled
    kernel's ``params``; the interpreter's kernel: the Python function's annotations)."""
    params = getattr(fn, "params", None)
    if params is not None:
        return tuple(p.name for p in params if not p.is_constexpr)
    sig = inspect.signature(fn.fn)
    return tuple(name for name, p in sig.parameters.items() if "constexpr" not in str(p.annotation))


#: the arguments that change from call to call, read off the kernels' own signatures: every
#: argument of a kernel of any table that is neither a compile-time constant nor fixed by the plan,
#: in launch order. A plan's launches take these from each call, every other argument from the call
#: that made the plan; ``_call_args`` gives their values by name, ``chunk_launch`` places them
_PER_CALL_ORDER = tuple(
    dict.fromkeys(name for fn in _KERNELS + _GLUON_KERNELS for name in _runtime_args(fn) if name not in PLAN_FIXED)
)
_PER_CALL = frozenset(_PER_CALL_ORDER)


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
    int32), in the order of ``SCRATCH_ARGS``."""
    half = ((TT, HV, K), (TT, HV, V), (TT, HV, V), (NT, HV, 64, 64), (NT, HV, K, V))
    return half, ((TT, HV), (TT, HV), (NT, HV), (NT, HV, PROG_SLOTS))


@functools.lru_cache(maxsize=256)
def _scratch_layout(TT, NT, HV, K, V, itemsize: int) -> tuple[tuple, int]:
    """Byte offsets of ``_scratch_shapes`` (input dtype of ``itemsize`` bytes, then 4-byte) in one
    scratch buffer, and its length in bytes."""
    half, f32 = _scratch_shapes(TT, NT, HV, K, V)
    offs, n = _carve([math.prod(x) * itemsize for x in half] + [math.prod(x) * 4 for x in f32])
    return tuple(offs), n  # cached: immutable


#: the scratch buffers in ``_scratch_shapes``' order, each with the kernel arguments that name it
#: (its writer's ``*_out`` and its readers' name are one buffer)
SCRATCH_ARGS = (
    ("w_out", "w"),
    ("u_out", "u"),
    ("vn_out", "vn"),
    ("a_out", "a_in"),
    ("h_out", "h"),
    ("fd_out", "fd"),
    ("gc_out", "gc"),
    ("gl_out", "gl"),
    ("prog",),
)


def _call_args(
    *, q, k, v, g, beta, A_log, dt_bias, scratch, o, h0, ht, hb, has_h0, chunk_info, seq_info, store_slot, scale,
    l2norm,
) -> dict:  # fmt: skip
    """The per-call arguments by name (``_PER_CALL``): tensors on Triton's launch path, device
    addresses on the direct path. ``scratch``: the nine scratch buffers in ``SCRATCH_ARGS``' order
    (w, u, v', A, chunk-start states, row factors, gate cumsum, chunk-end gate, progress
    counters); h0 and hb stand in with ht when absent; chunk_info, seq_info, store_slot are the
    chunk metadata's."""
    named = dict(
        q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, o=o, h0=h0, ht=ht, hb=hb, has_h0=has_h0,
        chunk_info=chunk_info, seq_info=seq_info, store_slot=store_slot, scale=float(scale), l2norm=l2norm,
    )  # fmt: skip
    for names, buf in zip(SCRATCH_ARGS, scratch):
        named.update(dict.fromkeys(names, buf))
    return named
