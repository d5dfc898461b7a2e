"""The search of `marconi advise`: an Optuna study (TPE, seeded) stored in the output folder,
trials simulated in parallel on local processes or Ray, and the answer with its evidence.

- Storage: ``DIR/study.journal`` (Optuna's journal file). A rerun of the same command loads it:
  finished trials are kept and never run again; trials an interrupt left running are run again
  with the parameters they were given; then the search goes on up to ``--trials``. A folder that
  holds the study of another problem (trace, model, engine, memory, objective, holdout, seed) is
  refused.
- Determinism: trials are asked in batches of ``workers`` and told in trial order, each ask with
  a TPE sampler seeded by (seed, trial number), so the same seed (and worker count) gives the
  same study, interrupted or not.
- Trial 0 is the engine's defaults, so the recommendation is never worse than them on the
  tuned part.
- Evaluation: each trial is a sweep Task (``sim.experiments.grid``) run by the sweep's
  ``execute`` (``sim.experiments.runners``), so a `marconi run` line rebuilt from its
  SimConfig reproduces it exactly.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import shlex
import signal
import sys
import threading
import warnings
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.base import get_preset
from sim.config import SimConfig, flag_of, format_size
from sim.cost import get_model
from sim.errors import STOP_SIGNALS, Terminated, UsageError, interrupted, note_stop
from policies.base import PolicyError
from sim.experiments.advise.space import Space, build_space, pool_states
from sim.experiments.grid import Task, make_task
from sim.experiments.runners import execute, ray_init
from sim.trace_options import TRACE_OPTIONS

STUDY_FILE = "study.journal"
STUDY_NAME = "advise"

#: objective -> (summary key, direction)
OBJECTIVES = {
    "token-hit": ("token_hit_rate", "maximize"),
    "ttft-p95": ("ttft_p95_ms", "minimize"),
    "throughput": ("throughput", "maximize"),
}
#: what each scheduler of the simulator measures (SimConfig ``scheduler``; today's DES is fcfs)
MEASURED = {"fcfs": ("token-hit", "ttft-p95"), "continuous": ("token-hit", "ttft-p95", "throughput")}
#: summary keys a scheduler may report throughput under (the first present is used)
THROUGHPUT_KEYS = ("throughput_tokens_per_s", "output_tokens_per_s", "throughput")
#: summary keys kept with every trial
METRICS = (
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "flops_saved_frac",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_mean_ms",
    "requests",
    "evictions",
    "checkpoints_admitted",
    "checkpoints_hit",
    "checkpoints_evicted",
    "kv_tokens_evicted",
    "rejected_inserts",
    "peak_bytes",
    "final_kv_bytes",
    "final_state_bytes",
    "hit_tokens",
    "input_tokens",
    *THROUGHPUT_KEYS,
)


@dataclass
class Problem:
    """What is being advised; a study folder belongs to one Problem."""

    trace_kwargs: dict  # trace options as `marconi run` names them (the whole trace)
    engine: str
    model: str
    gpu_memory: str
    objective: str = "token-hit"
    holdout: float = 0.0
    seed: int = 0
    fixed: dict = field(default_factory=dict)  # SimConfig fields the user set (sessions_per_second, ...)
    #: what the trials are computed from (trace file content, the code's row version): a study of
    #: other inputs is set aside and started again (``open_study``); "" = not checked
    digest: str = ""

    def identity(self) -> dict:
        return json.loads(
            json.dumps(
                {
                    k: getattr(self, k)
                    for k in ("trace_kwargs", "engine", "model", "gpu_memory", "objective", "holdout", "seed", "fixed")
                },
                sort_keys=True,
                default=str,
            )
        )


def check_objective(objective: str, fixed: dict) -> None:
    """UsageError when the simulator's scheduler cannot measure ``objective``."""
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    scheduler = SimConfig(**{k: v for k, v in fixed.items() if k in SimConfig.field_names()}).effective_scheduler
    if objective not in MEASURED.get(scheduler, ("token-hit", "ttft-p95")):
        raise UsageError(
            f"--objective {objective}: the {scheduler} scheduler does not measure it "
            f"(it measures {', '.join(MEASURED.get(scheduler, ()))})"
        )


