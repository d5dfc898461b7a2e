"""The chunked SSD (Mamba2) forward of ``kernels.ssd`` in plain torch: the same arguments, chunk
grid and boundary outputs, for machines without a GPU (the Triton interpreter runs one program at
a time). Never imports triton.

Every sequence is laid on its absolute 64-token chunk grid as in ``kernels.torch_gdn`` (virtual
rows in front of a ragged first chunk and after the last token, with dt = 0: they add nothing and
decay nothing); all chunks of all sequences and heads are then one batch. fp32 throughout:

    gamma = chunk-local cumsum of dt A,   s_c = X^T diag(exp(gamma_last - gamma) dt) B
    Y_c   = diag(exp(gamma)) C S_{c-1}^T + (C B^T o Lmask) diag(dt) X + D X
    S_c   = exp(gamma_last) S_{c-1} + s_c          (the only serial step, vectorised over
                                                    sequences and heads)
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from kernels._common import CHUNK
from kernels.ssd_args import ssd_call
from kernels.torch_gdn import _Grid

__all__ = ["chunk_ssd", "torch_chunk_ssd"]


def _dt(dt, dt_bias, dt_softplus, dt_limit):
    d = dt.float()
    if dt_bias is not None:
        d = d + dt_bias.float()
    if dt_softplus:
        d = F.softplus(d)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if lo > 0.0 or hi != float("inf"):
        d = d.clamp(lo, hi)
    return d


def chunk_ssd(x, dt, A, B, C, **options):
    """``kernels.ssd.chunk_ssd`` in plain torch, with its options (``kernels.ssd_args.ssd_call``;
    ``input_precision`` is accepted and ignored: every product is fp32; any head / state dim).
    Returns ``(y [Bsz, T, H, P] in x's dtype, final_state [S, H, P, N] fp32, boundary_states
    [NB, H, P, N] in state_dtype or None)``."""
    c = ssd_call(x, dt, A, B, C, **options, max_dim=None)
    D, dt_bias, dt_softplus, dt_limit = c.D, c.dt_bias, c.dt_softplus, c.dt_limit
    initial_state, state_dtype, boundary_states, meta = c.initial_state, c.state_dtype, c.boundary_states, c.meta
    Bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    rep = H // G
    dev, f32 = x.device, torch.float32
    S_n, TT = meta.num_seqs, Bsz * T
    S = initial_state.to(f32).clone() if initial_state is not None else torch.zeros(S_n, H, P, N, dtype=f32, device=dev)
    hb = torch.empty(meta.num_boundaries, H, P, N, dtype=state_dtype, device=dev) if boundary_states else None
    if meta.num_chunks == 0:
        return torch.zeros(Bsz, T, H, P, dtype=x.dtype, device=dev), S, hb
    d = _dt(dt.reshape(TT, H), dt_bias, dt_softplus, dt_limit)  # [TT, H]; virtual rows gather 0
    grid = _Grid(meta, dev)
    Cn = grid.C
    X = grid.gather(x.reshape(TT, H, P).to(f32)).permute(0, 1, 3, 2, 4)  # [S, C, H, 64, P]
    Bg = grid.gather(B.reshape(TT, G, N).to(f32)).permute(0, 1, 3, 2, 4)  # [S, C, G, 64, N]
    Cg = grid.gather(C.reshape(TT, G, N).to(f32)).permute(0, 1, 3, 2, 4)
    dg = grid.gather(d).permute(0, 1, 3, 2)  # [S, C, H, 64]
    gam = (dg * A.to(f32)[:, None]).cumsum(-1)
    last = gam[..., -1]  # [S, C, H]

    def per_head(t):  # [S, C, G, ...] -> heads
        return t.repeat_interleave(rep, dim=2) if rep > 1 else t

    Bh, Ch = per_head(Bg), per_head(Cg)
    wgt = torch.exp(last[..., None] - gam) * dg  # [S, C, H, 64]
    s = (X * wgt[..., None]).transpose(-1, -2) @ Bh  # chunk states [S, C, H, P, N]
    idx = torch.arange(CHUNK, device=dev)
    causal = idx[:, None] >= idx[None, :]
    seg = (gam[..., :, None] - gam[..., None, :]).masked_fill(~causal, float("-inf"))
    M = per_head(Cg @ Bg.transpose(-1, -2)) * torch.exp(seg) * dg[..., None, :]  # [S, C, H, 64, 64]
    y = M @ X
    eg = torch.exp(gam)[..., None]
    fl = torch.exp(last)[..., None, None]
    for c in range(Cn):
        y[:, c] += eg[:, c] * (Ch[:, c] @ S.transpose(-1, -2))
        S = S * fl[:, c] + s[:, c]
        if hb is not None and c in grid.ends:
            ns, slots = grid.ends[c]
            hb[slots] = S[ns].to(state_dtype)
    if D is not None:
        Df = D.to(f32)
        y = y + X * (Df[:, None, None] if Df.dim() == 1 else Df[:, None, :])
    out = y.permute(0, 1, 3, 2, 4).reshape(S_n * Cn * CHUNK, H, P).index_select(0, grid.back)
    return out.to(x.dtype).reshape(Bsz, T, H, P), S, hb


torch_chunk_ssd = chunk_ssd
