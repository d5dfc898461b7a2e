"""The replayed model: every layer type of a hybrid preset at its shapes, weights from a seed.

Needs torch, and triton for the ``triton`` gated-delta backend only; the CLI imports this module
lazily so that the simulator never needs torch.

A Qwen3-Next / Qwen3.5 layer is a token mixer (gated-delta linear attention, or gated full
attention every fourth layer) followed by an MLP, each behind an RMSNorm and a residual add:

  gated delta: h = rmsnorm(x); [qkv | z | a | b] = h W_in
               qkv -> causal conv1d (width W, window state) + SiLU -> q, k, v
               o = chunk_gated_delta_rule(q, k, v, a, b)  (gate -exp(A_log) softplus(a + dt_bias),
                   beta sigmoid(b), q/k l2norm in the kernel; fp32 recurrent state)
               x <- x + (rmsnorm_per_head(o) * w_norm * silu(z)) W_out
  attention:   h = rmsnorm(x); [q | gate] = h W_q, k = h W_k, v = h W_v; per-head RMSNorm of q, k;
               rotary embedding on a quarter of the head dim at absolute positions; the new keys
               and values are appended to the prefix's KV (restored from the paged KV store on a
               hit); o = SDPA(q, K, V) with a lower-right causal mask (the suffix attends to the
               whole prefix); x <- x + (o * sigmoid(gate)) W_o
  MLP:         x <- x + (silu(h W_gate) * h W_up) W_down, h = rmsnorm(x) (MoE presets: one dense
               SwiGLU at the active width: routed top-k + shared experts' intermediate sizes)

The residual stream is fp32 (matmul and kernel inputs in ``dtype``). Each layer feeds the next,
so every state and every key after a prefix depends on the whole prefix, as in a real model.
Token ids index the embedding modulo ``vocab_rows`` (a smaller table than the real vocabulary).

Every gated-delta call (conv + chunked core) goes through ``gated_delta`` with the model's
backend (``sim.replay.backends``): ``triton``, the project's kernels (compiled on a GPU, Triton's
interpreter on a CPU), or ``torch``, the same math in plain torch ops (``kernels.torch_gdn``: what
a CPU runs by default).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from kernels._common import CHUNK, prepare_chunk_metadata, upload
from sim.errors import UsageError
from sim.replay.backends import GDN_BACKENDS, default_kernel, resolve_kernel
from sim.replay.records import CHECK

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ATTN, GDN, MLP = "attention", "gated_delta", "mlp"
LAYER_TYPES = (ATTN, GDN, MLP)
ROPE_THETA = 1e7
ROTARY_FRACTION = 4  # rotary embedding on head_dim / 4 dimensions (Qwen3.5: factor 0.25)
NORM_EPS = 1e-6  # every RMS norm of the replayed model
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
#: how replay runs a prefill's attention (``marconi replay --attention``): ``sdpa``, SDPA's flash /
#: memory-efficient kernels (what the committed timing files were fitted with); ``cudnn``, SDPA's
#: cuDNN kernel on lengths padded to a few buckets (``attend_bucketed``): 2.2x faster at head dim
#: 256 and 8K-32K tokens on an H100 (61-67 % of the bf16 peak against 27-30 %,
#: benchmarks/attn_bench.py), bf16 / fp16 on a GPU only (elsewhere it runs as ``sdpa``)
ATTENTION_BACKENDS = ("sdpa", "cudnn")
#: how replay runs the norms, gates and activations around a layer's products (``marconi replay
#: --elementwise``): ``torch``, torch's ops, two to six passes over the activations each (what the
#: committed timing files were fitted with); ``fused``, one Triton kernel each (``kernels.norms``:
#: the sublayers' input norms, the gated-delta output gate, the SwiGLU activation, the q / k norm
#: and rotary embedding), on a GPU only (elsewhere it runs as ``torch``)
ELEMENTWISE = ("torch", "fused")
CUDNN_BACKENDS = [SDPBackend.CUDNN_ATTENTION]
#: cuDNN builds a plan per new length (40-50 ms on an H100): lengths are padded up to a multiple
#: of this, or of an eighth of their power of two when that is larger (at most 12.5 % padded)
ATTENTION_BUCKET = 1024
#: a suffix of Tq queries over Tk keys runs as a whole prompt (queries ahead padded with zeros)
#: when its own work is at least 1 / this of the whole prompt's x the cuDNN kernel's speed-up
#: (~2): Tk^2 / 2 < WHOLE_PROMPT_RATIO x Tq x (Tk - Tq / 2)
WHOLE_PROMPT_RATIO = 4


def spread(n_attn: int, n_gdn: int) -> list[str]:
    """Mixer types of ``n_attn + n_gdn`` layers, attention spread evenly and last in its group
    (Qwen3.5's 3 gated delta : 1 attention gives attention at layers 3, 7, 11, ...)."""
    n = n_attn + n_gdn
    at = {round((k + 1) * n / n_attn) - 1 for k in range(n_attn)} if n_attn else set()
    return [ATTN if i in at else GDN for i in range(n)]


def subsample(n_attn: int, n_gdn: int, layers: Optional[int]) -> tuple[int, int]:
    """``(attention, gated delta)`` layers to replay when ``layers`` mixer layers of the
    ``n_attn + n_gdn`` are asked for: each type in proportion, at least one of each present type
    when ``layers`` allows (None: all)."""
    n = n_attn + n_gdn
    if layers is None or layers >= n:
        return n_attn, n_gdn
    a = round(layers * n_attn / n) if n else 0
    if n_attn and layers >= 2:
        a = max(1, a)
    if n_gdn:
        a = min(a, layers - 1)
    return a, layers - a


@dataclass(frozen=True)
class ReplayShape:
    """Shapes of the replayed model: ``layers`` gated-delta layers, ``attn_layers`` attention
    layers and an MLP after every mixer when ``mlp_inter`` > 0."""

    hidden: int
    layers: int  # gated-delta layers (their states are the checkpoints)
    k_heads: int
    v_heads: int
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_width: int = 4
    vocab_rows: int = 1 << 16
    attn_layers: int = 0
    attn_heads: int = 0
    attn_kv_heads: int = 0
    attn_head_dim: int = 0
    attn_output_gate: bool = True
    mlp_inter: int = 0  # SwiGLU intermediate size (0: no MLP blocks)
    mlp_moe: bool = False  # the preset's MLP is a MoE replayed dense at its active width

    def __post_init__(self) -> None:
        if self.layers < 0 or self.attn_layers < 0 or self.layers + self.attn_layers < 1 or self.hidden < 1:
            raise ValueError("a replay model needs at least one layer and a positive hidden size")
        if self.layers and self.v_heads % self.k_heads:
            raise ValueError("v_heads must be a multiple of k_heads")
        if self.attn_layers and (self.attn_heads % max(1, self.attn_kv_heads) or self.attn_head_dim < 4):
            raise ValueError("attention heads must be a multiple of kv heads")

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.head_k_dim + self.v_heads * self.head_v_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.head_v_dim

    @property
    def proj_dim(self) -> int:
        return self.conv_dim + self.value_dim + 2 * self.v_heads

    @property
    def order(self) -> list[str]:
        """The mixer type of every replayed layer, in order."""
        return spread(self.attn_layers, self.layers)

    def counts(self) -> dict[str, int]:
        """Replayed layers by type (``layers_replayed``)."""
        n = self.layers + self.attn_layers
        return {ATTN: self.attn_layers, GDN: self.layers, MLP: n if self.mlp_inter else 0}

    @classmethod
    def from_spec(
        cls, spec, layers: Optional[int] = None, vocab_rows: int = 1 << 16, gdn_only: bool = False
    ) -> "ReplayShape":
        """Shapes of a cost-model preset (``spec``: ``sim.cost.ModelSpec``); ``layers``: mixer
        layers to replay, subsampled evenly per type (None: the preset's full depth).
        ``gdn_only``: gated-delta layers alone (``layers`` of them), no attention, no MLP."""
        if gdn_only:
            a, g = 0, spec.n_gdn if layers is None else layers
        else:
            a, g = subsample(spec.n_attn, spec.n_gdn, layers)
        inter = 0
        if not gdn_only and spec.n_mlp and spec.mlp_active_params:
            inter = mlp_width(spec.mlp_active_params, spec.d_model)
        moe = bool(spec.mlp_moe and inter)  # a config.json's MoE is named by its path: the spec says
        return cls(
            hidden=spec.d_model,
            layers=g,
            k_heads=spec.gdn_k_heads or 1,
            v_heads=spec.gdn_v_heads or 1,
            head_k_dim=spec.gdn_head_k_dim or 16,
            head_v_dim=spec.gdn_head_v_dim or 16,
            conv_width=spec.gdn_conv_width,
            vocab_rows=vocab_rows,
            attn_layers=a,
            attn_heads=spec.attn_heads,
            attn_kv_heads=spec.attn_kv_heads,
            attn_head_dim=spec.attn_head_dim,
            attn_output_gate=spec.attn_output_gate,
            mlp_inter=inter,
            mlp_moe=moe,
        )

    def state_bytes(self, act_dtype: torch.dtype) -> int:
        """Bytes of one stack checkpoint: fp32 recurrent states + conv windows in ``act_dtype``."""
        elt = torch.empty((), dtype=act_dtype).element_size()
        rec = self.v_heads * self.head_k_dim * self.head_v_dim * 4
        conv = self.conv_dim * (self.conv_width - 1) * elt
        return self.layers * (rec + conv)

    def kv_bytes_per_token(self, act_dtype: torch.dtype) -> int:
        elt = torch.empty((), dtype=act_dtype).element_size()
        return self.attn_layers * 2 * self.attn_kv_heads * self.attn_head_dim * elt


MLP_WIDTH_ALIGN = 64  # tensor-core GEMMs want widths in multiples of 8; 64 keeps every tile whole
MLP_WIDTH_MIN_ALIGNED = 8 * MLP_WIDTH_ALIGN  # narrower (toy) widths are kept: rounding would change their work


def mlp_width(active_params: int, hidden: int) -> int:
    """The SwiGLU intermediate size replayed for ``active_params`` MLP parameters per token (3
    matrices of ``hidden`` x width): for a MoE, its routed top-k and shared experts and its router
    as one dense SwiGLU. Rounded to a multiple of ``MLP_WIDTH_ALIGN``: a MoE's active width is
    rarely one (the router adds ``experts / 3`` columns: 5,803 for Qwen3-Next-80B-A3B), and a
    GEMM of such a width runs off cuBLAS's tensor-core tiles, 2.5-3.7x slower than the FLOPs say
    (H200, 2026-12-04); the rounding changes the MLP's work by < 0.6 % at every preset. A toy
    width under ``MLP_WIDTH_MIN_ALIGNED`` is kept (rounded to a whole column)."""
    width = active_params / (3 * hidden)
    if width < MLP_WIDTH_MIN_ALIGNED:  # a toy preset's (replay-tiny-moe: 42): as it is
        return max(1, int(round(width)))
    return int(round(width / MLP_WIDTH_ALIGN)) * MLP_WIDTH_ALIGN


def attention_weights(s: "ReplayShape", randn, device) -> dict:
    """One gated attention layer's weights at ``s``'s shapes, drawn by ``randn(*size, std=)`` (the
    model's seeded generator, so the draw order is the model's)."""
    H, KVH, hd = s.attn_heads, s.attn_kv_heads, s.attn_head_dim
    qw = H * hd * (2 if s.attn_output_gate else 1)
    return dict(
        w_q=randn(s.hidden, qw, std=s.hidden**-0.5),
        w_kv=randn(s.hidden, 2 * KVH * hd, std=s.hidden**-0.5),
        q_norm=torch.ones(hd, device=device, dtype=torch.float32),
        k_norm=torch.ones(hd, device=device, dtype=torch.float32),
        w_o=randn(H * hd, s.hidden, std=0.5 * (H * hd) ** -0.5),
    )


def mlp_weights(s: "ReplayShape", randn) -> dict:
    """One SwiGLU MLP's weights (gate and up in one matrix) at ``s.mlp_inter``."""
    return dict(
        w_gu=randn(s.hidden, 2 * s.mlp_inter, std=s.hidden**-0.5),
        w_down=randn(s.mlp_inter, s.hidden, std=0.5 * s.mlp_inter**-0.5),
    )


@dataclass
class StackState:
    """The model's state after ``pos`` tokens: recurrent ``[L, Hv, K, V]`` fp32 and conv windows
    ``[L, conv_dim, W-1]`` of the gated-delta layers, and the keys and values of the attention
    layers ``[A, 2, pos, KVH, hd]`` (None without attention layers)."""

    pos: int
    rec: torch.Tensor
    conv: torch.Tensor
    kv: Optional[torch.Tensor] = None

    def clone(self) -> "StackState":
        return StackState(self.pos, self.rec.clone(), self.conv.clone(), None if self.kv is None else self.kv.clone())


# on_state(position, layer, recurrent [Hv, K, V] fp32, conv window [conv_dim, W-1])
StateSink = Callable[[int, int, torch.Tensor, torch.Tensor], None]


def gated_delta(
    qkv,
    a,
    b,
    *,
    conv_w,
    A_log,
    dt_bias,
    rec0,
    conv0,
    meta,
    boundaries: bool,
    k_heads: int,
    head_k_dim: int,
    v_heads: int,
    head_v_dim: int,
    backend: Optional[tuple[Callable, Callable]] = None,
    varlen: bool = False,
):
    """One gated-delta layer's conv + chunked core over ``T`` tokens (``qkv [T, conv_dim]``,
    ``a``, ``b`` ``[T, Hv]``) from ``rec0 [Hv, K, V]`` / ``conv0 [conv_dim, W-1]`` (None: zeros).
    Returns ``(o [T, Hv, V], rec_end, conv_end, boundary recurrent states, boundary conv
    windows)``. The one call site of the gated-delta kernels; ``backend``: a loaded
    ``(conv, core)`` pair (``GDNBackend.load``; None: the Triton kernels). ``varlen``: the tokens
    are ``meta``'s N sequences (its ``cu_seqlens`` and absolute start positions), ``rec0`` /
    ``conv0`` one state per sequence ``[N, ...]`` and the end states returned the same way."""
    causal_conv1d, chunk_gated_delta_rule = backend or GDN_BACKENDS["triton"].load()
    T = qkv.shape[0]

    def per_seq(state):
        return None if state is None else state if varlen else state[None]

    y, conv_end, conv_b = causal_conv1d(
        qkv[None],
        conv_w,
        None,
        conv_state=per_seq(conv0),
        chunk_metadata=meta,
        activation="silu",
        boundary_conv_states=boundaries,
    )
    y = y[0]
    nk = k_heads * head_k_dim
    q = y[:, :nk].view(1, T, k_heads, head_k_dim)
    k = y[:, nk : 2 * nk].view(1, T, k_heads, head_k_dim)
    v = y[:, 2 * nk :].view(1, T, v_heads, head_v_dim)
    o, rec_end, rec_b = chunk_gated_delta_rule(
        q,
        k,
        v,
        a[None],
        b[None],
        initial_state=per_seq(rec0),
        chunk_metadata=meta,
        use_qk_l2norm=True,
        A_log=A_log,
        dt_bias=dt_bias,
        use_gate_in_kernel=True,
        use_beta_sigmoid=True,
        boundary_states=boundaries,
    )
    if varlen:
        return o[0], rec_end, conv_end, rec_b, conv_b
    return o[0], rec_end[0], conv_end[0], rec_b, conv_b


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half) on the first ``2 * cos.shape[-1]`` dims of ``x [T, heads,
    hd]``; ``cos``, ``sin`` ``[T, 1, rot / 2]`` fp32 (one table per call, shared by the layers)."""
    half = cos.shape[-1]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half : 2 * half]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., 2 * half :]], dim=-1)
    return out.to(x.dtype)


#: off a GPU, SDPA has no kernel for a bottom-right causal mask and materialises it and the scores
#: (Tq x Tk per head): queries then run in blocks of at most this many scores, each block over the
#: keys it can see (a hit's suffix of an 87K-token Mooncake prompt asked for 60 GB at once)
CPU_SCORE_ELEMENTS = 1 << 25


def _attend(q, k, v):
    """SDPA of queries ``[Tq, H, hd]`` (the last Tq positions) over keys and values
    ``[Tk, KVH, hd]``: causal, aligned to the bottom right (query i sees keys ``<= Tk - Tq + i``)."""
    Tq, H, _ = q.shape
    Tk, KVH, _ = k.shape
    if q.device.type != "cuda" and Tq != Tk and Tk * Tk < 6 * Tq * (Tk - Tq // 2):
        # most of the prompt is new: run as a whole prompt (top-left causal, SDPA's fused CPU
        # kernel: a third of the masked path's time per score) with zero queries ahead of the
        # suffix's, and keep the suffix's rows (each row's result is its own)
        pad = torch.cat([q.new_zeros(Tk - Tq, H, q.shape[2]), q])
        return _attend(pad, k, v)[Tk - Tq :]
    if q.device.type != "cuda" and Tq != Tk and Tq * Tk * H > CPU_SCORE_ELEMENTS:
        off, step = Tk - Tq, max(1, CPU_SCORE_ELEMENTS // (Tk * H))
        blocks = []
        for i in range(0, Tq, step):
            e = off + min(i + step, Tq)  # the block's last query sees keys up to here
            blocks.append(_attend(q[i : i + step], k[:e], v[:e]))
        return torch.cat(blocks)
    rep = H // KVH
    qh = q.transpose(0, 1)[None]
    kh = k.repeat_interleave(rep, dim=1).transpose(0, 1)[None] if rep > 1 else k.transpose(0, 1)[None]
    vh = v.repeat_interleave(rep, dim=1).transpose(0, 1)[None] if rep > 1 else v.transpose(0, 1)[None]
    # flash / memory-efficient kernels only: cuDNN's SDPA builds a plan per new sequence length
    # (measured ~5 ms per layer on an H200 for every new prompt length)
    with sdpa_kernel(SDPA_BACKENDS):
        if Tq == Tk:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(Tq, Tk))
    return o[0].transpose(0, 1)


def attention_bucket(n: int) -> int:
    """``n`` tokens padded up to ``ATTENTION_BUCKET``'s multiple, or to a multiple of an eighth of
    ``n``'s power of two where that is coarser: few lengths, at most 12.5 % padding."""
    if n <= 0:
        return 0
    step = max(ATTENTION_BUCKET, (1 << (n.bit_length() - 1)) // 8)
    return -(-n // step) * step


def attend_bucketed(q, k, v, backends=None):
    """``_attend``'s result with ``backends`` (default ``CUDNN_BACKENDS``) on a bucketed length, or
    None where that does not pay (``WHOLE_PROMPT_RATIO``). Exact by construction: a suffix's
    queries are put behind zero queries for the prefix's positions (a whole prompt, top-left
    causal; each row's result is its own), then queries, keys and values are padded at the end
    by the same count up to ``attention_bucket``: no real query sees a padded key, and the real
    rows are kept. The key / value heads are shared by SDPA (``enable_gqa``), not copied."""
    Tq, H, hd = q.shape
    Tk, KVH, _ = k.shape
    if Tq != Tk:
        if Tk * Tk >= 2 * WHOLE_PROMPT_RATIO * Tq * (Tk - Tq / 2):
            return None
        q = torch.cat([q.new_zeros(Tk - Tq, H, hd), q])
    n = attention_bucket(Tk)
    pad = (0, 0, 0, 0, 0, n - Tk)
    qh, kh, vh = (F.pad(x, pad).transpose(0, 1)[None] for x in (q, k, v))
    with sdpa_kernel(CUDNN_BACKENDS if backends is None else backends):
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=H != KVH)
    return o[0].transpose(0, 1)[Tk - Tq : Tk]


def attention_backend(name: str, device=None, dtype=None) -> str:
    """The backend a model on ``device`` in ``dtype`` runs for ``name`` (one of
    ``ATTENTION_BACKENDS``, else a ``UsageError``): ``cudnn`` only in bf16 / fp16 on a GPU (None:
    not known yet), else ``sdpa``."""
    if name not in ATTENTION_BACKENDS:
        raise UsageError(f"attention must be one of {', '.join(ATTENTION_BACKENDS)}, not {name!r}")
    if name == "cudnn" and device is not None and not cudnn_runs(torch.device(device), dtype):
        return "sdpa"
    return name


def cudnn_problem(device, dtype, heads: int, kv_heads: int, head_dim: int, backends=None) -> str:
    """Why SDPA's cuDNN kernel cannot run a model's attention (``heads`` / ``kv_heads`` of
    ``head_dim``) on ``device`` in ``dtype``, from one 16-token call (``attend_bucketed``); empty
    when it runs (a GPU or build without it: torch's first line, for one line of the CLI)."""
    q = torch.zeros(16, heads, head_dim, device=device, dtype=dtype)
    k = torch.zeros(16, kv_heads, head_dim, device=device, dtype=dtype)
    try:
        attend_bucketed(q, k, k, backends)
    except RuntimeError as exc:
        return f"--attention cudnn: SDPA's cuDNN kernel does not run here ({str(exc).splitlines()[0][:160]}); use sdpa"
    return ""


def model_attention(name: str, device, dtype, shape) -> str:
    """The attention backend a model of ``shape`` on ``device`` in ``dtype`` runs for ``name``
    (``attention_backend``); with cudnn chosen there, a ``UsageError`` where cuDNN cannot run its
    attention (``cudnn_problem``)."""
    backend = attention_backend(name, device, dtype)
    if backend == "cudnn" and shape.attn_layers:
        problem = cudnn_problem(device, dtype, shape.attn_heads, shape.attn_kv_heads, shape.attn_head_dim)
        if problem:
            raise UsageError(problem)
    return backend


def rotary_half(head_dim: int) -> int:
    """Half the rotary width of a head of ``head_dim`` (``ROTARY_FRACTION`` of it, at least 2)."""
    return max(2, head_dim // ROTARY_FRACTION // 2 * 2) // 2


def _pow2(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def elementwise_backend(name: str, device=None) -> str:
    """How a model on ``device`` runs ``name`` (one of ``ELEMENTWISE``, else a ``UsageError``):
    ``fused`` only on a GPU (None: not known yet), else ``torch``."""
    if name not in ELEMENTWISE:
        raise UsageError(f"elementwise must be one of {', '.join(ELEMENTWISE)}, not {name!r}")
    if name == "fused" and device is not None and torch.device(device).type != "cuda":
        return "torch"
    return name


def cudnn_runs(device: torch.device, dtype) -> bool:
    """Whether SDPA's cuDNN kernel serves a model on ``device`` in ``dtype``."""
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)


def attend(q, k, v, backend: str = "sdpa"):
    """A prefill's attention by ``backend`` (``ATTENTION_BACKENDS``): ``cudnn`` where it runs
    (bf16 / fp16 on a GPU, ``attend_bucketed``), else ``_attend``."""
    if backend == "cudnn" and cudnn_runs(q.device, q.dtype):
        o = attend_bucketed(q, k, v)
        if o is not None:
            return o
    return _attend(q, k, v)


def _attend_one(q, k, v):
    """A single query ``[1, H, hd]`` (a decode token) over its whole context ``[Tk, KVH, hd]``: no
    mask, and the key / value heads shared by SDPA itself (``enable_gqa``), not copied per query
    head as ``_attend`` does (a decode reads its context once)."""
    H, KVH = q.shape[1], k.shape[1]
    with sdpa_kernel(SDPA_BACKENDS):
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], enable_gqa=H != KVH
        )
    return o[0].transpose(0, 1)


