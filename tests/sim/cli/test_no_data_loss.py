"""Issue 21, data loss: through the real CLI, with every file's bytes compared before and after.

- ``--events FILE`` / ``run --out DIR`` never replace an existing file without ``--force``, and never
  write onto (or into) an input of the run, even with ``--force``; the refusal comes before any work.
- A sweep resume verifies each stored result (readable, one row, its config id, detail files with the
  row's request count) and recomputes a truncated, emptied or foreign one instead of counting it done.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli import main

SMALL = ["--trace", "synthetic:chat:sessions=3,turns=2", "--no-progress", "--policy", "sglang+"]
BAILIAN = [
    {
        "chat_id": 1,
        "parent_chat_id": -1,
        "turn": 1,
        "timestamp": 0.0,
        "input_length": 32,
        "output_length": 3,
        "type": "text",
        "hash_ids": [1, 2],
    },
    {
        "chat_id": 2,
        "parent_chat_id": 1,
        "turn": 2,
        "timestamp": 1.0,
        "input_length": 48,
        "output_length": 3,
        "type": "text",
        "hash_ids": [1, 2, 3],
    },
]


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(res, start: str) -> str:
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert len(text.splitlines()) == 1 and text.startswith("Error: " + start), text
    return text


@pytest.fixture
def trace(tmp_path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in BAILIAN))
    return path


@pytest.mark.parametrize("force", [False, True])
def test_events_onto_the_trace_is_refused_even_with_force(runner, tmp_path, trace, force):
    before = _snapshot(tmp_path)
    res = runner.invoke(
        main,
        [
            "run",
            "--trace",
            f"bailian:{trace}",
            "--events",
            str(trace),
            "--no-progress",
            *(["--force"] if force else []),
        ],
    )
    _one_line(res, f"--events {trace}: is an input of this command; write the output elsewhere")
    assert _snapshot(tmp_path) == before
    # the trace still loads
    assert runner.invoke(main, ["run", "--trace", f"bailian:{trace}", "--no-progress"]).exit_code == 0


def test_outputs_inside_an_input_folder_and_the_timing_file_are_refused(runner, tmp_path, trace):
    folder = tmp_path / "traj"
    folder.mkdir()
    (folder / "a.jsonl").write_text("{}\n")
    before = _snapshot(tmp_path)
    res = runner.invoke(main, ["run", "--trace", f"swebench:{folder}", "--events", str(folder / "ev.jsonl")])
    _one_line(res, f"--events {folder / 'ev.jsonl'}: is inside {folder.resolve()}, which is an input")
    timing = tmp_path / "timing.json"
    timing.write_text("{}")
    before = _snapshot(tmp_path)
    res = runner.invoke(main, ["run", *SMALL, "--timing", str(timing), "--events", str(timing), "--force"])
    _one_line(res, f"--events {timing}: is an input of this command")
    assert _snapshot(tmp_path) == before


def test_existing_events_file_needs_force(runner, tmp_path):
    ev = tmp_path / "ev.jsonl"
    ev.write_text("keep me\n")
    res = runner.invoke(main, ["run", *SMALL, "--events", str(ev)])
    _one_line(res, f"--events: {ev} already exists; pass --force to replace, or choose another name")
    assert ev.read_text() == "keep me\n"
    res = runner.invoke(main, ["run", *SMALL, "--events", str(ev), "--force"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(ln) for ln in ev.read_text().splitlines()]
    assert rows and {"policy", "event"} <= set(rows[0]) and rows[0]["policy"] == "sglang+"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.jsonl"]  # no temporary file left


def test_run_out_never_replaces_results_without_force(runner, tmp_path):
    out = tmp_path / "res"
    res = runner.invoke(main, ["run", *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["occupancy.parquet", "requests.parquet", "summary.json"]
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    res = runner.invoke(main, ["run", *SMALL, "--capacity", "1GB", "--out", str(out)])
    _one_line(
        res,
        f"--out: {out / 'summary.json'}, {out / 'requests.parquet'}, {out / 'occupancy.parquet'} "
        "already exist; pass --force to replace, or choose another name",
    )
    assert _snapshot(out) == before
    # one of the three is enough to refuse
    (out / "summary.json").unlink()
    (out / "requests.parquet").unlink()
    before = _snapshot(out)
    res = runner.invoke(main, ["run", *SMALL, "--out", str(out)])
    _one_line(res, f"--out: {out / 'occupancy.parquet'} already exists")
    assert _snapshot(out) == before
    res = runner.invoke(main, ["run", *SMALL, "--capacity", "1GB", "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())[0]["capacity_bytes"] == 10**9
    assert (out / "notes.txt").read_text() == "mine"  # --force replaces only the run's own files
    assert sorted(p.name for p in out.iterdir()) == [
        "notes.txt",
        "occupancy.parquet",
        "requests.parquet",
        "summary.json",
    ]


SWEEP = [
    "sweep",
    "--trace",
    "synthetic:chat:sessions=3,turns=2",
    "--policy",
    "sglang+,marconi",
    "--alpha",
    "0,1",
    "--capacity",
    "1GB",
    "--no-progress",
    "--workers",
    "1",
]


def test_sweep_resume_recomputes_truncated_empty_and_foreign_results(runner, tmp_path):
    out = tmp_path / "s"
    res = runner.invoke(main, [*SWEEP, "--out", str(out), "--save-requests"])
    assert res.exit_code == 0 and "ran 3 configurations" in res.output, res.output
    rows = sorted(p for p in out.glob("*.parquet"))
    good = {p.name: p.read_bytes() for p in rows}
    truncated, empty, foreign = rows
    truncated.write_bytes(truncated.read_bytes()[:100])
    empty.write_bytes(b"")
    pd.DataFrame([{"config_id": "someone-else", "requests": 6}]).to_parquet(foreign)
    res = runner.invoke(main, [*SWEEP, "--out", str(out), "--save-requests", "--dry-run"])
    assert "already done: 0, to run: 3" in res.output, res.output
    assert "note: 3 stored results unreadable or incomplete" in res.output
    res = runner.invoke(main, [*SWEEP, "--out", str(out), "--save-requests"])
    assert res.exit_code == 0 and "ran 3 configurations" in res.output, res.output
    assert {p.name: p.read_bytes() for p in out.glob("*.parquet")}.keys() == good.keys()
    for p in out.glob("*.parquet"):
        df = pd.read_parquet(p)
        assert list(df["config_id"]) == [p.stem]
    # a detail file cut short (fewer requests than the row says) is recomputed too
    req = out / "_requests" / rows[0].name
    pd.read_parquet(req).iloc[:2].to_parquet(req)
    res = runner.invoke(main, [*SWEEP, "--out", str(out), "--save-requests"])
    assert "already done: 2, to run: 1" in res.output and "ran 1 configuration" in res.output, res.output
    assert len(pd.read_parquet(req)) == int(pd.read_parquet(rows[0])["requests"].iloc[0])
    res = runner.invoke(main, ["plot", str(out), "--out", str(tmp_path / "fig")])
    assert res.exit_code == 0, res.output


def test_sweep_out_inside_a_trace_folder_is_refused(runner, tmp_path):
    folder = tmp_path / "traj"
    folder.mkdir()
    (folder / "a.jsonl").write_text("{}\n")
    before = _snapshot(tmp_path)
    for out in (folder, folder / "res"):
        res = runner.invoke(main, ["sweep", "--trace", f"swebench:{folder}", "--out", str(out), "--no-progress"])
        what = "is" if out == folder else f"is inside {folder.resolve()}, which is"
        _one_line(res, f"--out {out}: {what} an input of this command; write the output elsewhere")
    assert _snapshot(tmp_path) == before and sorted(p.name for p in folder.iterdir()) == ["a.jsonl"]


def test_input_paths_follow_the_trace_sources(tmp_path, monkeypatch):
    """Only sources whose arg is a path contribute inputs (`TraceSource.path_arg`)."""
    from sim.cli.outdir import input_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat").write_text("")
    (tmp_path / "t.jsonl").write_text("")
    assert input_paths("synthetic:chat") == []
    assert input_paths("mooncake:t.jsonl") == [(tmp_path / "t.jsonl").resolve()]
    assert input_paths("swebench:marconi:chat") == [(tmp_path / "chat").resolve()]
