"""What round 6 of bad inputs left as it was (docs/bad-input.md, round 6's table): a draft length no
engine step holds, a request count or session range past the trace said on stderr, advise's
``2x80GB`` with ``--gpu`` priced as the group it names, ``models A A``. Through the real CLI in
process; every refusal is one line on stderr and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.config import SimConfig
from sim.errors import UsageError
from refusals import one_line as _one_line

SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]


# ------------------------------------------------------------------------------ draft length


@pytest.mark.parametrize(
    "policy", [["trtllm"], ["vllm", "--speculative-method", "eagle"], ["sglang"]], ids=["trtllm", "vllm", "sglang"]
)
def test_more_draft_tokens_than_an_engine_step_holds_is_refused(runner, policy):
    """--speculative-tokens 100000 ran under trtllm (each running request holding 100,001 state
    slots); a verify step runs the K drafts and the sampled token in one engine step, and vLLM
    refuses num_speculative_tokens >= max_num_batched_tokens (VllmConfig._set_max_num_scheduled_tokens)."""
    res = runner.invoke(main, ["run", *SMALL, "--policy", *policy, "--speculative-tokens", "100000"])
    _one_line(
        res,
        "--speculative-tokens 100000 is more draft tokens than an engine step holds: a verify step runs them and "
        "the sampled token in one step of --max-num-batched-tokens 8192 (vLLM refuses num_speculative_tokens >= "
        "max_num_batched_tokens); give at most 8191",
    )


def test_the_draft_bound_is_the_step_budget():
    """K = budget - 1 is the most a step holds (vLLM raises at budget <= K); the budget is the
    --max-num-batched-tokens given."""
    SimConfig(policy="trtllm", speculative_tokens=8191).validate()
    with pytest.raises(UsageError, match=r"--speculative-tokens 8192 is more .* give at most 8191$"):
        SimConfig(policy="trtllm", speculative_tokens=8192).validate()
    cfg = dict(policy="trtllm", mode="des", scheduler="continuous", max_num_batched_tokens=64)
    SimConfig(**cfg, speculative_tokens=63).validate()
    with pytest.raises(UsageError, match=r"--max-num-batched-tokens 64 .* give at most 63$"):
        SimConfig(**cfg, speculative_tokens=64).validate()


# ------------------------------------------------------------------- past the trace: said, not refused


@pytest.mark.parametrize(
    "session_range, note",
    [
        ("0:5", "note: --session-range 0:5: the trace has 2 sessions; running sessions 0:2 (2 sessions)"),
        ("1:5", "note: --session-range 1:5: the trace has 2 sessions; running sessions 1:2 (1 session)"),
        ("0:2", ""),
        ("1:", ""),
    ],
)
def test_a_session_range_past_the_trace_is_said(runner, session_range, note):
    """--session-range 0:5 on a 2-session trace ran the 2 sessions without a word."""
    res = runner.invoke(
        main, ["run", *SMALL, "--policy", "sglang+", "--session-range", session_range, "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == note
    sessions = 2 - int(session_range.split(":")[0])
    assert json.loads(res.stdout)[0]["requests"] == 2 * sessions  # 2 turns a session


@pytest.mark.parametrize("requests, note", [("500", True), ("4", False)])
def test_replay_requests_past_the_trace_are_said(runner, requests, note):
    """replay --requests 500 on a 4-request trace replayed the 4 without a word."""
    res = runner.invoke(
        main,
        ["replay", "--device", "cpu", "--model", "replay-tiny", *SMALL, "--requests", requests, "--format", "json"],
    )
    assert res.exit_code == 0, res.output
    said = "note: --requests 500: the trace has 4 requests; replaying all 4"
    assert (said in res.stderr) is note, res.stderr
    assert json.loads(res.stdout)["requests"] == 4


# ------------------------------------------------------------------------------ advise's N x SIZE


ADVISE = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", *SMALL, "--trials", "1", "--workers", "1"]


def test_advise_gpu_memory_with_a_count_prices_that_group(runner, tmp_path):
    """`advise --gpu-memory 2x80GB --gpu h100` was refused as more than the memory of 1x h100 (the
    preset's group), though 2x80GB spells a two-GPU group (docs/advise.md): it is that group."""
    out = tmp_path / "adv"
    res = runner.invoke(main, [*ADVISE, "--gpu-memory", "2x80GB", "--gpu", "h100", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == "note: --gpu-memory 2x80GB: priced as a group of 2x h100 (--tensor-parallel 2)"
    assert "| GPU 2x h100 | --gpu-memory 160GB" in res.stdout
    assert "--gpu h100 --tensor-parallel 2 --gpu-memory" in res.stdout  # the reproducing run line
    # the preset's own count spelled out, or a group given, stays as it was: no note
    res = runner.invoke(main, [*ADVISE, "--gpu-memory", "1x80GB", "--gpu", "h100", "--out", str(tmp_path / "one")])
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert "| GPU 1x h100 |" in res.stdout
    res = runner.invoke(
        main,
        [*ADVISE, "--gpu-memory", "2x80GB", "--gpu", "h100", "--tensor-parallel", "4", "--out", str(tmp_path / "x")],
    )
    _one_line(res, "--gpu-memory 2x80GB is the memory of 2 GPUs, --tensor-parallel 4 a group of 4")


# ------------------------------------------------------------------------------------- models A A


def test_models_prints_a_model_given_twice_once(runner):
    res = runner.invoke(main, ["models", "llama-7b", "qwen3.5-9b", "llama-7b", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [r["name"] for r in json.loads(res.stdout)] == ["llama-7b", "qwen3.5-9b"]
    table = runner.invoke(main, ["models", "qwen3.5-9b", "qwen3.5-9b"]).stdout.splitlines()
    assert len(table) == 3 and table[2].startswith("qwen3.5-9b ")


# --------------------------------------------- options built from settings (sim/cli/options.py)


def test_a_choice_reads_any_case(runner):
    """Choices are read in any case (`--arrival POISSON` is poisson), as `--gpu H200` is h200
    (mutation: case_sensitive=True refused them)."""
    rows = []
    for arrival in ("POISSON", "poisson"):
        res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--arrival", arrival, "--format", "json"])
        assert res.exit_code == 0, res.output
        rows.append(json.loads(res.stdout))
    assert rows[0] == rows[1]


def _help_of(text: str, flag: str) -> str:
    """The help text of ``flag`` in a command's --help (its lines up to the next option)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("   "))  # the next option
    return " ".join(line.strip() for line in lines[start:end])


def test_help_states_an_options_default(runner):
    """An option's default is shown where it has one (mutation: dropping show_default, or showing
    it only for options without a default, hid them)."""
    text = runner.invoke(main, ["run", "--help"], terminal_width=200).output
    assert _help_of(text, "--max-num-batched-tokens").endswith("[default: 8192]")
    assert _help_of(text, "--seed").endswith("[default: 0]")
    assert "[default: None]" not in text


def test_an_option_twice_and_its_spelling_as_a_value_is_still_one_line(runner):
    """`--capacity` given twice and then once more as the value of --trace: the occurrences read
    stop at the line's end (mutation: `i + 0 < len` read past it, an IndexError traceback)."""
    res = runner.invoke(main, ["run", "--capacity", "5GB", "--capacity", "10GB", "--trace", "--capacity"])
    _one_line(res, "--capacity is given 2 times (--capacity 5GB, --capacity 10GB): it takes one value, give it once")


# ------------------------------------------------------------------- refusals (sim/cli/checks.py)


@pytest.mark.parametrize("rate, runs", [("1e-6", True), ("1e6", True), ("9.9e-7", False), ("1.1e6", False)])
def test_the_session_rate_range_holds_its_ends(runner, rate, runs):
    """--sessions-per-second is read in 1e-6..1e6, both ends included (mutation: `<` at the lower
    end refused 1e-6)."""
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--sessions-per-second", rate])
    if runs:
        assert res.exit_code == 0, res.output
    else:
        _one_line(
            res, f"--sessions-per-second must be in 1e-06..1e+06 (sessions started per second), not {float(rate)!r}"
        )


def test_check_timing_returns_the_timing_it_read(tmp_path):
    """`check_timing` returns the file's timing, as read_timing reads it (mutation: None)."""
    from sim.cli.checks import check_timing
    from sim.replay.measure import read_timing

    path = tmp_path / "t.json"
    path.write_text((Path(__file__).parents[3] / "sim" / "data" / "h200-timing.json").read_text())
    got = check_timing(path, model="qwen3.5-9b")
    assert got is not None and got == read_timing(path, model="qwen3.5-9b")
