"""Sweep grids: every knob takes lists and ranges; a grid expands into Tasks with stable ids.

Values of a knob are a comma list (``1GB,2GB``) and/or inclusive ranges ``start:stop[:step]``
(``0:2:0.1``), see :func:`parse_values`. ``config_id`` is a stable hash of everything that
determines the result (trace spec, trace options, simulation knobs).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from itertools import product
from pathlib import Path
from typing import Iterable

from policies.base import get_preset, policy_knobs
from sim.config import SimConfig, parse_size
from sim.errors import UsageError
from sim.trace_options import TRACE_OPTIONS

#: bump when the meaning of a row changes so old results are not mistaken for new ones
#: (2: the tuning knobs are TunerParams' (sim/tuning_options.py); same columns, new config ids)
ROW_VERSION = 2
#: knobs that change speed, not results: kept out of the config id
SPEED_KNOBS = ("tuning_workers",)
#: knobs read only by alpha tuning (--alpha auto) and presets tuned in hindsight (marconi-oracle,
#: ``PolicyPreset.hindsight``): reset to their defaults for other policies so those do not multiply
#: with a tuning grid
TUNING_KNOBS = tuple(f.name for f in SimConfig.settings("tuning") if f.name not in SPEED_KNOBS)
#: trace options newer than ROW_VERSION 1: left out of the config id while at their default
LATER_TRACE_OPTIONS = ("session_range", "hash_block_tokens")
#: trace options newer than the rows' columns (tests/data/sweep-row-v2): a column of a row only when
#: set, so rows at their defaults keep the columns, in their order, of the results folders before them
LATER_TRACE_COLUMNS = ("hash_block_tokens",)
#: knobs read only by --scheduler continuous
BATCHING_KNOBS = ("max_num_batched_tokens", "max_num_seqs")

# ---------------------------------------------------------------------------------- value lists

MAX_RANGE_VALUES = 100_000


def _split_list(text: str, kind: str, flag: str = "value") -> list[str]:
    if kind == "str" and "," in str(text) and Path(str(text).strip()).exists():
        return [str(text).strip()]  # a file or folder whose name holds a comma (--model my,model/): one value
    if kind == "trace" and "," in str(text):  # mooncake:my,trace.jsonl (swebench:marconi:DIR too): one spec
        spec = str(text).strip()
        if any(Path(path).exists() for path in spec.split(":", 2)[1:] if "," in path):
            return [spec]
    parts = [p.strip() for p in str(text).split(",")]
    if kind == "trace":
        # synthetic:KIND:k=v,k2=v2 -> keep the k=v continuations with their spec
        merged: list[str] = []
        for p in parts:
            if merged and "=" in p and ":" not in p:
                merged[-1] += "," + p
            else:
                merged.append(p)
        parts = merged
    if len(parts) > 1 and not all(parts):  # "1GB,,5GB" or a trailing comma: a value left out
        raise UsageError(f"{flag}: empty value in the list {text!r}")
    return [p for p in parts if p]


def _number(text: str, kind: str, flag: str):
    if kind == "size":
        return parse_size(text)
    try:
        return Decimal(text)
    except InvalidOperation:
        raise UsageError(f"{flag}: cannot read number {text!r}") from None


def _expand_range(text: str, kind: str, flag: str) -> list:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise UsageError(f"{flag}: a range is start:stop[:step], not {text!r}")
    start, stop = (_number(p.strip(), kind, flag) for p in parts[:2])
    step = _number(parts[2].strip(), kind, flag) if len(parts) == 3 else (Decimal(1) if kind != "size" else None)
    if step is None:
        raise UsageError(f"{flag}: a size range needs a step, e.g. 1GB:5GB:1GB")
    if step <= 0:
        raise UsageError(f"{flag}: range step must be positive in {text!r}")
    if stop < start:
        raise UsageError(f"{flag}: range {text!r} runs backwards")
    count = int((stop - start) / step) + 1  # exact in Decimal; inclusive of stop when it lands on the grid
    if count > MAX_RANGE_VALUES:
        raise UsageError(f"{flag}: range {text!r} has {count} values (more than {MAX_RANGE_VALUES})")
    return [start + i * step for i in range(count)]


def parse_values(texts: str | Iterable[str], kind: str = "str", flag: str = "value") -> list:
    """Values of one knob from comma lists and inclusive ``start:stop[:step]`` ranges.

    ``kind``: ``int``, ``float``, ``size`` (``1GB``; ranges ``1GB:5GB:1GB``), ``alpha`` (floats
    and ``auto``), ``str`` (comma list only) or ``trace`` (comma list keeping ``k=v`` suffixes of
    synthetic specs). ``texts`` may be a list (a repeated flag). Order is kept, duplicates dropped.
    >>> parse_values("0:1:0.25", "float")
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    if isinstance(texts, str):
        texts = [texts]
    out: list = []
    for text in texts:
        for item in _split_list(text, kind, flag):
            if kind in ("str", "trace") or (kind == "alpha" and item == "auto"):
                vals = [item]
            elif ":" in item:
                vals = _expand_range(item, kind, flag)
            else:
                vals = [_number(item, kind, flag)]
            for v in vals:
                if kind == "int":
                    if v != int(v):
                        raise UsageError(f"{flag}: {v} is not an integer")
                    v = int(v)
                elif kind in ("float", "alpha") and isinstance(v, Decimal):
                    v = float(v)
                    if kind == "alpha" and not 0 <= v < math.inf:  # NaN fails both comparisons
                        raise UsageError(f"{flag} must be a finite number >= 0 or 'auto', not {v}")
                elif kind == "size":
                    v = int(v)
                if v not in out:
                    out.append(v)
    if not out:
        raise UsageError(f"{flag}: no values given")
    return out


