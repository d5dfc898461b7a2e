"""A new user's own model, GPU and traces (session 21): what ran that a real deployment could not
hold, or said less than the user needs, through the real CLI in process."""

from __future__ import annotations

import pytest

from refusals import one_line
from sim.cli import main

SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]


@pytest.mark.parametrize(
    "capacity, ok",
    [("60GB", False), ("26.1GB", False), ("26GB", True), ("inf", True)],
)
def test_a_cache_that_fits_beside_the_weights_no_more_is_refused(runner, capacity, ok):
    """qwen3.5-27b's bf16 weights are 53.9GB: on one 80GB H100 a 60GB cache fits alone but not
    beside them (it ran); 26GB still fits, and inf (no limit) is not a size."""
    args = ["run", *SMALL, "--model", "qwen3.5-27b", "--gpu", "h100", "--capacity", capacity]
    res = runner.invoke(main, args)
    if ok:
        assert res.exit_code == 0, res.output
    else:
        one_line(
            res,
            f"--capacity {capacity} and qwen3.5-27b's bf16 weights (54GB) are more than the memory of 1x h100 "
            "(80GB): at most 26GB is left for the cache; lower it, or give --tensor-parallel for a larger group",
        )


def test_the_group_holds_the_cache_beside_its_weights(runner):
    """Two H100s hold qwen3.5-27b's weights and a 60GB cache (160GB)."""
    args = ["run", *SMALL, "--model", "qwen3.5-27b", "--gpu", "h100", "--tensor-parallel", "2"]
    res = runner.invoke(main, [*args, "--capacity", "60GB"])
    assert res.exit_code == 0, res.output
