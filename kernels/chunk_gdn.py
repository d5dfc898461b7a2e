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

The code, by stage as FLA lays out its ops (each module owns one job; this one is the public call):
  ``chunk_tiles``    device helpers the stages share (masks, the chunk table)
  ``chunk_solve``    stage 1, ``_solve_kernel``            ``chunk_prepare`` stage 2, ``_wu_kernel``
  ``chunk_state``    stage 3, ``_state_kernel``            ``chunk_output``  stage 4, ``_output_kernel``
  ``chunk_plan``     launch planning: configurations, the launch table, grids, scratch layout,
                     the per-call argument names
  ``chunk_launch``   the launches: Triton's launch path, and the direct path (plans remembered
                     from it, calls bound to their chunk metadata, the caller's buffers)
  ``chunk_gdn``      ``chunk_gated_delta_rule``: checks, the one route to the launches
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch

from kernels import chunk_launch as _launch
from kernels import chunk_plan as _plan
from kernels import chunk_segmented as _seg
from kernels import chunk_segmented_launch as _segl
from kernels._common import (
    INTERPRET,
    MAX_HEAD_DIM,
    MIN_HEAD_DIM,
    SUPPORTED_DTYPES,  # noqa: F401
    ChunkMetadata,
    check_args,
    prepare_chunk_metadata,
    remembered_metadata,
    resolve_call,
)

# the names the other modules own, as this module exported them before the split (benchmarks and
# tests read them here)
from kernels.chunk_launch import (  # noqa: F401
    _PLANS,
    WORKSPACE_ALIGN,
    _addresses,
    _bound_key,
    _buffers,
    _direct_call,
    _fp32_vector,
    _plan_key,
    _remember_plan,
    workspace_bytes,
)
from kernels.chunk_output import _output_kernel  # noqa: F401
from kernels.chunk_plan import (  # noqa: F401
    _GLUON_KERNELS,
    _KERNEL_KEYS,
    _KERNELS,
    _KERNELS_FUSED,
    _KERNELS_GLUON,
    _PER_CALL,
    _PER_CALL_ORDER,
    _SCRATCH_ALIGN,
    CONFIGS,
    FP32_PRECISION,
    FP32_PRECISIONS,
    HOST_KEYS,
    LAUNCH_OPTIONS,
    OUT_BV_FP32,
    STATE_BV_WIDE,
    STATE_WIDE_FILL,
    _call_args,
    _carve,
    _gluon_fused_kernel,
    _gluon_solve_kernel,
    _grids,
    _kernel_fns,
    _scratch_layout,
    _scratch_shapes,
    discard_applies,
    gluon_device,
    launch_params,
    state_wide,
)
from kernels.chunk_prepare import _wu_kernel  # noqa: F401
from kernels.chunk_solve import _solve_kernel  # noqa: F401
from kernels.chunk_state import _state_kernel  # noqa: F401
from kernels.state_gluon import GLUON_K, _gluon_state_kernel  # noqa: F401

__all__ = [
    "chunk_gated_delta_rule",
    "prepare_chunk_metadata",
    "ChunkMetadata",
    "CONFIGS",
    "launch_params",
    "MAX_HEAD_DIM",
    "MIN_HEAD_DIM",
]

_DIRECT = os.environ.get("KERNELS_LAUNCH", "direct") != "triton"

