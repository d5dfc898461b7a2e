"""Simulation settings: one dataclass whose fields become ``marconi run`` / ``marconi sweep`` flags
and the knob columns of every result row."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields

from policies.admission import JudiciousAdmission
from policies.engines import ChunkedPrefill, VllmBlocks
from policies.eviction import MarconiEviction
from sim.errors import UsageError

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {
    None: 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}


UNLIMITED = 2**62  # `--capacity inf`: a cache that never evicts (the `infinite` bound)


def parse_size(text: str | int | float) -> int:
    """'5GB' -> 5e9 bytes (decimal, as the Marconi artifact uses); '5GiB' -> 5 * 2**30;
    'inf' -> UNLIMITED."""
    if isinstance(text, float) and text == float("inf"):
        return UNLIMITED
    if isinstance(text, (int, float)):
        return int(text)
    if str(text).strip().lower() in ("inf", "infinite", "unlimited"):
        return UNLIMITED
    m = _SIZE_RE.match(str(text))
    if not m:
        hint = "; one capacity per run, lists are for `marconi sweep`" if "," in str(text) else ""
        raise UsageError(f"cannot read size {text!r} (examples: 5GB, 512MiB, 1e9){hint}")
    unit = m.group(2).lower() if m.group(2) else None
    value = float(m.group(1)) * _UNITS[unit]
    if not value < UNLIMITED:  # 1e999 reads as inf: say so instead of an OverflowError
        raise UsageError(f"size {text!r} is too large (use inf for a cache that never evicts)")
    return int(value)


def format_size(n: int) -> str:
    if n >= UNLIMITED:
        return "inf"
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n}B"


def setting(default, help: str, *, choices=None, flag: str | None = None, group: str | None = "sim"):
    """A SimConfig field with its help, allowed values and flag (``--`` + the name with dashes
    unless given). ``group``: "sim" (a knob of `run` and `sweep`), "tuning" (read only by
    ``--alpha auto`` and ``marconi-oracle``) or None (an option the CLI declares itself)."""
    meta = {"help": help, "choices": tuple(choices) if choices else None, "flag": flag, "group": group}
    return field(default=default, metadata=meta)


def policy_knob(params_cls: type, name: str, group: str | None = "sim"):
    """A SimConfig field that is a policy's knob: default, help and choices come from the policy's
    ``Params`` (written there once)."""
    f = {f.name: f for f in fields(params_cls)}[name]
    return setting(f.default, f.metadata["help"], choices=f.metadata.get("choices"), flag=f.metadata.get("flag"),
                   group=group)


def flag_of(f) -> str:
    """The command-line flag of a SimConfig field."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _either(choices: tuple) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


