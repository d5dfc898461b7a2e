"""Running sweep Tasks: on local processes or Ray, each result written as it finishes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, Callable

from sim.errors import STOP_SIGNALS, USER_ERRORS, Terminated, UsageError, interrupted, note_stop
from sim.experiments.grid import Task
from sim.experiments.store import is_done, write_result
from sim.simulate import simulate
from sim.trace_options import options_from_kwargs
from traces.base import RUN_MEMORY_FACTOR, available_memory
from traces.registry import load_trace, spec_stamp

TRACE_CACHE_SIZE = 4  # traces kept per worker process
WORKER_GRACE_S = 5.0  # an interrupted sweep's workers: seconds between SIGTERM and SIGKILL


_TRACES: "OrderedDict[str, Any]" = OrderedDict()


def _load_trace(trace_kwargs: dict):
    # keyed by the files' size and mtime too: a trace file changed on disk is loaded again
    stamp = spec_stamp(trace_kwargs.get("trace"))
    key = json.dumps([trace_kwargs, stamp], sort_keys=True, default=str)
    trace = _TRACES.get(key)
    if trace is not None:
        _TRACES.move_to_end(key)
        return trace, 0.0
    t0 = time.perf_counter()
    spec, opts = options_from_kwargs(dict(trace_kwargs), pop=True)
    opts.progress = False
    trace = load_trace(spec, opts)
    _TRACES[key] = trace
    while len(_TRACES) > TRACE_CACHE_SIZE:
        _TRACES.popitem(last=False)
    return trace, time.perf_counter() - t0


def task_trace(trace_kwargs: dict):
    """The trace of a task's trace options, from this process's cache (a sweep's parent reads its
    session count before the workers run; with one worker the run reuses it)."""
    return _load_trace(trace_kwargs)[0]


def loaded_trace_keys() -> list[str]:
    """Traces held by this process's cache (tests check that each is loaded once)."""
    return list(_TRACES)


def execute(task: Task, save_requests: bool = False) -> dict:
    """Run one configuration; returns {"row": dict, "requests": DataFrame|None, "occupancy": ...}.
    Runs in worker processes (local pool or Ray); writes nothing."""
    trace, load_s = _load_trace(task.trace_kwargs)
    t0 = time.perf_counter()
    res = simulate(trace, task.config)
    wall = time.perf_counter() - t0
    summary = res.summary.to_dict()
    summary.pop("policy", None)
    for k, v in summary.items():  # nested values (e.g. the oracle's per-alpha hit rates) as JSON text
        if isinstance(v, (dict, list, tuple)):
            summary[k] = json.dumps(v, sort_keys=True, default=str)
    row = {
        **task.knobs,
        "trace_name": trace.name,
        **summary,
        "wall_s": wall,
        "trace_load_s": load_s,
        "worker_pid": os.getpid(),
    }
    out = {"row": row, "requests": None, "occupancy": None}
    if save_requests:
        out["requests"] = res.requests
        out["occupancy"] = res.occupancy
    return out


@dataclass
class SweepReport:
    total: int
    skipped: int
    ran: int
    failed: list = field(default_factory=list)  # (Task, error text)
    wall_s: float = 0.0
    interrupted: bool = False


def describe(task: Task) -> str:
    k = task.knobs
    if task.alpha_mode == "static":
        alpha = f" alpha={task.config.alpha:g}"
    else:
        alpha = " alpha=auto" if task.alpha_mode == "auto" else ""
    return (
        f"{k['trace']} {task.config.policy}{alpha} cap={task.config.capacity_bytes / 1e9:g}GB "
        f"sps={task.config.sessions_per_second:g} [{task.config_id}]"
    )


