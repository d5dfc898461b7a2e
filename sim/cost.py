"""Cost model: model specs as data, FLOPs of prefill, KV / state bytes, and a prefill-time model.

Everything the simulator calls per request or per eviction candidate is a scalar polynomial
``a*L + b*L**2`` whose coefficients are precomputed once per spec (``__post_init__``), so there are
no loops over layers at call time.

Conventions
-----------
* FLOPs are 2 per multiply-add. A projection with P weights costs 2*P FLOPs per token.
* ``F(L)`` = FLOPs to prefill L tokens from scratch. Every term is linear in L except the
  attention score/value products (QK^T, AV), which are quadratic:
  - ``attn_causal=False`` (the Marconi paper's convention, docs/cost-model.md §2): ``4*L^2*D`` per layer,
    i.e. every query against every key;
  - ``attn_causal=True`` (real models): token t attends to t keys, so per layer
    ``sum_t 4*H*hd*t = 2*H*hd*(L^2 + L)``; then ``F(L) - F(p)`` is exactly the work of tokens
    [p, L) attending to the whole prefix.
* Gated-delta (GDN) core per token per value head (docs/cost-model.md §2, chunk C = 64):
  ``6*dk*dv + C*(5.25*dk + 4*dv)`` = ``6d^2 + 9.25*C*d`` for dk = dv = d (174,080 at d = 128),
  plus projections and the depthwise causal conv (2*conv_dim*W).
* Mamba2 per layer (paper, docs/cost-model.md §2): projections in D->2*d_inner, out d_inner->D
  (12*D^2 at expand 2), scan ``8*d_inner*N`` (= 16*D*N), elementwise ``5*d_inner`` (= 10*D).
* MLP / MoE: 2 x active parameters per token per layer. Embedding lookup and the LM head are not
  counted: a prefill computes logits only for its last position.
* Normalisation, RoPE, gates' elementwise work, softmax and routing are ignored (small).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Sequence

from sim.errors import UsageError
from sim.gpus import ALLREDUCE_LATENCY_S, allreduce_s, get_gpu, group_link_bytes_per_s, node_words
from sim.hf_config import NEMOTRON_H_STATE_NOTE, config_file, looks_like_path, read_config

GDN_CHUNK = 64  # chunk length the per-token cost of docs/cost-model.md §2 is derived for


@dataclass(frozen=True)
class ModelSpec:
    name: str
    d_model: int
    # -- full attention layers (GQA-aware)
    n_attn: int = 0
    attn_heads: int = 0
    attn_kv_heads: int = 0
    attn_head_dim: int = 0
    attn_causal: bool = True  # False = the paper's full-square 4*L^2*D quadratic term
    attn_output_gate: bool = False  # Qwen3-Next/3.5: q_proj also emits a per-head gate (2x q width)
    # -- gated-delta linear attention layers (Qwen3-Next / Qwen3.5)
    n_gdn: int = 0
    gdn_k_heads: int = 0
    gdn_v_heads: int = 0
    gdn_head_k_dim: int = 0
    gdn_head_v_dim: int = 0
    gdn_conv_width: int = 4
    # -- Mamba2 layers
    n_mamba: int = 0
    mamba_d_inner: int = 0
    mamba_d_state: int = 0
    mamba_conv_width: int = 4
    mamba_n_groups: int = 1
    # the paper stores a D x N state per layer (not d_inner x N) and all W conv columns; keep both
    # configurable so paper numbers are exact (docs/cost-model.md §3)
    mamba_state_channels: int = 0  # 0 -> d_inner
    mamba_conv_cols: int = 0  # 0 -> W - 1 (what engines keep)
    # real Mamba layers read from a config (sim/hf_config.py; docs/models.md): version 1 (Jamba: a
    # d_inner x N state, conv over d_inner channels, x_proj / dt_proj of rank mamba_dt_rank) or 2
    # with mamba_heads > 0 (in_proj D -> 2*d_inner + 2*G*N + heads, conv over d_inner + 2*G*N);
    # mamba_heads = 0 keeps the paper's Mamba2 projections (D -> 2*d_inner, conv not counted)
    mamba_version: int = 2
    mamba_heads: int = 0
    mamba_dt_rank: int = 0
    # -- MLP / MoE blocks
    n_mlp: int = 0
    mlp_active_params: int = 0  # per layer per token (MoE: routed top-k + shared expert + router)
    # the MLP blocks are mixtures of experts (some or all of them): replay runs them as one dense
    # SwiGLU at their active width and says so ("MoE at active width"); the name says nothing
    # (Granite 4.0 H-Small and Jamba are MoE, a config.json's model is named by its path)
    mlp_moe: bool = False
    # -- dtypes (bytes per element)
    kv_dtype_bytes: int = 2
    state_dtype_bytes: int = 4
    conv_dtype_bytes: int = 2
    # -- bookkeeping for `marconi models` and the active-parameter cross-check (not used in costs)
    embedding_params: int = 0  # vocab x d_model, one table
    nominal_active_params: float = 0.0  # what the model's name / card says (e.g. 3e9 for A3B)
    total_params: float = 0.0  # every weight (all experts), for weight bytes; 0: not known
    # a quantized checkpoint's weights (sim/hf_config.py: its quantization_config): their bytes and
    # what to call them; 0 / "bf16": total_params x 2 bytes
    weight_bytes: float = 0.0
    weight_dtype: str = "bf16"
    # the activations' dtype the engines serve it in (KV, conv windows; what a timing file fitted
    # in another dtype is checked against) and, where that is not the checkpoint's, why (an fp32
    # config.json: "fp32 checkpoint served in bf16", vLLM's and SGLang's --dtype auto)
    dtype: str = field(default="bf16", compare=False)
    dtype_note: str = field(default="", compare=False)
    # where the recurrent state's dtype is an engine's default rather than the config's (Nemotron-H:
    # fp32, sim/hf_config.NEMOTRON_H_STATE_NOTE): what `marconi models` says under its row
    state_note: str = field(default="", compare=False)
    source: str = ""

    # precomputed (see __post_init__)
    _a: float = field(init=False, repr=False, compare=False, default=0.0)
    _b: float = field(init=False, repr=False, compare=False, default=0.0)
    # per-layer FLOP coefficients (per token; attention also per token squared), for variants of
    # the cost model such as the artifact's (sim.compat)
    attn_layer_a: float = field(init=False, repr=False, compare=False, default=0.0)
    attn_layer_b: float = field(init=False, repr=False, compare=False, default=0.0)
    mlp_layer_a: float = field(init=False, repr=False, compare=False, default=0.0)
    # gated delta split into what runs per token (projections, conv) and what runs per 64-token
    # chunk of the kernel (the chunked core: GDN_CHUNK x its per-token FLOPs), for HardwareTiming
    gdn_layer_a: float = field(init=False, repr=False, compare=False, default=0.0)
    gdn_chunk_flops: float = field(init=False, repr=False, compare=False, default=0.0)
    mamba_layer_a: float = field(init=False, repr=False, compare=False, default=0.0)
    # the linear mixer as the timing prices it in its gated-delta slot: a gated-delta layer's
    # per-token and per-chunk FLOPs, or a Mamba2 model's per-token FLOPs and no chunk term
    linear_layer_a: float = field(init=False, repr=False, compare=False, default=0.0)
    linear_chunk_flops: float = field(init=False, repr=False, compare=False, default=0.0)
    _kv: int = field(init=False, repr=False, compare=False, default=0)
    _state: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        D = self.d_model
        # attention, per layer
        H, KVH, hd = self.attn_heads, self.attn_kv_heads, self.attn_head_dim
        attn_params = D * H * hd * (2 if self.attn_output_gate else 1) + 2 * D * KVH * hd + H * hd * D
        if self.attn_causal:
            attn1_a = 2.0 * attn_params + 2.0 * H * hd
            attn1_b = 2.0 * H * hd
        else:
            attn1_a = 2.0 * attn_params
            attn1_b = 4.0 * H * hd
        # gated delta, per layer per token
        Hk, Hv, dk, dv = self.gdn_k_heads, self.gdn_v_heads, self.gdn_head_k_dim, self.gdn_head_v_dim
        gdn_conv_dim = 2 * Hk * dk + Hv * dv
        gdn_params = D * (2 * Hk * dk + 2 * Hv * dv) + D * 2 * Hv + Hv * dv * D  # qkvz, ba, out
        gdn_core = Hv * (6.0 * dk * dv + GDN_CHUNK * (5.25 * dk + 4.0 * dv))
        gdn1_a = 2.0 * gdn_params + 2.0 * gdn_conv_dim * self.gdn_conv_width + gdn_core
        # mamba2, per layer per token
        di, N, G, W = self.mamba_d_inner, self.mamba_d_state, self.mamba_n_groups, self.mamba_conv_width
        if self.mamba_version == 1:
            R = self.mamba_dt_rank
            mamba_conv_dim = di
            mamba_proj = D * 2 * di + di * (R + 2 * N) + R * di + di * D
            mamba1_a = 2.0 * mamba_proj + 2.0 * mamba_conv_dim * W + 8.0 * di * N + 5.0 * di
        elif self.mamba_heads:
            mamba_conv_dim = di + 2 * G * N
            mamba_proj = D * (2 * di + 2 * G * N + self.mamba_heads) + di * D
            mamba1_a = 2.0 * mamba_proj + 2.0 * mamba_conv_dim * W + 8.0 * di * N + 5.0 * di
        else:  # the paper's Mamba2 (docs/cost-model.md §2)
            mamba_conv_dim = di + 2 * G * N
            mamba1_a = 2.0 * (D * 2 * di + di * D) + 8.0 * di * N + 5.0 * di
        mlp1_a = 2.0 * self.mlp_active_params

        a = self.n_attn * attn1_a + self.n_gdn * gdn1_a + self.n_mamba * mamba1_a + self.n_mlp * mlp1_a
        b = self.n_attn * attn1_b
        set_(self, "_a", a)
        set_(self, "_b", b)
        set_(self, "attn_layer_a", attn1_a)
        set_(self, "attn_layer_b", attn1_b)
        set_(self, "mlp_layer_a", mlp1_a)
        set_(self, "gdn_layer_a", gdn1_a - gdn_core)
        set_(self, "gdn_chunk_flops", gdn_core * GDN_CHUNK)
        set_(self, "mamba_layer_a", mamba1_a)
        set_(self, "linear_layer_a", self.gdn_layer_a if self.n_gdn else mamba1_a)
        set_(self, "linear_chunk_flops", self.gdn_chunk_flops if self.n_gdn else 0.0)

        set_(self, "_kv", self.n_attn * 2 * KVH * hd * self.kv_dtype_bytes)
        gdn_state = (
            Hv * dk * dv * self.state_dtype_bytes + gdn_conv_dim * (self.gdn_conv_width - 1) * self.conv_dtype_bytes
        )
        m_ch = self.mamba_state_channels or di
        m_cols = self.mamba_conv_cols or (self.mamba_conv_width - 1)
        mamba_state = m_ch * N * self.state_dtype_bytes + mamba_conv_dim * m_cols * self.conv_dtype_bytes
        set_(self, "_state", self.n_gdn * gdn_state + self.n_mamba * mamba_state)

    # ---- bytes
    def kv_bytes_per_token(self) -> int:
        return self._kv

    def state_bytes(self) -> int:
        return self._state

    @property
    def is_hybrid(self) -> bool:
        return self.n_gdn + self.n_mamba > 0

    def node_bytes(self, L_node: int) -> int:
        """Eviction denominator: one checkpoint plus the KV of the whole root-to-node path."""
        return self._state + self._kv * L_node

    # ---- FLOPs
    def flops(self, L: int) -> float:
        return self._a * L + self._b * L * L

    def prefill_flops(self, p: int, L: int) -> float:
        """FLOPs for tokens [p, L) given a cached prefix of p tokens (0 if nothing to compute)."""
        if p >= L:
            return 0.0
        return self._a * (L - p) + self._b * (L * L - p * p)

    def decode_flops(self, n: int, context_sum: int) -> float:
        """FLOPs of ``n`` decode tokens whose contexts sum to ``context_sum`` (each token at
        position c costs ``prefill_flops(c, c + 1)``)."""
        return self._a * n + self._b * (2 * context_sum + n)

    def node_flops(self, L_parent: int, L_node: int) -> float:
        """Eviction numerator: FLOPs saved by reusing the node's prefix, marginal to its parent.

        Linear/SSM layers contribute F(e) with e = L_node - L_parent, which equals F(L_n) - F(L_p)
        because they are linear in L; so the corrected value is just F(L_n) - F(L_p).
        """
        return self._a * (L_node - L_parent) + self._b * (L_node * L_node - L_parent * L_parent)

    # ---- descriptive helpers (CLI, tests)
    def layers_by_type(self) -> dict[str, int]:
        mamba = "mamba1" if self.mamba_version == 1 else "mamba2"
        return {"attention": self.n_attn, "gated_delta": self.n_gdn, mamba: self.n_mamba, "mlp": self.n_mlp}

    def state_kv_tokens(self) -> float:
        """One checkpoint expressed as the KV of this many tokens (break-even length)."""
        return self._state / self._kv if self._kv else float("inf")

    def active_params(self) -> int:
        """Approximate active parameters: linear FLOP coefficient / 2 (so it also carries the small
        non-weight linear terms: GDN core, conv) plus two vocab tables (embedding, LM head).
        A cross-check against the name's nominal count (A3B -> 3e9), not used in any cost."""
        return int(round(self._a / 2)) + 2 * self.embedding_params


# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------


def _qwen_hybrid(name, *, layers, d, hv, heads, kv_heads, mlp_params, vocab, nominal, source, moe=False):
    """Qwen3-Next / Qwen3.5 layout (docs/cost-model.md §4): 3 GDN : 1 full attention, Hk = 16, head dims
    128 (GDN) and 256 (attention, output-gated), conv width 4, fp32 SSM state, bf16 conv and KV;
    every layer has an MLP/MoE block."""
    return ModelSpec(
        name=name,
        d_model=d,
        n_attn=layers // 4,
        attn_heads=heads,
        attn_kv_heads=kv_heads,
        attn_head_dim=256,
        attn_causal=True,
        attn_output_gate=True,
        n_gdn=layers - layers // 4,
        gdn_k_heads=16,
        gdn_v_heads=hv,
        gdn_head_k_dim=128,
        gdn_head_v_dim=128,
        gdn_conv_width=4,
        n_mlp=layers,
        mlp_active_params=mlp_params,
        mlp_moe=moe,
        kv_dtype_bytes=2,
        state_dtype_bytes=4,
        conv_dtype_bytes=2,
        embedding_params=vocab * d,
        nominal_active_params=nominal,
        source=source,
    )


def _moe(d, inter, top_k, shared_inter, n_experts):
    # SwiGLU experts (3 matrices), top-k routed + one shared expert, a linear router; the shared
    # expert's scalar gate (d params) is negligible and ignored
    return 3 * d * inter * top_k + 3 * d * shared_inter + d * n_experts


_D7 = 4096
_QWEN_VOCAB = 248_320  # Qwen3.5 (slime Megatron scripts); Qwen3-Next uses 151,936

MODELS: dict[str, ModelSpec] = {
    # The paper's 7B hybrid with the paper's formulas exactly (docs/cost-model.md §2-§3): MHA fp16 KV, state
    # D*N fp16 + conv (2D + 2N) x 4 columns fp16, non-causal 4*L^2*D attention term.
    "marconi-7b": ModelSpec(
        name="marconi-7b",
        d_model=_D7,
        n_attn=4,
        attn_heads=32,
        attn_kv_heads=32,
        attn_head_dim=128,
        attn_causal=False,
        n_mamba=24,
        mamba_d_inner=2 * _D7,
        mamba_d_state=128,
        mamba_conv_width=4,
        mamba_n_groups=1,
        mamba_state_channels=_D7,
        mamba_conv_cols=4,
        n_mlp=28,
        mlp_active_params=8 * _D7 * _D7,  # 2 x D x 4D -> 16*L*D^2 FLOPs
        kv_dtype_bytes=2,
        state_dtype_bytes=2,
        conv_dtype_bytes=2,
        nominal_active_params=7e9,
        source="Marconi paper/artifact formulas (docs/cost-model.md §2-§3)",
    ),
    "qwen3-next-80b-a3b": _qwen_hybrid(
        "qwen3-next-80b-a3b",
        layers=48,
        d=2048,
        hv=32,
        heads=16,
        kv_heads=2,
        mlp_params=_moe(2048, 512, 10, 512, 512),
        moe=True,
        vocab=151_936,
        nominal=3e9,
        source="transformers Qwen3NextConfig defaults; MoE 512 experts top-10 x 512 + shared 512",
    ),
    "qwen3.5-9b": _qwen_hybrid(
        "qwen3.5-9b",
        layers=32,
        d=4096,
        hv=32,
        heads=16,
        kv_heads=4,
        mlp_params=3 * 4096 * 12288,
        vocab=_QWEN_VOCAB,
        nominal=9e9,
        source="docs/cost-model.md §4; dense SwiGLU intermediate 12288 (third-party transcription, unverified)",
    ),
    "qwen3.5-27b": _qwen_hybrid(
        "qwen3.5-27b",
        layers=64,
        d=5120,
        hv=48,
        heads=24,
        kv_heads=4,
        mlp_params=3 * 5120 * 17408,
        vocab=_QWEN_VOCAB,
        nominal=27e9,
        source="docs/cost-model.md §4; dense SwiGLU intermediate 17408 (slime Megatron script)",
    ),
    "qwen3.5-35b-a3b": _qwen_hybrid(
        "qwen3.5-35b-a3b",
        layers=40,
        d=2048,
        hv=32,
        heads=16,
        kv_heads=2,
        mlp_params=_moe(2048, 512, 8, 512, 256),
        moe=True,
        vocab=_QWEN_VOCAB,
        nominal=3e9,
        source="docs/cost-model.md §4; MoE 256 experts top-8 x 512 + shared 512 (slime Megatron script)",
    ),
    "qwen3.5-122b-a10b": _qwen_hybrid(
        "qwen3.5-122b-a10b",
        layers=48,
        d=3072,
        hv=64,
        heads=32,
        kv_heads=2,
        mlp_params=_moe(3072, 1024, 8, 1024, 256),
        moe=True,
        vocab=_QWEN_VOCAB,
        nominal=10e9,
        source="docs/cost-model.md §4; MoE 256 x top-8 x 1024 + shared 1024 is an ESTIMATE (not seen in a "
        "config; chosen so total active params ~ the name's 10B)",
    ),
    "qwen3.5-397b-a17b": _qwen_hybrid(
        "qwen3.5-397b-a17b",
        layers=60,
        d=4096,
        hv=64,
        heads=32,
        kv_heads=2,
        mlp_params=_moe(4096, 1024, 10, 1024, 512),
        moe=True,
        vocab=_QWEN_VOCAB,
        nominal=17e9,
        source="docs/cost-model.md §4; MoE 512 experts top-10 x 1024 + shared 1024 (slime Megatron script)",
    ),
    # Pure transformer sanity preset: Llama-2-7B shapes (MHA, SwiGLU 11008), fp16 KV, causal.
    "llama-7b": ModelSpec(
        name="llama-7b",
        d_model=4096,
        n_attn=32,
        attn_heads=32,
        attn_kv_heads=32,
        attn_head_dim=128,
        attn_causal=True,
        n_mlp=32,
        mlp_active_params=3 * 4096 * 11008,
        kv_dtype_bytes=2,
        embedding_params=32_000 * 4096,
        nominal_active_params=7e9,
        source="Llama-2-7B config",
    ),
}


def _mamba2_hybrid(
    name,
    *,
    d,
    n_attn,
    heads,
    kv_heads,
    n_mamba,
    m_heads,
    m_head_dim,
    d_state,
    groups,
    n_mlp,
    mlp_params,
    vocab,
    total,
    nominal,
    source,
    head_dim=128,
    state_bytes=2,
    version=2,
    dt_rank=0,
    d_inner=0,
    state_note="",
    moe=False,
):
    """A Mamba + attention hybrid read the way ``sim/hf_config.py`` reads its config (docs/models.md):
    real Mamba2 projections (in_proj D -> 2*d_inner + 2*G*N + heads) or Mamba1 (``version=1``:
    d_inner x N state, x_proj / dt_proj of rank ``dt_rank``), conv width 4, bf16 KV and conv
    window, the recurrent state in the model dtype (``state_bytes``) as engines keep it by default."""
    return ModelSpec(
        name=name,
        d_model=d,
        n_attn=n_attn,
        attn_heads=heads,
        attn_kv_heads=kv_heads,
        attn_head_dim=head_dim,
        attn_causal=True,
        n_mamba=n_mamba,
        mamba_version=version,
        mamba_heads=m_heads if version == 2 else 0,
        mamba_dt_rank=dt_rank,
        mamba_d_inner=d_inner or m_heads * m_head_dim,
        mamba_d_state=d_state,
        mamba_conv_width=4,
        mamba_n_groups=groups,
        n_mlp=n_mlp,
        mlp_active_params=mlp_params,
        mlp_moe=moe,
        kv_dtype_bytes=2,
        state_dtype_bytes=state_bytes,
        conv_dtype_bytes=2,
        embedding_params=vocab * d,
        nominal_active_params=nominal,
        total_params=total,
        source=source,
        state_note=state_note,
    )


