"""The fused row-wise ops (``kernels.norms``) against the torch ops they replace in the replayed
model (``sim.replay.model``'s torch path, written out here as the oracle): the same formulas, fp32
inside. Their one rounding (torch rounds between its passes) makes bf16 results differ by at
most one bf16 ulp of the result (2^-8 relative); fp32 ones by summation order (~1e-6).

CPU tests run under TRITON_INTERPRET=1; ``-m gpu`` ones at the presets' shapes on a GPU."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.triton_compat  # `make test` runs this module on the newest Triton too

import torch.nn.functional as F  # noqa: E402
from gpu_env import HAS_CUDA  # noqa: E402

from kernels.norms import EPS, gated_rms_norm, qk_norm_rope, rms_norm_cast, silu_mul  # noqa: E402

#: bf16 ulp: the oracle rounds between passes, the kernel once
BF16 = dict(atol=1e-2, rtol=2**-7)
FP32 = dict(atol=1e-5, rtol=1e-5)


def tol(dtype):
    return FP32 if dtype == torch.float32 else BF16


def rnd(gen, *shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


# ---- the oracles: the model's torch path ----------------------------------------------------
def rope_oracle(x, cos, sin):
    half = cos.shape[-1]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half : 2 * half]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., 2 * half :]], dim=-1)


def qk_oracle(x, w, cos, sin, dtype):
    hd = x.shape[-1]
    n = F.rms_norm(x.float(), (hd,), weight=w, eps=EPS)
    return rope_oracle(n, cos[:, None, :], sin[:, None, :]).to(dtype)


def rope_tables(R, half, gen):
    pos = torch.randint(0, 100_000, (R,), generator=gen).float()
    inv = 1e7 ** (-torch.arange(half, dtype=torch.float32) / half)
    ang = pos[:, None] * inv[None]
    return ang.cos(), ang.sin()


# ---- rms_norm_cast ---------------------------------------------------------------------------
@pytest.mark.parametrize("R,D", [(1, 8), (5, 40), (3, 96), (7, 130)])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16])
def test_rms_norm_cast(R, D, out):
    gen = torch.Generator().manual_seed(R * 1000 + D)
    x = rnd(gen, R, D) * 3
    y = rms_norm_cast(x, out_dtype=out)
    assert y.dtype == out and y.shape == (R, D) and y.is_contiguous()
    torch.testing.assert_close(y.float(), F.rms_norm(x, (D,), eps=EPS).to(out).float(), **tol(out))
    w = rnd(gen, D)
    yw = rms_norm_cast(x, w, out_dtype=out)
    torch.testing.assert_close(yw.float(), F.rms_norm(x, (D,), weight=w, eps=EPS).to(out).float(), **tol(out))


def test_rms_norm_cast_strided_rows_and_eps():
    """A row-strided view reads only its rows; ``eps`` is the one given (an all-zero row is
    zero, a tiny row is scaled by 1 / sqrt(mean + eps), not by 1 / sqrt(mean))."""
    gen = torch.Generator().manual_seed(3)
    big = rnd(gen, 6, 50)
    x = big[:, 5:45]  # row stride 50
    torch.testing.assert_close(rms_norm_cast(x), F.rms_norm(x, (40,), eps=EPS), **FP32)
    tiny = torch.full((2, 16), 1e-4)
    tiny[1] = 0
    y = rms_norm_cast(tiny, eps=1e-2)
    torch.testing.assert_close(y[0], torch.full((16,), 1e-4 / (1e-8 + 1e-2) ** 0.5), **FP32)
    assert torch.equal(y[1], torch.zeros(16))


def test_rows_are_independent():
    """A row's result is the same bits computed alone or among others (batch invariance)."""
    gen = torch.Generator().manual_seed(4)
    x = rnd(gen, 9, 72)
    whole = rms_norm_cast(x, out_dtype=torch.bfloat16)
    for r in (0, 4, 8):
        assert torch.equal(rms_norm_cast(x[r : r + 1], out_dtype=torch.bfloat16), whole[r : r + 1])


