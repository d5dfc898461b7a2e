"""`marconi report DIR`: any results folder (a sweep's, or `marconi run --out`'s) as a table, CSV or JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from sim.analysis import table
from sim.cli.options import format_option
from sim.errors import UsageError

SORT_HELP = "Metric to sort by, best first (higher hit rates and throughput, lower latencies and counts)"


def sort_key(text: str) -> str:
    """``--sort``: a metric column (or its short name); one line on anything else."""
    try:
        return table.metric_key(text)
    except ValueError:
        raise UsageError(f"--sort: unknown metric {text!r}; one of: {table.column_names()}") from None


def columns_of(text: str) -> list[str]:
    try:
        return table.parse_columns(text)
    except ValueError as exc:
        raise UsageError(
            f"--columns: unknown column {str(exc)!r}; use default, all or a comma list of: {table.column_names()}"
        ) from None


def timing_line(df) -> str:
    """A note naming the rows' GPUs priced by another device's datasheet ("uncalibrated for GPU
    b200"), as the run's and the sweep's headers say (a table of those rows said nothing): a run's
    summary.json records it, a sweep's rows are priced again from their model, GPU and group."""
    from sim.cost import calibrated_file, default_timing, timing_note  # noqa: PLC0415
    from sim.gpus import GPUS, canonical_gpu  # noqa: PLC0415

    notes: set = set()
    if "timing_note" in df.columns:  # `marconi run --out`: the note it wrote
        notes |= {n for n in df["timing_note"].dropna() if n}
    elif "gpu" in df.columns:
        keys = [c for c in ("model", "gpu", "tensor_parallel", "timing_file") if c in df.columns]
        for _, r in df[keys].astype(object).drop_duplicates().iterrows():  # each group priced once
            if not isinstance(r.get("gpu"), str) or not r["gpu"] or r.get("timing_file"):
                continue
            tp = r.get("tensor_parallel")
            try:
                tp = 0 if tp is None or (isinstance(tp, float) and math.isnan(tp)) else int(tp)
                notes.add(timing_note(default_timing(r["model"], r["gpu"], tp)))
            except (UsageError, KeyError, TypeError, ValueError):
                # a config.json not found from here (a relative path, read from another folder; moved
                # since): the GPU alone says it, as a model read from a config has no calibration of
                # its own (only the presets' A100 fit is; said nothing)
                dev = GPUS.get(canonical_gpu(r["gpu"]))
                if dev is not None and calibrated_file(dev.name) is None:
                    notes.add(f"uncalibrated for GPU {dev.name}")
                continue
    notes.discard("")
    return f"note: {'; '.join(sorted(notes))}" if notes else ""


def _plain(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def register(main: click.Group) -> None:
    @main.command("report")
    @click.argument("results", type=click.Path(path_type=Path))
    @format_option(
        "table: the rows as `marconi sweep` prints them; csv / json: config id, variant, knobs and metrics.",
        choices=("table", "csv", "json"),
    )
    @click.option("--sort", "sort", default="token_hit_rate", show_default=True, help=SORT_HELP + ".")
    @click.option(
        "--where",
        multiple=True,
        help="Keep rows whose column KEY equals VALUE (KEY=VALUE; repeat to combine): a knob "
        "(capacity=2GB, sessions_per_second=5, scheduler=fcfs), policy or variant.",
    )
    @click.option(
        "--columns",
        default="default",
        show_default=True,
        help="Metric columns: default, all, misses (missed tokens by cause), or a comma list of summary keys "
        "(as `marconi run --columns`).",
    )
    @click.option("--limit", type=click.IntRange(min=1), default=None, help="Print at most this many rows.")
    def report_cmd(results, fmt, sort, where, columns, limit):
        """Print a results folder as a table, one line per configuration, best first: a `marconi
        sweep --out` folder (its parquet rows) or a `marconi run --out` folder (its summary.json).

        \b
        Examples:
          marconi report results/
          marconi report results/ --sort ttft_p95_ms --where capacity=2GB --where policy=marconi
          marconi report results/ --format csv > results.csv
        """
        from sim.analysis import report  # noqa: PLC0415 - pandas, loaded only when reporting

        metric = sort_key(sort)
        cols = columns_of(columns)
        df = report.select(report.load_folder(results), list(where))
        if fmt == "table":
            click.echo(report.format_report(df, metric, cols, limit))
            note = timing_line(df)
            if note:
                click.echo(note)
            return
        records, knobs, metrics = report.report_rows(df, metric, cols)
        records = records[:limit] if limit else records
        keys = ["config_id", "variant", *knobs, *metrics]
        # a metric the table shows as '-' (an fcfs row's batch size) is empty / null, not 0.0
        rows = [{k: _plain(r[k]) if table.applies(k, r) else None for k in keys} for r in records]
        if fmt == "json":
            click.echo(json.dumps(rows, indent=2))
        else:
            import pandas as pd  # noqa: PLC0415

            click.echo(pd.DataFrame(rows, columns=keys).to_csv(index=False), nl=False)