@dataclass
class SimConfig:
    policy: str = setting("marconi", "Comma-separated policies (vanilla, vllm+, sglang+, marconi, ...).", group=None)
    model: str = setting("marconi-7b", "Model preset (see `marconi models`).")
    capacity_bytes: int = setting(5 * 10**9, "Cache capacity (5GB = 5e9 B, 5GiB = 5*2^30 B).", group=None)
    alpha: float | str = policy_knob(MarconiEviction.Params, "alpha", group=None)  # a float, or "auto"
    state_alignment: str = policy_knob(JudiciousAdmission.Params, "state_alignment")
    chunk_size: int = policy_knob(JudiciousAdmission.Params, "chunk_size")
    mode: str = setting("des", "des: discrete-event with servers and pinning; sequential: the artifact's replay.",
                        choices=("des", "sequential"))
    # corrected | paper (the artifact as published: its replay semantics, logical clock and two
    # bugs) | paper-fixed (the artifact's semantics with exactly its two bugs fixed): sim.compat
    compat: str = setting("corrected", "paper: the Marconi artifact as published (its replay, logical clock and two "
                          "bugs); paper-fixed: the same with its two bugs fixed; corrected: exact capacity, pinning.",
                          choices=("corrected", "paper", "paper-fixed"))
    sessions_per_second: float = setting(
        1.0, "Closed-loop traces: sessions started per second (session i at i / rate, or Poisson with --arrival "
        "poisson); open-loop traces (mooncake, bailian, marconi-jsonl) keep their own timestamps.", group=None)
    arrival: str = setting("uniform", "Session starts: i / rate (paper) or Poisson.", choices=("uniform", "poisson"))
    servers: int = setting(1, "Prefill servers (simpy resources).")
    ttft_model: str = setting("flops", "flops: FLOPs / throughput + overhead; jamba: the paper's fitted "
                              "Jamba-1.5-Mini table.", choices=("flops", "jamba"))
    timing_file: str | None = setting(
        None, "Timing file written by `marconi replay --calibrate FILE` (prefill throughput and overhead measured "
        "with the project's kernels) [default: the preset's estimate].", flag="--timing")
    seed: int = setting(0, "Seed of the Poisson session starts (--arrival poisson); uniform arrivals draw nothing.")
    # alpha tuning (--alpha auto, marconi-oracle; sim/tuning)
    alpha_grid: str = setting("0:2:0.1", "Alphas the tuner and marconi-oracle try (lo:hi:step or a comma list).",
                              group="tuning")
    bootstrap_multiplier: int = setting(5, "Tuning window = this x the requests seen before the first eviction "
                                        "(paper: 15 for LMSys).", group="tuning")
    tuning_objective: str | None = setting(
        None, "flops: FLOPs saved (artifact; replay: over the last 500 replayed requests); hit-rate: token hit rate "
        "(paper) [default: hit-rate for --tuner duel, flops for replay].", choices=("flops", "hit-rate"), group="tuning")
    tuning_start: str = setting("empty", "empty: replay from the trace start on an empty cache (artifact); snapshot: "
                                "from the cache at the first eviction.", choices=("empty", "snapshot"), group="tuning")
    tuning_workers: int = setting(0, "Replay processes (0 = all cores, 1 = serial).", group="tuning")
    retune_every: int = setting(0, "Tune again every N requests (0: once, as the artifact).", group="tuning")
    tuning_lru: bool | None = setting(
        None, "Let the tuner adopt SGLang+'s LRU when it beats every alpha [default: on, off in paper compat].",
        flag="--tuning-lru/--no-tuning-lru", group="tuning")
    tuner: str | None = setting(
        None, "duel: shadow caches per candidate on the live stream, adopt the best over a trailing window; replay: "
        "the artifact's bootstrap-window replay [default: duel, replay in paper compat].", choices=("duel", "replay"),
        group="tuning")
    duel_candidates: str = setting("lru,0,0.1,0.2,0.4,0.7,1,1.5,2", "Duel tuner: one shadow cache per candidate "
                                   "(lru = SGLang+'s eviction, or an alpha).", group="tuning")
    duel_every: int = setting(25, "Duel tuner: re-decide every N finished requests.", group="tuning")
    duel_window: int = setting(200, "Duel tuner: score candidates over the last N finished requests.", group="tuning")
    duel_margin: float = setting(0.02, "Duel tuner: a challenger must beat the incumbent's score by this fraction.",
                                 group="tuning")
    prefill_chunk_tokens: int = policy_knob(ChunkedPrefill, "prefill_chunk_tokens")
    block_size: int = policy_knob(VllmBlocks, "block_size")
    state_pool: str = setting("", "States' own pool for engine presets that have one (sglang-*, lmdeploy): a count of "
                              "states, or bytes with a unit, carved out of --capacity; empty = one budget.")

    def validate(self) -> None:
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices and not (value is None and f.default is None):
                raise UsageError(f"{flag_of(f)} must be {_either(choices)}, not {value!r}")
        if self.compat != "corrected" and self.mode != "sequential":
            # the artifact replays requests one at a time in timestamp order (docs/presets.md §5): it has
            # no servers, queues or pinning to reproduce in a discrete-event run
            raise UsageError(f"--compat {self.compat} reproduces the Marconi artifact's sequential replay: "
                             "use it with --mode sequential")
        if self.capacity_bytes <= 0:
            raise UsageError("capacity must be positive")
        if not 0 < self.sessions_per_second < math.inf:  # NaN fails both comparisons
            raise UsageError(f"--sessions-per-second must be a finite number > 0, not {self.sessions_per_second!r}")
        if self.servers < 1:
            raise UsageError("--servers must be >= 1")
        if self.seed < 0:  # numpy's generators take non-negative seeds only
            raise UsageError(f"--seed must be >= 0, not {self.seed}")
        if self.prefill_chunk_tokens < 1:
            raise UsageError("--prefill-chunk must be >= 1")
        if self.block_size < 0:
            raise UsageError("--block-size must be >= 0")
        if self.chunk_size < 1:
            raise UsageError("--chunk-size must be >= 1")
        if self.bootstrap_multiplier < 1:
            raise UsageError("--bootstrap-multiplier must be >= 1")
        if self.tuning_workers < 0 or self.retune_every < 0:
            raise UsageError("--tuning-workers and --retune-every must be >= 0")
        if self.duel_every < 1 or self.duel_window < 1 or not 0 <= self.duel_margin < math.inf:
            raise UsageError("--duel-every and --duel-window must be >= 1, --duel-margin >= 0")
        parse_grid(self.alpha_grid)
        parse_candidates(self.duel_candidates)
        if isinstance(self.alpha, str):
            if self.alpha != "auto":
                raise UsageError(f"--alpha must be a number or 'auto', not {self.alpha!r}")
        elif not 0 <= self.alpha < math.inf:  # NaN fails both comparisons
            raise UsageError(f"--alpha must be a finite number >= 0 or 'auto', not {self.alpha!r}")

    @classmethod
    def settings(cls, group: str) -> list:
        """The fields of ``group`` ("sim" or "tuning"), in declaration order."""
        return [f for f in fields(cls) if f.metadata.get("group") == group]

    def as_row(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


# ---------------------------------------------------------------------------------- tuning candidates

LRU = "lru"  # the tuning candidate that stands for SGLang+'s eviction


MAX_ALPHAS = 1000


def parse_grid(text: str | list | tuple, flag: str = "--alpha-grid") -> tuple[float, ...]:
    """'0:2:0.1' (inclusive range) or '0,0.5,1' -> sorted unique alphas (``flag`` names the option
    in error messages)."""
    if isinstance(text, (list, tuple)):
        vals = [float(v) for v in text]
    else:
        text = str(text).strip()
        try:
            if ":" in text:
                lo, hi, step = (float(x) for x in text.split(":"))
                if not (0 < step < math.inf and lo <= hi < math.inf):  # NaN fails too
                    raise ValueError
                n = int(round((hi - lo) / step))
                if n >= MAX_ALPHAS:  # each alpha is a shadow cache or a replay: refuse before building
                    raise UsageError(f"{flag} {text!r} has {n + 1:,} alphas (at most {MAX_ALPHAS:,})")
                vals = [round(lo + i * step, 10) for i in range(n + 1)]
            else:
                vals = [float(x) for x in text.split(",") if x.strip()]
        except UsageError:
            raise
        except ValueError:
            raise UsageError(f"{flag} must look like 0:2:0.1 or 0,0.5,1, not {text!r}") from None
    if not vals or not all(0 <= v < math.inf for v in vals):
        raise UsageError(f"{flag} needs finite alphas >= 0, not {text!r}")
    return tuple(sorted(set(vals)))


def parse_candidates(text: str) -> list:
    """'lru,0,0.5,1' -> [LRU, 0.0, 0.5, 1.0]: LRU first, then alphas ascending (the preference order:
    ties go to the earlier one). Alphas may also be given as a grid, 'lru,0:2:0.5'."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    lru = any(p.lower() == LRU for p in parts)
    rest = [p for p in parts if p.lower() != LRU]
    alphas: tuple = ()
    if rest:
        alphas = parse_grid(rest[0] if len(rest) == 1 and ":" in rest[0] else ",".join(rest),
                            flag="--duel-candidates")
    cands = ([LRU] if lru else []) + list(alphas)
    if len(cands) < 1:
        raise UsageError("--duel-candidates needs at least one of lru or an alpha")
    return cands
