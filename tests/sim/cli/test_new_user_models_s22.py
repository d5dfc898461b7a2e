"""A new user's own model and GPU (session 22): models from their config.json, the GPU catalogue,
through the real CLI in process."""

from __future__ import annotations

from refusals import one_line
from sim.cli import main

ADVISE = ["advise", "--for", "vllm", "--trace", "synthetic:chat:sessions=2,turns=2", "--trials", "2", "--no-progress"]


def test_advise_weights_beyond_the_default_group_name_the_group_that_holds_them(runner, tmp_path):
    """advise --gpu h100 on qwen3-next-80b-a3b (no --gpu-memory, no --tensor-parallel) said
    "--gpu-memory 160GB leaves no cache", a --gpu-memory the user never gave, and no way out; run
    names the group that holds the weights, and advise now says the same."""
    res = runner.invoke(main, [*ADVISE, "--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--out", str(tmp_path / "a")])
    one_line(
        res,
        "qwen3-next-80b-a3b's bf16 weights (160GB) fill the memory of 2x h100 (160GB): give --tensor-parallel 4 "
        "(the smallest group that holds them and splits its heads)",
    )
    assert not (tmp_path / "a").exists()
