"""Cost-model numbers against hand computation (docs/cost-model.md; docs/presets.md §3, §5)."""

import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.cost import MODELS, TimingModel, default_timing, get_model
from sim.errors import UsageError

D, N = 4096, 128


@pytest.fixture
def m7():
    return get_model("marconi-7b")


def test_marconi_7b_bytes(m7):
    assert m7.state_bytes() == 24 * (D * N * 2 + (2 * D + 2 * N) * 4 * 2) == 26_787_840
    assert m7.kv_bytes_per_token() == 4 * 2 * D * 2 == 65_536
    assert round(m7.state_kv_tokens()) == 409  # break-even
    assert m7.is_hybrid
    assert m7.node_bytes(100) == 26_787_840 + 65_536 * 100


def test_marconi_7b_flops_paper_formulas(m7):
    def attn(L):
        return 8 * L * D**2 + 4 * L**2 * D

    def mlp(L):
        return 16 * L * D**2

    def mamba(L):
        return 12 * L * D**2 + 16 * L * D * N + 10 * L * D

    assert mamba(1) == 209_756_160
    for L in (1, 100, 4096, 30_000):
        assert m7.flops(L) == pytest.approx(24 * mamba(L) + 4 * attn(L) + 28 * mlp(L), rel=1e-12)
    assert m7.prefill_flops(1000, 3000) == pytest.approx(m7.flops(3000) - m7.flops(1000), rel=1e-12)
    assert m7.prefill_flops(3000, 3000) == 0.0
    # marginal node FLOPs: SSM part on the edge only, attention/MLP as differences
    Lp, Ln = 5000, 5300
    want = 24 * mamba(Ln - Lp) + 4 * (attn(Ln) - attn(Lp)) + 28 * (mlp(Ln) - mlp(Lp))
    assert m7.node_flops(Lp, Ln) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("L,eff", [(100, 3.9e4), (1_000, 1.43e5), (10_000, 2.02e5), (30_000, 2.27e5)])
def test_marconi_7b_root_efficiency(m7, L, eff):
    assert m7.node_flops(0, L) / m7.node_bytes(L) == pytest.approx(eff, rel=0.01)


def test_qwen3_next_sizes():
    q = get_model("qwen3-next-80b-a3b")
    assert q.kv_bytes_per_token() == 12 * 2 * 2 * 256 * 2 == 24 * 1024
    per_layer = 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2  # 2 MiB + 48 KiB
    assert per_layer == 2 * 2**20 + 48 * 2**10
    assert q.state_bytes() == 36 * per_layer == 77_266_944
    assert q.state_bytes() / 2**20 == pytest.approx(73.7, abs=0.05)
    assert q.state_bytes() // q.kv_bytes_per_token() == 3144


def test_qwen3_next_flops_by_hand():
    q = get_model("qwen3-next-80b-a3b")
    # full attention layer (d=2048, 16 q heads x 256 with output gate, 2 kv heads):
    # q 2048*8192 + k,v 2*2048*512 + o 4096*2048 = 27,262,976 weights -> 54,525,952 FLOP/token;
    # causal QK^T + AV: 2*H*hd*(L^2 + L) with H*hd = 4096
    attn_lin, attn_sq = 54_525_952 + 8192, 8192
    # gated delta layer: qkvz 2048*12288 + ba 2048*64 + out 4096*2048 = 33,685,504 weights,
    # conv 2*8192*4 = 65,536, core 32 heads * (6*128^2 + 9.25*64*128) = 32 * 174,080
    gdn = 2 * 33_685_504 + 65_536 + 32 * 174_080
    assert gdn == 73_007_104
    # MoE: 11 SwiGLU experts of 3*2048*512 (top-10 + shared) + router 2048*512 = 35,651,584
    moe = 2 * 35_651_584
    for L in (1, 1024, 32_768):
        want = 12 * (attn_lin * L + attn_sq * L * L) + 36 * gdn * L + 48 * moe * L
        assert q.flops(L) == pytest.approx(want, rel=1e-12)
    # active params cross-check: ~3.3B non-embedding (the name says A3B)
    assert (q.active_params() - 2 * 151_936 * 2048) / 1e9 == pytest.approx(3.35, abs=0.05)


@pytest.mark.parametrize(
    "name,kv_kib,state_mib,n_tok",
    [
        ("qwen3.5-397b-a17b", 30, 183, 6252),
        ("qwen3.5-122b-a10b", 24, 147, 6252),
        ("qwen3.5-35b-a3b", 20, 61, 3144),
        ("qwen3.5-27b", 64, 147, 2349),
        ("qwen3.5-9b", 32, 49, 1572),
    ],
)
def test_qwen35_sizes_match_kernel_table(name, kv_kib, state_mib, n_tok):
    s = get_model(name)
    assert s.kv_bytes_per_token() == kv_kib * 1024
    assert s.state_bytes() / 2**20 == pytest.approx(state_mib, abs=0.5)
    assert int(s.state_kv_tokens()) == n_tok
    assert s.is_hybrid


