"""A new user's own model, GPU and traces (session 21): what ran that a real deployment could not
hold, or said less than the user needs, through the real CLI in process."""

from __future__ import annotations

import pytest

from refusals import one_line
from sim.cli import main

SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]


@pytest.mark.parametrize(
    "capacity, ok",
    [("60GB", False), ("31.9GB", False), ("31899345920", True), ("inf", True)],
)
def test_a_cache_that_fits_beside_the_weights_no_more_is_refused(runner, capacity, ok):
    """qwen3.5-27b's bf16 weights are 54GB: on one 80GiB H100 (85,899,345,920 B) a 60GB cache fits
    alone but not beside them (it ran); 31,899,345,920 B still fits, and inf (no limit) is not a size."""
    args = ["run", *SMALL, "--model", "qwen3.5-27b", "--gpu", "h100", "--capacity", capacity]
    res = runner.invoke(main, args)
    if ok:
        assert res.exit_code == 0, res.output
    else:
        one_line(
            res,
            f"--capacity {capacity} and qwen3.5-27b's bf16 weights (54GB) are more than the memory of 1x h100 "
            "(80GiB = 85.9GB): at most 31.9GB is left for the cache; lower it, or give --tensor-parallel for a larger group",
        )


def test_the_group_holds_the_cache_beside_its_weights(runner):
    """Two H100s hold qwen3.5-27b's weights and a 60GB cache (160GB)."""
    args = ["run", *SMALL, "--model", "qwen3.5-27b", "--gpu", "h100", "--tensor-parallel", "2"]
    res = runner.invoke(main, [*args, "--capacity", "60GB"])
    assert res.exit_code == 0, res.output


