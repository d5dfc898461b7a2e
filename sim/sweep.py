"""Parameter sweeps: expand a grid of knobs into configurations, run them on local processes or
Ray, and keep one tidy parquet row per configuration under an output folder.

Layout of a results folder (``--out``)::

    OUT/<config_id>.parquet              one row: every knob + every summary metric + wall time
    OUT/_requests/<config_id>.parquet    per-request records (``--save-requests``)
    OUT/_occupancy/<config_id>.parquet   cache occupancy over time (``--save-requests``)

``config_id`` is a stable hash of everything that determines the result (trace spec, trace
options, simulation knobs). A row file is written last, atomically (temp file + rename), so its
presence means the configuration is complete: a rerun skips it, a crash loses only what was
running, and nothing is written twice. ``pandas.read_parquet(OUT)`` reads the rows (pyarrow skips
the ``_``/``.``-prefixed detail folders and temp files); :func:`load_results` is a schema-tolerant
reader.

Values of a knob are a comma list (``1GB,2GB``) and/or inclusive ranges ``start:stop[:step]``
(``0:2:0.1``), see :func:`parse_values`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from itertools import product
from pathlib import Path
from typing import Any, Callable, Iterable

from sim.config import SimConfig, parse_size
from sim.errors import UsageError

#: bump when the meaning of a row changes so old results are not mistaken for new ones
ROW_VERSION = 1
REQUESTS_DIR = "_requests"
OCCUPANCY_DIR = "_occupancy"
TRACE_CACHE_SIZE = 4  # traces kept per worker process
#: row columns that depend on the run, not the configuration (excluded when comparing engines)
RUNTIME_COLUMNS = ("wall_s", "trace_load_s", "worker_pid", "tuning_seconds")
#: knobs that change speed, not results: kept out of the config id
SPEED_KNOBS = ("tuning_workers",)
#: knobs read only by alpha tuning (--alpha auto) and marconi-oracle: reset to their defaults for
#: other policies so those do not multiply with a tuning grid
TUNING_KNOBS = ("alpha_grid", "bootstrap_multiplier", "tuning_objective", "tuning_start", "retune_every",
                "tuning_lru", "tuner", "duel_candidates", "duel_every", "duel_window", "duel_margin")
TUNED_POLICIES = ("marconi-oracle",)

# ---------------------------------------------------------------------------------- value lists

MAX_RANGE_VALUES = 100_000


def _split_list(text: str, kind: str) -> list[str]:
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
        for item in _split_list(text, kind):
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
                elif kind == "size":
                    v = int(v)
                if v not in out:
                    out.append(v)
    if not out:
        raise UsageError(f"{flag}: no values given")
    return out


# ---------------------------------------------------------------------------------- the grid

def _trace_defaults() -> dict:
    from traces.cli import _OPTIONS

    return {key: kw.get("default") for _, key, kw in _OPTIONS}


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


def make_task(trace_kwargs: dict, **knobs) -> Task:
    """A Task from trace options (``trace``, ``sessions``, ... as `marconi run` names them; missing
    ones take the CLI defaults) and SimConfig fields. A policy that ignores alpha gets alpha 0 to
    run with and NaN in its row, so it does not multiply with an alpha grid."""
    from policies.presets import get_preset

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
    if mode != "auto" and cfg.policy not in TUNED_POLICIES:
        for k in TUNING_KNOBS:
            if hasattr(base, k):
                setattr(cfg, k, getattr(base, k))
    cfg.validate()
    row = cfg.as_row()
    if mode != "static":
        row["alpha"] = float("nan")
    ident = {k: v for k, v in cfg.as_row().items() if k not in SPEED_KNOBS}
    identity = {"v": ROW_VERSION, "trace": tk, "config": {**ident, "alpha": None if mode == "none" else cfg.alpha}}
    cid = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:20]
    knob_row = {"config_id": cid, **tk, **row, "alpha_mode": mode}
    return Task(tk, cfg, mode, cid, knob_row)


def expand_grid(trace_axes: dict[str, list], sim_axes: dict[str, list]) -> list[Task]:
    """The cartesian product of every axis (each a list of values; one value = fixed), as Tasks in
    a deterministic order grouped by trace. Duplicates (a policy without alpha over an alpha grid)
    appear once."""
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


# ---------------------------------------------------------------------------------- execution

_TRACES: "OrderedDict[str, Any]" = OrderedDict()


def _load_trace(trace_kwargs: dict):
    key = json.dumps(trace_kwargs, sort_keys=True, default=str)
    trace = _TRACES.get(key)
    if trace is not None:
        _TRACES.move_to_end(key)
        return trace, 0.0
    from traces.cli import options_from_kwargs
    from traces.registry import load_trace

    t0 = time.perf_counter()
    spec, opts = options_from_kwargs(dict(trace_kwargs), pop=True)
    opts.progress = False
    trace = load_trace(spec, opts)
    _TRACES[key] = trace
    while len(_TRACES) > TRACE_CACHE_SIZE:
        _TRACES.popitem(last=False)
    return trace, time.perf_counter() - t0


def loaded_trace_keys() -> list[str]:
    """Traces held by this process's cache (tests check that each is loaded once)."""
    return list(_TRACES)


