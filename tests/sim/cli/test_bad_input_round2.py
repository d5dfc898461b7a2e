"""Issue 21, the second round of bad inputs: each item through the real CLI (exit code and the one
line it prints; files before and after where something could be lost). Ctrl-C in a sweep is in
``test_sweep_interrupt.py``, the data-loss rules in ``test_no_data_loss.py``, the fuzzing of each
option family in ``test_option_fuzz.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from policies.base import PRESETS, PolicyPreset
from sim.cli import main
from sim.cost import TIMING_FORMAT

TINY = "synthetic:chat:sessions=2,turns=2"
SMALL = ["--trace", TINY, "--no-progress"]
MISSING_TRACE = ["--trace", "mooncake:/nonexistent/trace.jsonl"]  # reaching another error proves no load


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _one_line(res, message: str, *, prefix: bool = False) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output)
    text = res.output.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert (text.startswith if prefix else text.__eq__)(f"Error: {message}"), text


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ options that do nothing for the policy


@pytest.mark.parametrize("cmd", ["run", "sweep"])
@pytest.mark.parametrize(
    "policy, args, message",
    [
        ("sglang+", ["--alpha", "1.5"], "--alpha does nothing for sglang+ (it is read by marconi)"),
        (
            "marconi",
            ["--block-size", "64"],
            "--block-size does nothing for marconi (it is read by vllm, "
            "lmdeploy, vllm-0.11-align, vllm-0.11-all, lmdeploy-0.16-pytorch)",
        ),
        (
            "marconi",
            ["--state-pool", "3"],
            "--state-pool does nothing for marconi (it is read by sglang, trtllm, lmdeploy, sglang-0.5.9-no-buffer, ",
        ),
        ("vllm+", ["--state-alignment", "chunk"], "--state-alignment does nothing for vllm+ (it is read by sglang+, "),
        (
            "vanilla,marconi-oracle",
            ["--prefill-chunk", "512"],
            "--prefill-chunk does nothing for vanilla, marconi-oracle (it is read by sglang, vllm",
        ),
    ],
)
def test_option_no_chosen_policy_reads_is_refused_before_loading(runner, tmp_path, cmd, policy, args, message):
    head = ["run"] if cmd == "run" else ["sweep", "--out", str(tmp_path / "s")]
    res = runner.invoke(main, [*head, *MISSING_TRACE, "--policy", policy, *args])
    _one_line(res, message, prefix=True)
    assert res.output.strip().endswith(": leave it out or add a policy that reads it")
    assert not (tmp_path / "s").exists()


def test_option_read_by_one_chosen_policy_is_accepted(runner):
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+,marconi", "--alpha", "1.5", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [r["alpha"] for r in json.loads(res.stdout)] == [None, 1.5]
    res = runner.invoke(main, ["run", *SMALL, "--policy", "marconi,vllm-all", "--block-size", "64"])
    assert res.exit_code == 0, res.output
    # the header names alpha only when a chosen policy uses it
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+"])
    assert res.exit_code == 0 and "alpha" not in res.stdout.splitlines()[0], res.output


def test_a_new_preset_plugs_into_the_check(runner):
    """A preset declares what it reads (its policies' Params, or ``knobs``): nothing else to change."""
    PRESETS["test-blocky"] = PolicyPreset(
        "test-blocky", "test: judicious admission that reads --block-size", reads_also=("block_size",)
    )
    try:
        res = runner.invoke(main, ["run", *SMALL, "--policy", "test-blocky", "--block-size", "64"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(main, ["run", *SMALL, "--policy", "marconi", "--block-size", "64"])
        _one_line(
            res,
            "--block-size does nothing for marconi (it is read by vllm, lmdeploy, vllm-0.11-align, "
            "vllm-0.11-all, lmdeploy-0.16-pytorch, test-blocky)",
            prefix=True,
        )
    finally:
        del PRESETS["test-blocky"]


def test_duplicate_policy_and_empty_trace(runner):
    _one_line(
        runner.invoke(main, ["run", *SMALL, "--policy", "marconi,sglang+,marconi"]),
        "--policy lists marconi more than once (each policy is one row)",
    )
    msg = "--trace is empty: give a trace spec (see `marconi traces list`), or leave the option out"
    _one_line(runner.invoke(main, ["run", "--trace", "", "--no-progress"]), msg)
    _one_line(runner.invoke(main, ["traces", "stats", "--trace", " "]), msg)


@pytest.mark.parametrize(
    "policy, size", [("vllm-all", "5000"), ("vllm-align", "1000000000"), ("lmdeploy", "1000000000"), ("lmdeploy", "-1")]
)
def test_absurd_block_sizes(runner, policy, size):
    _one_line(
        runner.invoke(main, ["run", *SMALL, "--policy", policy, "--block-size", size]),
        f"--block-size must be 0 (the engine's default) or 1 to 4096 tokens, not {size}",
    )


def test_block_that_cannot_fit_the_capacity(runner, tmp_path):
    res = runner.invoke(
        main,
        ["run", *SMALL, "--policy", "lmdeploy", "--block-size", "4096", "--model", "qwen3.5-9b", "--capacity", "100MB"],
    )
    _one_line(res, "capacity 100MB cannot hold one 4096-token block of qwen3.5-9b with its state", prefix=True)
    assert "for lmdeploy: every insert would be rejected" in res.output
    res = runner.invoke(
        main,
        [
            "sweep",
            *SMALL,
            "--policy",
            "sglang+,vllm-all",
            "--block-size",
            "4096",
            "--model",
            "qwen3.5-9b",
            "--capacity",
            "100MB,10GB",
            "--out",
            str(tmp_path / "s"),
            "--dry-run",
        ],
    )
    _one_line(res, "capacity 100MB cannot hold one 4096-token block of qwen3.5-9b with its state", prefix=True)


# ------------------------------------------------------------------ files the run reads


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", '"nan"', "0", "-1"])
def test_timing_file_with_non_finite_values_refused_before_loading(runner, tmp_path, value):
    t = tmp_path / "t.json"
    t.write_text(
        f'{{"format": "{TIMING_FORMAT}", "model": "marconi-7b", "effective_tflops": {value}, '
        f'"overhead_ms": 1.0, "decode_ms_per_token": 1.0}}'
    )
    res = runner.invoke(main, ["run", *MISSING_TRACE, "--timing", str(t)])
    _one_line(res, f"timing file {t}: effective_tflops must be a finite number > 0, not ", prefix=True)
    t.write_text(
        f'{{"format": "{TIMING_FORMAT}", "model": "marconi-7b", "effective_tflops": 100, '
        f'"overhead_ms": {value}, "decode_ms_per_token": 1.0}}'
    )
    res = runner.invoke(main, ["run", *MISSING_TRACE, "--timing", str(t)])
    if value == "0":  # no overhead is a valid time
        _one_line(res, "mooncake file not found: /nonexistent/trace.jsonl")
    else:
        _one_line(res, f"timing file {t}: overhead_ms must be a finite number >= 0, not ", prefix=True)


def test_swebench_empty_parquet(runner, tmp_path):
    f = tmp_path / "t.parquet"
    f.write_bytes(b"")
    _one_line(
        runner.invoke(main, ["run", "--trace", f"swebench:{f}", "--no-progress"]),
        f"cannot read parquet file {f}: ",
        prefix=True,
    )


BAILIAN = {
    "chat_id": 1,
    "parent_chat_id": -1,
    "turn": 1,
    "timestamp": 0.0,
    "input_length": 16,
    "output_length": 3,
    "type": "text",
    "hash_ids": [1],
}
MJ = {
    "session_id": 1,
    "turn_id": 0,
    "ts": 0,
    "num_input_tokens": 2,
    "num_output_tokens": 1,
    "input_tokens": [1, 2],
    "output_tokens": [5],
}


@pytest.mark.parametrize(
    "kind, rows, where, message",
    [
        (
            "mooncake",
            [{"timestamp": 0, "input_length": 0, "output_length": 10, "hash_ids": []}],
            1,
            "input_length 0: a request needs at least one input token",
        ),
        (
            "bailian",
            [{**BAILIAN, "input_length": 0, "hash_ids": []}],
            1,
            "input_length 0: a request needs at least one input token",
        ),
        (
            "bailian",
            [{**BAILIAN, "parent_chat_id": 2}, {**BAILIAN, "chat_id": 2, "parent_chat_id": 1, "timestamp": 1.0}],
            1,
            "parent_chat_id 2 of chat_id 1 appears later in the file (a parent cycle, or rows out of order): a "
            "parent must come before its child",
        ),
        ("bailian", [{**BAILIAN, "parent_chat_id": 1}], 1, "chat_id 1 is its own parent (a cycle)"),
        (
            "marconi-jsonl",
            [{**MJ, "num_input_tokens": 0, "input_tokens": []}],
            1,
            "num_input_tokens 0: a request needs at least one input token",
        ),
        (
            "marconi-jsonl",
            [MJ, {**MJ, "session_id": 2}, {**MJ, "ts": 1}],
            3,
            "session_id 1 turn_id 0 again (first on line 1)",
        ),
    ],
)
def test_trace_content_problems_are_named_by_line(runner, tmp_path, kind, rows, where, message):
    f = _write_jsonl(tmp_path / "t.jsonl", rows)
    _one_line(
        runner.invoke(main, ["run", "--trace", f"{kind}:{f}", "--no-progress", "--policy", "sglang+"]),
        f"{f}:{where}: {message}",
    )


def test_bailian_cycle_skipped_with_skip_bad_rows(runner, tmp_path):
    f = _write_jsonl(
        tmp_path / "t.jsonl",
        [{**BAILIAN, "parent_chat_id": 2}, {**BAILIAN, "chat_id": 2, "parent_chat_id": 1, "timestamp": 1.0}],
    )
    res = runner.invoke(main, ["traces", "stats", f"bailian:{f}", "--skip-bad-rows", "--format", "json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)
    assert (st["requests"], st["skipped_rows"]) == (1, 1)


def test_sharegpt_not_utf8(runner, tmp_path):
    f = tmp_path / "sg.json"
    f.write_bytes(
        b'[{"id": "a", "conversations": [{"from": "human", "value": "h\xe9llo"}, {"from": "gpt", "value": "x"}]}]'
    )
    _one_line(
        runner.invoke(main, ["run", "--trace", f"sharegpt:{f}", "--no-progress"]),
        f"{f}:1: not UTF-8 text (invalid continuation byte, on this line or within 1,048,576 characters "
        "after it); convert the file to UTF-8",
    )


# ------------------------------------------------------------------ the trace cache


def test_cache_dir_that_is_a_file_or_cannot_be_written(runner, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    sg = tmp_path / "sg.json"
    sg.write_text(
        json.dumps(
            [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}] * 2}]
        )
    )
    for env, why in (
        (str(f), f"{f} is a file, not a folder"),
        ("/proc/nope", "cannot write to /proc/nope/traces (No such file or directory)"),
    ):
        res = runner.invoke(
            main,
            ["traces", "prepare", f"sharegpt:{sg}", "--min-rounds", "1", "--tokenizer", "qwen3.5"],
            env={"MARCONI_CACHE_DIR": env},
        )
        _one_line(res, f"MARCONI_CACHE_DIR={env}: {why}; point it at a writable folder, or unset it")
    assert f.read_text() == "x"
    # the default cache unwritable: the run goes on uncached, and prepare names no file it did not write
    res = runner.invoke(
        main,
        ["traces", "prepare", f"sharegpt:{sg}", "--min-rounds", "1", "--tokenizer", "qwen3.5"],
        env={"MARCONI_CACHE_DIR": None, "XDG_CACHE_HOME": str(f)},
    )
    assert res.exit_code == 0, res.output
    assert "not cached: " in res.output and "cache:" not in res.output, res.output
    cache = tmp_path / "cache"
    res = runner.invoke(
        main,
        ["traces", "prepare", f"sharegpt:{sg}", "--min-rounds", "1", "--tokenizer", "qwen3.5"],
        env={"MARCONI_CACHE_DIR": str(cache)},
    )
    path = res.output.strip().splitlines()[-1].removeprefix("cache: ")
    assert res.exit_code == 0 and Path(path).is_file() and Path(path).parent == cache / "traces", res.output


# ------------------------------------------------------------------ TensorRT-LLM's snapshot offsets


@pytest.mark.parametrize("cmd", ["run", "sweep"])
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--additional-snapshot-offsets-from-start", "0"],
            "--additional-snapshot-offsets-from-start offsets must be positive (>= 1), not 0",
        ),
        (
            ["--additional-snapshot-offsets-from-start", "-1024"],
            "--additional-snapshot-offsets-from-start offsets must be positive (>= 1), not -1024",
        ),
        (
            ["--additional-snapshot-offsets-from-start", "1024,,4096"],
            "--additional-snapshot-offsets-from-start takes comma-separated integer token offsets (e.g. 1024,4096), "
            "not '1024,,4096'",
        ),
        (
            ["--additional-snapshot-offsets-from-start", "512.5"],
            "--additional-snapshot-offsets-from-start takes comma-separated integer token offsets (e.g. 1024,4096), "
            "not '512.5'",
        ),
        (
            ["--additional-snapshot-offsets-from-end", "-1"],
            "--additional-snapshot-offsets-from-end offsets must be non-negative (>= 0), not -1",
        ),
        (
            ["--additional-snapshot-offsets-from-end", "0,"],
            "--additional-snapshot-offsets-from-end takes comma-separated integer token offsets (e.g. 1024,4096), "
            "not '0,'",
        ),
    ],
)
def test_trtllm_bad_snapshot_offsets(runner, tmp_path, cmd, args, message):
    """TensorRT-LLM's MambaStateConfig takes a list of positive ints from the start and of
    non-negative ints from the end: anything else is one line, exit 2 (run, and sweep before it
    writes anything)."""
    head = ["run"] if cmd == "run" else ["sweep", "--out", str(tmp_path / "s"), "--dry-run"]
    res = runner.invoke(main, [*head, *SMALL, "--policy", "trtllm", *args])
    _one_line(res, message)
    assert not (tmp_path / "s").exists()