def objective_value(objective: str, metrics: dict) -> float:
    key, _ = OBJECTIVES[objective]
    if objective == "throughput":
        key = next((k for k in THROUGHPUT_KEYS if k in metrics), None)
        if key is None:
            raise UsageError("--objective throughput: the simulation reports no throughput")
    return float(metrics[key])


# ---------------------------------------------------------------------------------- trace split


def split_ranges(n_sessions: int, holdout: float) -> tuple[str, str]:
    """Session ranges (``--session-range``) of the tuned part and the held-out part."""
    if not 0 < holdout < 1:
        raise UsageError(f"--holdout must be in (0, 1), not {holdout}")
    k = int(round(n_sessions * (1 - holdout)))
    if k < 1 or k >= n_sessions:
        raise UsageError(f"--holdout {holdout:g} of {n_sessions} sessions leaves a part without sessions")
    return f"0:{k}", f"{k}:"


# ---------------------------------------------------------------------------------- tasks and run lines


def make_trial_task(trace_kwargs: dict, space: Space, point: dict, problem: Problem) -> Task:
    knobs = {"model": problem.model, **problem.fixed, **space.sim_fields(point)}
    return make_task(trace_kwargs, **knobs)


def run_line(task: Task) -> str:
    """The `marconi run` command that replays ``task`` (same trace, same SimConfig)."""
    words = ["marconi", "run"]
    defaults = {opt.key: opt.default for opt in TRACE_OPTIONS}
    for opt in TRACE_OPTIONS:
        v = task.trace_kwargs.get(opt.key, opt.default)
        if opt.is_flag:
            if v:
                words.append(opt.flag)
        elif v != defaults[opt.key] or opt.key == "trace":
            words += [opt.flag, _word(v)]
    cfg = task.config
    base = SimConfig()
    preset = get_preset(cfg.policy)
    for f in SimConfig.knobs():
        v = getattr(cfg, f.name)
        name = f.name
        if name in ("tuning_workers",):
            continue
        if name == "policy":
            words += ["--policy", v]
        elif name == "capacity_bytes":
            if not cfg.gpu_memory:  # --gpu-memory replaces it (`run` refuses the two when they differ)
                words += ["--capacity", str(int(v))]
        elif name == "alpha":
            if preset.uses_alpha:
                words += ["--alpha", _word(v)]
        elif name == "sessions_per_second":
            if v != base.sessions_per_second:
                words += ["--sessions-per-second", _word(v)]
        elif v != getattr(base, name):
            flag = flag_of(f)
            if "/" in flag:  # --x/--no-x
                on, off = flag.split("/")
                words.append(on if v else off)
            else:
                words += [flag, _word(v)]
    words += ["--format", "json", "--no-progress"]
    return " ".join(shlex.quote(w) if i > 1 else w for i, w in enumerate(words))


def _word(v) -> str:
    """A value as a command-line word that reads back exactly (floats by repr)."""
    return repr(v) if isinstance(v, float) else str(v)


# ---------------------------------------------------------------------------------- evaluation