def execute(task: Task, save_requests: bool = False) -> dict:
    """Run one configuration; returns {"row": dict, "requests": DataFrame|None, "occupancy": ...}.
    Runs in worker processes (local pool or Ray); writes nothing."""
    from sim.engine import simulate

    trace, load_s = _load_trace(task.trace_kwargs)
    t0 = time.perf_counter()
    res = simulate(trace, task.config)
    wall = time.perf_counter() - t0
    summary = dict(res.summary)
    summary.pop("policy", None)
    for k, v in summary.items():  # nested values (e.g. the oracle's per-alpha hit rates) as JSON text
        if isinstance(v, (dict, list, tuple)):
            summary[k] = json.dumps(v, sort_keys=True, default=str)
    row = {**task.knobs, "trace_name": trace.name, **summary, "wall_s": wall, "trace_load_s": load_s,
           "worker_pid": os.getpid()}
    out = {"row": row, "requests": None, "occupancy": None}
    if save_requests:
        out["requests"] = res.requests
        out["occupancy"] = res.occupancy
    return out


def _atomic_parquet(df, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.stem}-{os.getpid()}-{time.monotonic_ns()}.parquet"
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def row_path(out: Path, config_id: str) -> Path:
    return Path(out) / f"{config_id}.parquet"


def _detail_paths(out: Path, config_id: str) -> tuple[Path, Path]:
    out = Path(out)
    return out / REQUESTS_DIR / f"{config_id}.parquet", out / OCCUPANCY_DIR / f"{config_id}.parquet"


def is_done(out: Path, task: Task, save_requests: bool) -> bool:
    if not row_path(out, task.config_id).exists():
        return False
    return not save_requests or all(p.exists() for p in _detail_paths(out, task.config_id))


def write_result(out: Path, task: Task, result: dict) -> None:
    """Details first, the row last: the row file marks the configuration complete."""
    import pandas as pd

    req_p, occ_p = _detail_paths(out, task.config_id)
    for df, p in ((result["requests"], req_p), (result["occupancy"], occ_p)):
        if df is not None and not p.exists():
            df = df.copy()
            df.insert(0, "config_id", task.config_id)
            _atomic_parquet(df, p)
    rp = row_path(out, task.config_id)
    if not rp.exists():
        _atomic_parquet(pd.DataFrame([result["row"]]), rp)


@dataclass
class SweepReport:
    total: int
    skipped: int
    ran: int
    failed: list = field(default_factory=list)  # (Task, error text)
    wall_s: float = 0.0
    interrupted: bool = False


def _describe(task: Task) -> str:
    k = task.knobs
    if task.alpha_mode == "static":
        alpha = f" alpha={task.config.alpha:g}"
    else:
        alpha = " alpha=auto" if task.alpha_mode == "auto" else ""
    return (f"{k['trace']} {task.config.policy}{alpha} cap={task.config.capacity_bytes / 1e9:g}GB "
            f"sps={task.config.sessions_per_second:g} [{task.config_id}]")