@pytest.mark.parametrize("name", list(MODELS))
def test_active_params_near_nominal(name):
    s = get_model(name)
    assert s.active_params() == pytest.approx(s.nominal_active_params, rel=0.35)


def test_llama_pure_transformer():
    s = get_model("llama-7b")
    assert not s.is_hybrid and s.state_bytes() == 0
    assert s.kv_bytes_per_token() == 32 * 2 * 4096 * 2
    assert s.node_bytes(10) == 10 * s.kv_bytes_per_token()


def test_get_model_unknown():
    with pytest.raises(UsageError, match="marconi-7b"):
        get_model("gpt-5")


def test_timing():
    m7 = get_model("marconi-7b")
    t = default_timing("marconi-7b")
    assert TimingModel.jamba_ttft_s(8192) == pytest.approx(0.0178 + 0.0530e-3 * 8192)
    assert t.prefill_time_s(m7, 0, 8192) == pytest.approx(TimingModel.jamba_ttft_s(8192), rel=0.01)
    assert t.prefill_time_s(m7, 8192, 8192) == pytest.approx(0.0178)
    assert t.decode_time_s(10) == pytest.approx(10 * t.decode_ms_per_token / 1e3)
    custom = TimingModel(effective_tflops=100.0, overhead_ms=0.0, decode_ms_per_token=1.0)
    assert custom.prefill_time_s(m7, 0, 1000) == pytest.approx(m7.flops(1000) / 1e14)
    for name in MODELS:
        assert default_timing(name).effective_tflops > 0
    with pytest.raises(UsageError):
        TimingModel(effective_tflops=0.0, overhead_ms=1.0, decode_ms_per_token=1.0)


