"""Executed FLOPs of replayed layers against the cost model's per-token formula."""

from dataclasses import replace

from sim.cost import get_model
from sim.replay.flops import chunks_of, layer_flops, model_flops, segments_flops


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
