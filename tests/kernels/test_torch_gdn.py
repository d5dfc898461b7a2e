"""The plain-torch gated delta rule and causal conv1d (kernels/torch_gdn.py, what replay runs on a
CPU) against the per-token fp32 oracles of kernels/reference.py: ragged absolute starts, several
sequences, initial states, boundary states at every boundary and at an index list, K != V, GVA,
head dims that are not powers of two, the in-kernel gate; conv with a strided conv state; resuming
from every emitted boundary reproduces the rest of a from-scratch run. No triton is needed (one
test runs the module with triton unimportable).

Tolerance against the oracle: relative 1e-5 of the tensor's scale (both sides are fp32 evaluations
of one recurrence in different summation orders; observed ~1e-6). Boundary conv windows are
copies of inputs and must match exactly.
"""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from kernels._common import prepare_chunk_metadata  # noqa: E402
from kernels.reference import naive_causal_conv1d, naive_gated_delta_rule, naive_gdn_gate  # noqa: E402
from kernels.torch_gdn import causal_conv1d, chunk_gated_delta_rule  # noqa: E402

RTOL = 1e-5


def close(got, want, rtol=RTOL):
    """Relative to the reference's largest magnitude (entries near zero carry no relative meaning)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.numel() == 0:
        return
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()
    assert err < rtol, err


def inputs(T, H, HV, K, V, seed, *, B=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen)) * 0.5  # log decay < 0
    beta = torch.rand(B, T, HV, generator=gen)
    return q, k, v, g, beta


def state(N, HV, K, V, seed):
    return 0.1 * torch.randn(N, HV, K, V, generator=torch.Generator().manual_seed(seed))


def both(q, k, v, g, beta, **kw):
    """The torch implementation and the oracle on the same arguments (l2norm on)."""
    meta = kw.pop("chunk_metadata", None)
    got = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, **kw)
    want = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, **kw)
    return got, want


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130, 200])
def test_single_sequence_matches_oracle(T):
    q, k, v, g, beta = inputs(T, 2, 4, 32, 32, seed=T)
    h0 = state(1, 4, 32, 32, seed=T + 1) if T % 2 else None
    (o, ht, hb), (ro, rf, rb, rpos) = both(q, k, v, g, beta, initial_state=h0)
    assert o.dtype == torch.float32 and ht.dtype == torch.float32
    assert rpos == [[64 * (i + 1) for i in range(T // 64)]]
    close(o, ro)
    close(ht, rf)
    close(hb, rb)


# sequences of 100, 80, 150 tokens at ragged absolute starts: 30 (a 34-token first chunk), 64, 130
CU, STARTS = [0, 100, 180, 330], [30, 64, 130]


@pytest.mark.parametrize(
    "H, HV, K, V",
    [(2, 4, 32, 32), (1, 1, 64, 32), (1, 1, 32, 64), (2, 4, 64, 32), (1, 2, 48, 48), (2, 2, 48, 24), (3, 6, 20, 36)],
    ids=["gva", "K64V32", "K32V64", "gva-K64V32", "gva-48", "K48V24", "gva-20x36"],
)
def test_varlen_ragged_starts_initial_states(H, HV, K, V):
    q, k, v, g, beta = inputs(CU[-1], H, HV, K, V, seed=H * 100 + K + V)
    h0 = state(3, HV, K, V, seed=3)
    (o, ht, hb), (ro, rf, rb, rpos) = both(q, k, v, g, beta, initial_state=h0, cu_seqlens=CU, start_positions=STARTS)
    assert rpos == [[64, 128], [128], [192, 256]]
    assert o.shape == (1, CU[-1], HV, V) and ht.shape == (3, HV, K, V) and hb.shape == (5, HV, K, V)
    close(o, ro)
    close(ht, rf)
    close(hb, rb)


def test_in_kernel_gate_beta_sigmoid_and_metadata():
    """What replay calls: gate and beta computed inside, metadata prepared once (boundaries at an
    index list per sequence), l2norm, a ragged start, GVA."""
    q, k, v, a, b = inputs(CU[-1], 1, 2, 16, 16, seed=5)
    gen = torch.Generator().manual_seed(6)
    A_log = torch.log(torch.empty(2).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(2, generator=gen)
    a, b = a * 4, b * 6 - 3
    h0 = state(3, 2, 16, 16, seed=7)
    meta = prepare_chunk_metadata(CU, STARTS, boundary_indices=[[64], [], [256]])
    o, ht, hb = chunk_gated_delta_rule(
        q,
        k,
        v,
        a,
        b,
        initial_state=h0,
        chunk_metadata=meta,
        use_qk_l2norm=True,
        A_log=A_log,
        dt_bias=dt_bias,
        use_gate_in_kernel=True,
        use_beta_sigmoid=True,
    )
    g = naive_gdn_gate(a, A_log, dt_bias)
    ro, rf, rb, rpos = naive_gated_delta_rule(
        q, k, v, g, torch.sigmoid(b), initial_state=h0, cu_seqlens=CU, start_positions=STARTS, use_qk_l2norm=True
    )
    assert meta.boundary_positions == [[64], [], [256]]
    close(o, ro)
    close(ht, rf)
    close(hb, rb[[0, 4]])  # all boundaries: 64, 128 | 128 | 192, 256


def test_boundary_stride_index_list_dtype_and_none():
    q, k, v, g, beta = inputs(200, 2, 4, 32, 32, seed=3)
    _, _, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)  # 64, 128, 192
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, boundary_stride=2)
    close(hb, rb[1:2])
    _, _, hb16 = chunk_gated_delta_rule(
        q, k, v, g, beta, use_qk_l2norm=True, boundary_indices=[64, 192], state_dtype=torch.bfloat16
    )
    assert hb16.dtype == torch.bfloat16 and hb16.shape[0] == 2
    close(hb16, rb[[0, 2]], rtol=1e-2)
    o2, ht2, none = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, boundary_states=False)
    assert none is None and torch.equal(o, o2) and torch.equal(ht, ht2)


def test_batched_no_l2norm_custom_scale_and_empty_sequence():
    q, k, v, g, beta = inputs(70, 2, 4, 32, 32, seed=11, B=2)
    q, k = q * 0.2, k * 0.2
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, scale=0.3)
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, scale=0.3)
    close(o, ro)
    close(ht, rf)
    close(hb, rb)
    # an empty sequence keeps its initial state
    q, k, v, g, beta = inputs(90, 1, 2, 16, 16, seed=12)
    h0 = state(3, 2, 16, 16, seed=13)
    (o, ht, _), (ro, rf, _, _) = both(q, k, v, g, beta, initial_state=h0, cu_seqlens=[0, 40, 40, 90])
    close(o, ro)
    close(ht, rf)
    assert torch.equal(ht[1], h0[1])


def test_half_inputs_keep_their_dtype_and_fp32_states():
    q, k, v, g, beta = inputs(130, 1, 2, 32, 32, seed=4)
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    o, ht, hb = chunk_gated_delta_rule(qb, kb, vb, g, beta, use_qk_l2norm=True)
    ro, rf, rb, _ = naive_gated_delta_rule(qb, kb, vb, g, beta, use_qk_l2norm=True)
    assert o.dtype == torch.bfloat16 and ht.dtype == hb.dtype == torch.float32
    close(o, ro, rtol=1e-2)  # the output rounded to bf16; the math in fp32
    close(ht, rf)


def test_resume_from_every_boundary_reproduces_the_rest():
    """A call resumed at boundary b (its state, the tokens from b on, start b) gives the same
    outputs, final state and later boundary states as the from-scratch call, for every b."""
    T, start = 300, 30
    q, k, v, g, beta = inputs(T, 1, 2, 16, 24, seed=21)
    conv_x = torch.randn(1, T, 40, generator=torch.Generator().manual_seed(22))
    w, bias = torch.randn(40, 4), torch.randn(40)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, start_positions=[start])
    y, cf, cb = causal_conv1d(conv_x, w, bias, start_positions=[start])
    bounds = prepare_chunk_metadata([0, T], [start]).boundary_positions[0]
    assert bounds == [64, 128, 192, 256, 320]
    for i, b in enumerate(bounds):
        j = b - start
        o2, ht2, hb2 = chunk_gated_delta_rule(
            q[:, j:],
            k[:, j:],
            v[:, j:],
            g[:, j:],
            beta[:, j:],
            use_qk_l2norm=True,
            initial_state=hb[i : i + 1],
            start_positions=[b],
        )
        close(o2, o[:, j:])
        close(ht2, ht)
        close(hb2, hb[i + 1 :])
        y2, cf2, cb2 = causal_conv1d(conv_x[:, j:], w, bias, conv_state=cb[i : i + 1], start_positions=[b])
        close(y2, y[:, j:])
        assert torch.equal(cf2, cf) and torch.equal(cb2, cb[i + 1 :])


# ---- conv ------------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_conv_single_sequence(T):
    gen = torch.Generator().manual_seed(T)
    x, w, b = torch.randn(1, T, 40, generator=gen), torch.randn(40, 4, generator=gen), torch.randn(40, generator=gen)
    y, cf, cb = causal_conv1d(x, w, b)
    ry, rcf, rcb, pos = naive_causal_conv1d(x, w, b)
    close(y, ry)
    assert torch.equal(cf, rcf) and torch.equal(cb, rcb)
    assert cb.shape == (T // 64, 40, 3) and pos == [[64 * (i + 1) for i in range(T // 64)]]


@pytest.mark.parametrize("activation", ["silu", None])
def test_conv_varlen_ragged_starts_strided_state(activation):
    """Ragged starts, a 2-token sequence that ends inside its incoming window, an empty sequence,
    x a view into a fused projection and a conv state that is not contiguous."""
    gen = torch.Generator().manual_seed(1)
    D, cu, starts = 24, [0, 2, 70, 70, 200, 330], [0, 62, 10, 100, 30]
    big = torch.randn(1, 330, 3 * D, generator=gen)
    x = big[..., D : 2 * D]
    w = torch.randn(D, 4, generator=gen)
    cs = torch.randn(5, 3, D, generator=gen).transpose(1, 2)  # [N, D, W-1], strided
    assert not cs.is_contiguous() and not x.is_contiguous()
    y, cf, cb = causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu, start_positions=starts, activation=activation)
    ry, rcf, rcb, pos = naive_causal_conv1d(
        x, w, conv_state=cs, cu_seqlens=cu, start_positions=starts, activation=activation
    )
    assert pos == [[], [64, 128], [], [128, 192], [64, 128]]
    close(y, ry)
    assert torch.equal(cf, rcf) and torch.equal(cb, rcb)
    assert torch.equal(cf[2], cs[2])  # the empty sequence keeps its state
    # the boundary selection of the metadata (an index list per sequence)
    meta = prepare_chunk_metadata(cu, starts, boundary_indices=[[], [128], [], [], [64, 128]])
    _, cf2, cb2 = causal_conv1d(x, w, conv_state=cs, chunk_metadata=meta, activation=activation)
    assert torch.equal(cf2, cf) and torch.equal(cb2, rcb[[1, 4, 5]])
    _, _, none = causal_conv1d(x, w, conv_state=cs, chunk_metadata=meta, boundary_conv_states=False)
    assert none is None


def test_conv_half_input_and_refusals():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 80, 16, generator=gen).to(torch.bfloat16)
    w = torch.randn(16, 4, generator=gen)
    y, cf, cb = causal_conv1d(x, w)
    ry, rcf, rcb, _ = naive_causal_conv1d(x, w)
    assert y.dtype == cf.dtype == torch.bfloat16
    close(y, ry, rtol=1e-2)
    assert torch.equal(cf.float(), rcf) and torch.equal(cb.float(), rcb)
    with pytest.raises(ValueError):
        causal_conv1d(x, w[:, :1])
    with pytest.raises(ValueError, match="conv_state"):
        causal_conv1d(x, w, conv_state=torch.zeros(2, 16, 3))


def test_refusals():
    q, k, v, g, beta = inputs(4, 2, 4, 16, 16, seed=0)
    with pytest.raises(ValueError, match="HV a multiple of H"):
        chunk_gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="initial_state"):
        chunk_gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(1, 2, 16, 16))
    with pytest.raises(ValueError, match="use_gate_in_kernel"):
        chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True)
    # no head-dim ceiling (the Triton kernels stop at 256)
    q, k, v, g, beta = inputs(3, 1, 1, 300, 8, seed=1)
    (o, ht, _), (ro, rf, _, _) = both(q, k, v, g, beta)
    close(o, ro)
    close(ht, rf)


def test_package_exports():
    from kernels import torch_gdn

    assert kernels.torch_chunk_gated_delta_rule is torch_gdn.chunk_gated_delta_rule
    assert kernels.torch_causal_conv1d is torch_gdn.causal_conv1d


def test_runs_without_triton():
    """The module imports and runs where triton cannot be imported."""
    code = (
        "import builtins\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name.split('.')[0] == 'triton':\n"
        "        raise ImportError(name, name='triton')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "import sys, torch\n"
        "from kernels import torch_chunk_gated_delta_rule as gdn, torch_causal_conv1d as conv\n"
        "x = torch.randn(1, 70, 2, 16)\n"
        "o, ht, hb = gdn(x[:, :, :1], x[:, :, 1:], x, x[..., 0], x[..., 1].sigmoid())\n"
        "y, cf, cb = conv(x.reshape(1, 70, 32), torch.randn(32, 4))\n"
        "print(tuple(o.shape), tuple(hb.shape), tuple(cb.shape), 'triton' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["(1,", "70,", "2,", "16)", "(1,", "2,", "16,", "16)", "(1,", "32,", "3)", "False"]
