"""Argument checks and chunk metadata of the SSD (Mamba2) forward, shared by the Triton
(``kernels.ssd``) and plain-torch (``kernels.torch_ssd``) implementations. Torch only."""

from __future__ import annotations

import torch

from dataclasses import dataclass
from typing import Optional

from kernels._common import STATE_DTYPES, SUPPORTED_DTYPES, ChunkMetadata, resolve_metadata

__all__ = ["check_ssd_args", "resolve_ssd_call", "ssd_call", "SsdCall", "MAX_SSD_DIM"]

#: the largest head dim P and state dim N of the Triton kernels (padded to a power of two there)
MAX_SSD_DIM = 256


def check_ssd_args(x, dt, A, B, C, D=None, dt_bias=None, *, state_dtype=torch.float32, max_dim=MAX_SSD_DIM):
    """Raise one-line ValueErrors for anything the SSD implementations cannot run."""
    if state_dtype not in STATE_DTYPES:
        names = ", ".join(str(t) for t in STATE_DTYPES)
        raise ValueError(f"state_dtype must be one of {names}; got {state_dtype!r}")
    if x.dim() != 4 or B.dim() != 4 or C.dim() != 4:
        raise ValueError(
            f"x must be [batch, T, heads, headdim], B and C [batch, T, groups, dstate]; got "
            f"x{tuple(x.shape)} B{tuple(B.shape)} C{tuple(C.shape)}"
        )
    Bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    if C.shape != B.shape or B.shape[:2] != (Bsz, T) or G == 0 or H % G:
        raise ValueError(
            f"bad shapes x{tuple(x.shape)} B{tuple(B.shape)} C{tuple(C.shape)} "
            "(need B == C [batch, T, groups, dstate] with heads a multiple of groups)"
        )
    if dt.shape != (Bsz, T, H):
        raise ValueError(f"dt must be [batch, T, heads] = {(Bsz, T, H)}; got {tuple(dt.shape)}")
    if A.shape != (H,):
        raise ValueError(f"A must be [heads] = {(H,)}; got {tuple(A.shape)}")
    if dt_bias is not None and dt_bias.shape != (H,):
        raise ValueError(f"dt_bias must be [heads] = {(H,)}; got {tuple(dt_bias.shape)}")
    if D is not None and D.shape not in ((H,), (H, P)):
        raise ValueError(f"D must be [heads] or [heads, headdim]; got {tuple(D.shape)}")
    top = max_dim if max_dim is not None else float("inf")
    for name, v in (("headdim", P), ("dstate", N)):
        if not 1 <= v <= top:
            raise ValueError(f"{name}={v} is not supported (need 1 <= {name} <= {max_dim})")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"x dtype {x.dtype} is not supported (float32, float16, bfloat16)")
    if not (x.device == dt.device == B.device == C.device == A.device):
        raise ValueError("x, dt, A, B, C must be on one device")


def resolve_ssd_call(x, B, *, initial_state, cu_seqlens, start_positions, boundary_stride, boundary_indices,
                     chunk_metadata) -> ChunkMetadata:  # fmt: skip
    """The call's chunk metadata, checked against the inputs (token count, initial state shape)."""
    Bsz, T, H, P = x.shape
    N = B.shape[3]
    meta = resolve_metadata(
        Bsz, T, x.device, cu_seqlens, start_positions, boundary_stride, boundary_indices, chunk_metadata
    )
    if x.is_cuda and meta.chunk_info.device != x.device:
        raise ValueError(
            f"chunk_metadata is on {meta.chunk_info.device}, the inputs on {x.device} "
            "(prepare_chunk_metadata(..., device=x.device))"
        )
    if meta.total_tokens != Bsz * T:
        raise ValueError(f"metadata covers {meta.total_tokens} tokens, inputs have {Bsz * T}")
    want = (meta.num_seqs, H, P, N)
    if initial_state is not None and tuple(initial_state.shape) != want:
        raise ValueError(f"initial_state must be {want}, got {tuple(initial_state.shape)}")
    return meta


@dataclass(frozen=True)
class SsdCall:
    """One call of the SSD forward, its arguments checked (``ssd_call``) and its chunk metadata."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: Optional[torch.Tensor]
    dt_bias: Optional[torch.Tensor]
    dt_softplus: bool
    dt_limit: tuple
    initial_state: Optional[torch.Tensor]
    boundary_states: bool
    state_dtype: torch.dtype
    input_precision: Optional[str]
    meta: ChunkMetadata


def ssd_call(
    x,
    dt,
    A,
    B,
    C,
    *,
    D=None,
    dt_bias=None,
    dt_softplus: bool = True,
    dt_limit=(0.0, float("inf")),
    initial_state=None,
    cu_seqlens=None,
    start_positions=None,
    boundary_states: bool = True,
    state_dtype=torch.float32,
    boundary_stride: int = 1,
    boundary_indices=None,
    chunk_metadata: Optional[ChunkMetadata] = None,
    input_precision: Optional[str] = None,
    max_dim: Optional[int] = MAX_SSD_DIM,
    precisions: Optional[tuple] = None,
) -> SsdCall:
    """The arguments of ``chunk_ssd`` (both implementations take these, documented in
    ``kernels.ssd.chunk_ssd``), checked: ``check_ssd_args`` with ``max_dim``, then
    ``input_precision`` against ``precisions`` (None: not checked), then the chunk metadata
    (``resolve_ssd_call``)."""
    check_ssd_args(x, dt, A, B, C, D, dt_bias, state_dtype=state_dtype, max_dim=max_dim)
    if precisions is not None and input_precision not in precisions:
        raise ValueError(f"input_precision must be one of 'ieee', 'tf32', 'tf32x3' (or None), not {input_precision!r}")
    meta = resolve_ssd_call(
        x,
        B,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        start_positions=start_positions,
        boundary_stride=boundary_stride,
        boundary_indices=boundary_indices,
        chunk_metadata=chunk_metadata,
    )
    return SsdCall(
        x, dt, A, B, C, D, dt_bias, dt_softplus, dt_limit, initial_state, boundary_states, state_dtype,
        input_precision, meta,
    )  # fmt: skip
