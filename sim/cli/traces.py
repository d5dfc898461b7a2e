"""``marconi traces list|prepare|stats``, and the ``--trace`` options as click options for ``run`` / ``sweep``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from click.core import ParameterSource

from sim.cli.options import PROGRESS_HELP, format_option
from sim.errors import UsageError
from sim.trace_options import TRACE_OPTIONS, options_from_kwargs
from traces.base import TraceError
from traces.registry import SPECS, load_trace
from traces.stats import trace_stats
from traces.tokenizers import TOKENIZERS


def trace_options(func):
    """Click decorator adding ``--trace`` and the trace-building options to a command."""
    for opt in reversed(TRACE_OPTIONS):
        kw = dict(default=opt.default, help=opt.help)
        if opt.is_flag:
            kw["is_flag"] = True
        else:
            kw["show_default"] = True
            if opt.type is not None:
                kw["type"] = opt.type
        func = click.option(opt.flag, opt.key, **kw)(func)
    return func


def trace_from_cli(kwargs: dict, progress: bool = True, say_skipped: bool = True):
    """Pops the trace options out of a command's ``kwargs`` and loads the trace (progress bar on
    stderr while tokenizing). ``say_skipped``: a note on stderr counts the rows --skip-bad-rows
    skipped (`traces` commands print the count themselves)."""
    spec, opts = options_from_kwargs(kwargs)
    opts.progress = progress
    trace = load_trace(spec, opts)
    if trace.meta.get("cache_rebuilt"):  # a cache file that failed its check was replaced: said once
        click.echo(f"note: trace cache {trace.meta['cache_rebuilt']}", err=True)
    skipped = trace.meta.get("skipped_rows") or 0
    if say_skipped and skipped:  # the run is of what is left: how much was left out is said
        rows = "row" if skipped == 1 else "rows"
        click.echo(f"note: {skipped:,} bad {rows} of {trace.name} skipped (--skip-bad-rows)", err=True)
    dropped = trace.meta.get("non_ascii_dropped") or 0
    if dropped:  # lmsys: the paper's selection leaves out mostly non-ASCII conversations, said as skipped rows are
        share = trace.meta.get("max_non_ascii", 0.5)
        click.echo(
            f"note: {dropped:,} conversation{'' if dropped == 1 else 's'} of {trace.name} left out: more than {share:.0%} "
            "non-ASCII text (the Marconi paper's LMSys selection)",
            err=True,
        )
    empty = trace.meta.get("dropped_sessions") or 0
    if empty:  # chat traces: a selected conversation that made no request is no session (fewer than --sessions)
        meta = trace.meta
        cap = meta.get("max_input_tokens") or meta.get("max_total_tokens") or meta.get("max_tokens")
        limit = f"--max-tokens {cap:,}" if cap else "--max-tokens"
        over = f"its first is over {limit}, or it has none"
        click.echo(
            f"note: {empty:,} conversation{'' if empty == 1 else 's'} of {trace.name} left out: it makes no request "
            f"({over})",
            err=True,
        )
    cut = trace.meta.get("truncated_after_records")
    if cut is not None:  # the file stops inside a record: what came before it is run, and that is said
        click.echo(
            f"note: {trace.name} ends inside a record (the file is cut short): its {cut:,} complete "
            f"record{'' if cut == 1 else 's'} before it are read",
            err=True,
        )
    say_short_session_range(trace)
    say_fewer_sessions(trace)
    return trace


def say_fewer_sessions(trace) -> None:
    """A chat trace with fewer sessions than ``--sessions`` asked for (``--min-rounds`` left fewer
    conversations): said in one line on stderr, as a ``--session-range`` past the trace is
    (`--sessions 1000 --min-rounds 40` ran ShareGPT's 2 without a word)."""
    asked, meta = trace.meta.get("sessions_requested") or 0, trace.meta
    # the conversations the filters kept: sessions, and those left out for making no request (said)
    have = meta.get("sessions_total", trace.n_sessions) + (meta.get("dropped_sessions") or 0)
    ctx = click.get_current_context(silent=True)
    given = ctx is not None and ctx.get_parameter_source("sessions") not in (ParameterSource.DEFAULT, None)
    if not asked or have >= asked or not given:  # the default 100 of a small file of one's own: nothing to say
        return
    rounds = meta.get("min_rounds")
    which = f" of at least {rounds} rounds (--min-rounds {rounds})" if rounds else ""
    noun = "trajector" if "construction" in meta else "conversation"  # swebench: trajectories
    plural = ("y" if have == 1 else "ies") if noun == "trajector" else ("" if have == 1 else "s")
    click.echo(f"note: --sessions {asked:,}: {trace.name} has only {have:,} {noun}{plural}{which}", err=True)


def say_short_session_range(trace) -> None:
    """A --session-range that ends past the trace's sessions runs what there is: said in one line
    on stderr (the run is still meaningful, of fewer sessions than the range names)."""
    from traces.sessions import parse_session_range  # noqa: PLC0415

    text, total = trace.meta.get("session_range"), trace.meta.get("sessions_total")
    if not text or total is None:
        return
    start, stop = parse_session_range(text)
    if stop is not None and stop > total:
        kept = total - start
        click.echo(
            f"note: --session-range {text}: the trace has {total:,} sessions; running sessions {start}:{total} "
            f"({kept:,} session{'' if kept == 1 else 's'})",
            err=True,
        )


def _one_trace(spec: str, kwargs: dict) -> None:
    """SPEC or --trace names the trace (either, not both: one of them would be silently ignored)."""
    ctx = click.get_current_context()
    given = {name: ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None) for name in ("spec", "trace")}
    if given["spec"] and given["trace"]:
        raise UsageError(f"the trace is given twice ({spec!r} and --trace {kwargs['trace']!r}): give one of them")
    if not given["trace"]:
        kwargs["trace"] = spec


