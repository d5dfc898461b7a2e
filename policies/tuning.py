"""Alpha tuning for Marconi's eviction (``--alpha auto``) and the static-alpha oracle (``marconi-oracle``).

Tuner (marconi.md §6). The run starts with alpha 0. When the first eviction happens after ``n`` requests,
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
  window. Measured on the ShareGPT grid (benchmarks/tuning_report.py) it never wins there: the 9/36
  configurations where the tuner falls below SGLang+ come from the window not predicting the rest of the
  trace (the tuned alpha does beat LRU on the window), so the guard does not close them yet. Paper
  compat (``--compat paper``/``paper-fixed``) leaves it out unless asked (the artifact has none).
- objective (``--tuning-objective``): ``flops`` = FLOPs saved over the last 500 replayed requests (the
  artifact), or ``hit-rate`` = token hit rate over those requests (what the paper states). Ties go to the
  smallest alpha, so results never depend on which worker finishes first.
- ``--retune-every N``: tune again every N requests after the first round, replaying the requests since
  the previous round from a snapshot of the cache taken then.

Replays always run the artifact's sequential semantics (lookup, then one insert of input + output) in
arrival order, under the run's compat mode; a ``des`` run is tuned on the same sequential replay.

Oracle: ``marconi-oracle`` replays the whole trace once per alpha of the grid (plain Marconi, static
alpha) and reports the run with the best token hit rate; its ``tuned_alpha`` is that alpha. It is an
upper bound for the tuner, not a policy a server could run.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from sim.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from sim.engine import Simulation
    from sim.metrics import SimResult

LRU = "lru"  # the candidate that stands for SGLang+'s eviction
TUNING_INTERVAL = 500  # the artifact scores the last 500 replayed requests
DEFAULT_GRID = "0:2:0.1"


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


# ---------------------------------------------------------------------------------------------
# switching a live simulation's eviction policy
# ---------------------------------------------------------------------------------------------

def set_candidate(sim: "Simulation", cand) -> None:
    """Make ``sim`` evict with ``cand`` (an alpha, or LRU) from now on, keeping its cache."""
    from policies.eviction import LRULeafEviction, MarconiEviction

    tree = sim.tree
    pol = tree.policy
    if cand == LRU:
        if not isinstance(pol, LRULeafEviction):
            _reattach(tree, LRULeafEviction())
    else:
        if not isinstance(pol, MarconiEviction):
            new = MarconiEviction(sim.spec, alpha=float(cand), paper_bugs=sim.paper_bugs)
            new.artifact_order = sim.paper
            _reattach(tree, new)
        tree.policy.alpha = float(cand)
    sim.refresh_path = tree.policy.refresh == "path"


def _reattach(tree, policy) -> None:
    tree.policy = policy
    policy.attach(tree)
    for node in tree.iter_nodes():
        if node is not tree.root:
            node.slot = -1
            policy.add(node)


# ---------------------------------------------------------------------------------------------
# replays (run in worker processes)
# ---------------------------------------------------------------------------------------------

_PAYLOAD: dict | None = None


def _init_worker(payload: dict) -> None:
    global _PAYLOAD
    _PAYLOAD = payload


def replay(payload: dict, cand) -> tuple[float, float]:
    """Replay the payload's requests with ``cand``; returns (objective, token hit rate) over the last
    ``interval`` requests."""
    from sim.engine import Simulation
    from traces.base import Trace

    reqs = [dataclasses.replace(r, arrival=float(t), think_time=0.0)
            for r, t in zip(payload["requests"], payload["arrivals"])]
    trace = Trace(payload["name"], reqs, block_tokens=payload["block_tokens"], closed_loop=False)
    cfg = dataclasses.replace(payload["config"], alpha=0.0, mode="sequential")
    sim = Simulation(trace, cfg)
    if payload["snapshot"] is not None:
        sim.tree = pickle.loads(payload["snapshot"])
    set_candidate(sim, cand)
    sim._run_sequential()
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
    return config.tuning_workers if config.tuning_workers > 0 else (os.cpu_count() or 1)


# ---------------------------------------------------------------------------------------------
# the engine hook
# ---------------------------------------------------------------------------------------------

class AlphaTuner:
    """Owns the tuning schedule of one Simulation. The engine calls ``before_insert(k)`` before the
    insert of the k-th processed request (1-based) and ``after_insert(k)`` after it."""

    def __init__(self, sim: "Simulation") -> None:
        cfg = sim.config
        self.sim = sim
        self.grid = parse_grid(cfg.alpha_grid)
        lru = cfg.tuning_lru if cfg.tuning_lru is not None else not sim.paper
        self.candidates: list = list(self.grid) + ([LRU] if lru else [])
        self.multiplier = cfg.bootstrap_multiplier
        self.objective = cfg.tuning_objective
        self.start = cfg.tuning_start
        self.retune_every = cfg.retune_every
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

    def after_insert(self, k: int) -> None:
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
        self.history.append({"at_request": k, "choice": best, "replayed": k - lo, "seconds": dt,
                             "scores": {str(c): v for c, v in scores.items()}})
        if self.retune_every > 0:
            self.next_at = k + self.retune_every
            self.snapshot, self.snapshot_at = pickle.dumps(sim.tree, -1), k
        else:
            self.next_at = None

    def summary(self) -> dict:
        first = self.history[0] if self.history else None
        choice = self.chosen
        return {
            "tuned_alpha": (None if choice is None else (float("nan") if choice == LRU else float(choice))),
            "tuned_choice": (None if choice is None else ("lru" if choice == LRU else f"{float(choice):g}")),
            "tuned_at_request": first["at_request"] if first else None,
            "tuning_rounds": len(self.history),
            "tuning_seconds": self.seconds,
            "first_eviction_request": self.n_before,
        }


# ---------------------------------------------------------------------------------------------
# marconi-oracle
# ---------------------------------------------------------------------------------------------

def _oracle_one(args) -> tuple[float, "SimResult"]:
    from sim.engine import Simulation

    trace, cfg, alpha = args
    res = Simulation(trace, dataclasses.replace(cfg, policy="marconi", alpha=alpha)).run()
    return alpha, res


def run_oracle(trace, config, progress=None) -> "SimResult":
    """Best static alpha in hindsight over the grid, by token hit rate (ties: smallest alpha)."""
    grid = parse_grid(config.alpha_grid)
    workers = min(default_workers(config), len(grid))
    jobs = [(trace, config, a) for a in grid]
    if workers <= 1:
        results = [_oracle_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            results = list(ex.map(_oracle_one, jobs))
    best_alpha, best = results[0]
    for a, res in results[1:]:
        if res.summary["token_hit_rate"] > best.summary["token_hit_rate"]:
            best_alpha, best = a, res
    summary = dict(best.summary)
    summary.update(policy=config.policy, tuned_alpha=float(best_alpha), tuned_choice=f"{best_alpha:g}",
                   tuned_at_request=None, oracle_hit_rates={f"{a:g}": r.summary["token_hit_rate"] for a, r in results})
    if progress is not None:
        progress.update(len(trace.requests))
    return dataclasses.replace(best, summary=summary)


def snapshot_copy(tree):
    """A deep copy of a tree (tests: replay determinism)."""
    return copy.deepcopy(tree)