def kept_layers(keep_outputs, n_layers: int) -> Optional[frozenset]:
    """The mixer layers whose outputs a forward keeps (``keep_outputs``): every one for True, none
    for False (None), else the layer indices given (a hit's check holding one group of layers at a
    time, ``sim.replay.hits.output_groups``)."""
    if keep_outputs is True:
        return frozenset(range(n_layers))
    if keep_outputs is False or keep_outputs is None:
        return None
    kept = frozenset(int(layer) for layer in keep_outputs)
    if any(not 0 <= layer < n_layers for layer in kept):
        raise ValueError(f"kept layers {sorted(kept)} outside the model's {n_layers}")
    return kept


def kept_rows(cu_seqlens, starts, keep_from) -> list[int]:
    """Offsets of each sequence's kept rows in ``forward_batch``'s outputs with ``keep_from``:
    sequence n's rows are ``[k[n], k[n + 1])``, its positions ``max(keep_from[n], start)`` up to
    its end (None: from its start)."""
    k = [0]
    for n, p in enumerate(starts):
        ln = int(cu_seqlens[n + 1]) - int(cu_seqlens[n])
        kf = p if keep_from[n] is None else min(max(int(keep_from[n]), p), p + ln)
        k.append(k[-1] + p + ln - kf)
    return k


