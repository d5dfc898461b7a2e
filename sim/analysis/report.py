"""Turning sweep results into the paper's condensed numbers (pandas only; figures are in sim.analysis.plot).

The notebooks call these functions so they stay short and the logic stays tested:

- :func:`results_dir` picks the folder (``RESULTS_DIR`` / a parameter cell) or runs a small sweep;
- :func:`load` reads the rows and labels each policy variant (``marconi α=0.5``, ``marconi (auto α)``);
- :func:`condense` collapses a static-alpha grid per configuration (best alpha in hindsight, or one
  alpha) so policies compare one row per configuration;
- :func:`ratio_table` / :func:`headline` give Fig. 7's mean ratio (Marconi / vLLM+) and Fig. 8's
  P95 relative gain over SGLang+ (docs/cost-model.md §6).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from policies.base import get_preset
from sim.analysis import table
from sim.config import UNLIMITED, SimConfig, format_size, parse_size
from sim.errors import UsageError
from sim.experiments.grid import expand_grid
from sim.experiments.runners import run_sweep
from sim.experiments.store import advise_folder_words, load_results, replay_folder_words, row_files, summary_kind
from sim.gpus import canonical_gpu
from sim.trace_options import TRACE_OPTION_KEYS

#: the columns that are neither knobs of the configuration nor metrics
_NON_KNOBS = {"config_id", "policy", "alpha", "alpha_mode", "variant", "capacity_gb"}

#: small sweeps the notebooks run when no results folder is given
SMALL = {
    "hit_rates": dict(
        trace_axes={"trace": ["sharegpt"], "sessions": [10]},
        sim_axes={
            "policy": ["vllm+", "sglang+", "marconi"],
            "capacity_bytes": [10**9, 3 * 10**9],
            "sessions_per_second": [1.0, 5.0],
            "alpha": ["auto", 0.0, 1.0],
        },
    ),
    "alpha_sweep": dict(
        trace_axes={"trace": ["sharegpt"], "sessions": [10]},
        sim_axes={
            "policy": ["marconi"],
            "capacity_bytes": [10**9, 2 * 10**9],
            "sessions_per_second": [5.0],
            "alpha": [0.0, 0.5, 1.0, 1.5, 2.0, "auto"],
        },
    ),
    "ttft": dict(
        trace_axes={"trace": ["sharegpt"], "sessions": [10]},
        sim_axes={
            "policy": ["sglang+", "marconi"],
            "capacity_bytes": [10**9, 3 * 10**9],
            "sessions_per_second": [1.0, 5.0, 10.0],
            "scheduler": ["fcfs", "continuous"],
        },
    ),
}


def trace_option_keys() -> list[str]:
    return list(TRACE_OPTION_KEYS)


def knob_columns(df: pd.DataFrame) -> list[str]:
    """Columns identifying a configuration apart from the policy and its alpha."""
    knobs = trace_option_keys() + SimConfig.field_names()
    return [c for c in knobs if c in df.columns and c not in _NON_KNOBS]


def run_small(kind: str, out: str | os.PathLike | None = None, **overrides) -> Path:
    """Run the small sweep of notebook ``kind`` (see SMALL) into ``out`` (if None: a temp folder,
    removed when the process exits)."""
    spec = SMALL[kind]
    trace_axes = {**spec["trace_axes"], **overrides.pop("trace_axes", {})}
    sim_axes = {**spec["sim_axes"], **overrides.pop("sim_axes", {})}
    if out:
        out = Path(out)
    else:  # a temp folder of this process: removed when it exits (a notebook's kernel), not left behind
        out = Path(tempfile.mkdtemp(prefix=f"marconi-{kind}-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
    tasks = expand_grid(trace_axes, sim_axes)
    run_sweep(tasks, out, workers=1, save_requests=(kind == "ttft"), progress=False, **overrides)
    return out


def results_dir(given: str | os.PathLike | None, kind: str) -> Path:
    """The results folder: ``given`` (a notebook parameter), else ``$RESULTS_DIR``, else a small
    sweep run now (``$SMALL_SWEEP_DIR`` or a temp folder)."""
    given = given or os.environ.get("RESULTS_DIR") or None
    if given:
        return find_folder(given)
    return run_small(kind, os.environ.get("SMALL_SWEEP_DIR") or None)


def find_folder(given: str | os.PathLike) -> Path:
    """A results folder named by the user: as given when it exists (or is absolute), else relative
    to the shell's folder (``$PWD``: a notebook's kernel runs in ``notebooks/``, so
    ``RESULTS_DIR=results`` names the folder beside it) or to the parent of the working folder (the
    repository root, seen from ``notebooks/``); one-line UsageError when none exists."""
    path = Path(given)
    if path.is_absolute() or path.exists():
        return path
    bases = [Path(os.environ["PWD"])] if os.environ.get("PWD") else []
    bases.append(Path.cwd().parent)
    for base in bases:
        if (base / path).exists():
            return base / path
    tried = ", ".join(str(b / path) for b in [Path.cwd(), *bases])
    raise UsageError(f"results folder {given} not found (tried {tried})")


_POLICY_ORDER = ["vanilla", "vllm+", "sglang+", "marconi"]


def order_variants(variants) -> list[str]:
    """Baselines first (vanilla, vllm+, sglang+, marconi...), then the rest as they come."""
    vs = list(dict.fromkeys(variants))

    def key(v: str):
        base = v.split(" ")[0]
        return (_POLICY_ORDER.index(base) if base in _POLICY_ORDER else len(_POLICY_ORDER), vs.index(v))

    return sorted(vs, key=key)


def variant_label(policy: str, alpha_mode: str, alpha: float) -> str:
    if alpha_mode == "none":
        return policy
    if alpha_mode == "auto":
        return f"{policy} (auto α)"
    return f"{policy} α={alpha:g}"


def scheduler_tag(scheduler: str, mixed: bool) -> str:
    """A variant's scheduler in its label (`` [fcfs]`` / `` [continuous]``), only where the rows
    mix schedulers: a folder of one scheduler keeps plain labels."""
    return f" [{scheduler}]" if mixed else ""


def load(path: str | os.PathLike) -> pd.DataFrame:
    """Rows of a results folder with ``variant`` (policy + alpha) and ``capacity_gb`` columns."""
    df = load_results(path)
    if "scheduler" not in df.columns:  # results written before --scheduler existed
        df["scheduler"] = "fcfs"
    mixed = df["scheduler"].nunique() > 1
    df["variant"] = [
        variant_label(p, m, a) + scheduler_tag(s, mixed)
        for p, m, a, s in zip(df["policy"], df["alpha_mode"], df["alpha"], df["scheduler"])
    ]
    df["capacity_gb"] = df["capacity_bytes"] / 1e9
    return df


def condense(df: pd.DataFrame, static: str | float = "best", metric: str = "token_hit_rate") -> pd.DataFrame:
    """One row per configuration and policy variant.

    Static-alpha rows of a policy are collapsed per configuration: ``"best"`` keeps the best alpha in
    hindsight (variant ``marconi (best α)``; a single static alpha keeps plain ``marconi``),
    ``"all"`` keeps every alpha as its own variant, a number keeps that alpha only. Rows without
    alpha and auto-tuned rows are kept as they are."""
    if static == "all":
        return df.copy()
    keep = df[df["alpha_mode"] != "static"]
    stat = df[df["alpha_mode"] == "static"]
    if stat.empty:
        return keep.copy()
    if static == "best":
        parts = []
        for policy, g in stat.groupby("policy", sort=False):
            if g["alpha"].nunique() == 1:
                g = g.assign(variant=policy)
            else:
                idx = g.groupby(knob_columns(g), dropna=False)[metric].idxmax()
                g = g.loc[idx].assign(variant=f"{policy} (best α)")
            if "scheduler" in g.columns:
                mixed = stat["scheduler"].nunique() > 1
                g = g.assign(variant=[v + scheduler_tag(s, mixed) for v, s in zip(g["variant"], g["scheduler"])])
            parts.append(g)
        stat = pd.concat(parts)
    else:
        want = float(static)
        for policy, g in stat.groupby("policy", sort=False):  # a line would vanish without a word
            if not np.isclose(g["alpha"], want).any():
                grid = ", ".join(f"{a:g}" for a in sorted(g["alpha"].unique()))
                raise UsageError(
                    f"--alpha {want:g} is not in the static-alpha grid of {policy} in these results "
                    f"({grid}): pick one of those, best or all"
                )
        stat = stat[np.isclose(stat["alpha"], want)]
    return pd.concat([keep, stat]).reset_index(drop=True)


def paired(df: pd.DataFrame, num: str, den: str, metric: str = "token_hit_rate") -> pd.DataFrame:
    """Per configuration: metric of variant ``num`` beside that of ``den`` (from a condensed frame)."""
    keys = knob_columns(df)
    a = df[df["variant"] == num][keys + [metric]]
    b = df[df["variant"] == den][keys + [metric]]
    return a.merge(b, on=keys, suffixes=("_num", "_den"))


def ratio_table(df: pd.DataFrame, den: str = "vllm+", metric: str = "token_hit_rate") -> pd.DataFrame:
    """Fig. 7 style: for every variant, the mean over configurations of its metric / ``den``'s
    (configurations where ``den`` is 0 are counted apart), per trace and overall."""
    rows = []
    for variant in df["variant"].unique():
        if variant == den:
            continue
        p = paired(df, variant, den, metric)
        for trace, g in [("all", p)] + list(p.groupby("trace")):
            ok = g[f"{metric}_den"] > 0
            ratio = g.loc[ok, f"{metric}_num"] / g.loc[ok, f"{metric}_den"]
            rows.append(
                {
                    "variant": variant,
                    "trace": trace,
                    "configs": len(g),
                    "den_zero": int((~ok).sum()),
                    f"mean_ratio_vs_{den}": ratio.mean() if len(ratio) else np.nan,
                }
            )
    return pd.DataFrame(rows)


def headline(df: pd.DataFrame, marconi: str | None = None, metric: str = "token_hit_rate") -> dict:
    """The paper's two hit-rate numbers (docs/cost-model.md §6) for one marconi variant: mean over configs
    of marconi / vllm+, and the 95th percentile over configs of (marconi - sglang+) / sglang+."""
    variants = list(df["variant"].unique())
    if marconi is None:
        for cand in ("marconi (auto α)", "marconi", "marconi (best α)"):
            if cand in variants:
                marconi = cand
                break
        else:
            marconi = next((v for v in variants if v.startswith("marconi")), None)
    out = {"marconi": marconi}
    if marconi is None:
        return out
    pv = paired(df, marconi, "vllm+", metric)
    ok = pv[f"{metric}_den"] > 0
    out["configs"] = int(len(pv))
    ratio = pv.loc[ok, f"{metric}_num"] / pv.loc[ok, f"{metric}_den"]
    out["ratio_vs_vllm+"] = float(ratio.mean()) if ok.any() else float("nan")
    ps = paired(df, marconi, "sglang+", metric)
    ok = ps[f"{metric}_den"] > 0
    gain = (ps.loc[ok, f"{metric}_num"] - ps.loc[ok, f"{metric}_den"]) / ps.loc[ok, f"{metric}_den"]
    out["p95_gain_vs_sglang+"] = float(np.percentile(gain, 95)) if len(gain) else float("nan")
    return out


def hit_rate_table(df: pd.DataFrame, metric: str = "token_hit_rate") -> pd.DataFrame:
    """Mean metric by trace and capacity (rows) and variant (columns)."""
    return df.pivot_table(index=["trace", "capacity_gb"], columns="variant", values=metric, aggfunc="mean")


def chosen_alpha_column(df: pd.DataFrame) -> str | None:
    """The summary column holding the alpha an auto-tuned run adopted, if the tuner reports one."""
    for c in df.columns:
        lc = c.lower()
        if "alpha" in lc and any(w in lc for w in ("chosen", "tuned", "adopted", "selected", "best")):
            return c
    return None


def alpha_grid(df: pd.DataFrame, metric: str = "token_hit_rate", policy: str = "marconi") -> pd.DataFrame:
    """Mean metric over the other knobs, alpha (rows) x capacity in GB (columns), static rows."""
    g = df[(df["policy"] == policy) & (df["alpha_mode"] == "static")]
    return g.pivot_table(index="alpha", columns="capacity_gb", values=metric, aggfunc="mean").sort_index()


def auto_alphas(df: pd.DataFrame, policy: str = "marconi") -> pd.DataFrame:
    """Auto-tuned rows: capacity, mean chosen alpha (NaN if the tuner reports none) and hit rate."""
    g = df[(df["policy"] == policy) & (df["alpha_mode"] == "auto")]
    if g.empty:
        return pd.DataFrame(columns=["capacity_gb", "alpha_chosen", "token_hit_rate"])
    col = chosen_alpha_column(g)
    g = g.assign(alpha_chosen=g[col] if col else np.nan)
    return g.groupby("capacity_gb", as_index=False)[["alpha_chosen", "token_hit_rate", "flops_saved_frac"]].mean()


def ttft_cdf(rows: pd.DataFrame, requests: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """variant -> (sorted TTFT in ms over all its requests, cumulative fraction)."""
    lab = rows[["config_id", "variant"]]
    req = requests.merge(lab, on="config_id")
    out = {}
    groups = dict(list(req.groupby("variant", sort=False)))
    for variant in order_variants(groups):
        g = groups[variant]
        x = np.sort(g["ttft_s"].to_numpy() * 1e3)
        out[variant] = (x, np.arange(1, len(x) + 1) / len(x))
    return out


def ttft_table(rows: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """P5 / P50 / P95 TTFT (ms) per variant over the pooled requests."""
    data = {v: np.percentile(x, [5, 50, 95]) for v, (x, _) in ttft_cdf(rows, requests).items()}
    return pd.DataFrame(data, index=["p5_ms", "p50_ms", "p95_ms"]).T


def ttft_under_load(rows: pd.DataFrame) -> pd.DataFrame:
    """TTFT p50 / p95 (ms) per policy variant and session rate, fcfs beside continuous batching
    (the rows' own percentiles, averaged over the other knobs, e.g. capacities)."""
    tags = (scheduler_tag("continuous", True), scheduler_tag("fcfs", True))
    df = rows.assign(policy_variant=[v.replace(tags[0], "").replace(tags[1], "") for v in rows["variant"]])
    table = df.groupby(["policy_variant", "sessions_per_second", "scheduler"])[["ttft_p50_ms", "ttft_p95_ms"]].mean()
    table = table.unstack("scheduler")
    table.columns = [f"{m.replace('_ms', '')} {s} ms" for m, s in table.columns]
    return table[sorted(table.columns, key=lambda c: (c.split()[0], c.split()[1] != "fcfs"))]


# ---- `marconi report` / the end of `marconi sweep`: any results folder as a table

#: knob columns shown under a shorter name (the rest under their own)
KNOB_LABELS = {"capacity_bytes": "capacity", "sessions_per_second": "sessions/s"}
#: names --where also takes for a column
WHERE_ALIASES = {"capacity": "capacity_bytes", "sessions/s": "sessions_per_second", "rate": "sessions_per_second"}
#: columns that label a configuration but are no knob to show (derived, or one per row)
_NOT_SHOWN = {"trace_name", "input_digest", "timing_file"}


def _run_summary_rows(path: Path) -> pd.DataFrame | None:
    """The rows of a `marconi run --out` folder (its summary.json), labelled as :func:`load` labels
    a sweep's; None when the folder has no such file."""
    import json  # noqa: PLC0415

    f = path / "summary.json"
    if not f.is_file():
        return None
    try:
        rows = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {f}: {exc}") from None
    if summary_kind(path) == "replay":
        raise UsageError(replay_folder_words(path, "a run's or a sweep's results"))
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and "token_hit_rate" in r for r in rows):
        raise UsageError(f"{f} is not the summary of `marconi run --out`")
    df = pd.DataFrame(rows)
    modes, alphas = [], []
    for policy, alpha in zip(df["policy"], df.get("alpha", pd.Series([None] * len(df)))):
        uses = get_preset(policy).uses_alpha
        modes.append("none" if not uses else ("auto" if alpha == "auto" else "static"))
        alphas.append(float(alpha) if uses and alpha not in (None, "auto") else np.nan)
    df["alpha_mode"], df["alpha"] = modes, alphas
    df["config_id"] = [f"run-{i}" for i in range(len(df))]
    df["variant"] = [variant_label(p, m, a) for p, m, a in zip(df["policy"], df["alpha_mode"], df["alpha"])]
    df["capacity_gb"] = df["capacity_bytes"] / 1e9
    return df