def _ignore_sigint() -> None:
    """Worker initializer: Ctrl-C (SIGINT to the terminal's process group) is the parent's to
    handle; a worker that died of it mid-queue-read would leave the pool's lock held (a hang) and
    print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_workers(procs: list, grace_s: float = WORKER_GRACE_S) -> None:
    """Terminates (then kills) the pool's worker processes and reaps them: an interrupted sweep
    leaves no process behind and does not wait for running configurations (rerun resumes)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _local_results(todo: list[Task], workers: int, save_requests: bool):
    if workers <= 1:
        for task in todo:
            try:
                yield task, execute(task, save_requests), None
            except Exception as exc:  # noqa: BLE001 - reported per configuration
                yield task, None, exc
        return
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["sim.experiments.runners", "sim.simulate", "traces.registry"])
    # While the pool starts, SIGINT is blocked in this thread, so the fork server (when started
    # now) and the workers forked from it inherit the mask and no Ctrl-C reaches a worker before its
    # initializer ignores it; a Ctrl-C delivered meanwhile (to another thread) is only noted, and
    # raised once the cleanup below is armed.
    main = threading.current_thread() is threading.main_thread()  # signals are the main thread's
    resource_tracker.ensure_running()  # started first: starting it unblocks SIGINT again
    pending: list[int] = []
    if main:  # SIGTERM / SIGHUP meanwhile are noted as well (not blocked: workers must die of them)
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
        previous_stop = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in STOP_SIGNALS}
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_ignore_sigint)
    finished = False
    try:
        futures = {}
        # keep a bounded queue so a Ctrl-C has few configurations in flight
        it = iter(todo)
        for task in it:
            futures[pool.submit(execute, task, save_requests)] = task
            if len(futures) >= 2 * workers:
                break
        if main:  # a Ctrl-C pending since the pool started is raised here, inside the cleanup's try
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            signal.signal(signal.SIGINT, previous)
            for sig, handler in previous_stop.items():
                signal.signal(sig, handler)
            if pending:
                if pending[0] == signal.SIGINT:
                    raise KeyboardInterrupt
                note_stop(pending[0])
                raise Terminated(pending[0])
        while futures:
            done, _ = wait(futures, return_when=FIRST_COMPLETED)
            for fut in done:
                task = futures.pop(fut)
                exc = fut.exception()
                yield task, (None if exc else fut.result()), exc
                nxt = next(it, None)
                if nxt is not None:
                    futures[pool.submit(execute, nxt, save_requests)] = nxt
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:  # Ctrl-C, a stopping error or --limit reached: stop now, a second Ctrl-C cannot cut this short
            if main:  # nor a SIGTERM / SIGHUP
                held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, *STOP_SIGNALS)}
            try:
                procs = list((getattr(pool, "_processes", None) or {}).values())
                pool.shutdown(wait=False, cancel_futures=True)
                _stop_workers(procs)
            finally:
                if main:
                    for sig, handler in held.items():  # as they were (a first SIGTERM left them ignored)
                        signal.signal(sig, previous if sig == signal.SIGINT else handler)
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def ray_init(ray, address: str | None, workers: int) -> None:
    """Starts a local Ray of ``workers`` CPUs, or joins the cluster at ``address``; a cluster that
    is not there (``--ray-address auto`` with none running) is one line, not Ray's traceback."""
    if not address:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        return
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, TimeoutError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"--ray-address {address}: no Ray cluster reached ({first}); start one (ray start --head) or "
            "leave --ray-address out for a local Ray"
        ) from None


def _ray_results(todo: list[Task], workers: int, save_requests: bool, address: str | None):
    try:
        import ray  # noqa: PLC0415 - optional extra (marconi-sim[ray]), loaded only for --engine ray
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'marconi-sim[ray]'") from None
    started = False
    mine: dict = {}
    if not ray.is_initialized():
        # ray.init installs its own SIGTERM handler in the driver (a stack dump and exit code 15):
        # ours come back after it, so SIGTERM / SIGHUP stop a Ray sweep as they stop a local one
        # (finished rows kept, one line, exit 143 / 129; ray.shutdown below ends Ray's processes)
        mine = {s: signal.getsignal(s) for s in (signal.SIGINT, *STOP_SIGNALS)} if _main_thread() else {}
        try:
            ray_init(ray, address, workers)
        finally:
            for sig, handler in mine.items():
                if handler is not None:
                    signal.signal(sig, handler)
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
        # a cluster this sweep started goes down whole with ray.shutdown; force-cancelling its
        # tasks first raced their replies and crashed the driver now and then (Ray's core worker,
        # a stack dump and exit 1 instead of the stop's one line and 143). On a cluster it joined
        # (--ray-address) the tasks are cancelled, so that they stop there too
        for ref in pending if address or not started else ():
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
            # ray.shutdown leaves SIGTERM at its default action below Python (its C++ logger
            # uninstalls its handlers: signal.getsignal still names ours), so a SIGTERM while the
            # sweep writes its last rows killed it outright (exit -15, no line): ours go back
            for sig, handler in mine.items():
                if handler is not None and signal.getsignal(sig) is handler:
                    signal.signal(sig, handler)


def _trace_bytes(trace) -> int:
    return sum(r.input_tokens.nbytes + r.output_tokens.nbytes for r in trace.requests)


