"""The two ways to run a Simulation's per-request steps over a trace.

- ``run_sequential``: requests in timestamp order, each looked up and inserted at once (the
  Marconi artifact's replay).
- ``run_des``: a simpy discrete-event run: servers, queueing, prefill then decode, pinned paths
  (``--scheduler fcfs``; an engine preset that ``rematches_waiting`` is looked up when a server
  takes it), or one engine stepping continuous batches (``--scheduler continuous``,
  ``sim.engine.batching``).

An attached tuner (``sim.tuning``) is called around each request's insert.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import simpy

from sim.cache.future import NextUse
from sim.engine.batching import run_continuous
from sim.engine.events import listeners
from sim.engine.metrics import SimResult
from sim.engine.simulation import Simulation
from traces.base import Request


def session_start_times(n: int, rate: float, kind: str, seed: int) -> np.ndarray:
    """Paper: session i starts at i / rate; or Poisson arrivals at that rate (seeded)."""
    if kind == "uniform":
        return np.arange(n) / rate
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def timestamps(sim: Simulation) -> np.ndarray:
    """Arrival time of every request: the trace's own (open loop), or session start + think times."""
    trace, config = sim.trace, sim.config
    reqs = trace.requests
    if not trace.closed_loop:
        return np.array([r.arrival for r in reqs], dtype=float)
    sessions = trace.sessions()
    starts = session_start_times(len(sessions), config.sessions_per_second, config.arrival, config.seed)
    ts = np.zeros(len(reqs))
    for start, turns in zip(starts, sessions.values()):
        t = start
        for r in turns:
            t += r.think_time
            ts[r.request_id] = t
    return ts


def next_use_index(sim: Simulation) -> NextUse:
    """The trace's future as ``sim`` will see it, for an offline bound (``belady``): every
    request's input symbols in nominal arrival order (``sim.cache.future``)."""
    order = np.argsort(timestamps(sim), kind="stable")
    seqs = [sim.symbols(sim.trace.requests[i]) for i in order]
    return NextUse([s[0] for s in seqs], max((len(s[1]) for s in seqs), default=0))


def run(sim: Simulation) -> SimResult:
    """Run ``sim`` in its configured mode and summarise it."""
    if getattr(sim.tree, "wants_future", False) and sim.tree.future is None:
        sim.tree.future = next_use_index(sim)
    if sim.config.mode == "sequential":
        run_sequential(sim)
    else:
        run_des(sim)
    res = sim.rec.result(sim.trace, sim.tree, sim.config.policy)
    if sim.tuner is not None:
        res.summary = dataclasses.replace(res.summary, tuning=sim.tuner.summary())
    return res


def _tune_before(sim: Simulation, r: Request, t: float) -> None:
    tuner = sim.tuner
    if tuner is not None:
        tuner.seen(r, t)
        tuner.before_insert(len(tuner.order))


def _tune_after(sim: Simulation, r: Request, t: float) -> None:
    tuner = sim.tuner
    if tuner is not None:  # r: the request whose last insert just finished
        tuner.after_insert(len(tuner.order), r, t)


def _tick(sim: Simulation) -> None:
    if sim.progress is not None:
        sim.progress.update(1)


def run_sequential(sim: Simulation) -> None:
    ts = timestamps(sim)
    order = np.argsort(ts, kind="stable")
    reqs = sim.trace.requests
    for i in order:
        r = reqs[i]
        t = float(ts[i])
        if sim.aborts(r):  # the engine refuses its prompt (SGLang's max_req_input_len)
            sim.abort(r, t)
            continue
        f = sim.sequential_lookup(r, t)
        _tune_before(sim, r, t)  # the artifact tunes inside insert(), before its match and eviction
        sim.sequential_insert(f, t)
        _tune_after(sim, r, t)
        _tick(sim)