MODELS.update(
    {
        # Nemotron-H: pattern "M-M-M-M*-..." (52 / 118 blocks): Mamba2 (M), attention (*) and
        # squared-ReLU MLP (-, up and down only) blocks, each its own layer
        "nemotron-h-8b": _mamba2_hybrid(
            "nemotron-h-8b",
            d=4096,
            n_attn=4,
            heads=32,
            kv_heads=8,
            n_mamba=24,
            m_heads=128,
            m_head_dim=64,
            d_state=128,
            groups=8,
            n_mlp=24,
            mlp_params=2 * 4096 * 21504,
            vocab=131_072,
            total=8_100_389_888,
            nominal=8e9,
            source="HF nvidia/Nemotron-H-8B-Base-8K config.json (tests/data/configs/nemotron-h-8b.json)",
            state_bytes=4,  # the engines' fp32 Mamba state for Nemotron-H (NEMOTRON_H_STATE_NOTE)
            state_note=NEMOTRON_H_STATE_NOTE,
        ),
        "nemotron-h-56b": _mamba2_hybrid(
            "nemotron-h-56b",
            d=8192,
            n_attn=10,
            heads=64,
            kv_heads=8,
            n_mamba=54,
            m_heads=256,
            m_head_dim=64,
            d_state=256,
            groups=8,
            n_mlp=54,
            mlp_params=2 * 8192 * 32768,
            vocab=131_072,
            total=56_322_269_696,
            nominal=56e9,
            source="HF nvidia/Nemotron-H-56B-Base-8K config.json (tests/data/configs/nemotron-h-56b.json)",
            state_bytes=4,  # the engines' fp32 Mamba state for Nemotron-H (NEMOTRON_H_STATE_NOTE)
            state_note=NEMOTRON_H_STATE_NOTE,
        ),
        # Jamba 1.5 Mini: attention at layers 4, 12, 20, 28 (period 8, offset 4), Mamba1 elsewhere;
        # MoE (16 experts, top-2, SwiGLU 14336) at odd layers, a dense SwiGLU 14336 at even ones,
        # averaged over the 32 MLP blocks: 1.5 dense widths + half a router per block
        "jamba-1.5-mini": _mamba2_hybrid(
            "jamba-1.5-mini",
            d=4096,
            n_attn=4,
            heads=32,
            kv_heads=8,
            n_mamba=28,
            m_heads=0,
            m_head_dim=0,
            d_inner=8192,
            d_state=16,
            groups=1,
            n_mlp=32,
            mlp_params=(16 * 3 * 4096 * 14336 + 16 * (2 * 3 * 4096 * 14336 + 4096 * 16)) // 32,
            vocab=65_536,
            total=51_569_590_272,
            nominal=12e9,
            version=1,
            dt_rank=256,
            source="HF ai21labs/AI21-Jamba-1.5-Mini config.json (tests/data/configs/jamba-1.5-mini.json)",
            moe=True,
        ),
        # Falcon-H1 7B: attention (12 heads, 2 KV heads) and Mamba2 (24 heads x 128, d_state 256)
        # side by side in each of 44 layers, then a SwiGLU MLP 12288
        "falcon-h1-7b": _mamba2_hybrid(
            "falcon-h1-7b",
            d=3072,
            n_attn=44,
            heads=12,
            kv_heads=2,
            n_mamba=44,
            m_heads=24,
            m_head_dim=128,
            d_state=256,
            groups=1,
            n_mlp=44,
            mlp_params=3 * 3072 * 12288,
            vocab=130_049,
            total=7_585_223_776,
            nominal=7e9,
            source="HF tiiuae/Falcon-H1-7B-Base config.json (tests/data/configs/falcon-h1-7b.json)",
        ),
        # Granite 4.0 H-Small: 36 Mamba2 + 4 attention layers (layer_types), each with an MoE block
        # (72 experts, top-10, 768 wide, shared expert 1536)
        "granite-4.0-h-small": _mamba2_hybrid(
            "granite-4.0-h-small",
            d=4096,
            n_attn=4,
            heads=32,
            kv_heads=8,
            n_mamba=36,
            m_heads=128,
            m_head_dim=64,
            d_state=128,
            groups=1,
            n_mlp=40,
            mlp_params=_moe(4096, 768, 10, 1536, 72),
            moe=True,
            vocab=100_352,
            total=32_206_702_080,
            nominal=9e9,
            source="HF ibm-granite/granite-4.0-h-small config.json (tests/data/configs/granite-4.0-h-small.json)",
        ),
    }
)


def _replay_tiny() -> ModelSpec:
    """Toy shapes of the Qwen3.5 layout for CPU replay tests (plain-torch gated delta, or the Triton
    interpreter): 3 gated-delta layers (Hk 1, Hv 2, head dims 16) and 1 attention layer, hidden size 32."""
    spec = ModelSpec(
        name="replay-tiny",
        d_model=32,
        n_attn=1,
        attn_heads=2,
        attn_kv_heads=1,
        attn_head_dim=16,
        attn_causal=True,
        attn_output_gate=True,
        n_gdn=3,
        gdn_k_heads=1,
        gdn_v_heads=2,
        gdn_head_k_dim=16,
        gdn_head_v_dim=16,
        gdn_conv_width=4,
        n_mlp=4,
        mlp_active_params=3 * 32 * 64,
        kv_dtype_bytes=2,
        state_dtype_bytes=4,
        conv_dtype_bytes=2,
        embedding_params=512 * 32,
        source="toy shapes for CPU replay tests (marconi replay --device cpu)",
    )
    return replace(spec, nominal_active_params=float(spec.active_params()))


MODELS["replay-tiny"] = _replay_tiny()


def _replay_tiny_moe() -> ModelSpec:
    """replay-tiny's MoE twin for CPU replay tests: the MoE presets' traits at toy size (the MLP at
    a MoE's active width: 4 routed experts of 8, a shared one and the router; 8 query heads per KV
    head, as qwen3-next-80b-a3b and qwen3.5-35b-a3b have)."""
    spec = replace(
        _replay_tiny(),
        name="replay-tiny-moe",
        attn_heads=8,
        attn_kv_heads=1,
        mlp_active_params=_moe(32, 8, 4, 8, 6),
        mlp_moe=True,
        source="toy MoE shapes for CPU replay tests (marconi replay --device cpu)",
    )
    return replace(spec, nominal_active_params=float(spec.active_params()))


MODELS["replay-tiny-moe"] = _replay_tiny_moe()


_READ: dict = {}  # (resolved path, mtime, size) -> ModelSpec read from a config.json


def get_model(name: str) -> ModelSpec:
    """A preset by name, or the model read from a Hugging Face config.json (or a folder holding
    one) when ``name`` is a path (sim/hf_config.py)."""
    key = str(name).strip().lower()
    if key in MODELS:
        return MODELS[key]
    if key and looks_like_path(str(name)):  # "" is no path (it would read ./config.json)
        path = config_file(name, presets=MODELS)
        st = path.stat()
        k = (str(path.resolve()), st.st_mtime_ns, st.st_size, str(name))
        if k not in _READ:
            _READ[k] = ModelSpec(**read_config(name))
        return _READ[k]
    raise UsageError(f"unknown model {name!r}; valid: {', '.join(MODELS)}, or a config.json path")


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

JAMBA_TTFT_INTERCEPT_MS = 17.8  # docs/cost-model.md §5: linear fit to the paper's Jamba-1.5-Mini TTFT profile
JAMBA_TTFT_SLOPE_MS = 0.0530


