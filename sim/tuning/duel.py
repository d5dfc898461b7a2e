"""Set dueling with shadow caches (``--tuner duel``), the default tuner outside paper compat."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from sim.engine.metrics import DuelTuning
from sim.engine.simulation import Simulation
from sim.tuning.candidates import set_candidate
from sim.tuning.replay import Builder
from sim.tuning_options import LRU, parse_candidates, tuner_params


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

    def __init__(self, sim: Simulation, build: Builder) -> None:
        cfg = sim.config
        p = tuner_params(cfg)
        self.sim = sim
        self.candidates = parse_candidates(p.duel_candidates)
        self.every = p.duel_every
        self.window = p.duel_window
        self.margin = p.duel_margin
        self.objective = p.tuning_objective or "hit-rate"
        n = len(sim.trace.requests)
        shadow_cfg = dataclasses.replace(cfg, alpha=0.0)
        self.shadows = []
        for c in self.candidates:
            sh = build(sim.trace, shadow_cfg, spec=sim.spec, timing=sim.timing)
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
        t0 = time.perf_counter()
        self._flights[r.request_id] = [sh.shadow_lookup(r, t) for sh in self.shadows]
        self.seconds += time.perf_counter() - t0

    def before_insert(self, k: int) -> None:
        pass

    def after_insert(self, k: int, r=None, t: float = 0.0) -> None:
        t0 = time.perf_counter()
        i = r.request_id
        row = self.scores[self.finished_n]
        flights = self._flights.pop(i)
        for j, sh in enumerate(self.shadows):
            sh.shadow_finish(flights[j], r, t)
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
        win = self.scores[max(m - self.window, 0) : m].sum(axis=0)
        cur = self.candidates.index(self.chosen)
        best = int(np.argmax(win))  # first maximum: the earliest candidate in preference order
        switch = win[best] > win[cur] * (1.0 + self.margin)
        if switch:
            self.chosen = self.candidates[best]
            set_candidate(self.sim, self.chosen)
        self.history.append({"at_request": m, "choice": self.chosen, "switched": bool(switch)})

    def summary(self) -> DuelTuning:
        choice = self.chosen
        return DuelTuning(
            tuned_alpha=float("nan") if choice == LRU else float(choice),
            tuned_choice="lru" if choice == LRU else f"{float(choice):g}",
            tuned_at_request=self.history[0]["at_request"] if self.history else None,
            tuning_rounds=len(self.history),
            tuning_switches=sum(h["switched"] for h in self.history),
            tuning_seconds=self.seconds,
            first_eviction_request=self.first_eviction,
        )
