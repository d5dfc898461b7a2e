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
    "evictions",
    # why prompt tokens were missed (sim/engine/misses.py), totals by cause
    "missed_never_shared",
    "missed_no_checkpoint",
    "missed_last_token_rule",
    "missed_evicted",
    "missed_insert_rejected",
    "missed_held_by_running",
    "missed_speculative",
    "rejected",
    "saturated",
    "sustainable_rps",
    "alpha",
    "tuned_choice",
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
    res = runner.invoke(main, ["run", "--trace", "synthetic:chat", "--no-progress", *args])
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