@dataclass(frozen=True)
class TimingModel:
    effective_tflops: float
    overhead_ms: float
    decode_ms_per_token: float
    source: str = field(default="", compare=False)
    # tensor parallel (--tensor-parallel N): the all-reduces of one call, per token and per call
    comm_ms_per_token: float = 0.0
    comm_ms_per_call: float = 0.0
    device: str = field(default="", compare=False)  # the catalogue GPU it prices (sim/gpus.py)
    uncalibrated: bool = field(default=False, compare=False)  # scaled from another device's figures
    _inv: float = field(init=False, repr=False, compare=False, default=0.0)
    charges_splits = False  # FLOPs only: an exact-alignment split costs nothing here

    def __post_init__(self) -> None:
        if self.effective_tflops <= 0 or self.overhead_ms < 0 or self.decode_ms_per_token < 0:
            raise UsageError("timing: throughput must be positive and times non-negative")
        object.__setattr__(self, "_inv", 1.0 / (self.effective_tflops * 1e12))

    def prefill_time_s(self, spec: ModelSpec, p: int, L: int, splits: int = 0) -> float:
        """One request's prefill of tokens [p, L); ``splits`` (extra kernel calls of an
        exact-alignment split) are not charged by this FLOPs-only model."""
        t = self.overhead_ms * 1e-3 + spec.prefill_flops(p, L) * self._inv
        if self.comm_ms_per_call or self.comm_ms_per_token:
            t += (self.comm_ms_per_call + max(L - p, 0) * self.comm_ms_per_token) * 1e-3
        return t

    def decode_time_s(self, n_tokens: int) -> float:
        return n_tokens * (self.decode_ms_per_token + self.comm_ms_per_call + self.comm_ms_per_token) * 1e-3

    def step_time_s(
        self, spec: ModelSpec, prefills: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        """Modelled time of one engine step (a continuous-batching iteration).

        ``prefills``: ``(start, end)`` token positions of each request's prefill chunk in this step
        (attention sees ``0..end``); ``decode_contexts``: the context length of each request
        decoding one token. A step with prefill work pays the fixed overhead once plus the batch's
        FLOPs at the effective throughput; decode is memory-bound: the weights are read once per
        step however many requests decode (``decode_ms_per_token``), so a step takes the larger of
        its compute time and that read. One request alone: ``step_time_s(spec, [(p, L)], [])``
        equals ``prefill_time_s(spec, p, L)`` and ``step_time_s(spec, [], [c])`` equals
        ``decode_time_s(1)``."""
        flops = spec.decode_flops(len(decode_contexts), sum(decode_contexts)) if decode_contexts else 0.0
        for p, L in prefills:
            flops += spec.prefill_flops(p, L)
        compute = flops * self._inv
        if prefills:
            compute += self.overhead_ms * 1e-3
        if self.comm_ms_per_call or self.comm_ms_per_token:
            tokens = sum(max(L - p, 0) for p, L in prefills) + len(decode_contexts)
            compute += (self.comm_ms_per_call + tokens * self.comm_ms_per_token) * 1e-3
        if decode_contexts:
            return max(compute, self.decode_ms_per_token * 1e-3)
        return compute

    @staticmethod
    def jamba_ttft_s(n_tokens: int) -> float:
        return (JAMBA_TTFT_INTERCEPT_MS + JAMBA_TTFT_SLOPE_MS * n_tokens) * 1e-3


def gdn_chunks(start: int, end: int) -> int:
    """Kernel chunks of one call over absolute positions [start, end) (chunks are aligned to
    absolute multiples of GDN_CHUNK, so a call starting or ending off one has a ragged chunk)."""
    if end <= start:
        return 0
    return (end - 1) // GDN_CHUNK - start // GDN_CHUNK + 1


TERMS = ("attn_linear", "attn_quadratic", "gdn_linear", "gdn_chunk", "mlp_linear")
LAYER_KINDS = ("attention", "gated_delta", "mlp")
#: how a HardwareTiming's per-layer terms combine (``HardwareTiming.layer_form``)
LAYER_FORMS = ("additive", "overlap")
_NO_CORE = dict.fromkeys(LAYER_KINDS, 0.0)  # a call priced without a core (read only)


def weight_gb(spec: ModelSpec) -> dict:
    """GB of weights one layer of each kind reads per call: its linear FLOPs per token (2 per
    parameter) are its bytes at 2 bytes a parameter (bf16 / fp16 weights)."""
    return {
        "attention": spec.attn_layer_a * 1e-9,
        "gated_delta": spec.linear_layer_a * 1e-9,
        "mlp": spec.mlp_layer_a * 1e-9,
    }


def kv_gb_per_layer_token(spec: ModelSpec) -> float:
    """GB of keys and values one attention layer holds per token of context."""
    return 2 * spec.attn_kv_heads * spec.attn_head_dim * spec.kv_dtype_bytes * 1e-9


def kv_read_gb_per_layer_token(spec: ModelSpec, query_heads: bool) -> float:
    """GB per token of context one attention call reads as its keys and values: the key / value
    heads' (``kv_gb_per_layer_token``), or with ``query_heads`` those plus, where the query heads
    outnumber them, their copy at every query head (the replay's SDPA path repeats each key / value
    head for its query heads before the kernel reads them): ``2 x (kv heads + query heads) x head
    dim x bytes``; nothing is copied where the heads are equal."""
    if not query_heads or spec.attn_heads <= spec.attn_kv_heads:
        return kv_gb_per_layer_token(spec)
    return 2 * (spec.attn_kv_heads + spec.attn_heads) * spec.attn_head_dim * spec.kv_dtype_bytes * 1e-9


def attn_run_b(spec: ModelSpec) -> float:
    """Per ``L^2 - p^2``, the FLOPs of the attention core a causal kernel runs: ``spec.attn_layer_b``,
    halved for a preset counted by the paper's full-square convention (``attn_causal=False``), as
    every engine and the replay run attention causal whatever the FLOP count's convention."""
    return spec.attn_layer_b if spec.attn_causal else 0.5 * spec.attn_layer_b


def act_gb(spec: ModelSpec) -> dict:
    """GB of activations one layer of each kind writes per token: the output widths of its
    products (its weight GB over the hidden size) at 2 bytes an element."""
    return {k: v / spec.d_model for k, v in weight_gb(spec).items()}


@dataclass(frozen=True)
class HardwareTiming:
    """Prefill / decode / step time from terms that exist in hardware (``marconi replay
    --calibrate`` fits them to per-layer-type measurements):

    * per FLOP term, ``ms_per_tflop[term]``: milliseconds per 1e12 FLOPs of that work
      (achieved fraction of the device's peak = 1000 / (ms_per_tflop * peak_tflops)):
      attention projections (linear in tokens) and score/value products (context-quadratic);
      gated-delta projections + conv (linear) and the chunked core (per 64-token kernel chunk,
      ragged chunks counted whole); MLP (linear);
    * ``layer_call_ms[kind]``: fixed device time of one call of one layer of that kind (its
      weights read, small kernels), plus ``call_ms`` per call of the whole model (embedding,
      chunk metadata);
    * ``layer_floor_ms[kind]``: the host's time to issue one layer of that kind (Python and
      kernel launches). Launches are asynchronous, so a layer takes
      ``max(floor, call + FLOP terms)``: short prefills are launch-bound, long ones compute-bound.
      A prefill pays all of it once per call, so an exact-alignment split (a second call) pays
      it again, with its ragged chunk;
    * ``seq_ms[kind]``: each further sequence in one call, per layer of that kind (its state
      gathered and scattered, its own attention call over its own context, its chunk programs):
      a step of n sequences pays it n - 1 times; 0 in a file fitted before steps were measured;
    * ``decode_ms_per_token``: one decode step of one request (``decode_time_s``, the ``fcfs``
      scheduler's decode); a continuous-batching step prices its decode tokens as one-token
      sequences of the step's call instead;
    * shape terms, which carry a fit from one preset's widths to another's (0 in a file fitted
      on one preset, whose ``layer_call_ms`` then holds them at that preset's shapes):
      ``ms_per_weight_gb[kind]``, each call of a layer reading its weights (``weight_gb``: the
      layer's linear FLOPs per token, which at 2 bytes a parameter are its weight bytes), and
      ``ms_per_act_gb[kind]``, per token the activations its products write (``act_gb``: the
      weight GB over the hidden size, the products' output widths): at a small hidden size a
      token's FLOPs are few for the bytes it moves, and the GEMMs run further from the peak.
    * the host's issue time of a whole call, ``host_ms_per_call`` + ``host_ms_per_layer`` per
      layer call (``host_issue_ms``): what a call costs when the host, not the device, is the
      slower (``issued_time_s`` = the later of the two). ``prefill_time_s`` and ``step_time_s``
      stay device time (what an engine whose host keeps up runs; ``marconi run`` prices that);
      replay prices its host-bound calls with it (docs/replay-cost-model.md). 0 in a file fitted
      before it was measured.
    * ``gdn_resume_ms_per_chunk``: per kernel chunk, per gated-delta layer, the extra device time
      of a prefill that resumes from a restored state (``p > 0``) over one from scratch (H200,
      Triton kernels: a suffix from a 512-token hit runs its gated-delta layers 1.11-1.26x the
      same request's from-scratch reference per token; attention and MLP 1.0x). Priced by
      ``prefill_time_s`` only: a continuous-batching step passes every sequence a state, and its
      per-sequence terms were fitted with it. 0 in a file fitted before it was measured.
    Compute terms are divided by ``gpus`` (tensor parallel, ideal scaling assumed). ``dtype``
    and ``covers`` (the models, widths and call lengths it was fitted on) are what a calibrated
    file records; ``coverage_note`` says when a run leaves them."""

    ms_per_tflop: dict
    layer_call_ms: dict
    call_ms: float
    decode_ms_per_token: float
    peak_tflops: float = 0.0
    gpus: int = 1
    source: str = field(default="", compare=False)
    layer_floor_ms: dict = field(default_factory=lambda: dict.fromkeys(LAYER_KINDS, 0.0))
    seq_ms: dict = field(default_factory=lambda: dict.fromkeys(LAYER_KINDS, 0.0))
    # tensor parallel (--tensor-parallel N): the all-reduces of one call, per token and per call
    comm_ms_per_token: float = 0.0
    comm_ms_per_call: float = 0.0
    device: str = field(default="", compare=False)  # the catalogue GPU it prices (sim/gpus.py)
    uncalibrated: bool = field(default=False, compare=False)  # scaled from another device's figures
    ms_per_weight_gb: dict = field(default_factory=lambda: dict.fromkeys(LAYER_KINDS, 0.0))
    ms_per_act_gb: dict = field(default_factory=lambda: dict.fromkeys(LAYER_KINDS, 0.0))
    ms_per_kv_gb: float = 0.0
    dtype: str = field(default="", compare=False)  # the activations' dtype it was fitted in
    # how the replay it was fitted on ran attention (sim.replay.model.ATTENTION_BACKENDS)
    attention: str = field(default="sdpa", compare=False)
    # how it ran the norms, gates and activations (sim.replay.model.ELEMENTWISE)
    elementwise: str = field(default="torch", compare=False)
    covers: dict = field(default_factory=dict, compare=False)  # models, d_model, tokens fitted on
    # the host's time to issue a call (Python, dispatch, launches): per call and per layer call
    # (an attention, gated-delta, Mamba or MLP layer each one); 0 in a file fitted without it
    host_ms_per_call: float = 0.0
    host_ms_per_layer: float = 0.0
    # a gated-delta layer's extra device time per kernel chunk of a call resumed from a state
    gdn_resume_ms_per_chunk: float = 0.0
    # how a layer's terms combine (LAYER_FORMS): "additive", every term summed (a file fitted before
    # 2026-12-07); "overlap", the projections' GEMMs stream the layer's weights while they compute
    # (the larger of the two), the attention / chunk core after them (docs/replay-cost-model.md)
    layer_form: str = "additive"
    # the kv term per context token counts the replay's copy of the key / value heads at every query
    # head (``sim.replay.model``'s SDPA path repeats them where the query heads outnumber them)
    kv_query_heads: bool = False
    # per model: (the spec, {context: a one-token decode's work by kind}, its layer_fixed_ms);
    # memoized because a continuous-batching step prices every decoding sequence and a decode
    # run times up to VARIABLE_RUN steps of the same contexts (values equal to recomputing them)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    charges_splits = True

    def __post_init__(self) -> None:
        if set(self.ms_per_tflop) != set(TERMS) or set(self.layer_call_ms) != set(LAYER_KINDS):
            raise UsageError(f"timing: terms must be {', '.join(TERMS)} and per-call times {', '.join(LAYER_KINDS)}")
        if set(self.layer_floor_ms) != set(LAYER_KINDS) or set(self.seq_ms) != set(LAYER_KINDS):
            raise UsageError(f"timing: per-layer floors and per-sequence times must be {', '.join(LAYER_KINDS)}")
        if set(self.ms_per_weight_gb) != set(LAYER_KINDS) or set(self.ms_per_act_gb) != set(LAYER_KINDS):
            raise UsageError(f"timing: per-weight-GB and per-activation-GB times must be {', '.join(LAYER_KINDS)}")
        if self.layer_form not in LAYER_FORMS:
            raise UsageError(f"timing: layer_form must be one of {', '.join(LAYER_FORMS)}, not {self.layer_form!r}")
        vals = (
            list(self.ms_per_tflop.values())
            + list(self.layer_call_ms.values())
            + list(self.layer_floor_ms.values())
            + list(self.seq_ms.values())
            + list(self.ms_per_weight_gb.values())
            + list(self.ms_per_act_gb.values())
        )
        fixed = [
            self.call_ms,
            self.decode_ms_per_token,
            self.ms_per_kv_gb,
            self.host_ms_per_call,
            self.host_ms_per_layer,
            self.gdn_resume_ms_per_chunk,
        ]
        if min(vals + fixed) < 0 or self.gpus < 1:
            raise UsageError("timing: every term must be non-negative")
        if self.peak_tflops > 0:
            for term, c in self.ms_per_tflop.items():
                if c > 0 and 1e3 / (c * self.peak_tflops) > 1.0 + 1e-9:
                    raise UsageError(
                        f"timing: term {term} runs at {1e3 / (c * self.peak_tflops):.0%} of "
                        f"the device's {self.peak_tflops:g} TFLOP/s peak (over 100 %: not physical)"
                    )

    # the old single-rate fields, for callers that print them
    @property
    def effective_tflops(self) -> float:
        c = self.ms_per_tflop["mlp_linear"] or self.ms_per_tflop["gdn_linear"]
        return 1e3 / c * self.gpus if c > 0 else float("inf")

    @property
    def overhead_ms(self) -> float:
        return self.call_ms

    def fraction_of_peak(self) -> dict:
        """Achieved fraction of ``peak_tflops`` of every FLOP term (None where not known)."""
        return {
            t: (1e3 / (c * self.peak_tflops) if c > 0 and self.peak_tflops > 0 else None)
            for t, c in self.ms_per_tflop.items()
        }

    def _layers(self, spec: ModelSpec) -> dict:
        return {"attention": spec.n_attn, "gated_delta": spec.n_gdn + spec.n_mamba, "mlp": spec.n_mlp}

    def layer_fixed_ms(self, spec: ModelSpec) -> dict:
        """Per layer of each kind, the device time of one call that computes nothing: its fixed
        time and its weights read (tensor parallel: each GPU reads its share)."""
        r = self.weights_read_ms(spec)
        return {k: self.layer_call_ms[k] + r[k] for k in LAYER_KINDS}

    def weights_read_ms(self, spec: ModelSpec) -> dict:
        """Per layer of each kind, the time of one call's read of its weights (tensor parallel:
        each GPU reads its share)."""
        w = weight_gb(spec)
        return {k: self.ms_per_weight_gb[k] * w[k] / self.gpus for k in LAYER_KINDS}

    _MEMO_CONTEXTS = 1 << 18  # contexts remembered per model before the table starts again
    _MEMO_MODELS = 8  # models remembered (a replay prices a fresh copy of its spec at every step)

    def _model_memo(self, spec: ModelSpec) -> tuple:
        """(spec, decode work by context, layer_fixed_ms, weights_read_ms) of ``spec``: keyed by
        the object, which the entry keeps alive so its id is not reused while cached."""
        m = self._memo.get(id(spec))
        if m is None or m[0] is not spec:
            if len(self._memo) >= self._MEMO_MODELS:
                self._memo.clear()
            m = self._memo[id(spec)] = (spec, {}, self.layer_fixed_ms(spec), self.weights_read_ms(spec))
        return m

    def _decode_work(self, spec: ModelSpec, c: int, table: dict) -> tuple:
        """``work_parts(spec, c, c + 1, 1)`` as (attention, gated_delta, mlp) per-token terms then
        the same kinds' cores, remembered."""
        w = table.get(c)
        if w is None:
            if len(table) >= self._MEMO_CONTEXTS:
                table.clear()
            lin, core = self.work_parts(spec, c, c + 1, 1)
            w = table[c] = tuple(lin[k] for k in LAYER_KINDS) + tuple(core[k] for k in LAYER_KINDS)
        return w

    def fixed_ms(self, spec: ModelSpec) -> float:
        """Time of one call of the whole model that computes nothing (every layer at its floor)."""
        n, fixed = self._layers(spec), self.layer_fixed_ms(spec)
        return self.call_ms + sum(n[k] * max(self.layer_floor_ms[k], fixed[k]) for k in LAYER_KINDS)

    @property
    def has_host_term(self) -> bool:
        """Whether the file prices the host's issue time (``host_issue_ms``)."""
        return self.host_ms_per_call > 0 or self.host_ms_per_layer > 0

    def host_issue_ms(self, spec: ModelSpec, calls: int = 1) -> float:
        """The host's time to issue ``calls`` calls of ``spec`` (each layer of every kind one layer
        call): ``calls x (host_ms_per_call + host_ms_per_layer x layer calls)``. Not divided by
        ``gpus``: one host issues every GPU's launches (a lower bound for tensor parallel)."""
        n = sum(self._layers(spec).values())
        return max(0, int(calls)) * (self.host_ms_per_call + self.host_ms_per_layer * n)

    def issued_time_s(self, spec: ModelSpec, p: int, L: int, splits: int = 0) -> float:
        """A prefill of [p, L) as a host that issues it while it runs sees it: the later of the
        device's work (``prefill_time_s``) and the host's issue of its ``1 + splits`` calls
        (launches are asynchronous, so the two overlap; the GPU ends just after the host's last
        launch when the host is the slower). Equal to ``prefill_time_s`` without a host term."""
        return max(self.prefill_time_s(spec, p, L, splits), self.host_issue_ms(spec, 1 + splits) * 1e-3)

    def coverage_note(self, spec: ModelSpec, max_tokens: int = 0, layer_calls: int = 0) -> str:
        """One line when ``spec`` (or a prompt of ``max_tokens``, or calls of ``layer_calls``
        layer calls priced with the host term) lies outside the shapes this timing was fitted on
        (``covers``); empty inside them or when the file records none."""
        c = self.covers or {}
        out = []
        lo, hi = (c.get("d_model") or (0, 0))[:2]
        if hi and not lo <= spec.d_model <= hi:
            out.append(f"d_model {spec.d_model} (fitted {lo}-{hi})")
        top = int(c.get("max_tokens") or 0)
        if top and max_tokens > top:
            out.append(f"prompts up to {max_tokens:,} tokens (fitted up to {top:,})")
        lo, hi = (c.get("host_layer_calls") or (0, 0))[:2]
        if self.has_host_term and hi and layer_calls and not lo <= layer_calls <= hi:
            out.append(f"{layer_calls} layer calls a call (host issue time fitted at {lo}-{hi})")
        if not out:
            return ""
        models = ", ".join(c.get("models") or []) or "its fit set"
        return f"timing: {spec.name} lies outside the shapes the timing file was fitted on ({models}): {'; '.join(out)}"

    def work_tflop(self, spec: ModelSpec, p: int, L: int, chunks: int) -> dict:
        """Per layer of each kind: its FLOP terms' time in ms for tokens [p, L) in ``chunks``
        kernel chunks (tensor parallel applied): ``work_parts``' two parts summed."""
        lin, core = self.work_parts(spec, p, L, chunks)
        return {k: lin[k] + core[k] for k in LAYER_KINDS}

    def work_parts(self, spec: ModelSpec, p: int, L: int, chunks: int) -> tuple[dict, dict]:
        """``(per_token, core)``: per layer of each kind, the ms of its per-token terms (the
        projections' FLOPs and the activations they write) and of its core (attention: the
        context-quadratic FLOPs and the keys and values read; gated delta or Mamba2: the per-chunk
        term; MLP: none) for tokens [p, L) in ``chunks`` kernel chunks (tensor parallel applied).
        The "overlap" form prices the attention core as the causal kernel runs it (``attn_run_b``)
        and, with ``kv_query_heads``, the keys and values at the query heads too."""
        if L <= p:
            zero = dict.fromkeys(LAYER_KINDS, 0.0)
            return zero, dict(zero)
        n = L - p
        c, a = self.ms_per_tflop, self.ms_per_act_gb
        mixer_a = spec.linear_layer_a
        overlap = self.layer_form == "overlap"
        # activations: a layer's weight GB (act_gb) over the hidden size, per token; inline, as this
        # runs for every request and every decoding sequence of a step
        act = 1e-9 * n / spec.d_model
        g = 1.0 / self.gpus
        attn = c["attn_linear"] * spec.attn_layer_a * n * 1e-12 + a["attention"] * spec.attn_layer_a * act
        b = attn_run_b(spec) if overlap else spec.attn_layer_b
        quad = c["attn_quadratic"] * b * (L * L - p * p) * 1e-12
        if n > 1:  # a one-token query (a decode) splits the context across programs: not bound by it
            quad += self.ms_per_kv_gb * kv_read_gb_per_layer_token(spec, self.kv_query_heads) * L
        gdn = c["gdn_linear"] * mixer_a * n * 1e-12 + a["gated_delta"] * mixer_a * act
        chunk = c["gdn_chunk"] * spec.linear_chunk_flops * chunks * 1e-12
        mlp = c["mlp_linear"] * spec.mlp_layer_a * n * 1e-12 + a["mlp"] * spec.mlp_layer_a * act
        return (
            {"attention": attn * g, "gated_delta": gdn * g, "mlp": mlp * g},
            {"attention": quad * g, "gated_delta": chunk * g, "mlp": 0.0},
        )

    def call_ms_for(self, spec: ModelSpec, work: dict, seqs: int = 1, core: dict | None = None) -> float:
        """One call of the model over ``seqs`` sequences doing ``work`` (per-layer ms by kind: the
        per-token terms, ``work_parts``' first part) and ``core`` (its second; none: 0). Per layer:
        additive, the fixed time, weights read, per-sequence time and both parts summed;
        overlap, the fixed and per-sequence times, the larger of the weights read and the
        per-token terms (the projections stream the weights while they compute), then the core
        (its own kernels, after them); either at least the layer's floor."""
        # on every priced step: summed inline (``layer_times`` is the same per kind, as a dict)
        m, n = self._model_memo(spec), self._layers(spec)
        floor, seq = self.layer_floor_ms, self.seq_ms
        more = max(0, int(seqs) - 1)
        cr = core or _NO_CORE
        if self.layer_form == "overlap":
            base, read = self.layer_call_ms, m[3]
            return self.call_ms + sum(
                n[k] * max(floor[k], base[k] + more * seq[k] + max(read[k], work[k]) + cr[k]) for k in LAYER_KINDS
            )
        fixed = m[2]
        return self.call_ms + sum(n[k] * max(floor[k], fixed[k] + more * seq[k] + work[k] + cr[k]) for k in LAYER_KINDS)

    def layer_times(self, spec: ModelSpec, work: dict, seqs: int = 1, core: dict | None = None) -> dict:
        """Per layer of each kind, its ms in one call over ``seqs`` sequences doing ``work`` and
        ``core`` (``call_ms_for``'s terms, before the layer counts and the call's own time)."""
        m = self._model_memo(spec)
        floor, seq = self.layer_floor_ms, self.seq_ms
        more = max(0, int(seqs) - 1)
        cr = core or _NO_CORE
        if self.layer_form == "overlap":
            base, read = self.layer_call_ms, m[3]
            return {k: max(floor[k], base[k] + more * seq[k] + max(read[k], work[k]) + cr[k]) for k in LAYER_KINDS}
        fixed = m[2]
        return {k: max(floor[k], fixed[k] + more * seq[k] + work[k] + cr[k]) for k in LAYER_KINDS}

    def prefill_layer_ms(self, spec: ModelSpec, p: int, L: int) -> dict:
        """Per layer of each kind, its ms in a one-call prefill of ``[p, L)`` (``prefill_time_s``'s
        layers, the resumed-call extra included): what a replay's per-layer-type times are
        compared with, layer by layer."""
        chunks = gdn_chunks(p, L)
        work, core = self.work_parts(spec, p, L, chunks)
        core["gated_delta"] += self.resume_ms(spec, p, L, chunks)
        return self.layer_times(spec, work, 1, core)

    def compute_ms(self, spec: ModelSpec, p: int, L: int, chunks: int) -> float:
        """The FLOP terms of tokens [p, L) in ``chunks`` kernel chunks over every layer."""
        n = self._layers(spec)
        return sum(n[k] * v for k, v in self.work_tflop(spec, p, L, chunks).items())

    def prefill_time_s(self, spec: ModelSpec, p: int, L: int, splits: int = 0) -> float:
        """One request's prefill of [p, L) in ``1 + splits`` calls: the split-off calls are taken
        as short (a call at its floor and fixed time, plus a ragged chunk each)."""
        chunks = gdn_chunks(p, L) + splits
        work, core = self.work_parts(spec, p, L, chunks)
        core["gated_delta"] += self.resume_ms(spec, p, L, chunks)
        t = (self.call_ms_for(spec, work, 1, core) + splits * self.fixed_ms(spec)) * 1e-3
        if self.comm_ms_per_call or self.comm_ms_per_token:
            t += ((1 + splits) * self.comm_ms_per_call + max(L - p, 0) * self.comm_ms_per_token) * 1e-3
        return t

    def resume_ms(self, spec: ModelSpec, p: int, L: int, chunks: int) -> float:
        """Per gated-delta layer, the extra time of tokens [p, L) in ``chunks`` kernel chunks run
        from a state (``p > 0``: a restored hit, or a chunked prefill's next piece) over the same
        chunks from zero (``gdn_resume_ms_per_chunk``); 0 from scratch."""
        if p > 0 and L > p and spec.n_gdn and self.gdn_resume_ms_per_chunk:
            return self.gdn_resume_ms_per_chunk * chunks / self.gpus
        return 0.0

    def decode_time_s(self, n_tokens: int) -> float:
        return n_tokens * (self.decode_ms_per_token + self.comm_ms_per_call + self.comm_ms_per_token) * 1e-3

    def step_time_s(self, spec: ModelSpec, prefills, decode_contexts) -> float:
        """One engine step: one call of the model over the step's sequences (a continuous-batching
        engine's varlen forward): every prefill chunk's work, and every decoding request as a
        one-token sequence at its context (its projections and MLP rows, its attention over the
        context, one ragged kernel chunk); the per-call and per-layer times once, the
        per-sequence time for each sequence after the first; a prefill from a state its resumed
        chunks' extra (``resume_ms``; decodes are priced by their own fitted terms). One request
        alone is its prefill."""
        if not prefills and not decode_contexts:
            return 0.0
        # each kind summed in the order of the sequences (prefills, then decodes), as one dict did
        wa = wg = wm = ca = cg = cm = 0.0
        for p, L in prefills:
            chunks = gdn_chunks(p, L)
            w, c = self.work_parts(spec, p, L, chunks)
            wa += w["attention"]
            wg += w["gated_delta"]
            wm += w["mlp"]
            ca += c["attention"]
            cg += c["gated_delta"] + self.resume_ms(spec, p, L, chunks)
        if decode_contexts:
            table = self._model_memo(spec)[1]
            for c in decode_contexts:
                w = table.get(c)  # inline: this loop runs for every decoding sequence of every step
                la, lg, lm, qa, qg, qm = w if w is not None else self._decode_work(spec, int(c), table)
                wa += la
                wg += lg
                wm += lm
                ca += qa
                cg += qg
                cm += qm
        work = {"attention": wa, "gated_delta": wg, "mlp": wm}
        core = {"attention": ca, "gated_delta": cg, "mlp": cm}
        t = self.call_ms_for(spec, work, len(prefills) + len(decode_contexts), core) * 1e-3
        if self.comm_ms_per_call or self.comm_ms_per_token:
            tokens = sum(max(L - p, 0) for p, L in prefills) + len(decode_contexts)
            t += (self.comm_ms_per_call + tokens * self.comm_ms_per_token) * 1e-3
        return t

    def with_gpus(self, gpus: int, source: str = "") -> "HardwareTiming":
        return replace(self, gpus=int(gpus), source=source or self.source)

    # --ttft-model jamba prices a prefill by the paper's table whatever the timing (the engine
    # calls ``timing.jamba_ttft_s``; without it every preset timed by a calibration crashed)
    jamba_ttft_s = staticmethod(TimingModel.jamba_ttft_s)


# Hardware: (dense bf16 peak TFLOP/s, HBM bytes/s). A100-40GB: 312 TFLOP/s, 1.555 TB/s (spec sheet);
# H200: ~989 TFLOP/s, 4.8 TB/s (spec sheet; docs/cost-model.md §5).
_A100 = (312.0, 1.555e12)
_H200 = (989.0, 4.8e12)
_MFU = 0.40  # assumed prefill model-FLOPs utilisation on H200 (estimate)
_BW_EFF = 0.60  # assumed fraction of HBM bandwidth reached by batch-1 decode (estimate)
_GPUS = {  # smallest tensor-parallel group that holds bf16 weights with room for cache (estimate)
    "qwen3.5-9b": 1,
    "qwen3.5-27b": 1,
    "qwen3.5-35b-a3b": 1,
    "qwen3-next-80b-a3b": 2,
    "qwen3.5-122b-a10b": 4,
    "qwen3.5-397b-a17b": 8,
    "replay-tiny": 1,
    "replay-tiny-moe": 1,
}


def _marconi_7b_timing() -> TimingModel:
    # Calibrated so marconi-7b prefill from scratch equals the paper's Jamba fit at 8K tokens:
    # overhead = the fit's 17.8 ms intercept; throughput = F(8192) / (0.0530 ms * 8192)
    # ~ 257 TFLOP/s (82% of one A100's bf16 peak; the TTFT profile reportedly used 4x A100).
    # Decode: ~6.5B weights x 2 B / (0.7 x 1.555 TB/s) ~ 12 ms per token on one A100.
    f8k = MODELS["marconi-7b"].flops(8192)
    tflops = f8k / (JAMBA_TTFT_SLOPE_MS * 8192 * 1e-3) / 1e12
    return TimingModel(
        round(tflops, 1),
        JAMBA_TTFT_INTERCEPT_MS,
        12.0,
        source="calibrated to the paper's Jamba-1.5-Mini TTFT fit at 8K (A100)",
        device="a100-40gb",
    )


#: the GPU of the paper's measurements (its A100 fit of ``marconi-7b`` / ``llama-7b``)
PAPER_GPU = "a100-40gb"


def default_timing(name: str, gpu: str | None = None, tensor_parallel: int = 0):
    """The timing of model ``name`` (a preset or a config.json path).

    With neither ``gpu`` nor ``tensor_parallel`` it is what it always was: the paper's A100 fit for
    ``marconi-7b`` / ``llama-7b``, the committed H200 calibration on the preset's GPU count (ideal
    scaling) for the others. ``gpu`` (a ``sim.gpus`` name) and ``tensor_parallel`` N >= 1 price
    that device and group: the calibration of the device where one exists, else the calibrated
    model scaled by the datasheet (``uncalibrated`` set, ``device`` named), compute divided by N,
    plus one all-reduce of the activations after every block (docs/cost-model.md §5). The 7B
    presets keep the paper's fit on ``PAPER_GPU`` (and with ``tensor_parallel`` alone), carried
    to N GPUs; on any other GPU they are priced as the other presets."""
    if gpu is None and not tensor_parallel:
        return _preset_timing(name)
    spec = get_model(name)
    tp = int(tensor_parallel) or gpu_count(spec, gpu)
    # the paper's A100 fit prices the 7B presets on the paper's GPU (and where no GPU is named); a
    # GPU named otherwise gets the calibrated hardware model as every other preset does: replayed
    # on an H100 (session 24), marconi-7b's prefills were 5-6 % (median) from it and 24-1,200 %
    # from the paper's fit carried there by the datasheets
    seven = spec.name in ("marconi-7b", "llama-7b") and (gpu is None or get_gpu(gpu).name == PAPER_GPU)
    home = PAPER_GPU if seven else "h200"
    dev = get_gpu(gpu or home)
    own = None if seven else calibrated_file(dev.name)
    if own is not None:  # a calibration of this very device (sim/data/<gpu>-timing.json)
        home, base = dev.name, own
    else:
        base = _marconi_7b_timing() if seven else calibrated_file(home)
    if base is None:  # no calibrated file: the estimate, on one GPU of the home device
        base = _preset_timing(name, gpus=1)
    calibrated = dev.name == home
    if not calibrated:
        base = scale_timing(base, get_gpu(home), dev)
    note = (
        "" if calibrated else f"; uncalibrated for GPU {dev.name}: scaled from {home} by the datasheet ({dev.source})"
    )
    return split_timing(base, spec, dev, tp, note, uncalibrated=not calibrated)


def split_timing(base, spec: ModelSpec, dev, tp: int, note: str = "", uncalibrated: bool = False):
    """``base`` (the timing of one GPU ``dev``) on a tensor-parallel group of ``tp`` of them:
    compute and decode divided by ``tp``, plus one all-reduce of the activations after every block
    (docs/cost-model.md §5)."""
    # one all-reduce of the token's activations (bf16) after each block of attention, linear
    # attention, Mamba and MLP
    blocks = spec.n_attn + spec.n_gdn + spec.n_mamba + spec.n_mlp
    per_token = allreduce_s(dev, spec.d_model * 2, tp) - (ALLREDUCE_LATENCY_S if tp > 1 else 0.0)
    comm_tok = blocks * per_token * 1e3
    comm_call = blocks * ALLREDUCE_LATENCY_S * 1e3 if tp > 1 else 0.0
    nodes = node_words(dev, tp)
    what = f"{tp}x {dev.name}" + (
        f", {blocks} all-reduces a call over {group_link_bytes_per_s(dev, tp) / 1e9:g} GB/s links"
        + (
            f" ({nodes})"
            if nodes
            else f" (PCIe: {tp} GPUs span {dev.name}'s NVLink bridges of {dev.bridge_group})"
            if dev.bridge_group and tp > dev.bridge_group
            else ""
        )
        if tp > 1
        else ""
    )
    extra = dict(comm_ms_per_token=comm_tok, comm_ms_per_call=comm_call, device=dev.name, uncalibrated=uncalibrated)
    if isinstance(base, HardwareTiming):
        return replace(
            base,
            gpus=tp,
            decode_ms_per_token=base.decode_ms_per_token / tp,
            source=f"{base.source}; {what}{note}",
            **extra,
        )
    return replace(
        base,
        effective_tflops=base.effective_tflops * tp,
        decode_ms_per_token=base.decode_ms_per_token / tp,
        source=f"{base.source}; {what}{note}",
        **extra,
    )


def scale_timing(timing, home, dev):
    """A timing measured (or fitted) on GPU ``home`` carried to ``dev`` by the datasheets: compute
    terms at the same fraction of the peak; the per-layer call time, decode and every per-GB term
    (the weights read, the activations written, the keys and values read) at the ratio of memory
    bandwidths; the host's launch floors and per-call times unchanged."""
    flop, bw = home.bf16_tflops / dev.bf16_tflops, home.hbm_bytes_per_s / dev.hbm_bytes_per_s
    if isinstance(timing, HardwareTiming):
        return replace(
            timing,
            ms_per_tflop={k: v * flop for k, v in timing.ms_per_tflop.items()},
            layer_call_ms={k: v * bw for k, v in timing.layer_call_ms.items()},
            # per GB moved: a slower memory reads the same bytes slower (session 27: the weights
            # read stayed at the home GPU's rate, faster than an A100's or L40S's memory delivers)
            ms_per_weight_gb={k: v * bw for k, v in timing.ms_per_weight_gb.items()},
            ms_per_act_gb={k: v * bw for k, v in timing.ms_per_act_gb.items()},
            ms_per_kv_gb=timing.ms_per_kv_gb * bw,
            decode_ms_per_token=timing.decode_ms_per_token * bw,
            peak_tflops=dev.bf16_tflops,
        )
    return replace(
        timing, effective_tflops=timing.effective_tflops / flop, decode_ms_per_token=timing.decode_ms_per_token * bw
    )


def gpu_memory_limit(model: str, gpu: str, tensor_parallel: int = 0) -> tuple[int, int]:
    """The GPUs of ``model``'s group on ``gpu`` (``tensor_parallel``, or the preset's count when 0)
    and the memory they hold together, in bytes: what a --gpu-memory on that group can be at most."""
    n = int(tensor_parallel) or gpu_count(get_model(model), gpu)
    return n, n * get_gpu(gpu).memory_bytes


#: the share of one server's memory the weights of a model may fill before its default group
#: (``gpu_count``) spans servers: below SGLang's --mem-fraction-static 0.88, the smallest fraction
#: of the whole memory an engine preset takes (vLLM: 0.9; LMDeploy, TensorRT-LLM: of what the
#: weights leave), so every engine keeps a cache
NODE_WEIGHT_SHARE = 0.88


def gpu_count(spec: ModelSpec, gpu: str | None = None) -> int:
    """The preset's GPU count (``_GPUS``), or for a model with a known weight count the smallest
    power-of-two group whose memory holds its weights in 3/4 of it (the rest for cache) and whose
    GPUs split its heads (``group_spec``), else the smallest such group of any size; where that
    group spans servers (more than ``node_gpus``), the smallest group of one server that holds the
    weights in ``NODE_WEIGHT_SHARE`` of its memory and splits the heads, if one does."""
    if spec.name in ("marconi-7b", "llama-7b"):
        return 1
    g = _GPUS.get(spec.name)
    if g is not None:
        return g
    if spec.total_params <= 0:
        raise UsageError(
            f"model {spec.name!r} has no GPU count for its default timing (sim/cost.py _GPUS); "
            f"give a timing file: --timing FILE, or --tensor-parallel N"
        )
    dev = get_gpu(gpu or "h200")
    mem = dev.memory_bytes
    need = spec.weight_bytes or spec.total_params * 2

    def serves(n: int, share: float = 0.75) -> bool:  # holds the weights in 3/4 of its memory, splits the heads
        if need > share * mem * n:
            return False
        try:
            group_spec(spec, n)
        except UsageError:
            return False
        return True

    # the smallest power-of-two group that serves it (an 8-GPU group of a 12-head model was priced),
    # else the smallest group of any size that does, else (no group splits it) the power of two
    n = next((k for k in (1, 2, 4, 8, 16, 32, 64) if serves(k)), 0) or next((k for k in range(1, 65) if serves(k)), 0)
    if n > dev.node_gpus:
        # a group beyond one server all-reduces over the network (sim.gpus.group_link_bytes_per_s): one
        # server's group that holds the weights with a cache left under every engine's memory fraction
        # is served instead (550GB on H100s: 8, not 16 across two servers)
        n = next((k for k in range(1, dev.node_gpus + 1) if serves(k, NODE_WEIGHT_SHARE)), n)
    if n:
        return n
    n = 1
    while need > 0.75 * mem * n and n < 64:
        n *= 2
    return n


def _preset_timing(name: str, gpus: int = 0):
    spec = get_model(name)
    if spec.name in ("marconi-7b", "llama-7b"):
        # llama-7b shares the paper's A100 calibration so 7B comparisons are like for like
        return _marconi_7b_timing()
    g = gpus or gpu_count(spec)
    calibrated = _h200_calibrated()
    if calibrated is not None:
        # the H200 terms, fitted on qwen3.5-9b shapes, priced per FLOP and per layer call, so
        # they carry over to the other Qwen3.5 / Qwen3-Next presets (MoE at its active width)
        return calibrated.with_gpus(
            g, f"{calibrated.source}; {g}x H200 (ideal tensor parallel)" if g > 1 else calibrated.source
        )
    tflops = g * _H200[0] * _MFU
    # batch-1 decode reads the active weights (incl. LM head) once per token
    decode_ms = spec.active_params() * 2 / (g * _H200[1] * _BW_EFF) * 1e3
    return TimingModel(
        round(tflops, 1),
        10.0,
        round(decode_ms, 2),
        source=f"estimate: {g}x H200 at {_MFU:.0%} of 989 TFLOP/s; decode = active bf16 "
        f"weights / {_BW_EFF:.0%} of 4.8 TB/s per GPU; 10 ms fixed overhead",
    )


def group_spec(spec: ModelSpec, tp: int) -> ModelSpec:
    """The model as ``tp`` GPUs hold it under tensor parallelism, bytes and FLOPs summed over the
    group: heads, Mamba channels and each expert's width split evenly (so those totals do not change), KV heads
    fewer than ``tp`` replicated (each GPU keeps one), as is a single Mamba B/C group (vLLM's and
    SGLang's sharding; several groups must split evenly). A head or group count ``tp`` does not
    divide is one UsageError line."""
    if tp <= 1:
        return spec
    name = spec.name

    def split(n: int, what: str) -> None:
        if n and tp > n:  # more GPUs than heads: some GPU would hold none
            raise UsageError(
                f"--tensor-parallel {tp} is more GPUs than the {n} {what} of {name} (each GPU holds a whole "
                f"share of them): give a divisor of {n}"
            )
        if n and n % tp:
            raise UsageError(f"--tensor-parallel {tp} does not divide the {n} {what} of {name}")

    split(spec.attn_heads, "attention heads")
    split(spec.gdn_k_heads, "gated-delta key heads")
    split(spec.gdn_v_heads, "gated-delta value heads")
    split(spec.mamba_heads, "Mamba heads")
    split(spec.mamba_d_inner, "Mamba channels")

    def replicated(n: int, what: str) -> int:
        if n == 0 or n % tp == 0:
            return n
        if tp % n:
            raise UsageError(f"--tensor-parallel {tp} neither divides nor is a multiple of the {n} {what} of {name}")
        return tp  # one per GPU

    groups = spec.mamba_n_groups
    if spec.n_mamba and groups > 1 and groups % tp:
        # MambaMixer2 (vLLM, and SGLang's port of it) asserts "n_groups % tp_size == 0 or
        # n_groups == 1": a single group is replicated on every GPU, several are split, never both
        raise UsageError(
            f"--tensor-parallel {tp} does not divide the {groups} Mamba groups of {name} (vLLM and SGLang "
            f"replicate a single group only): give a divisor of {groups}"
        )
    return replace(
        spec,
        attn_kv_heads=replicated(spec.attn_kv_heads, "KV heads"),
        mamba_n_groups=replicated(groups, "Mamba groups") if spec.n_mamba else groups,
    )


def model_for(config) -> ModelSpec:
    """The spec a run of ``config`` (a SimConfig) simulates: its model, as its tensor-parallel
    group holds it when ``--tensor-parallel`` is given."""
    return group_spec(get_model(config.model), int(getattr(config, "tensor_parallel", 0) or 0))


def timing_for(config):
    """The default timing of a run of ``config`` (its model, ``--gpu``, ``--tensor-parallel``)."""
    return default_timing(config.model, getattr(config, "gpu", None), int(getattr(config, "tensor_parallel", 0) or 0))


def timing_note(timing) -> str:
    """What every output's header says of a timing scaled from another device ("" when calibrated)."""
    return f"uncalibrated for GPU {timing.device}" if getattr(timing, "uncalibrated", False) else ""


H200_TIMING_FILE = Path(__file__).parent / "data" / "h200-timing.json"  # provenance inside
TIMING_FORMAT = "marconi-timing/1"  # one rate + a per-prefill overhead (TimingModel)
HARDWARE_FORMAT = "marconi-timing/2"  # HardwareTiming's terms


def calibrated_file(device: str):
    """The committed calibration of catalogue GPU ``device`` (``sim/data/<device>-timing.json``),
    or None."""
    path = Path(__file__).parent / "data" / f"{device}-timing.json"
    if not path.is_file():
        return None
    t = read_timing_file(path)
    return replace(t, device=t.device or device)


def _h200_calibrated():
    """The committed calibrated H200 timing (None before one was committed)."""
    if not H200_TIMING_FILE.is_file():
        return None
    t = read_timing_file(H200_TIMING_FILE)
    return replace(t, device=t.device or "h200")


def timing_to_dict(timing) -> dict:
    if isinstance(timing, HardwareTiming):
        return dict(
            format=HARDWARE_FORMAT,
            ms_per_tflop=dict(timing.ms_per_tflop),
            layer_call_ms=dict(timing.layer_call_ms),
            layer_floor_ms=dict(timing.layer_floor_ms),
            seq_ms=dict(timing.seq_ms),
            call_ms=timing.call_ms,
            decode_ms_per_token=timing.decode_ms_per_token,
            peak_tflops=timing.peak_tflops,
            gpus=timing.gpus,
            source=timing.source,
            **({"device": timing.device} if timing.device else {}),
            **(
                {
                    "ms_per_weight_gb": dict(timing.ms_per_weight_gb),
                    "ms_per_act_gb": dict(timing.ms_per_act_gb),
                    "ms_per_kv_gb": timing.ms_per_kv_gb,
                }
                if any(timing.ms_per_weight_gb.values()) or any(timing.ms_per_act_gb.values()) or timing.ms_per_kv_gb
                else {}
            ),
            **({"dtype": timing.dtype} if timing.dtype else {}),
            **({"attention": timing.attention} if timing.attention != "sdpa" else {}),
            **({"elementwise": timing.elementwise} if timing.elementwise != "torch" else {}),
            **({"covers": dict(timing.covers)} if timing.covers else {}),
            **(
                {"host_ms_per_call": timing.host_ms_per_call, "host_ms_per_layer": timing.host_ms_per_layer}
                if timing.has_host_term
                else {}
            ),
            **({"gdn_resume_ms_per_chunk": timing.gdn_resume_ms_per_chunk} if timing.gdn_resume_ms_per_chunk else {}),
            **({"layer_form": timing.layer_form} if timing.layer_form != "additive" else {}),
            **({"kv_query_heads": True} if timing.kv_query_heads else {}),
        )
    return dict(
        format=TIMING_FORMAT,
        effective_tflops=timing.effective_tflops,
        overhead_ms=timing.overhead_ms,
        decode_ms_per_token=timing.decode_ms_per_token,
        source=timing.source,
        **({"device": timing.device} if timing.device else {}),
    )


def _check_finite(d: dict, path) -> None:
    """Refuse NaN, Infinity, "nan", a zero or negative throughput and negative times in a timing
    file before anything runs (one line each, naming the field)."""
    rules = [
        ("effective_tflops", True),
        ("overhead_ms", False),
        ("decode_ms_per_token", False),
        ("call_ms", False),
        ("ms_per_kv_gb", False),
        ("host_ms_per_call", False),
        ("host_ms_per_layer", False),
        ("gdn_resume_ms_per_chunk", False),
    ]
    for key, positive in rules:
        if key not in d:
            continue
        v = d[key]
        try:
            x = float(v) if not isinstance(v, bool) else math.nan
        except (TypeError, ValueError):
            x = math.nan
        ok = 0 < x < math.inf if positive else 0 <= x < math.inf
        if not ok:
            need = "a finite number > 0" if positive else "a finite number >= 0"
            raise UsageError(f"timing file {path}: {key} must be {need}, not {v!r}")
    for group in ("ms_per_tflop", "layer_call_ms", "layer_floor_ms", "seq_ms", "ms_per_weight_gb", "ms_per_act_gb"):
        for k, v in (d.get(group) or {}).items() if isinstance(d.get(group), dict) else ():
            try:
                x = float(v) if not isinstance(v, bool) else math.nan
            except (TypeError, ValueError):
                x = math.nan
            if not 0 <= x < math.inf:
                raise UsageError(f"timing file {path}: {group}.{k} must be a finite number >= 0, not {v!r}")


def same_model(recorded, given) -> bool:
    """Whether the ``--model`` value ``given`` names the model a timing file records (``recorded``:
    the name its model had when it was fitted). A preset by its name (in any case). A model read
    from a config.json (its name is its path as the user spelled it: ``DIR/config.json``, ``DIR``,
    ``./DIR/``, an absolute path) by what is read there: the two config files read as the same
    model (``ModelSpec``, its name and source aside: the same file in any spelling, or a copy). A
    recorded path that reads no config now (moved, removed) matches only its own spelling; a
    relative one is read from the current folder (``read_timing_file`` then compares the shapes a
    newer file records, ``model_spec``). A preset never matches a config."""
    if recorded == given:
        return True
    a, b = str(recorded).strip().lower(), str(given).strip().lower()
    if a in MODELS or b in MODELS:
        return a == b
    try:
        ra, rb = get_model(str(recorded)), get_model(str(given))
    except UsageError:  # not a preset and no config read there (moved, removed, not a path)
        return False
    return replace(ra, name="", source="") == replace(rb, name="", source="")  # both say where it was read


def spec_fields(spec: ModelSpec) -> dict:
    """What identifies a model's shapes and bytes (``ModelSpec``'s compared fields, its name and
    source aside): a timing file fitted on a model read from a config.json records them
    (``model_spec``), so the file goes with that model however its path is spelled later, from
    another folder, or after the config moved (``read_timing_file``)."""
    return {
        f.name: getattr(spec, f.name) for f in fields(spec) if f.init and f.compare and f.name not in ("name", "source")
    }


def _same_spec(recorded, given) -> bool:
    """The ``model_spec`` a timing file records (``spec_fields``) is the model ``given`` reads as."""
    if not isinstance(recorded, dict) or str(given).strip().lower() in MODELS:
        return False
    try:
        spec = get_model(str(given))
    except UsageError:
        return False
    return spec_fields(spec) == recorded


def _flag(v) -> bool:
    """A timing file's true / false field (a string or a number is a bad field)."""
    if not isinstance(v, bool):
        raise ValueError(v)
    return v


def read_timing_file(path, model: str | None = None):
    """A timing file written by ``marconi replay --calibrate`` (bad input, or a file fitted for
    another model than ``model``: UsageError). A hardware-term file's terms are priced per FLOP
    and per layer call, so ``default_timing`` carries the committed H200 file to every Qwen
    preset; a user's file is held to the model it was fitted on."""
    try:
        d = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read timing file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"timing file {path} is not JSON: {exc}") from None
    fmt = d.get("format") if isinstance(d, dict) else None
    if fmt not in (TIMING_FORMAT, HARDWARE_FORMAT):
        raise UsageError(
            f"timing file {path} is not a {TIMING_FORMAT} or {HARDWARE_FORMAT} file "
            "(write one with marconi replay --calibrate FILE)"
        )
    if (
        model is not None
        and d.get("model") is not None
        and not same_model(d["model"], model)
        and not _same_spec(d.get("model_spec"), model)  # the recorded path spelled from another folder, moved
    ):
        raise UsageError(f"timing file {path} was calibrated for {d.get('model')}, not {model}")
    _check_finite(d, path)
    missing = object()

    def get(key: str, conv, default=missing):
        """Field ``key`` through ``conv`` (``terms``: a dict of numbers by layer kind); a field
        missing or of the wrong kind is one line naming it."""
        v = d.get(key, default)
        if v is missing:
            raise UsageError(f"timing file {path}: missing field {key!r}")
        try:
            return conv(v)
        except (TypeError, ValueError, AttributeError):
            raise UsageError(f"timing file {path}: bad field {key!r}: {v!r}") from None

    def terms(v) -> dict:
        return {str(k): float(x) for k, x in v.items()}

    def count(v) -> int:  # a whole number of GPUs, >= 1 (2.5 was read as 2, 0 as "a negative term")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 1:
            raise ValueError(v)
        return int(v)

    zeros = dict.fromkeys(LAYER_KINDS, 0.0)
    try:
        if fmt == HARDWARE_FORMAT:
            return HardwareTiming(
                get("ms_per_tflop", terms),
                get("layer_call_ms", terms),
                get("call_ms", float),
                get("decode_ms_per_token", float),
                get("peak_tflops", float, 0.0),
                get("gpus", count, 1),
                source=str(d.get("source", path)),
                layer_floor_ms=get("layer_floor_ms", terms, zeros),
                seq_ms=get("seq_ms", terms, zeros),
                device=str(d.get("device") or ""),
                ms_per_weight_gb=get("ms_per_weight_gb", terms, zeros),
                ms_per_act_gb=get("ms_per_act_gb", terms, zeros),
                ms_per_kv_gb=get("ms_per_kv_gb", float, 0.0),
                dtype=str(d.get("dtype") or ""),
                attention=str(d.get("attention") or "sdpa"),
                elementwise=str(d.get("elementwise") or "torch"),
                covers=get("covers", lambda v: dict(v or {}), {}),
                host_ms_per_call=get("host_ms_per_call", float, 0.0),
                host_ms_per_layer=get("host_ms_per_layer", float, 0.0),
                gdn_resume_ms_per_chunk=get("gdn_resume_ms_per_chunk", float, 0.0),
                layer_form=get("layer_form", str, "additive"),
                kv_query_heads=get("kv_query_heads", _flag, False),
            )
        return TimingModel(
            get("effective_tflops", float),
            get("overhead_ms", float),
            get("decode_ms_per_token", float),
            source=str(d.get("source", path)),
            device=str(d.get("device") or ""),
        )
    except UsageError as exc:  # the timing's own checks ("timing: terms must be ..."): name the file
        text = str(exc)
        if not text.startswith("timing: "):
            raise
        raise UsageError(f"timing file {path}: {text.removeprefix('timing: ')}") from None
