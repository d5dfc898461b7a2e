"""Row-wise fused ops around a replayed layer's products: its RMS norms, its output gate and its
MLP activation, one kernel each where torch runs two to six passes over the activations.

At a small hidden size a token's products are few for the bytes its activations move
(Qwen3-Next-80B-A3B: hidden 2,048, a gated-delta value width of 4,096), so these passes are a
large share of a prefill: the gated-delta output gate alone reads and writes about 46 bytes an
element in torch (a cast, the norm, a cast, the SiLU, the product, a cast) against 6 here.

- ``rms_norm_cast(x, weight=None)``: ``rms_norm(x) * weight`` over the last dim of ``x [R, D]``,
  cast once to ``out_dtype`` (a sublayer's input norm of the fp32 residual stream);
- ``gated_rms_norm(o, z, weight)``: ``rms_norm(o) * weight * silu(z)`` per head of ``o [R, G, V]``
  with ``z [R, G * V]`` (the gated-delta layer's output gate), cast once;
- ``silu_mul(gu, inter)``: ``silu(gu[:, :inter]) * gu[:, inter:]`` (the SwiGLU activation);
- ``qk_norm_rope(x, weight, cos, sin)``: per head of ``x [R, H, hd]``, ``rms_norm * weight``, then
  the rotate-half rotary embedding on its first ``2 * cos.shape[-1]`` dims (attention's q / k).

Each computes in fp32 and rounds once; a row's result depends on that row alone (one program per
row or per row and head block), so a batch of sequences gets the rows each sequence gets alone.
Inputs may be strided views (a row stride, unit stride in the last dim); outputs are new,
contiguous tensors. ``tests/kernels/test_norms.py`` checks each against the torch ops it replaces.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

__all__ = ["gated_rms_norm", "qk_norm_rope", "rms_norm_cast", "silu_mul", "EPS"]

#: the replayed models' norm epsilon
EPS = 1e-6
#: heads of ``gated_rms_norm`` / ``qk_norm_rope`` per program, at most (a tile of heads x head dim)
HEAD_BLOCK_ELEMENTS = 2048
#: columns of ``silu_mul`` per program
SILU_BLOCK = 1024


def _warps(elements: int) -> int:
    return 8 if elements >= 4096 else 4 if elements >= 1024 else 2


@triton.jit
def _rms_cast_kernel(x, w, y, sx, D, eps, BD: tl.constexpr, HAS_W: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    m = d < D
    v = tl.load(x + r * sx + d, mask=m, other=0.0).to(tl.float32)
    v = v * tl.rsqrt(tl.sum(v * v, axis=0) / D + eps)
    if HAS_W:
        v = v * tl.load(w + d, mask=m, other=0.0).to(tl.float32)
    tl.store(y + r * D + d, v.to(y.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_kernel(o, z, w, y, so, sz, G, eps, V: tl.constexpr, BG: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BG + tl.arange(0, BG)
    v = tl.arange(0, V)
    m = (g < G)[:, None]
    off = g[:, None] * V + v[None, :]
    ov = tl.load(o + r * so + off, mask=m, other=0.0).to(tl.float32)
    zv = tl.load(z + r * sz + off, mask=m, other=0.0).to(tl.float32)
    wv = tl.load(w + v).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(ov * ov, axis=1) / V + eps)
    out = ov * rstd[:, None] * wv[None, :] * (zv * tl.sigmoid(zv))
    tl.store(y + r * G * V + off, out.to(y.dtype.element_ty), mask=m)


@triton.jit
def _silu_mul_kernel(gu, y, sg, INTER, BI: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    m = i < INTER
    g = tl.load(gu + r * sg + i, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu + r * sg + INTER + i, mask=m, other=0.0).to(tl.float32)
    tl.store(y + r * INTER + i, (g * tl.sigmoid(g) * u).to(y.dtype.element_ty), mask=m)


@triton.jit
def _qk_norm_rope_kernel(
    x, w, cos, sin, y, sxr, sxh, scr, H, eps, HD: tl.constexpr, HALF: tl.constexpr, BH: tl.constexpr
):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    m = (h < H)[:, None]
    j = tl.arange(0, HD)
    rot = j < 2 * HALF
    # rotate-half: dim j < HALF pairs with j + HALF (x1 cos - x2 sin), HALF <= j < 2 HALF with
    # j - HALF (x2 cos + x1 sin); the dims past 2 HALF pass through (cos 1, sin 0)
    partner = tl.where(j < HALF, j + HALF, tl.where(rot, j - HALF, j))
    base = x + r * sxr + h[:, None].to(tl.int64) * sxh
    xv = tl.load(base + j[None, :], mask=m, other=0.0).to(tl.float32)
    xp = tl.load(base + partner[None, :], mask=m, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xv * xv, axis=1) / HD + eps)[:, None]
    a = xv * rstd * tl.load(w + j).to(tl.float32)[None, :]
    b = xp * rstd * tl.load(w + partner).to(tl.float32)[None, :]
    c = tl.load(cos + r * scr + j % HALF, mask=rot, other=1.0)
    s = tl.load(sin + r * scr + j % HALF, mask=rot, other=0.0)
    s = tl.where(j < HALF, -s, s)
    out = a * c[None, :] + b * s[None, :]
    tl.store(y + (r * H + h[:, None]) * HD + j[None, :], out.to(y.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a unit stride in its last dim (a copy only where it has none)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def rms_norm_cast(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, *, eps: float = EPS, out_dtype=None
) -> torch.Tensor:
    """``F.rms_norm(x, (D,), weight, eps).to(out_dtype)`` of ``x [R, D]`` in one pass (fp32
    inside, one rounding). ``out_dtype``: None keeps ``x``'s."""
    if x.dim() != 2:
        raise ValueError(f"x must be [R, D], not {tuple(x.shape)}")
    R, D = x.shape
    if weight is not None and weight.shape != (D,):
        raise ValueError(f"weight must be [{D}], not {tuple(weight.shape)}")
    x = _rows(x)
    y = torch.empty(R, D, dtype=out_dtype or x.dtype, device=x.device)
    if R:
        BD = triton.next_power_of_2(D)
        _rms_cast_kernel[(R,)](
            x,
            weight.contiguous() if weight is not None else x,
            y,
            x.stride(0),
            D,
            eps,
            BD=BD,
            HAS_W=weight is not None,
            num_warps=_warps(BD),
        )
    return y


