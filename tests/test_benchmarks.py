"""Every script in benchmarks/ still runs (issue 20: two of them stopped parsing and nothing
noticed): each at its smallest size, or `--help` where it needs a GPU or minutes. The figures they
print are not checked here (they are measurements); only that the script runs to the end."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from forked_cli import shared_forks

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> (arguments of its smallest run, text its output must contain)
SMALLEST = {
    "sim_bench.py": (["--smoke"], "marconi"),
    "sweep_bench.py": (["--smoke"], "wall time"),
    "tuning_report.py": (
        ["--sessions", "2", "--capacities", "1", "--rates", "1", "--alpha-grid", "0:1:1", "--workers", "1"],
        "below sglang+",
    ),
    "trace_memory.py": (["--trace", "synthetic:chat", "--sessions", "2"], "cached load"),
    # the smallest module's sites (sim/cost.py's 953 took 12-15 CPU s to list: one compile each)
    "mutation.py": (["--list", "-m", "ssd_args", "--per-module", "2"], "ssd_args"),
    "validation_sensitivity.py": (
        ["--dtype", "fp32", "--scales", "0.01", "--prompt", "70", "--kernel", "torch"],
        "caught",
    ),
    # host issue vs device time per call shape (a GPU's figures; on a CPU a smoke run)
    "replay_cost_probe.py": (
        ["--model", "replay-tiny", "--device", "cpu", "--small", "--reps", "1", "--suffixes", "25", "--prefixes", "0"],
        "device ms",
    ),
    # what waited inside each timed call (a GPU's figures; on a CPU a smoke run: counts 0)
    "replay_stall_probe.py": (
        ["--", "--device", "cpu", "--model", "replay-tiny", "--requests", "3", "--mode", "sequential"]
        + ["--trace", "synthetic:chat:sessions=1,turns=3,prompt_tokens=150,user_tokens=20,output_tokens=8,prompts=1"],
        "timed calls probed",
    ),
    # kept replay runs re-priced with a timing file, the P95's requests and their causes (no GPU)
    "reprice_requests.py": (
        [str(ROOT / "benchmarks/results/2026-12-06-gpu-s16/matrix2"), "--quiet"],
        "without the measurement causes",
    ),
    # replay's contract per preset x trace x scheduler as a table (the real presets on a GPU)
    "replay_matrix.py": (
        ["--device", "cpu", "--models", "replay-tiny", "--traces", "agent", "--schedulers", "fcfs"]
        + ["--requests", "3", "--out", "matrix"],
        "| replay-tiny-agent-fcfs |",
    ),
    # the time model's own share of peak per preset x trace (no GPU); a preset without hardware terms is said so
    "replay_peak_share.py": (
        ["--models", "replay-tiny,marconi-7b", "--trace", "synthetic:chat:sessions=1,turns=2", "--requests", "2"],
        "marconi-7b           -                        its timing has no hardware terms",
    ),
    # need a GPU (kernel_bench, kernel_host_probe, kernel_launch_floor, replay_bench) or compile kernels for minutes
    # (kernel_resources is run by tests/kernels/test_resources.py): their command line at least
    "kernel_bench.py": (["--help"], "usage"),
    "replay_bench.py": (["--help"], "usage"),
    "kernel_resources.py": (["--help"], "usage"),
    "kernel_host_probe.py": (["--help"], "usage"),
    "kernel_launch_floor.py": (["--help"], "usage"),
    "ssd_bench.py": (["--help"], "usage"),
    "conv_bench.py": (["--help"], "usage"),  # the conv from zeros and from a state (a GPU), session 26
    "attn_bench.py": (["--help"], "usage"),  # the replay's attention against SDPA's other kernels (a GPU)
    # the peer backends' GPU check: its commands (the run needs a GPU and the peers)
    "peer_check.py": (["--dry-run"], "kernel_bench.py"),
    # needs an LMDeploy checkout and its dependencies (fetched outside CI)
    "differential_lmdeploy.py": (["--help"], "usage"),
    "differential_sglang.py": (["--help"], "usage"),  # needs SGLang's unpacked wheel (--sglang)
    "differential_vllm_split.py": (["--help"], "usage"),  # needs vLLM's scheduler.py (--vllm)
    "differential_vllm.py": (["--help"], "usage"),  # needs vLLM's unpacked wheel (--vllm)
    "differential_trtllm.py": (["--help"], "usage"),  # needs TensorRT-LLM's cache files (--trtllm)
    # the cross-preset time-model fit, on the committed H200 campaign (no GPU needed)
    "timing_fit.py": (
        [str(ROOT / "benchmarks" / "results" / "2026-12-04-timing-campaign-h200" / "after-moe-fix")],
        "fraction of peak",
    ),
}


# modules of this folder that the scripts import (not scripts themselves)
SHARED = {"differential_report.py"}


def test_every_benchmark_is_listed():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted([*SMALLEST, *SHARED])


def test_differential_agreement_counts_each_way_and_prints_the_scripts_line(monkeypatch):
    """``differential_report.Agreement``, the line every ``differential_*.py`` prints. Hand-worked:
    simulator hits 0, 64, 128, 512 against the engine's 0, 128, 128, 448: requests 1 and 3
    differ, the simulator lower on 1 and higher on 3; totals 704 and 704."""
    monkeypatch.syspath_prepend(str(BENCH))
    report = __import__("differential_report")
    a = report.Agreement.of([0, 64, 128, 512], [0, 128, 128, 448])
    assert (a.n, a.same, a.higher, a.lower, a.differing) == (4, 2, 1, 1, (1, 3))
    assert a.line("vllm", 6) == (
        "vllm   agrees on 2/4 requests (simulator higher on 1, lower on 1); hit tokens 704 vs engine 704"
    )
    assert a.counts(percent=True) == "agrees on 2/4 requests (50.0 %; simulator higher on 1, lower on 1)"
    assert report.Agreement.of([1_000], [1_000]).tokens() == "hit tokens 1,000 vs engine 1,000"
    with pytest.raises(ValueError, match="3 simulator hits against 2 engine hits"):
        report.Agreement.of([1, 2, 3], [1, 2])
    sys.modules.pop("differential_report", None)


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_size(script, tmp_path):
    args, expect = SMALLEST[script]
    if script == "sweep_bench.py":
        args = [*args, "--out", str(tmp_path / "results")]  # not a folder of its own under /tmp
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)  # kernel_resources refuses the interpreter even for --help
    # one torch thread: beside the other xdist worker, torch's default two spin against each other
    # (validation_sensitivity.py took 14.7 CPU s so, 3.6 on one thread)
    env.setdefault("OMP_NUM_THREADS", "1")
    # each script in a process of its own, forked from one with torch loaded (tests/cli_forkserver.py)
    rc, out, err = shared_forks(env, ("numpy", "pandas", "torch")).run(
        [str(BENCH / script), *args], timeout=300, cwd=tmp_path, script=BENCH / script
    )
    assert rc == 0, err[-2000:]
    assert expect in out, out[-2000:]


def test_host_time_column_is_the_median_of_seven_runs(monkeypatch):
    """``kernel_bench``'s and ``kernel_host_probe``'s host figure: the median of seven runs of the
    busy-queue measure (a single run swung by up to 2x on the lent hosts), clean only if every run
    kept the device busy."""
    monkeypatch.syspath_prepend(str(BENCH))
    bench = __import__("kernel_bench")
    runs = iter([(5.0, True), (1.0, True), (9.0, False), (3.0, True), (7.0, True), (2.0, True), (8.0, True)])
    monkeypatch.setattr(bench, "host_overhead_us", lambda torch, fn, calls: next(runs))
    assert bench.host_us_median(None, None, 20) == (5.0, False)
    monkeypatch.setattr(bench, "host_overhead_us", lambda torch, fn, calls: (4.0, True))
    assert bench.host_us_median(None, None, 20, repeats=3) == (4.0, True)
    sys.modules.pop("kernel_bench", None)


def test_trtllm_differential_splits_capacity_as_the_engine_sizes_its_pools(monkeypatch):
    """``differential_trtllm.pool_slots``: TensorRT-LLM's V2 Mamba manager describes a typical
    request as ``1 + fixed_rules`` descriptors sharing ``avg_seq_len`` tokens
    (``mamba_cache_manager_v2.py`` ``_typical_request_descs``) and the storage manager splits the
    quota by the bytes they need (``_storage_manager.py`` ``ratio_from_batch`` /
    ``_compute_slots_for_batch``: ceil(tokens / tokens_per_block) attention pages per descriptor,
    one recurrent page each). Hand-worked: 10 tokens, one end offset -> two descriptors of 5
    tokens -> 2 + 2 pages of 4 tokens (16 bytes) against 2 states (20 bytes); of 1,000 bytes the
    attention pool gets 1000 * 16/36 = 444.4 bytes = 111 pages, the recurrent pool 555.6 = 55."""
    monkeypatch.syspath_prepend(str(BENCH))
    bench = __import__("differential_trtllm")
    assert bench.pool_slots(1000, 1, 10, 4, 10, 1) == {bench.ATTN: 111, bench.SSM: 55}
    # no fixed offset: one descriptor of 10 tokens -> 3 pages (12 bytes) against one state (10)
    assert bench.pool_slots(1000, 1, 10, 4, 10, 0) == {bench.ATTN: 136, bench.SSM: 45}
    sys.modules.pop("differential_trtllm", None)


def _load_benchmark(name: str):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / name
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replay_matrix_share_of_peak_is_a_percentage(monkeypatch):
    """The matrix's share of peak on a GPU: the replay's peak table is in TFLOP/s, as the summary's
    executed TFLOP/s are (the H100 run of 2026-12-05 printed "298.5 (30181669336228.1 %)": the
    peak was divided by 1e12 once more). 494.5 of an H100's 989 is 50.0 %."""
    torch = pytest.importorskip("torch")
    matrix = _load_benchmark("replay_matrix.py")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    peak = matrix.peak_of("cuda")
    assert peak == 989.0 and matrix.peak_of("cpu") == 0.0
    summary = {
        "hits": 3, "hits_validated": 3, "kv_hits_validated": 3, "failures": 0, "measured_flops_saved": 2.0e12,
        "simulated_flops_saved": 2.0e12, "time_model_compared": False, "replay_tflops_timed": 494.5,
    }  # fmt: skip
    row = matrix.row("run", summary, peak)
    assert row[-1] == "494.5 (50.0 %)" and row[6] == "not compared"
    assert matrix.row("run", summary, 0.0)[-1] == "494.5"


