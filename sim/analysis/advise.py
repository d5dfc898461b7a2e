"""Figures and tables of `marconi advise`: the Pareto front (token hit vs TTFT p95) of the trials,
the search history, and why the recommendation wins (hits, evictions by kind, memory split).

Each function takes the Advice of ``sim.experiments.advise`` (or its trial rows); matplotlib is
the optional extra ``notebooks``, imported only when a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path

from sim.analysis.plot import pyplot
from sim.experiments.advise.search import Advice, pareto_front


def fig_pareto(adv: Advice):
    """Every trial as a point (token hit %, TTFT p95 ms), the Pareto front as a line, the
    engine's defaults and the recommendation marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    rows = adv.history
    ax.scatter(
        [r.metrics["token_hit_rate"] * 100 for r in rows],
        [r.metrics["ttft_p95_ms"] for r in rows],
        s=14,
        color="0.6",
        label="trials",
    )
    front = pareto_front(rows)
    ax.plot(
        [r.metrics["token_hit_rate"] * 100 for r in front],
        [r.metrics["ttft_p95_ms"] for r in front],
        marker="o",
        color="C0",
        label="Pareto front",
    )
    for s, name, color, mark in (
        (adv.defaults, "engine defaults", "C3", "s"),
        (adv.recommended, "recommended", "C2", "*"),
    ):
        ax.scatter(
            [s.tuned["token_hit_rate"] * 100],
            [s.tuned["ttft_p95_ms"]],
            s=120,
            marker=mark,
            color=color,
            label=name,
            zorder=3,
        )
    ax.set_xlabel("token hit rate (%)")
    ax.set_ylabel("TTFT p95 (ms)")
    ax.set_title(f"advise --for {adv.problem.engine}: {adv.trials} trials", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def fig_history(adv: Advice):
    """The objective of each trial in order, and the best so far."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.2))
    rows = adv.history
    maximize = adv.problem.objective != "ttft-p95"
    scale = 100 if adv.problem.objective == "token-hit" else 1
    xs = [r.number for r in rows]
    ys = [r.value * scale for r in rows]
    best, acc = [], None
    for y in ys:
        acc = y if acc is None else (max(acc, y) if maximize else min(acc, y))
        best.append(acc)
    ax.scatter(xs, ys, s=12, color="0.6", label="trial")
    ax.step(xs, best, where="post", color="C0", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(adv.problem.objective + (" (%)" if scale == 100 else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def save_pareto(adv: Advice, path: str | Path) -> Path:
    path = Path(path)
    fig = fig_pareto(adv)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


#: (label, metric key, format) rows of the explanation table
EXPLAIN_ROWS = (
    ("token hit rate", "token_hit_rate", "pct"),
    ("requests with a state hit", "checkpoints_hit", "int"),
    ("TTFT p95 ms", "ttft_p95_ms", "f1"),
    ("states admitted", "checkpoints_admitted", "int"),
    ("states evicted", "checkpoints_evicted", "int"),
    ("KV tokens evicted", "kv_tokens_evicted", "int"),
    ("evictions (entries)", "evictions", "int"),
    ("rejected inserts", "rejected_inserts", "int"),
    ("KV at the end (GB)", "final_kv_bytes", "gb"),
    ("states at the end (GB)", "final_state_bytes", "gb"),
)


def explain_rows(adv: Advice, part: str = "tuned") -> list[tuple[str, str, str]]:
    """(what, engine defaults, recommended) rows saying why the recommendation wins: hits, evictions
    by kind (states vs KV), and the memory split (the state pool and what each kind holds at the
    end)."""
    d, r = getattr(adv.defaults, part), getattr(adv.recommended, part)
    out = []
    for label, key, fmt in EXPLAIN_ROWS:
        out.append((label, _fmt(d.get(key), fmt), _fmt(r.get(key), fmt)))
    state = adv.space.ctx.spec.state_bytes()
    cap = adv.space.ctx.capacity_bytes
    pool = [
        ("state pool (states)", _pool(adv.defaults.state_pool, state), _pool(adv.recommended.state_pool, state)),
        (
            "KV pool (GB)",
            _kv_pool(adv.defaults.state_pool, state, cap),
            _kv_pool(adv.recommended.state_pool, state, cap),
        ),
    ]
    return pool + out


def _kv_pool(n, state_bytes: int, capacity: int) -> str:
    return "shared budget" if n is None else f"{(capacity - n * state_bytes) / 1e9:.3g}"


def _pool(n, state_bytes: int) -> str:
    return "shared budget" if n is None else f"{n:,} ({n * state_bytes / 1e9:.3g} GB)"


def _fmt(v, fmt: str) -> str:
    if v is None:
        return "-"
    if fmt == "pct":
        return f"{v * 100:.2f}%"
    if fmt == "int":
        return f"{int(v):,}"
    if fmt == "gb":
        return f"{v / 1e9:.3g}"
    return f"{v:.1f}"
