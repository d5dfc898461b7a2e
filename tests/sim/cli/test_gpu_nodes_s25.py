"""Tensor-parallel groups beyond one server (session 25): a group larger than a GPU's server
(``sim.gpus.GPU.node_gpus``: 8 on an HGX board) all-reduces over each GPU's network card, not
NVLink (16 H100s were priced at NVLink's 450 GB/s each way, as if one switch held them); the
default group stays in one server where one holds the weights; the outputs say when a group spans
servers. By hand: a ring of tp GPUs moves 2 (tp - 1) / tp of the buffer at its slowest hop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from refusals import one_line
from sim.cli import main
from sim.cost import NODE_WEIGHT_SHARE, default_timing, get_model, gpu_count
from sim.gpus import ALLREDUCE_LATENCY_S, GPUS, allreduce_s, get_gpu, group_link_bytes_per_s, node_words

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


def test_sixteen_h100s_all_reduce_at_the_network_cards_50_gb_s():
    h100 = get_gpu("h100")
    # one layer's activations of an 8192-token prefill of qwen3.5-397b-a17b: 4096 x 2 B x 8192
    layer = 4096 * 2 * 8192
    assert layer == 67_108_864
    # 16 GPUs, two servers of 8: 2 x 15/16 of 64 MiB at 50 GB/s = 2.5165824 ms, plus 10 us
    assert allreduce_s(h100, layer, 16) == pytest.approx(10e-6 + 2.5165824e-3, rel=1e-12)
    assert allreduce_s(h100, 1e6, 16) == pytest.approx(47.5e-6, rel=1e-12)  # 10 + 1.875e6 / 50e9 s
    # 8, one server: NVLink's 450 GB/s each way, as before (2 x 7/8 x 1 MB / 450 GB/s = 3.888... us)
    assert allreduce_s(h100, 1e6, 8) == ALLREDUCE_LATENCY_S + 2 * (7 / 8) * 1e6 / 450e9
    assert group_link_bytes_per_s(h100, 8) == 900e9 and group_link_bytes_per_s(h100, 16) == 100e9
    # A100 (DGX A100: 200 Gb/s HDR a GPU) and the PCIe servers of 8 (200 Gb/s a GPU): 25 GB/s each
    # way; L40S's PCIe Gen4 (32 GB/s each way) is the faster hop there
    for name in ("a100", "a100-40gb", "l40s", "h100-pcie", "h100-nvl", "h200-nvl"):
        assert allreduce_s(get_gpu(name), 1e6, 16) == pytest.approx(10e-6 + 1.875e6 / 25e9, rel=1e-12), name
    # a GH200 server holds one superchip: two of them are two servers
    assert allreduce_s(get_gpu("gh200"), 1e6, 2) == pytest.approx(10e-6 + 1e6 / 50e9, rel=1e-12)
    # within a server nothing changed: the 4-way bridge, then PCIe Gen5 (64 GB/s each way)
    assert allreduce_s(get_gpu("h200-nvl"), 1e6, 8) == ALLREDUCE_LATENCY_S + 2 * (7 / 8) * 1e6 / 64e9


def test_the_timing_of_a_group_of_two_servers_by_hand():
    spec = get_model("qwen3.5-397b-a17b")
    blocks = spec.n_attn + spec.n_gdn + spec.n_mamba + spec.n_mlp  # 15 + 45 + 60 = 120
    assert blocks == 120 and spec.d_model == 4096
    t16, t8 = default_timing(spec.name, "h100", 16), default_timing(spec.name, "h100", 8)
    # a token's 8 KiB all-reduced 120 times: 120 x 2 x 15/16 x 8192 B / 50 GB/s = 36.864 us
    assert t16.comm_ms_per_token == pytest.approx(36.864e-3, rel=1e-9)
    assert t8.comm_ms_per_token == pytest.approx(120 * 2 * (7 / 8) * 8192 / 450e9 * 1e3, rel=1e-9)
    assert t16.comm_ms_per_call == t8.comm_ms_per_call == pytest.approx(1.2)  # 120 x 10 us either way
    assert "(2 nodes of 8: all-reduce over the inter-node link, 50 GB/s each way)" in t16.source
    assert "nodes" not in t8.source


@pytest.mark.parametrize("name", sorted(GPUS))
def test_a_group_in_one_server_never_all_reduces_slower_than_one_across_servers(name):
    """The same bytes over more GPUs of one server are never priced slower than over a group that
    spans servers, whose ring is never faster than one GPU's network card."""
    g = get_gpu(name)
    assert 1 <= g.node_gpus <= 64 and 0 < g.node_link_bytes_per_s <= g.link_bytes_per_s
    inside = range(2, g.node_gpus + 1)
    across = range(g.node_gpus + 1, 65)
    for k in across:
        assert group_link_bytes_per_s(g, k) <= g.node_link_bytes_per_s, k
    for k in inside:
        for m in across:
            assert group_link_bytes_per_s(g, k) >= group_link_bytes_per_s(g, m), (k, m)
            assert allreduce_s(g, 1e6, k) <= allreduce_s(g, 1e6, m), (k, m)
    # and per GPU more of them never all-reduce faster (the ring's share grows, its links do not)
    times = [allreduce_s(g, 1e6, k) for k in range(2, 65)]
    assert times == sorted(times)