# ---------------------------------------------------------------------------------- the grid


def _trace_defaults() -> dict:
    return {opt.key: opt.default for opt in TRACE_OPTIONS}


def _norm(value, like):
    """Normalise a value to the type of the field default (1 -> 1.0 for float knobs) for hashing."""
    if isinstance(like, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


@dataclass
class Task:
    """One configuration: a trace (spec + options, ``marconi run`` option names) and a SimConfig."""

    trace_kwargs: dict
    config: SimConfig
    alpha_mode: str  # static | auto | none (policy ignores alpha)
    config_id: str = ""
    knobs: dict = field(default_factory=dict)

    @property
    def trace_key(self) -> str:
        return json.dumps(self.trace_kwargs, sort_keys=True, default=str)


def unread_knobs(policy: str) -> list[str]:
    """The policy knobs (``policies.base.policy_knobs``: read by some presets, not all) that
    ``policy``'s preset does not read, alpha and the tuning knobs left to ``make_task``'s own rules."""
    name = get_preset(policy).name
    return [
        k
        for k, readers in policy_knobs().items()
        if name not in readers and k != "alpha" and k not in TUNING_KNOBS and k in SimConfig.field_names()
    ]


def make_task(trace_kwargs: dict, **knobs) -> Task:
    """A Task from trace options (``trace``, ``sessions``, ... as `marconi run` names them; missing
    ones take the CLI defaults) and SimConfig fields. A policy that ignores alpha gets alpha 0 to
    run with and NaN in its row, so it does not multiply with an alpha grid."""
    defaults = _trace_defaults()
    unknown = set(trace_kwargs) - set(defaults)
    if unknown:
        raise UsageError(f"unknown trace options {sorted(unknown)}")
    tk = {k: _norm(trace_kwargs.get(k, d), d) for k, d in defaults.items()}
    base = SimConfig()
    bad = set(knobs) - set(SimConfig.field_names())
    if bad:
        raise UsageError(f"unknown simulation knobs {sorted(bad)}")
    knobs = {k: _norm(v, getattr(base, k)) for k, v in knobs.items()}
    if "tuning_workers" in SimConfig.field_names():
        knobs.setdefault("tuning_workers", 1)  # the sweep already runs configurations in parallel
    cfg = SimConfig(**knobs)
    preset = get_preset(cfg.policy)
    if not preset.uses_alpha:
        cfg.alpha = 0.0
        mode = "none"
    elif cfg.alpha == "auto":
        mode = "auto"
    else:
        cfg.alpha = float(cfg.alpha)
        mode = "static"
    if mode != "auto" and not preset.tuned_in_hindsight:
        for k in TUNING_KNOBS:
            if hasattr(base, k):
                setattr(cfg, k, getattr(base, k))
    if cfg.effective_scheduler == "fcfs":  # the batching knobs mean nothing to fcfs: one run, not one per value
        for k in BATCHING_KNOBS:
            setattr(cfg, k, getattr(base, k))
    # a policy knob this preset does not read (vllm of --gpu-memory, SGLang's) runs at its default:
    # one run and one row, not one identical row per value of it (`sweep --policy sglang,vllm
    # --gpu-memory 20GB,40GB` showed two vllm rows of the same numbers); its cell is the default's
    for k in unread_knobs(cfg.policy):
        setattr(cfg, k, getattr(base, k))
    cfg.validate()
    row = cfg.as_row()
    if mode != "static":
        row["alpha"] = float("nan")
    ident = {k: v for k, v in cfg.as_row().items() if k not in SPEED_KNOBS}
    if cfg.effective_scheduler == "fcfs":  # config ids of fcfs runs stay those of before the scheduler existed
        for k in ("scheduler", *BATCHING_KNOBS):
            ident.pop(k)
    # trace options added later count only when set, so earlier results folders keep their ids
    tk_id = {k: v for k, v in tk.items() if not (k in LATER_TRACE_OPTIONS and v == defaults[k])}
    identity = {"v": ROW_VERSION, "trace": tk_id, "config": {**ident, "alpha": None if mode == "none" else cfg.alpha}}
    cid = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:20]
    tk_row = {k: v for k, v in tk.items() if not (k in LATER_TRACE_COLUMNS and v == defaults[k])}
    knob_row = {"config_id": cid, **tk_row, **row, "alpha_mode": mode}
    return Task(tk, cfg, mode, cid, knob_row)


