"""Arrival synthesis: session start times, Poisson response times, sequential-mode timestamps.

Every random draw takes an explicit seed. The Marconi paper starts session i at ``i / rate``
(deterministic); ``poisson=True`` draws exponential gaps instead (first session at 0).
"""

from __future__ import annotations

import math

import numpy as np

from traces.base import Trace, TraceError

PAPER_RESPONSE_SEED = 42


def session_starts(n: int, rate: float, poisson: bool = False, seed: int = 0) -> np.ndarray:
    """Start times (s) of ``n`` sessions at ``rate`` sessions per second."""
    if n < 0:
        raise TraceError("number of sessions must be >= 0")
    if not 0 < rate < math.inf:
        raise TraceError(f"session rate must be a finite number > 0 (got {rate})")
    if seed < 0:
        raise TraceError(f"seed must be >= 0 (got {seed})")
    if not poisson:
        return np.arange(n, dtype=np.float64) / rate
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=n)
    starts = np.empty(n, dtype=np.float64)
    if n:
        starts[0] = 0.0
        np.cumsum(gaps[:-1], out=starts[1:])
    return starts


def poisson_response_times(n: int, mean: float, seed: int = PAPER_RESPONSE_SEED) -> np.ndarray:
    """``n`` integer-valued Poisson(mean) draws in seconds, as the paper's
    ``np.random.seed(42); np.random.poisson(lam=avg_response_time)`` (legacy generator)."""
    if not 0 <= mean < math.inf:
        raise TraceError(f"mean response time must be a finite number >= 0 (got {mean})")
    rng = np.random.RandomState(seed)
    return rng.poisson(lam=mean, size=n).astype(np.float64)


def session_order(trace: Trace) -> list[int]:
    """Session ids in order of first appearance (the order sessions are started in)."""
    seen: dict[int, None] = {}
    for r in trace.requests:
        seen.setdefault(r.session_id, None)
    return list(seen)


def sequential_timestamps(trace: Trace, rate: float = 1.0, poisson: bool = False, seed: int = 0) -> np.ndarray:
    """Timestamps (s) for sequential (paper-artifact) replay, indexed by ``request_id``.

    Closed loop: session i (in order of first appearance) starts at ``session_starts(...)[i]``; a
    turn's timestamp is the start plus the cumulative think times of the session's turns up to and
    including it (generation time is not added, as in the artifact). Open loop: the arrivals.
    Replay order is ``np.argsort(ts, kind='stable')``.
    """
    n = len(trace.requests)
    ts = np.empty(n, dtype=np.float64)
    if not trace.closed_loop:
        for r in trace.requests:
            ts[r.request_id] = r.arrival
        return ts
    order = session_order(trace)
    starts = session_starts(len(order), rate, poisson, seed)
    start_of = dict(zip(order, starts.tolist()))
    for sid, reqs in trace.sessions().items():
        t = start_of[sid]
        for r in reqs:
            t += r.think_time
            ts[r.request_id] = t
    return ts
