"""Executed FLOPs of replayed layers against the cost model's per-token formula."""

from dataclasses import replace

from sim.cost import get_model
import pytest

from sim.replay.flops import chunks_of, layer_flops, model_flops, padding_flops, replayed_flops, segments_flops


def test_chunks_of_counts_absolute_aligned_chunks():
    assert chunks_of(0, 64) == 1
    assert chunks_of(0, 65) == 2
    assert chunks_of(60, 70) == 2  # ragged on both sides
    assert chunks_of(64, 128) == 1
    assert chunks_of(100, 100) == 0
    assert chunks_of(63, 64) == 1


def test_full_chunks_match_the_cost_model_per_token():
    spec = get_model("qwen3.5-9b")
    gdn_only = replace(spec, n_attn=0, n_mlp=0, n_gdn=1)
    # 640 tokens in 10 full chunks: no padding, so exactly the simulator's F(L)
    assert abs(layer_flops(spec, 640, 10) - gdn_only.flops(640)) < 1e-6 * gdn_only.flops(640)
    # a split at 100 pads two ragged chunks: more work than the simulator's count
    split = segments_flops(spec, [(0, 100), (100, 640)], 1)
    assert split > gdn_only.flops(640)
    assert abs(split - gdn_only.flops(640) - layer_flops(spec, 0, 1)) < 1e-3


def test_model_flops_scale_the_replayed_layers_and_add_the_rest():
    spec = get_model("qwen3.5-9b")
    # aligned calls: equal to the simulator's FLOPs for the same tokens
    got = model_flops(spec, [(128, 640)], replayed_layers=4)
    want = spec.prefill_flops(128, 640)
    assert abs(got - want) < 1e-9 * want


def test_padding_is_the_unfilled_part_of_every_chunk_a_call_touches():
    """[100, 130) touches chunks 1 and 2 (2 chunks for 30 tokens), [130, 1000) chunks 2 to 15 (14
    for 870): 2 - 30/64 + 14 - 870/64 = 1.9375 chunks of padding, in each gated-delta layer."""
    spec = get_model("replay-tiny")
    assert padding_flops(spec, [(100, 130), (130, 1000)]) == spec.n_gdn * spec.gdn_chunk_flops * 1.9375
    assert padding_flops(spec, [(0, 640), (640, 640)]) == 0.0  # whole chunks, and an empty call
    assert padding_flops(get_model("marconi-7b"), [(100, 130)]) == 0.0  # Mamba2: priced per token


@pytest.mark.parametrize("model", ["replay-tiny", "replay-tiny-moe", "qwen3.5-9b", "qwen3-next-80b-a3b", "marconi-7b"])
def test_executed_flops_less_the_padding_are_the_cost_models_exactly(model):
    """The replay's executed count and the simulator's per-token one differ by the chunks' padding
    and nothing else, on every preset kind (gated-delta, MoE, Mamba2): the independent oracle is
    ``ModelSpec.prefill_flops``, the formula the simulator charges."""
    spec = get_model(model)
    for segs in ([(0, 1000)], [(500, 1000)], [(1234, 2000)], [(100, 130), (130, 1000)], [(63, 65)]):
        cost = sum(spec.prefill_flops(a, b) for a, b in segs)
        assert model_flops(spec, segs) - padding_flops(spec, segs) == pytest.approx(cost, rel=1e-12)


def test_the_flops_line_says_what_the_chunks_make_of_the_difference():
    from sim.cli.replay import flops_line

    s = {"measured_flops_saved": 2.834e9, "simulated_flops_saved": 2.845e9, "padding_flops_saved": -1.1e7}
    assert flops_line(s) == "executed 2.834e+09, simulated 2.845e+09 (-1.100e+07 from the kernel's 64-token chunks)"
    s["padding_flops_saved"] = -1.0e7  # 1e6 not explained: said
    assert flops_line(s).endswith("(-1.000e+07 from the kernel's 64-token chunks, -1.000e+06 otherwise)")
    s["padding_flops_saved"] = 0.0  # whole chunks (or a Mamba2 model): the two figures alone
    assert flops_line(s) == "executed 2.834e+09, simulated 2.845e+09"


def test_a_mamba2_models_replayed_layers_are_priced_per_token_as_the_cost_model_prices_them():
    """``marconi-7b`` replays its Mamba2 layers in the gated-delta slot (``counts["gated_delta"]``):
    one attention and three Mamba2 layers, no MLP named, over two calls, cost exactly what the cost
    model charges a model of those layers for the same tokens (a missing kind counts 0)."""
    spec = get_model("marconi-7b")
    segs = [(0, 100), (100, 357)]
    want = sum(replace(spec, n_attn=1, n_mamba=3, n_mlp=0).prefill_flops(a, b) for a, b in segs)
    assert replayed_flops(spec, {"attention": 1, "gated_delta": 3}, segs) == pytest.approx(want, rel=1e-12)
    assert replayed_flops(spec, {"gated_delta": 2}, [(0, 64)]) == 2 * spec.mamba_layer_a * 64
    # a gated-delta model's MLP-less count: attention and gated-delta layers only
    tiny = get_model("replay-tiny")
    no_mlp = replayed_flops(tiny, {"attention": 1, "gated_delta": 1}, [(0, 64)])
    assert no_mlp == replayed_flops(tiny, {"attention": 1, "gated_delta": 1, "mlp": 0}, [(0, 64)])
    assert no_mlp + tiny.mlp_layer_a * 64 == replayed_flops(
        tiny, {"attention": 1, "gated_delta": 1, "mlp": 1}, [(0, 64)]
    )