def test_trtllm_snapshot_offsets_accepted_and_refused_for_other_presets(runner):
    res = runner.invoke(
        main,
        [
            "run",
            *SMALL,
            "--policy",
            "trtllm",
            "--additional-snapshot-offsets-from-start",
            "256,1024",
            "--additional-snapshot-offsets-from-end",
            "0",
            "--periodic-snapshot-interval",
            "512",
            "--format",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["policy"] == "trtllm"
    res = runner.invoke(
        main, ["run", *MISSING_TRACE, "--policy", "vllm", "--additional-snapshot-offsets-from-end", "0"]
    )
    _one_line(
        res,
        "--additional-snapshot-offsets-from-end does nothing for vllm (it is read by trtllm): leave it "
        "out or add a policy that reads it",
    )


# ------------------------------------------------------------------ sweep and plot


def test_sweep_alpha_nan_refused_even_for_a_policy_without_alpha(runner, tmp_path):
    for policy in ("sglang+", "marconi"):
        res = runner.invoke(
            main, ["sweep", *MISSING_TRACE, "--policy", policy, "--alpha", "0,nan", "--out", str(tmp_path / "s")]
        )
        _one_line(res, "--alpha must be a finite number >= 0 or 'auto', not nan")


def test_sweep_grid_counted_and_capped_before_it_is_built(runner, tmp_path):
    t0 = time.monotonic()
    res = runner.invoke(
        main,
        ["sweep", "--alpha", "0:99.9:0.1", "--capacity", "1GB:1000GB:1GB", "--out", str(tmp_path / "s"), "--dry-run"],
    )
    _one_line(
        res,
        "the grid has 1,002,000 configurations (policy(3) x capacity_bytes(1000) x alpha(1000)), more "
        "than 50,000: use fewer values or split it into several sweeps",
    )
    res = runner.invoke(
        main,
        [
            "sweep",
            "--alpha",
            "0:99.9:0.1",
            "--capacity",
            "1GB:1000GB:1GB",
            "--sessions-per-second",
            "1:100",
            "--out",
            str(tmp_path / "s"),
            "--dry-run",
        ],
    )
    _one_line(res, "the grid has 100,200,000 configurations", prefix=True)
    assert time.monotonic() - t0 < 5 and not (tmp_path / "s").exists()


def test_plot_alpha_outside_the_grid(runner, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "s"
    res = runner.invoke(
        main,
        [
            "sweep",
            "--trace",
            TINY,
            "--policy",
            "sglang+,marconi",
            "--alpha",
            "0,1",
            "--out",
            str(out),
            "--workers",
            "1",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["plot", str(out), "--alpha", "0.7", "--out", str(tmp_path / "fig")])
    _one_line(
        res,
        "--alpha 0.7 is not in the static-alpha grid of marconi in these results (0, 1): pick one of "
        "those, best or all",
    )
    assert not (tmp_path / "fig").exists()
    res = runner.invoke(main, ["plot", str(out), "--alpha", "1", "--out", str(tmp_path / "fig")])
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------ replay: checked before any work


def test_replay_checks_before_work(runner, tmp_path):
    f = tmp_path / "F"
    f.write_text("x")
    base = ["replay", *MISSING_TRACE, "--device", "cpu", "--model", "replay-tiny"]
    _one_line(
        runner.invoke(main, [*base, "--calibrate", str(f / "t.json")]),
        f"--calibrate {f / 't.json'}: is inside {f}, which is a file, not a folder",
    )
    _one_line(
        runner.invoke(main, [*base, "--calibrate", str(f)]),
        f"--calibrate: {f} already exists; pass --force to replace, or choose another name",
    )
    assert f.read_text() == "x"
    for tol in ("-1", "0", "nan", "inf"):
        _one_line(
            runner.invoke(main, [*base, "--tolerance", tol]),
            f"--tolerance must be a finite number > 0, not {float(tol)}",
        )
    trace = _write_jsonl(tmp_path / "t.jsonl", [BAILIAN])
    _one_line(
        runner.invoke(
            main,
            [
                "replay",
                "--trace",
                f"bailian:{trace}",
                "--device",
                "cpu",
                "--model",
                "replay-tiny",
                "--calibrate",
                str(trace),
                "--force",
            ],
        ),
        f"--calibrate {trace}: is an input of this command; write the output elsewhere",
    )


#: a Qwen3.5-shaped model just wider than the warning's d_model 1024, and small everywhere else (a
#: 1,000-token vocabulary, four layers, narrow heads): the warning is about the width, and building
#: qwen3.5-9b's 248K x 4096 embedding on the CPU took most of this test's 11 s
WIDE_NARROW = {
    "model_type": "qwen3_5_text",
    "dtype": "bfloat16",
    "hidden_size": 1088,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "vocab_size": 1000,
    "intermediate_size": 256,
}


def test_replay_on_cpu_warns_of_a_wide_model(tmp_path):
    """--device cpu with a model wider than d_model 1024 runs, after one line on stderr with the
    expected time (it used to be refused); narrower models get no warning."""
    pytest.importorskip("torch")
    trace = _write_jsonl(tmp_path / "t.jsonl", [BAILIAN])
    config = tmp_path / "wide" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(WIDE_NARROW))
    args = [
        "replay",
        "--trace",
        f"bailian:{trace}",
        "--device",
        "cpu",
        "--layers",
        "1",
        "--no-progress",
        "--format",
        "json",
    ]
    res = CliRunner().invoke(main, [*args, "--model", str(config)])
    assert res.exit_code == 0, res.output
    warning = res.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith(
        f"warning: --device cpu: {config} (d_model 1088) will take about "
    ), warning
    assert " for 1 request of 1 layer (" in warning[0]
    # the default scheduler is continuous: its engine steps run the suffixes again (44422e5)
    assert warning[0].endswith(
        "TFLOP of from-scratch prefills at ~0.1 TFLOP/s; the engine steps of continuous batching run the "
        "suffixes again); --layers, --requests or --device cuda cut it"
    ), warning
    assert json.loads(res.stdout)["requests"] == 1
    res = CliRunner().invoke(main, [*args, "--model", "replay-tiny"])
    assert res.exit_code == 0 and res.stderr == "", res.output


# ------------------------------------------------------------------ notebooks


def test_notebook_small_sweep_removes_its_temp_folder(tmp_path):
    code = (
        "from sim.analysis import report\n"
        "report.SMALL['t'] = dict(trace_axes={'trace': ['synthetic:chat:sessions=2,turns=2']},\n"
        "                         sim_axes={'policy': ['sglang+']})\n"
        "p = report.results_dir(None, 't')\n"
        "print(p, len(list(p.glob('*.parquet'))))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RESULTS_DIR", "SMALL_SWEEP_DIR")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(env, TMPDIR=str(tmp_path))
    )
    assert proc.returncode == 0, proc.stderr
    path, rows = proc.stdout.split()
    assert rows == "1" and Path(path).parent == tmp_path
    assert not Path(path).exists()  # removed when the process (a notebook's kernel) exited
    nb = json.loads((Path(__file__).resolve().parents[3] / "notebooks" / "replay.ipynb").read_text())
    src = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "mkdtemp" in src and "atexit.register(shutil.rmtree, path" in src