def _refuse_unread(kwargs: dict, rate_flag: str = "") -> None:
    """Trace options the trace does not read (and, for ``stats``, a session rate on an open-loop
    trace) are refused in one line, as ``run`` refuses them."""
    from sim.cli.checks import given_trace_options, refuse_rate_on_open_loop, refuse_unread_trace_options

    ctx = click.get_current_context()
    refuse_unread_trace_options([kwargs["trace"]], given_trace_options(ctx))
    if rate_flag:
        given = ctx.get_parameter_source("rate") not in (ParameterSource.DEFAULT, None)
        refuse_rate_on_open_loop([kwargs["trace"]], given, rate_flag)


def _fmt(v, key: str = "") -> str:
    """One value of the `traces stats` table: hit rates as percentages, as `run` prints them (they
    read 0.9319 beside run's 93.19%), other numbers with a thousands separator and one decimal (two
    under 10: a mean of 8.0000 turns)."""
    if isinstance(v, float) and key.endswith("_rate"):
        return f"{v:.2%}"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 10 else f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def register(main: click.Group) -> None:
    @main.group("traces")
    def traces_group() -> None:
        """List, prepare (tokenize and cache) and describe traces."""

    @traces_group.command("list")
    def list_cmd() -> None:
        """Trace specs and tokenizers."""
        width = max(len(s) for s in SPECS)
        click.echo("Traces (--trace):")
        for spec, doc in SPECS.items():
            click.echo(f"  {spec:<{width}}  {doc}")
        click.echo("Tokenizers (--tokenizer):")
        for spec, doc in TOKENIZERS.items():
            click.echo(f"  {spec:<{width}}  {doc}")

    @traces_group.command("prepare")
    @click.argument("spec", required=False, default="sharegpt")
    @trace_options
    @click.option("--progress/--no-progress", default=True, show_default=True, help=PROGRESS_HELP)
    def prepare_cmd(spec, progress, **kwargs) -> None:
        """Load (tokenize) SPEC and store it in the trace cache."""
        _one_trace(spec, kwargs)
        _refuse_unread(kwargs)
        t0 = time.perf_counter()
        trace = trace_from_cli(kwargs, progress, say_skipped=False)
        dt = time.perf_counter() - t0
        click.echo(
            f"{trace.name}: {trace.n_sessions:,} sessions, {len(trace.requests):,} requests, "
            f"{trace.input_tokens_total():,} input / {trace.output_tokens_total():,} output tokens "
            f"({trace.meta.get('cache', 'no cache')}, {dt:.2f} s)"
        )
        if "cache_path" in trace.meta and Path(trace.meta["cache_path"]).is_file():  # only a file that exists
            click.echo(f"cache: {trace.meta['cache_path']}")
        if trace.meta.get("skipped_rows"):
            click.echo(f"skipped rows: {trace.meta['skipped_rows']}")

    @traces_group.command("stats")
    @click.argument("spec", required=False, default="sharegpt")
    @trace_options
    @click.option(
        "--sessions-per-second",
        "rate",
        type=float,
        default=1.0,
        show_default=True,
        help="Session rate defining the replay order of closed-loop traces.",
    )
    @format_option("table: a statistic a line; json: the same statistics as one object.")
    @click.option("--progress/--no-progress", default=True, show_default=True, help=PROGRESS_HELP)
    def stats_cmd(spec, rate, fmt, progress, **kwargs) -> None:
        """Sessions, requests, tokens and infinite-cache hit-rate upper bounds of SPEC."""
        from sim.cli.checks import RATE_RANGE  # noqa: PLC0415 - the range run and sweep take

        if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:  # 1e-320 ordered the sessions on an infinite clock
            raise TraceError(
                f"--sessions-per-second must be in {RATE_RANGE[0]:g}..{RATE_RANGE[1]:g} (sessions started per "
                f"second), not {rate!r}"
            )
        _one_trace(spec, kwargs)
        _refuse_unread(kwargs, rate_flag="--sessions-per-second")
        trace = trace_from_cli(kwargs, progress, say_skipped=False)
        st = trace_stats(trace, rate, progress=progress)
        if trace.meta.get("skipped_rows"):
            st["skipped_rows"] = trace.meta["skipped_rows"]
        if fmt == "json":
            click.echo(json.dumps(st, indent=2))
            return
        width = max(len(k) for k in st)
        for k, v in st.items():
            click.echo(f"{k:<{width}}  {_fmt(v, k)}")


__all__ = ["register", "trace_options", "trace_from_cli"]
