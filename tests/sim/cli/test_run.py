"""`marconi run` end to end through click: table, JSON keys, --out files, and one-line errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli import main

JSON_KEYS = [
    "policy",
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "queue_p50_ms",
    "queue_p95_ms",
    "throughput_rps",
    "output_tokens_per_s",
    "batch_size_mean",
    "preemptions",
    "requests",
    "aborted_requests",
    "evictions",
    # why prompt tokens were missed (sim/engine/misses.py), totals by cause
    "missed_never_shared",
    "missed_no_checkpoint",
    "missed_last_token_rule",
    "missed_evicted",
    "missed_insert_rejected",
    "missed_held_by_running",
    "missed_speculative",
    # hit tokens of preempted requests past what they shared at their first lookup (docs/misses.md)
    "hit_after_preemption",
    "rejected",
    "saturated",
    "sustainable_rps",
    "alpha",
    "tuned_choice",
    "timing_device",
    "timing_note",
]


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def test_default_sharegpt_run_orders_policies_as_the_paper(runner, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    res = runner.invoke(
        main, ["run", "--sessions", "20", "--format", "json", "--no-progress"], env={"MARCONI_CACHE_DIR": str(cache)}
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["policy"] for r in rows] == ["vllm+", "sglang+", "marconi"]
    assert all(list(r) == JSON_KEYS for r in rows)
    hit = {r["policy"]: r["token_hit_rate"] for r in rows}
    assert hit["marconi"] >= hit["sglang+"] > hit["vllm+"] > 0
    assert len({r["requests"] for r in rows}) == 1


def test_out_writes_summary_and_per_request_parquet(runner, tmp_path):
    out = tmp_path / "res"
    res = runner.invoke(
        main,
        [
            "run",
            "--trace",
            "synthetic:chat",
            "--policy",
            "sglang+,marconi",
            "--capacity",
            "2GB",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "sglang+" in res.stdout and "cache hit" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["sglang+", "marconi"]
    assert summary[0]["capacity_bytes"] == 2 * 10**9
    df = pd.read_parquet(out / "requests.parquet")
    assert set(df["policy"]) == {"sglang+", "marconi"}
    for s in summary:
        part = df[df["policy"] == s["policy"]]
        assert len(part) == s["requests"]
        assert part["hit_tokens"].sum() / part["input_tokens"].sum() == pytest.approx(s["token_hit_rate"])
    occ = pd.read_parquet(out / "occupancy.parquet")
    assert (occ["kv_bytes"] + occ["state_bytes"] <= 2 * 10**9).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "nope"], "unknown policy"),
        (["--capacity", "1MB"], "smaller than one state checkpoint"),
        (["--capacity", "lots"], "cannot read size"),
        (["--sessions-per-second", "-2"], "must be a finite number > 0"),
        (["--model", "gpt-9"], "unknown model"),
        (["--alpha", "-1"], "alpha"),
        (["--trace", "mooncake:/does/not/exist.jsonl"], "not found"),
        (["--compat", "paper"], "use it with --mode sequential"),  # the default --mode is des
        (["--compat", "paper-fixed", "--mode", "des"], "use it with --mode sequential"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(runner, args, message):
    trace = [] if "--trace" in args else ["--trace", "synthetic:chat"]  # an option is given once
    res = runner.invoke(main, ["run", *trace, "--no-progress", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("command", ["run", "replay"])
@pytest.mark.parametrize("flag,shown", [("--no-progress", False), ("--progress", True)])
def test_progress_flag_reaches_the_trace_loader(runner, monkeypatch, command, flag, shown):
    """``--no-progress`` silences the tokenizing bar too (a cold trace cache printed it into the
    table's first line), ``--progress`` keeps it: the loader is asked for the bar or not."""
    import sim.cli.traces as cli_traces

    seen = []

    def record(spec, opts):
        seen.append(opts.progress)
        raise cli_traces.UsageError("stop here")

    monkeypatch.setattr(cli_traces, "load_trace", record)
    args = [command, "--sessions", "2", flag] + (
        ["--device", "cpu", "--model", "replay-tiny"] if command == "replay" else []
    )
    out = runner.invoke(main, args)
    assert out.exit_code == 2 and "stop here" in out.output, out.output
    assert seen == [shown]


@pytest.mark.parametrize("text,value", [("0", 0.0), ("0.25", 0.25), ("1", 1.0), ("1e6", 1e6), ("auto", "auto")])
def test_alpha_takes_every_finite_number_from_zero(text, value):
    """--alpha is a weight >= 0 (0: marconi's utility is recency alone): 0 and fractions below 1
    are values, not mistakes; NaN, infinities and anything below 0 are refused."""
    from sim.cli.run import parse_alpha

    assert parse_alpha(text) == value


@pytest.mark.parametrize("text", ["-0.001", "-1", "nan", "inf", "-inf", "one"])
def test_alpha_refuses_below_zero_and_non_finite(text):
    from sim.cli.run import parse_alpha
    from sim.errors import UsageError

    with pytest.raises(UsageError, match="--alpha must be a"):
        parse_alpha(text)


def test_run_passes_a_fractional_alpha_through(runner):
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    for alpha in ("0", "0.5"):
        res = runner.invoke(main, [*args, "--alpha", alpha, "--format", "json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)[0]["alpha"] == float(alpha)


@pytest.mark.parametrize(
    "settings,note",
    [
        ({"ttft_model": "jamba"}, "TTFT from the paper's Jamba-1.5-Mini table (A100)"),
        (
            {"ttft_model": "jamba", "gpu": "l40s"},
            "TTFT from the paper's Jamba-1.5-Mini table (A100); uncalibrated for GPU l40s",
        ),
        # the table prices the prefill, not a calibration: no word on the calibration's widths
        ({"ttft_model": "jamba", "model": "qwen3.5-27b"}, "TTFT from the paper's Jamba-1.5-Mini table (A100)"),
        ({}, ""),  # marconi-7b at its preset's A100 figures
        ({"gpu": "l40s"}, "uncalibrated for GPU l40s"),
        ({"model": "qwen3.5-9b", "gpu": "h200"}, ""),  # calibrated on its device, inside the fitted widths
        ({"ttft_model": "jamba", "timing_file": "t.json"}, ""),  # the user's own timing: nothing to say
    ],
)
def test_run_timing_note_names_the_table_then_the_gpu(settings, note):
    """The header's timing words: the paper's TTFT table first when --ttft-model jamba prices the
    prefills (decode still runs at the GPU's figures: their scaling follows), else the GPU's
    scaling and the calibration's coverage."""
    from sim.cli.run import run_timing_note
    from sim.config import SimConfig

    assert run_timing_note(SimConfig(**settings)) == note


def test_run_timing_note_says_a_model_lies_outside_the_calibrations_widths():
    from sim.cli.run import run_timing_note
    from sim.config import SimConfig

    note = run_timing_note(SimConfig(model="qwen3.5-27b", gpu="b200"))
    head, _, coverage = note.partition("; ")
    assert head == "uncalibrated for GPU b200"
    assert coverage.startswith("qwen3.5-27b lies outside the shapes") and coverage.endswith(
        "d_model 5120 (fitted 2048-4096)"
    )
    # the H100's own calibration (sim/data/h100-timing.json) covers the same widths: no head
    on_h100 = run_timing_note(SimConfig(model="qwen3.5-27b", gpu="h100"))
    assert on_h100.startswith("qwen3.5-27b lies outside the shapes") and on_h100.endswith("(fitted 2048-4096)")


def test_open_loop_saturation_prices_the_slices_own_span_at_the_given_time_scale(runner):
    """Sessions 20-59 of mooncake:sample are rows 21-60 of its file, one request each, stamped
    3000 ms to 15000 ms; at --time-scale 0.05 they arrive from 0.15 s to 0.75 s (the slice keeps
    its arrivals), so 40 requests in 0.6 s are offered at 66.7/s (not 40 / 0.75 s: the slice does
    not start at 0). The engine saturates; the time scale that keeps up is the one given times
    offered / served (arrivals stretch with it), not offered / served as if the scale were 1."""
    import re

    args = ["run", "--trace", "mooncake:sample", "--session-range", "20:60", "--time-scale", "0.05"]
    res = runner.invoke(main, [*args, "--policy", "sglang", "--capacity", "40GB", "--no-progress"])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("warning: offered load")]
    m = re.search(r"sustains about ([\d.]+) requests/s of busy time against ([\d.]+) offered", line)
    assert m is not None, line
    served, offered = float(m[1]), m[2]
    assert offered == "66.7"
    assert line.endswith(f"about --time-scale {0.05 * (40 / 0.6) / served:.2g} or more keeps up"), line


def test_open_loop_burst_saturation_names_no_time_scale(runner):
    """Sessions 10-25 of mooncake:sample are 16 rows all stamped 3000 ms: one instant, so the
    offered rate has no span to divide by and stretching the arrivals spreads nothing; the warning
    says so instead of an infinite rate and an infinite --time-scale."""
    args = ["run", "--trace", "mooncake:sample", "--session-range", "10:26", "--policy", "sglang"]
    res = runner.invoke(main, [*args, "--capacity", "40GB", "--no-progress"])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("warning: offered load")]
    assert line.endswith(
        "against requests that all arrive at once (the trace's arrivals: no --time-scale spreads them)"
    )


@pytest.mark.parametrize(
    "settings,row",
    [
        ({}, {"timing_device": "a100-40gb", "timing_note": ""}),  # marconi-7b's preset timing
        ({"gpu": "l40s"}, {"timing_device": "l40s", "timing_note": "uncalibrated for GPU l40s"}),
        ({"model": "qwen3.5-9b", "gpu": "h200"}, {"timing_device": "h200", "timing_note": ""}),
        # the paper's TTFT table or the user's file prices the run: no device of ours to name
        ({"ttft_model": "jamba", "gpu": "l40s"}, {"timing_device": None, "timing_note": ""}),
        ({"timing_file": "t.json"}, {"timing_device": None, "timing_note": ""}),
    ],
)
def test_summary_json_names_the_timings_device_only_when_ours_prices_the_run(settings, row):
    from sim.cli.run import timing_row
    from sim.config import SimConfig

    assert timing_row(SimConfig(**settings)) == row


def test_summary_json_of_a_jamba_ttft_run_has_no_timing_device(runner, tmp_path):
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    res = runner.invoke(main, [*args, "--ttft-model", "jamba", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    (row,) = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert row["timing_device"] is None and row["timing_note"] == "" and row["ttft_model"] == "jamba"


@pytest.mark.parametrize("extra", [[], ["--gpu", "h100"], ["--tensor-parallel", "2"]])
def test_jamba_ttft_prices_a_calibrated_presets_prefills_by_the_table(runner, tmp_path, extra):
    """--ttft-model jamba on a preset timed by a calibration (qwen3.5-9b: HardwareTiming) crashed
    with AttributeError 'jamba_ttft_s'; each vanilla prefill in sequential mode now takes the
    table's 17.8 ms + 0.0530 ms a token (612 tokens: 50.236 ms)."""
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "vanilla"]
    out = tmp_path / "o"
    res = runner.invoke(
        main,
        [*args, "--model", "qwen3.5-9b", "--ttft-model", "jamba", "--mode", "sequential", "--out", str(out), *extra],
    )
    assert res.exit_code == 0, res.output
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 4 and (req["hit_tokens"] == 0).all()
    want = (17.8 + 0.0530 * req["input_tokens"]) * 1e-3
    assert req["ttft_s"].tolist() == pytest.approx(want.tolist(), rel=1e-9)
    assert req["input_tokens"].iloc[0] == 612 and req["ttft_s"].iloc[0] == pytest.approx(0.050236)


def test_json_says_a_gpu_is_uncalibrated_as_the_header_does(runner):
    """--format json had no header and no word that --gpu b200 is priced by a datasheet scaling;
    its rows carry summary.json's timing_device / timing_note."""
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    for gpu, note in (("b200", "uncalibrated for GPU b200"), ("h100", "")):
        res = runner.invoke(main, [*args, "--model", "qwen3.5-9b", "--gpu", gpu, "--format", "json"])
        assert res.exit_code == 0, res.output
        (row,) = json.loads(res.stdout)
        assert (row["timing_device"], row["timing_note"]) == (gpu, note)
        table = runner.invoke(main, [*args, "--model", "qwen3.5-9b", "--gpu", gpu])
        assert (note in table.output.splitlines()[0]) and ("uncalibrated" in table.output) == bool(note)


def test_json_says_whether_the_engine_kept_up_and_at_what_rate():
    """``saturated`` / ``sustainable_rps``: null / null with fewer than 6 finished requests (no
    verdict), false / null for a run that keeps up, true / the sustained rate for one that does not
    (the table's warning names the same rate); ``alpha`` is null for a policy without one."""
    runner = CliRunner()
    small = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--format", "json"]
    res = runner.invoke(main, [*small, "--policy", "sglang+,marconi", "--alpha", "0.5"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["saturated"], r["sustainable_rps"], r["alpha"]) for r in rows] == [(None, None, None), (None, None, 0.5)]
    quiet = ["run", "--trace", "synthetic:chat:sessions=4,turns=3", "--policy", "sglang", "--no-progress"]
    res = runner.invoke(main, [*quiet, "--format", "json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["saturated"] is False and row["sustainable_rps"] is None
    busy = ["run", "--trace", "mooncake:sample", "--session-range", "20:60", "--time-scale", "0.05"]
    res = runner.invoke(main, [*busy, "--policy", "sglang", "--capacity", "40GB", "--no-progress", "--format", "json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["saturated"] is True and f"sustains about {row['sustainable_rps']:.3g} requests/s" in res.stderr


def test_events_holds_each_policys_own_events(runner, tmp_path):
    """--events: one line per event, each named by its policy, every request arriving and looked up
    once per policy (2 sessions x 2 turns)."""
    ev = tmp_path / "e.jsonl"
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "sglang+,marconi"]
    res = runner.invoke(main, [*args, "--events", str(ev)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in ev.read_text().splitlines()]
    for policy in ("sglang+", "marconi"):
        mine = [r for r in rows if r["policy"] == policy]
        for kind in ("arrive", "lookup"):
            assert sorted(r["request_id"] for r in mine if r["event"] == kind) == [0, 1, 2, 3]
    assert {r["policy"] for r in rows} == {"sglang+", "marconi"}


def test_run_out_refuses_a_sweeps_folder(runner, tmp_path):
    """A folder holding a sweep's rows is not `run`'s to write into (relative or absolute)."""
    out = tmp_path / "swept"
    out.mkdir()
    (out / ("0" * 20 + ".parquet")).write_bytes(b"")
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "sglang+"]
    res = runner.invoke(main, [*args, "--out", str(out)])
    assert res.exit_code == 2 and "holds the rows of `marconi sweep`" in res.output, res.output
    assert sorted(p.name for p in out.iterdir()) == ["0" * 20 + ".parquet"]


def test_the_oracles_line_names_its_best_static_alpha(runner):
    """marconi-oracle tunes in hindsight (no tuning rounds): its line is the best static alpha,
    the one its JSON names."""
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi-oracle"]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(runner.invoke(main, [*args, "--format", "json"]).stdout)
    assert res.output.splitlines()[-1] == f"marconi-oracle: best static alpha in hindsight {row['tuned_choice']}"


def test_a_capacity_below_one_block_and_its_state_is_refused():
    """lmdeploy at --block-size 4096 on marconi-7b: a block's KV and a state need 295MB; at 100MB
    every insert would be rejected, so the run is refused in one line (at 1GB it runs)."""
    runner = CliRunner()
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "lmdeploy"]
    res = runner.invoke(main, [*args, "--block-size", "4096", "--capacity", "100MB"])
    assert res.exit_code == 2, res.output
    assert "capacity 100MB cannot hold one 4096-token block of marconi-7b with its state (295MB)" in res.output
    assert runner.invoke(main, [*args, "--block-size", "4096", "--capacity", "1GB"]).exit_code == 0
