"""Switching a live simulation's eviction policy to a tuning candidate (an alpha, or LRU)."""

from __future__ import annotations

from policies.eviction import LRULeafEviction, MarconiEviction
from sim.engine.simulation import Simulation
from sim.tuning_options import LRU


def set_candidate(sim: Simulation, cand) -> None:
    """Make ``sim`` evict with ``cand`` (an alpha, or LRU) from now on, keeping its cache."""
    pol = sim.tree.policy
    if cand == LRU:
        if not isinstance(pol, LRULeafEviction):
            sim.set_eviction(sim.make_eviction("lru-leaf", 0.0))
    else:
        if not isinstance(pol, MarconiEviction):
            sim.set_eviction(sim.make_eviction("marconi", float(cand)))
        sim.tree.policy.alpha = float(cand)
