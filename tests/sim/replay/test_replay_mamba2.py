"""The replayed Mamba2 layer (``sim.replay.mamba2``): shapes from the presets, a restore at a
boundary from the layer's emitted SSD state and conv window equal to the from-scratch run (what
replay's validation checks), the varlen batch against per-sequence runs, and the Triton kernels
against the plain-torch ones."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernels._common import prepare_chunk_metadata  # noqa: E402
from sim.cost import MODELS  # noqa: E402
from sim.replay.mamba2 import Mamba2Shape, init_weights, load_backend, mamba2_block  # noqa: E402

TINY = Mamba2Shape(hidden=32, heads=4, head_dim=16, d_state=16, groups=2)


def _layer(shape=TINY, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return init_weights(shape, gen, "cpu", dtype)


def _run(x, w, start, rec0, conv0, boundaries, backend="torch", dtype=torch.float32):
    meta = prepare_chunk_metadata([0, x.shape[0]], [start], boundary_indices=boundaries)
    out = mamba2_block(
        x, w, TINY, dtype=dtype, meta=meta, rec0=rec0, conv0=conv0, boundaries=bool(boundaries),
        backend=load_backend(backend),
    )  # fmt: skip
    return out


def test_shape_from_the_presets():
    s = Mamba2Shape.from_spec(MODELS["marconi-7b"])
    assert (s.heads, s.head_dim, s.d_state, s.groups, s.conv_width) == (128, 64, 128, 1, 4)
    assert s.conv_dim == 8192 + 2 * 128 and s.proj_dim == 2 * 8192 + 2 * 128 + 128
    assert s.state_shape == (128, 64, 128)
    with pytest.raises(ValueError, match="no Mamba2 layers"):
        Mamba2Shape.from_spec(MODELS["qwen3.5-9b"])
    with pytest.raises(ValueError, match="bad Mamba2 shape"):
        Mamba2Shape(hidden=8, heads=3, head_dim=4, d_state=4, groups=2)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_restore_at_a_boundary_equals_the_run_through(backend):
    pytest.importorskip("triton") if backend == "triton" else None
    w = _layer()
    gen = torch.Generator().manual_seed(1)
    T = 150
    x = torch.randn(T, TINY.hidden, generator=gen)
    y, rec, conv, rb, cb = _run(x, w, 0, None, None, [64, 128], backend)
    assert rb.shape == (2, 4, 16, 16) and cb.shape == (2, TINY.conv_dim, 3)
    for j, p in enumerate((64, 128)):
        y2, rec2, conv2, _, _ = _run(x[p:], w, p, rb[j], cb[j], [], backend)
        assert torch.equal(y2, y[p:]) and torch.equal(rec2, rec) and torch.equal(conv2, conv)


def test_triton_equals_torch_and_varlen_equals_per_sequence():
    pytest.importorskip("triton")
    w = _layer(seed=2)
    gen = torch.Generator().manual_seed(3)
    lens, starts = [70, 1, 90], [0, 40, 64]
    x = torch.randn(sum(lens), TINY.hidden, generator=gen)
    rec0 = 0.1 * torch.randn(3, *TINY.state_shape, generator=gen)
    rec0[0] = 0
    conv0 = 0.1 * torch.randn(3, TINY.conv_dim, 3, generator=gen)
    conv0[0] = 0
    cu = [0, 70, 71, 161]
    meta = prepare_chunk_metadata(cu, starts, boundary_indices=[[64], [], [128]])
    outs = {}
    for name in ("torch", "triton"):
        outs[name] = mamba2_block(
            x, w, TINY, dtype=torch.float32, meta=meta, rec0=rec0, conv0=conv0, boundaries=True,
            backend=load_backend(name), varlen=True,
        )  # fmt: skip
    for a, b in zip(outs["torch"], outs["triton"]):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    y, rec, conv, rb, cb = outs["torch"]
    assert rb.shape[0] == 2
    for n in range(3):
        a, b = cu[n], cu[n + 1]
        bnd = ([64], [], [128])[n]
        y1, rec1, conv1, rb1, cb1 = _run(x[a:b], w, starts[n], rec0[n], conv0[n], bnd)
        torch.testing.assert_close(y[a:b], y1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rec[n], rec1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(conv[n], conv1, atol=1e-5, rtol=1e-5)  # the projection of other row counts


# ---- the replayed model with Mamba2 layers ---------------------------------------------------


def test_replay_shape_of_marconi_7b_carries_the_mamba2_sizes():
    from sim.replay.mamba2 import mamba2_of, replay_shape

    s = replay_shape(MODELS["marconi-7b"])
    assert (s.layers, s.attn_layers, s.order.count("attention")) == (24, 4, 4)
    assert mamba2_of(s) == Mamba2Shape(hidden=4096, heads=128, head_dim=64, d_state=128, groups=1)
    # one checkpoint: 24 x (fp32 [128, 128, 64] + bf16 conv window [8192 + 2 x 128, 3])
    assert s.state_bytes(torch.bfloat16) == 24 * (128 * 128 * 64 * 4 + (8192 + 256) * 3 * 2)
    assert s.kv_bytes_per_token(torch.bfloat16) == 4 * 2 * 32 * 128 * 2
    small = replay_shape(MODELS["marconi-7b"], layers=7)
    assert (small.layers, small.attn_layers) == (6, 1)


def _tiny_model(kernel="torch"):
    from sim.replay.mamba2 import Mamba2Model
    from sim.replay.model import ReplayShape

    shape = ReplayShape(
        hidden=32, layers=2, k_heads=2, v_heads=4, head_k_dim=16, head_v_dim=16, conv_width=4, vocab_rows=512,
        attn_layers=1, attn_heads=2, attn_kv_heads=1, attn_head_dim=16, mlp_inter=64,
    )  # fmt: skip
    return Mamba2Model(shape, kernel=kernel, seed=0)


def test_model_restore_from_boundary_states_matches_scratch():
    """What replay validates on every hit: run a prompt from scratch keeping the states at its
    boundaries, restore one (Mamba2 states and conv windows, the attention KV of the prefix) and
    run the suffix: the final states and outputs equal the from-scratch run's."""
    from sim.replay.model import StackState

    model = _tiny_model()
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 512, (150,), generator=gen)
    got = {}

    def on_state(p, layer, rec, conv):
        got[(p, layer)] = (rec.clone(), conv.clone())

    final, outs, calls = model.run(tokens, None, 0, wanted=[64, 128], on_state=on_state, keep_outputs=True)
    assert calls == 1 and final.rec.shape == (2, 4, 16, 16)
    for p in (64, 128):
        rec = torch.stack([got[(p, l)][0] for l in range(2)])
        conv = torch.stack([got[(p, l)][1] for l in range(2)])
        st = StackState(p, rec, conv, final.kv[:, :, :p].clone())
        f2, o2, _ = model.run(tokens[p:], st, p, keep_outputs=True)
        torch.testing.assert_close(f2.rec, final.rec, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(f2.conv, final.conv, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(o2[-1], outs[-1][p:], atol=1e-4, rtol=1e-4)


def test_model_batch_equals_segments_and_triton_equals_torch():
    model = _tiny_model()
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randint(0, 512, (90,), generator=gen), torch.randint(0, 512, (70,), generator=gen)
    out = model.forward_batch(torch.cat([a, b]), [0, 90, 160], [0, 0])
    for n, toks in enumerate((a, b)):
        fin, _, _ = model.run(toks, None, 0)
        torch.testing.assert_close(out.rec[0][n], fin.rec[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.rec[1][n], fin.rec[1], atol=1e-5, rtol=1e-5)
    pytest.importorskip("triton")
    tri = _tiny_model("triton")
    f1, _, _ = model.run(a, None, 0)
    f2, _, _ = tri.run(a, None, 0)
    torch.testing.assert_close(f1.rec, f2.rec, atol=1e-4, rtol=1e-4)


def test_model_refuses_a_peer_kernel():
    from sim.errors import UsageError

    with pytest.raises(UsageError, match="no Mamba2 kernel"):
        _tiny_model("fla")


def test_replay_accepts_mamba2_presets():
    """``marconi replay --model marconi-7b`` runs (``Mamba2Model``); its layer count and the
    --layers bound count its Mamba2 layers (a CPU run of 2 layers and 4 requests validated its 3
    hits bit for bit: docs/kernels.md)."""
    from sim.errors import UsageError
    from sim.replay.session import check_model

    assert check_model(MODELS["marconi-7b"], None) == 28
    assert check_model(MODELS["marconi-7b"], 3) == 3
    with pytest.raises(UsageError, match=r"more than marconi-7b's 28 layers \(4 attention \+ 24 Mamba2\)"):
        check_model(MODELS["marconi-7b"], 29)
    with pytest.raises(UsageError, match="no gated-delta or Mamba2 layers"):
        check_model(MODELS["llama-7b"], None)
    # the refusal names every kind of preset replay runs: the Mamba2 hybrids too, not only
    # qwen3.5-* / qwen3-next-* / marconi-7b
    with pytest.raises(UsageError, match=r"\(Mamba1\).*nemotron-h-\*, falcon-h1-7b, granite-4.0-h-small"):
        check_model(MODELS["jamba-1.5-mini"], None)
    for name in ("nemotron-h-8b", "falcon-h1-7b", "granite-4.0-h-small"):
        assert check_model(MODELS[name], None) == MODELS[name].n_attn + MODELS[name].n_mamba


# ---- a replay of a Mamba2 hybrid: its linear layers labelled and priced as Mamba2 layers --------

TOY = Path(__file__).resolve().parents[2] / "data" / "configs" / "toy-mamba2-hybrid.json"
CHAT = "synthetic:chat:sessions=3,turns=3,prompt_tokens=40,user_tokens=24,output_tokens=16,prompts=1"


def test_replayed_flops_price_mamba2_layers_per_token_as_the_cost_model():
    """Mamba2 layers ride in the gated-delta slot of the replayed shape; their FLOPs are the cost
    model's per-token Mamba2 FLOPs (a gated-delta model keeps its per-token + per-chunk ones)."""
    from sim.cost import get_model
    from sim.replay.flops import replayed_flops
    from sim.replay.measure import model_counts, replayed_spec

    spec = get_model(str(TOY))
    assert (spec.n_attn, spec.n_mamba, spec.n_gdn) == (1, 3, 0) and spec.mamba_layer_a > 0
    counts = {"attention": 1, "gated_delta": 3, "mlp": 4}
    want = spec.attn_layer_a * 30 + spec.attn_layer_b * (100 * 100 - 70 * 70)
    want += 3 * spec.mamba_layer_a * 30 + 4 * spec.mlp_layer_a * 30
    assert replayed_flops(spec, counts, [(70, 100)]) == pytest.approx(want, rel=1e-12)
    assert model_counts(spec)["gated_delta"] == 3
    r = replayed_spec(spec, counts)
    assert (r.n_attn, r.n_mamba, r.n_gdn, r.n_mlp) == (1, 3, 0, 4)
    # the whole replayed model's prefill is what the cost model charges those layers
    assert replayed_flops(spec, counts, [(0, 100)]) == pytest.approx(r.prefill_flops(0, 100), rel=1e-12)
    tiny = get_model("replay-tiny")  # gated delta: per token and per chunk, unchanged
    g = {"attention": 0, "gated_delta": 1, "mlp": 0}
    assert replayed_flops(tiny, g, [(0, 65)]) == tiny.gdn_layer_a * 65 + tiny.gdn_chunk_flops * 2


@pytest.mark.parametrize("mode,scheduler", [("sequential", "fcfs"), ("des", "continuous")])
def test_a_mamba2_replay_labels_its_linear_layers_mamba2(mode, scheduler):
    """The summary (and its JSON) and the settings key the Mamba2 layers ``mamba2``, their time is
    scaled to the model's Mamba2 layers, and ``--calibrate``'s counts read them back into the
    cost model's gated-delta slot."""
    from sim.config import SimConfig
    from sim.replay.session import ReplaySettings, run_replay
    from sim.replay.summary import cost_counts
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace(CHAT, TraceOptions())
    cfg = SimConfig(model=str(TOY), capacity_bytes=10**9, mode=mode, scheduler=scheduler)
    res = run_replay(trace, cfg, ReplaySettings(device="cpu", dtype="fp32", requests=6), build=build)
    s = res.summary
    assert res.failures == [] and s["hits"] > 0 and s["hits_validated"] == s["hits"]
    counts = {"attention": 1, "mamba2": 3, "mlp": 4}
    assert s["layers_replayed"] == counts and res.settings["layers_replayed"] == counts
    assert list(s["measured_ms_by_layer_type"]) == ["attention", "mamba2", "mlp", "other"]
    assert s["measured_model_ms_by_layer_type"]["mamba2"] == pytest.approx(s["measured_ms_by_layer_type"]["mamba2"])
    assert s["measured_ms_by_layer_type"]["mamba2"] > 0
    assert "gated_delta" not in json.dumps(s)
    assert cost_counts(res.settings["layers_replayed"]) == {"attention": 1, "gated_delta": 3, "mlp": 4}
    if scheduler == "continuous":
        assert s["step_layers_replayed"] == counts and s["steps_executed"] > 0
        assert list(s["step_measured_ms_by_layer_type"]) == ["attention", "mamba2", "mlp", "other"]


def test_a_moe_is_told_by_its_spec_not_its_name():
    """``ReplayShape.mlp_moe`` (the summary's ``mlp_moe_at_active_width``, the header's "MoE MLP
    replayed dense at its active width") comes from the spec: it was read from the preset's name
    ("-a" / "-moe"), so Granite 4.0 H-Small's 72 experts and Qwen3.5-35B-A3B read from its own
    config.json (named by its path) were called a dense MLP."""
    from dataclasses import replace

    from sim.cost import MODELS, get_model
    from sim.replay.model import ReplayShape

    configs = Path(__file__).resolve().parents[2] / "data" / "configs"
    moe = {n for n, s in MODELS.items() if s.mlp_moe}
    assert moe == {
        "qwen3-next-80b-a3b",
        "qwen3.5-35b-a3b",
        "qwen3.5-122b-a10b",
        "qwen3.5-397b-a17b",
        "jamba-1.5-mini",
        "granite-4.0-h-small",
        "replay-tiny-moe",
    }
    for name in ("granite-4.0-h-small", "qwen3.5-35b-a3b", "nemotron-h-8b", "qwen3.5-9b"):
        from_config = get_model(str(configs / f"{name}.json"))
        assert from_config.mlp_moe == MODELS[name].mlp_moe
        assert ReplayShape.from_spec(from_config, layers=4).mlp_moe == (name in moe)
    # Mamba2 layers ride in the gated-delta slot (sim.replay.mamba2); a model without MLPs is no MoE
    granite, codestral = (get_model(str(configs / f"{n}.json")) for n in ("granite-4.0-h-small", "mamba-codestral-7b"))
    assert ReplayShape.from_spec(replace(granite, n_gdn=granite.n_mamba), layers=4).mlp_moe
    assert not ReplayShape.from_spec(replace(codestral, n_gdn=codestral.n_mamba), layers=2).mlp_moe