#: the most configurations one sweep may have (counted before the grid is built: building takes
#: about a millisecond per configuration, and each is a simulation)
MAX_GRID = 50_000


def grid_size(trace_axes: dict[str, list], sim_axes: dict[str, list]) -> int:
    """The number of configurations ``expand_grid`` builds at most, counted from the axis lengths
    alone (a policy that ignores alpha counts once over the alpha axis, as it runs once)."""
    others = math.prod(len(v) for k, v in {**trace_axes, **sim_axes}.items() if k not in ("policy", "alpha"))
    alphas = len(sim_axes.get("alpha", [None]))
    per_policy = [alphas if get_preset(p).uses_alpha else 1 for p in sim_axes.get("policy", [SimConfig().policy])]
    return others * sum(per_policy)


def check_grid_size(trace_axes: dict[str, list], sim_axes: dict[str, list]) -> int:
    """``grid_size``, refused (one line naming the axes) above MAX_GRID."""
    n = grid_size(trace_axes, sim_axes)
    if n > MAX_GRID:
        axes = " x ".join(f"{k}({len(v)})" for k, v in {**trace_axes, **sim_axes}.items() if len(v) > 1)
        raise UsageError(
            f"the grid has {n:,} configurations ({axes}), more than {MAX_GRID:,}: use fewer values "
            "or split it into several sweeps"
        )
    return n


def expand_grid(trace_axes: dict[str, list], sim_axes: dict[str, list]) -> list[Task]:
    """The cartesian product of every axis (each a list of values; one value = fixed), as Tasks in
    a deterministic order grouped by trace. Duplicates (a policy without alpha over an alpha grid)
    appear once. A grid larger than MAX_GRID is refused before anything is built."""
    check_grid_size(trace_axes, sim_axes)
    t_names = list(trace_axes)
    s_names = list(sim_axes)
    tasks: list[Task] = []
    seen: set[str] = set()
    for t_vals in product(*(trace_axes[n] for n in t_names)):
        tk = dict(zip(t_names, t_vals))
        for s_vals in product(*(sim_axes[n] for n in s_names)):
            task = make_task(tk, **dict(zip(s_names, s_vals)))
            if task.config_id not in seen:
                seen.add(task.config_id)
                tasks.append(task)
    return tasks