class _Interrupts:
    """Ctrl-C held back while the study's journal is written: Optuna's journal file takes a lock
    by renaming a file, and an interrupt between its steps leaves the lock half taken (the next
    write fails). Inside ``critical()`` a SIGINT is recorded and raised as KeyboardInterrupt when
    the write is done; elsewhere it is raised at once (in the main thread; other threads cannot
    take signals and are left as they are)."""

    def __init__(self) -> None:
        self.pending = False
        self.depth = 0
        self.previous = None

    def __enter__(self) -> "_Interrupts":
        try:
            self.previous = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, *STOP_SIGNALS)}
        except ValueError:  # not the main thread
            self.previous = None
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            for s, h in self.previous.items():
                signal.signal(s, h)

    def _handler(self, signum, frame) -> None:
        """SIGTERM and SIGHUP as Ctrl-C (``sim.errors.Terminated``); the first signal wins."""
        if signum != signal.SIGINT:
            note_stop(signum)
        if self.depth:
            self.pending = self.pending or signum
        else:
            self._raise(signum)

    @staticmethod
    def _raise(signum) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    @contextmanager
    def critical(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:
                signum, self.pending = self.pending, False
                self._raise(signum)


def _start_fork_server_without_sigint() -> None:
    """Start the fork server now, with SIGINT blocked: every worker it forks (the pool spawns
    them on demand, between trials) inherits the blocked mask, so a Ctrl-C to the process group
    never reaches a worker before its initializer ignores it (seen: a KeyboardInterrupt traceback
    from a worker being forked as the Ctrl-C came). A Ctrl-C meanwhile is raised on unblocking."""
    from multiprocessing import forkserver, resource_tracker  # noqa: PLC0415 - local processes only

    resource_tracker.ensure_running()  # started first: starting it would unblock SIGINT
    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _ignore_sigint() -> None:
    """Worker processes leave Ctrl-C to the parent, which finishes the running trials' batch
    cleanly (no traceback from each worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Evaluator:
    """Runs Tasks in a persistent pool: local processes (forkserver, as the sweep) or Ray."""

    def __init__(self, engine: str = "local", workers: int = 1, ray_address: str | None = None) -> None:
        self.engine, self.workers, self.ray_address = engine, max(1, workers), ray_address
        self._pool = None
        self._ray = None
        self._ray_started = False

    def __enter__(self) -> "Evaluator":
        if self.engine == "ray":
            try:
                import ray  # noqa: PLC0415 - optional extra (marconi-sim[ray])
            except ImportError:
                raise UsageError("--engine ray needs Ray: pip install 'marconi-sim[ray]'") from None
            if not ray.is_initialized():
                ray_init(ray, self.ray_address, self.workers)
                self._ray_started = True
            self._ray = ray
            self._remote = ray.remote(num_cpus=1)(execute)
        elif self.engine != "local":
            raise UsageError(f"--engine must be local or ray, not {self.engine!r}")
        elif self.workers > 1:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["sim.experiments.runners", "sim.simulate", "traces.registry"])
            _start_fork_server_without_sigint()
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx, initializer=_ignore_sigint)
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._ray_started:
            self._ray.shutdown()

    def map(self, tasks: list[Task]) -> list:
        """One result (or exception) per task, in order."""
        if self._ray is not None:
            refs = [self._remote.remote(t) for t in tasks]
            out = []
            try:
                for ref in refs:
                    try:
                        out.append(self._ray.get(ref))
                    except Exception as exc:  # noqa: BLE001 - reported per trial
                        cause = getattr(exc, "cause", None)
                        out.append(cause if isinstance(cause, Exception) else exc)
            except KeyboardInterrupt:
                for ref in refs:
                    self._ray.cancel(ref, force=True)
                raise
            return out
        if self._pool is None:
            out = []
            for t in tasks:
                try:
                    out.append(execute(t))
                except Exception as exc:  # noqa: BLE001 - reported per trial
                    out.append(exc)
            return out
        futures = [self._pool.submit(execute, t) for t in tasks]
        try:
            return [f.exception() or f.result() for f in futures]
        except BaseException as exc:
            if not interrupted(exc):
                raise
            for f in futures:
                f.cancel()
            raise KeyboardInterrupt from None  # an interrupt inside a future's wait can surface as RuntimeError


def metrics_of(result: dict) -> dict:
    row = result["row"]
    return {k: float(row[k]) for k in METRICS if k in row and row[k] is not None}


# ---------------------------------------------------------------------------------- the study


@dataclass
class StudyReport:
    ran: int = 0
    resumed: int = 0  # trials an interrupt had left running, run again
    kept: int = 0  # finished trials found in the folder
    failed: list = field(default_factory=list)
    pruned: list = field(default_factory=list)  # (trial, why): combinations the preset refuses
    interrupted: bool = False


def _optuna():
    try:
        import optuna  # noqa: PLC0415 - optional extra (marconi-sim[advise])
    except ImportError:
        raise UsageError("marconi advise needs Optuna: pip install 'marconi-sim[advise]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_study(out: Path, problem: Problem, direction: str):
    """The study in ``out`` (created, or loaded when it is this problem's)."""
    optuna = _optuna()
    out.mkdir(parents=True, exist_ok=True)
    path = out / STUDY_FILE
    storage, names = _journal(path)
    ident = problem.identity()
    if STUDY_NAME in names:
        study = _load(optuna, storage, path)
        if study.user_attrs.get("problem") != ident:
            raise UsageError(
                f"--out {out} holds the study of another search (different trace, model, engine, "
                f"memory, objective, holdout or seed): choose another folder"
            )
        if not problem.digest or study.user_attrs.get("digest") == problem.digest:
            return study, False
        kept = _set_aside(path)
        print(
            f"note: the trace changed since the study in {out} ran (or the model's config.json, or it was run by an "
            "older simulator): "
            f"starting it again (the old study kept as {kept})",
            file=sys.stderr,
        )
        storage, names = _journal(path)
    with _Interrupts() as guard, guard.critical():
        study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction=direction)
        study.set_user_attr("problem", ident)
        if problem.digest:
            study.set_user_attr("digest", problem.digest)
    return study, True


def _journal(path: Path):
    """(storage, study names) of the journal at ``path``; one line when it is not a journal (a
    folder, a binary or foreign file) instead of Optuna's traceback."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage  # noqa: PLC0415

    if path.exists() and not path.is_file():
        raise UsageError(f"{path} is not a file (a study journal goes there): move it away or choose another --out")
    try:
        storage = JournalStorage(JournalFileBackend(str(path)))
        return storage, [s.study_name for s in storage.get_all_studies()]
    except Exception as exc:  # noqa: BLE001 - Optuna raises JSONDecodeError, UnicodeDecodeError, KeyError...
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise UsageError(
            f"{path} is not a study journal of `marconi advise` ({first}): move it away or choose another --out"
        ) from None


def _load(optuna, storage, path: Path):
    try:
        return optuna.load_study(study_name=STUDY_NAME, storage=storage)
    except Exception as exc:  # noqa: BLE001 - a journal whose records are not a study's
        raise UsageError(f"{path} is not a study journal of `marconi advise` ({exc}): move it away") from None


def _set_aside(path: Path) -> Path:
    """Renames a stale journal to a free ``study.journal.stale-N`` beside it (never replaced)."""
    n = 1
    while (kept := path.with_name(f"{path.name}.stale-{n}")).exists():
        n += 1
    os.rename(path, kept)
    return kept


def _sampler(seed: int, number: int, n_trials: int):
    optuna = _optuna()
    startup = min(10, max(3, n_trials // 5))
    with warnings.catch_warnings():  # multivariate / group are "experimental" in Optuna
        warnings.simplefilter("ignore")
        return optuna.samplers.TPESampler(
            seed=(seed * 1_000_003 + number) % 2**32,
            n_startup_trials=startup,
            multivariate=True,
            group=True,
            constant_liar=True,
        )


def run_study(
    study,
    space: Space,
    problem: Problem,
    trace_kwargs: dict,
    n_trials: int,
    evaluator: Evaluator,
    progress: bool = True,
) -> StudyReport:
    """Run the study up to ``n_trials`` finished trials (resuming what the folder holds)."""
    optuna = _optuna()
    from optuna.trial import TrialState  # noqa: PLC0415
    from tqdm import tqdm  # noqa: PLC0415

    report = StudyReport()
    spec, block = space.ctx.spec, space.ctx.block_tokens
    direction = OBJECTIVES[problem.objective][1]
    guard = _Interrupts()
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)]
    report.kept = len(finished)
    stale = [t for t in trials if t.state == TrialState.RUNNING]
    best = _best_value([t for t in finished if t.state == TrialState.COMPLETE], direction)
    bar = tqdm(
        total=n_trials,
        initial=min(len(finished), n_trials),
        unit="trial",
        desc=f"advise {space.engine.name}",
        disable=not progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    if best is not None:
        bar.set_postfix_str(f"best {problem.objective} {_fmt(problem.objective, best)}")
    try:
        guard.__enter__()
        with guard.critical():
            if not trials:
                study.enqueue_trial(space.defaults())
            # trials an interrupt left running: run them again with the parameters they were given
            pending = [(optuna.trial.Trial(study, t._trial_id), dict(t.params)) for t in stale]
        report.resumed = len(pending)
        done = len(finished)
        while True:
            if not pending:
                want = min(evaluator.workers, n_trials - done)
                if want <= 0:
                    break
                for _ in range(want):
                    with guard.critical():
                        study.sampler = _sampler(problem.seed, len(study.get_trials(deepcopy=False)), n_trials)
                        trial = study.ask()
                        params = space.sample(lambda name, dist, t=trial: suggest(t, name, dist))
                        pending.append((trial, params))
            tasks = [make_trial_task(trace_kwargs, space, params, problem) for _, params in pending]
            refused = [refusal(task, spec, block) for task in tasks]
            ran = iter(evaluator.map([t for t, why in zip(tasks, refused) if why is None]))
            results = [next(ran) if why is None else None for why in refused]
            for (trial, _params), task, res, why in zip(pending, tasks, results, refused):
                if why is not None:  # a combination the preset refuses: no simulation
                    with guard.critical():
                        study.tell(trial, state=TrialState.PRUNED)
                    report.pruned.append((trial.number, why))
                elif isinstance(res, PolicyError):  # refused by the engine only once it is built (a pool
                    with guard.critical():  # too small to run one request): pruned, as the refusals above
                        study.tell(trial, state=TrialState.PRUNED)
                    report.pruned.append((trial.number, str(res)))
                elif isinstance(res, BaseException):
                    if isinstance(res, KeyboardInterrupt):
                        raise KeyboardInterrupt
                    if isinstance(res, UsageError):
                        raise res
                    with guard.critical():
                        study.tell(trial, state=TrialState.FAIL)
                    report.failed.append((trial.number, f"{type(res).__name__}: {res}"))
                else:
                    m = metrics_of(res)
                    value = objective_value(problem.objective, m)
                    with guard.critical():
                        trial.set_user_attr("metrics", m)
                        trial.set_user_attr("config", _config_attrs(task))
                        study.tell(trial, value)
                    if best is None or (value > best if direction == "maximize" else value < best):
                        best = value
                report.ran += 1
                done += 1
                bar.update(1)
                if best is not None:
                    bar.set_postfix_str(f"best {problem.objective} {_fmt(problem.objective, best)}")
            pending = []
            if done >= n_trials:
                break
    except BaseException as exc:
        if not interrupted(exc):
            raise
        report.interrupted = True
    finally:
        guard.__exit__()
        bar.close()
    return report


def suggest(trial, name: str, dist):
    """``trial``'s value of ``name`` from an Optuna distribution (public suggest API)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution  # noqa: PLC0415

    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, log=dist.log)


