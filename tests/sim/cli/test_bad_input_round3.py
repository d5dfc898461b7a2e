"""Issue 47, the third round of bad inputs, through the real CLI: nothing lost (every output resolved
and refused when it is an input, a package file or another output; a lock per output folder; the
user's umask), nothing stale (sweep rows, advise studies and trace caches recomputed when what
they were computed from changed, or when they fail their own check), and the tracebacks of the
round as one line. Files are hashed before and after wherever something could be lost. Signals
(SIGTERM, SIGHUP) are in ``test_stop_signals.py``."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.cli.outdir import LOCK_FILE, input_paths
from traces.hashblock import DATA_DIR, SAMPLES

TINY = "synthetic:chat:sessions=2,turns=2"
SMALL = ["--trace", TINY, "--no-progress"]
SAMPLE = DATA_DIR / SAMPLES[("mooncake", "sample")]


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _one_line(res, message: str, *, prefix: bool = True) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output)
    text = res.output.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert (text.startswith if prefix else text.__eq__)(f"Error: {message}"), text


def _hashes(*roots: Path) -> dict:
    """sha256 of every file under ``roots`` (or of the file itself)."""
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _mooncake(path: Path, rows: int = 12) -> Path:
    """The first ``rows`` rows of the bundled Mooncake sample (a small real trace)."""
    path.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:rows]))
    return path


# ------------------------------------------------------------------ outputs onto inputs, resolved


def test_a_bundled_sample_is_an_input_through_its_short_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert SAMPLE.resolve() in input_paths("mooncake:sample")


@pytest.mark.parametrize("flag", ["--events", "--calibrate"])
def test_outputs_onto_the_bundled_sample_are_refused_even_with_force(runner, flag):
    before = _hashes(DATA_DIR)
    if flag == "--events":
        args = ["run", "--trace", "mooncake:sample", "--no-progress", "--events", str(SAMPLE), "--force"]
    else:
        args = ["replay", "--trace", "mooncake:sample", "--device", "cpu", "--model", "replay-tiny"]
        args += ["--calibrate", str(SAMPLE), "--force", "--no-progress"]
    res = runner.invoke(main, args)
    _one_line(res, f"{flag} ")
    assert "is inside the installed package" in res.output, res.output
    assert _hashes(DATA_DIR) == before


def test_an_output_folder_inside_the_package_is_refused(runner, tmp_path):
    before = _hashes(DATA_DIR)
    res = runner.invoke(main, ["sweep", *SMALL, "--out", str(DATA_DIR / "results")])
    _one_line(res, f"--out {DATA_DIR / 'results'}: is inside the installed package")
    assert _hashes(DATA_DIR) == before and not (DATA_DIR / "results").exists()


def test_advise_out_inside_a_trace_folder_is_refused(runner, tmp_path):
    folder = tmp_path / "traj"
    folder.mkdir()
    (folder / "a.json").write_text("[]")
    before = _hashes(folder)
    res = runner.invoke(
        main, ["advise", "--for", "sglang", "--trace", f"swebench:marconi:{folder}", "--out", str(folder / "adv")]
    )
    _one_line(res, f"--out {folder / 'adv'}: is inside {folder.resolve()}, which is an input of this command")
    assert _hashes(folder) == before and not (folder / "adv").exists()


@pytest.mark.parametrize(
    "cmd, second",
    [
        (["run", *SMALL, "--out", "{d}", "--events", "{d}/summary.json"], "--events {d}/summary.json"),
        (
            ["run", *SMALL, "--out", "{d}", "--events", "{d}/x/../requests.parquet"],
            "--events {d}/x/../requests.parquet",
        ),
        (
            [
                "replay",
                *SMALL,
                "--device",
                "cpu",
                "--model",
                "replay-tiny",
                "--out",
                "{d}",
                "--calibrate",
                "{d}/summary.json",
            ],
            "--calibrate {d}/summary.json",
        ),
    ],
    ids=["run-events", "run-events-dotdot", "replay-calibrate"],
)
def test_two_outputs_of_one_command_on_one_path_are_refused(runner, tmp_path, cmd, second):
    d = tmp_path / "d"
    res = runner.invoke(main, [a.format(d=d) for a in cmd])
    _one_line(res, f"{second.format(d=d)}: is also written by --out {d / Path(second).name} in this command")
    assert not d.exists()


def test_replay_calibrate_onto_a_parent_is_refused_before_the_replay(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(main, ["replay", *SMALL, "--device", "cpu", "--model", "replay-tiny", "--calibrate", "x/.."])
    _one_line(res, "--calibrate x/..: needs a file name", prefix=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "cmd",
    [
        ["run", *SMALL, "--out", ""],
        ["run", *SMALL, "--events", ""],
        ["sweep", *SMALL, "--out", ""],
        ["advise", "--for", "sglang", *SMALL, "--out", ""],
        ["replay", *SMALL, "--device", "cpu", "--model", "replay-tiny", "--calibrate", ""],
    ],
    ids=["run-out", "run-events", "sweep", "advise", "replay"],
)
def test_an_empty_output_name_is_refused(runner, tmp_path, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(main, cmd)
    _one_line(res, "Invalid value for '--")
    assert "needs a name (got an empty one)" in res.output
    assert list(tmp_path.iterdir()) == []


def test_a_second_writer_to_a_locked_folder_is_refused(runner, tmp_path):
    out = tmp_path / "res"
    out.mkdir()
    with open(out / LOCK_FILE, "w") as f:  # a running command's lock (this process stands in for it)
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write("4242\n")
        f.flush()
        for args in (["run", *SMALL, "--out", str(out)], ["sweep", *SMALL, "--out", str(out)]):
            res = runner.invoke(main, args)
            _one_line(res, f"--out {out}: process 4242 is writing there now; wait for it to finish", prefix=True)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
    # released: the command runs, and takes its lock file away when done
    res = runner.invoke(main, ["run", *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["occupancy.parquet", "requests.parquet", "summary.json"]


def test_two_runs_into_one_out_the_second_is_refused(runner, tmp_path):
    out = tmp_path / "res"
    assert runner.invoke(main, ["run", *SMALL, "--out", str(out)]).exit_code == 0
    before = _hashes(out)
    res = runner.invoke(main, ["run", *SMALL, "--capacity", "1GB", "--out", str(out)])
    _one_line(res, "--out: ")
    assert _hashes(out) == before


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_result_files_get_the_users_umask(runner, tmp_path, umask):
    old = os.umask(umask)
    try:
        res = runner.invoke(main, ["run", *SMALL, "--out", str(tmp_path / "r"), "--events", str(tmp_path / "e.jsonl")])
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    for p in [*(tmp_path / "r").iterdir(), tmp_path / "e.jsonl"]:
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask, (p, oct(p.stat().st_mode))


def test_plot_keeps_a_users_figure_without_force(runner, tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "s"
    res = runner.invoke(
        main, ["sweep", *SMALL, "--policy", "marconi", "--alpha", "0", "--out", str(results), "--workers", "1"]
    )
    assert res.exit_code == 0, res.output
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "hit-rate.png").write_bytes(b"my own figure")
    res = runner.invoke(main, ["plot", str(results), "--out", str(figs)])
    _one_line(res, f"--out: {figs / 'hit-rate.png'} already exists; pass --force to replace", prefix=True)
    assert (figs / "hit-rate.png").read_bytes() == b"my own figure"
    res = runner.invoke(main, ["plot", str(results), "--out", str(figs), "--force"])
    assert res.exit_code == 0, res.output
    assert (figs / "hit-rate.png").read_bytes()[:4] == b"\x89PNG"


def test_advise_keeps_a_users_advice_json_without_force(runner, tmp_path):
    pytest.importorskip("optuna")
    out = tmp_path / "adv"
    out.mkdir()
    (out / "advice.json").write_text("mine")
    trace = _mooncake(tmp_path / "m.jsonl")
    args = ["advise", "--for", "sglang", "--trace", f"mooncake:{trace}", "--trials", "1", "--workers", "1"]
    res = runner.invoke(main, [*args, "--out", str(out), "--no-progress"])
    _one_line(res, f"--out: {out / 'advice.json'} already exists; pass --force to replace")
    assert (out / "advice.json").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["advice.json"]


# ------------------------------------------------------------------ nothing stale


def test_a_sweep_rerun_after_its_trace_changed_recomputes(runner, tmp_path):
    trace = _mooncake(tmp_path / "m.jsonl", rows=12)
    out = tmp_path / "s"
    args = ["sweep", "--trace", f"mooncake:{trace}", "--policy", "sglang+", "--out", str(out), "--workers", "1"]
    res = runner.invoke(main, [*args, "--no-progress"])
    assert res.exit_code == 0, res.output
    import pandas as pd

    assert pd.read_parquet(out)["requests"].tolist() == [12]
    res = runner.invoke(main, [*args, "--no-progress"])
    assert "already done: 1, to run: 0" in res.output and "note:" not in res.output
    trace.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:7]))  # now 7 rows
    res = runner.invoke(main, [*args, "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "already done: 0, to run: 1" in res.output
    assert "note: 1 stored result computed from other inputs (the trace or timing file changed" in res.output
    assert pd.read_parquet(out)["requests"].tolist() == [7]


def test_a_sweep_row_whose_trace_was_edited_in_place_is_recomputed(runner, tmp_path):
    """Same size, mtime set back: only the content sample tells."""
    trace = _mooncake(tmp_path / "m.jsonl", rows=12)
    out = tmp_path / "s"
    args = ["sweep", "--trace", f"mooncake:{trace}", "--policy", "sglang+", "--out", str(out), "--workers", "1"]
    assert runner.invoke(main, [*args, "--no-progress"]).exit_code == 0
    st = trace.stat()
    data = bytearray(trace.read_bytes())
    i = data.index(b'"output_length": ') + len(b'"output_length": ')
    data[i] = ord("9") if data[i] != ord("9") else ord("8")
    trace.write_bytes(bytes(data))
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = runner.invoke(main, [*args, "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "already done: 0, to run: 1" in res.output and "computed from other inputs" in res.output


def test_an_advise_study_on_a_changed_trace_starts_again_and_keeps_the_old_one(runner, tmp_path):
    pytest.importorskip("optuna")
    trace = _mooncake(tmp_path / "m.jsonl", rows=12)
    out = tmp_path / "adv"
    args = ["advise", "--for", "sglang", "--trace", f"mooncake:{trace}", "--trials", "1", "--workers", "1"]
    args += ["--out", str(out), "--no-progress", "--format", "json"]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    old = (out / "study.journal").read_bytes()
    _mooncake(trace, rows=8)
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert f"note: the trace changed since the study in {out} ran" in res.output
    assert (out / "study.journal.stale-1").read_bytes() == old
    assert json.loads(res.stdout[res.stdout.index("{") :])["trials"] == 1


def _cached_trace(runner, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MARCONI_CACHE_DIR", str(cache))
    conv = [
        {"from": "human", "value": "Explain how a prefix cache reuses the state of a shared prompt."},
        {"from": "gpt", "value": "It keeps the recurrent state at the end of the prefix and restores it."},
        {"from": "human", "value": "And when the cache is full?"},
        {"from": "gpt", "value": "It evicts the entries that are least likely to be reused."},
    ]
    src = tmp_path / "sg.json"
    src.write_text(json.dumps([{"id": "a", "conversations": conv}, {"id": "b", "conversations": conv[:2]}]))
    args = ["traces", "stats", "--trace", f"sharegpt:{src}", "--min-rounds", "1", "--format", "json"]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    files = list((cache / "traces").glob("*.npz"))
    assert len(files) == 1
    return args, files[0], json.loads(res.stdout)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "arrays-cut"])
def test_a_trace_cache_that_fails_its_check_is_rebuilt_and_said_so(runner, tmp_path, monkeypatch, damage):
    args, path, stats = _cached_trace(runner, tmp_path, monkeypatch)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff" * 100)
    else:  # a valid npz whose token buffer and input lengths were cut, the header kept
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["tokens"] = arrays["tokens"][:40]
        arrays["in_len"] = np.minimum(arrays["in_len"], 20)
        arrays["in_off"] = np.zeros_like(arrays["in_off"])
        arrays["out_off"] = np.zeros_like(arrays["out_off"])
        arrays["out_len"] = np.minimum(arrays["out_len"], 20)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert f"note: trace cache {path} failed its check (" in res.output and "): rebuilt" in res.output
    assert json.loads(res.stdout) == stats
    # rebuilt and sound: the next load is a plain hit, no note
    res = runner.invoke(main, args)
    assert res.exit_code == 0 and "note:" not in res.output, res.output


# ------------------------------------------------------------------ tracebacks of the round, now one line


def test_sweep_resume_folder_entries_of_the_wrong_kind(runner, tmp_path):
    out = tmp_path / "s"
    args = ["sweep", *SMALL, "--policy", "marconi", "--alpha", "0", "--out", str(out), "--workers", "1"]
    assert runner.invoke(main, args).exit_code == 0
    (row,) = [p for p in out.glob("*.parquet")]
    row.unlink()
    row.mkdir()  # a folder where the row file goes
    before = _hashes(out)
    res = runner.invoke(main, args)
    _one_line(res, f"{row} is a folder where the sweep keeps a result file: move it away and rerun", prefix=False)
    assert _hashes(out) == before
    row.rmdir()
    (out / "_requests").write_text("not a folder")
    res = runner.invoke(main, [*args, "--save-requests"])
    _one_line(
        res, f"{out / '_requests'} is a file where the sweep keeps a folder: move it away and rerun", prefix=False
    )


@pytest.mark.parametrize("kind", ["binary", "folder", "foreign-json"])
def test_a_study_journal_that_is_not_one_is_one_line(runner, tmp_path, kind):
    pytest.importorskip("optuna")
    out = tmp_path / "adv"
    out.mkdir()
    journal = out / "study.journal"
    if kind == "binary":
        journal.write_bytes(bytes(range(256)) * 4)
    elif kind == "folder":
        journal.mkdir()
    else:
        journal.write_text('{"op_code": 0, "worker_id": "x"}\n{"hello": 1}\n')
    before = _hashes(out)
    trace = _mooncake(tmp_path / "m.jsonl")
    res = runner.invoke(
        main,
        [
            "advise",
            "--for",
            "sglang",
            "--trace",
            f"mooncake:{trace}",
            "--trials",
            "1",
            "--workers",
            "1",
            "--out",
            str(out),
        ],
    )
    _one_line(res, f"{journal} ")
    assert "move it away or choose another --out" in res.output or "move it away" in res.output
    assert _hashes(out) == before


def test_a_foreign_parquet_in_a_results_folder_is_one_line(runner, tmp_path):
    pytest.importorskip("matplotlib")
    import pandas as pd

    out = tmp_path / "s"
    res = runner.invoke(
        main, ["sweep", *SMALL, "--policy", "marconi", "--alpha", "0", "--out", str(out), "--workers", "1"]
    )
    assert res.exit_code == 0, res.output
    pd.DataFrame({"a": [1, 2]}).to_parquet(out / "mine.parquet")
    res = runner.invoke(main, ["plot", str(out), "--out", str(tmp_path / "f")])
    _one_line(
        res,
        f"{out / 'mine.parquet'} is not a row of `marconi sweep` (no config_id, policy, alpha_mode, capacity_bytes "
        f"column): move it out of {out}",
        prefix=False,
    )


def test_a_non_utf8_swebench_jsonl_is_one_line(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("MARCONI_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "trajs.jsonl"
    bad.write_bytes(b'{"instance_id": "x", "trajectory": "caf\xe9"}\n')
    res = runner.invoke(main, ["run", "--trace", f"swebench:{bad}", "--no-progress"])
    assert res.exit_code == 2 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, (
        res.output
    )


def test_copying_the_package_sample_elsewhere_is_fine(runner, tmp_path):
    """The refusal is about the package's file, not the name: a user's copy may be replaced."""
    copy = tmp_path / "m.jsonl"
    shutil.copy(SAMPLE, copy)
    res = runner.invoke(main, ["run", "--trace", "mooncake:sample", "--no-progress", "--events", str(copy), "--force"])
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------ options that cannot act, numbers out of range

MOONCAKE3 = ["--trace", "mooncake:sample", "--session-range", "0:3", "--no-progress"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            [*SMALL, "--policy", "marconi", "--scheduler", "fcfs", "--max-num-seqs", "8"],
            "--max-num-seqs does nothing under --scheduler fcfs (it is read by --scheduler continuous): leave it out",
        ),
        (
            [*SMALL, "--policy", "marconi", "--mode", "sequential", "--max-num-batched-tokens", "512"],
            "--max-num-batched-tokens does nothing under the sequential mode",
        ),
        ([*SMALL, "--policy", "sglang+", "--duel-every", "5"], "--duel-every does nothing here: tuning knobs are read"),
        ([*SMALL, "--policy", "marconi", "--alpha", "1", "--duel-window", "50"], "--duel-window does nothing here"),
        (
            [*SMALL, "--policy", "marconi", "--tuner", "replay", "--duel-margin", "0.1"],
            "--duel-margin does nothing with --tuner replay (the duel tuner reads it)",
        ),
        (
            [*SMALL, "--policy", "marconi", "--bootstrap-multiplier", "3"],
            "--bootstrap-multiplier does nothing with the duel tuner (--tuner replay reads it)",
        ),
        (
            ["--trace", "mooncake:sample", "--sessions", "5", "--no-progress"],
            "--sessions does nothing for mooncake traces (it is read by sharegpt, lmsys, swebench, synthetic); "
            "--session-range keeps sessions of any trace",
        ),
        (
            [*SMALL, "--min-rounds", "3"],
            "--min-rounds does nothing for synthetic traces (it is read by sharegpt, lmsys)",
        ),
        ([*SMALL, "--time-scale", "2"], "--time-scale does nothing for synthetic traces"),
        (
            [*SMALL, "--sessions-per-second", "1e-320"],
            "--sessions-per-second must be in 1e-06..1e+06 (sessions started per second), not 1e-320",
        ),
        ([*MOONCAKE3, "--time-scale", "1e-320"], "--time-scale must be in 1e-06..1e+06 (got 1e-320)"),
        (
            [*SMALL, "--policy", "sglang", "--gpu-memory", "10GB", "--capacity", "1GB"],
            "--gpu-memory 10GB replaces --capacity 1GB for sglang (its engine splits the memory): give one of them",
        ),
        (
            [*SMALL, "--policy", "sglang", "--gpu-memory", "10GB", "--mamba-full-memory-ratio", "1e6"],
            "the engine's split of --gpu-memory 10GB leaves ",
        ),
    ],
    ids=[
        "max-num-seqs-fcfs",
        "batched-tokens-sequential",
        "duel-sglang+",
        "duel-static-alpha",
        "duel-replay-tuner",
        "replay-knob-duel-tuner",
        "sessions-hashblock",
        "min-rounds-synthetic",
        "time-scale-closed-loop",
        "rate-denormal",
        "time-scale-denormal",
        "gpu-memory-and-capacity",
        "no-kv-room",
    ],
)
def test_options_that_cannot_act_and_numbers_out_of_range_are_refused(runner, tmp_path, args, message):
    res = runner.invoke(main, ["run", *args, "--out", str(tmp_path / "r")])
    _one_line(res, message)
    assert not (tmp_path / "r").exists()


def test_every_request_missing_for_lack_of_kv_names_the_shortest_request(runner):
    res = runner.invoke(
        main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", "10GB", "--mamba-full-memory-ratio", "1e6"]
    )
    _one_line(res, "the engine's split of --gpu-memory 10GB leaves ")
    assert "every request would miss; lower --mamba-full-memory-ratio (1e+06) or give more memory" in res.output


def test_gpu_memory_is_what_the_header_and_summary_say(runner, tmp_path):
    res = runner.invoke(
        main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", "10GB", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    assert "| capacity 10GB |" in res.stdout.splitlines()[0]
    (row,) = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert row["capacity_bytes"] == 10**10 and row["gpu_memory"] == "10GB"
    # the same figure given twice is no contradiction
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", "10GB", "--capacity", "10GB"])
    assert res.exit_code == 0, res.output


def _timing(tmp_path: Path, name: str, edit) -> Path:
    d = json.loads((Path(__file__).parents[3] / "sim" / "data" / "h200-timing.json").read_text())
    edit(d)
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(d).replace('"NAN"', "NaN"))
    return p


TIMING_CASES = {
    "all-zero": (lambda d: d.update(ms_per_tflop=dict.fromkeys(d["ms_per_tflop"], 0.0)), "every compute term is 0"),
    "1e300-term": (lambda d: d["ms_per_tflop"].update(mlp_linear=1e300), "term mlp_linear of 1e+300 ms per TFLOP"),
    "1e9-gpus": (
        lambda d: d.update(gpus=10**9),
        "gpus 1,000,000,000 is more than a tensor-parallel group may have (at most 64)",
    ),
    "negative-peak": (lambda d: d.update(peak_tflops=-5), "peak_tflops must be a finite number >= 0, not -5"),
    "nan-peak": (lambda d: d.update(peak_tflops="NAN"), "peak_tflops must be a finite number >= 0, not nan"),
    "faster-than-device": (
        lambda d: (d.update(peak_tflops=0), d["ms_per_tflop"].update(mlp_linear=0.5)),
        "term mlp_linear runs at 2,000 TFLOP/s per GPU, faster than the h200's peak (989 TFLOP/s): not physical",
    ),
    "huge-call": (lambda d: d.update(call_ms=1e300), "call_ms 1e+300 ms is beyond any machine"),
}


@pytest.mark.parametrize("case", list(TIMING_CASES))
def test_a_timing_file_that_describes_no_machine_is_refused(runner, tmp_path, case):
    edit, message = TIMING_CASES[case]
    path = _timing(tmp_path, case, edit)
    res = runner.invoke(main, ["run", *SMALL, "--model", "qwen3.5-9b", "--policy", "marconi", "--timing", str(path)])
    _one_line(res, f"timing file {path}: {message}")


def test_a_sweep_checks_its_timing_files_before_any_configuration_runs(runner, tmp_path):
    good = _timing(tmp_path, "good", lambda d: None)
    bad = _timing(tmp_path, "bad", TIMING_CASES["all-zero"][0])
    out = tmp_path / "s"
    res = runner.invoke(
        main,
        ["sweep", *SMALL, "--model", "qwen3.5-9b", "--policy", "marconi", "--alpha", "0", "--out", str(out)]
        + ["--timing", str(good), "--timing", str(bad), "--workers", "1"],
    )
    _one_line(res, f"timing file {bad}: every compute term is 0")
    assert not out.exists()


def test_a_timing_file_with_the_jamba_table_is_refused(runner, tmp_path):
    path = _timing(tmp_path, "good", lambda d: None)
    res = runner.invoke(main, ["run", *SMALL, "--model", "qwen3.5-9b", "--timing", str(path), "--ttft-model", "jamba"])
    _one_line(res, "--timing does nothing with --ttft-model jamba (the Jamba table times prefills): leave one out")


@pytest.mark.parametrize(
    "args, message",
    [
        (["sweep", "--trace", "mooncake:sample", "--sessions", "3"], "--sessions does nothing for mooncake traces"),
        (["sweep", *SMALL, "--policy", "sglang+", "--duel-every", "3,5"], "--duel-every does nothing here"),
        (
            [
                "replay",
                *SMALL,
                "--device",
                "cpu",
                "--model",
                "replay-tiny",
                "--scheduler",
                "fcfs",
                "--max-num-seqs",
                "4",
            ],
            "--max-num-seqs does nothing under --scheduler fcfs",
        ),
        (
            [
                "replay",
                *SMALL,
                "--device",
                "cpu",
                "--model",
                "replay-tiny",
                "--mode",
                "sequential",
                "--coast-steps",
                "2",
            ],
            "--coast-steps does nothing under --scheduler fcfs",
        ),
        (["advise", "--for", "sglang", "--trace", "mooncake:sample", "--sessions", "3"], "--sessions does nothing"),
        (["advise", "--for", "sglang", *SMALL, "--sessions-per-second", "1e-320"], "--sessions-per-second must be in"),
    ],
    ids=["sweep-sessions", "sweep-duel", "replay-seqs", "replay-coast", "advise-sessions", "advise-rate"],
)
def test_other_commands_refuse_the_same_before_any_work(runner, tmp_path, args, message):
    out = ["--calibrate", str(tmp_path / "o" / "t.json")] if args[0] == "replay" else ["--out", str(tmp_path / "o")]
    res = runner.invoke(main, [*args, *out])
    _one_line(res, message)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ linear refusals, visible progress


def test_a_huge_sharegpt_record_is_decoded_in_a_logarithmic_number_of_attempts(monkeypatch):
    """A record larger than the read buffer was decoded again after every 1 MB read (a 240 MB
    record took 30-41 s, 120 MB 55 s): now the buffer doubles, so a 24 MB record takes about
    log2(24) + 1 attempts, not 24, and the work is linear in its size."""
    import io

    from traces import sharegpt

    calls = []
    real = sharegpt.json.JSONDecoder.raw_decode

    def counting(self, s, idx=0):
        calls.append(len(s) - idx)
        return real(self, s, idx)

    monkeypatch.setattr(sharegpt.json.JSONDecoder, "raw_decode", counting)
    value = "ab" * (12 << 20)
    data = json.dumps([{"id": "x", "conversations": [{"from": "human", "value": value}]}]).encode()
    records = list(sharegpt.JsonRecordReader(io.BytesIO(data), "big.json"))
    assert len(records) == 1 and records[0][0]["conversations"][0]["value"] == value
    assert len(calls) <= 7, len(calls)
    assert sum(calls) <= 3 * len(data), (sum(calls), len(data))  # characters scanned: linear


def test_a_huge_json_lines_record_spanning_many_reads_is_one_record():
    import io

    from traces import sharegpt

    value = "x" * (5 << 20)
    rows = [{"id": "a", "conversations": [{"from": "human", "value": value}]}, {"id": "b", "conversations": []}]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    out = list(sharegpt.JsonRecordReader(io.BytesIO(data), "big.jsonl"))
    assert [(r["id"], line) for r, line in out] == [("a", 1), ("b", 2)]
    assert out[0][0]["conversations"][0]["value"] == value


def test_a_large_trace_file_shows_progress_while_read(runner, monkeypatch):
    import traces.jsonl

    monkeypatch.setattr(traces.jsonl, "PROGRESS_BYTES", 0)  # the bundled sample counts as large
    res = runner.invoke(main, ["traces", "stats", "--trace", "mooncake:sample", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert f"reading {SAMPLE.name}" in res.output


def test_replay_holds_its_output_folders_locked_while_it_replays(runner, tmp_path, monkeypatch):
    """Issue 47: ``replay --out D --calibrate E/t.json`` keeps D and E locked for the whole replay
    (not only while it checks its outputs), so a second writer cannot interleave its files."""
    pytest.importorskip("torch")
    import sim.replay.session as session
    from sim.errors import UsageError

    out, cal = tmp_path / "out", tmp_path / "cal"
    out.mkdir()  # there before the replay: kept when it fails (folders it made, still empty, are removed)
    cal.mkdir()
    seen = []

    def probe(*args, **kwargs):
        for folder in (out, cal):
            with open(folder / LOCK_FILE, "a+") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    seen.append((folder.name, "free"))
                except OSError:
                    seen.append((folder.name, "held"))
        raise UsageError("stopped by the test")

    monkeypatch.setattr(session, "run_replay", probe)
    args = ["replay", "--device", "cpu", "--model", "replay-tiny", "--trace", "synthetic:chat", "--requests", "2"]
    res = runner.invoke(main, [*args, "--out", str(out), "--calibrate", str(cal / "t.json"), "--no-progress"])
    _one_line(res, "stopped by the test", prefix=False)
    assert seen == [("out", "held"), ("cal", "held")]
    # released at the end: another command may write there now
    with open(out / LOCK_FILE, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
