"""A replay output folder (no torch): ``summary.json`` (the run's settings and summary) and
``requests.parquet`` (one row per request) and, with ``--scheduler continuous``, ``steps.parquet``
(one row per executed engine step: ``sim.replay.steps``), written by ``marconi replay --out DIR`` and read by
``marconi plot --kind replay`` and ``notebooks/replay.ipynb``."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pandas as pd

from sim.errors import UsageError
from sim.replay.measure import held_up

SUMMARY = "summary.json"
REQUESTS = "requests.parquet"
STEPS = "steps.parquet"


def finite(value):
    """``value`` with every NaN or infinite float as None (JSON null), through dicts and lists:
    summary.json and ``--format json`` stay standard JSON (a replay with no timed prefill, a
    batched one, or none replayed wrote ``NaN``, which strict parsers refuse), as `marconi run`'s."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def files(out, summary: dict, settings: dict, requests: pd.DataFrame, steps: pd.DataFrame | None = None) -> list:
    """The files of a replay output folder under ``out``, each with what writes it to a given path
    (``[(path, write(tmp))]``): ``requests.parquet``, ``steps.parquet`` when ``steps`` is given,
    then ``summary.json``. The CLI writes them with its other outputs as one set
    (``sim.cli.outdir.written_together``: an interrupt leaves all of them or none)."""
    out = Path(out)
    payload = finite(json.loads(json.dumps({"settings": settings, "summary": summary}, default=str)))
    text = json.dumps(payload, indent=2, allow_nan=False) + "\n"
    out_files = [(out / REQUESTS, lambda tmp: requests.to_parquet(tmp, index=False))]
    if steps is not None:
        out_files.append((out / STEPS, lambda tmp: steps.to_parquet(tmp, index=False)))
    out_files.append((out / SUMMARY, lambda tmp: Path(tmp).write_text(text)))
    return out_files


def write(out, summary: dict, settings: dict, requests: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[Path]:
    """``summary.json`` and ``requests.parquet`` under ``out``, and ``steps.parquet`` (one row per
    executed engine step, ``--scheduler continuous``) when ``steps`` is given. Without ``steps`` an
    earlier run's ``steps.parquet`` there (``--force`` replaced its other files) is removed first:
    left beside this run's summary it would read as this run's steps (``benchmarks/timing_fit.py``
    fits any ``steps.parquet`` of a folder)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if steps is None:
        (out / STEPS).unlink(missing_ok=True)
    for path, put in files(out, summary, settings, requests, steps):
        # each written under a temporary name and renamed when complete: never a truncated file
        tmp = path.with_name(f".tmp-{path.name}")
        put(tmp)
        tmp.replace(path)
    return [out / SUMMARY, out / REQUESTS] + ([out / STEPS] if steps is not None else [])


def load(path) -> tuple[dict, dict, pd.DataFrame]:
    """``(settings, summary, requests)`` of a replay output folder (bad input: UsageError)."""
    p = Path(path)
    if not (p / SUMMARY).is_file() or not (p / REQUESTS).is_file():
        raise UsageError(
            f"{path} is not a replay output folder (no {SUMMARY} / {REQUESTS}; write one with marconi replay --out DIR)"
        )
    try:
        d = json.loads((p / SUMMARY).read_text())
        return d["settings"], d["summary"], pd.read_parquet(p / REQUESTS)
    except (ValueError, KeyError, OSError) as exc:
        raise UsageError(f"cannot read replay output {path}: {exc}") from None


def fig_replay(requests: pd.DataFrame, summary: dict | None = None):
    """Measured vs modelled suffix-prefill time per request (log-log, hits and misses apart, the
    host-bound prefills marked) and the histogram of the relative time-model error (without the
    host-bound ones, as the summary's statistics)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("plots need matplotlib: pip install 'marconi-sim[notebooks]'") from None
    import numpy as np

    if summary and "batch_calls" in summary:
        raise UsageError(
            "a batched replay (--batch > 1) times batches, not requests: plot the per-request "
            "replay's output (--batch 1); the batch figures are in its summary.json"
        )
    df = requests[requests["suffix_ms"].notna() & (requests["suffix_ms"] > 0)]
    held = held_up(df)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    clean = df[~held]
    for label, sub, m in (("miss", clean[clean["hit_tokens"] == 0], "o"), ("hit", clean[clean["hit_tokens"] > 0], "x")):
        if len(sub):
            a.scatter(sub["modelled_ms"], sub["suffix_ms"], s=10, marker=m, label=label, alpha=0.7)
    if held.any():  # device time with host gaps (sim.replay.clock.Stopwatch): left out of the errors
        a.scatter(
            df.loc[held, "modelled_ms"], df.loc[held, "suffix_ms"], s=14, marker="^", c="red",
            label=f"host-bound ({int(held.sum())}, left out)", alpha=0.8,
        )  # fmt: skip
    if len(df):
        lo = float(min(df["modelled_ms"].min(), df["suffix_ms"].min()))
        hi = float(max(df["modelled_ms"].max(), df["suffix_ms"].max()))
        a.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = modelled")
        a.set_xscale("log")
        a.set_yscale("log")
    a.set_xlabel("modelled prefill time (ms)")
    a.set_ylabel("measured prefill time (ms)")
    a.set_title("suffix prefill per request", fontsize=10)
    if a.get_legend_handles_labels()[0]:
        a.legend(fontsize=8)
    else:  # no timed prefill (every request aborted at arrival): said, not matplotlib's "no artists" warning
        a.text(0.5, 0.5, "no timed prefill", transform=a.transAxes, ha="center", va="center", fontsize=9)
    compared = not summary or summary.get("time_model_compared", True)
    if compared:
        err = clean["model_error"].replace([np.inf, -np.inf], np.nan).dropna() * 100 if len(clean) else []
        b.hist(err, bins=40)
        b.set_xlabel("(modelled - measured) / measured (%)")
        b.set_ylabel("requests")
    title = "time-model error"
    if not compared:
        # the timing does not describe the run (a CPU replay against the H200 fit): the table says
        # "not compared", and the histogram with a median error in its title (98.5 % on a CPU) read
        # as the model's error; the note instead
        title += ": not compared"
        b.set_axis_off()
        note = summary.get("time_model_note") or "the timing does not describe this run"
        b.text(0.5, 0.5, textwrap.fill(note, 44), transform=b.transAxes, ha="center", va="center", fontsize=9)
    elif (
        summary
        and isinstance(summary.get("time_model_median_error"), (int, float))
        and math.isfinite(summary["time_model_median_error"])
    ):  # NaN in an older summary.json, null since
        title += f" (median |err| {summary['time_model_median_error'] * 100:.1f} %)"
    b.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
