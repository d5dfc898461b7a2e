"""Figures of sweep results (``marconi plot RESULTS --kind hit-rate|alpha|ttft|occupancy|ttft-load|misses``).

Every figure is a panel per configuration family (the knobs that vary and the figure does not put
on an axis or a line: capacity, session rate, scheduler, trace...), every line is in a legend, and
every axis says its unit (tests/sim/analysis/test_plot_labels.py checks it).

matplotlib is the optional extra ``notebooks``; it is imported only when a figure is drawn.
Each ``fig_*`` function takes the rows of :func:`sim.analysis.report.load` (and per-request / occupancy
records where needed) and returns a matplotlib Figure; the CLI saves it as PNG and SVG.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from sim.analysis import report
from sim.analysis.report import alpha_grid, auto_alphas, order_variants, ttft_cdf
from sim.errors import UsageError
from sim.experiments.store import load_details

KINDS = ("hit-rate", "alpha", "ttft", "occupancy", "ttft-load", "misses")
#: the miss causes of ``sim.engine.misses`` as summary columns, in stacking order
MISS_CAUSES = (
    "missed_last_token_rule",
    "missed_no_checkpoint",
    "missed_speculative",
    "missed_evicted",
    "missed_held_by_running",
    "missed_insert_rejected",
    "missed_never_shared",
)


def pyplot():
    try:
        import matplotlib.pyplot as plt  # noqa: PLC0415 - optional extra (notebooks), loaded only to draw
    except ImportError:
        raise UsageError("plots need matplotlib: pip install 'marconi-sim[notebooks]'") from None
    return plt


def _facets(df, col: str, limit: int = 6) -> list:
    vals = sorted(df[col].dropna().unique()) if col in df.columns else []
    return vals if 1 < len(vals) <= limit else [None]


def _short(trace: str) -> str:
    return trace if len(trace) <= 28 else "…" + trace[-27:]


#: at most this many panels in one figure (narrow the rows with --where beyond)
MAX_PANELS = 16


def _knob_label(knob: str, value) -> str:
    """A knob's value as a panel title reads it: ``2GB``, ``5 sessions/s``, ``fcfs``."""
    text = report._knob_text(knob, value)
    if knob == "trace":
        return _short(text)
    if knob == "capacity_bytes":
        return f"{text} cache"
    if knob == "sessions_per_second":
        return f"{text} session{'' if text == '1' else 's'}/s"
    if knob == "scheduler":
        return text
    return f"{knob}={text}"


def _families(df, exclude=()):
    """The configuration families of ``df`` (rows sharing every knob that varies, but the
    ``exclude``d ones, which the panel's axes or lines show): [(title, rows)], in knob order.
    The trace names the panel when it is the only knob; more than MAX_PANELS families is a UsageError."""
    knobs = [k for k in report.varying_knobs(df) if k not in exclude]
    if not knobs:
        traces = sorted(df["trace"].astype(str).unique()) if "trace" in df.columns else []
        return [(_short(", ".join(traces)), df)]
    groups = list(df.groupby(knobs, sort=True, dropna=False))
    if len(groups) > MAX_PANELS:
        raise UsageError(
            f"{len(groups)} configuration families ({', '.join(knobs)}) would be {len(groups)} panels: "
            f"select some with --where (at most {MAX_PANELS})"
        )
    out = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        out.append((", ".join(_knob_label(k, v) for k, v in zip(knobs, key)), g))
    return out


def _grid(plt, n: int, width: float = 4.2, height: float = 3.3, sharey: bool = False):
    """A figure of ``n`` panels, up to 3 a row; unused panels hidden. Returns (fig, [axes])."""
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.6), squeeze=False, sharey=sharey)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


#: a scheduler's line style where the rows mix schedulers (``report.scheduler_tag``'s labels)
_SCHEDULER_LINES = {"continuous": "-", "fcfs": "--"}


def _series_styles(variants) -> dict[str, dict]:
    """One style per series of a figure, the same in every panel: a colour per policy variant
    (the label without its `` [scheduler]`` tag; one policy under two schedulers drew the same
    colour and line twice, and a panel without some variant shifted the others' colours), a line
    style per scheduler (continuous solid, fcfs dashed)."""
    bases: dict[str, int] = {}
    out = {}
    for v in order_variants(variants):
        m = re.fullmatch(r"(.*) \[([\w-]+)\]", v)
        base, sched = (m[1], m[2]) if m else (v, "")
        i = bases.setdefault(base, len(bases))
        line = _SCHEDULER_LINES.get(sched, ":") if sched else "-"
        out[v] = {"color": f"C{i % 10}", "linestyle": line}
    return out


