"""The replayed stack against a plain-torch oracle built from kernels/reference.py, on both
gated-delta backends (torch, the CPU's default; the Triton kernels, in the interpreter on a CPU),
and the resumability it exists for: a state handed over at any position (64-aligned from the
kernels' boundary states, or anywhere by splitting the call) continues to the same result as one
from-scratch call. The backend registry: defaults by device, unknown names refused."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from kernels.reference import naive_causal_conv1d, naive_gated_delta_rule, naive_gdn_gate  # noqa: E402
from sim.replay.checks import rel_error, state_error  # noqa: E402
from sim.replay.backends import GDN_BACKENDS, default_kernel, kernel_choices, resolve_kernel  # noqa: E402
from sim.replay.model import GDNStack, ReplayShape  # noqa: E402


def oracle(model, tokens):
    """Per-token fp32 oracle of the whole stack (its own code, reference.py's recurrences)."""
    s = model.shape
    x = model.embedding[tokens % s.vocab_rows].float()
    T = x.shape[0]
    recs, convs = [], []
    for w in model.layers:
        h = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        proj = h @ w["w_in"].float()
        c, v = s.conv_dim, s.value_dim
        y, conv_end, _, _ = naive_causal_conv1d(proj[None, :, :c], w["conv_w"].float())
        nk = s.k_heads * s.head_k_dim
        q = y[:, :, :nk].reshape(1, T, s.k_heads, s.head_k_dim)
        k = y[:, :, nk : 2 * nk].reshape(1, T, s.k_heads, s.head_k_dim)
        vv = y[:, :, 2 * nk :].reshape(1, T, s.v_heads, s.head_v_dim)
        g = naive_gdn_gate(proj[None, :, c + v : c + v + s.v_heads], w["A_log"], w["dt_bias"])
        beta = torch.sigmoid(proj[None, :, c + v + s.v_heads :])
        o, fin, _, _ = naive_gated_delta_rule(q, k, vv, g, beta, use_qk_l2norm=True)
        o = o[0]
        o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + 1e-6) * w["norm_w"]
        o = o * F.silu(proj[:, c : c + v].reshape(T, s.v_heads, s.head_v_dim))
        x = x + o.reshape(T, v) @ w["w_out"].float()
        recs.append(fin[0])
        convs.append(conv_end[0])
    return x, torch.stack(recs), torch.stack(convs)


@pytest.fixture(scope="module")
def triton_model(tiny_shape):
    """The tiny stack on the Triton kernels (the interpreter on a CPU), same weights."""
    pytest.importorskip("triton")
    return GDNStack(tiny_shape, device="cpu", dtype=torch.float32, seed=7, kernel="triton")


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_stack_matches_the_oracle(kernel, tiny_model, request):
    model = tiny_model if kernel == "torch" else request.getfixturevalue("triton_model")
    assert model.kernel == kernel
    tokens = torch.randint(0, 10_000, (100,), generator=torch.Generator().manual_seed(1))
    final, outs, calls = model.run(tokens, None, 0, keep_outputs=True)
    x, rec, conv = oracle(model, tokens)
    assert calls == 1
    assert rel_error(outs[-1], x) < 1e-5
    r, c = state_error(final.rec, final.conv, rec, conv)
    assert r < 1e-5 and c < 1e-6


