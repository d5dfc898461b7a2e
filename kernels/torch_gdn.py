"""The chunked gated delta rule and the causal conv1d of ``kernels.chunk_gdn`` / ``kernels.conv``
in plain torch: the same signatures, chunk grid and boundary outputs, for machines without a GPU
(Triton's interpreter runs the kernels one program at a time, which is orders of magnitude slower).
This module never imports triton.

    from kernels.torch_gdn import chunk_gated_delta_rule, causal_conv1d

Layout. Every sequence of the call is laid on its absolute 64-token chunk grid: a sequence that
starts at ``p`` with ``p % 64 != 0`` gets ``p % 64`` virtual rows in front of its first token
(the ragged first chunk), and every sequence is padded after its last token to the longest
sequence's chunk count. Virtual rows are gathered from a zero row with zero gate, so they change
nothing: key 0 and beta 0 add nothing to the state, decay exp(0) = 1 keeps it. All chunks of all
sequences and value heads are then one batch ``[N, C, HV, 64, .]``.

Math (fp32 throughout; per value head, gamma = chunk-local cumsum of the log decay g):
  L   = strict_tril(diag(beta) (K K^T o exp(gamma_i - gamma_j)))
  w   = (I + L)^-1 diag(beta exp(gamma)) K,   u = (I + L)^-1 diag(beta) V
        (one batched unit-lower-triangular solve for all chunks; the UT transform of the
        delta rule: chunk-start state S, the corrected values v' = u - w S)
  O   = diag(exp(gamma)) Q S + tril(Q K^T o exp(gamma_i - gamma_j)) v'
  S  <- exp(gamma_last) S + (diag(exp(gamma_last - gamma)) K)^T v'
Everything but the last three lines runs batched over all chunks; the loop over chunks (the only
serial dependence) is vectorised over sequences and heads. q / k are l2-normalised
(``x / sqrt(|x|^2 + 1e-6)``) and q scaled before any product; value head i reads key head
``i // (HV // H)``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from kernels._common import CHUNK, ChunkMetadata, check_args, resolve_call, resolve_metadata

__all__ = ["chunk_gated_delta_rule", "causal_conv1d", "torch_chunk_gated_delta_rule", "torch_causal_conv1d"]


class _Grid:
    """The chunk grid of one call as gather indices (built from the metadata's host lists: no
    device-to-host sync).

    ``rows [N * C * 64]``: the token row of every grid row (``TT``, one past the last token, for a
    virtual row); ``back [TT]``: the grid row of every token; ``ends[c]``: ``(sequence ids,
    boundary slots)`` of the boundaries emitted at the end of chunk column ``c``."""

    def __init__(self, meta: ChunkMetadata, device):
        cu, starts = meta.cu_seqlens, meta.start_positions
        N = meta.num_seqs
        self.N, self.TT = N, cu[-1]
        ragged = [p % CHUNK for p in starts]
        self.C = C = meta.max_chunks
        G = C * CHUNK
        bos = torch.tensor(cu[:-1], dtype=torch.int64, device=device)
        eos = torch.tensor(cu[1:], dtype=torch.int64, device=device)
        r = torch.tensor(ragged, dtype=torch.int64, device=device)
        src = bos[:, None] - r[:, None] + torch.arange(G, dtype=torch.int64, device=device)[None]
        real = (src >= bos[:, None]) & (src < eos[:, None])
        self.rows = torch.where(real, src, self.TT).reshape(-1)
        lengths = eos - bos
        seq = torch.repeat_interleave(torch.arange(N, device=device), lengths, output_size=self.TT)
        shift = torch.arange(N, device=device) * G + r - bos  # grid row - token row
        self.back = torch.arange(self.TT, device=device) + shift[seq]
        ends: dict = {}
        for n in range(N):
            first = starts[n] - ragged[n]  # absolute start of the grid
            for j, b in enumerate(meta.boundary_positions[n]):
                c = (b - first) // CHUNK - 1
                ends.setdefault(c, ([], []))
                ends[c][0].append(n)
                ends[c][1].append(meta.boundary_offsets[n] + j)
        self.ends = {
            c: (torch.tensor(ns, device=device), torch.tensor(sl, device=device)) for c, (ns, sl) in ends.items()
        }

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``x [TT, ...]`` on the grid: ``[N, C, 64, ...]``, zeros in virtual rows."""
        padded = torch.cat([x, x.new_zeros((1,) + tuple(x.shape[1:]))])
        return padded.index_select(0, self.rows).view(self.N, self.C, CHUNK, *x.shape[1:])


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


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
):
    """Chunked gated-delta-rule forward in plain torch: the arguments and results of
    ``kernels.chunk_gdn.chunk_gated_delta_rule`` (``input_precision`` is accepted and ignored:
    every product is fp32). Any head dims K, V >= 1.

    Returns ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] fp32, boundary_states
    [NB, HV, K, V] in state_dtype or None)``."""
    check_args(q, k, v, g, beta, max_head_dim=None, state_dtype=state_dtype)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
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
    dev, dt, f32 = q.device, q.dtype, torch.float32
    if scale is None:
        scale = K**-0.5
    N, TT = meta.num_seqs, B * T
    S = initial_state.to(f32).clone() if initial_state is not None else torch.zeros(N, HV, K, V, dtype=f32, device=dev)
    hb = torch.empty(meta.num_boundaries, HV, K, V, dtype=state_dtype, device=dev) if boundary_states else None
    if meta.num_chunks == 0:
        return torch.zeros(B, T, HV, V, dtype=dt, device=dev), S, hb

    qf, kf = q.reshape(TT, H, K).to(f32), k.reshape(TT, H, K).to(f32)
    vf = v.reshape(TT, HV, V).to(f32)
    gf, bf = g.reshape(TT, HV).to(f32), beta.reshape(TT, HV).to(f32)
    if use_gate_in_kernel:
        gf = -torch.exp(A_log.to(f32)) * F.softplus(gf + dt_bias.to(f32))
    if use_beta_sigmoid:
        bf = torch.sigmoid(bf)
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf = qf * scale

    grid = _Grid(meta, dev)
    C = grid.C
    # [N, C, heads, 64, dim]: chunk rows last but one, so the products below are batched matmuls
    Q = grid.gather(qf).permute(0, 1, 3, 2, 4)
    Kc = grid.gather(kf).permute(0, 1, 3, 2, 4)
    Vc = grid.gather(vf).permute(0, 1, 3, 2, 4)
    gam = grid.gather(gf).permute(0, 1, 3, 2).cumsum(-1)  # [N, C, HV, 64]
    bt = grid.gather(bf).permute(0, 1, 3, 2)

    def per_value_head(x):  # [N, C, H, ...] -> HV heads
        return x.repeat_interleave(group, dim=2) if group > 1 else x

    idx = torch.arange(CHUNK, device=dev)
    causal = idx[:, None] >= idx[None, :]
    strict = idx[:, None] > idx[None, :]
    decay = torch.exp((gam[..., :, None] - gam[..., None, :]).masked_fill(~causal, float("-inf")))
    KK = per_value_head(Kc @ Kc.transpose(-1, -2))  # [N, C, HV, 64, 64]
    L = (bt[..., :, None] * KK * decay).masked_fill(~strict, 0.0)
    Kv = per_value_head(Kc)  # [N, C, HV, 64, K]
    eg = torch.exp(gam)
    rhs = torch.cat([Kv * (bt * eg)[..., None], Vc * bt[..., None]], dim=-1)
    # (I + L) X = rhs; the solver reads only the strict lower triangle (unit diagonal assumed)
    wu = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
    w, u = wu[..., :K], wu[..., K:]
    g_last = gam[..., -1]  # [N, C, HV]
    kd = (Kv * torch.exp(g_last[..., None] - gam)[..., None]).transpose(-1, -2)  # [.., K, 64]
    qg = per_value_head(Q) * eg[..., None]
    P = per_value_head(Q @ Kc.transpose(-1, -2)) * decay  # causal (decay 0 above)
    fl = torch.exp(g_last)[..., None, None]

    out = torch.empty(N, C, HV, CHUNK, V, dtype=f32, device=dev)
    for c in range(C):
        vn = u[:, c] - w[:, c] @ S  # corrected values v'
        out[:, c] = qg[:, c] @ S + P[:, c] @ vn
        S = S * fl[:, c] + kd[:, c] @ vn
        if hb is not None and c in grid.ends:
            ns, slots = grid.ends[c]
            hb[slots] = S[ns].to(state_dtype)
    o = out.permute(0, 1, 3, 2, 4).reshape(N * C * CHUNK, HV, V).index_select(0, grid.back)
    return o.to(dt).reshape(B, T, HV, V), S, hb


