"""The replay tuner (the artifact's), and how the tuners compare (``--alpha auto``; ``marconi-oracle``).

Two tuners (``--tuner``):

- ``duel`` (the default outside paper compat; ``DuelTuner`` below): set dueling with shadow caches, one
  per candidate (``--duel-candidates``, SGLang+'s LRU and alphas 0..2), run on the live request stream;
  every ``--duel-every`` requests the live cache adopts the candidate with the most hit tokens over the
  trailing ``--duel-window`` requests, if it beats the incumbent by ``--duel-margin``. It is the robust
  one: on the paper's ShareGPT grid (benchmarks/tuning_report.py, 36 configurations) it never falls below
  SGLang+ in sequential or des mode (closest +1.6 pp) and its mean is within 0.6 pp of the best static
  alpha in hindsight (sequential 59.8% vs 60.2%, SGLang+ 53.4%), for about (1 + candidates) x the
  simulator time of a static run (0.84 s vs 0.09 s per ShareGPT run). Where it can still lose: the
  shadows score their own caches, and the live cache only converges to the adopted candidate's content
  after a switch, so phases shorter than ``--duel-window`` + ``--duel-every`` requests can make it lag;
  in ``des`` mode shadows insert once per request at its end (no prefill-end insert), so their scores
  approximate the live policy's.
- ``replay`` (the artifact's; the default in ``--compat paper|paper-fixed``; ``AlphaTuner``), described
  next. Its single bootstrap window often does not predict the rest of the trace: tuned once, it falls
  below SGLang+ on 9/36 ShareGPT configurations (down to -14 pp at 3 GB, 1 session/s, where it picks
  alpha 1.7 and the best static alpha is 0.1); the LRU candidate does not help, since the tuned alpha does
  beat LRU on the window.

Replay tuner (docs/presets.md §4). The run starts with alpha 0. When the first eviction happens after ``n`` requests,
a bootstrap window of ``k * n`` requests is set (``--bootstrap-multiplier``, 5 by default, 15 for LMSys in
the paper). When the ``k*n``-th request arrives (before its insert, as the artifact does), the window is
replayed once per candidate, in worker processes (``--tuning-workers``; serial when 1), and the best
candidate is adopted for the rest of the run:

- ``--tuning-start empty`` (paper-compatible): replay every request from the trace start up to the
  trigger on an empty cache; ``snapshot``: replay the requests after the first eviction, starting from a
  copy of the cache taken then.
- candidates: every alpha of the grid (``--alpha-grid``, 0 to 2 step 0.1 by default) and, unless
  ``--no-tuning-lru``, SGLang+'s eviction (LRU over leaves, whole-path refresh). The LRU candidate is the
  intended robustness guard: it is adopted only when it strictly beats every alpha on the replayed
  window; it never wins on the ShareGPT grid (see above). Paper compat (``--compat paper``/``paper-fixed``)
  leaves it out unless asked (the artifact has none).
- objective (``--tuning-objective``, default ``flops`` for this tuner): ``flops`` = FLOPs saved over the
  last 500 replayed requests (the artifact), or ``hit-rate`` = token hit rate over those requests (what the
  paper states). Ties go to the smallest alpha, so results never depend on which worker finishes first.
- ``--retune-every N``: tune again every N requests after the first round, replaying the requests since
  the previous round from a snapshot of the cache taken then.

Replays always run the artifact's sequential semantics (lookup, then one insert of input + output) in
arrival order, under the run's compat mode; a ``des`` run is tuned on the same sequential replay.

Oracle: ``marconi-oracle`` replays the whole trace once per alpha of the grid (plain Marconi, static
alpha) and reports the run with the best token hit rate; its ``tuned_alpha`` is that alpha. It is an
upper bound for the tuner, not a policy a server could run.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

from sim.tuning_options import LRU, parse_grid, tuner_params
from sim.engine.drivers import run_sequential
from sim.engine.metrics import ReplayTuning
from sim.engine.simulation import Simulation
from sim.tuning.candidates import set_candidate
from traces.base import Trace

TUNING_INTERVAL = 500  # the artifact scores the last 500 replayed requests

#: builds a Simulation for (trace, config, **kw) with the run's compat variant (sim.simulate.build)
Builder = Callable[..., Simulation]

_PAYLOAD: dict | None = None


def _init_worker(payload: dict) -> None:
    global _PAYLOAD
    _PAYLOAD = payload


def replay(payload: dict, cand) -> tuple[float, float]:
    """Replay the payload's requests with ``cand``; returns (objective, token hit rate) over the last
    ``interval`` requests."""
    reqs = [
        dataclasses.replace(r, arrival=float(t), think_time=0.0)
        for r, t in zip(payload["requests"], payload["arrivals"])
    ]
    trace = Trace(payload["name"], reqs, block_tokens=payload["block_tokens"], closed_loop=False)
    cfg = dataclasses.replace(payload["config"], alpha=0.0, mode="sequential")
    sim = payload["build"](trace, cfg)
    if payload["snapshot"] is not None:
        sim.restore_tree(pickle.loads(payload["snapshot"]))
    set_candidate(sim, cand)
    run_sequential(sim)
    rec = sim.rec
    last = slice(max(len(reqs) - payload["interval"], 0), len(reqs))
    hits = rec.hit_tokens[last]
    inputs = rec.input_tokens[last]
    hit_rate = float(hits.sum() / inputs.sum()) if inputs.sum() else 0.0
    if payload["objective"] == "flops":
        spec = sim.spec
        obj = float(sum(spec.flops(int(h)) for h in hits if h))
    else:
        obj = hit_rate
    return obj, hit_rate


def _replay_in_worker(cand) -> tuple[float, float]:
    assert _PAYLOAD is not None
    return replay(_PAYLOAD, cand)


def evaluate(payload: dict, candidates: list, workers: int) -> dict:
    """Objective and hit rate of every candidate: {cand: (objective, hit rate)}."""
    workers = min(workers, len(candidates))
    if workers <= 1:
        return {c: replay(payload, c) for c in candidates}
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(payload,)) as ex:
        results = list(ex.map(_replay_in_worker, candidates))
    return dict(zip(candidates, results))


def pick(scores: dict) -> object:
    """Best alpha by objective (ties: the smallest alpha); LRU only if it strictly beats it."""
    alphas = sorted(c for c in scores if c != LRU)
    best = alphas[0]
    for a in alphas[1:]:
        if scores[a][0] > scores[best][0]:
            best = a
    if LRU in scores and scores[LRU][0] > scores[best][0]:
        return LRU
    return best


def default_workers(config) -> int:
    workers = tuner_params(config).tuning_workers
    return workers if workers > 0 else (os.cpu_count() or 1)


# ---------------------------------------------------------------------------------------------
# the engine hook
# ---------------------------------------------------------------------------------------------


class AlphaTuner:
    """Owns the tuning schedule of one Simulation. The engine calls ``before_insert(k)`` before the
    insert of the k-th processed request (1-based) and ``after_insert(k)`` after it."""

    def __init__(self, sim: Simulation, build: Builder, lru: bool) -> None:
        cfg = sim.config
        p = tuner_params(cfg)
        self.sim = sim
        self.build = build
        self.grid = parse_grid(p.alpha_grid)
        self.candidates: list = list(self.grid) + ([LRU] if lru else [])
        self.multiplier = p.bootstrap_multiplier
        self.objective = p.tuning_objective or "flops"
        self.start = p.tuning_start
        self.retune_every = p.retune_every
        self.workers = default_workers(cfg)
        self.order: list[int] = []  # request ids in processing order
        self.times: list[float] = []
        self.n_before: int | None = None
        self.window: int | None = None
        self.snapshot: bytes | None = None
        self.snapshot_at = 0  # requests processed when the snapshot was taken
        self.next_at: int | None = None
        self.history: list[dict] = []
        self.chosen = None
        self.seconds = 0.0

    def seen(self, r, t: float) -> None:
        self.order.append(r.request_id)
        self.times.append(t)

    def before_insert(self, k: int) -> None:
        if self.next_at is not None and k == self.next_at:
            self._tune(k)

    def after_insert(self, k: int, r=None, t: float = 0.0) -> None:
        if self.n_before is None and self.sim.tree.stats.eviction_calls > 0:
            self.n_before = k
            self.window = self.multiplier * k
            self.next_at = self.window if self.window > k else None
            if self.start == "snapshot":
                self.snapshot, self.snapshot_at = pickle.dumps(self.sim.tree, -1), k

    def _tune(self, k: int) -> None:
        t0 = time.perf_counter()
        sim = self.sim
        first = not self.history
        if first and self.start == "empty":
            lo, snap = 0, None
        else:
            lo, snap = self.snapshot_at, self.snapshot
        reqs = sim.trace.requests
        payload = {
            "name": f"{sim.trace.name}[tuning]",
            "requests": [reqs[i] for i in self.order[lo:k]],
            "arrivals": self.times[lo:k],
            "block_tokens": sim.trace.block_tokens,
            "config": sim.config,
            "build": self.build,
            "snapshot": snap,
            "interval": TUNING_INTERVAL,
            "objective": self.objective,
        }
        scores = evaluate(payload, self.candidates, self.workers)
        best = pick(scores)
        set_candidate(sim, best)
        self.chosen = best
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.history.append(
            {
                "at_request": k,
                "choice": best,
                "replayed": k - lo,
                "seconds": dt,
                "scores": {str(c): v for c, v in scores.items()},
            }
        )
        if self.retune_every > 0:
            self.next_at = k + self.retune_every
            self.snapshot, self.snapshot_at = pickle.dumps(sim.tree, -1), k
        else:
            self.next_at = None

    def summary(self) -> ReplayTuning:
        first = self.history[0] if self.history else None
        choice = self.chosen
        return ReplayTuning(
            tuned_alpha=(None if choice is None else (float("nan") if choice == LRU else float(choice))),
            tuned_choice=(None if choice is None else ("lru" if choice == LRU else f"{float(choice):g}")),
            tuned_at_request=first["at_request"] if first else None,
            tuning_rounds=len(self.history),
            tuning_seconds=self.seconds,
            first_eviction_request=self.n_before,
        )