@pytest.mark.parametrize("script", ["replay_bench.py", "ssd_bench.py"])
def test_gpu_benchmark_on_a_machine_without_cuda_says_so_in_one_line(script, tmp_path):
    """A GPU benchmark run where torch has no CUDA (this CI's CPU build) ends with one line on
    stderr and exit 2, not a traceback from its first device tensor (``replay_bench.py`` raised
    "Torch not compiled with CUDA enabled" from its ceilings step)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the benchmark would run")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    args = ["--model", "replay-tiny", "--requests", "2"] if script == "replay_bench.py" else ["--small"]
    rc, out, err = shared_forks(env, ("numpy", "pandas", "torch")).run(
        [str(BENCH / script), *args], timeout=300, cwd=tmp_path, script=BENCH / script
    )
    assert rc == 2, (out[-1000:], err[-1000:])
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "CUDA" in err, err


@pytest.mark.parametrize("model", ["replay-tiny", "qwen3.5-9b", "qwen3-next-80b-a3b", "nemotron-h-8b"])
def test_peak_share_prices_what_the_time_model_prices(model, monkeypatch):
    """``replay_peak_share.modelled_share``: its time per prefill is ``HardwareTiming.compute_ms``
    (the FLOP terms over every layer, an independent sum) and, on whole 64-token chunks, its FLOPs
    are the preset's ``flops(L)`` (the simulator's count); the preset's timing at one GPU."""
    monkeypatch.syspath_prepend(str(BENCH))
    bench = __import__("replay_peak_share")
    from sim.cost import default_timing, gdn_chunks, get_model

    spec = get_model(model)
    timing = bench.one_gpu(default_timing(model))
    assert timing.gpus == 1
    r = bench.modelled_share(spec, timing, [1024, 64])
    want_ms = sum(timing.compute_ms(spec, 0, L, gdn_chunks(0, L)) for L in (1024, 64))
    assert sum(r["ms"].values()) == pytest.approx(want_ms, rel=1e-12)
    assert sum(r["flops"].values()) == pytest.approx(spec.flops(1024) + spec.flops(64), rel=1e-9)
    assert r["quadratic"] == pytest.approx(spec.attn_layer_b * (1024**2 + 64**2) * spec.n_attn, rel=1e-12)
    sys.modules.pop("replay_peak_share", None)


