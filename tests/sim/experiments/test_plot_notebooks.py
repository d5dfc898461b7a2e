"""`marconi plot` writes PNG + SVG for every kind and draws the numbers of the results; the notebooks
execute (nbclient) on a results folder and on their own small sweep, and the numbers they print are
those of the rows they read (recomputed here with plain pandas, not with sim.analysis)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from notebook_kernel import kernel_env

from sim.analysis import report
from sim.experiments.grid import expand_grid
from sim.experiments.runners import run_sweep

from .conftest import ROOT, marconi

NOTEBOOKS = ["hit_rates", "alpha_sweep", "ttft"]


@pytest.fixture(scope="module")
def results(tmp_path_factory, trace_files) -> Path:
    out = tmp_path_factory.mktemp("results")
    tasks = expand_grid(
        {"trace": trace_files[:1]},
        {
            "policy": ["vanilla", "vllm+", "sglang+", "marconi"],
            "capacity_bytes": [10**8, 3 * 10**8, 10**9],
            "alpha": [0.0, 1.0, 2.0],
            "sessions_per_second": [1.0],
        },
    )
    rep = run_sweep(tasks, out, workers=1, save_requests=True, progress=False)
    assert rep.ran == 3 * 6 and not rep.failed
    return out


def test_plot_cli_writes_png_and_svg(results, tmp_path):
    figs = tmp_path / "figs"
    p = marconi("plot", results, "--kind", "all", "--out", figs)
    for kind in ("hit-rate", "alpha", "ttft", "occupancy", "ttft-load"):
        for ext in ("png", "svg"):
            f = figs / f"{kind}.{ext}"
            assert f.stat().st_size > 1000 and str(f) in p.stdout
    assert (figs / "hit-rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (figs / "alpha.svg").read_bytes()[:2000]
    # matplotlib's SVG keeps every text as a comment: the legends and axes say what is drawn
    svg = (figs / "hit-rate.svg").read_text()
    for text in ("vanilla", "vllm+", "sglang+", "marconi (best α)", "cache capacity (GB)", "token hit rate (%)"):
        assert f"<!-- {text} -->" in svg, text
    svg = (figs / "ttft.svg").read_text()
    assert "<!-- TTFT (ms, log scale) -->" in svg and "<!-- cumulative share of requests (fraction) -->" in svg
    svg = (figs / "alpha.svg").read_text()
    assert "<!-- marconi: token hit rate (%) -->" in svg and "<!-- best static α -->" in svg
    marconi(
        "plot", results, "--kind", "ttft", "--out", tmp_path / "f2", "--where", "capacity_bytes == 1e9", "--alpha", "1"
    )
    assert (tmp_path / "f2" / "ttft.svg").exists()
    bad = marconi(
        "plot", results, "--kind", "ttft", "--out", tmp_path / "f3", "--where", "capacity_bytes < 0", check=False
    )
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
    # the headline against the rows themselves (plain pandas, one configuration per capacity here)
    h = report.headline(best)
    by_cap = {v: g.set_index("capacity_bytes")["token_hit_rate"] for v, g in best.groupby("variant")}
    m, v, s = by_cap["marconi (best α)"], by_cap["vllm+"], by_cap["sglang+"]
    assert h["marconi"] == "marconi (best α)" and h["configs"] == 3
    assert math.isclose(h["ratio_vs_vllm+"], (m / v)[v > 0].mean())
    assert math.isclose(h["p95_gain_vs_sglang+"], np.percentile(((m - s) / s)[s > 0], 95))
    grid = report.alpha_grid(rows)
    assert list(grid.index) == [0.0, 1.0, 2.0] and list(grid.columns) == [0.1, 0.3, 1.0]


# ------------------------------------------------------------------ expected numbers, by hand
def raw_rows(folder: Path) -> pd.DataFrame:
    """The row files read with plain pandas (not sim.report / sim.sweep)."""
    return pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))], ignore_index=True)


def best_alpha_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per policy and configuration: for a static-alpha grid, the alpha with the best token
    hit rate (what the notebooks call 'marconi (best α)'); auto-tuned rows are left out."""
    keep = []
    if "scheduler" not in rows.columns:
        rows = rows.assign(scheduler="fcfs")
    for (_, _, _, mode, _), g in rows.groupby(
        ["policy", "capacity_bytes", "sessions_per_second", "alpha_mode", "scheduler"]
    ):
        if mode == "auto":
            continue
        keep.append(g.loc[[g["token_hit_rate"].idxmax()]] if mode == "static" else g)
    return pd.concat(keep, ignore_index=True)