def test_backends_agree_on_boundary_states(tiny_model, triton_model):
    """From a state at a ragged start (130), both backends hand over the same boundary states and
    the same end state (the Triton kernels in the interpreter: a short call)."""
    tokens = torch.randint(0, 10_000, (200,), generator=torch.Generator().manual_seed(3))
    st, _, _ = tiny_model.run(tokens[:130], None, 0)
    got = {}
    for name, model in (("torch", tiny_model), ("triton", triton_model)):
        sink = got.setdefault(name, {})
        end, outs, _ = model.run(
            tokens[130:],
            st,
            130,
            [192, 200],
            lambda p, l, r, c, sink=sink: sink.__setitem__((p, l), (r.clone(), c.clone())),
            keep_outputs=True,
        )
        sink["outs"] = outs[-1]
    assert set(got["torch"]) == set(got["triton"]) == {(p, l) for p in (192, 200) for l in (0, 1)} | {"outs"}
    assert rel_error(got["torch"]["outs"], got["triton"]["outs"]) < 1e-5
    for key in ((192, 0), (192, 1), (200, 0), (200, 1)):
        r, c = state_error(*got["torch"][key], *got["triton"][key])
        assert r < 1e-5 and c < 1e-6, key


def test_backend_registry():
    assert kernel_choices() == ("auto", "triton", "torch", "fla", "flashqla", "ours")
    assert set(GDN_BACKENDS) == {"triton", "torch", "fla", "flashqla"}
    assert (
        default_kernel("cpu") == resolve_kernel("auto", "cpu") == resolve_kernel(None, torch.device("cpu")) == "torch"
    )
    assert default_kernel("cuda:0") == resolve_kernel("auto", torch.device("cuda", 0)) == "triton"
    assert resolve_kernel("triton", "cpu") == "triton" and resolve_kernel("torch", "cuda") == "torch"
    assert GDN_BACKENDS["triton"].triton and not GDN_BACKENDS["torch"].triton
    assert resolve_kernel("ours", "cuda") == "triton"
    with pytest.raises(ValueError, match="unknown gated-delta kernel 'mamba'"):
        resolve_kernel("mamba", "cpu")


@pytest.mark.parametrize("p", [64, 100])
def test_restore_at_p_continues_like_from_scratch(tiny_model, p):
    tokens = torch.randint(0, 10_000, (150,), generator=torch.Generator().manual_seed(2))
    got = {}

    def sink(pos, layer, rec, conv):
        got.setdefault(pos, {})[layer] = (rec.clone(), conv.clone())

    full, full_outs, calls = tiny_model.run(tokens, None, 0, [p, 150], sink, keep_outputs=True)
    # 64 comes from the boundary states (one call); 100 splits the call in two
    assert calls == (1 if p % 64 == 0 else 2)
    L = tiny_model.shape.layers
    assert set(got) == {p, 150} and all(len(v) == L for v in got.values())
    st = full.__class__(p, torch.stack([got[p][l][0] for l in range(L)]), torch.stack([got[p][l][1] for l in range(L)]))
    resumed, outs, _ = tiny_model.run(tokens[p:], st, p, keep_outputs=True)
    ref, ref_outs, _ = tiny_model.run(tokens, None, 0, keep_outputs=True)
    r, c = state_error(resumed.rec, resumed.conv, ref.rec, ref.conv)
    assert r < 1e-4 and c < 1e-5
    for o, ro in zip(outs, ref_outs):
        assert rel_error(o, ro[p:]) < 1e-4
    # the state handed to the sink at the end equals the final state
    assert torch.equal(torch.stack([got[150][l][0] for l in range(L)]), full.rec)
    # the prefix state differs from a state at a neighbouring position
    other = {}
    tiny_model.run(tokens, None, 0, [p + 1], lambda pos, layer, rec, conv: other.setdefault(layer, rec.clone()))
    assert rel_error(other[0].reshape(-1, 16), got[p][0][0].reshape(-1, 16)) > 1e-3


def test_shape_from_a_preset_and_state_bytes():
    from sim.cost import get_model

    spec = get_model("qwen3.5-9b")
    shape = ReplayShape.from_spec(spec)
    assert (shape.layers, shape.hidden, shape.k_heads, shape.v_heads) == (24, 4096, 16, 32)
    # docs/cost-model.md §4: 2 MiB fp32 recurrent + 48 KiB bf16 conv per layer
    assert shape.state_bytes(torch.bfloat16) == 24 * (2 * 2**20 + 48 * 2**10)