def refusal(task: Task, spec, block_tokens: int = 1) -> str | None:
    """Why the task's preset refuses its combination of knobs (its ``check``, or a grid the
    simulator cannot lay over the trace's ``block_tokens``-token blocks), or None."""
    cfg = task.config
    preset = get_preset(cfg.policy)
    try:
        preset.check(spec, cfg)
        preset.check_blocks(spec, cfg, block_tokens)
    except PolicyError as exc:
        return str(exc)
    grid = preset.grid_for(spec, cfg)
    if grid > 1 and grid % max(block_tokens, 1):
        return f"a {grid}-token grid ({cfg.policy}) does not line up with the trace's {block_tokens}-token blocks"
    return None


def _config_attrs(task: Task) -> dict:
    return json.loads(json.dumps({"config": task.config.as_row(), "trace_kwargs": task.trace_kwargs}, default=str))


def _best_value(trials, direction: str):
    vals = [t.value for t in trials if t.value is not None]
    if not vals:
        return None
    return max(vals) if direction == "maximize" else min(vals)


def _fmt(objective: str, v: float) -> str:
    return f"{v * 100:.2f}%" if objective == "token-hit" else f"{v:.4g}"


# ---------------------------------------------------------------------------------- the answer


@dataclass
class TrialRow:
    number: int
    params: dict
    value: float
    metrics: dict