def test_cli_models_table_and_json():
    r = CliRunner().invoke(main, ["models"])
    assert r.exit_code == 0, r.output
    assert "qwen3-next-80b-a3b" in r.output and "26,787,840" in r.output and "65,536" in r.output
    r = CliRunner().invoke(main, ["models", "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert set(rows) == set(MODELS)
    assert rows["marconi-7b"]["state_bytes"] == 26_787_840
    assert rows["qwen3-next-80b-a3b"]["kv_bytes_per_token"] == 24_576
    assert rows["llama-7b"]["is_hybrid"] is False


# Active parameters counted by hand from each model's configuration: weights per token, plus what
# ``active_params`` documents it also carries (half the non-weight linear FLOPs: the causal
# attention's 2*H*hd, GDN core and conv, Mamba scan), plus two vocab tables.
def _qwen35_27b_by_hand() -> int:
    D, layers, H, KVH, hd, Hv = 5120, 64, 24, 4, 256, 48
    attn = D * H * hd * 2 + 2 * D * KVH * hd + H * hd * D + H * hd  # q (+ output gate), k, v, o; causal term
    gdn_w = D * (2 * 16 * 128 + 2 * Hv * 128) + D * 2 * Hv + Hv * 128 * D  # qkvz, ba, out
    gdn = gdn_w + (2 * 16 * 128 + Hv * 128) * 4 + Hv * (6 * 128 * 128 + 64 * (5.25 * 128 + 4 * 128)) / 2
    mlp = 3 * D * 17408
    return int(layers // 4 * attn + layers * 3 // 4 * gdn + layers * mlp + 2 * 248_320 * D)


ACTIVE_BY_HAND = {
    # paper 7B: (24 Mamba2 + 4 attention + 28 MLP) linear FLOP coefficients / 2, no vocab counted
    "marconi-7b": (24 * (12 * D**2 + 16 * D * N + 10 * D) + 4 * 8 * D**2 + 28 * 16 * D**2) // 2,
    # Llama-2-7B: 32 x (4 D^2 attention + H*hd causal term + 3 x 4096 x 11008 SwiGLU) + 2 x 32000 x 4096
    "llama-7b": 32 * (4 * 4096**2 + 4096 + 3 * 4096 * 11008) + 2 * 32_000 * 4096,
    # Qwen3-Next: the per-layer FLOPs of test_qwen3_next_flops_by_hand, halved, + 2 x 151936 x 2048
    "qwen3-next-80b-a3b": (12 * (54_525_952 + 8192) + 36 * 73_007_104 + 48 * 2 * 35_651_584) // 2 + 2 * 151_936 * 2048,
    "qwen3.5-27b": _qwen35_27b_by_hand(),
}


@pytest.mark.parametrize("name", sorted(ACTIVE_BY_HAND))
def test_active_params_counted_by_hand(name):
    assert get_model(name).active_params() == ACTIVE_BY_HAND[name]


def test_mamba_state_defaults_to_what_engines_keep():
    # d_inner channels x N fp32 state, and W - 1 conv columns of (d_inner + 2 * groups * N) bf16
    from sim.cost import ModelSpec

    s = ModelSpec(
        name="tiny-mamba",
        d_model=256,
        n_mamba=2,
        mamba_d_inner=512,
        mamba_d_state=16,
        mamba_conv_width=4,
        n_attn=1,
        attn_heads=4,
        attn_kv_heads=2,
        attn_head_dim=64,
    )
    assert s.state_bytes() == 2 * (512 * 16 * 4 + (512 + 2 * 16) * 3 * 2) == 72_064
    assert s.kv_bytes_per_token() == 1 * 2 * 2 * 64 * 2


@pytest.mark.parametrize("name, gpus", [("qwen3.5-9b", 1), ("qwen3-next-80b-a3b", 2), ("qwen3.5-397b-a17b", 8)])
def test_h200_default_is_the_calibrated_file(name, gpus):
    # the Qwen presets' default is the committed H200 calibration (marconi replay --calibrate):
    # every FLOP term at most 100 % of the peak, the provenance in its source; a preset that needs
    # a tensor-parallel group divides the compute terms (ideal scaling), not the per-call times
    from sim.cost import H200_TIMING_FILE, HardwareTiming, read_timing_file

    t, f = default_timing(name), read_timing_file(H200_TIMING_FILE)
    spec = get_model(name)
    assert isinstance(t, HardwareTiming) and t.gpus == gpus and t.ms_per_tflop == f.ms_per_tflop
    # (the gated-delta chunk term none: the resumed-call term beside it took its time, "not known")
    assert all(0 < x <= 1 for k, x in t.fraction_of_peak().items() if k != "gdn_chunk")
    # (the resumed-call term fitted, taken out of the fit runs' resumed calls, and not priced: 0)
    assert t.fraction_of_peak()["gdn_chunk"] is None and t.gdn_resume_ms_per_chunk == 0.0
    assert "H200" in t.source and "torch" in t.source and "fit traces" in t.source
    assert f.dtype == "bf16" and f.device == "h200" and "qwen3.5-9b" in f.covers["models"]
    # by hand: each layer at max(floor, per-call time + weights read + its FLOP, activation and KV
    # terms), all but the per-call time divided by gpus, plus the call time
    from sim.cost import act_gb, kv_gb_per_layer_token, weight_gb

    c, T = f.ms_per_tflop, 4096
    wgb, agb = weight_gb(spec), act_gb(spec)
    per = {
        "attention": (c["attn_linear"] * spec.attn_layer_a * T + c["attn_quadratic"] * spec.attn_layer_b * T * T)
        * 1e-12
        + f.ms_per_act_gb["attention"] * agb["attention"] * T
        + f.ms_per_kv_gb * kv_gb_per_layer_token(spec) * T,
        "gated_delta": (c["gdn_linear"] * spec.gdn_layer_a * T + c["gdn_chunk"] * spec.gdn_chunk_flops * 64) * 1e-12
        + f.ms_per_act_gb["gated_delta"] * agb["gated_delta"] * T,
        "mlp": c["mlp_linear"] * spec.mlp_layer_a * T * 1e-12 + f.ms_per_act_gb["mlp"] * agb["mlp"] * T,
    }
    n = {"attention": spec.n_attn, "gated_delta": spec.n_gdn + spec.n_mamba, "mlp": spec.n_mlp}
    want = f.call_ms + sum(
        n[k] * max(f.layer_floor_ms[k], f.layer_call_ms[k] + (f.ms_per_weight_gb[k] * wgb[k] + per[k]) / gpus)
        for k in ("attention", "gated_delta", "mlp")
    )
    assert t.prefill_time_s(spec, 0, 4096) == pytest.approx(want * 1e-3)
    assert t.seq_ms == f.seq_ms and any(v > 0 for v in f.seq_ms.values())  # fitted on replayed steps


def test_marconi_7b_timing_by_hand():
    # prefill calibrated to the Jamba fit: F(8192) FLOPs in 0.0530 ms x 8192 (~257 TFLOP/s), 17.8 ms
    # overhead; decode reads ~6.5B bf16 weights at 70% of an A100's 1.555 TB/s: ~12 ms per token
    D, N = 4096, 128
    f8k = 8192 * (24 * (12 * D**2 + 16 * D * N + 10 * D) + 4 * 8 * D**2 + 28 * 16 * D**2) + 4 * 4 * 8192**2 * D
    t = default_timing("marconi-7b")
    assert t.effective_tflops == pytest.approx(f8k / (0.0530e-3 * 8192) / 1e12, abs=0.05)
    assert t.effective_tflops == pytest.approx(257, abs=1)
    assert t.overhead_ms == 17.8
    assert t.decode_ms_per_token == pytest.approx(6.5e9 * 2 / (0.7 * 1.555e12) * 1e3, abs=0.1)
    assert default_timing("llama-7b") == t  # the same A100 calibration, like for like


def test_a_preset_without_a_gpu_count_is_a_usage_error_not_a_key_error(monkeypatch):
    """A new model preset that nobody gave a GPU count gets one clear line (exit 2 in the CLI)."""
    import dataclasses

    from sim import cost
    from sim.errors import UsageError

    new = dataclasses.replace(cost.MODELS["qwen3.5-9b"], name="qwen-new")
    monkeypatch.setitem(cost.MODELS, "qwen-new", new)
    with pytest.raises(UsageError, match="no GPU count.*--timing"):
        cost.default_timing("qwen-new")
    assert cost.default_timing("qwen3.5-9b").effective_tflops > 0