def load_folder(path: str | os.PathLike) -> pd.DataFrame:
    """The rows of any results folder: a `marconi sweep` folder (its parquet rows) or a
    `marconi run --out` folder (its summary.json); one-line UsageError otherwise."""
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"{path} is not a folder (give a `marconi sweep --out` or `marconi run --out` folder)")
    df = _run_summary_rows(p)  # a run's folder: summary.json beside requests.parquet
    if df is not None:
        return df
    if not row_files(p) and advise_folder_words(p, ""):
        raise UsageError(advise_folder_words(path, "the results of `marconi sweep` or `marconi run`"))
    if not row_files(p):
        raise UsageError(f"no results in {path}: neither `marconi sweep` rows (*.parquet) nor a run's summary.json")
    return load(p)


def varying_knobs(df: pd.DataFrame) -> list[str]:
    """Knob columns whose value differs between rows (what tells the configurations apart)."""
    out = []
    for c in knob_columns(df):
        if c in _NOT_SHOWN:
            continue
        if df[c].astype(str).nunique() > 1:
            out.append(c)
    return out


def _where_value(df: pd.DataFrame, key: str, value: str):
    col = df[key]
    if key == "capacity_bytes":
        try:
            return parse_size(value)
        except UsageError as exc:
            raise UsageError(f"--where {key}={value}: {exc}") from None
    if key == "gpu":  # spelled as --gpu takes it ("H100", "nvidia-h100"): the rows hold the catalogue name
        return canonical_gpu(value)
    if pd.api.types.is_bool_dtype(col):
        if value.lower() not in ("true", "false", "1", "0"):
            raise UsageError(f"--where {key}={value}: {key} is true or false")
        return value.lower() in ("true", "1")
    if pd.api.types.is_numeric_dtype(col):
        try:
            return float(value)
        except ValueError:
            raise UsageError(f"--where {key}={value}: {key} is a number") from None
    return value


