"""Alpha tuning for Marconi's eviction (``--alpha auto``) and the static-alpha oracle (``marconi-oracle``).

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

Replay tuner (marconi.md §6). The run starts with alpha 0. When the first eviction happens after ``n`` requests,
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
  last 500 replayed requests (the artifact), or ``hit-rate`` = token hit rate over those requests (what the paper states). Ties go to the
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
        self.objective = cfg.tuning_objective or "flops"
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
# set dueling with shadow caches (the default tuner outside paper compat)
# ---------------------------------------------------------------------------------------------

DEFAULT_DUEL_CANDIDATES = "lru,0,0.1,0.2,0.4,0.7,1,1.5,2"


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


class DuelTuner:
    """Set dueling with shadow caches (``--tuner duel``).

    One shadow cache per candidate (``--duel-candidates``: SGLang+'s LRU and a few alphas) runs in
    the same process on the live request stream from the start of the trace: it sees every request at
    the time the live cache does (lookup at arrival, insert when the live cache's last insert for that
    request is done; pinned in between, as the live one) and keeps its own recorder. Shadows stand
    for metadata-only "ghost" caches a server could keep (no KV or state bytes, just the tree).

    Every ``--duel-every`` finished requests the live cache's eviction policy becomes the candidate
    with the best objective (hit tokens, or FLOPs saved with ``--tuning-objective flops``) over the
    last ``--duel-window`` finished requests, if it beats the incumbent by more than ``--duel-margin``
    (relative; hysteresis against flapping); ties go to the earlier candidate (LRU, then smaller
    alphas). Unlike the replay tuner, the choice is scored on the requests just served, by caches in
    the steady state of each candidate, so it tracks drift and cannot overfit a bootstrap window that
    does not predict the rest of the trace. Deterministic: shadows are processed in candidate order.

    The live cache starts with alpha 0 (the paper: alpha 0 until the first eviction; before it, all
    candidates keep the same content and score the same).
    """

    def __init__(self, sim: "Simulation") -> None:
        from sim.engine import Simulation

        cfg = sim.config
        self.sim = sim
        self.candidates = parse_candidates(cfg.duel_candidates)
        self.every = cfg.duel_every
        self.window = cfg.duel_window
        self.margin = cfg.duel_margin
        self.objective = cfg.tuning_objective or "hit-rate"
        n = len(sim.trace.requests)
        shadow_cfg = dataclasses.replace(cfg, alpha=0.0)
        self.shadows = []
        for c in self.candidates:
            sh = Simulation(sim.trace, shadow_cfg, spec=sim.spec, timing=sim.timing)
            set_candidate(sh, c)
            self.shadows.append(sh)
        self.scores = np.zeros((n, len(self.candidates)))  # per finished request, objective per candidate
        self.finished_n = 0
        self._flights: dict[int, list] = {}
        self.order: list[int] = []  # the engine counts arrivals with it
        self.chosen = 0.0 if 0.0 in self.candidates else self.candidates[0]
        set_candidate(sim, self.chosen)
        self.history: list[dict] = []
        self.first_eviction: int | None = None
        self.seconds = 0.0

    def seen(self, r, t: float) -> None:
        self.order.append(r.request_id)
        if self.sim.paper:
            return  # paper mode: shadows replay the whole artifact step when the request finishes
        t0 = time.perf_counter()
        self._flights[r.request_id] = [sh.lookup(r, t, lock=True) for sh in self.shadows]
        self.seconds += time.perf_counter() - t0

    def before_insert(self, k: int) -> None:
        pass

    def after_insert(self, k: int, r=None, t: float = 0.0) -> None:
        t0 = time.perf_counter()
        i = r.request_id
        row = self.scores[self.finished_n]
        flights = self._flights.pop(i, None)
        for j, sh in enumerate(self.shadows):
            if flights is None:
                sh._paper_step(r, t)
            else:
                f = flights[j]
                f.decode_cps = sorted(set(f.prefill_cps) | set(f.decode_cps))
                f.prefill_cps = []
                sh.insert_decode(f, t)
            h = int(sh.rec.hit_tokens[i])
            row[j] = sh.spec.flops(h) if (self.objective == "flops" and h) else h
        self.finished_n += 1
        if self.first_eviction is None and self.sim.tree.stats.eviction_calls > 0:
            self.first_eviction = self.finished_n
        if self.first_eviction is not None and self.finished_n % self.every == 0:
            self._decide()
        self.seconds += time.perf_counter() - t0

    def _decide(self) -> None:
        m = self.finished_n
        win = self.scores[max(m - self.window, 0):m].sum(axis=0)
        cur = self.candidates.index(self.chosen)
        best = int(np.argmax(win))  # first maximum: the earliest candidate in preference order
        switch = win[best] > win[cur] * (1.0 + self.margin)
        if switch:
            self.chosen = self.candidates[best]
            set_candidate(self.sim, self.chosen)
        self.history.append({"at_request": m, "choice": self.chosen, "switched": bool(switch)})

    def summary(self) -> dict:
        choice = self.chosen
        return {
            "tuned_alpha": float("nan") if choice == LRU else float(choice),
            "tuned_choice": "lru" if choice == LRU else f"{float(choice):g}",
            "tuned_at_request": self.history[0]["at_request"] if self.history else None,
            "tuning_rounds": len(self.history),
            "tuning_switches": sum(h["switched"] for h in self.history),
            "tuning_seconds": self.seconds,
            "first_eviction_request": self.first_eviction,
        }


def make_tuner(sim: "Simulation"):
    """The tuner ``--tuner`` asks for: ``duel`` (default) or ``replay`` (the artifact's; default in paper
    compat)."""
    kind = sim.config.tuner or ("replay" if sim.paper else "duel")
    return DuelTuner(sim) if kind == "duel" else AlphaTuner(sim)


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
