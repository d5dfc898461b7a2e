"""Executed FLOPs of replayed gated-delta layers (plain arithmetic, no torch).

Same conventions as ``sim.cost`` (2 FLOPs per multiply-add; gated-delta core per token per value
head ``6*dk*dv + C*(5.25*dk + 4*dv)``, docs/cost-model.md §2), but counted over what the kernel actually
computes: every chunk it touches is a full 64-token block of work, so the padding of ragged
chunks (a call starting or ending off a 64-multiple, e.g. exact-alignment splits) is included.
"""

from __future__ import annotations

from dataclasses import replace

from sim.cost import GDN_CHUNK


def chunks_of(start: int, end: int, chunk: int = GDN_CHUNK) -> int:
    """Chunks of a call over absolute positions ``[start, end)`` (chunks are absolute-aligned)."""
    if end <= start:
        return 0
    return (end - 1) // chunk - start // chunk + 1


def layer_flops(spec, tokens: int, chunks: int) -> float:
    """FLOPs of one gated-delta layer of ``spec``'s shapes over ``tokens`` tokens in ``chunks``
    kernel chunks: projections and conv per token, the chunked core per chunk."""
    D = spec.d_model
    Hk, Hv, dk, dv = spec.gdn_k_heads, spec.gdn_v_heads, spec.gdn_head_k_dim, spec.gdn_head_v_dim
    conv_dim = 2 * Hk * dk + Hv * dv
    params = D * (2 * Hk * dk + 2 * Hv * dv) + D * 2 * Hv + Hv * dv * D
    per_token = 2.0 * params + 2.0 * conv_dim * spec.gdn_conv_width
    core_per_token = Hv * (6.0 * dk * dv + GDN_CHUNK * (5.25 * dk + 4.0 * dv))
    return per_token * tokens + core_per_token * GDN_CHUNK * chunks


def segments_flops(spec, segments, layers: int) -> float:
    """FLOPs of ``layers`` replayed layers over calls ``[(start, end), ...]``."""
    return layers * sum(layer_flops(spec, e - s, chunks_of(s, e)) for s, e in segments)


def mamba2_linear(spec) -> bool:
    """``spec``'s linear layers are Mamba2 layers (replayed in the gated-delta layers' slot:
    ``counts["gated_delta"]`` counts them)."""
    return bool(spec.n_mamba and not spec.n_gdn and spec.mamba_version == 2)


def replayed_flops(spec, counts, segments) -> float:
    """FLOPs of ``counts`` layers of each type (``{"attention", "gated_delta", "mlp"}``) over
    calls ``[(start, end), ...]``: attention projections and causal score/value products (each
    call's tokens attend to everything before them), gated-delta per token and per kernel chunk
    (ragged chunks whole), MLP per token. A Mamba2 model's linear layers (``mamba2_linear``) are
    priced per token as the cost model prices them."""
    total = 0.0
    mamba2 = mamba2_linear(spec)
    for s, e in segments:
        if e <= s:
            continue
        total += counts.get("attention", 0) * (spec.attn_layer_a * (e - s) + spec.attn_layer_b * (e * e - s * s))
        if mamba2:
            total += counts.get("gated_delta", 0) * spec.mamba_layer_a * (e - s)
        else:
            total += counts.get("gated_delta", 0) * (
                spec.gdn_layer_a * (e - s) + spec.gdn_chunk_flops * chunks_of(s, e)
            )
        total += counts.get("mlp", 0) * spec.mlp_layer_a * (e - s)
    return total


def padding_flops(spec, segments) -> float:
    """What the kernel's 64-token chunks add to ``model_flops`` over the cost model's per-token
    price of the same calls (``spec.prefill_flops``): the gated-delta core of every chunk's
    unfilled part, ``n_gdn * gdn_chunk_flops * (chunks - tokens / 64)`` summed over the calls (0
    for Mamba layers, which the cost model and replay both price per token). ``model_flops`` less
    this equals the cost model's FLOPs exactly."""
    if not spec.n_gdn:
        return 0.0
    ragged = sum(chunks_of(s, e) - (e - s) / GDN_CHUNK for s, e in segments if e > s)
    return spec.n_gdn * spec.gdn_chunk_flops * ragged


def model_flops(spec, segments, replayed_layers=None) -> float:
    """Executed FLOPs of the calls scaled to the whole model: every layer of the preset over the
    calls (gated-delta chunk padding included), plus Mamba layers analytically."""
    counts = {"attention": spec.n_attn, "gated_delta": spec.n_gdn, "mlp": spec.n_mlp}
    rest = sum(_non_gdn(spec, s, e) for s, e in segments) if spec.n_mamba else 0.0
    return replayed_flops(spec, counts, segments) + rest


def _non_gdn(spec, start: int, end: int) -> float:
    other = _NON_GDN.get(spec)
    if other is None:
        other = _NON_GDN[spec] = replace(spec, n_gdn=0, n_attn=0, n_mlp=0)
    return other.prefill_flops(start, end)


_NON_GDN: dict = {}
