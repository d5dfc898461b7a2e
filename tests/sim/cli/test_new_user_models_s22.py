"""A new user's own model and GPU (session 22): models from their config.json, the GPU catalogue,
through the real CLI in process."""

from __future__ import annotations

from refusals import one_line
from sim.cli import main

ADVISE = ["advise", "--for", "vllm", "--trace", "synthetic:chat:sessions=2,turns=2", "--trials", "2", "--no-progress"]


def test_advise_weights_beyond_the_default_group_name_the_group_that_holds_them(runner, tmp_path):
    """advise --gpu h100 on qwen3-next-80b-a3b (no --gpu-memory, no --tensor-parallel) said
    "--gpu-memory 160GB leaves no cache", a --gpu-memory the user never gave, and no way out; run
    names the group that holds the weights, and advise now says the same. Its 2 H100s hold the
    160GB (2 x 80GiB = 171.8GB), but the engine's fraction of them does not (vLLM 0.9: 154.6GB)."""
    res = runner.invoke(main, [*ADVISE, "--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--out", str(tmp_path / "a")])
    one_line(
        res,
        "qwen3-next-80b-a3b's bf16 weights (160GB) leave no cache in --gpu-memory-utilization 0.9 of 2x h100 "
        "(160GiB = 171.8GB): give --tensor-parallel 4 (the smallest group that leaves a cache and splits its heads)",
    )
    assert not (tmp_path / "a").exists()


def test_a_quantized_config_is_priced_at_its_weights(runner, tmp_path):
    """An fp8 checkpoint of Nemotron-H 8B (compressed-tensors) was priced at 16.2GB of bf16 weights;
    its layers' 7.03B weights take a byte each, the 1.07B of vocabulary tables two: 9.17GB."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(__file__).resolve().parents[2] / "data" / "configs" / "nemotron-h-8b.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}},
        "ignore": ["lm_head"],
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "sglang"]
    res = runner.invoke(main, [*args, "--model", str(tmp_path), "--gpu", "l40s", "--gpu-memory", "45GB"])
    one_line(
        res,
        f"--gpu-memory 45GB and {tmp_path}'s fp8 weights (9.17GB) are more than the memory of 1x l40s (48GiB = 51.54GB): "
        "at most 42.4GB is left for the cache",
    )


def test_run_header_names_a_group_that_splits_the_heads(runner, tmp_path):
    """A 132B Falcon-H1-shaped config (12 attention heads) on H100 with no --tensor-parallel was
    priced on "GPU 8x h100", a group vLLM refuses (12 heads do not split 8 ways): its 264GB of
    weights need more than 4 H100s (3/4 of 4 x 80GiB is 258GB), and 6 split the heads."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(__file__).resolve().parents[2] / "data" / "configs" / "falcon-h1-7b.json").read_text())
    cfg["intermediate_size"] = 12288 * 26
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "sglang+"]
    res = runner.invoke(main, [*args, "--model", str(tmp_path), "--gpu", "h100"])
    assert res.exit_code == 0, res.output
    assert " | GPU 6x h100 | " in res.output.splitlines()[0]
