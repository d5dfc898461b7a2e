"""A sweep over a policy knob that some of its policies do not read (session 25): `sweep --policy
sglang,vllm --gpu-memory 20GB,40GB` ran vllm once per --gpu-memory value (vllm reads --capacity,
not --gpu-memory: `run --policy vllm --gpu-memory 20GB` is refused as doing nothing) and showed two
vllm rows of the same numbers, one under each memory. Such a policy now runs once, at the knob's
default (the run it is: the same configuration id as without the knob), and the grid line says why."""

from __future__ import annotations

from sim.cli import main
from sim.experiments.grid import expand_grid, make_task, unread_knobs

SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]


def test_a_policy_runs_once_over_a_knob_it_does_not_read():
    tasks = expand_grid({}, {"policy": ["sglang", "vllm"], "gpu_memory": ["20GB", "40GB"]})
    assert [(t.config.policy, t.config.gpu_memory) for t in tasks] == [
        ("sglang", "20GB"),
        ("sglang", "40GB"),
        ("vllm", ""),
    ]
    # vllm's one run is the run without --gpu-memory (a results folder of it is reused)
    assert tasks[2].config_id == make_task({}, policy="vllm").config_id
    assert "gpu_memory" in unread_knobs("vllm") and "gpu_memory" not in unread_knobs("sglang")
    # a knob multiplies the runs of the policies that read it: vllm over its retention interval, sglang once
    tasks = expand_grid({}, {"policy": ["vllm", "sglang"], "prefix_cache_retention_interval": [0, 16]})
    assert [(t.config.policy, t.config.prefix_cache_retention_interval) for t in tasks] == [
        ("vllm", 0),
        ("vllm", 16),
        ("sglang", 0),
    ]


def test_the_sweep_shows_one_row_and_says_why(runner, tmp_path):
    args = ["sweep", *SMALL, "--policy", "sglang,vllm", "--gpu-memory", "20GB,40GB", "--out", str(tmp_path / "s")]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == (
        "grid: policy(2) x gpu_memory(2) = 3 configurations (4 grid points; vllm runs once over --gpu-memory, "
        "which it does not read) | trace synthetic:chat:sessions=2,turns=2 | model marconi-7b"
    )
    rows = [line.split() for line in lines if line.startswith(("sglang ", "vllm "))]
    assert [r[:2] for r in rows] == [["sglang", "20GB"], ["sglang", "40GB"], ["vllm", "33.78%"]]
    # alpha's own reason is kept beside it
    res = runner.invoke(
        main, [*args[:-1], str(tmp_path / "t"), "--policy", "sglang,vllm,marconi", "--alpha", "0,1", "--dry-run"]
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].startswith(
        "grid: policy(3) x alpha(2) x gpu_memory(2) = 5 configurations (12 grid points; policies that ignore "
        "alpha run once; vllm, marconi run once over --gpu-memory, which they do not read) | "
    )
