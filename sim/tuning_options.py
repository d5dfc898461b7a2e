"""The knobs of alpha tuning (``--alpha auto``'s tuners and ``marconi-oracle``; sim/tuning), written
once here as a ``Params`` dataclass the way policies write theirs (:func:`policies.base.knob`).
:class:`TunerParams` is SimConfig's ``tuning`` group (``config.tuning``; each knob also read and
written flat, ``config.duel_every``), so the CLI options of `run` / `sweep`, the sweep axes and the
result columns all come from here; sim/tuning reads its knobs back with :func:`tuner_params`. This
module sits below sim.config (which imports it) and so below sim.tuning."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from policies.base import knob, params_from
from sim.errors import UsageError


@dataclass(frozen=True)
class TunerParams:
    """The tuning knobs, in the order of their CLI options and result columns. Shared: ``tuner``,
    ``alpha_grid`` (the replay tuner and marconi-oracle), ``tuning_objective``, ``tuning_lru``;
    the replay tuner's: ``bootstrap_multiplier`` .. ``retune_every``; the duel tuner's: ``duel_*``."""

    alpha_grid: str = knob("0:2:0.1", "Alphas the tuner and marconi-oracle try (lo:hi:step or a comma list).")
    bootstrap_multiplier: int = knob(
        5, "Tuning window = this x the requests seen before the first eviction (paper: 15 for LMSys)."
    )
    tuning_objective: str | None = knob(
        None,
        "flops: FLOPs saved (artifact; replay: over the last 500 replayed requests); hit-rate: token hit rate "
        "(paper) [default: hit-rate for --tuner duel, flops for replay].",
        choices=("flops", "hit-rate"),
    )
    tuning_start: str = knob(
        "empty",
        "empty: replay from the trace start on an empty cache (artifact); snapshot: "
        "from the cache at the first eviction.",
        choices=("empty", "snapshot"),
    )
    tuning_workers: int = knob(0, "Replay processes (0 = all cores, 1 = serial).")
    retune_every: int = knob(0, "Tune again every N requests (0: once, as the artifact).")
    tuning_lru: bool | None = knob(
        None,
        "Let the tuner adopt SGLang+'s LRU when it beats every alpha [default: on, off in paper compat].",
        flag="--tuning-lru/--no-tuning-lru",
    )
    tuner: str | None = knob(
        None,
        "duel: shadow caches per candidate on the live stream, adopt the best over a trailing window; replay: "
        "the artifact's bootstrap-window replay [default: duel, replay in paper compat].",
        choices=("duel", "replay"),
    )
    duel_candidates: str = knob(
        "lru,0,0.1,0.2,0.4,0.7,1,1.5,2",
        "Duel tuner: one shadow cache per candidate (lru = SGLang+'s eviction, or an alpha).",
    )
    duel_every: int = knob(25, "Duel tuner: re-decide every N finished requests.")
    duel_window: int = knob(200, "Duel tuner: score candidates over the last N finished requests.")
    duel_margin: float = knob(0.02, "Duel tuner: a challenger must beat the incumbent's score by this fraction.")

    def validate(self) -> None:
        """Refuses values out of range (the messages `marconi run` prints)."""
        if self.bootstrap_multiplier < 1:
            raise UsageError("--bootstrap-multiplier must be >= 1")
        if self.tuning_workers < 0 or self.retune_every < 0:
            raise UsageError("--tuning-workers and --retune-every must be >= 0")
        if self.duel_every < 1 or self.duel_window < 1 or not 0 <= self.duel_margin < math.inf:
            raise UsageError("--duel-every and --duel-window must be >= 1, --duel-margin >= 0")
        parse_grid(self.alpha_grid)
        parse_candidates(self.duel_candidates)


def tuner_params(config: Any) -> TunerParams:
    """The tuning knobs of a simulation's config (a SimConfig: same-named fields)."""
    return params_from(TunerParams, config)


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
        alphas = parse_grid(rest[0] if len(rest) == 1 and ":" in rest[0] else ",".join(rest), flag="--duel-candidates")
    cands = ([LRU] if lru else []) + list(alphas)
    if len(cands) < 1:
        raise UsageError("--duel-candidates needs at least one of lru or an alpha")
    return cands