def _ttft(runner, tmp_path, name, extra):
    import pandas as pd

    out = tmp_path / name
    args = ["run", *SMALL[:-2], "--policy", "vanilla", "--model", "qwen3.5-9b", "--mode", "sequential"]
    res = runner.invoke(main, [*args, "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    return res.output.splitlines()[0], pd.read_parquet(out / "requests.parquet")["ttft_s"].tolist()


def test_a_timing_file_is_split_over_the_tensor_parallel_group(runner, tmp_path):
    """--timing FILE with --tensor-parallel 8 timed one GPU's prefills (the same TTFT at 1, 2 and
    8 GPUs: only the KV bytes changed); the file's one-GPU times are now split over the group as
    the default timing of its device is: the committed H200 file at 8 GPUs times every request as
    --gpu h200 --tensor-parallel 8 does, and faster than on one GPU."""
    from sim.cost import H200_TIMING_FILE

    head, file8 = _ttft(runner, tmp_path, "f8", ["--timing", str(H200_TIMING_FILE), "--tensor-parallel", "8"])
    assert f"timing {H200_TIMING_FILE} on 8 GPUs (tensor parallel) |" in head
    _, gpu8 = _ttft(runner, tmp_path, "g8", ["--gpu", "h200", "--tensor-parallel", "8"])
    _, file1 = _ttft(runner, tmp_path, "f1", ["--timing", str(H200_TIMING_FILE)])
    assert file8 == pytest.approx(gpu8, rel=1e-12)
    assert all(a < 0.6 * b for a, b in zip(file8, file1))


def test_a_timing_file_without_a_gpu_cannot_price_a_groups_all_reduces(runner, tmp_path):
    import json

    f = tmp_path / "cpu.json"
    f.write_text(
        json.dumps({"format": "marconi-timing/1", "effective_tflops": 1.0, "overhead_ms": 1, "decode_ms_per_token": 1})
    )
    res = runner.invoke(main, ["run", *SMALL, "--model", "qwen3.5-9b", "--timing", str(f), "--tensor-parallel", "2"])
    one_line(
        res,
        f"--tensor-parallel 2 needs the GPU timing file {f} was calibrated on (to price its all-reduces), and the "
        "file names none: leave out one of them",
    )
    # on one GPU (or --tensor-parallel 1) the file's times are used as they are
    for extra in ([], ["--tensor-parallel", "1"]):
        ok = runner.invoke(main, ["run", *SMALL, "--model", "qwen3.5-9b", "--timing", str(f), *extra])
        assert ok.exit_code == 0, ok.output


def test_an_untuned_auto_alpha_is_not_called_a_hindsight_optimum(runner):
    """alpha auto on a run whose cache never evicted (the duel tuner never decided) printed
    "marconi: best static alpha in hindsight 0", the oracle's words, though no oracle ran; the
    oracle keeps them."""
    res = runner.invoke(main, ["run", *SMALL[:-2], "--policy", "marconi,marconi-oracle"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-2:] == [
        "marconi: alpha auto stayed at 0 (not tuned: the cache never evicted)",
        "marconi-oracle: best static alpha in hindsight 0",
    ]


@pytest.mark.parametrize(
    "gpu, gpus, note", [(["--gpu", "b200"], "1x b200", "uncalibrated for GPU b200"), ([], None, "")]
)
def test_advise_json_says_which_gpus_priced_it(runner, tmp_path, gpu, gpus, note):
    """advise --format json (and advice.json) named no GPU and said nothing of a datasheet scaling
    the table's header reports ("| GPU 1x b200 | ... | uncalibrated for GPU b200")."""
    import json

    pytest.importorskip("optuna")
    out = tmp_path / "adv"
    args = ["advise", "--for", "vllm", "--model", "qwen3.5-9b", "--gpu-memory", "80GB", "--trials", "2"]
    args += ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--format", "json", "--out", str(out)]
    res = runner.invoke(main, [*args, *gpu])
    assert res.exit_code == 0, res.output
    for data in (json.loads(res.stdout), json.loads((out / "advice.json").read_text())):
        assert (data["gpus"], data["timing_note"]) == (gpus, note)


def test_report_says_which_rows_gpus_are_uncalibrated(runner, tmp_path):
    """The sweep's and the run's headers say "uncalibrated for GPU b200"; `marconi report` of their
    folders printed the rows alone. It now ends with that note where its rows hold such a GPU."""
    sweep = tmp_path / "sweep"
    args = ["sweep", *SMALL, "--alpha", "0", "--model", "qwen3.5-9b", "--gpu", "h100,b200", "--workers", "1"]
    res = runner.invoke(main, [*args, "--out", str(sweep)])
    assert res.exit_code == 0, res.output
    rep = runner.invoke(main, ["report", str(sweep)])
    assert rep.exit_code == 0 and rep.output.splitlines()[-1] == "note: uncalibrated for GPU b200", rep.output
    h100 = runner.invoke(main, ["report", str(sweep), "--where", "gpu=h100"])
    assert h100.exit_code == 0 and "uncalibrated" not in h100.output, h100.output
    run = tmp_path / "run"
    res = runner.invoke(main, ["run", *SMALL, "--model", "qwen3.5-9b", "--gpu", "l40s", "--out", str(run)])
    assert res.exit_code == 0, res.output
    rep = runner.invoke(main, ["report", str(run)])
    assert rep.output.splitlines()[-1] == "note: uncalibrated for GPU l40s", rep.output


def test_weights_that_fill_the_group_leave_no_cache(runner):
    """qwen3-next-80b-a3b's bf16 weights are 160GB exactly: its preset's 2 GPUs of H100 (2 x 80GiB,
    171.8GB) hold them and 11.8GB of cache. Weights that fill the group exactly passed the weights
    check (not more than the memory) and then said "at most 0B is left for the cache"; they are
    refused with the group that holds them."""
    res = runner.invoke(main, ["run", *SMALL, "--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--capacity", "12GB"])
    one_line(res, "--capacity 12GB and qwen3-next-80b-a3b's bf16 weights (160GB) are more than the memory of 2x h100")
    assert "at most 11.8GB is left for the cache" in res.output
    ok = runner.invoke(main, ["run", *SMALL, "--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--capacity", "11GB"])
    assert ok.exit_code == 0, ok.output
    import sim.experiments.advise.space as space

    with pytest.MonkeyPatch.context() as mp:  # weights of exactly 2 x 80GiB
        mp.setattr(space, "weight_bytes", lambda spec: 160 * 2**30)
        res = runner.invoke(main, ["run", *SMALL, "--model", "qwen3-next-80b-a3b", "--gpu", "h100"])
        one_line(
            res,
            "qwen3-next-80b-a3b's bf16 weights (172GB) fill the memory of 2x h100 (160GiB = 171.8GB): give --tensor-parallel 4 "
            "(the smallest group that holds them and splits its heads)",
        )
        ok = runner.invoke(
            main, ["run", *SMALL, "--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--tensor-parallel", "4"]
        )
        assert ok.exit_code == 0, ok.output


def test_gpu_memory_after_the_weights_must_fit_beside_them(runner):
    """sglang's --gpu-memory is the memory the engine splits after the weights (as --capacity is the
    cache): 70GB beside qwen3.5-27b's 54GB of weights on one 80GB H100 ran; the 16.4GB advise
    derives for that GPU runs."""
    args = ["run", *SMALL[:-2], "--policy", "sglang", "--model", "qwen3.5-27b", "--gpu", "h100"]
    one_line(
        runner.invoke(main, [*args, "--gpu-memory", "70GB"]),
        "--gpu-memory 70GB and qwen3.5-27b's bf16 weights (54GB) are more than the memory of 1x h100 (80GiB = 85.9GB): "
        "at most 31.9GB is left for the cache",
    )
    ok = runner.invoke(main, [*args, "--gpu-memory", "16.4GB"])
    assert ok.exit_code == 0, ok.output


def test_the_header_counts_one_session_in_the_singular(runner):
    """`--session-range 4:5` ran "13 requests, 1 sessions"."""
    res = runner.invoke(main, ["run", *SMALL, "--session-range", "1:2"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("trace synthetic:chat: 2 requests, 1 session | "), res.output


def test_requests_run_beyond_the_capacity_are_said(runner, tmp_path):
    """A request too large to fit in --capacity even alone runs anyway (docs/batching.md), counted
    in summary.json's memory_overshoots; the table said nothing of it. replay-tiny's 612-token
    first prompt holds 612 x 64 B of KV and a 7,296 B state: more than 20KB."""
    import json

    from sim.config import format_size

    args = ["run", *SMALL[:-2], "--policy", "sglang+", "--model", "replay-tiny"]
    res = runner.invoke(main, [*args, "--capacity", "20KB", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    (row,) = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert row["memory_overshoots"] > 0 and row["peak_charged_bytes"] > 612 * 64 + 7296 > 20_000
    assert res.output.splitlines()[-1] == (
        "note: running requests too large to fit even alone ran beyond --capacity 20KB (charged, not refused): "
        f"sglang+ {row['memory_overshoots']:,} steps, peak {format_size(row['peak_charged_bytes'])}"
    )
    ample = runner.invoke(main, [*args, "--capacity", "1GB"])
    assert ample.exit_code == 0 and "beyond --capacity" not in ample.output, ample.output


def test_a_sweep_refuses_a_policy_off_its_hash_block_traces_blocks_before_running(runner, tmp_path):
    """--trace synthetic:chat,mooncake:sample --policy sglang+,vllm+ simulated the synthetic
    configurations, then stopped on vllm+'s 32-token checkpoints on Mooncake's 512-token blocks
    (a rerun stopped there again); it is refused before anything runs, as `marconi run` does, and
    --hash-block-tokens (the trace spelled out as tokens) runs it."""
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", "synthetic:chat:sessions=2,turns=2,mooncake:sample", "--session-range", "0:4"]
    args += ["--policy", "sglang+,vllm+", "--model", "qwen3.5-9b", "--capacity", "40GB", "--workers", "1"]
    res = runner.invoke(main, [*args, "--no-progress", "--out", str(out)])
    one_line(
        res,
        "--trace mooncake:sample: policy vllm+ checkpoints every 32 tokens, finer than (or not a multiple of) the "
        "trace's 512-token blocks",
    )
    assert not out.exists()


def test_a_default_sweep_over_a_token_and_a_hash_block_trace_runs_whole(runner, tmp_path):
    """The default policy list keeps vllm+ when the grid holds a token trace; on Mooncake's
    512-token blocks its configuration stopped the sweep (exit 2, the rest unrun, again on a rerun).
    It is left out there alone, and every other configuration runs."""
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", "synthetic:chat:sessions=2,turns=2,mooncake:sample", "--session-range", "0:2"]
    args += ["--alpha", "0", "--model", "qwen3.5-9b", "--capacity", "40GB", "--workers", "1", "--no-progress"]
    res = runner.invoke(main, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == "vllm+ on mooncake:sample left out: checkpoints finer than the trace's blocks"
    assert "ran 5 configurations" in res.output and len(list(out.glob("*.parquet"))) == 5