def select(df: pd.DataFrame, where: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """Rows matching every ``KEY=VALUE`` of ``where`` (a knob, policy, variant or metric column;
    numbers compared as numbers, capacities as sizes: ``capacity=2GB``)."""
    for cond in where:
        key, sep, value = cond.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise UsageError(f"--where {cond!r}: write KEY=VALUE, e.g. policy=marconi or capacity=2GB")
        given, key = key, WHERE_ALIASES.get(key, key)
        if key not in df.columns:
            shown = ["policy", "variant", *(KNOB_LABELS.get(k, k) for k in varying_knobs(df))]
            raise UsageError(f"--where {cond!r}: no column {key!r} in these results (e.g. {', '.join(shown)})")
        want = _where_value(df, key, value)
        col = df[key]
        if isinstance(want, float) and pd.api.types.is_numeric_dtype(col):
            mask = np.isclose(col.astype(float), want)
        else:
            mask = col.astype(str) == str(want) if not isinstance(want, bool) else col == want
        if not mask.any():  # the values there are, as stored (a config.json path as the sweep was given it)
            sizes = key.endswith("_bytes") and pd.api.types.is_numeric_dtype(col)  # capacity=2GB: said as sizes
            labels = size_labels(col.dropna().unique()) if sizes else {}
            held = [
                labels[int(v)] if sizes else str(v) for v in sorted(col.dropna().unique(), key=float if sizes else str)
            ]
            shown = ", ".join(held[:8]) + (f", ... ({len(held)} in all)" if len(held) > 8 else "")
            raise UsageError(f"--where {cond!r} selects no rows ({given} holds: {shown or 'nothing'})")
        df = df[mask]
    return df


def _knob_text(key: str, value, sizes: dict | None = None) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if key == "capacity_bytes":
        return (sizes or {}).get(int(value)) or format_size(int(value))
    if key == "session_range" and not str(value).strip():  # run's "empty = all", not a blank cell
        return "all"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def size_labels(values) -> dict[int, str]:
    """Each distinct byte count of ``values`` as a size, with as many significant digits as tell
    them apart: ``format_size``'s three printed 5GiB, 5.37GB and 5.371GB as three rows of 5.37GB."""
    distinct = sorted({int(v) for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))})
    for digits in range(3, 16):
        labels = {n: _size(n, digits) for n in distinct}
        if len(set(labels.values())) == len(distinct):
            return labels
    return {n: f"{n}B" for n in distinct}