def causal_conv1d(
    x,
    weight,
    bias=None,
    *,
    conv_state=None,
    cu_seqlens=None,
    start_positions=None,
    activation: Optional[str] = "silu",
    boundary_conv_states=True,
    boundary_stride=1,
    boundary_indices=None,
    chunk_metadata: Optional[ChunkMetadata] = None,
):
    """Depthwise causal conv1d in plain torch: the arguments and results of
    ``kernels.conv.causal_conv1d`` (any width W >= 2). x ``[B, T, D]``, weight ``[D, W]``,
    conv_state ``[N, D, W-1]`` (any strides). Returns ``(y [B, T, D] in x's dtype,
    final_conv_state [N, D, W-1], boundary_conv_states [NB, D, W-1] or None)``, states in
    conv_state's dtype (x's without one)."""
    B, T, D = x.shape
    W = weight.shape[-1]
    if weight.shape != (D, W) or W < 2:
        raise ValueError("weight must be [D, W] with W >= 2")
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"unknown activation {activation!r}")
    dev, f32 = x.device, torch.float32
    meta = resolve_metadata(B, T, dev, cu_seqlens, start_positions, boundary_stride, boundary_indices, chunk_metadata)
    N, TT = meta.num_seqs, B * T
    if meta.total_tokens != TT:
        raise ValueError(f"metadata covers {meta.total_tokens} tokens, inputs have {TT}")
    if conv_state is not None and tuple(conv_state.shape) != (N, D, W - 1):
        raise ValueError(f"conv_state must be {(N, D, W - 1)}")
    cs_dtype = conv_state.dtype if conv_state is not None else x.dtype
    # one table of pre-conv inputs: the tokens, then each sequence's W-1 incoming inputs, then 0
    parts = [x.reshape(TT, D).to(f32)]
    if conv_state is not None:
        parts.append(conv_state.to(f32).transpose(1, 2).reshape(N * (W - 1), D))
    parts.append(x.new_zeros(1, D, dtype=f32))
    table = torch.cat(parts)
    zero_row = table.shape[0] - 1
    cu = torch.tensor(meta.cu_seqlens, dtype=torch.int64, device=dev)
    bos = cu[:-1]

    def rows(src, n):
        """Table rows of the inputs at token rows ``src`` of sequences ``n`` (broadcast): a row
        before the sequence's first token reads its incoming conv state (or zero)."""
        if conv_state is None:
            before = torch.full_like(src, zero_row)
        else:
            before = TT + n * (W - 1) + (W - 1) + (src - bos[n])
        return torch.where(src >= bos[n], src, before)

    seq = torch.repeat_interleave(torch.arange(N, device=dev), cu[1:] - bos, output_size=TT)
    t = torch.arange(TT, device=dev)
    w32 = weight.to(f32)
    y = bias.to(f32)[None].expand(TT, D) if bias is not None else torch.zeros(TT, D, dtype=f32, device=dev)
    for i in range(W):
        y = y + table.index_select(0, rows(t - (W - 1) + i, seq)) * w32[:, i]
    if activation in ("silu", "swish"):
        y = F.silu(y)

    def windows(ends, n):
        """The W-1 inputs before token rows ``ends`` (exclusive) as ``[len(ends), D, W-1]``."""
        src = ends[:, None] - (W - 1) + torch.arange(W - 1, device=dev)[None]
        r = rows(src, n[:, None])
        return table.index_select(0, r.reshape(-1)).view(-1, W - 1, D).transpose(1, 2).to(cs_dtype)

    final = windows(cu[1:], torch.arange(N, device=dev))
    cb = None
    if boundary_conv_states:
        ns, ends = [], []
        for n in range(N):
            for b in meta.boundary_positions[n]:
                ns.append(n)
                ends.append(meta.cu_seqlens[n] + b - meta.start_positions[n])
        if ends:
            cb = windows(torch.tensor(ends, device=dev), torch.tensor(ns, device=dev))
        else:
            cb = torch.empty(0, D, W - 1, dtype=cs_dtype, device=dev)
    return y.to(x.dtype).reshape(B, T, D), final.contiguous(), cb if cb is None else cb.contiguous()


# the names ``kernels`` exports them under (beside the Triton kernels' own names)
torch_chunk_gated_delta_rule = chunk_gated_delta_rule
torch_causal_conv1d = causal_conv1d