def gated_rms_norm(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, *, eps: float = EPS, out_dtype=None
) -> torch.Tensor:
    """``(F.rms_norm(o.float(), (V,), weight, eps) * F.silu(z.float())).to(out_dtype)`` for ``o
    [R, G, V]`` and ``z [R, G * V]`` (or ``[R, G, V]``), returned as ``[R, G * V]``. ``V`` must be
    a power of two. ``out_dtype``: None keeps ``o``'s."""
    if o.dim() != 3:
        raise ValueError(f"o must be [R, G, V], not {tuple(o.shape)}")
    R, G, V = o.shape
    if V & (V - 1):
        raise ValueError(f"the head size must be a power of two, not {V}")
    if z.shape not in ((R, G * V), (R, G, V)) or weight.shape != (V,):
        raise ValueError(f"z must be [{R}, {G * V}] and weight [{V}]")
    o = _rows(o.reshape(R, G * V))
    z = _rows(z.reshape(R, G * V))
    y = torch.empty(R, G * V, dtype=out_dtype or o.dtype, device=o.device)
    if R:
        BG = max(1, min(triton.next_power_of_2(G), HEAD_BLOCK_ELEMENTS // V))
        _gated_rms_kernel[(R, triton.cdiv(G, BG))](
            o, z, weight.contiguous(), y, o.stride(0), z.stride(0), G, eps, V=V, BG=BG, num_warps=_warps(BG * V)
        )
    return y


def silu_mul(gu: torch.Tensor, inter: int) -> torch.Tensor:
    """``F.silu(gu[:, :inter]) * gu[:, inter:]`` of ``gu [R, 2 * inter]`` (fp32 inside, one
    rounding): ``[R, inter]`` in ``gu``'s dtype."""
    if gu.dim() != 2 or gu.shape[1] != 2 * inter or inter < 1:
        raise ValueError(f"gu must be [R, 2 * {inter}], not {tuple(gu.shape)}")
    gu = _rows(gu)
    R = gu.shape[0]
    y = torch.empty(R, inter, dtype=gu.dtype, device=gu.device)
    if R:
        BI = min(SILU_BLOCK, triton.next_power_of_2(inter))
        _silu_mul_kernel[(R, triton.cdiv(inter, BI))](gu, y, gu.stride(0), inter, BI=BI, num_warps=_warps(BI))
    return y


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    eps: float = EPS,
    out_dtype=None,
) -> torch.Tensor:
    """Per head of ``x [R, H, hd]`` (a strided view: rows and heads any stride, unit stride in
    ``hd``): ``F.rms_norm(x.float(), (hd,), weight, eps)``, then the rotate-half rotary
    embedding at ``cos`` / ``sin`` (``[R, half]`` or ``[R, 1, half]`` fp32, one row per row of
    ``x``) on its first ``2 * half`` dims; ``[R, H, hd]`` contiguous in ``out_dtype`` (None:
    ``x``'s). ``hd`` and ``half`` must be powers of two."""
    if x.dim() != 3:
        raise ValueError(f"x must be [R, H, hd], not {tuple(x.shape)}")
    R, H, hd = x.shape
    cos2, sin2 = cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1)
    half = cos2.shape[1]
    if hd & (hd - 1) or half & (half - 1) or 2 * half > hd:
        raise ValueError(
            f"the head size ({hd}) and half the rotary width ({half}) must be powers of two, 2 x half <= hd"
        )
    if cos2.shape != (R, half) or sin2.shape != (R, half) or weight.shape != (hd,):
        raise ValueError(f"cos and sin must be [{R}, {half}] and weight [{hd}]")
    if cos2.dtype != torch.float32 or sin2.dtype != torch.float32:
        raise ValueError("cos and sin must be fp32")
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    y = torch.empty(R, H, hd, dtype=out_dtype or x.dtype, device=x.device)
    if R:
        BH = max(1, min(triton.next_power_of_2(H), HEAD_BLOCK_ELEMENTS // hd))
        _qk_norm_rope_kernel[(R, triton.cdiv(H, BH))](
            x,
            weight.contiguous(),
            cos2,
            sin2,
            y,
            x.stride(0),
            x.stride(1),
            half,
            H,
            eps,
            HD=hd,
            HALF=half,
            BH=BH,
            num_warps=_warps(BH * hd),
        )
    return y