def _figure_legend(fig, axes, top: float = 0.9) -> None:
    """One legend for the whole figure, every line's label once, above the panels."""
    seen: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="upper center", ncol=min(len(seen), 4), frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, top))


def fig_hit_rate(df, metric: str = "token_hit_rate"):
    """Metric vs cache capacity, a line per policy variant, a panel per configuration family (the
    other knobs that vary: trace, session rate, scheduler...). Expects a condensed frame
    (report.condense)."""
    plt = pyplot()
    panels = _families(df, exclude=("capacity_bytes",))
    fig, axes = _grid(plt, len(panels), 3.8, 3.0, sharey=True)
    variants = order_variants(df["variant"])
    styles = _series_styles(variants)
    for ax, (title, sub) in zip(axes, panels):
        for v in variants:
            g = sub[sub["variant"] == v].groupby("capacity_gb")[metric].mean()
            if len(g):
                ax.plot(g.index, g.values * 100, marker="o", label=v, **styles[v])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("cache capacity (GB)")
        ax.set_ylabel(metric.replace("_", " ") + " (%)")
        ax.grid(alpha=0.3)
    rows = -(-len(panels) // 3)
    _figure_legend(fig, axes, top=1 - 0.45 / (3.0 * rows + 0.6))
    return fig


class NotInRows(UsageError):
    """The selected rows hold nothing this figure draws (no static-alpha rows, no missed-token
    counts): ``plot --kind all`` names it and draws the others."""


def fig_alpha(df, policy: str = "marconi", metrics=("token_hit_rate", "flops_saved_frac")):
    """Heatmaps over alpha x capacity (static-alpha rows), a row of panels (one per metric) per
    configuration family (the other knobs that vary: session rate, scheduler, trace...), never
    averaged across families; auto-tuned alphas marked with a star where the tuner reports the
    chosen alpha, the best static alpha of each capacity with a square."""
    plt = pyplot()
    mine = df[df["policy"] == policy] if "policy" in df.columns else df
    if alpha_grid(mine, metrics[0], policy).empty:
        raise NotInRows(f"no static-alpha rows of policy {policy!r} to plot (sweep --alpha a:b:step)")
    alpha_knobs = [c for c in ("alpha", "alpha_mode", "tuner", "capacity_bytes", "policy") if c in mine.columns]
    families = [(t, g) for t, g in _families(mine, exclude=alpha_knobs) if not alpha_grid(g, metrics[0], policy).empty]
    n_alpha = max(len(alpha_grid(g, metrics[0], policy)) for _, g in families)
    fig, flat = plt.subplots(
        len(families),
        len(metrics),
        figsize=(4.6 * len(metrics), (0.22 * n_alpha + 2.6) * len(families)),
        squeeze=False,
    )
    for axes, (title, sub) in zip(flat, families):
        auto = auto_alphas(sub, policy)
        for ax, m in zip(axes, metrics):
            grid = alpha_grid(sub, m, policy)
            im = ax.imshow(grid.values * 100, aspect="auto", origin="lower", cmap="viridis")
            ax.set_xticks(range(grid.shape[1]), [f"{c:g}" for c in grid.columns])
            step = max(1, len(grid.index) // 10)
            ax.set_yticks(range(0, len(grid.index), step), [f"{a:g}" for a in grid.index[::step]])
            ax.set_xlabel("cache capacity (GB)")
            ax.set_ylabel("alpha")
            ax.set_title(
                f"{policy}: {m.replace('_', ' ')} (%)" + (f"\n{title}" if len(families) > 1 else ""), fontsize=9
            )
            fig.colorbar(im, ax=ax, label=f"{m.replace('_', ' ')} (%)")
            best = np.nanargmax(np.nan_to_num(grid.values, nan=-np.inf), axis=0)
            ax.scatter(
                range(grid.shape[1]),
                best,
                marker="s",
                facecolors="none",
                edgecolors="white",
                s=60,
                label="best static α",
            )
            if not auto.empty and auto["alpha_chosen"].notna().any():
                cols = list(grid.columns)
                xs, ys = [], []
                for cap, a in zip(auto["capacity_gb"], auto["alpha_chosen"]):
                    if cap in cols and not np.isnan(a):
                        xs.append(cols.index(cap))
                        ys.append(np.interp(a, grid.index.to_numpy(dtype=float), np.arange(len(grid.index))))
                ax.scatter(xs, ys, marker="*", color="red", s=120, label="auto-tuned α")
            ax.legend(loc="upper right", fontsize=7, framealpha=0.6)
    fig.tight_layout()
    return fig


def _label_log_axis(plt, axis) -> None:
    """A log axis drawn with numbers on it: where fewer than two powers of ten fall in its range
    (TTFTs of 15 to 45 ms) its minor ticks carry them, in plain numbers (the TTFT panels had no
    number at all: their minor labels were hidden and no power of ten was in view); a wider axis
    keeps its powers of ten alone."""
    lo, hi = sorted(axis.get_view_interval())
    if lo > 0 and np.floor(np.log10(hi)) - np.ceil(np.log10(lo)) < 1:
        wide = hi / lo > 4  # 17 to 110 ms: 20, 30, 50, 100 (every tick's number ran 80 90 100 together)

        def plain_text(v, _):
            if v <= 0:
                return ""
            lead = round(v / 10 ** np.floor(np.log10(v)), 6)
            return f"{v:g}" if not wide or lead in (1, 2, 3, 5) else ""

        plain = plt.FuncFormatter(plain_text)
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    else:
        axis.set_minor_formatter(plt.NullFormatter())


def fig_ttft(rows, requests):
    """Empirical CDF of TTFT, a curve per policy variant, a panel per configuration (every knob
    that varies: capacity, session rate, trace...), so no curve pools configurations."""
    plt = pyplot()
    panels = _families(rows)
    fig, axes = _grid(plt, len(panels), 4.4, 3.4, sharey=True)
    styles = _series_styles(rows["variant"])
    for ax, (title, sub) in zip(axes, panels):
        for variant, (x, y) in ttft_cdf(sub, requests).items():
            ax.step(np.maximum(x, 1e-3), y, where="post", label=variant, **styles.get(variant, {}))
        ax.set_xscale("log")
        _label_log_axis(plt, ax.xaxis)
        ax.set_xlabel("TTFT (ms, log scale)")
        ax.set_ylabel("cumulative share of requests (fraction)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def fig_ttft_load(rows):
    """TTFT p95 (solid) and p50 (dashed) against the session rate, a line per policy variant and
    scheduler (fcfs vs continuous batching), a panel per configuration family (capacity, trace...)."""
    plt = pyplot()
    panels = _families(rows, exclude=("sessions_per_second", "scheduler"))
    fig, axes = _grid(plt, len(panels), 5.0, 3.6)
    for ax, (title, sub) in zip(axes, panels):
        table = report.ttft_under_load(sub)
        for i, variant in enumerate(table.index.get_level_values(0).unique()):
            t = table.loc[variant]
            for col in t.columns:
                pct, sched = col.split()[:2]
                ax.plot(
                    t.index,
                    t[col],
                    marker="o" if sched == "fcfs" else "s",
                    color=f"C{i}",
                    linestyle="-" if pct == "ttft_p95" else "--",
                    alpha=1.0 if sched == "continuous" else 0.55,
                    label=f"{variant} {sched} {pct.split('_')[1]}",
                )
        ax.set_yscale("log")
        _label_log_axis(plt, ax.yaxis)
        ax.set_xlabel("session rate (sessions/s)")
        ax.set_ylabel("TTFT (ms, log scale)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def fig_misses(rows):
    """Where the prompt tokens went, a stacked bar per policy variant (mean over the selected
    configurations): hit, then the tokens missed by cause (``sim.engine.misses``), as shares of
    the prompt tokens; a panel per trace and capacity."""
    missing = [c for c in MISS_CAUSES if c not in rows.columns]
    if missing:
        raise NotInRows("--kind misses needs results with the missed_* columns (rerun the sweep with this version)")
    older = rows[list(MISS_CAUSES)].isna().any(axis=1)
    if older.any():  # rows of an older version beside newer ones: their misses were drawn as hits
        raise NotInRows(
            f"--kind misses: {int(older.sum())} of {len(rows)} rows have no missed-token counts (written by an "
            "older version): rerun the same sweep to recompute them, or leave them out with --where"
        )
    plt = pyplot()
    panels = sorted({(t, c) for t, c in zip(rows["trace"], rows["capacity_gb"])})
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(4.0, 1.1 * rows["variant"].nunique() + 2) * len(panels), 4.0), squeeze=False
    )
    for ax, (trace, cap) in zip(axes[0], panels):
        sel = rows[(rows["trace"] == trace) & (rows["capacity_gb"] == cap)]
        variants = order_variants(list(sel["variant"].unique()))
        total = sel.groupby("variant")["input_tokens"].sum()
        shares = {"hit": sel.groupby("variant")["hit_tokens"].sum() / total}
        for c in MISS_CAUSES:
            shares[c] = sel.groupby("variant")[c].sum() / total
        x = np.arange(len(variants))
        bottom = np.zeros(len(variants))
        for i, (name, share) in enumerate(shares.items()):
            y = np.array([float(share.get(v, 0.0)) for v in variants])
            label = name.removeprefix("missed_").replace("_", " ")
            ax.bar(x, y, bottom=bottom, color="0.25" if name == "hit" else f"C{i}", label=label, width=0.7)
            bottom += y
        ax.set_xticks(x, variants, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_xlabel("policy")
        ax.set_ylabel("share of prompt tokens (fraction)")
        ax.set_title(f"{_short(trace)}, {cap:g} GB", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def fig_occupancy(rows, occupancy):
    """Cache occupancy (KV + states, % of capacity) over simulated time, a line per policy
    variant, a panel per configuration (every knob that varies: capacity, session rate...)."""
    plt = pyplot()
    panels = _families(rows)
    fig, axes = _grid(plt, len(panels), 4.4, 3.2, sharey=True)
    occ = occupancy.merge(rows[["config_id", "variant", "capacity_bytes"]], on="config_id")
    styles = _series_styles(rows["variant"])
    for ax, (title, sub) in zip(axes, panels):
        mine = occ[occ["config_id"].isin(sub["config_id"])]
        for v in order_variants(sub["variant"]):
            for _cid, g in mine[mine["variant"] == v].groupby("config_id", sort=True):
                g = g.sort_values("t_s", kind="stable")
                pct = (g["kv_bytes"] + g["state_bytes"]) / g["capacity_bytes"] * 100
                ax.plot(g["t_s"], pct, lw=1, label=v, **styles[v])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("cache occupancy (% of capacity)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save_to(fig, path: str | Path, fmt: str) -> None:
    """One figure as ``fmt`` (png, svg) at ``path``, as every figure of `marconi plot` is saved:
    the same bytes for the same figure (an SVG carried the time it was saved and ids salted with a
    random UUID, so two plots of one results folder differed on every line that names a clip path)."""
    import matplotlib  # noqa: PLC0415 - optional extra, loaded only to draw

    if fmt != "svg":
        fig.savefig(path, dpi=120, bbox_inches="tight", format=fmt)
        return
    with matplotlib.rc_context({"svg.hashsalt": "marconi-sim"}):
        fig.savefig(path, dpi=120, bbox_inches="tight", format=fmt, metadata={"Date": None})


def save(fig, out: str | Path, name: str, formats=("png", "svg")) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = out / f"{name}.{fmt}"
        tmp = out / f".tmp-{name}.{fmt}"  # renamed when complete: never a truncated figure
        try:
            save_to(fig, tmp, fmt)
            tmp.replace(p)
        finally:
            tmp.unlink(missing_ok=True)  # an interrupted save leaves no hidden file behind
        paths.append(p)
    return paths


def make_figure(results: str | Path, kind: str, where: str | None = None, static: str = "best"):
    """The figure of ``kind`` for a results folder; ``where`` filters rows: ``KEY=VALUE`` as
    `marconi report --where` takes it (``capacity=2GB``), or a pandas query."""
    rows = report.load(results)
    if where and re.fullmatch(r"\s*[A-Za-z_][\w.]*\s*=(?!=).*", where):  # report's form (a query has ==)
        rows = report.select(rows, [where])
    elif where:
        try:
            rows = rows.query(where)
        except Exception as exc:  # noqa: BLE001 - pandas raises many kinds
            raise UsageError(f"--where {where!r}: {exc}") from None
        if rows.empty:
            raise UsageError(f"--where {where!r} selects no rows")
    if kind == "hit-rate":
        return fig_hit_rate(report.condense(rows, static))
    if kind == "alpha":
        return fig_alpha(rows)
    selected = report.condense(rows, static)
    if kind == "ttft":
        return fig_ttft(selected, load_details(results, "requests", selected["config_id"]))
    if kind == "occupancy":
        return fig_occupancy(selected, load_details(results, "occupancy", selected["config_id"]))
    if kind == "ttft-load":
        return fig_ttft_load(selected)
    if kind == "misses":
        return fig_misses(selected)
    raise UsageError(f"--kind must be one of {', '.join(KINDS)}")
