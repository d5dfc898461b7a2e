"""`marconi plot` writes PNG + SVG for every kind; sim.analysis.report's condensed numbers; the notebooks
execute (nbclient) on a results folder and on their own small sweep, and draw figures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sim.analysis import report
from sim.experiments.grid import expand_grid
from sim.experiments.runners import run_sweep

from .conftest import ROOT, marconi

NOTEBOOKS = ["hit_rates", "alpha_sweep", "ttft"]


@pytest.fixture(scope="module")
def results(tmp_path_factory, trace_files) -> Path:
    out = tmp_path_factory.mktemp("results")
    tasks = expand_grid({"trace": trace_files[:1]}, {
        "policy": ["vanilla", "vllm+", "sglang+", "marconi"], "capacity_bytes": [10**8, 3 * 10**8, 10**9],
        "alpha": [0.0, 1.0, 2.0], "sessions_per_second": [1.0]})
    rep = run_sweep(tasks, out, workers=1, save_requests=True, progress=False)
    assert rep.ran == 3 * 6 and not rep.failed
    return out


def test_plot_cli_writes_png_and_svg(results, tmp_path):
    figs = tmp_path / "figs"
    p = marconi("plot", results, "--kind", "all", "--out", figs)
    for kind in ("hit-rate", "alpha", "ttft", "occupancy"):
        for ext in ("png", "svg"):
            f = figs / f"{kind}.{ext}"
            assert f.stat().st_size > 1000 and str(f) in p.stdout
    assert (figs / "hit-rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (figs / "alpha.svg").read_bytes()[:2000]
    marconi("plot", results, "--kind", "ttft", "--out", tmp_path / "f2", "--where", "capacity_bytes == 1e9",
            "--alpha", "1")
    assert (tmp_path / "f2" / "ttft.svg").exists()
    bad = marconi("plot", results, "--kind", "ttft", "--out", tmp_path / "f3", "--where", "capacity_bytes < 0",
                  check=False)
    assert bad.returncode == 2 and "selects no rows" in bad.stderr


def test_report_condenses_alpha_grid_and_computes_ratios(results):
    rows = report.load(results)
    assert len(rows) == 18
    best = report.condense(rows)
    assert report.order_variants(best["variant"]) == ["vanilla", "vllm+", "sglang+", "marconi (best α)"]
    assert len(best) == 12  # 4 variants x 3 capacities
    stat = rows[rows["alpha_mode"] == "static"]
    for cap, g in stat.groupby("capacity_bytes"):
        got = best[(best["variant"] == "marconi (best α)") & (best["capacity_bytes"] == cap)]["token_hit_rate"]
        assert got.item() == g["token_hit_rate"].max()
    one = report.condense(rows, static=1.0)
    assert set(one.loc[one["policy"] == "marconi", "alpha"]) == {1.0}
    h = report.headline(best)
    pv = report.paired(best, "marconi (best α)", "vllm+")
    pv = pv[pv["token_hit_rate_den"] > 0]
    assert h["marconi"] == "marconi (best α)"
    assert math.isclose(h["ratio_vs_vllm+"], (pv["token_hit_rate_num"] / pv["token_hit_rate_den"]).mean())
    ps = report.paired(best, "marconi (best α)", "sglang+")
    gain = (ps["token_hit_rate_num"] - ps["token_hit_rate_den"]) / ps["token_hit_rate_den"]
    assert math.isclose(h["p95_gain_vs_sglang+"], np.percentile(gain, 95))
    grid = report.alpha_grid(rows)
    assert list(grid.index) == [0.0, 1.0, 2.0] and list(grid.columns) == [0.1, 0.3, 1.0]


def _run_notebook(name: str, tmp_path: Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no figure"
    return nb, outputs


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_on_results_dir(name, results, tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(results))
    nb, outputs = _run_notebook(name, tmp_path)
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert str(results) in text


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_its_own_small_sweep(name, tmp_path, monkeypatch):
    monkeypatch.delenv("RESULTS_DIR", raising=False)
    small = tmp_path / "small"
    monkeypatch.setenv("SMALL_SWEEP_DIR", str(small))
    _run_notebook(name, tmp_path)
    rows = report.load(small)
    assert rows["capacity_bytes"].nunique() == 2 and (rows["requests"] > 0).all()
    assert set(rows["sessions"]) == {10}