def test_node_words():
    assert node_words(get_gpu("h100"), 8) == ""
    assert node_words(get_gpu("h100"), 16) == "2 nodes of 8: all-reduce over the inter-node link, 50 GB/s each way"
    assert node_words(get_gpu("l40s"), 12) == (
        "2 nodes (8 a node, 4 on the last): all-reduce over the inter-node link, 25 GB/s each way"
    )


def _experts(tmp_path, n: int) -> str:
    # Qwen3-Next's shapes with n experts: 0.305 GB of bf16 weights an expert (48 layers of 3 x 2048 x 512)
    cfg = json.loads((CONFIGS / "qwen3-next-80b-a3b.json").read_text())
    cfg["num_experts"] = n
    path = tmp_path / f"experts-{n}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_the_default_group_stays_in_one_server_that_holds_the_weights(tmp_path):
    """549GB of bf16 weights on H100s (8 x 80GiB = 687GB): 3/4 of 8 GPUs (515GB) is too little, so
    the default group was 16, across two servers; 8 hold them in 0.80 of their memory, a cache left
    under every engine's fraction: 8."""
    spec = get_model(_experts(tmp_path, 1800))
    h100 = get_gpu("h100")
    assert 0.75 < spec.total_params * 2 / (8 * h100.memory_bytes) < NODE_WEIGHT_SHARE
    assert gpu_count(spec, "h100") == 8
    # 609GB: 0.886 of one server, beyond SGLang's 0.88 (no cache there): two servers, as before
    big = get_model(_experts(tmp_path, 2000))
    assert big.total_params * 2 / (8 * h100.memory_bytes) > NODE_WEIGHT_SHARE
    assert gpu_count(big, "h100") == 16


def test_node_weight_share_leaves_every_engine_a_cache():
    from sim.experiments.advise.space import ENGINES

    for engine in ENGINES.values():
        m = engine.memory
        assert m.cache_bytes(10**12, int(NODE_WEIGHT_SHARE * 10**12) - 10**9) > 0, engine.name


SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]


def test_advise_recommends_one_server_not_two(runner, tmp_path):
    path = _experts(tmp_path, 1800)
    args = ["advise", "--for", "sglang", "--model", path, "--gpu", "h100", *SMALL, "--trials", "1", "--workers", "1"]
    res = runner.invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "| GPU 8x h100 | --gpu-memory 640GiB" in res.stdout  # no "= 2 nodes"
    assert "--tp-size 8" in res.stdout and "nodes" not in res.stdout


def test_a_group_across_servers_says_so_in_one_line(runner, tmp_path):
    words = "2 nodes of 8: all-reduce over the inter-node link, 50 GB/s each way"
    model = ["--model", "qwen3.5-397b-a17b", "--gpu", "h100"]
    # the refusal that names the group
    one_line(
        runner.invoke(main, ["run", *model, *SMALL]),
        "qwen3.5-397b-a17b's bf16 weights (794GB) are more than the memory of 8x h100 (640GiB = 687.2GB): give "
        f"--tensor-parallel 16 (the smallest group that holds them and splits its heads; 16 GPUs = {words})",
    )
    res = runner.invoke(main, ["run", *model, "--tensor-parallel", "16", "--policy", "vllm", *SMALL])
    assert res.exit_code == 0, res.output
    assert f"| GPU 16x h100 = {words} |" in res.output.splitlines()[0]
    adv = ["advise", "--for", "vllm", *model, "--tensor-parallel", "16", *SMALL, "--trials", "1", "--workers", "1"]
    res = runner.invoke(main, [*adv, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    header = res.stdout.splitlines()[0]
    assert f"| GPU 16x h100 = {words} |" in header
    assert sum(words in line for line in res.stdout.splitlines()) == 1
    data = json.loads((tmp_path / "a" / "advice.json").read_text())
    assert (data["gpus"], data["gpu_nodes"]) == ("16x h100", words)
    # one server: nothing said
    res = runner.invoke(main, ["run", *model[:2], "--gpu", "h200", "--policy", "vllm", *SMALL])
    assert res.exit_code == 0, res.output
    assert "| GPU 8x h200 | " in res.output and "nodes" not in res.output