@dataclass
class BatchOut:
    """What ``HybridModel.forward_batch`` returns: the last layer's output ``x [T, hidden]`` of
    every token, the end states per gated-delta layer (``rec[l] [N, Hv, K, V]`` fp32, ``conv[l]
    [N, conv_dim, W-1]``), per sequence its KV up to its end ``[A, 2, end_n, KVH, hd]`` (None
    without attention layers) and, with ``keep_outputs``, every layer's output ``[T, hidden]``
    (with ``keep_from``: only the kept rows, ``kept_rows`` gives each sequence's offsets)."""

    x: torch.Tensor
    rec: list
    conv: list
    kv: list
    outs: Optional[list] = None

    def state(self, n: int, pos: int) -> StackState:
        """Sequence ``n``'s end state (at position ``pos``) as a ``StackState``."""
        kv = self.kv[n]
        return StackState(
            pos,
            torch.stack([r[n] for r in self.rec]) if self.rec else torch.empty(0),
            torch.stack([c[n] for c in self.conv]) if self.conv else torch.empty(0),
            kv,
        )


def timestamp(cuda: bool):
    """A point in time of device work: a recorded CUDA event (resolved later, no sync) on a GPU,
    ``perf_counter`` on the CPU (where every op is synchronous)."""
    if cuda:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