def test_variant_specs_parse_the_same_for_both_kernel_benchmarks(monkeypatch, capsys):
    """``kernel_bench.parse_variants`` (``--variant``, repeatable, also ``ssd_bench.py``'s):
    ``NAME:VAR=VALUE[;VAR=VALUE]``, a value keeping its '=' and ','; a spec without a name or an
    assignment is one line and exit 2; ``environ`` gives the variables back after its block."""
    monkeypatch.syspath_prepend(str(BENCH))
    kb = __import__("kernel_bench")
    got = kb.parse_variants(["prep:KERNELS_CONFIG_SSD_STATE=PREP=1,BP=64", "two:A=1;B=x=y"])
    assert got == {"prep": {"KERNELS_CONFIG_SSD_STATE": "PREP=1,BP=64"}, "two": {"A": "1", "B": "x=y"}}
    for bad in ("bad", "x:", ":A=1", "x:A"):
        with pytest.raises(SystemExit) as exc:
            kb.parse_variants([bad])
        assert exc.value.code == 2
        assert capsys.readouterr().err.strip() == f"--variant {bad!r}: expected NAME:VAR=VALUE[;VAR=VALUE]"
    monkeypatch.setenv("MARCONI_TEST_KEPT", "before")
    monkeypatch.delenv("MARCONI_TEST_NEW", raising=False)
    with kb.environ({"MARCONI_TEST_KEPT": "inside", "MARCONI_TEST_NEW": "1"}):
        assert (os.environ["MARCONI_TEST_KEPT"], os.environ["MARCONI_TEST_NEW"]) == ("inside", "1")
    assert os.environ["MARCONI_TEST_KEPT"] == "before" and "MARCONI_TEST_NEW" not in os.environ
    sys.modules.pop("kernel_bench", None)