def run_des(sim: Simulation) -> None:
    env = simpy.Environment()
    if sim.config.effective_scheduler == "continuous":
        if sim.trace.closed_loop:
            sessions = sim.trace.sessions()
            starts = session_start_times(
                len(sessions), sim.config.sessions_per_second, sim.config.arrival, sim.config.seed
            )
            run_continuous(sim, env, list(zip(starts, sessions.values())), None, _tune_before, _tune_after, _tick)
        else:
            ts = timestamps(sim)
            order = np.argsort(ts, kind="stable")
            run_continuous(
                sim, env, None, (ts[order], [sim.trace.requests[i] for i in order]), _tune_before, _tune_after, _tick
            )
        return
    servers = simpy.Resource(env, capacity=sim.config.servers)
    # an engine preset whose engine matches a request when it schedules it (``rematches_waiting``:
    # SGLang, vLLM) is looked up when a server takes it, not at its arrival, and holds no lock
    # while it queues; the paper's policies look up (and pin) at the arrival. TensorRT-LLM matches a
    # request when its first context chunk is scheduled (``matches_when_scheduled``)
    at_start = bool(
        getattr(sim.admission, "rematches_waiting", False) or getattr(sim.admission, "matches_when_scheduled", False)
    )
    # an engine whose running requests take their live state and their own pages from the cache's
    # pools (TensorRT-LLM's two pool groups, ``pages_one_by_one``) is charged them from its lookup
    # to its end, as sequential mode charges them (``hold_running``, ``finish_running``)
    charge_running = bool(getattr(sim.tree, "pages_one_by_one", False))
    # an engine that snapshots the prompt only while it computes it (``snapshots_in_context_only``:
    # TensorRT-LLM) cannot put back at the request's end a prompt state evicted since its prefill
    context_only = bool(getattr(sim.admission, "snapshots_in_context_only", False))
    on_arrive = listeners(sim.observers, "arrive") if at_start else ()
    # an engine that checkpoints every chunk inserts one state per insert (``publishes_chunks``:
    # SGLang's ``commit_insert_component_data``), so a request's end does not refresh its prompt's
    # states, inserted at its prefill's end (as ``ContinuousEngine._finish``)
    one_state = bool(getattr(sim.admission, "publishes_chunks", False))

    def serve(r: Request):
        arrival = env.now
        if sim.aborts(r):  # the engine refuses its prompt at arrival (SGLang's max_req_input_len)
            sim.abort(r, arrival)
            return
        f = None
        if at_start:
            for fn in on_arrive:  # the arrival time (the lookup's time is the server's start)
                fn(r, arrival)
        else:
            f = sim.lookup(r, arrival, lock=True)
        _tune_before(sim, r, arrival)  # des: the window counts arrivals
        with servers.request() as slot:
            yield slot
            start = env.now
            if f is None:
                f = sim.lookup(r, start, lock=True)
                if charge_running:
                    sim.hold_running(f, start)
                    sim.hold_own_pages(f, start, f.hit_tokens)  # a partially matched block's copy
            prefill = sim.prefill_s(f)
            yield env.timeout(prefill)
            sim.served(f, start, prefill, env.now, 0.0, None)
            if charge_running:  # the insert's need counts the prompt's pages from the hit's block on
                sim.hold_own_pages(f, env.now, 0)
            prompt_in = sim.insert_prefill(f, env.now)
            if charge_running:  # the prompt's pages past the tree's stay the request's to its end
                sim.tree.stamp_partial_tail(f.locked)  # a committed partial block: the tree's copy
                sim.hold_own_pages(f, env.now, f.tok_in)
        decode = sim.decode_s(f)
        decode_start = env.now
        yield env.timeout(decode)
        sim.decoded(f, decode_start, decode, env.now)
        if one_state and sim.end_state(f, prompt_in) is None:
            sim.end_without_insert(f, env.now)
        else:
            if context_only and prompt_in:
                sim.forget_lost_states(f)
            if charge_running:  # the end insert, then the blocks it held go (``held_after`` first)
                held, kept = f.locked, sim.tree.partial_tail(f.locked)
                sim.insert_decode(f, env.now)
                sim.tree.release_path(held, kept, tag=(f, env.now))  # before the decode's pages evict
                sim.finish_running(f, env.now)
            else:
                sim.insert_decode(f, env.now)
        _tune_after(sim, r, env.now)
        _tick(sim)

    if sim.trace.closed_loop:
        sessions = sim.trace.sessions()
        starts = session_start_times(len(sessions), sim.config.sessions_per_second, sim.config.arrival, sim.config.seed)

        def session(start: float, turns: list[Request]):
            yield env.timeout(start)
            for r in turns:
                if r.think_time > 0:
                    yield env.timeout(r.think_time)
                yield env.process(serve(r))

        for start, turns in zip(starts, sessions.values()):
            env.process(session(float(start), turns))
    else:
        ts = timestamps(sim)
        order = np.argsort(ts, kind="stable")
        reqs = sim.trace.requests

        def feeder():
            for i in order:
                wait = float(ts[i]) - env.now
                if wait > 0:
                    yield env.timeout(wait)
                env.process(serve(reqs[i]))

        env.process(feeder())
    env.run()
