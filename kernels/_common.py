"""Shared helpers (torch only, no triton): interpreter detection, chunk metadata, argument checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

CHUNK = 64
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
MIN_HEAD_DIM, MAX_HEAD_DIM = 1, 256  # the Triton kernels' head dims (padded tiles)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def chunk_bucket(n: int) -> int:
    """Power-of-two bucket of a chunk count (autotune key)."""
    return 1 << max(0, int(n) - 1).bit_length()


def _as_list(x) -> list[int]:
    if x is None:
        return None
    if torch.is_tensor(x):
        x = x.tolist()  # a device tensor costs one sync here, once per step
    return [int(v) for v in x]


@dataclass
class ChunkMetadata:
    """Chunk layout of one call, prepared once per step and reused across layers.

    The tensors live on ``device``; the kernels read them, so a call that receives this object
    does no device-to-host synchronisation.
    """

    num_seqs: int
    total_tokens: int
    num_chunks: int
    chunk_info: torch.Tensor  # [NT, 4] int32: seq id, first (virtual) token, lo, hi
    seq_info: torch.Tensor  # [N, 4] int32: bos, eos, first chunk, end chunk
    store_slot: torch.Tensor  # [NT] int32: boundary slot of the chunk's end, or -1
    num_boundaries: int
    boundary_offsets: list  # [N + 1] host ints: sequence n owns slots [off[n], off[n+1])
    boundary_positions: list  # per sequence, absolute positions of the emitted boundaries
    cu_seqlens: list
    start_positions: list
    max_chunks: int
    has_empty: bool = False
    device: Optional[torch.device] = field(default=None)
    #: calls bound to this metadata by ``kernels.chunk_gdn`` (its direct path), by call options:
    #: a later call with the same options and input layout (a model step's next layer) skips the
    #: argument checks and the plan key
    calls: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def bucket(self) -> int:
        return chunk_bucket(self.max_chunks)


def prepare_chunk_metadata(
    cu_seqlens, start_positions=None, *, boundary_stride: int = 1, boundary_indices=None, device=None
) -> ChunkMetadata:
    """Build the chunk grid for sequences ``[cu[n], cu[n+1])`` starting at absolute positions
    ``start_positions[n]`` (default 0).

    Chunks are aligned to absolute multiples of 64: a sequence that starts at ``p`` with
    ``p % 64 != 0`` gets a ragged first chunk of ``64 - p % 64`` tokens. A chunk whose end is an
    absolute multiple of 64 ends at a boundary; boundary ``b`` is emitted when
    ``(b // 64) % boundary_stride == 0`` or, if ``boundary_indices`` is given (a list of absolute
    positions, or one such list per sequence), when ``b`` is listed.
    Pass ``cu_seqlens`` as a list or CPU tensor to avoid a sync.
    """
    cu = _as_list(cu_seqlens)
    N = len(cu) - 1
    starts = _as_list(start_positions) if start_positions is not None else [0] * N
    if len(starts) != N:
        raise ValueError(f"start_positions has {len(starts)} entries for {N} sequences")
    if boundary_stride < 1:
        raise ValueError("boundary_stride must be >= 1")
    wanted = None
    if boundary_indices is not None:
        bi = boundary_indices
        if torch.is_tensor(bi):
            bi = bi.tolist()
        if N == 1 and (len(bi) == 0 or not isinstance(bi[0], (list, tuple))):
            bi = [bi]
        if len(bi) != N:
            raise ValueError("boundary_indices needs one list of positions per sequence")
        wanted = []
        for n, lst in enumerate(bi):
            s = set()
            for p in lst:
                p = int(p)
                if p % CHUNK:
                    raise ValueError(f"boundary position {p} is not a multiple of {CHUNK}")
                if not (starts[n] < p <= starts[n] + cu[n + 1] - cu[n]):
                    raise ValueError(f"boundary position {p} is outside sequence {n}'s call range")
                s.add(p)
            wanted.append(s)
    # vectorised over chunks (a Python loop over 512 chunks cost ~0.3 ms a call)
    cu_a = np.asarray(cu, dtype=np.int64)
    bos, eos = cu_a[:-1], cu_a[1:]
    lens = eos - bos
    st = np.asarray(starts, dtype=np.int64)
    rag = st % CHUNK  # tokens of the first chunk that lie before the call
    nc = np.where(lens == 0, 0, (lens + rag + CHUNK - 1) // CHUNK)
    c_end = np.cumsum(nc)
    c0 = c_end - nc
    NT = int(c_end[-1]) if N else 0
    seq = np.repeat(np.arange(N, dtype=np.int64), nc)
    local = np.arange(NT, dtype=np.int64) - c0[seq]
    ts = bos[seq] + local * CHUNK - rag[seq]
    lo, hi = np.maximum(ts, bos[seq]), np.minimum(ts + CHUNK, eos[seq])
    b_abs = st[seq] - rag[seq] + (local + 1) * CHUNK  # absolute position of each chunk's end
    full = ts + CHUNK <= eos[seq]
    if wanted is None:
        emit = full & ((b_abs // CHUNK) % boundary_stride == 0)
    else:
        emit = np.zeros(NT, dtype=bool)
        for n, s in enumerate(wanted):
            for p in s:  # validated above: a 64-multiple in (start, start + len]
                emit[c0[n] + (p - (st[n] - rag[n])) // CHUNK - 1] = True
        emit &= full
    emitted_before = np.concatenate([[0], np.cumsum(emit)])
    slots = np.where(emit, emitted_before[1:] - 1, -1)
    offs = [0] + emitted_before[c_end].tolist()
    nb = offs[-1]
    emitted = b_abs[emit]
    positions = [emitted[offs[n] : offs[n + 1]].tolist() for n in range(N)]
    max_chunks = int(nc.max()) if N else 0
    has_empty = bool((lens == 0).any())
    chunk_info = np.stack([seq, ts, lo, hi], axis=1)
    seq_info = np.stack([bos, eos, c0, c_end], axis=1)
    if device is None:
        device = cu_seqlens.device if torch.is_tensor(cu_seqlens) else torch.device("cpu")
    ci, si, ss = _device_tables(device, chunk_info, seq_info, slots)
    return ChunkMetadata(
        num_seqs=N,
        total_tokens=cu[-1],
        num_chunks=len(chunk_info),
        chunk_info=ci,
        seq_info=si,
        store_slot=ss,
        num_boundaries=nb,
        boundary_offsets=offs,
        boundary_positions=positions,
        cu_seqlens=cu,
        start_positions=starts,
        max_chunks=max_chunks,
        has_empty=has_empty,
        device=torch.device(device),
    )


#: int32 entries per 16 bytes: each table of ``_device_tables`` starts on a 16-byte boundary (the
#: pointer alignment Triton specialises on; an unaligned table would compile another variant)
_ALIGN = 4


def _device_tables(device, chunk_info: np.ndarray, seq_info: np.ndarray, slots: np.ndarray):
    """The three int32 tables ``[NT, 4]``, ``[N, 4]``, ``[NT]`` on ``device``, from one host buffer
    in one copy: pinned and asynchronous to a CUDA device (no host sync: a pageable copy waits for
    the device's queue), so preparing a step's metadata does not stall the launches before it.
    Each table starts on a 16-byte boundary."""
    parts = (chunk_info.reshape(-1), seq_info.reshape(-1), slots.reshape(-1))
    offs, n = [], 0
    for part in parts:
        offs.append(n)
        n += len(part) + (-len(part) % _ALIGN)
    flat = np.zeros(n, dtype=np.int32)
    for off, part in zip(offs, parts):
        flat[off : off + len(part)] = part
    host = torch.from_numpy(flat)
    device = torch.device(device)
    if device.type == "cuda":
        buf = host.pin_memory().to(device, non_blocking=True)
    else:
        buf = host.to(device)
    ci = buf[offs[0] : offs[0] + len(parts[0])].view(-1, 4)
    si = buf[offs[1] : offs[1] + len(parts[1])].view(-1, 4)
    ss = buf[offs[2] : offs[2] + len(parts[2])]
    return ci, si, ss


def upload(values, device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list or array) as a tensor on ``device``: on a GPU through pinned memory and
    an asynchronous copy (a copy from pageable memory waits until the device's queue drains, so
    the host could not run ahead of the kernels)."""
    host = torch.as_tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def resolve_metadata(
    B, T, device, cu_seqlens, start_positions, boundary_stride, boundary_indices, chunk_metadata
) -> ChunkMetadata:
    if chunk_metadata is not None:
        return chunk_metadata
    if cu_seqlens is None:
        cu = [b * T for b in range(B + 1)]
    else:
        if B != 1:
            raise ValueError("cu_seqlens needs B == 1")
        cu = cu_seqlens
    return prepare_chunk_metadata(
        cu, start_positions, boundary_stride=boundary_stride, boundary_indices=boundary_indices, device=device
    )


#: chunk metadata of calls made without ``chunk_metadata``, by layout (``remembered_metadata``)
_REMEMBERED: dict = {}
_MAX_REMEMBERED = 32
#: metadata built for a layout not seen before (``remembered_metadata``): what a test counts
REMEMBERED_BUILDS = [0]


def _host_ints(x):
    """``x`` (None, a list / tuple of ints or a CPU tensor) as a tuple of ints, None for None, or
    ``False`` where reading it would cost a device sync (a CUDA tensor) or it is not such a sequence."""
    if x is None:
        return None
    if torch.is_tensor(x):
        return tuple(x.tolist()) if x.device.type == "cpu" and x.dim() == 1 else False
    if isinstance(x, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        return tuple(x)
    return False


def remembered_metadata(q, cu_seqlens, start_positions, boundary_stride, boundary_indices):
    """The chunk metadata of a call made without ``chunk_metadata``, built once per layout: the
    inputs' batch, length and device, ``cu_seqlens`` and ``start_positions`` (lists or CPU tensors),
    the boundary selection. A later call of the layout gets the same object, and with it the calls
    bound to it (``kernels.chunk_gdn``'s direct path): no chunk table built, uploaded or planned
    again. None where the layout cannot be read without a device sync (offsets on the GPU), or is
    wrong (the call's own checks then say what, in their order)."""
    if q.dim() != 4 or not isinstance(boundary_stride, int):
        return None
    cu, st = _host_ints(cu_seqlens), _host_ints(start_positions)
    if cu is False or st is False:
        return None
    bi = boundary_indices
    if bi is not None:
        if torch.is_tensor(bi):
            if bi.device.type != "cpu":
                return None
            bi = bi.tolist()
        try:
            bi = tuple(tuple(int(p) for p in row) if isinstance(row, (list, tuple)) else int(row) for row in bi)
        except (TypeError, ValueError):
            return None
    if cu is not None and q.shape[0] != 1:
        return None
    key = (tuple(q.shape[:2]), q.device, cu, st, boundary_stride, bi)
    meta = _REMEMBERED.get(key)
    if meta is None:
        try:
            meta = resolve_metadata(
                q.shape[0], q.shape[1], q.device, cu_seqlens, start_positions, boundary_stride, boundary_indices, None
            )
        except ValueError:
            return None  # the call's own checks raise it, in their order
        if len(_REMEMBERED) >= _MAX_REMEMBERED:
            _REMEMBERED.pop(next(iter(_REMEMBERED)))  # the oldest
        _REMEMBERED[key] = meta
        REMEMBERED_BUILDS[0] += 1
    return meta


def resolve_call(
    q, v, *, initial_state, cu_seqlens, start_positions, boundary_stride, boundary_indices, chunk_metadata,
    use_gate_in_kernel, A_log, dt_bias,
) -> ChunkMetadata:  # fmt: skip
    """What every implementation of the call checks after ``check_args`` (the in-kernel gate's
    parameters, the metadata's token count, the initial state's shape; ``ValueError``s), and the
    call's chunk metadata."""
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if use_gate_in_kernel and (A_log is None or dt_bias is None):
        raise ValueError("use_gate_in_kernel needs A_log and dt_bias")
    meta = resolve_metadata(
        B, T, q.device, cu_seqlens, start_positions, boundary_stride, boundary_indices, chunk_metadata
    )
    N, TT = meta.num_seqs, B * T
    if q.is_cuda and meta.chunk_info.device != q.device:
        raise ValueError(
            f"chunk_metadata is on {meta.chunk_info.device}, the inputs on {q.device} "
            "(prepare_chunk_metadata(..., device=q.device))"
        )
    if meta.total_tokens != TT:
        raise ValueError(f"metadata covers {meta.total_tokens} tokens, inputs have {TT}")
    if initial_state is not None and tuple(initial_state.shape) != (N, HV, K, V):
        raise ValueError(f"initial_state must be {(N, HV, K, V)}, got {tuple(initial_state.shape)}")
    return meta


#: the dtypes boundary states may be emitted in (``state_dtype``)
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_args(q, k, v, g, beta, *, max_head_dim: Optional[int] = MAX_HEAD_DIM, state_dtype=torch.float32):
    """Raise ValueError for anything the kernels cannot run (one clear line). ``max_head_dim``:
    the largest K / V (None: no limit, the plain-torch implementation); ``state_dtype``: the
    boundary states' dtype (``STATE_DTYPES``)."""
    if state_dtype not in STATE_DTYPES:
        names = ", ".join(str(t) for t in STATE_DTYPES)
        raise ValueError(f"state_dtype must be one of {names}; got {state_dtype!r}")
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-d [B, T, heads, dim]; got q{tuple(q.shape)} v{tuple(v.shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (B, T) or H == 0 or HV % H:
        raise ValueError(
            f"bad shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} "
            f"(need k == q, v [B, T, HV, V] with HV a multiple of H)"
        )
    if g.shape != (B, T, HV) or beta.shape != (B, T, HV):
        raise ValueError(f"g and beta must be [B, T, HV] = {(B, T, HV)}; got g{tuple(g.shape)} beta{tuple(beta.shape)}")
    top = max_head_dim if max_head_dim is not None else float("inf")
    for name, d in (("K", K), ("V", V)):
        if not MIN_HEAD_DIM <= d <= top:
            raise ValueError(f"head dim {name}={d} is not supported (need {MIN_HEAD_DIM} <= {name} <= {max_head_dim})")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q dtype {q.dtype} is not supported (float32, float16, bfloat16)")
    if not (q.device == k.device == v.device == g.device == beta.device):
        raise ValueError("q, k, v, g, beta must be on one device")