def completed(study) -> list[TrialRow]:
    from optuna.trial import TrialState  # noqa: PLC0415

    return [
        TrialRow(t.number, dict(t.params), float(t.value), dict(t.user_attrs.get("metrics", {})))
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    ]


def pick_best(rows: list[TrialRow], objective: str) -> TrialRow:
    """The recommendation: best objective; ties go to the better other metric (TTFT p95 for
    token hit, token hit for the others), then to the earlier trial (the defaults first)."""
    sign = 1 if OBJECTIVES[objective][1] == "maximize" else -1
    if objective == "token-hit":
        key = lambda r: (-r.value, r.metrics.get("ttft_p95_ms", math.inf), r.number)  # noqa: E731
    else:
        key = lambda r: (-sign * r.value, -r.metrics.get("token_hit_rate", 0.0), r.number)  # noqa: E731
    return min(rows, key=key)


#: the recommendation must beat the defaults' objective by this fraction, else the defaults stay
MIN_GAIN = 0.01


def beats(value: float, default: float, objective: str) -> bool:
    """``value`` improves on ``default`` by more than MIN_GAIN (relative)."""
    if OBJECTIVES[objective][1] == "minimize":
        return value < default * (1 - MIN_GAIN)
    return value > default * (1 + MIN_GAIN) if default > 0 else value > 0