class Marks:
    """Per-layer-type elapsed time of one call: CUDA events (resolved lazily, no sync on the hot
    path) on a GPU, ``perf_counter`` on the CPU (where every op is synchronous)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.points: list = []
        self.labels: list[str] = []

    def start(self) -> None:
        """The start of a marked call, or of a later piece of it (a call split at a position off
        the 64-token grid marks each ``forward_segment`` into the same marks): the time since the
        last mark goes to "other" then, so every label keeps its own interval."""
        if self.points:
            self.mark("other")
        else:
            self.points.append(timestamp(self.cuda))

    def mark(self, label: str) -> None:
        self.labels.append(label)
        self.points.append(timestamp(self.cuda))

    def ms_by_type(self) -> dict[str, float]:
        """ms per layer type, "other", and ``CHECK`` (a hit check's work inside the call)."""
        out = {t: 0.0 for t in LAYER_TYPES}
        out["other"] = 0.0
        out[CHECK] = 0.0
        if self.cuda and self.points:
            self.points[-1].synchronize()
        for i, lab in enumerate(self.labels):
            a, b = self.points[i], self.points[i + 1]
            ms = float(a.elapsed_time(b)) if self.cuda else (b - a) * 1e3
            out[lab if lab in out else "other"] += ms
        return out


def _load_backend(name: str, device, dtype, shape: ReplayShape) -> tuple[Callable, Callable]:
    """The backend's ``(conv, core)``, after its check (a peer not installed, a GPU or dtype or
    head dims it cannot run: one line, a ``UsageError``)."""
    backend = GDN_BACKENDS[name]
    problem = backend.problem(device, dtype, shape.head_k_dim, shape.head_v_dim)
    if problem:
        raise UsageError(problem)
    return backend.load()


class HybridModel:
    """Weights of the replayed model, drawn from ``seed`` on ``device``, and its forward pass.
    ``kernel``: the gated-delta backend (``GDN_BACKENDS``; None or "auto": ``triton`` on CUDA,
    ``torch`` elsewhere); ``attention``: how prefills run attention (``ATTENTION_BACKENDS``);
    ``elementwise``: how the norms, gates and activations run (``ELEMENTWISE``)."""

    def __init__(
        self,
        shape: ReplayShape,
        *,
        device="cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        kernel: Optional[str] = None,
        attention: str = "sdpa",
        elementwise: str = "torch",
    ) -> None:
        self.attention = model_attention(attention, device, dtype, shape)  # how prefills run attention (``attend``)
        self.shape = shape
        self._set_elementwise(elementwise, device)
        self.device = torch.device(device)
        self.dtype = dtype
        self.kernel = resolve_kernel(kernel, self.device)  # the gated-delta backend's name
        self._backend = _load_backend(self.kernel, self.device, dtype, shape)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        s = shape

        def randn(*size, std):
            return torch.randn(*size, generator=gen, device=self.device, dtype=torch.float32).mul_(std).to(dtype)

        self.embedding = randn(s.vocab_rows, s.hidden, std=1.0)
        self.layers = []  # gated-delta layers' weights (in model order)
        self.attn = []  # attention layers' weights
        self.mlp = []  # one MLP per mixer layer, in model order
        for kind in s.order:
            if kind == GDN:
                u = torch.rand(s.v_heads, generator=gen, device=self.device)
                dt = torch.exp(math.log(1e-3) + u * (math.log(0.1) - math.log(1e-3)))
                self.layers.append(
                    dict(
                        w_in=randn(s.hidden, s.proj_dim, std=s.hidden**-0.5),
                        conv_w=randn(s.conv_dim, s.conv_width, std=0.5),
                        # Mamba2 / FLA-style initialisation: A in [1, 16], dt in [1e-3, 0.1]
                        A_log=torch.log(1 + 15 * torch.rand(s.v_heads, generator=gen, device=self.device)),
                        dt_bias=dt + torch.log(-torch.expm1(-dt)),  # softplus^-1(dt)
                        norm_w=torch.ones(s.head_v_dim, device=self.device, dtype=torch.float32),
                        w_out=randn(s.value_dim, s.hidden, std=0.5 * s.value_dim**-0.5),
                    )
                )
            else:
                self.attn.append(attention_weights(s, randn, self.device))
            if s.mlp_inter:
                self.mlp.append(mlp_weights(s, randn))

    def upcast(self, dtype: torch.dtype = torch.float32) -> "HybridModel":
        """The same model (the same weights, exactly: ``dtype`` holds every ``self.dtype``
        value) computing in ``dtype``: the fp32 shadow of ``--validate shadow``."""
        m = object.__new__(type(self))
        m.__dict__.update(self.__dict__)
        m.dtype = dtype
        s = self.shape
        if GDN_BACKENDS[self.kernel].problem(self.device, dtype, s.head_k_dim, s.head_v_dim):
            # a peer without this dtype (FlashQLA runs bf16 / fp16 only): the shadow is a reference
            # (untimed), so it runs the device's default backend instead
            m.kernel = default_kernel(self.device)
            m._backend = GDN_BACKENDS[m.kernel].load()

        def up(d: dict) -> dict:
            return {k: v.to(dtype) if v.is_floating_point() else v for k, v in d.items()}

        m.embedding = self.embedding.to(dtype)
        m.layers = [up(w) for w in self.layers]
        m.attn = [up(w) for w in self.attn]
        m.mlp = [up(w) for w in self.mlp]
        return m

    # ---- states ------------------------------------------------------------------------------
    def zero_state(self) -> StackState:
        s = self.shape
        kv = None
        if s.attn_layers:
            kv = torch.zeros(
                s.attn_layers, 2, 0, s.attn_kv_heads, s.attn_head_dim, dtype=self.dtype, device=self.device
            )
        return StackState(
            0,
            torch.zeros(s.layers, s.v_heads, s.head_k_dim, s.head_v_dim, dtype=torch.float32, device=self.device),
            torch.zeros(s.layers, s.conv_dim, s.conv_width - 1, dtype=self.dtype, device=self.device),
            kv,
        )

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The residual stream is kept in fp32 (matmul and kernel inputs are in ``dtype``), so the
        restore-vs-scratch comparison sees the kernels' differences, not residual rounding."""
        return self.embedding[tokens % self.shape.vocab_rows].float()

    # ---- blocks ------------------------------------------------------------------------------
    def _gdn(self, l: int, x: torch.Tensor, meta, rec0, conv0, want_boundaries: bool, varlen: bool = False):
        s, w = self.shape, self.layers[l]
        T = x.shape[0]
        proj = self._in_norm(x) @ w["w_in"]
        c, v = s.conv_dim, s.value_dim
        z = proj[:, c : c + v]
        o, rec_end, conv_end, rec_b, conv_b = gated_delta(
            proj[:, :c],
            proj[:, c + v : c + v + s.v_heads],
            proj[:, c + v + s.v_heads :],
            conv_w=w["conv_w"],
            A_log=w["A_log"],
            dt_bias=w["dt_bias"],
            rec0=rec0,
            conv0=conv0,
            meta=meta,
            boundaries=want_boundaries,
            k_heads=s.k_heads,
            head_k_dim=s.head_k_dim,
            v_heads=s.v_heads,
            head_v_dim=s.head_v_dim,
            backend=self._backend,
            varlen=varlen,
        )
        if self._fused_gate:
            o = self._ops.gated_rms_norm(o, z, w["norm_w"], eps=NORM_EPS, out_dtype=self.dtype)
        else:
            o = F.rms_norm(o.float(), (s.head_v_dim,), weight=w["norm_w"], eps=NORM_EPS)
            o = (o * F.silu(z.float().view(T, s.v_heads, s.head_v_dim))).to(self.dtype).reshape(T, v)
        x = x + o @ w["w_out"]  # fp32 + bf16 adds in fp32: one kernel, no cast
        return x, rec_end, conv_end, rec_b, conv_b

    def _set_elementwise(self, name: str, device) -> None:
        """``self.elementwise`` (``elementwise_backend``) and which ops run fused: the gate and the
        q / k norm need power-of-two head sizes (``kernels.norms``); others run as torch."""
        self.elementwise = elementwise_backend(name, device)
        fused, s = self.elementwise == "fused", self.shape
        self._fused_gate = fused and _pow2(s.head_v_dim)
        self._fused_qk = fused and _pow2(s.attn_head_dim) and _pow2(rotary_half(s.attn_head_dim))
        self._ops = None  # kernels.norms, resolved once here (the torch path needs no triton)
        if fused:
            from kernels import norms

            self._ops = norms

    def _in_norm(self, x: torch.Tensor) -> torch.Tensor:
        """A sublayer's input: the fp32 residual ``x`` RMS-normed, in the model's dtype."""
        if self.elementwise == "fused":
            return self._ops.rms_norm_cast(x, eps=NORM_EPS, out_dtype=self.dtype)
        return F.rms_norm(x, (self.shape.hidden,), eps=NORM_EPS).to(self.dtype)

    def _rope_tables(self, start: int, T: int):
        return self._rope_at(torch.arange(start, start + T, device=self.device, dtype=torch.float32))

    def _rope_at(self, pos: torch.Tensor):
        """cos / sin tables ``[T, 1, rot / 2]`` of the rotary embedding at fp32 positions ``pos``."""
        half = rotary_half(self.shape.attn_head_dim)
        inv = ROPE_THETA ** (-torch.arange(half, device=self.device, dtype=torch.float32) / half)
        ang = pos[:, None] * inv[None]
        return ang.cos()[:, None, :], ang.sin()[:, None, :]

    def _mlp_after(self, mi: int, kind: str, x: torch.Tensor, marks, outs, rows=None) -> torch.Tensor:
        """What follows mixer layer ``mi`` (of ``kind``): its time mark, its MLP (and the MLP's
        mark), the layer's output kept in ``outs`` (None: not kept): every row, or only ``rows``
        (an int: the rows from there on; a tensor: those row indices), copied out so that the
        kept rows never hold the whole layer output alive."""
        if marks is not None:
            marks.mark(kind)
        if self.shape.mlp_inter:
            x = self._mlp(mi, x)
            if marks is not None:
                marks.mark(MLP)
        if outs is not None:
            if rows is None:
                outs.append(x)
            else:
                outs.append(x[rows:].clone() if isinstance(rows, int) else x.index_select(0, rows))
                if marks is not None:
                    marks.mark(CHECK)  # the copy kept for a hit's check: not the prefill's time
        return x

    def _layer_out(self, mi: int, kind: str, x: torch.Tensor, marks, outs, keep, rows) -> torch.Tensor:
        """``_mlp_after`` for layer ``mi``, its output kept in ``outs`` when ``keep`` (the kept
        layers, ``kept_layers``) names it, a None in its place when not (None: nothing kept)."""
        held = outs is not None and mi in keep
        x = self._mlp_after(mi, kind, x, marks, outs if held else None, rows)
        if outs is not None and not held:
            outs.append(None)
        return x

    def _attention(self, l: int, x: torch.Tensor, start: int, kv0, rope=None):
        """One attention layer over tokens at ``[start, start + T)``; ``kv0 [2, start, KVH, hd]``
        is the prefix's KV. Returns ``(x, kv [2, start + T, KVH, hd])``."""
        rope = rope if rope is not None else self._rope_tables(start, x.shape[0])
        qg, q, k, v = self._attn_in(l, x, rope)
        new = torch.stack([k, v])
        kv = new if kv0 is None or kv0.shape[1] == 0 else torch.cat([kv0, new], dim=1)
        return self._attn_out(l, x, qg, attend(q, kv[0], kv[1], self.attention)), kv

    def _attn_in(self, l: int, x: torch.Tensor, rope):
        """Attention layer ``l``'s inputs for tokens ``x``: the query (and gate) projection ``qg``,
        and q, k (head-normed, rotary at the ``rope`` tables' positions) and v ``[T, heads, hd]``."""
        s, w = self.shape, self.attn[l]
        T = x.shape[0]
        H, KVH, hd = s.attn_heads, s.attn_kv_heads, s.attn_head_dim
        h = self._in_norm(x)
        qg = h @ w["w_q"]
        kvp = (h @ w["w_kv"]).view(T, 2, KVH, hd)
        q = qg.view(T, H, -1)[..., :hd]
        cos, sin = rope
        if self._fused_qk:
            qk = self._ops.qk_norm_rope
            q = qk(q, w["q_norm"], cos, sin, eps=NORM_EPS, out_dtype=self.dtype)
            k = qk(kvp[:, 0], w["k_norm"], cos, sin, eps=NORM_EPS, out_dtype=self.dtype)
            return qg, q, k, kvp[:, 1]
        q = _rope(F.rms_norm(q.float(), (hd,), weight=w["q_norm"], eps=NORM_EPS).to(self.dtype), cos, sin)
        k = _rope(F.rms_norm(kvp[:, 0].float(), (hd,), weight=w["k_norm"], eps=NORM_EPS).to(self.dtype), cos, sin)
        return qg, q, k, kvp[:, 1]

    def _attn_out(self, l: int, x: torch.Tensor, qg: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The residual after attention layer ``l``: ``o [T, H, hd]`` gated (where the preset gates
        its output) and projected back."""
        s = self.shape
        T, H, hd = x.shape[0], s.attn_heads, s.attn_head_dim
        if s.attn_output_gate:
            o = o * torch.sigmoid(qg.view(T, H, 2 * hd)[..., hd:])
        return x + o.reshape(T, H * hd) @ self.attn[l]["w_o"]

    def _mlp(self, l: int, x: torch.Tensor) -> torch.Tensor:
        s, w = self.shape, self.mlp[l]
        gu = self._in_norm(x) @ w["w_gu"]
        if self.elementwise == "fused":
            act = self._ops.silu_mul(gu, s.mlp_inter)
        else:
            act = F.silu(gu[:, : s.mlp_inter]) * gu[:, s.mlp_inter :]
        return x + act @ w["w_down"]

    # ---- forward -----------------------------------------------------------------------------
    def forward_segment(
        self,
        x: torch.Tensor,
        state: Optional[StackState],
        start: int,
        boundaries: list[int],
        on_state: Optional[StateSink] = None,
        keep_outputs=False,
        marks: Optional[Marks] = None,
        keep_from: Optional[int] = None,
        on_output=None,
    ):
        """Run all layers over embedded tokens ``x`` ``[T, hidden]`` at absolute positions
        ``[start, start + T)`` from ``state`` (None: zeros). ``boundaries``: 64-aligned positions
        in ``(start, start + T)`` whose states go to ``on_state`` (from the kernels' boundary
        outputs). ``marks``: the timed call's per-layer-type marks (None: untimed).
        ``keep_from``: with ``keep_outputs``, keep each layer's rows from this absolute position
        on only (None: every row). ``on_output(layer, x, start)``: each layer's output ``[T,
        hidden]`` as it comes (a check compares it and lets it go). Returns ``(x_out, final
        StackState, per-layer outputs or None)``."""
        T = x.shape[0]
        s = self.shape
        if marks is not None:
            marks.start()
        meta = (
            prepare_chunk_metadata([0, T], [start], boundary_indices=list(boundaries), device=self.device)
            if s.layers
            else None
        )
        rope = self._rope_tables(start, T) if s.attn_layers else None
        want = bool(boundaries)
        keep = kept_layers(keep_outputs, len(s.order))
        recs, convs, kvs, outs = [], [], [], [] if keep is not None else None
        rows = None if keep_from is None or keep_from <= start else min(int(keep_from) - start, T)
        if marks is not None:
            marks.mark("other")
        gi = ai = 0
        for mi, kind in enumerate(s.order):
            if kind == GDN:
                r0 = None if state is None else state.rec[gi]
                c0 = None if state is None else state.conv[gi]
                x, r1, c1, rb, cb = self._gdn(gi, x, meta, r0, c0, want)
                recs.append(r1)
                convs.append(c1)
                if want and on_state is not None:
                    for j, p in enumerate(meta.boundary_positions[0]):
                        on_state(p, gi, rb[j], cb[j])
                gi += 1
            else:
                kv0 = None if state is None or state.kv is None else state.kv[ai]
                x, kv = self._attention(ai, x, start, kv0, rope)
                kvs.append(kv)
                ai += 1
            x = self._layer_out(mi, kind, x, marks, outs, keep, rows)
            if on_output is not None:
                on_output(mi, x, start)
                if marks is not None:
                    marks.mark(CHECK)
        z = self.zero_state() if not recs or not kvs else None
        final = StackState(
            start + T,
            torch.stack(recs) if recs else z.rec,
            torch.stack(convs) if convs else z.conv,
            torch.stack(kvs) if kvs else None,
        )
        return x, final, outs

    def forward_batch(
        self,
        tokens: torch.Tensor,
        cu_seqlens: list[int],
        starts: list[int],
        rec0=None,
        conv0=None,
        kv=None,
        keep_outputs=False,
        boundaries=None,
        on_state=None,
        marks: Optional[Marks] = None,
        keep_from=None,
        on_output=None,
    ) -> BatchOut:
        """One engine step: N sequences in one varlen batch. ``tokens [T]``: the ids of every
        sequence, concatenated (sequence n is ``tokens[cu[n]:cu[n+1]]``, at least one token, at
        absolute positions ``starts[n]...``; a decode is a one-token sequence at its context).
        ``rec0[l]`` ``[N, Hv, K, V]`` fp32 and ``conv0[l]`` ``[N, conv_dim, W-1]``: each gated-delta
        layer's states at the sequences' starts (anything indexable by layer: a stacked tensor or
        a list; None: zeros for every sequence). ``kv[n]``: sequence n's KV ``[A, 2, C, KVH, hd]``
        holding its prefix ``[0, starts[n])`` (None: no prefix); a buffer with room
        (``C >= starts[n] + len_n``) is written in place, otherwise a new one is made (the input
        is then left untouched).

        Embedding, norms, projections and MLPs run over all T tokens at once; each gated-delta
        layer is one varlen kernel call (``cu_seqlens``, one initial state per sequence, absolute
        start positions); attention projects all tokens at once, then attends per sequence (one
        SDPA call per sequence: over its prefix plus its new keys, bottom-right causal; a decode
        token without mask and with grouped heads shared). Same outputs and end states as
        ``forward_segment`` on each sequence alone (the math per token is the same).

        ``boundaries[n]``: 64-aligned positions in ``(starts[n], ends[n])`` whose states go to
        ``on_state(n, position, layer, recurrent, conv window)`` (the kernels' boundary outputs,
        as ``forward_segment`` hands them over; None: none). ``marks``: the timed call's
        per-layer-type marks (None: untimed). ``keep_from[n]``: with ``keep_outputs``, keep
        sequence n's rows from this absolute position on only (clamped to ``[starts[n],
        ends[n]]``; None: every row): the kept outputs are then the concatenation of those rows,
        sequence by sequence (``kept_rows`` gives each one's offsets), and a check that compares
        a hit's suffix keeps the suffix, not layers x the whole prompt. ``on_output(layer, x)``:
        each layer's output ``[T, hidden]`` as it comes (a check compares it and lets it go)."""
        s = self.shape
        cu = [int(c) for c in cu_seqlens]
        starts = [int(p) for p in starts]
        N, T = len(cu) - 1, int(tokens.shape[0])
        if N < 1 or len(starts) != N or cu[0] != 0 or cu[-1] != T or any(b <= a for a, b in zip(cu, cu[1:])):
            raise ValueError("forward_batch needs cu_seqlens [0, ..., T] of non-empty sequences and one start each")
        lens = [b - a for a, b in zip(cu, cu[1:])]
        ends = [p + n for p, n in zip(starts, lens)]
        if marks is not None:
            marks.start()
        x = self.embed(tokens)
        if boundaries is not None and len(boundaries) != N:
            raise ValueError("forward_batch needs one list of boundary positions per sequence")
        wanted = boundaries if boundaries is not None else [[]] * N
        want = any(wanted)
        meta = prepare_chunk_metadata(cu, starts, boundary_indices=wanted, device=self.device) if s.layers else None
        bufs = None
        rope = None
        if s.attn_layers:
            bufs = []
            for n in range(N):
                b = None if kv is None else kv[n]
                if b is None or b.shape[2] < ends[n]:
                    new = torch.empty(
                        s.attn_layers,
                        2,
                        ends[n],
                        s.attn_kv_heads,
                        s.attn_head_dim,
                        dtype=self.dtype,
                        device=self.device,
                    )
                    if starts[n]:
                        new[:, :, : starts[n]] = b[:, :, : starts[n]]
                    b = new
                bufs.append(b)
            # absolute position of every token: its sequence's start plus its offset in the sequence
            off = np.arange(T) - np.repeat(cu[:-1], lens) + np.repeat(starts, lens)
            rope = self._rope_at(upload(off.astype(np.float32), self.device, torch.float32))
        rows = None
        keep = kept_layers(keep_outputs, len(s.order))
        if keep is not None and keep_from is not None:
            if len(keep_from) != N:
                raise ValueError("forward_batch needs one keep_from position per sequence")
            segs = kept_rows(cu, starts, keep_from)
            if any(b - a != cu[n + 1] - cu[n] for n, (a, b) in enumerate(zip(segs, segs[1:]))):
                idx = np.concatenate(
                    [np.arange(cu[n + 1] - (b - a), cu[n + 1]) for n, (a, b) in enumerate(zip(segs, segs[1:]))]
                )
                rows = upload(idx, self.device)
        if marks is not None:
            marks.mark("other")
        recs, convs, outs = [], [], [] if keep is not None else None
        gi = ai = 0
        for mi, kind in enumerate(s.order):
            if kind == GDN:
                r0 = None if rec0 is None else rec0[gi]
                c0 = None if conv0 is None else conv0[gi]
                x, r1, c1, rb, cb = self._gdn(gi, x, meta, r0, c0, want, varlen=True)
                if want and on_state is not None:
                    for n, positions in enumerate(meta.boundary_positions):
                        o0 = meta.boundary_offsets[n]
                        for j, p in enumerate(positions):
                            on_state(n, p, gi, rb[o0 + j], cb[o0 + j])
                recs.append(r1)
                convs.append(c1)
                gi += 1
            else:
                x = self._attention_batch(ai, x, cu, starts, ends, bufs, rope)
                ai += 1
            x = self._layer_out(mi, kind, x, marks, outs, keep, rows)
            if on_output is not None:
                on_output(mi, x)
                if marks is not None:
                    marks.mark(CHECK)
        kv_out = [b[:, :, :e] for b, e in zip(bufs, ends)] if bufs is not None else [None] * N
        return BatchOut(x, recs, convs, kv_out, outs)

    def _attention_batch(self, l: int, x: torch.Tensor, cu, starts, ends, bufs, rope) -> torch.Tensor:
        """Attention layer ``l`` of ``forward_batch``: projections, norms and rotary embedding over
        all tokens; each sequence's new keys and values written into its buffer ``bufs[n]`` at
        ``[starts[n], ends[n])``; one SDPA call per sequence over its buffer up to its end."""
        qg, q, k, v = self._attn_in(l, x, rope)
        o = torch.empty_like(q)
        for n in range(len(starts)):
            a, b, p, e = cu[n], cu[n + 1], starts[n], ends[n]
            buf = bufs[n]
            buf[l, 0, p:e] = k[a:b]
            buf[l, 1, p:e] = v[a:b]
            kk, vv = buf[l, 0, :e], buf[l, 1, :e]
            o[a:b] = _attend_one(q[a:b], kk, vv) if b - a == 1 else attend(q[a:b], kk, vv, self.attention)
        return self._attn_out(l, x, qg, o)

    def run(
        self,
        tokens: torch.Tensor,
        state: Optional[StackState],
        start: int,
        wanted=(),
        on_state: Optional[StateSink] = None,
        keep_outputs=False,
        marks: Optional[Marks] = None,
        keep_from: Optional[int] = None,
        on_output=None,
    ):
        """Prefill ``tokens`` (the ids at absolute positions ``[start, start + T)``) from
        ``state`` and hand the state at every position of ``wanted`` in ``(start, start + T]``
        to ``on_state``: 64-aligned positions come from the kernels' boundary states; others
        split the call there (the state is handed over between the two calls); the end comes
        from the final state; ``marks``: the timed call's per-layer-type marks, every
        ``forward_segment`` of it marked (None: untimed). ``keep_outputs``: True keeps every layer's
        outputs, a collection of layer indices those layers' (the others' None: ``kept_layers``).
        ``keep_from``: with ``keep_outputs``, the outputs' rows from this absolute position on only
        (None: every row). ``on_output(layer,
        x, start)``: each call's layer outputs as they come (``forward_segment``'s). Returns
        ``(final StackState (with the KV of every position so far), per-layer outputs
        [layers][T, hidden] (``[end - keep_from, hidden]``) or None, number of calls)``."""
        T = int(tokens.shape[0])
        end = start + T
        wanted = sorted({int(p) for p in wanted})
        for p in wanted:
            if not start < p <= end:
                raise ValueError(f"position {p} is outside the call range ({start}, {end}]")
        n_layers = len(self.shape.order)
        keep = kept_layers(keep_outputs, n_layers)
        if T == 0:
            st = state if state is not None else self.zero_state()
            # no rows
            empty = None if keep is None else [self.embed(tokens) if l in keep else None for l in range(n_layers)]
            return StackState(start, st.rec, st.conv, st.kv), empty, 0
        cuts = [p for p in wanted if p % CHUNK and p < end] + [end]
        x_all = self.embed(tokens)
        outs = [[] for _ in range(n_layers)] if keep is not None else None
        s0 = start
        calls = 0
        for cut in cuts:
            bnd = [p for p in wanted if s0 < p < cut and p % CHUNK == 0]
            _, state, o = self.forward_segment(
                x_all[s0 - start : cut - start],
                state,
                s0,
                bnd,
                on_state,
                keep,
                marks=marks,
                keep_from=keep_from,
                on_output=on_output,
            )
            calls += 1
            if keep is not None:
                for l in range(n_layers):
                    outs[l].append(o[l])
            if cut in wanted and on_state is not None:
                for l in range(self.shape.layers):
                    on_state(cut, l, state.rec[l], state.conv[l])
            s0 = cut
        if keep is not None:
            # one call's outputs are the forward's own tensors: a copy of every layer's output
            # here, inside a timed suffix call and in no from-scratch reference, was timed as the
            # suffix's prefill (0.1-0.4 ms on an 8K-token Mooncake suffix, session 27); a split
            # call's pieces are joined
            outs = [o[0] if len(o) == 1 or o[0] is None else torch.cat(o) for o in outs]
        return state, outs, calls


GDNStack = HybridModel  # the name of the gated-delta-only stack this model grew from