def fit_workers(todo: list[Task], workers: int, explicit: bool, memory: int | None = None) -> tuple[int, str]:
    """The worker count whose traces and runs fit in the memory available together, checked once
    before the workers start (each worker ran the trace reader's memory check alone, against the
    whole machine's memory: N workers of one large trace could fill it): each worker holds the
    traces its cache keeps (``TRACE_CACHE_SIZE``, the largest counted) and a run of the largest
    (``RUN_MEMORY_FACTOR`` times its buffer, as the reader counts it). ``explicit`` (``--workers``
    given): more than fit is refused in one line naming the most that do; the default (a worker a
    CPU) is lowered to them, and the returned note says so. ``memory``: the bytes available (now's)."""
    if workers <= 1:
        return workers, ""
    sizes, names = [], {}
    seen: set[str] = set()
    for task in todo:
        key = json.dumps(task.trace_kwargs, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            trace = task_trace(task.trace_kwargs)
        except ValueError:  # TraceError / UsageError: the configuration's run reports it
            continue
        sizes.append(_trace_bytes(trace))
        names[sizes[-1]] = trace.name
    if not sizes:
        return workers, ""
    sizes.sort(reverse=True)
    per_worker = sum(sizes[:TRACE_CACHE_SIZE]) + (RUN_MEMORY_FACTOR - 1) * sizes[0]
    memory = available_memory() if memory is None else memory
    if workers * per_worker <= memory:
        return workers, ""
    fits = max(0, memory // per_worker) if per_worker else workers
    each = (
        f"each worker holds {_gb(per_worker)} (trace {names[sizes[0]]}: {_gb(sizes[0])} of symbols, and a run of "
        f"it as much again{', beside the other traces it keeps' if len(sizes) > 1 else ''})"
    )
    if explicit or fits < 1:
        most = f"give --workers {fits} or fewer" if fits >= 1 else "not even one fits: free memory, or a smaller trace"
        raise UsageError(
            f"{workers} sweep workers: {each}, {_gb(workers * per_worker)} in all, more than the {_gb(memory)} of "
            f"memory available: {most}"
        )
    return int(fits), (
        f"note: {fits} sweep worker{'s' if fits > 1 else ''}, not {workers} (one a CPU): {each}, and "
        f"{_gb(memory)} is available"
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e7 else f"{n / 1e6:,.3f} MB"


def run_sweep(
    tasks: list[Task],
    out: str | os.PathLike,
    *,
    engine: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    save_requests: bool = False,
    progress: bool = True,
    limit: int | None = None,
    on_result: Callable | None = None,
    digest: Callable[[Task], str] | None = None,
    check_memory: bool = True,
) -> SweepReport:
    """Run the tasks not yet done under ``out``; writes each row as it finishes.

    A UsageError in any configuration stops the sweep (bad settings); other failures are
    reported per configuration and the rest carries on. ``limit`` runs at most that many
    configurations (then stops, as an interrupted sweep would). ``digest(task)``: what the task's
    result is computed from (``sim.experiments.store``): a stored row of other inputs is rerun.
    ``check_memory``: the workers' traces and runs are checked against the memory available
    together (``fit_workers``; `marconi sweep` checks before it prints anything, and passes False)."""
    from tqdm import tqdm  # noqa: PLC0415 - progress bar, loaded only when a sweep runs

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digest = digest or (lambda task: None)
    todo = [t for t in tasks if not is_done(out, t, save_requests, digest(t))]
    report = SweepReport(total=len(tasks), skipped=len(tasks) - len(todo), ran=0)
    if limit is not None:
        todo = todo[:limit]
    explicit = workers is not None
    workers = max(1, min(workers or os.cpu_count() or 1, max(1, len(todo))))
    t0 = time.perf_counter()
    if not todo:
        return report
    if check_memory and (engine == "local" or (engine == "ray" and not ray_address)):  # one machine
        workers, note = fit_workers(todo, workers, explicit)
        if note:
            print(note, file=sys.stderr)
    if engine == "local":
        results = _local_results(todo, workers, save_requests)
    elif engine == "ray":
        results = _ray_results(todo, workers, save_requests, ray_address)
    else:
        raise UsageError(f"--engine must be local or ray, not {engine!r}")
    bar = tqdm(
        total=len(tasks),
        initial=report.skipped,
        unit="cfg",
        desc="sweep",
        disable=not progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    try:
        for task, result, exc in results:
            if exc is not None:
                if isinstance(exc, KeyboardInterrupt):  # Ctrl-C reached a worker first
                    raise KeyboardInterrupt
                if isinstance(exc, USER_ERRORS):
                    raise UsageError(f"{describe(task)}: {exc}") from exc
                report.failed.append((task, f"{type(exc).__name__}: {exc}"))
            else:
                write_result(out, task, result, digest(task))
                report.ran += 1
                if on_result is not None:
                    on_result(task, result)
            bar.update(1)
            bar.set_postfix_str(describe(task), refresh=False)
    except BaseException as exc:
        if not interrupted(exc):
            raise
        report.interrupted = True
    finally:
        bar.close()
        results.close()
        report.wall_s = time.perf_counter() - t0
    return report