def pareto_front(rows: list[TrialRow]) -> list[TrialRow]:
    """Trials no other trial beats on both token hit (higher) and TTFT p95 (lower), by token hit."""
    pts = sorted(rows, key=lambda r: (-r.metrics["token_hit_rate"], r.metrics["ttft_p95_ms"], r.number))
    front, best_ttft = [], math.inf
    for r in pts:
        if r.metrics["ttft_p95_ms"] < best_ttft:
            front.append(r)
            best_ttft = r.metrics["ttft_p95_ms"]
    return front


@dataclass
class Side:
    """One configuration (the defaults or the recommendation) with its metrics."""

    params: dict
    flags: list  # (engine flag, value)
    sim_fields: dict
    tuned: dict  # metrics on the tuned part (the whole trace without --holdout)
    run_tuned: str
    held_out: dict | None = None
    run_held_out: str | None = None
    state_pool: int | None = None


@dataclass
class Advice:
    problem: Problem
    space: Space
    gpu_bytes: int
    weight_bytes: int
    trials: int
    recommended: Side
    defaults: Side
    front: list  # TrialRow
    history: list  # TrialRow, by trial number
    parts: tuple | None  # (tuned range, held-out range) with --holdout
    figure: str | None = None
    report: StudyReport | None = None

    def command(self) -> str:
        """The engine started with the recommendation, as its own command line (on the group of
        GPUs the cache was sized for: its tensor-parallel flag where more than one; the checkpoint
        a config.json's folder, else ``MODEL``)."""
        return self.space.command(self.recommended.params, gpus=group_gpus(self.problem), model=self.problem.model)


def group_gpus(problem: Problem) -> int:
    """The GPUs the advice's memory is of: --tensor-parallel, the count of ``--gpu-memory NxSIZE``,
    or the group --gpu prices the model on (1 where none is named)."""
    from sim.cost import gpu_memory_limit  # noqa: PLC0415
    from sim.experiments.advise.space import gpu_memory_count  # noqa: PLC0415

    tp = int(problem.fixed.get("tensor_parallel") or 0)
    count = tp or gpu_memory_count(problem.gpu_memory)
    if count:
        return int(count)
    gpu = problem.fixed.get("gpu")
    if not gpu or problem.fixed.get("timing_file"):
        return 1
    try:
        return gpu_memory_limit(problem.model, gpu, 0)[0]
    except UsageError:  # a config.json without a parameter count: no group known
        return 1


