"""Simulation settings: one dataclass whose fields become ``marconi run`` / ``marconi sweep`` flags
and the knob columns of every result row."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from sim.errors import UsageError

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
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
        raise UsageError(f"cannot read size {text!r} (examples: 5GB, 512MiB, 1e9)")
    unit = m.group(2).lower() if m.group(2) else None
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(n: int) -> str:
    if n >= UNLIMITED:
        return "inf"
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n}B"


@dataclass
class SimConfig:
    policy: str = "marconi"
    model: str = "marconi-7b"
    capacity_bytes: int = 5 * 10**9
    alpha: float | str = 0.0  # float, or "auto" once tuning exists
    state_alignment: str = "exact"  # exact | chunk
    chunk_size: int = 64  # kernel chunk: state checkpoints land on multiples of it in `chunk` mode
    mode: str = "des"  # des | sequential
    # corrected | paper (the artifact as published: its replay semantics, logical clock and two
    # bugs) | paper-fixed (the artifact's semantics with exactly its two bugs fixed)
    compat: str = "corrected"
    sessions_per_second: float = 1.0
    arrival: str = "uniform"  # uniform (session i at i / rate) | poisson
    servers: int = 1  # simpy resources serving prefill + decode
    ttft_model: str = "flops"  # flops (FLOPs / throughput + overhead) | jamba (the paper's fitted table)
    seed: int = 0
    # alpha tuning (--alpha auto, marconi-oracle; policies/tuning.py)
    alpha_grid: str = "0:2:0.1"  # candidate alphas: lo:hi:step (inclusive) or a comma list
    bootstrap_multiplier: int = 5  # tuning window = k x requests seen before the first eviction
    # flops (artifact: FLOPs saved) | hit-rate (paper); None: hit-rate for the duel tuner, flops for replay
    tuning_objective: str | None = None
    tuning_start: str = "empty"  # empty (artifact: replay from the trace start) | snapshot (from the first eviction)
    tuning_workers: int = 0  # replay processes; 0 = all cores, 1 = serial
    retune_every: int = 0  # tune again every N requests (0: once, as the artifact)
    tuning_lru: bool | None = None  # SGLang+'s LRU as a tuning candidate (None: on unless paper compat)
    # which tuner --alpha auto runs: duel (shadow caches on the live stream) | replay (the artifact's
    # bootstrap-window replay); None: duel, or replay in paper / paper-fixed compat
    tuner: str | None = None
    duel_candidates: str = "lru,0,0.1,0.2,0.4,0.7,1,1.5,2"  # one shadow cache each
    duel_every: int = 25  # re-decide every N finished requests
    duel_window: int = 200  # score the last N finished requests
    duel_margin: float = 0.02  # a challenger must beat the incumbent by this fraction
    prefill_chunk_tokens: int = 8192  # chunked prefill: token budget of one scheduled prefill step
    block_size: int = 0  # engine presets' block in tokens (vllm-*: KV/state block); 0 = per model

    def validate(self) -> None:
        if self.capacity_bytes <= 0:
            raise UsageError("capacity must be positive")
        if self.state_alignment not in ("exact", "chunk"):
            raise UsageError(f"--state-alignment must be exact or chunk, not {self.state_alignment!r}")
        if self.mode not in ("des", "sequential"):
            raise UsageError(f"--mode must be des or sequential, not {self.mode!r}")
        if self.compat not in ("corrected", "paper", "paper-fixed"):
            raise UsageError(f"--compat must be corrected, paper or paper-fixed, not {self.compat!r}")
        if self.arrival not in ("uniform", "poisson"):
            raise UsageError(f"--arrival must be uniform or poisson, not {self.arrival!r}")
        if self.ttft_model not in ("flops", "jamba"):
            raise UsageError(f"--ttft-model must be flops or jamba, not {self.ttft_model!r}")
        if self.sessions_per_second <= 0:
            raise UsageError("--sessions-per-second must be positive")
        if self.servers < 1:
            raise UsageError("--servers must be >= 1")
        if self.prefill_chunk_tokens < 1:
            raise UsageError("--prefill-chunk must be >= 1")
        if self.block_size < 0:
            raise UsageError("--block-size must be >= 0")
        if self.chunk_size < 1:
            raise UsageError("--chunk-size must be >= 1")
        if self.bootstrap_multiplier < 1:
            raise UsageError("--bootstrap-multiplier must be >= 1")
        if self.tuning_objective not in (None, "flops", "hit-rate"):
            raise UsageError(f"--tuning-objective must be flops or hit-rate, not {self.tuning_objective!r}")
        if self.tuning_start not in ("empty", "snapshot"):
            raise UsageError(f"--tuning-start must be empty or snapshot, not {self.tuning_start!r}")
        if self.tuning_workers < 0 or self.retune_every < 0:
            raise UsageError("--tuning-workers and --retune-every must be >= 0")
        if self.tuner not in (None, "duel", "replay"):
            raise UsageError(f"--tuner must be duel or replay, not {self.tuner!r}")
        if self.duel_every < 1 or self.duel_window < 1 or self.duel_margin < 0:
            raise UsageError("--duel-every and --duel-window must be >= 1, --duel-margin >= 0")
        parse_grid(self.alpha_grid)
        parse_candidates(self.duel_candidates)
        if isinstance(self.alpha, str):
            if self.alpha != "auto":
                raise UsageError(f"--alpha must be a number or 'auto', not {self.alpha!r}")
        elif self.alpha < 0:
            raise UsageError("--alpha must be >= 0")

    def as_row(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


# ---------------------------------------------------------------------------------- tuning candidates

LRU = "lru"  # the tuning candidate that stands for SGLang+'s eviction


def parse_grid(text: str | list | tuple) -> tuple[float, ...]:
    """'0:2:0.1' (inclusive range) or '0,0.5,1' -> sorted unique alphas."""
    if isinstance(text, (list, tuple)):
        vals = [float(v) for v in text]
    else:
        text = str(text).strip()
        try:
            if ":" in text:
                lo, hi, step = (float(x) for x in text.split(":"))
                if step <= 0 or hi < lo:
                    raise ValueError
                n = int(round((hi - lo) / step))
                vals = [round(lo + i * step, 10) for i in range(n + 1)]
            else:
                vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--alpha-grid must look like 0:2:0.1 or 0,0.5,1, not {text!r}") from None
    if not vals or min(vals) < 0:
        raise UsageError("--alpha-grid needs alphas >= 0")
    return tuple(sorted(set(vals)))


def parse_candidates(text: str) -> list:
    """'lru,0,0.5,1' -> [LRU, 0.0, 0.5, 1.0]: LRU first, then alphas ascending (the preference order:
    ties go to the earlier one). Alphas may also be given as a grid, 'lru,0:2:0.5'."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    lru = any(p.lower() == LRU for p in parts)
    rest = [p for p in parts if p.lower() != LRU]
    alphas: tuple = ()
    if rest:
        alphas = parse_grid(rest[0] if len(rest) == 1 and ":" in rest[0] else ",".join(rest))
    cands = ([LRU] if lru else []) + list(alphas)
    if len(cands) < 1:
        raise UsageError("--duel-candidates needs at least one of lru or an alpha")
    return cands
