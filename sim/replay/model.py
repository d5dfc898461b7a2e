"""The replayed model: a stack of gated-delta-net blocks at a preset's shapes, weights from a seed.

Needs torch and the project's Triton kernels; the CLI imports this module lazily so that the
simulator never needs torch.

One block (Qwen3-Next / Qwen3.5 linear-attention layer, without its MLP):
  h = rmsnorm(x); [qkv | z | a | b] = h W_in
  qkv -> causal conv1d (width W, window state) + SiLU -> q, k, v
  o = chunk_gated_delta_rule(q, k, v, a, b)  (gate -exp(A_log) softplus(a + dt_bias), beta
      sigmoid(b) and q/k l2norm inside the kernel; fp32 recurrent state)
  x <- x + (rmsnorm_per_head(o) * w_norm * silu(z)) W_out      (x, the residual stream, in fp32)
Each block feeds the next, so layer l's state after a prefix depends on the whole prefix, as in a
real model. Token ids index the embedding modulo ``vocab_rows`` (a smaller table than the real
vocabulary: the state is still a deterministic function of the token ids).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from kernels._common import CHUNK, prepare_chunk_metadata
from kernels.chunk_gdn import chunk_gated_delta_rule
from kernels.conv import causal_conv1d

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class ReplayShape:
    """Shapes of the replayed stack (one gated-delta layer repeated ``layers`` times)."""

    hidden: int
    layers: int
    k_heads: int
    v_heads: int
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_width: int = 4
    vocab_rows: int = 1 << 16

    def __post_init__(self) -> None:
        if self.layers < 1 or self.hidden < 1:
            raise ValueError("a replay stack needs at least one layer and a positive hidden size")
        if self.v_heads % self.k_heads:
            raise ValueError("v_heads must be a multiple of k_heads")

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.head_k_dim + self.v_heads * self.head_v_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.head_v_dim

    @property
    def proj_dim(self) -> int:
        return self.conv_dim + self.value_dim + 2 * self.v_heads

    @classmethod
    def from_spec(cls, spec, layers: Optional[int] = None, vocab_rows: int = 1 << 16) -> "ReplayShape":
        """Shapes of a cost-model preset's gated-delta layers (``spec``: ``sim.cost.ModelSpec``)."""
        n = spec.n_gdn if layers is None else layers
        return cls(hidden=spec.d_model, layers=n, k_heads=spec.gdn_k_heads,
                   v_heads=spec.gdn_v_heads, head_k_dim=spec.gdn_head_k_dim,
                   head_v_dim=spec.gdn_head_v_dim, conv_width=spec.gdn_conv_width,
                   vocab_rows=vocab_rows)

    def state_bytes(self, act_dtype: torch.dtype) -> int:
        """Bytes of one stack checkpoint: fp32 recurrent states + conv windows in ``act_dtype``."""
        elt = torch.empty((), dtype=act_dtype).element_size()
        rec = self.v_heads * self.head_k_dim * self.head_v_dim * 4
        conv = self.conv_dim * (self.conv_width - 1) * elt
        return self.layers * (rec + conv)


@dataclass
class StackState:
    """The state of every replayed layer after ``pos`` tokens: recurrent ``[L, Hv, K, V]`` fp32,
    conv windows ``[L, conv_dim, W-1]`` in the activation dtype."""

    pos: int
    rec: torch.Tensor
    conv: torch.Tensor

    def clone(self) -> "StackState":
        return StackState(self.pos, self.rec.clone(), self.conv.clone())


# on_state(position, layer, recurrent [Hv, K, V] fp32, conv window [conv_dim, W-1])
StateSink = Callable[[int, int, torch.Tensor, torch.Tensor], None]