def side(
    space: Space,
    problem: Problem,
    row: TrialRow,
    tune_kwargs: dict,
    hold_kwargs: dict | None,
    evaluator: Evaluator | None,
) -> Side:
    task = make_trial_task(tune_kwargs, space, row.params, problem)
    fields_ = space.sim_fields(row.params)
    s = Side(
        row.params,
        space.flags(row.params),
        fields_,
        row.metrics,
        run_line(task),
        state_pool=pool_states(task.config, space.ctx.spec),
    )
    if hold_kwargs is not None:
        htask = make_trial_task(hold_kwargs, space, row.params, problem)
        (res,) = evaluator.map([htask])
        if isinstance(res, BaseException):
            raise res
        s.held_out = metrics_of(res)
        s.run_held_out = run_line(htask)
    return s


def advise(
    problem: Problem,
    out: Path,
    n_trials: int = 50,
    *,
    workers: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
    progress: bool = True,
    trace=None,
    on_trace=None,
) -> Advice:
    """Search, then compare the recommendation with the engine's defaults (and on the held-out
    part with ``problem.holdout``); the study is kept in ``out`` (the CLI also writes advice.json
    and the Pareto figure there). ``on_trace``: called with the loaded trace before any trial
    runs (the CLI says a ``--session-range`` past the trace's end)."""
    from traces.registry import load_trace  # noqa: PLC0415
    from sim.trace_options import options_from_kwargs  # noqa: PLC0415

    check_objective(problem.objective, problem.fixed)
    if n_trials < 1:
        raise UsageError("--trials must be >= 1")
    spec = get_model(problem.model)
    from sim.experiments.advise.space import parse_gpu_memory, weight_bytes  # noqa: PLC0415

    gpu = parse_gpu_memory(problem.gpu_memory)
    build_space(problem.engine, spec, gpu, problem.fixed)  # bad memory or nothing to tune: before the trace loads
    if trace is None:
        tspec, opts = options_from_kwargs(dict(problem.trace_kwargs), pop=True)
        opts.progress = progress
        trace = load_trace(tspec, opts)
    if on_trace is not None:
        on_trace(trace)
    space = build_space(problem.engine, spec, gpu, problem.fixed, trace.block_tokens)
    _check_one_request(trace, space)
    why = refusal(
        make_trial_task(dict(problem.trace_kwargs), space, space.defaults(), problem), spec, trace.block_tokens
    )
    if why is not None:
        # on hash blocks the way out is the trace spelled out as tokens, as `marconi run` says
        spell = "; --hash-block-tokens runs it on the trace spelled out as tokens" if trace.block_tokens > 1 else ""
        raise UsageError(f"--for {problem.engine}: the engine's defaults cannot run here: {why}{spell}")
    parts = None
    tune_kwargs, hold_kwargs = dict(problem.trace_kwargs), None
    if problem.holdout:
        if problem.trace_kwargs.get("session_range"):
            raise UsageError("--holdout splits the whole trace: leave --session-range out")
        parts = split_ranges(trace.n_sessions, problem.holdout)
        tune_kwargs = {**problem.trace_kwargs, "session_range": parts[0]}
        hold_kwargs = {**problem.trace_kwargs, "session_range": parts[1]}
    direction = OBJECTIVES[problem.objective][1]
    with Evaluator(engine, workers, ray_address) as ev:  # a Ray cluster not there: refused before the study is written
        study, _ = open_study(out, problem, direction)
        rep = run_study(study, space, problem, tune_kwargs, n_trials, ev, progress)
        rows = completed(study)
        if rep.interrupted and not rows:  # stopped before a trial finished: the CLI says so (exit 130 / 143)
            return Advice(problem, space, gpu, weight_bytes(spec), 0, None, None, [], rows, parts, report=rep)
        if not rows:
            why = (
                f": trial {rep.failed[0][0]} failed: {rep.failed[0][1]}"
                if rep.failed
                else f": trial {rep.pruned[0][0]} pruned: {rep.pruned[0][1]}"
                if rep.pruned
                else " (rerun the same command to resume)"
            )
            raise UsageError(f"no trial finished in {out}{why}")
        if rep.interrupted:
            return Advice(problem, space, gpu, weight_bytes(spec), len(rows), None, None, [], rows, parts, report=rep)
        best = pick_best(rows, problem.objective)
        default_row = next((r for r in rows if r.params == space.defaults()), rows[0])
        if not beats(best.value, default_row.value, problem.objective):
            best = default_row  # a gain within noise is no reason to change the engine's settings
        rec = side(space, problem, best, tune_kwargs, hold_kwargs, ev)
        dflt = side(space, problem, default_row, tune_kwargs, hold_kwargs, ev)
    return Advice(
        problem,
        space,
        gpu,
        weight_bytes(spec),
        len(rows),
        rec,
        dflt,
        pareto_front(rows),
        sorted(rows, key=lambda r: r.number),
        parts,
        report=rep,
    )


