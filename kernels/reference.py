"""Plain-torch fp32 oracles for the kernels in this package.

These are deliberately naive (one token at a time, one sequence at a time) and share no code with
the Triton kernels; every kernel test compares against them.

Conventions (the same as the kernels):
  q, k ``[B, T, H, K]``; v ``[B, T, HV, V]`` with ``HV % H == 0`` (value head ``i`` reads key head
  ``i // (HV // H)``); g (natural-log decay) and beta ``[B, T, HV]``; states ``[N, HV, K, V]``.
  Varlen: ``B == 1`` and ``cu_seqlens`` ``[N + 1]``.
  ``start_positions[n]`` is the absolute position of sequence n's first token in this call; a
  "boundary" is an absolute position that is a multiple of 64 strictly above the start and at most
  the end; the boundary state is the state after the token at absolute position ``b - 1``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def naive_gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Qwen3-Next gate in fp32: g = -exp(A_log) * softplus(a + dt_bias)."""
    return -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())


def _seq_bounds(B: int, T: int, cu_seqlens):
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
    assert B == 1, "varlen needs B == 1"
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def naive_gated_delta_rule(
    q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, start_positions=None, use_qk_l2norm=False
):
    """Per-token fp32 recurrence.

    Returns ``(o, final_state, boundary_states, boundary_positions)``: ``o`` fp32 ``[B, T, HV, V]``,
    ``final_state`` ``[N, HV, K, V]``, ``boundary_states`` ``[NB, HV, K, V]`` (all boundaries of all
    sequences, sequence-major, in position order) and ``boundary_positions``: a list (per sequence)
    of the absolute positions of its boundaries.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert HV % H == 0
    group = HV // H
    if scale is None:
        scale = K**-0.5
    dev = q.device
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * scale
    seqs = _seq_bounds(B, T, cu_seqlens)
    N = len(seqs)
    if start_positions is None:
        starts = [0] * N
    else:
        starts = [int(x) for x in (start_positions.tolist() if torch.is_tensor(start_positions) else start_positions)]
    o = torch.zeros(B, T, HV, V, dtype=torch.float32, device=dev)
    h0 = (
        initial_state.float()
        if initial_state is not None
        else torch.zeros(N, HV, K, V, dtype=torch.float32, device=dev)
    )
    # Sequences of equal length advance in lockstep (a batched token loop; still one token at a
    # time, no chunking), which keeps the oracle usable on a GPU at T = 32K.
    groups: dict = {}
    for n, (_b, bos, eos) in enumerate(seqs):
        groups.setdefault(eos - bos, []).append(n)
    finals = [None] * N
    per_seq_b = [[] for _ in range(N)]
    bpos = [[] for _ in range(N)]
    for L, ns in groups.items():
        take = lambda x: torch.stack([x[seqs[n][0], seqs[n][1] : seqs[n][2]] for n in ns])  # noqa
        qg, kg, vg, bg = take(q), take(k), take(v), take(beta)  # [G, L, HV, ...]
        eg = torch.exp(take(g))  # [G, L, HV]
        S = h0[ns].clone()  # [G, HV, K, V]
        og = torch.empty(len(ns), L, HV, V, dtype=torch.float32, device=dev)
        for t in range(L):
            S.mul_(eg[:, t, :, None, None])
            kt = kg[:, t]
            pred = torch.matmul(kt.unsqueeze(-2), S).squeeze(-2)  # [G, HV, V]
            delta = bg[:, t, :, None] * (vg[:, t] - pred)
            S.add_(kt.unsqueeze(-1) * delta.unsqueeze(-2))
            og[:, t] = torch.matmul(qg[:, t].unsqueeze(-2), S).squeeze(-2)
            for i, n in enumerate(ns):
                p = starts[n] + t + 1
                if p % CHUNK == 0:
                    per_seq_b[n].append(S[i].clone())
                    bpos[n].append(p)
        for i, n in enumerate(ns):
            b, bos, eos = seqs[n]
            o[b, bos:eos] = og[i]
            finals[n] = S[i]
    bstates = [s for lst in per_seq_b for s in lst]
    final = torch.stack(finals) if finals else torch.zeros(0, HV, K, V, device=dev)
    bs = torch.stack(bstates) if bstates else torch.zeros(0, HV, K, V, device=dev)
    return o, final, bs, bpos


def naive_recurrent_step(q, k, v, g, beta, state, *, scale=None, use_qk_l2norm=False):
    """One decode step for N sequences: q, k ``[N, H, K]``, v ``[N, HV, V]``, g, beta ``[N, HV]``,
    state ``[N, HV, K, V]``. Returns ``(o [N, HV, V], new_state)`` in fp32."""
    o, final, _, _ = naive_gated_delta_rule(
        q[:, None],
        k[:, None],
        v[:, None],
        g[:, None],
        beta[:, None],
        scale=scale,
        initial_state=state,
        use_qk_l2norm=use_qk_l2norm,
    )
    return o[:, 0], final


def naive_causal_conv1d(
    x, weight, bias=None, *, conv_state=None, cu_seqlens=None, start_positions=None, activation="silu"
):
    """Depthwise causal conv through ``F.conv1d`` in fp32.

    x ``[B, T, D]``; weight ``[D, W]``; conv_state ``[N, D, W-1]`` holds the W-1 inputs before each
    sequence's first token (zeros if None). Returns ``(y, final_conv_state, boundary_windows,
    boundary_positions)``: for each boundary b (as in ``naive_gated_delta_rule``) the inputs
    ``x[b-W+1 .. b-1]`` as ``[D, W-1]``.
    """
    B, T, D = x.shape
    W = weight.shape[1]
    seqs = _seq_bounds(B, T, cu_seqlens)
    N = len(seqs)
    starts = (
        [0] * N
        if start_positions is None
        else [int(s) for s in (start_positions.tolist() if torch.is_tensor(start_positions) else start_positions)]
    )
    y = torch.zeros(B, T, D, dtype=torch.float32, device=x.device)
    finals, wins, bpos = [], [], []
    for n, (b, bos, eos) in enumerate(seqs):
        prev = conv_state[n].float() if conv_state is not None else torch.zeros(D, W - 1, device=x.device)
        xs = torch.cat([prev, x[b, bos:eos].float().t()], dim=1)  # [D, W-1+L]
        L = eos - bos
        if L == 0:
            finals.append(prev.clone())
            bpos.append([])
            continue
        out = F.conv1d(xs[None], weight.float()[:, None, :], None if bias is None else bias.float(), groups=D)[
            0
        ]  # [D, L]
        if activation in ("silu", "swish"):
            out = F.silu(out)
        y[b, bos:eos] = out.t()
        finals.append(xs[:, L : L + W - 1].clone())
        pl = []
        for j in range(1, L + 1):
            p = starts[n] + j
            if p % CHUNK == 0:
                wins.append(xs[:, j : j + W - 1].clone())  # inputs at local j-W+1 .. j-1
                pl.append(p)
        bpos.append(pl)
    final = torch.stack(finals)
    bw = torch.stack(wins) if wins else torch.zeros(0, D, W - 1, device=x.device)
    return y, final, bw, bpos
