"""The trace-building options shared by ``marconi run``, ``marconi sweep``, ``marconi traces`` and
the sweep grids: each option is written once here (flag, default, help); the CLI turns them into
click options and the sweeps into grid axes."""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import UsageError
from traces.registry import SPECS, TraceOptions
from traces.tokenizers import TOKENIZERS

_DEFAULTS = TraceOptions()


@dataclass(frozen=True)
class TraceOption:
    flag: str
    key: str  # keyword name in a command's kwargs and a sweep row
    default: object
    help: str
    type: type | None = None  # int / float (None: a string, or a flag)
    is_flag: bool = False


TRACE_OPTIONS = (
    TraceOption("--trace", "trace", "sharegpt", "Trace spec: " + ", ".join(SPECS) + " (see `marconi traces list`)."),
    TraceOption(
        "--sessions",
        "sessions",
        _DEFAULTS.sessions,
        "First N sessions of a text trace (0 = all); a synthetic trace makes N (0: 100).",
        int,
    ),
    TraceOption(
        "--min-rounds",
        "min_rounds",
        _DEFAULTS.min_rounds,
        "Chat traces: keep conversations with at least this many rounds.",
        int,
    ),
    TraceOption("--max-tokens", "max_tokens", _DEFAULTS.max_tokens, "Per-session token cap of text traces.", int),
    TraceOption("--tokenizer", "tokenizer", _DEFAULTS.tokenizer, "Tokenizer: " + ", ".join(TOKENIZERS) + "."),
    TraceOption(
        "--skip-bad-rows",
        "skip_bad_rows",
        False,
        "Skip malformed trace rows (counted) instead of stopping.",
        is_flag=True,
    ),
    TraceOption(
        "--response-time",
        "response_time",
        _DEFAULTS.response_time,
        "SWE-bench: mean Poisson think time in seconds.",
        float,
    ),
    TraceOption(
        "--time-scale",
        "time_scale",
        _DEFAULTS.time_scale,
        "Open-loop traces: multiply inter-arrival times by this factor.",
        float,
    ),
    TraceOption(
        "--trace-seed", "trace_seed", _DEFAULTS.seed, "Seed of every random draw made while building the trace.", int
    ),
    TraceOption(
        "--hash-block-tokens",
        "hash_block_tokens",
        False,
        "Mooncake / Bailian: spell every hash block out as its tokens (block_tokens 1), so a preset's own "
        "blocks and states can end inside a hash block, as the engine's do; the trace then holds block "
        "size (512 / 16) times as many symbols (mooncake:sample: 4.4 million tokens).",
        is_flag=True,
    ),
    TraceOption(
        "--session-range",
        "session_range",
        _DEFAULTS.session_range,
        "Keep sessions START:STOP of the trace (0-based, in order of first appearance; STOP exclusive "
        "or left out); empty = all.",
    ),
)
TRACE_OPTION_KEYS = tuple(opt.key for opt in TRACE_OPTIONS)


def options_from_kwargs(kwargs: dict, pop: bool = True) -> tuple[str, TraceOptions]:
    """(trace spec, TraceOptions) from a command's or a sweep row's keyword arguments."""
    get = kwargs.pop if pop else kwargs.get
    vals = {key: get(key, None) for key in TRACE_OPTION_KEYS}
    spec = vals.pop("trace")
    if spec is not None and not str(spec).strip():  # `--trace ''` is a mistake, not the default trace
        raise UsageError("--trace is empty: give a trace spec (see `marconi traces list`), or leave the option out")
    spec = spec or "sharegpt"
    seed = vals.pop("trace_seed")
    opts = TraceOptions(**{k: v for k, v in vals.items() if v is not None})
    if seed is not None:
        opts.seed = seed
    return spec, opts