def _check_one_request(trace, space: Space) -> None:
    """UsageError when the cache cannot hold the largest request with one state."""
    spec, cap = space.ctx.spec, space.ctx.capacity_bytes
    B = trace.block_tokens
    longest = max(r.n_input_tokens(B) + r.n_output_tokens(B) for r in trace.requests)
    need = spec.kv_bytes_per_token() * longest + (spec.state_bytes() if spec.is_hybrid else 0)
    if need > cap:
        raise UsageError(
            f"the cache {space.engine.name} gets ({format_size(cap)} of {space.engine.memory.flag} "
            f"{space.engine.memory.fraction:g} after the weights) cannot hold one request of the trace "
            f"({longest:,} tokens need {format_size(need)})"
        )


def advice_json(adv: Advice) -> dict:
    """The advice as plain data (`--format json`, DIR/advice.json)."""

    def sd(s: Side) -> dict:
        return {
            "flags": dict(s.flags),
            "params": s.params,
            "state_pool_states": s.state_pool,
            "policy": s.sim_fields["policy"],
            "tuned": s.tuned,
            "held_out": s.held_out,
            "marconi_run": s.run_tuned,
            "marconi_run_held_out": s.run_held_out,
        }

    p = adv.problem
    return _finite(
        {
            "engine": p.engine,
            "model": p.model,
            "objective": p.objective,
            "trials": adv.trials,
            "gpu_memory_bytes": adv.gpu_bytes,
            "weight_bytes": adv.weight_bytes,
            "cache_bytes": adv.space.ctx.capacity_bytes,
            "memory_rule": {
                "flag": adv.space.engine.memory.flag,
                "fraction": adv.space.engine.memory.fraction,
                "of": adv.space.engine.memory.of,
            },
            "parts": list(adv.parts) if adv.parts else None,
            "command": adv.command(),
            "recommended": sd(adv.recommended),
            "defaults": sd(adv.defaults),
            "difference": differences(adv),
            "pareto_front": [
                {
                    "trial": r.number,
                    "params": r.params,
                    "token_hit_rate": r.metrics["token_hit_rate"],
                    "ttft_p95_ms": r.metrics["ttft_p95_ms"],
                }
                for r in adv.front
            ],
            "pruned": len(adv.report.pruned) if adv.report else 0,
            "figure": adv.figure,
        }
    )


def differences(adv: Advice) -> dict:
    """Recommendation minus defaults (token hit in points, TTFT p95 relative), per part."""
    out = {}
    for part in ("tuned", "held_out"):
        r, d = getattr(adv.recommended, part), getattr(adv.defaults, part)
        if r is None or d is None:
            continue
        out[part] = {
            "token_hit_rate": r["token_hit_rate"] - d["token_hit_rate"],
            "token_hit_rel": _rel(r["token_hit_rate"], d["token_hit_rate"]),
            "ttft_p95_ms": r["ttft_p95_ms"] - d["ttft_p95_ms"],
            "ttft_p95_rel": _rel(r["ttft_p95_ms"], d["ttft_p95_ms"]),
        }
    return out


def _rel(a: float, b: float) -> float:
    return (a - b) / b if b else (0.0 if a == b else math.inf)


def _finite(v: Any):
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def cpu_count() -> int:
    return os.cpu_count() or 1
