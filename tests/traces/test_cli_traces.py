import json

import click
import pytest
from click.testing import CliRunner

from sim.cli.traces import trace_from_cli, trace_options
from sim.trace_options import TRACE_OPTION_KEYS


@pytest.fixture(scope="module")
def main():
    from sim.cli import main as marconi_main

    return marconi_main


def test_list(main):
    res = CliRunner().invoke(main, ["traces", "list"])
    assert res.exit_code == 0
    for spec in (
        "sharegpt",
        "lmsys[:PATH]".split("[")[0],
        "swebench:PATH",
        "mooncake:PATH",
        "bailian:PATH",
        "marconi-jsonl:PATH",
        "synthetic:KIND",
        "qwen3.5",
        "hf:PATH",
    ):
        assert spec in res.output


def test_stats_json_synthetic(main):
    res = CliRunner().invoke(main, ["traces", "stats", "synthetic:chat:sessions=4,turns=3", "--format", "json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)
    assert st["sessions"] == 4 and st["requests"] == 12
    assert {"kv_hit_rate", "hybrid_every_hit_rate", "hybrid_64_hit_rate", "input_tokens", "output_tokens"} <= set(st)


def test_stats_default_table(main, default_sharegpt):
    res = CliRunner().invoke(main, ["traces", "stats"])
    assert res.exit_code == 0, res.output
    assert "requests                1,235" in res.output
    assert "kv_hit_rate" in res.output and "hybrid_64_hit_rate" in res.output


def test_prepare_and_mooncake_stats(main):
    res = CliRunner().invoke(main, ["traces", "stats", "mooncake:sample-synthetic", "--format", "json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)
    assert st["requests"] == 300 and st["block_tokens"] == 512
    res = CliRunner().invoke(main, ["traces", "prepare", "sharegpt", "--sessions", "2"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("sharegpt: 2 sessions,")


@pytest.mark.parametrize(
    "args, message",
    [
        (["traces", "stats", "nope"], "Error: unknown trace 'nope'; valid: sharegpt, sharegpt:PATH, lmsys"),
        (["traces", "stats", "mooncake:/nonexistent/x.jsonl"], "Error: mooncake file not found: /nonexistent/x.jsonl"),
        (["traces", "stats", "synthetic:chat", "--sessions", "-1"], "Error: --sessions must be >= 0 (got -1)"),
        (["traces", "stats", "sharegpt", "--tokenizer", "gpt2"], "Error: unknown tokenizer 'gpt2'"),
        (
            ["traces", "stats", "synthetic:agent", "--response-time", "nan"],
            "Error: --response-time must be a finite number >= 0 (got nan)",
        ),
        (
            ["traces", "stats", "synthetic:agent", "--response-time", "inf"],
            "Error: --response-time must be a finite number >= 0 (got inf)",
        ),
        (
            ["traces", "stats", "mooncake:sample", "--time-scale", "inf"],
            "Error: --time-scale must be a finite number > 0 (got inf)",
        ),
        (
            ["traces", "stats", "mooncake:sample", "--time-scale", "0"],
            "Error: --time-scale must be a finite number > 0 (got 0.0)",
        ),
        (["traces", "stats", "synthetic:chat", "--trace-seed", "-1"], "Error: --trace-seed must be >= 0 (got -1)"),
    ],
)
def test_bad_input_one_line_exit_2(main, args, message):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [res.output.strip()]
    assert res.output.startswith(message)


def test_bad_row_exit_2_and_skip(main, tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    res = CliRunner().invoke(main, ["traces", "stats", f"mooncake:{p}"])
    assert res.exit_code == 2 and f"{p}:2: missing field 'input_length'" in res.output
    res = CliRunner().invoke(main, ["traces", "stats", f"mooncake:{p}", "--skip-bad-rows", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output)["skipped_rows"] == 1


def test_trace_options_decorator():
    seen = {}

    @click.command()
    @trace_options
    @click.option("--other", default=1)
    def cmd(**kwargs):
        seen["trace"] = trace_from_cli(kwargs, progress=False)
        seen["rest"] = dict(kwargs)

    res = CliRunner().invoke(
        cmd,
        [
            "--trace",
            "synthetic:agent:turns=4",
            "--sessions",
            "3",
            "--response-time",
            "5",
            "--trace-seed",
            "9",
            "--other",
            "2",
        ],
    )
    assert res.exit_code == 0, res.output
    assert seen["rest"] == {"other": 2}  # the trace keys were popped
    tr = seen["trace"]
    assert tr.n_sessions == 3 and len(tr.requests) == 12
    assert set(TRACE_OPTION_KEYS) == {
        "trace",
        "sessions",
        "min_rounds",
        "max_tokens",
        "tokenizer",
        "skip_bad_rows",
        "response_time",
        "time_scale",
        "trace_seed",
        "hash_block_tokens",
        "session_range",
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["traces", "stats", "mooncake:sample", "--sessions", "3"],
            "Error: --sessions does nothing for mooncake traces",
        ),
        (
            ["traces", "prepare", "mooncake:sample", "--min-rounds", "3"],
            "Error: --min-rounds does nothing for mooncake",
        ),
        (
            ["traces", "stats", "synthetic:agent", "--max-tokens", "100"],
            "Error: --max-tokens does nothing for synthetic",
        ),
        (
            ["traces", "stats", "mooncake:sample", "--sessions-per-second", "5"],
            "Error: --sessions-per-second does nothing for mooncake traces (their requests arrive at the trace's own",
        ),
        (
            ["run", "--trace", "mooncake:sample", "--sessions-per-second", "2"],
            "Error: --sessions-per-second does nothing for mooncake traces",
        ),
    ],
)
def test_options_the_trace_does_not_read_are_refused_by_traces_commands_too(main, args, message):
    """Issue 47: `traces stats` / `prepare` refuse trace options the trace does not read, as `run`
    does, and a session rate on an open-loop trace (its requests arrive at their own times)."""
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith(message), res.output


def test_a_session_rate_on_a_closed_loop_trace_still_reads(main):
    res = CliRunner().invoke(
        main, ["traces", "stats", "synthetic:agent", "--sessions", "2", "--sessions-per-second", "3"]
    )
    assert res.exit_code == 0, res.output