def _local_results(todo: list[Task], workers: int, save_requests: bool):
    if workers <= 1:
        for task in todo:
            try:
                yield task, execute(task, save_requests), None
            except Exception as exc:  # noqa: BLE001 - reported per configuration
                yield task, None, exc
        return
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["sim.sweep", "sim.engine", "traces.registry", "traces.cli"])
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    futures = {}
    try:
        # keep a bounded queue so a Ctrl-C has few configurations in flight
        it = iter(todo)
        for task in it:
            futures[pool.submit(execute, task, save_requests)] = task
            if len(futures) >= 2 * workers:
                break
        while futures:
            done, _ = wait(futures, return_when=FIRST_COMPLETED)
            for fut in done:
                task = futures.pop(fut)
                exc = fut.exception()
                yield task, (None if exc else fut.result()), exc
                nxt = next(it, None)
                if nxt is not None:
                    futures[pool.submit(execute, nxt, save_requests)] = nxt
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ray_results(todo: list[Task], workers: int, save_requests: bool, address: str | None):
    try:
        import ray
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'marconi-sim[ray]'") from None
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        started = True
    remote = ray.remote(num_cpus=1)(execute)
    pending = {remote.remote(task, save_requests): task for task in todo}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    yield task, ray.get(ref), None
                except Exception as exc:  # noqa: BLE001
                    cause = getattr(exc, "cause", None)
                    yield task, None, cause if isinstance(cause, Exception) else exc
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def run_sweep(tasks: list[Task], out: str | os.PathLike, *, engine: str = "local", workers: int | None = None,
              ray_address: str | None = None, save_requests: bool = False, progress: bool = True,
              limit: int | None = None, on_result: Callable | None = None) -> SweepReport:
    """Run the tasks not yet done under ``out``; writes each row as it finishes.

    A UsageError in any configuration stops the sweep (bad settings); other failures are
    reported per configuration and the rest carries on. ``limit`` runs at most that many
    configurations (then stops, as an interrupted sweep would)."""
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [t for t in tasks if not is_done(out, t, save_requests)]
    report = SweepReport(total=len(tasks), skipped=len(tasks) - len(todo), ran=0)
    if limit is not None:
        todo = todo[:limit]
    workers = max(1, min(workers or os.cpu_count() or 1, max(1, len(todo))))
    t0 = time.perf_counter()
    if not todo:
        return report
    if engine == "local":
        results = _local_results(todo, workers, save_requests)
    elif engine == "ray":
        results = _ray_results(todo, workers, save_requests, ray_address)
    else:
        raise UsageError(f"--engine must be local or ray, not {engine!r}")
    bar = tqdm(total=len(tasks), initial=report.skipped, unit="cfg", desc="sweep", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    try:
        for task, result, exc in results:
            if exc is not None:
                if isinstance(exc, KeyboardInterrupt):  # Ctrl-C reached a worker first
                    raise KeyboardInterrupt
                if isinstance(exc, UsageError):
                    raise UsageError(f"{_describe(task)}: {exc}") from exc
                report.failed.append((task, f"{type(exc).__name__}: {exc}"))
            else:
                write_result(out, task, result)
                report.ran += 1
                if on_result is not None:
                    on_result(task, result)
            bar.update(1)
            bar.set_postfix_str(_describe(task), refresh=False)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        bar.close()
        results.close()
        report.wall_s = time.perf_counter() - t0
    return report


# ---------------------------------------------------------------------------------- reading

def row_files(out: str | os.PathLike) -> list[Path]:
    """Finished row files (temp files of running writers start with '.')."""
    return sorted(p for p in Path(out).glob("*.parquet") if not p.name.startswith("."))


def load_results(out: str | os.PathLike):
    """All rows of a results folder as one DataFrame (columns unioned across files)."""
    import pandas as pd

    files = row_files(out)
    if not files:
        raise UsageError(f"no results in {out} (expected <config_id>.parquet files from `marconi sweep`)")
    frames = [pd.read_parquet(f) for f in files]
    return pd.concat(frames, ignore_index=True, sort=False)


def load_details(out: str | os.PathLike, kind: str = "requests", config_ids: Iterable[str] | None = None):
    """Per-request (``kind="requests"``) or occupancy records of the given configurations."""
    import pandas as pd

    folder = Path(out) / (REQUESTS_DIR if kind == "requests" else OCCUPANCY_DIR)
    if config_ids is None:
        files = row_files(folder)
    else:
        files = [folder / f"{c}.parquet" for c in config_ids]
        files = [f for f in files if f.exists()]
    if not files:
        raise UsageError(f"no {kind} records in {folder}: rerun the sweep with --save-requests")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def is_nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)
