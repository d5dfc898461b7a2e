"""Every figure `marconi plot` draws can be read (issue 45): each `--kind` rendered on a small sweep,
and its matplotlib objects inspected: every line labelled in a legend, every panel titled, both axes
labelled with their units, and a panel per configuration family (no curve pools configurations)."""

from __future__ import annotations

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from sim.analysis import plot, report  # noqa: E402
from sim.errors import UsageError  # noqa: E402
from sim.experiments.grid import expand_grid  # noqa: E402
from sim.experiments.runners import run_sweep  # noqa: E402

# an axis is a knob without a unit (alpha), the policies (bars), or has its unit in parentheses
UNITLESS = {"alpha", "policy"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("plots")
    tasks = expand_grid(
        {"trace": ["sharegpt"], "sessions": [3]},
        {
            "policy": ["sglang+", "marconi"],
            "capacity_bytes": [10**9, 2 * 10**9],
            "sessions_per_second": [1.0, 5.0],
            "alpha": [0.0, 1.0],
            "scheduler": ["fcfs", "continuous"],
        },
    )
    run_sweep(tasks, out, workers=1, save_requests=True, progress=False)
    return out


def _legend_labels(fig) -> set[str]:
    texts = set()
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if legend is not None:
            texts |= {t.get_text() for t in legend.get_texts()}
    return texts


@pytest.mark.parametrize("kind", plot.KINDS)
def test_every_kind_labels_its_lines_panels_and_axes(results, kind):
    try:
        fig = plot.make_figure(results, kind)
    except UsageError as exc:  # a kind that needs columns these results do not hold says so
        pytest.skip(f"{kind}: {exc}")
    legend = _legend_labels(fig)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert panels
    drawn = 0
    for ax in panels:
        assert ax.get_title(), f"{kind}: a panel without a title"
        for label in (ax.get_xlabel(), ax.get_ylabel()):
            assert label, f"{kind}: an axis without a label"
            assert "(" in label or label in UNITLESS, f"{kind}: {label!r} has no unit"
        for line in ax.lines:
            drawn += 1
            assert not line.get_label().startswith("_"), f"{kind}: an unlabelled line in {ax.get_title()!r}"
            assert line.get_label() in legend, f"{kind}: {line.get_label()!r} is in no legend"
        for coll in ax.collections:  # markers drawn with scatter (the alpha heatmap's best / auto α)
            if not coll.get_label().startswith("_"):
                assert coll.get_label() in legend
    assert drawn or kind in ("alpha", "misses")
    matplotlib.pyplot.close(fig)


def test_ttft_and_occupancy_draw_a_panel_per_configuration_and_a_curve_per_policy(results):
    rows = report.condense(report.load(results))
    configs = rows.groupby(["capacity_bytes", "sessions_per_second", "scheduler"]).ngroups
    assert configs == 8
    for kind in ("ttft", "occupancy"):
        fig = plot.make_figure(results, kind)
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert len(panels) == configs, kind
        for ax in panels:  # best-alpha condensing: sglang+ and marconi (best α), one curve each
            labels = sorted(line.get_label().split(" [")[0] for line in ax.lines)  # less the scheduler tag
            assert labels == ["marconi (best α)", "sglang+"], kind
        matplotlib.pyplot.close(fig)
    # each TTFT curve is one configuration's requests, not a pool of several
    fig = plot.make_figure(results, "ttft")
    per_config = rows["requests"].iloc[0]
    assert all(len(line.get_xdata()) == per_config for ax in fig.axes for line in ax.lines)
    matplotlib.pyplot.close(fig)


def test_too_many_families_is_one_line(results, monkeypatch):
    monkeypatch.setattr(plot, "MAX_PANELS", 3)
    with pytest.raises(UsageError, match="select some with --where"):
        plot.make_figure(results, "ttft")


def test_the_alpha_heatmap_has_a_row_per_configuration_family(results):
    """Issue 45: the alpha figure no longer averages over the knobs that vary: one row of panels
    (a heatmap per metric) per family, each titled with its family."""
    fig = plot.make_figure(results, "alpha")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>" and ax.images]
    assert len(panels) == 4 * 2  # (1 or 5 sessions/s) x (fcfs, continuous), two metrics each
    titles = [ax.get_title() for ax in panels]
    for family in ("1 session/s", "5 sessions/s", "fcfs", "continuous"):
        assert sum(family in t for t in titles) == 4, (family, titles)
    for ax in panels:  # 2 capacities x 2 static alphas, never a pooled mean of the families
        assert ax.images[0].get_array().shape == (2, 2)
    matplotlib.pyplot.close(fig)