def test_ssd_bench_table_rows(monkeypatch):
    """``ssd_bench``'s rows print as each shape and length is measured (a run cut by its time limit
    keeps them, session 18): one row's columns, ratios to two places, '-' where no peer ran."""
    monkeypatch.syspath_prepend(str(BENCH))
    bench = __import__("ssd_bench")
    r = dict(shape="marconi-7b", T=4096, mode="states", plain_ms=0.3191, graph_ms=0.308, ratio_plain=0.7168)
    line = bench._table_row(dict(r, ratio_graph=1.0402))
    assert line.split() == ["marconi-7b", "4096", "states", "0.319", "0.308", "0.72", "1.04", "-"]
    assert bench._table_row(dict(r, ratio_plain=None, ratio_graph=None)).split()[-3:] == ["-", "-", "-"]
    # the ratio to the faster state-emitting peer (graphed), session 26
    assert bench._table_row(dict(r, ratio_graph=1.0402, ratio_state_peer_graph=0.8751)).split()[-1] == "0.88"
    sys.modules.pop("ssd_bench", None)


def test_timing_fit_reads_a_mamba2_replays_layer_counts(tmp_path):
    """``timing_fit.load_runs`` on a Mamba2 model's replay folder: its summary names the linear
    layers ``mamba2`` (``layers_replayed``), which the cost model keys as the gated-delta slot; the
    fit stopped on a KeyError there (session 24, nemotron-h-8b's H100 rows)."""
    pd = pytest.importorskip("pandas")
    tf = _load_benchmark("timing_fit.py")
    d = tmp_path / "nemotron"
    d.mkdir()
    summary = {
        "settings": {"model": "nemotron-h-8b"},
        "summary": {"layers_replayed": {"attention": 1, "mamba2": 3, "mlp": 4}},
    }
    (d / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"request": [0]}).to_parquet(d / "requests.parquet")
    ((run, settings, steps),) = tf.load_runs(tmp_path)
    assert run.counts == {"attention": 1, "gated_delta": 3, "mlp": 4} and steps is None
    assert tf.replayed_spec(run.spec, run.counts).n_mamba == 3


