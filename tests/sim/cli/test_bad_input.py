"""Issue 12, the CLI rows: each bad input through the real CLI gives exit code 2 and one line
naming the option (no traceback); output folders are checked before any simulation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sigint import as_from_a_shell

SMALL = ["--trace", "synthetic:chat:sessions=3,turns=2", "--no-progress"]


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _one_line_error(res, message: str) -> None:
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert text.splitlines() == [text], text
    assert text == f"Error: {message}", text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--alpha", "nan"], "--alpha must be a finite number >= 0 or 'auto', not 'nan'"),
        (["--alpha", "inf"], "--alpha must be a finite number >= 0 or 'auto', not 'inf'"),
        (["--alpha", "-1"], "--alpha must be a finite number >= 0 or 'auto', not '-1'"),
        (["--sessions-per-second", "nan"], "--sessions-per-second must be a finite number > 0, not nan"),
        (["--sessions-per-second", "inf"], "--sessions-per-second must be a finite number > 0, not inf"),
        (
            ["--capacity", "1GB,,5GB"],
            "cannot read size '1GB,,5GB' (examples: 5GB, 512MiB, 1e9); one capacity per run, lists are for `marconi sweep`",
        ),
        (["--capacity", "1e999"], "size '1e999' is too large (use inf for a cache that never evicts)"),
        (["--duel-candidates", "lru,x"], "--duel-candidates must look like 0:2:0.1 or 0,0.5,1, not 'x'"),
        (["--duel-candidates", "lru,nan"], "--duel-candidates needs finite alphas >= 0, not 'nan'"),
        (["--alpha-grid", "0,inf"], "--alpha-grid needs finite alphas >= 0, not '0,inf'"),
        (["--seed", "-1", "--arrival", "poisson"], "--seed must be >= 0, not -1"),
        (
            ["--alpha-grid", "0:1e9:1e-9"],
            "--alpha-grid '0:1e9:1e-9' has 1,000,000,000,000,000,001 alphas (at most 1,000)",
        ),
        (["--alpha-grid", "0:inf:1"], "--alpha-grid must look like 0:2:0.1 or 0,0.5,1, not '0:inf:1'"),
        (["--duel-margin", "nan"], "--duel-every and --duel-window must be >= 1, --duel-margin >= 0"),
        (["--trace-seed", "-1"], "--trace-seed must be >= 0 (got -1)"),
    ],
)
def test_run_bad_values(runner, args, message):
    _one_line_error(runner.invoke(main, ["run", *SMALL, *args]), message)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--alpha", "nan"], "--alpha must be a finite number >= 0 or 'auto', not nan"),
        (["--sessions-per-second", "1,nan"], "--sessions-per-second must be a finite number > 0, not nan"),
        (["--capacity", "1GB,,5GB"], "--capacity: empty value in the list '1GB,,5GB'"),
        (["--capacity", "1GB,"], "--capacity: empty value in the list '1GB,'"),
    ],
)
def test_sweep_bad_values_before_running(runner, tmp_path, args, message):
    out = tmp_path / "res"
    _one_line_error(runner.invoke(main, ["sweep", *SMALL, "--out", str(out), *args]), message)
    assert not out.exists()


def test_capacity_in_scientific_notation_is_accepted(runner):
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--capacity", "1e9", "--format", "json"])
    assert res.exit_code == 0, res.output
    res2 = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--capacity", "1GB", "--format", "json"])
    assert json.loads(res.stdout) == json.loads(res2.stdout)


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "somefile"
    f.write_text("x")
    return f


@pytest.mark.parametrize("cmd", ["run", "sweep", "plot"])
def test_out_that_cannot_be_a_folder_is_refused_before_any_work(runner, tmp_path, a_file, cmd):
    # the trace does not exist: reaching the error about --out proves nothing was loaded or run
    head = {
        "run": ["run", "--trace", "mooncake:/nonexistent.jsonl"],
        "sweep": ["sweep", "--trace", "mooncake:/nonexistent.jsonl"],
        "plot": ["plot", str(tmp_path)],
    }[cmd]
    res = runner.invoke(main, [*head, "--out", "/proc/x"])
    _one_line_error(res, "--out /proc/x: cannot create or write the folder (No such file or directory)")
    sub = a_file / "sub"
    res = runner.invoke(main, [*head, "--out", str(sub)])
    _one_line_error(res, f"--out {sub}: is inside {a_file}, which is a file, not a folder")


def test_failed_sweep_leaves_no_empty_out_folder(runner, tmp_path):
    out = tmp_path / "deep" / "res"
    res = runner.invoke(main, ["sweep", "--trace", "mooncake:/nonexistent.jsonl", "--out", str(out), "--no-progress"])
    assert res.exit_code != 0
    assert not (tmp_path / "deep").exists()
    res = runner.invoke(main, ["sweep", *SMALL, "--policy", "sglang+", "--out", str(out), "--dry-run"])
    assert res.exit_code == 0 and "1 configuration ->" not in res.output and "= 1 configuration" in res.output
    assert not (tmp_path / "deep").exists()  # a dry run creates nothing


def test_plot_corrupt_results_file(runner, tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "results"
    results.mkdir()
    bad = results / "0123abcd.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file PAR1")
    res = runner.invoke(main, ["plot", str(results), "--out", str(tmp_path / "fig")])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"Error: cannot read results file {bad}: ")
    assert res.output.strip().endswith("(delete it and rerun the sweep to recompute it)")
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "fig").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "x"])
def test_plot_static_alpha_must_be_finite(runner, tmp_path, value):
    pytest.importorskip("matplotlib")
    res = runner.invoke(main, ["plot", str(tmp_path), "--alpha", value, "--out", str(tmp_path / "fig")])
    _one_line_error(res, f"--alpha must be best, all or a finite number >= 0, not {value!r}")


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    """A real interpreter in which matplotlib cannot be imported (as in a base install)."""
    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.pyplot'] = None\n"
        "from sim.cli import main\n"
        f"main(['plot', {str(tmp_path)!r}, '--out', {str(tmp_path / 'fig')!r}])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "Error: marconi plot needs matplotlib: pip install 'marconi-sim[notebooks]'"
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert "marconi-sim[notebooks]" in readme


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals to a process group")
def test_ctrl_c_in_run_exits_130(tmp_path):
    marconi = Path(sys.executable).parent / "marconi"
    proc = subprocess.Popen(
        [str(marconi), "run", "--trace", "synthetic:agent:sessions=400", "--progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=as_from_a_shell,
        env=dict(os.environ, MARCONI_CACHE_DIR=str(tmp_path)),
    )
    try:
        os.set_blocking(proc.stderr.fileno(), False)
        err = b""
        t0 = time.monotonic()
        while b"simulating" not in err:  # the simulation is running
            assert proc.poll() is None and time.monotonic() - t0 < 120, err[-500:]
            time.sleep(0.05)
            err += proc.stderr.read() or b""
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
        time.sleep(0.1)
        err += proc.stderr.read() or b""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = [ln for ln in err.decode().replace("\r", "\n").splitlines() if ln.strip() and "simulating" not in ln]
    assert proc.returncode == 130 and lines == ["Interrupted."], (proc.returncode, err[-1000:])


def test_traces_stats_refuses_two_traces(runner):
    res = runner.invoke(main, ["traces", "stats", "synthetic:chat", "--trace", "sharegpt"])
    _one_line_error(res, "the trace is given twice ('synthetic:chat' and --trace 'sharegpt'): give one of them")
    res = runner.invoke(main, ["traces", "prepare", "synthetic:chat", "--trace", "sharegpt"])
    _one_line_error(res, "the trace is given twice ('synthetic:chat' and --trace 'sharegpt'): give one of them")
    res = runner.invoke(main, ["traces", "stats", "--trace", "synthetic:chat:sessions=2", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output)["sessions"] == 2  # --trace alone is the trace
    res = runner.invoke(main, ["traces", "stats", "synthetic:chat", "--sessions-per-second", "nan"])
    _one_line_error(res, "--sessions-per-second must be in 1e-06..1e+06 (sessions started per second), not nan")


MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 1024, "output_length": 513, "hash_ids": [0, 1]},
    {"timestamp": 2500, "input_length": 1600, "output_length": 0, "hash_ids": [0, 1, 3, 4]},
]


def test_default_policies_on_a_hash_block_trace_leave_vllm_out(runner, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MOONCAKE_ROWS))
    res = runner.invoke(main, ["run", "--trace", f"mooncake:{path}", "--no-progress"])
    assert res.exit_code == 0, res.output
    header, *rest = res.stdout.splitlines()
    assert header.endswith("| vllm+ left out: checkpoints finer than the trace's 512-token blocks")
    rule = next(i for i, ln in enumerate(rest) if ln.startswith("-------"))  # under the table's header
    assert [ln.split()[0] for ln in rest[rule + 1 : rule + 3]] == ["sglang+", "marconi"]
    res = runner.invoke(main, ["run", "--trace", f"mooncake:{path}", "--no-progress", "--format", "json"])
    assert res.exit_code == 0 and [r["policy"] for r in json.loads(res.stdout)] == ["sglang+", "marconi"]
    assert res.stderr.strip() == "note: vllm+ left out: checkpoints finer than the trace's 512-token blocks"
    # named explicitly, it is still refused with the reason
    res = runner.invoke(main, ["run", "--trace", f"mooncake:{path}", "--no-progress", "--policy", "vllm+"])
    _one_line_error(
        res,
        "policy vllm+ checkpoints every 32 tokens, finer than (or not a multiple of) the trace's 512-token blocks; "
        "--hash-block-tokens runs it on the trace spelled out as tokens",
    )


def test_default_sweep_on_a_hash_block_trace_leaves_vllm_out(runner, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MOONCAKE_ROWS))
    out = tmp_path / "res"
    res = runner.invoke(
        main, ["sweep", "--trace", f"mooncake:{path}", "--out", str(out), "--capacity", "1GB,5GB", "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == "vllm+ left out: checkpoints finer than the trace's 512-token blocks"
    assert (
        lines[1] == f"grid: policy(2) x capacity_bytes(2) = 4 configurations | trace mooncake:{path} | model marconi-7b"
    )
    # a token trace in the grid keeps the whole default list
    res = runner.invoke(
        main,
        [
            "sweep",
            "--trace",
            f"mooncake:{path},synthetic:chat:sessions=2",
            "--out",
            str(tmp_path / "res2"),
            "--dry-run",
        ],
    )
    # ... there, and leaves vllm+ out on the hash-block trace alone (it stayed, and stopped the sweep
    # when its turn came)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[:2] == [
        f"vllm+ on mooncake:{path} left out: checkpoints finer than the trace's blocks",
        "grid: trace(2) x policy(3) = 5 configurations (6 grid points; policies that ignore alpha run once) | "
        "model marconi-7b | capacity 5GB",
    ]


def test_json_has_rejected_and_alpha_and_summary_stores_numbers(runner, tmp_path):
    out = tmp_path / "res"
    res = runner.invoke(
        main,
        [
            "run",
            *SMALL,
            "--policy",
            "vanilla,sglang+,marconi",
            "--capacity",
            "30MB",
            "--format",
            "json",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    rows = {r["policy"]: r for r in json.loads(res.stdout)}
    assert rows["vanilla"]["alpha"] is None and rows["sglang+"]["alpha"] is None
    assert rows["marconi"]["tuned_choice"] is not None  # alpha auto (the default) was tuned
    assert rows["marconi"]["alpha"] == (
        None if rows["marconi"]["tuned_choice"] == "lru" else float(rows["marconi"]["tuned_choice"])
    )
    summary = {s["policy"]: s for s in json.loads((out / "summary.json").read_text())}  # standard JSON: no NaN
    for policy, row in rows.items():
        assert row["rejected"] == summary[policy]["rejected_inserts"]
    tuned = summary["marconi"]["tuned_alpha"]
    assert tuned is None or isinstance(tuned, float)
    res = runner.invoke(main, ["run", *SMALL, "--policy", "marconi", "--alpha", "1.5", "--format", "json"])
    assert json.loads(res.stdout)[0]["alpha"] == 1.5 and json.loads(res.stdout)[0]["tuned_choice"] is None


def test_help_texts(runner):
    run_help = runner.invoke(main, ["run", "--help"]).output
    flat = " ".join(run_help.split())
    assert "--seed INTEGER Seed of the Poisson session starts (--arrival poisson)" in flat
    assert "--sessions-per-second FLOAT Closed-loop traces: sessions started per second" in flat
    assert "by default by the duel tuner" in flat
    assert "request = share of requests that reuse at least one cached token" in flat
    sweep_help = runner.invoke(main, ["sweep", "--help"]).output
    options = " ".join(sweep_help.split()).split(" --")
    assert options and all(o.count("[default:") <= 1 for o in options), [o for o in options if o.count("[default:") > 1]
    assert "--events" not in sweep_help  # writing an event stream is not a sweep knob
    top = runner.invoke(main, ["--help"]).output
    commands = top.split("Commands:")[1]
    assert "..." not in commands  # descriptions are wrapped, not cut
    assert "Replay a trace (default: 100 real ShareGPT sessions) under each policy." in " ".join(top.split())