class GDNStack:
    """Weights of the replayed stack, drawn from ``seed`` on ``device``, and its forward pass."""

    def __init__(self, shape: ReplayShape, *, device="cpu", dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> None:
        self.shape = shape
        self.device = torch.device(device)
        self.dtype = dtype
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        s = shape

        def randn(*size, std):
            return (torch.randn(*size, generator=gen, device=self.device, dtype=torch.float32)
                    * std).to(dtype)

        self.embedding = randn(s.vocab_rows, s.hidden, std=1.0)
        self.layers = []
        for _ in range(s.layers):
            u = torch.rand(s.v_heads, generator=gen, device=self.device)
            dt = torch.exp(math.log(1e-3) + u * (math.log(0.1) - math.log(1e-3)))
            self.layers.append(dict(
                w_in=randn(s.hidden, s.proj_dim, std=s.hidden ** -0.5),
                conv_w=randn(s.conv_dim, s.conv_width, std=0.5),
                # Mamba2 / FLA-style initialisation: A in [1, 16], dt in [1e-3, 0.1]
                A_log=torch.log(1 + 15 * torch.rand(s.v_heads, generator=gen, device=self.device)),
                dt_bias=dt + torch.log(-torch.expm1(-dt)),   # softplus^-1(dt)
                norm_w=torch.ones(s.head_v_dim, device=self.device, dtype=torch.float32),
                w_out=randn(s.value_dim, s.hidden, std=0.5 * s.value_dim ** -0.5),
            ))

    # ---- states ------------------------------------------------------------------------------
    def zero_state(self) -> StackState:
        s = self.shape
        return StackState(0,
                          torch.zeros(s.layers, s.v_heads, s.head_k_dim, s.head_v_dim,
                                      dtype=torch.float32, device=self.device),
                          torch.zeros(s.layers, s.conv_dim, s.conv_width - 1, dtype=self.dtype,
                                      device=self.device))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The residual stream is kept in fp32 (matmul and kernel inputs are in ``dtype``), so the
        restore-vs-scratch comparison sees the kernels' differences, not residual rounding."""
        return self.embedding[tokens % self.shape.vocab_rows].float()

    # ---- forward -----------------------------------------------------------------------------
    def _layer(self, l: int, x: torch.Tensor, meta, rec0, conv0, want_boundaries: bool):
        s, w = self.shape, self.layers[l]
        T = x.shape[0]
        h = F.rms_norm(x, (s.hidden,), eps=1e-6).to(self.dtype)
        proj = h @ w["w_in"]
        c, v = s.conv_dim, s.value_dim
        qkv = proj[:, :c]
        z = proj[:, c:c + v]
        a = proj[:, c + v:c + v + s.v_heads]
        b = proj[:, c + v + s.v_heads:]
        y, conv_end, conv_b = causal_conv1d(
            qkv[None], w["conv_w"], None, conv_state=None if conv0 is None else conv0[None],
            chunk_metadata=meta, activation="silu", boundary_conv_states=want_boundaries)
        y = y[0]
        nk = s.k_heads * s.head_k_dim
        q = y[:, :nk].view(1, T, s.k_heads, s.head_k_dim)
        k = y[:, nk:2 * nk].view(1, T, s.k_heads, s.head_k_dim)
        vv = y[:, 2 * nk:].view(1, T, s.v_heads, s.head_v_dim)
        o, rec_end, rec_b = chunk_gated_delta_rule(
            q, k, vv, a[None], b[None], initial_state=None if rec0 is None else rec0[None],
            chunk_metadata=meta, use_qk_l2norm=True, A_log=w["A_log"], dt_bias=w["dt_bias"],
            use_gate_in_kernel=True, use_beta_sigmoid=True, boundary_states=want_boundaries)
        o = F.rms_norm(o[0].float(), (s.head_v_dim,), weight=w["norm_w"], eps=1e-6)
        o = o * F.silu(z.float().view(T, s.v_heads, s.head_v_dim))
        x = x + (o.to(self.dtype).reshape(T, v) @ w["w_out"]).float()
        return x, rec_end[0], conv_end[0], rec_b, conv_b

    def forward_segment(self, x: torch.Tensor, state: Optional[StackState], start: int,
                        boundaries: list[int], on_state: Optional[StateSink] = None,
                        keep_outputs: bool = False):
        """Run all layers over embedded tokens ``x`` ``[T, hidden]`` at absolute positions
        ``[start, start + T)`` from ``state`` (None: zeros). ``boundaries``: 64-aligned positions
        in ``(start, start + T)`` whose states go to ``on_state`` (from the kernels' boundary
        outputs). Returns ``(x_out, final StackState, per-layer outputs or None)``."""
        T = x.shape[0]
        L = self.shape.layers
        meta = prepare_chunk_metadata([0, T], [start], boundary_indices=list(boundaries),
                                      device=self.device)
        want = bool(boundaries)
        recs, convs, outs = [], [], [] if keep_outputs else None
        for l in range(L):
            r0 = None if state is None else state.rec[l]
            c0 = None if state is None else state.conv[l]
            x, r1, c1, rb, cb = self._layer(l, x, meta, r0, c0, want)
            recs.append(r1)
            convs.append(c1)
            if keep_outputs:
                outs.append(x)
            if want and on_state is not None:
                for j, p in enumerate(meta.boundary_positions[0]):
                    on_state(p, l, rb[j], cb[j])
        final = StackState(start + T, torch.stack(recs), torch.stack(convs))
        return x, final, outs

    def run(self, tokens: torch.Tensor, state: Optional[StackState], start: int,
            wanted=(), on_state: Optional[StateSink] = None, keep_outputs: bool = False):
        """Prefill ``tokens`` (the ids at absolute positions ``[start, start + T)``) from
        ``state`` and hand the state at every position of ``wanted`` in ``(start, start + T]``
        to ``on_state``: 64-aligned positions come from the kernels' boundary states; others
        split the call there (the state is handed over between the two calls); the end comes
        from the final state. Returns ``(final StackState, per-layer outputs [L][T, hidden]
        or None, number of kernel calls per layer)``."""
        T = int(tokens.shape[0])
        end = start + T
        wanted = sorted({int(p) for p in wanted})
        for p in wanted:
            if not start < p <= end:
                raise ValueError(f"position {p} is outside the call range ({start}, {end}]")
        if T == 0:
            st = state if state is not None else self.zero_state()
            empty = [self.embed(tokens)] * self.shape.layers if keep_outputs else None
            return StackState(start, st.rec, st.conv), empty, 0
        cuts = [p for p in wanted if p % CHUNK and p < end] + [end]
        x_all = self.embed(tokens)
        outs = [[] for _ in range(self.shape.layers)] if keep_outputs else None
        s0 = start
        calls = 0
        for cut in cuts:
            bnd = [p for p in wanted if s0 < p < cut and p % CHUNK == 0]
            _, state, o = self.forward_segment(x_all[s0 - start:cut - start], state, s0, bnd,
                                               on_state, keep_outputs)
            calls += 1
            if keep_outputs:
                for l in range(self.shape.layers):
                    outs[l].append(o[l])
            if cut in wanted and on_state is not None:
                for l in range(self.shape.layers):
                    on_state(cut, l, state.rec[l], state.conv[l])
            s0 = cut
        if keep_outputs:
            outs = [torch.cat(o) for o in outs]
        return state, outs, calls