def test_timing_fit_reads_a_matrix_row_by_its_folder_name(tmp_path):
    """A preset matrix row (``MARCONI_GPU_ROWS``: ``{"summary": ...}`` only, no settings) is read
    as the preset its folder name starts with (the longest such name); a folder no preset name
    starts is one line, exit 2."""
    pd = pytest.importorskip("pandas")
    tf = _load_benchmark("timing_fit.py")
    for name in ("qwen3.5-35b-a3b-mooncake-fcfs", "nemotron-h-8b-sharegpt-continuous"):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"summary": {"layers_replayed": {"attention": 1, "mlp": 4}}}))
        pd.DataFrame({"request": [0]}).to_parquet(d / "requests.parquet")
    runs = tf.load_runs(tmp_path)
    assert [(r.name, r.spec.name, s["model"]) for r, s, _ in runs] == [
        ("nemotron-h-8b-sharegpt-continuous", "nemotron-h-8b", "nemotron-h-8b"),
        ("qwen3.5-35b-a3b-mooncake-fcfs", "qwen3.5-35b-a3b", "qwen3.5-35b-a3b"),
    ]
    (tmp_path / "my-model-row").mkdir()
    (tmp_path / "my-model-row" / "summary.json").write_text(json.dumps({"summary": {}}))
    pd.DataFrame({"request": [0]}).to_parquet(tmp_path / "my-model-row" / "requests.parquet")
    assert tf.main([str(tmp_path)]) == 2


def test_timing_fit_drop_resume_needs_resume(tmp_path, capsys):
    """``--drop-resume`` takes out the term ``--resume`` fits: alone it is one line, exit 2."""
    tf = _load_benchmark("timing_fit.py")
    assert tf.main([str(tmp_path), "--drop-resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --drop-resume takes the term --resume fits out of the runs: give both"]


def test_every_timing_campaign_replay_parses_and_mooncake_alternates(tmp_path):
    """``benchmarks/timing_campaign.sh`` with a stand-in CLI that logs its arguments: every replay
    it asks for parses with the real ``marconi replay`` options (choices included, nothing run), and
    the Mooncake runs time their hits' prefills alternated (``--saved-timing alternate``)."""
    import shlex
    import subprocess

    from sim.cli import main

    log = tmp_path / "calls.txt"
    fake = tmp_path / "fake-marconi"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {shlex.quote(str(log))}\n')
    fake.chmod(0o755)
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        ["bash", str(root / "benchmarks" / "timing_campaign.sh"), str(tmp_path / "out"), str(fake)],
        check=True,
        capture_output=True,
        env={**os.environ, "FIT4_REQUESTS": "2"},
    )
    calls = [shlex.split(line) for line in log.read_text().splitlines()]
    assert len(calls) == 4 * 4 + 2 * 2 + 2 + 2  # fit runs, held-out, continuous, ShareGPT
    replay = main.commands["replay"]
    for args in calls:
        assert args[0] == "replay"
        replay.make_context("replay", args[1:], resilient_parsing=False)  # raises on a bad option
        moon = "mooncake:sample" in args
        assert (args[args.index("--saved-timing") + 1] == "alternate") if moon else "--saved-timing" not in args