def _size(n: int, digits: int) -> str:
    if digits == 3 or n >= UNLIMITED:
        return format_size(n)
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}g}{unit}"
    return f"{n}B"


def report_rows(
    df: pd.DataFrame, sort: str = "token_hit_rate", columns: list[str] | None = None
) -> tuple[list[dict], list[str], list[str]]:
    """(records best first by ``sort``, knob columns that vary, metric columns) of the rows ``df``:
    a record per configuration with its variant (policy and alpha), the varying knobs and the
    metrics (``columns``: summary keys; default: :data:`sim.analysis.table.DEFAULT_COLUMNS`)."""
    knobs = varying_knobs(df)
    metrics = [c for c in (columns or table.DEFAULT_COLUMNS) if c in df.columns]
    keep = ["config_id", "variant", *knobs, *metrics]
    if "steps" in df.columns and "steps" not in keep:
        keep.append("steps")
    rank = [_POLICY_ORDER.index(p) if p in _POLICY_ORDER else len(_POLICY_ORDER) for p in df["policy"]]
    df = df.assign(_rank=rank).sort_values(["_rank", "policy", "alpha_mode", "alpha", *knobs], kind="stable")
    records = [
        {k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()} for r in df[keep].to_dict("records")
    ]
    return table.best_first(records, sort), knobs, metrics  # ties: baselines first, then by knob


def format_report(
    df: pd.DataFrame, sort: str = "token_hit_rate", columns: list[str] | None = None, limit: int | None = None
) -> str:
    """The rows ``df`` as a text table, best first by ``sort``: a line per configuration, the
    variant, the knobs that vary, then the metrics; at most ``limit`` lines (and a line saying how
    many more)."""
    records, knobs, metrics = report_rows(df, sort, columns)
    shown = records if limit is None else records[:limit]
    sizes = size_labels(r["capacity_bytes"] for r in records) if "capacity_bytes" in knobs else None
    text_rows = []
    for r in shown:
        row = {"policy": r["variant"], **{m: r[m] for m in metrics}, "steps": r.get("steps", 1)}
        row.update({KNOB_LABELS.get(k, k): _knob_text(k, r[k], sizes) for k in knobs})
        text_rows.append(row)
    out = table.format_table(text_rows, [KNOB_LABELS.get(k, k) for k in knobs] + metrics)
    if limit is not None and len(records) > limit:
        out += f"\n... {len(records) - limit} more"
    return out
