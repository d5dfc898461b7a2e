"""A results folder written before SimConfig was grouped (tests/data/sweep-row-v2, ROW_VERSION 2,
flat fields) still reads: the same sweep finds every configuration done (same config ids, same
input digests), `marconi report` lists its rows, and today's rows have its columns in its order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from sim.cli import main
from sim.config import SimConfig
from sim.experiments.grid import ROW_VERSION, make_task

FOLDER = Path(__file__).resolve().parents[2] / "data" / "sweep-row-v2"
SWEEP = ["--sessions", "3", "--policy", "sglang+,marconi", "--capacity", "1GB", "--no-progress"]


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "old"
    shutil.copytree(FOLDER, out, ignore=shutil.ignore_patterns("*.md"))
    return out


def test_an_old_folder_resumes_with_nothing_left_to_run(tmp_path):
    out = _copy(tmp_path)
    res = CliRunner().invoke(main, ["sweep", "--out", str(out), *SWEEP, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"already done: 2, to run: 0 -> {out}" in res.output


def test_an_old_folder_reports_its_rows(tmp_path):
    out = _copy(tmp_path)
    res = CliRunner().invoke(main, ["report", str(out), "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("config_id,variant,token_hit_rate")
    assert {line.split(",")[1] for line in lines[1:]} == {"sglang+", "marconi (auto α)"}


def test_rows_keep_the_old_columns_in_their_order():
    assert ROW_VERSION == 2  # the row's meaning and columns are unchanged: no new version
    old = pd.read_parquet(FOLDER / "356c8f6e3ad52d9b3ab2.parquet")
    knobs = [c for c in old.columns if c in set(SimConfig.field_names())]
    assert knobs == SimConfig.field_names()
    task = make_task({"sessions": 3}, policy="sglang+", capacity_bytes=10**9, alpha="auto")
    assert task.config_id == old["config_id"].iloc[0]
    assert list(task.knobs) == list(old.columns[: len(task.knobs)])
    assert {k: v for k, v in task.knobs.items() if k != "alpha"} == {
        k: v for k, v in old.iloc[0].to_dict().items() if k in task.knobs and k != "alpha"
    }