def numbers(text: str) -> list[float]:
    """The numbers of ``text``, thousands separators read (the notebooks print counts as 1,494)."""
    found = re.findall(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+\.\d+(?:[eE][-+]?\d+)?|-?\d+(?:[eE][-+]?\d+)?", text)
    return [float(x.replace(",", "")) for x in found]


def assert_shown(text: str, values, decimals: int) -> None:
    """Every value, rounded as the notebook rounds it, appears among the numbers of ``text``."""
    shown = numbers(text)
    for v in values:
        want = round(float(v), decimals)
        assert any(abs(s - want) <= 0.51 * 10**-decimals for s in shown), (want, text)


def _run_notebook(name: str, tmp_path: Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute(env=kernel_env())
    cells = [c for c in nb.cells if c.cell_type == "code"]
    outputs = [o for c in cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert [o for o in outputs if "image/png" in o.get("data", {})], f"{name} drew no figure"
    shown = {}  # the source of each cell -> what it printed or displayed
    for c in cells:
        shown[c.source.strip()] = "".join(
            o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
            for o in c.get("outputs", [])
        )
    return shown


def _cell(shown: dict, start: str) -> str:
    (text,) = [t for src, t in shown.items() if start in src]
    return text


def check_notebook_numbers(name: str, shown: dict, folder: Path) -> None:
    rows = raw_rows(folder)
    best = best_alpha_rows(rows)
    n_files = len(list(folder.glob("*.parquet")))
    if name == "hit_rates":
        text = _cell(shown, "report.results_dir")
        assert f"{n_files} rows from {folder}" in text
        means = best.groupby(["policy", "capacity_bytes"])["token_hit_rate"].mean()
        assert_shown(_cell(shown, "report.hit_rate_table"), means.values, 4)
        # headline: mean over configurations of marconi / vllm+ (non-zero denominators), by hand
        cfg = ["capacity_bytes", "sessions_per_second"]
        auto = rows[(rows["policy"] == "marconi") & (rows["alpha_mode"] == "auto")]
        # the headline takes the auto-tuned marconi when there is one, else the best static alpha
        m = (auto if len(auto) else best[best["policy"] == "marconi"]).set_index(cfg)["token_hit_rate"]
        v = best[best["policy"] == "vllm+"].set_index(cfg)["token_hit_rate"]
        s = best[best["policy"] == "sglang+"].set_index(cfg)["token_hit_rate"]
        head = _cell(shown, "report.headline")
        ratio = (m / v)[v > 0].mean()
        got = float(re.search(r"'ratio_vs_vllm\+': ([-0-9.e]+|nan)", head).group(1))
        assert got == pytest.approx(ratio, rel=1e-9)
        gain = np.percentile(((m - s) / s)[s > 0], 95)
        got = float(re.search(r"'p95_gain_vs_sglang\+': ([-0-9.e]+|nan)", head).group(1))
        assert got == pytest.approx(gain, rel=1e-9)
    elif name == "alpha_sweep":
        assert f"{n_files} rows from {folder}" in _cell(shown, "report.results_dir")
        stat = rows[(rows["policy"] == "marconi") & (rows["alpha_mode"] == "static")]
        for metric in ("token_hit_rate", "flops_saved_frac"):
            grid = stat.groupby(["alpha", "capacity_bytes"])[metric].mean()
            assert_shown(_cell(shown, f'report.alpha_grid(rows, "{metric}")'), grid.values, 4)
    elif name == "ttft":
        req = pd.concat([pd.read_parquet(p) for p in sorted((folder / "_requests").glob("*.parquet"))])
        text = _cell(shown, "report.results_dir")
        picked = req[req["config_id"].isin(best["config_id"])]
        assert f"{len(best)} configurations, {len(picked)} requests from {folder}" in text
        table = _cell(shown, "report.ttft_table")
        for _, g in best.groupby(["policy", "scheduler"]):
            x = picked[picked["config_id"].isin(g["config_id"])]["ttft_s"].to_numpy() * 1e3
            assert_shown(table, np.percentile(x, [5, 50, 95]), 1)
        # fcfs vs continuous under load: the rows' own TTFT percentiles, averaged over capacities
        load = best.groupby(["policy", "sessions_per_second", "scheduler"])[["ttft_p50_ms", "ttft_p95_ms"]].mean()
        assert_shown(_cell(shown, "report.ttft_under_load"), load.to_numpy().ravel(), 1)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_prints_the_numbers_of_its_results_dir(name, results, tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(results))
    check_notebook_numbers(name, _run_notebook(name, tmp_path), results)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_its_own_small_sweep_and_prints_its_numbers(name, tmp_path, monkeypatch):
    monkeypatch.delenv("RESULTS_DIR", raising=False)
    small = tmp_path / "small"
    monkeypatch.setenv("SMALL_SWEEP_DIR", str(small))
    shown = _run_notebook(name, tmp_path)
    rows = raw_rows(small)
    assert rows["capacity_bytes"].nunique() == 2 and (rows["requests"] > 0).all()
    assert set(rows["sessions"]) == {10}
    check_notebook_numbers(name, shown, small)


# ------------------------------------------------------------------ figures: the data drawn
def test_hit_rate_figure_draws_the_mean_hit_rate_of_each_variant(results):
    from sim.analysis import plot

    fig = plot.make_figure(results, "hit-rate")
    (ax,) = fig.axes
    best = best_alpha_rows(raw_rows(results))
    lines = {ln.get_label(): ln for ln in ax.lines}
    assert set(lines) == {"vanilla", "vllm+", "sglang+", "marconi (best α)"}
    for policy, g in best.groupby("policy"):
        label = "marconi (best α)" if policy == "marconi" else policy
        want = g.groupby("capacity_bytes")["token_hit_rate"].mean()
        x, y = lines[label].get_data()
        assert list(x) == pytest.approx(list(want.index / 1e9))
        assert list(y) == pytest.approx(list(want.values * 100))


def test_ttft_figure_draws_the_empirical_cdf_of_each_variant(results):
    """A panel per configuration (here: per capacity), a curve per variant of that configuration's
    requests alone (issue 45: no curve pools configurations)."""
    from sim.analysis import plot
    from sim.config import format_size

    fig = plot.make_figure(results, "ttft")
    best = best_alpha_rows(raw_rows(results))
    req = pd.concat([pd.read_parquet(p) for p in sorted((results / "_requests").glob("*.parquet"))])
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert set(panels) == {f"{format_size(c)} cache" for c in best["capacity_bytes"].unique()}
    for (policy, cap), g in best.groupby(["policy", "capacity_bytes"]):
        label = "marconi (best α)" if policy == "marconi" else policy
        lines = {ln.get_label(): ln for ln in panels[f"{format_size(cap)} cache"].lines}
        x = np.sort(req[req["config_id"].isin(g["config_id"])]["ttft_s"].to_numpy() * 1e3)
        gx, gy = lines[label].get_data()
        assert np.allclose(gx, np.maximum(x, 1e-3)) and np.allclose(gy, np.arange(1, len(x) + 1) / len(x))


def test_alpha_figure_heatmap_holds_the_alpha_grid(results):
    from sim.analysis import plot

    fig = plot.make_figure(results, "alpha")
    rows = raw_rows(results)
    stat = rows[(rows["policy"] == "marconi") & (rows["alpha_mode"] == "static")]
    for ax, metric in zip([a for a in fig.axes if a.images], ("token_hit_rate", "flops_saved_frac")):
        want = stat.pivot_table(index="alpha", columns="capacity_bytes", values=metric, aggfunc="mean")
        assert np.allclose(ax.images[0].get_array(), want.values * 100)


@pytest.mark.slow
def test_advise_notebook_prints_the_numbers_of_its_studies(tmp_path, monkeypatch):
    """notebooks/advise.ipynb: three workloads (ShareGPT, agent, the Mooncake sample) tuned and
    held out; the comparison table and the 'why' rows show the numbers of the advice each study
    wrote (advice.json)."""
    pytest.importorskip("optuna")
    folder = tmp_path / "adv"
    monkeypatch.setenv("ADVISE_DIR", str(folder))
    monkeypatch.setenv("ADVISE_TRIALS", "4")  # the committed notebook runs 10 a study
    shown = _run_notebook("advise", tmp_path)
    table = _cell(shown, "table = pd.DataFrame(rows)")
    why = _cell(shown, "explain_rows(adv")
    for name in ("sharegpt", "agent", "mooncake"):
        adv = json.loads((folder / name / "advice.json").read_text())
        # a sampled combination the engine refuses (SGLang's mamba pool too small to run one
        # request) is pruned, not counted
        assert 1 <= adv["trials"] <= 4 and adv["parts"]
        for who in ("defaults", "recommended"):
            for part in ("tuned", "held_out"):
                assert_shown(table, [adv[who][part]["token_hit_rate"] * 100], 2)
                assert_shown(table, [adv[who][part]["ttft_p95_ms"]], 1)
            assert_shown(why, [adv[who]["tuned"]["checkpoints_evicted"]], 0)
        assert adv["recommended"]["marconi_run_held_out"] in _cell(shown, "run_held_out")
