"""`marconi report DIR` and the table `marconi sweep` ends with (issue 45): every configuration of
a results folder, best first by the chosen metric, as a table, CSV or JSON; `--where` filters;
a bad folder, metric or filter is one line and exit 2."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.experiments.store import load_results

GRID = ["--policy", "sglang+,marconi", "--alpha", "0,1", "--capacity", "0.5GB,2GB", "--sessions", "4"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "res"
    res = CliRunner().invoke(main, ["sweep", *GRID, "--out", str(out), "--no-progress", "--workers", "1"])
    assert res.exit_code == 0, res.output
    return out, res.stdout


def _body(text: str) -> list[str]:
    """The table's data lines (after the rule under the header)."""
    lines = text.splitlines()
    rule = next(i for i, x in enumerate(lines) if x.startswith("-------"))
    return [x for x in lines[rule + 1 :] if x.strip()]


def test_sweep_ends_with_its_configurations_best_first(swept):
    out, stdout = swept
    rows = load_results(out)
    assert f"best first by token_hit_rate (all rows, CSV or JSON: marconi report {out}" in stdout
    body = _body(stdout)
    assert len(body) == len(rows) == 6  # sglang+ x 2 capacities, marconi x 2 alphas x 2 capacities
    shown = [float(x.split("%")[0].split()[-1]) for x in body]  # the token hit column
    assert shown == sorted(shown, reverse=True)
    assert shown[0] == pytest.approx(rows["token_hit_rate"].max() * 100, abs=0.005)


def test_report_sorts_by_a_latency_ascending_and_filters(swept):
    out, _ = swept
    rows = load_results(out)
    res = CliRunner().invoke(main, ["report", str(out), "--sort", "evictions", "--format", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert [r["evictions"] for r in got] == sorted(rows["evictions"])
    assert {r["config_id"] for r in got} == set(rows["config_id"])
    assert set(got[0]) >= {"variant", "capacity_bytes", "token_hit_rate", "ttft_p95_ms", "preemptions"}
    res = CliRunner().invoke(main, ["report", str(out), "--where", "capacity=2GB", "--where", "policy=marconi"])
    assert res.exit_code == 0, res.output
    body = _body(res.stdout)
    assert len(body) == 2 and all(x.startswith("marconi α=") for x in body)


def test_report_csv_holds_the_stored_values(swept):
    out, _ = swept
    res = CliRunner().invoke(main, ["report", str(out), "--format", "csv", "--columns", "all"])
    assert res.exit_code == 0, res.output
    csv = pd.read_csv(io.StringIO(res.stdout))
    rows = load_results(out).set_index("config_id")
    assert len(csv) == 6 and "e2e_p95_ms" in csv.columns
    for r in csv.itertuples():
        assert r.ttft_p95_ms == pytest.approx(rows.loc[r.config_id, "ttft_p95_ms"])


def test_report_reads_a_run_out_folder(tmp_path):
    out = tmp_path / "run"
    args = ["run", "--trace", "synthetic:chat:sessions=4", "--policy", "sglang+,marconi", "--no-progress"]
    assert CliRunner().invoke(main, [*args, "--out", str(out)]).exit_code == 0
    res = CliRunner().invoke(main, ["report", str(out), "--sort", "ttft_p50_ms"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    best = min(summary, key=lambda s: s["ttft_p50_ms"])
    assert _body(res.stdout)[0].startswith(best["policy"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sort", "fastest"], "--sort: unknown metric 'fastest'"),
        (["--where", "policy"], "write KEY=VALUE"),
        (["--where", "colour=red"], "no column 'colour'"),
        (["--where", "capacity=7GB"], "selects no rows"),
        (["--where", "capacity=lots"], "--where capacity_bytes=lots"),
        (["--where", "sessions_per_second=fast"], "is a number"),
        (["--columns", "ttft"], "--columns: unknown column 'ttft'"),
    ],
)
def test_bad_report_arguments_are_one_line(swept, args, message):
    out, _ = swept
    res = CliRunner().invoke(main, ["report", str(out), *args])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def test_a_folder_without_results_is_one_line(tmp_path):
    for target in (tmp_path / "missing", tmp_path):
        res = CliRunner().invoke(main, ["report", str(target)])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    (tmp_path / "summary.json").write_text('{"not": "a run"}')
    res = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "is not the summary of `marconi run --out`" in res.stderr


def test_sweep_refuses_an_unknown_sort_before_running(tmp_path):
    res = CliRunner().invoke(main, ["sweep", *GRID, "--out", str(tmp_path / "r"), "--sort", "nope"])
    assert res.exit_code == 2 and "--sort: unknown metric 'nope'" in res.stderr
    assert not (tmp_path / "r").exists()