def test_empty_and_bad_shapes():
    assert rms_norm_cast(torch.zeros(0, 8)).shape == (0, 8)
    assert silu_mul(torch.zeros(0, 8), 4).shape == (0, 4)
    with pytest.raises(ValueError, match=r"\[R, D\]"):
        rms_norm_cast(torch.zeros(8))
    with pytest.raises(ValueError, match="weight"):
        rms_norm_cast(torch.zeros(2, 8), torch.ones(4))
    with pytest.raises(ValueError, match="power of two"):
        gated_rms_norm(torch.zeros(2, 3, 12), torch.zeros(2, 36), torch.ones(12))
    with pytest.raises(ValueError, match="2 \\* 4"):
        silu_mul(torch.zeros(2, 9), 4)
    with pytest.raises(ValueError, match="powers of two"):
        qk_norm_rope(torch.zeros(2, 1, 12), torch.ones(12), torch.zeros(2, 2), torch.zeros(2, 2))


# ---- gated_rms_norm --------------------------------------------------------------------------
@pytest.mark.parametrize("R,G,V", [(1, 1, 8), (4, 3, 16), (3, 8, 32), (2, 5, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm(R, G, V, dtype):
    """As the gated-delta layer calls it: ``o`` the kernel's ``[T, Hv, V]`` output, ``z`` a
    column slice of the input projection (row stride wider than ``G * V``)."""
    gen = torch.Generator().manual_seed(R * 100 + G * 10 + V)
    o = rnd(gen, R, G, V, dtype=dtype)
    proj = rnd(gen, R, 2 * G * V + 3, dtype=dtype) * 2
    z = proj[:, G * V + 1 : 2 * G * V + 1]
    w = rnd(gen, V).abs() + 0.5
    y = gated_rms_norm(o, z, w)
    ref = F.rms_norm(o.float(), (V,), weight=w, eps=EPS) * F.silu(z.float().view(R, G, V))
    assert y.shape == (R, G * V) and y.dtype == dtype
    torch.testing.assert_close(y.float(), ref.to(dtype).reshape(R, G * V).float(), **tol(dtype))


def test_gated_rms_norm_norms_each_head_alone():
    """The norm is per head: scaling one head's ``o`` leaves the other heads' outputs as they
    were, and that head's output unchanged too (a norm is scale-invariant)."""
    gen = torch.Generator().manual_seed(5)
    o, z, w = rnd(gen, 2, 4, 16), rnd(gen, 2, 64), torch.ones(16)
    y = gated_rms_norm(o, z, w)
    o2 = o.clone()
    o2[:, 1] *= 50
    torch.testing.assert_close(gated_rms_norm(o2, z, w), y, **FP32)
    o3 = o.clone()
    o3[:, 2] = o3[:, 3]
    y3 = gated_rms_norm(o3, z, w)
    assert not torch.allclose(y3[:, 32:48], y[:, 32:48])


# ---- silu_mul --------------------------------------------------------------------------------
@pytest.mark.parametrize("R,inter", [(1, 1), (3, 7), (4, 100), (2, 1500)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(R, inter, dtype):
    gen = torch.Generator().manual_seed(R + inter)
    gu = rnd(gen, R, 2 * inter, dtype=dtype) * 3
    y = silu_mul(gu, inter)
    ref = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    assert y.shape == (R, inter) and y.dtype == dtype
    torch.testing.assert_close(y.float(), ref.to(dtype).float(), **tol(dtype))


# ---- qk_norm_rope ----------------------------------------------------------------------------
@pytest.mark.parametrize("R,H,hd,half", [(1, 1, 4, 1), (3, 2, 16, 2), (4, 3, 32, 4), (2, 5, 64, 16), (2, 2, 16, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_rope(R, H, hd, half, dtype):
    """As attention calls it: q a head-strided slice of the query-and-gate projection (each
    head's ``2 hd`` columns, the query first), k the first of the key-value projection's pair."""
    gen = torch.Generator().manual_seed(R * 1000 + H * 100 + hd + half)
    qg = rnd(gen, R, H * 2 * hd, dtype=dtype) * 2
    q = qg.view(R, H, 2 * hd)[..., :hd]
    kvp = rnd(gen, R, 2, H, hd, dtype=dtype)
    k = kvp[:, 0]
    w = rnd(gen, hd).abs() + 0.5
    cos, sin = rope_tables(R, half, gen)
    for x in (q, k):
        y = qk_norm_rope(x, w, cos[:, None, :], sin[:, None, :])
        assert y.shape == (R, H, hd) and y.is_contiguous() and y.dtype == dtype
        torch.testing.assert_close(y.float(), qk_oracle(x, w, cos, sin, dtype).float(), **tol(dtype))


def test_qk_norm_rope_rotates_the_rotary_dims_only():
    """With cos 0 and sin 1 the first ``half`` dims become minus the next ``half`` (normed),
    those become the first, and the dims past ``2 half`` are the normed input unrotated."""
    x = torch.arange(1, 17, dtype=torch.float32).view(1, 1, 16)
    w = torch.ones(16)
    y = qk_norm_rope(x, w, torch.zeros(1, 4), torch.ones(1, 4))
    n = F.rms_norm(x, (16,), eps=EPS)[0, 0]
    torch.testing.assert_close(y[0, 0], torch.cat([-n[4:8], n[0:4], n[8:]]), **FP32)


# ---- GPU: the presets' shapes ----------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(
    "hidden,G,V,inter,H,KVH,hd", [(2048, 32, 128, 5632, 16, 2, 256), (4096, 32, 128, 12288, 16, 4, 256)]
)
def test_gpu_preset_shapes(hidden, G, V, inter, H, KVH, hd):
    """qwen3-next-80b-a3b's and qwen3.5-9b's widths, bf16, 3,000 rows: each op within one bf16
    ulp of the torch ops it replaces."""
    gen = torch.Generator().manual_seed(hidden)
    dev, bf = "cuda", torch.bfloat16
    R = 3000
    x = rnd(gen, R, hidden, device=dev) * 4
    torch.testing.assert_close(
        rms_norm_cast(x, out_dtype=bf).float(), F.rms_norm(x, (hidden,), eps=EPS).to(bf).float(), **BF16
    )
    o = rnd(gen, R, G, V, dtype=bf, device=dev)
    proj = rnd(gen, R, 3 * G * V, dtype=bf, device=dev)
    z, w = proj[:, G * V : 2 * G * V], torch.rand(V, generator=gen).to(dev) + 0.5
    ref = (F.rms_norm(o.float(), (V,), weight=w, eps=EPS) * F.silu(z.float().view(R, G, V))).to(bf)
    torch.testing.assert_close(gated_rms_norm(o, z, w).float(), ref.reshape(R, -1).float(), **BF16)
    gu = rnd(gen, R, 2 * inter, dtype=bf, device=dev)
    ref = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    torch.testing.assert_close(silu_mul(gu, inter).float(), ref.to(bf).float(), **BF16)
    qg = rnd(gen, R, H * 2 * hd, dtype=bf, device=dev)
    kvp = rnd(gen, R, 2, KVH, hd, dtype=bf, device=dev)
    wq = torch.rand(hd, generator=gen).to(dev) + 0.5
    cos, sin = (t.to(dev) for t in rope_tables(R, hd // 8, gen))
    for xh in (qg.view(R, H, 2 * hd)[..., :hd], kvp[:, 0]):
        y = qk_norm_rope(xh, wq, cos[:, None, :], sin[:, None, :])
        torch.testing.assert_close(y.float(), qk_oracle(xh, wq, cos, sin, bf).float(), **BF16)
