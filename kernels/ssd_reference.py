"""Per-token fp32 oracle of the Mamba2 selective state update (SSD), for the tests of
``kernels.ssd`` and ``kernels.torch_ssd``. Deliberately naive: one token at a time, no chunking,
sharing no code with the kernels.

Per head h (head dim P, state dim N), with B and C shared by the ``H // G`` heads of a group:

    dt_t = clamp(softplus(dt_raw_t + dt_bias_h), dt_min, dt_max)   (softplus and bias optional)
    h_t  = exp(dt_t * A_h) * h_{t-1} + dt_t * x_t B_t^T            (state [P, N])
    y_t  = h_t C_t + D_h * x_t                                    (y_t [P])

``A_h`` is the (negative) decay rate, ``-exp(A_log_h)`` in a checkpoint. Shapes: x ``[B, T, H, P]``,
dt ``[B, T, H]``, B and C ``[B, T, G, N]``, A ``[H]``, D ``[H]`` or ``[H, P]``; states
``[num_seqs, H, P, N]`` (mamba_ssm's ``ssm_state`` layout: head dim before state dim). Varlen:
``B == 1`` and ``cu_seqlens``. Boundaries as in ``kernels.reference``: absolute positions that are
multiples of 64 strictly after a sequence's start and at most its end; the state at boundary b is
the state after the token at absolute position ``b - 1``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.reference import CHUNK, _seq_bounds

__all__ = ["naive_ssd", "naive_ssd_dt"]


def naive_ssd_dt(dt, dt_bias=None, *, dt_softplus=True, dt_limit=(0.0, float("inf"))):
    """The step size in fp32: ``clamp(softplus(dt + dt_bias), *dt_limit)``."""
    d = dt.float()
    if dt_bias is not None:
        d = d + dt_bias.float()
    if dt_softplus:
        d = F.softplus(d)  # threshold 20: x itself above it, as mamba_ssm's kernels do
    lo, hi = dt_limit
    if lo > 0.0 or hi != float("inf"):
        d = d.clamp(lo, hi)
    return d


def naive_ssd(
    x,
    dt,
    A,
    B,
    C,
    *,
    D=None,
    dt_bias=None,
    dt_softplus=True,
    dt_limit=(0.0, float("inf")),
    initial_state=None,
    cu_seqlens=None,
    start_positions=None,
):
    """Returns ``(y fp32 [B, T, H, P], final_state [S, H, P, N], boundary_states [NB, H, P, N],
    boundary_positions)`` (boundaries of all sequences, sequence-major, in position order)."""
    Bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    rep = H // G
    dev = x.device
    xf = x.float()
    d = naive_ssd_dt(dt, dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)  # [B, T, H]
    Bh = B.float().repeat_interleave(rep, dim=2)  # [B, T, H, N]
    Ch = C.float().repeat_interleave(rep, dim=2)
    a = A.float()
    seqs = _seq_bounds(Bsz, T, cu_seqlens)
    S_n = len(seqs)
    starts = [0] * S_n if start_positions is None else [int(s) for s in start_positions]
    y = torch.zeros(Bsz, T, H, P, dtype=torch.float32, device=dev)
    finals, bstates, bpos = [], [], []
    for n, (b, bos, eos) in enumerate(seqs):
        h = (
            initial_state[n].float().clone()
            if initial_state is not None
            else torch.zeros(H, P, N, dtype=torch.float32, device=dev)
        )
        pl = []
        for t in range(bos, eos):
            dtt = d[b, t]  # [H]
            h = torch.exp(dtt * a)[:, None, None] * h + (dtt[:, None] * xf[b, t])[:, :, None] * Bh[b, t][:, None, :]
            y[b, t] = (h * Ch[b, t][:, None, :]).sum(-1)
            p = starts[n] + (t - bos) + 1
            if p % CHUNK == 0:
                bstates.append(h.clone())
                pl.append(p)
        finals.append(h)
        bpos.append(pl)
    if D is not None:
        Df = D.float()
        y = y + xf * (Df[:, None] if Df.dim() == 1 else Df)
    final = torch.stack(finals) if finals else torch.zeros(0, H, P, N, device=dev)
    bs = torch.stack(bstates) if bstates else torch.zeros(0, H, P, N, device=dev)
    return y, final, bs, bpos
