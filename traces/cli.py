"""``marconi traces list|prepare|stats`` and the ``--trace`` options shared by ``run`` / ``sweep``."""

from __future__ import annotations

import json
import time

import click

from traces.registry import SPECS, TraceOptions, load_trace
from traces.tokenizers import TOKENIZERS

_DEFAULTS = TraceOptions()

# (option flags, kwargs key, click kwargs)
_OPTIONS = [
    (("--trace",), "trace", dict(default="sharegpt", show_default=True,
                                 help="Trace spec: " + ", ".join(SPECS) + " (see `marconi traces list`).")),
    (("--sessions",), "sessions", dict(type=int, default=_DEFAULTS.sessions, show_default=True,
                                       help="First N sessions of a text or synthetic trace (0 = all).")),
    (("--min-rounds",), "min_rounds", dict(type=int, default=_DEFAULTS.min_rounds, show_default=True,
                                           help="Chat traces: keep conversations with at least this many rounds.")),
    (("--max-tokens",), "max_tokens", dict(type=int, default=_DEFAULTS.max_tokens, show_default=True,
                                           help="Per-session token cap of text traces.")),
    (("--tokenizer",), "tokenizer", dict(default=_DEFAULTS.tokenizer, show_default=True,
                                         help="Tokenizer: " + ", ".join(TOKENIZERS) + ".")),
    (("--skip-bad-rows",), "skip_bad_rows", dict(is_flag=True, default=False,
                                                 help="Skip malformed trace rows (counted) instead of stopping.")),
    (("--response-time",), "response_time", dict(type=float, default=_DEFAULTS.response_time, show_default=True,
                                                 help="SWE-bench: mean Poisson think time in seconds.")),
    (("--time-scale",), "time_scale", dict(type=float, default=_DEFAULTS.time_scale, show_default=True,
                                           help="Open-loop traces: multiply inter-arrival times by this factor.")),
    (("--trace-seed",), "trace_seed", dict(type=int, default=_DEFAULTS.seed, show_default=True,
                                           help="Seed of every random draw made while building the trace.")),
]
TRACE_OPTION_KEYS = tuple(key for _, key, _ in _OPTIONS)


def trace_options(func):
    """Click decorator adding ``--trace`` and the trace-building options to a command."""
    for flags, key, kw in reversed(_OPTIONS):
        func = click.option(*flags, key, **kw)(func)
    return func


def options_from_kwargs(kwargs: dict, pop: bool = True) -> tuple[str, TraceOptions]:
    get = kwargs.pop if pop else kwargs.get
    vals = {key: get(key, None) for key in TRACE_OPTION_KEYS}
    spec = vals.pop("trace") or "sharegpt"
    seed = vals.pop("trace_seed")
    opts = TraceOptions(**{k: v for k, v in vals.items() if v is not None})
    if seed is not None:
        opts.seed = seed
    return spec, opts


def trace_from_cli(kwargs: dict, progress: bool = True):
    """Pops the trace options out of a command's ``kwargs`` and loads the trace (progress bar on
    stderr while tokenizing)."""
    spec, opts = options_from_kwargs(kwargs)
    opts.progress = progress
    return load_trace(spec, opts)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:,.1f}"
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
    def prepare_cmd(spec, **kwargs) -> None:
        """Load (tokenize) SPEC and store it in the trace cache."""
        kwargs["trace"] = spec
        t0 = time.perf_counter()
        trace = trace_from_cli(kwargs)
        dt = time.perf_counter() - t0
        click.echo(f"{trace.name}: {trace.n_sessions:,} sessions, {len(trace.requests):,} requests, "
                   f"{trace.input_tokens_total():,} input / {trace.output_tokens_total():,} output tokens "
                   f"({trace.meta.get('cache', 'no cache')}, {dt:.2f} s)")
        if "cache_path" in trace.meta:
            click.echo(f"cache: {trace.meta['cache_path']}")
        if trace.meta.get("skipped_rows"):
            click.echo(f"skipped rows: {trace.meta['skipped_rows']}")

    @traces_group.command("stats")
    @click.argument("spec", required=False, default="sharegpt")
    @trace_options
    @click.option("--sessions-per-second", "rate", type=float, default=1.0, show_default=True,
                  help="Session rate defining the replay order of closed-loop traces.")
    @click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
    def stats_cmd(spec, rate, fmt, **kwargs) -> None:
        """Sessions, requests, tokens and infinite-cache hit-rate upper bounds of SPEC."""
        from traces.stats import trace_stats

        if not rate > 0:
            from traces.base import TraceError

            raise TraceError(f"--sessions-per-second must be > 0 (got {rate})")
        kwargs["trace"] = spec
        trace = trace_from_cli(kwargs)
        st = trace_stats(trace, rate)
        if trace.meta.get("skipped_rows"):
            st["skipped_rows"] = trace.meta["skipped_rows"]
        if fmt == "json":
            click.echo(json.dumps(st, indent=2))
            return
        width = max(len(k) for k in st)
        for k, v in st.items():
            click.echo(f"{k:<{width}}  {_fmt(v)}")


__all__ = ["register", "trace_options", "trace_from_cli", "options_from_kwargs", "TRACE_OPTION_KEYS"]
