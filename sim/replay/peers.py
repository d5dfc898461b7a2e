"""Replay backends ``fla`` and ``flashqla``: the peers' chunked gated delta rule behind the
signature of ``kernels.chunk_gdn.chunk_gated_delta_rule`` (so replay, its validation and its FLOP
accounting are the same for every backend). Imports a peer only when its backend is chosen; the
peers are optional (never a dependency of the project or its tests).

  fla       FLA 0.6 ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (flash-linear-attention):
            its Triton kernels fuse the gate (``use_gate_in_kernel`` with A_log / dt_bias), the beta
            sigmoid and the q / k l2norm, as the project's kernels do. FLA's backend dispatch is
            switched off (``FLA_DISABLE_BACKEND_DISPATCH=1`` unless set before FLA is imported), so
            FLA's own Triton path runs, as the engines that vendor it do (with the gate fused it
            would not dispatch to FlashQLA anyway). CUDA only: FLA autotunes on a GPU, and Triton's
            interpreter cannot run its autotuner.
  flashqla  QwenLM's FlashQLA ``flash_qla.chunk_gated_delta_rule`` (TileLang kernels: sm90, sm100,
            sm103, sm120; bf16 / fp16; K = V = 128): it takes the log decay and beta, so the gate
            ``-exp(A_log) softplus(a + dt_bias)`` and ``sigmoid(b)`` are computed here in fp32 torch
            ops (once per call); q / k l2norm in its kernel; its default intra-card CP (``auto_cp``).

Both: ``scale`` K^-0.5 unless given (the project's default), the initial state per sequence (fp32),
the final state fp32 (both peers return it in fp32), ``input_precision`` ignored.

Boundary states. Both peers materialise the state at every chunk start inside their forward (FLA's
``chunk_gated_delta_rule_fwd_h`` returns ``h``, FlashQLA's ``fused_gdr_fwd(output_h=True)``; this
is what SGLang #34820 and vLLM #36649 read out), but neither can serve here: (1) both allocate ``h``
in the input dtype (``k.new_empty`` / ``dtype=k.dtype``), so at bf16 a state read from it is a bf16
snapshot of the fp32 recurrence: the bug class SGLang #34820 fixed, and a restore from it would not
continue the fp32 state; neither peer offers fp32 ``h``; (2) their chunk grid starts at each
sequence's first token, not at absolute 64-multiples, so a call that starts off a multiple of 64
(a suffix after a restore) has no chunk start at the requested positions; (3) neither public
function returns ``h``. So the adapters split the call at every requested boundary: sequential
calls of the peer, each handing its fp32 final state to the next (exact: the state at a boundary
is the peer's own fp32 final state there). Cost: one peer call per segment (a call with b boundary
states inside it makes b + 1 peer calls, each with the peer's full launch sequence; with several
sequences the segments of all sequences go round by round in varlen calls, so a call makes
1 + max boundaries per sequence), the inputs of a round gathered (a view for one sequence) and
the outputs copied into place; a boundary at a segment's end makes its chunk grid end there, and
the work in FLOPs is unchanged. A call without boundary states is one peer call. Replay asks for
few boundaries per call (the checkpoints the policy keeps, not every 64 tokens), so replay's split
costs a few launches per layer, which the measured times include (they are what that backend costs
to emit exact states).

The conv stays the project's ``kernels.conv.causal_conv1d`` for both (the engines run their own
conv kernels; the gated-delta core is what is compared).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from kernels._common import ChunkMetadata, check_args, resolve_call, upload

#: largest head dim FLA's forward takes (``chunk_gated_delta_rule_fwd_h`` asserts K <= 256)
FLA_MAX_HEAD_DIM = 256
FLA_HINT = "--kernel fla needs flash-linear-attention (pip install flash-linear-attention)"
FLASHQLA_HINT = "--kernel flashqla needs flash-qla (pip install flash-qla)"
#: the compute capabilities FlashQLA 0.1.3 builds kernels for (its chunk/__init__.py refuses others)
FLASHQLA_ARCHS = ((9, 0), (10, 0), (10, 3), (12, 0), (12, 1))
#: its only head dims (FLA's dispatch verifier for FlashQLA checks the same)
FLASHQLA_HEAD_DIM = 128
FLASHQLA_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Flags:
    """What a peer call needs besides its tensors (the project kernel's keyword arguments)."""

    scale: float
    use_qk_l2norm: bool
    use_gate_in_kernel: bool
    use_beta_sigmoid: bool
    A_log: Optional[torch.Tensor]
    dt_bias: Optional[torch.Tensor]


#: ``run(q, k, v, g, beta, h0, cu, flags) -> (o, final_state)``: one call of a peer over
#: ``[1, T, ...]`` inputs; ``h0`` fp32 ``[n, HV, K, V]`` or None (zeros); ``cu`` None for one
#: sequence or the host list of ``n + 1`` cumulative lengths; the final state fp32.
PeerRun = Callable[..., tuple]


def _segments(meta: ChunkMetadata, boundary_states: bool) -> list:
    """Per sequence, its ``(first token row, end row, boundary slot or None)`` pieces in order:
    cut at every boundary the metadata emits (when ``boundary_states``), else one piece."""
    out = []
    for n in range(meta.num_seqs):
        bos, eos, s0 = meta.cu_seqlens[n], meta.cu_seqlens[n + 1], meta.start_positions[n]
        segs, a = [], bos
        if boundary_states:
            for j, p in enumerate(meta.boundary_positions[n]):
                b = bos + p - s0
                segs.append((a, b, meta.boundary_offsets[n] + j))
                a = b
        if a < eos:
            segs.append((a, eos, None))
        out.append(segs)
    return out


def split_call(
    run: PeerRun,
    q,
    k,
    v,
    g,
    beta,
    *,
    meta: ChunkMetadata,
    flags: Flags,
    initial_state: Optional[torch.Tensor],
    boundary_states: bool,
    state_dtype: torch.dtype,
):
    """The project kernel's results from a peer that returns only outputs and final states:
    ``q, k, v, g, beta`` flattened to ``[1, TT, ...]`` are cut at ``meta``'s boundaries and run
    round by round (round j: the j-th piece of every sequence that has one, one varlen call), each
    piece from the fp32 state the previous piece ended in. Returns ``(o [1, TT, HV, V],
    final_state [N, HV, K, V] fp32, boundary_states [NB, HV, K, V] in state_dtype or None)``."""
    N, TT = meta.num_seqs, meta.total_tokens
    HV, K, V = v.shape[2], k.shape[3], v.shape[3]
    dev, f32 = q.device, torch.float32
    segs = _segments(meta, boundary_states)
    hb = torch.empty(meta.num_boundaries, HV, K, V, dtype=state_dtype, device=dev) if boundary_states else None
    rounds = max((len(s) for s in segs), default=0)
    if N == 1 and rounds == 1:  # one piece: the peer's results as they are
        h0 = None if initial_state is None else initial_state.to(f32)
        o, h1 = run(q, k, v, g, beta, h0, None, flags)
        h1 = h1.to(f32)
        slot = segs[0][0][2]
        if slot is not None:  # a boundary at the call's end: the final state
            hb[slot] = h1[0].to(state_dtype)
        return o, h1, hb
    if initial_state is not None:
        ht = initial_state.to(f32).clone()
    else:
        ht = torch.zeros(N, HV, K, V, dtype=f32, device=dev)
    if rounds == 0:
        return torch.zeros(1, TT, HV, V, dtype=q.dtype, device=dev), ht, hb
    o = torch.empty(1, TT, HV, V, dtype=q.dtype, device=dev)
    for j in range(rounds):
        part = [(n, *s[j]) for n, s in enumerate(segs) if len(s) > j]
        if len(part) == 1:
            n, a, b, _ = part[0]
            xs = [x[:, a:b] for x in (q, k, v, g, beta)]
            cu = None
            h0 = None if j == 0 and initial_state is None else ht[n : n + 1]
        else:
            xs = [torch.cat([x[:, a:b] for _, a, b, _ in part], dim=1) for x in (q, k, v, g, beta)]
            cu = [0]
            for _, a, b, _ in part:
                cu.append(cu[-1] + b - a)
            h0 = None if j == 0 and initial_state is None else torch.stack([ht[n] for n, _, _, _ in part])
        o_r, h_r = run(*xs, h0, cu, flags)
        off = 0
        for i, (n, a, b, slot) in enumerate(part):
            o[:, a:b] = o_r[:, off : off + b - a]
            off += b - a
            ht[n] = h_r[i]
            if slot is not None:
                hb[slot] = h_r[i].to(state_dtype)
    return o, ht, hb


def adapted_chunk_gated_delta_rule(
    run: PeerRun,
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
    max_head_dim: Optional[int] = None,
):
    """``kernels.chunk_gated_delta_rule``'s arguments and results, computed by ``run`` (a peer,
    see ``PeerRun``) through ``split_call``. ``input_precision`` is ignored (the peer's own)."""
    check_args(q, k, v, g, beta, max_head_dim=max_head_dim)
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
    dt = q.dtype
    if k.dtype != dt or v.dtype != dt:
        k, v = k.to(dt), v.to(dt)
    TT = B * T
    flags = Flags(
        scale=float(K**-0.5 if scale is None else scale),
        use_qk_l2norm=bool(use_qk_l2norm),
        use_gate_in_kernel=bool(use_gate_in_kernel),
        use_beta_sigmoid=bool(use_beta_sigmoid),
        A_log=None if A_log is None else A_log.float(),
        dt_bias=None if dt_bias is None else dt_bias.float(),
    )
    flat = [x.reshape(1, TT, *x.shape[2:]) for x in (q, k, v, g, beta)]
    o, ht, hb = split_call(
        run,
        *flat,
        meta=meta,
        flags=flags,
        initial_state=initial_state,
        boundary_states=bool(boundary_states),
        state_dtype=state_dtype,
    )
    return o.reshape(B, T, HV, V), ht, hb


# ---- FLA ---------------------------------------------------------------------------------------
_FLA: dict = {}


def _fla_function():
    """FLA's ``chunk_gated_delta_rule``, imported on first use with its backend dispatch off."""
    if "fn" not in _FLA:
        os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
        _FLA["fn"] = importlib.import_module("fla.ops.gated_delta_rule").chunk_gated_delta_rule
    return _FLA["fn"]


#: what a peer's import raises when it is installed but broken: a missing dependency
#: (ImportError), or an error inside its import (TileLang 0.1.15 with apache-tvm-ffi 0.1.13 or
#: newer: RuntimeError "'tl.SwizzleMode' has no enum"; FLA imports TileLang where installed)
IMPORT_FAILURES = (ImportError, RuntimeError, AttributeError, OSError, TypeError, ValueError)
#: the known break: FlashQLA 0.1.3's TileLang (0.1.15) needs apache-tvm-ffi below 0.1.13
TILELANG_PIN = "TileLang 0.1.15 needs apache-tvm-ffi<0.1.13"


def _import_line(hint: str, package: str, exc: BaseException) -> str:
    """``hint`` when the package itself is missing; with the reason when it is there but broken
    (one line: the exception's first line, and the TileLang pin where that is what broke)."""
    missing = isinstance(exc, ImportError) and (getattr(exc, "name", None) or "").split(".")[0] == package
    if missing:
        return hint
    first = (str(exc).splitlines() or [""])[0]
    pin = f"; {TILELANG_PIN}" if "SwizzleMode" in first or "tvm" in first.lower() else ""
    return f"{hint}: importing it failed ({type(exc).__name__}: {first}){pin}"


def fla_problem(device, dtype, head_k_dim: int, head_v_dim: int) -> Optional[str]:
    """Why the ``fla`` backend cannot run here (one line), or None."""
    if torch.device(device).type != "cuda":
        return "--kernel fla needs a CUDA GPU (FLA's Triton kernels autotune on one; the interpreter cannot run them)"
    if max(head_k_dim, head_v_dim) > FLA_MAX_HEAD_DIM:
        return f"--kernel fla: FLA takes head dims up to {FLA_MAX_HEAD_DIM}, not K = {head_k_dim}, V = {head_v_dim}"
    try:
        _fla_function()
    except IMPORT_FAILURES as exc:
        return _import_line(FLA_HINT, "fla", exc)
    return None


def _fla_run(q, k, v, g, beta, h0, cu, flags: Flags):
    fn = _fla_function()
    cu_kw = {}
    if cu is not None:  # a round of several sequences: FLA's chunk indices from the host copy
        cu_kw = dict(
            cu_seqlens=upload(cu, q.device),
            cu_seqlens_cpu=torch.tensor(cu, dtype=torch.long),
        )
    gate = {}
    if flags.use_gate_in_kernel:
        gate = dict(use_gate_in_kernel=True, A_log=flags.A_log, dt_bias=flags.dt_bias)
    return fn(
        q,
        k,
        v,
        g,
        beta,
        scale=flags.scale,
        initial_state=h0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=flags.use_qk_l2norm,
        use_beta_sigmoid_in_kernel=flags.use_beta_sigmoid,
        **cu_kw,
        **gate,
    )


def fla_chunk_gated_delta_rule(q, k, v, g, beta, **kwargs):
    """The ``fla`` backend's core: FLA's forward with the project kernel's signature."""
    return adapted_chunk_gated_delta_rule(_fla_run, q, k, v, g, beta, max_head_dim=FLA_MAX_HEAD_DIM, **kwargs)


# ---- FlashQLA ----------------------------------------------------------------------------------
_FLASHQLA: dict = {}


def _flashqla_function():
    if "fn" not in _FLASHQLA:
        _FLASHQLA["fn"] = importlib.import_module("flash_qla").chunk_gated_delta_rule
    return _FLASHQLA["fn"]


def flashqla_problem(device, dtype, head_k_dim: int, head_v_dim: int) -> Optional[str]:
    """Why the ``flashqla`` backend cannot run here (one line), or None. The device is checked
    before FlashQLA is imported (its import itself fails off the GPUs it builds for)."""
    need = "--kernel flashqla needs a Hopper or Blackwell GPU (sm90 / sm100 / sm103 / sm120)"
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"{need}; {dev.type} is none"
    cap = tuple(torch.cuda.get_device_capability(dev))
    if cap not in FLASHQLA_ARCHS:
        return f"{need}; {torch.cuda.get_device_name(dev)} is sm{cap[0]}{cap[1]}"
    if dtype not in FLASHQLA_DTYPES:
        return f"--kernel flashqla runs bf16 / fp16 only (FlashQLA's kernels), not {str(dtype).replace('torch.', '')}"
    if (head_k_dim, head_v_dim) != (FLASHQLA_HEAD_DIM, FLASHQLA_HEAD_DIM):
        return (
            f"--kernel flashqla needs head dims K = V = {FLASHQLA_HEAD_DIM} (FlashQLA's kernels), "
            f"not K = {head_k_dim}, V = {head_v_dim}"
        )
    try:
        _flashqla_function()
    except IMPORT_FAILURES as exc:
        return _import_line(FLASHQLA_HINT, "flash_qla", exc)
    return None


def _flashqla_run(q, k, v, g, beta, h0, cu, flags: Flags):
    fn = _flashqla_function()
    cu_t = None if cu is None else upload(cu, q.device, torch.int32)
    return fn(
        q,
        k,
        v,
        g,
        beta,
        scale=flags.scale,
        initial_state=h0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=flags.use_qk_l2norm,
        cu_seqlens=cu_t,
    )


def torch_gate_beta(g, beta, *, A_log=None, dt_bias=None, use_gate_in_kernel=False, use_beta_sigmoid=False):
    """The gate and beta a peer without them in its kernel takes, in fp32 (the project's kernels
    compute both in fp32 from the raw inputs): ``g = -exp(A_log) softplus(a + dt_bias)`` when
    ``use_gate_in_kernel``, ``beta = sigmoid(b)`` when ``use_beta_sigmoid``."""
    g = g.float()
    if use_gate_in_kernel:
        g = -torch.exp(A_log.float()) * F.softplus(g + dt_bias.float())
    beta = torch.sigmoid(beta.float()) if use_beta_sigmoid else beta.float()
    return g, beta


def flashqla_chunk_gated_delta_rule(
    q, k, v, g, beta, *, A_log=None, dt_bias=None, use_gate_in_kernel=False, use_beta_sigmoid=False, **kwargs
):
    """The ``flashqla`` backend's core: FlashQLA's forward with the project kernel's signature
    (the gate and the beta sigmoid here in torch, once per call)."""
    if use_gate_in_kernel and (A_log is None or dt_bias is None):
        raise ValueError("use_gate_in_kernel needs A_log and dt_bias")
    g, beta = torch_gate_beta(
        g, beta, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid=use_beta_sigmoid
    )
    return adapted_chunk_gated_delta_rule(_flashqla_run, q, k, v, g, beta, max_head_dim=FLASHQLA_HEAD_DIM, **kwargs)