#: why a bf16 call is refused in the interpreter: its ``tl.dot`` multiplies bf16 operands' bit
#: patterns (outputs near 1e10 for values near 1; fp16 and fp32 are right)
INTERPRETER_BF16 = (
    "the Triton interpreter (TRITON_INTERPRET=1) computes bf16 matrix products wrongly "
    "(triton-lang/triton#11584); on a CPU pass fp16 or fp32 inputs"
)

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
    state_segments=None,
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
    the call does no device-to-host sync and the metadata's boundary selection is used. Without
    it the call's layout (batch, length, device, offsets and starts as lists or CPU tensors,
    boundary selection) gets its metadata built once and remembered
    (``_common.remembered_metadata``): a later plain call of the layout takes the calls bound to it,
    as a caller with prepared metadata does (offsets on the GPU are read with a sync every call).
    ``input_precision`` applies to fp32 inputs on GPU: "tf32x3" (the default, ``FP32_PRECISION``:
    fp32's accuracy on tensor cores), "ieee" (FMA products, 14x slower on an H200), "tf32".

    Preallocated buffers (a caller that keeps them allocates nothing per call): ``out`` ``[B, T,
    HV, V]`` in q's dtype, ``final_state_out`` ``[N, HV, K, V]`` fp32, ``boundary_out`` ``[NB, HV,
    K, V]`` in ``state_dtype``, each contiguous and 16-byte aligned, returned as given (written);
    ``workspace``: 1-d uint8 of at least ``workspace_bytes(q, v, chunk_metadata)`` elements,
    256-byte aligned, the call's scratch (free again when the call's kernels have run on its
    stream). A wrong buffer is a one-line ValueError.

    ``state_segments`` (opt-in; None: ``KERNELS_CONFIG_STATE=SEG=n``, else 0): ``n`` > 0 runs the
    state pass chunk-parallel over segments of ``n`` chunks (``kernels.chunk_segmented``: other
    bits than the serial loop, within its tolerance); 0 the serial loop; "auto" segments where
    the serial loop's programs would leave the GPU idle (``chunk_segmented.auto_segments``).
    """
    if chunk_metadata is None:  # a plain call: its layout's metadata, built once (and its bindings)
        chunk_metadata = remembered_metadata(q, cu_seqlens, start_positions, boundary_stride, boundary_indices)
    given = (
        None
        if out is None and final_state_out is None and boundary_out is None and workspace is None
        else (out, final_state_out, boundary_out, workspace)
    )
    gate = (A_log, dt_bias) if use_gate_in_kernel else None
    l2norm, store_b = int(bool(use_qk_l2norm)), bool(boundary_states)
    # One route to the launches, three places to join it, each a cheaper start than the next:
    # 1. a layout this metadata has run before (the model step's earlier layers): its bound call
    #    checks the layout and launches, instead of the checks, launch table and plan key below
    #    (the segmented pass's bindings are keyed apart: ``chunk_segmented_launch.bound_key``)
    options = None
    if _DIRECT and chunk_metadata is not None and chunk_metadata.calls:
        options = _bound_key(
            q.shape[-1] ** -0.5 if scale is None else scale, l2norm, store_b, state_dtype,
            bool(use_gate_in_kernel), bool(use_beta_sigmoid), q.dtype, input_precision,
        )  # fmt: skip
        calls = chunk_metadata.calls
        bound = calls.get(options if not state_segments else _segl.bound_key(state_segments, options))
        if bound is None and state_segments is None:  # ``KERNELS_CONFIG_STATE=SEG=n``'s binding
            bound = calls.get(_segl.bound_key(None, options))
        if bound is not None:
            res = bound.run(q, k, v, g, beta, initial_state, gate, given)
            if res is not None:
                return res
    check_args(q, k, v, g, beta, state_dtype=state_dtype)
    if INTERPRET and q.dtype == torch.bfloat16:
        raise ValueError(INTERPRETER_BF16)
    if scale is None:
        scale = q.shape[3] ** -0.5
    # the segmented state pass (opt-in): never through the serial loop's plans, so a serial
    # binding serves only calls without it (its key holds ``KERNELS_CONFIG_STATE``); it binds
    # itself to the metadata under its own key (``chunk_segmented_launch``)
    env_segments = _seg.env_segments(_plan._env_config("state"))
    _seg.check_segments(state_segments)
    segments = env_segments if state_segments is None else state_segments
    seg_key = None
    if _DIRECT and chunk_metadata is not None and (segments or env_segments):
        if options is None:
            options = _bound_key(
                scale, l2norm, store_b, state_dtype, bool(use_gate_in_kernel), bool(use_beta_sigmoid), q.dtype,
                input_precision,
            )  # fmt: skip
        seg_key = _segl.bound_key(state_segments, options)
    if segments == "auto" and chunk_metadata is not None:  # "auto" that picks the serial loop takes its paths
        segments = _auto_segments(chunk_metadata, q, v, input_precision)
    # 2. a plan remembered for this specialisation (``_direct_fits``): bound to the metadata, launched
    if _DIRECT and not segments and not env_segments and _direct_fits(q, k, v, initial_state, chunk_metadata, gate):
        K, HV, V = q.shape[3], v.shape[2], v.shape[3]
        wide = _plan.state_wide(chunk_metadata.num_seqs, HV, V, q.device)
        lp = launch_params(K, V, q.dtype, input_precision, wide, _plan.gluon_device(q.device))
        res = _direct_call(
            q, k, v, g, beta, scale, initial_state, store_b, state_dtype, chunk_metadata, l2norm, lp, gate,
            bool(use_beta_sigmoid), given, input_precision,
        )  # fmt: skip
        if res is not None:
            if seg_key is not None:  # "auto" that picked the serial loop: its binding serves "auto" too
                serial = chunk_metadata.calls.get(options)
                if serial is not None:
                    chunk_metadata.calls[seg_key] = serial
            return res
    # 3. Triton's launch path: compiles a new specialisation's kernels and remembers their plan
    return _triton_call(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, l2norm=l2norm, store_b=store_b,
        state_dtype=state_dtype, gate=gate, beta_sig=bool(use_beta_sigmoid), input_precision=input_precision,
        meta=resolve_call(
            q, v, initial_state=initial_state, cu_seqlens=cu_seqlens, start_positions=start_positions,
            boundary_stride=boundary_stride, boundary_indices=boundary_indices, chunk_metadata=chunk_metadata,
            use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
        ),
        out=out, final_state_out=final_state_out, boundary_out=boundary_out, workspace=workspace,
        segments=segments, bind_key=seg_key,
    )  # fmt: skip


def _auto_segments(meta, q, v, input_precision) -> int:
    """``state_segments="auto"``'s chunks per segment for a call on ``meta`` (0: the serial loop):
    ``chunk_segmented.auto_segments`` at the serial loop's V block and the device's multiprocessors
    (none on a CPU or in the interpreter: the serial loop)."""
    dev = q.device
    if dev.type != "cuda" or INTERPRET:
        return 0
    K, HV, V = q.shape[3], v.shape[2], v.shape[3]
    lp = launch_params(
        K, V, q.dtype, input_precision, _plan.state_wide(meta.num_seqs, HV, V, dev), _plan.gluon_device(dev)
    )
    sms = _plan._multiprocessors(dev.index or 0)
    return _seg.auto_segments(meta.num_seqs, HV, V, lp["state"]["BV"], meta.max_chunks, sms)


def _direct_fits(q, k, v, initial_state, meta, gate) -> bool:
    """Whether a checked call can take the direct path (a plan's launches with bare addresses):
    compiled kernels on a GPU, one sequence batch on its prepared metadata, one dtype, unit head-dim
    strides, fp32 gate parameters and initial state in place."""
    return (
        meta is not None
        and q.is_cuda
        and not INTERPRET
        and (gate is None or (_fp32_vector(gate[0], q.device) and _fp32_vector(gate[1], q.device)))
        and meta.chunk_info.device == q.device  # the direct path passes bare addresses
        and q.shape[0] == 1
        and meta.num_chunks > 0
        and meta.total_tokens == q.shape[1]
        and k.dtype == v.dtype == q.dtype
        and q.stride(3) == k.stride(3) == v.stride(3) == 1
        and (
            initial_state is None
            or (
                initial_state.dtype == torch.float32
                and initial_state.is_contiguous()
                and initial_state.device == q.device
                and tuple(initial_state.shape) == (meta.num_seqs, v.shape[2], q.shape[3], v.shape[3])
            )
        )
    )


def _triton_call(
    q, k, v, g, beta, *, scale, initial_state, l2norm, store_b, state_dtype, gate, beta_sig, input_precision, meta,
    out, final_state_out, boundary_out, workspace, segments=0, bind_key=None,
):  # fmt: skip
    """A checked call through Triton's launch path (``meta``: ``resolve_call``'s): the inputs as
    token rows, the caller's buffers or fresh ones, the scratch carved, every kernel launched by
    name (``chunk_launch.triton_launches``), and the plan remembered where the direct path can use
    it. ``segments``: chunks per segment of the segmented state pass, "auto", or 0 (the serial
    loop). ``bind_key``: where the segmented pass binds itself in the metadata's calls (None:
    nowhere)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    dt = q.dtype
    if k.dtype != dt or v.dtype != dt:
        k, v = k.to(dt), v.to(dt)
    N, TT, NT = meta.num_seqs, B * T, meta.num_chunks
    # the queries and keys the Gluon kernels copy by cp.async (solve and loop: keys; the fused loop:
    # queries too) on rows they can prove aligned
    aligned = K == GLUON_K and torch.finfo(dt).bits == 16 and _plan.gluon_device(dev)
    q2, k2 = _rows(q, TT, H, K, aligned), _rows(k, TT, H, K, aligned)
    v2 = _rows(v, TT, HV, V)
    g2, b2 = _rows(g, TT, HV, None), _rows(beta, TT, HV, None)
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
    if gate is not None:
        A_log_t, dt_bias_t = gate[0].float().contiguous(), gate[1].float().contiguous()
    if segments == "auto":
        segments = _auto_segments(meta, q, v, input_precision)
    tables = _seg.segment_tables(meta, segments, dev) if segments else None
    wide = _plan.state_wide(N if tables is None else tables.num, HV, V, dev)
    lp = launch_params(K, V, dt, input_precision, wide, _plan.gluon_device(dev))
    half_shapes, f32_shapes = _scratch_shapes(TT, NT, HV, K, V)
    w, u, vn, A, hbuf, fd, gcum, glast, prog = (
        scratch[off : off + math.prod(shape) * t.itemsize].view(t).view(shape)
        for off, shape, t in zip(offs, half_shapes + f32_shapes, (dt,) * 5 + (torch.float32,) * 3 + (torch.int32,))
    )
    if gate is None:
        A_log_t = dt_bias_t = fd  # never read; any fp32 tensor stands in
    store = store_b and meta.num_boundaries > 0
    # runtime arguments, by the names the kernels share (a name is one buffer in all of them)
    shared = dict(
        _call_args(
            q=q2, k=k2, v=v2, g=g2, beta=b2, A_log=A_log_t, dt_bias=dt_bias_t,
            scratch=(w, u, vn, A, hbuf, fd, gcum, glast, prog), o=o, h0=h0, ht=ht, hb=hb if store else ht,
            has_h0=int(initial_state is not None), chunk_info=meta.chunk_info, seq_info=meta.seq_info,
            store_slot=meta.store_slot, scale=scale, l2norm=l2norm,
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
        USE_GATE=gate is not None,
        BETA_SIGMOID=beta_sig,
        WHILE_LOOP=INTERPRET,
    )  # fmt: skip
    # a plan is remembered (a call bound) only where the kernels saw the 4-d inputs themselves:
    # their token / head strides (what the key holds) and their addresses (not a copy, ``_rows``:
    # the key holds the inputs' alignment, and a kernel compiled for an aligned copy must not get
    # the unaligned input)
    same_strides = all(
        x2.stride() == x.stride()[1 : 1 + x2.dim()] and x2.data_ptr() == x.data_ptr()
        for x2, x in ((q2, q), (k2, k), (v2, v), (g2, g), (b2, beta))
    )
    if tables is not None:
        record = _segmented_launches(lp, shared, tables, N, NT, HV, K, V, dev, h0, int(initial_state is not None), ht)
        if bind_key is not None and _segmented_binds(dev, B, same_strides, q, k, v, g, beta, initial_state, gate):
            bound = _segl.bind(record, tables, meta, bind_key, q, k, v, g, beta, store_b, state_dtype)
            if bound is not None:
                meta.calls[bind_key] = bound
        return (o.reshape(B, T, HV, V) if out is None else out), ht, hb
    compiled, fns, lists, lp, fallback = _launch.triton_launches(
        lp, lambda lp: _grids(lp, N, NT, HV, V), shared,
        lambda: launch_params(K, V, dt, input_precision, wide, False),
    )  # fmt: skip
    if _DIRECT and dev.type == "cuda" and not INTERPRET and B == 1 and same_strides and not fallback:
        ptrs = _addresses(q, k, v, g, beta, initial_state, *((A_log_t, dt_bias_t) if gate is not None else ()))
        key = _launch._plan_key(
            lp, dev, dt, state_dtype if store else None, H, HV, gate is not None, beta_sig, q, k, v, g, beta, ptrs
        )
        _remember_plan(compiled, fns, lists, lp, key)
    return (o.reshape(B, T, HV, V) if out is None else out), ht, hb


def _segmented_binds(dev, B, same_strides, q, k, v, g, beta, initial_state, gate) -> bool:
    """Whether a segmented call that ran through Triton's path may bind itself to its metadata:
    as the serial loop's plans, compiled kernels on a GPU, one sequence batch, the inputs as the
    kernels saw them, every address 16-byte aligned (what the bound check takes for granted).
    A test stands in for it on the CPU."""
    if not (_DIRECT and dev.type == "cuda" and not INTERPRET and B == 1 and same_strides):
        return False
    return all(p % 16 == 0 for p in _addresses(q, k, v, g, beta, initial_state, *(gate or (None, None))))


def _segmented_launches(lp, shared, tables, N, NT, HV, K, V, dev, h0, has_h0, ht):
    """The segmented state pass's launches (``chunk_segmented.launches``) on launch table ``lp``;
    its launch records. Unlike the serial path a Gluon compile failure is not caught here: the
    opt-in path raises it."""
    slp = _seg.segmented_table(lp)
    return _seg.launches(
        slp, _plan._kernel_fns(slp), _grids(slp, tables.num, NT, HV, V), shared, tables,
        N=N, HV=HV, K=K, V=V, dev=dev, h0=h0, has_h0=has_h0, ht=ht,
    )  # fmt: skip
