"""The simulation's hooks that the mutation run (``benchmarks/mutation.py -m current --seed 0``,
2026-12-05) found untested: each test fails with the mutant it names."""

from __future__ import annotations

import numpy as np

from sim.config import SimConfig
from sim.engine.drivers import run
from sim.simulate import build
from traces.base import Request, Trace


def _pressure_trace():
    """Three 100-token prompts with nothing in common, one session each (t = 0, 1, 2)."""
    return Trace(
        "t",
        [
            Request(
                session_id=i,
                turn=0,
                input_tokens=np.arange(1000 * i, 1000 * i + 100, dtype=np.int64),
                output_tokens=np.arange(9000 + 10 * i, 9000 + 10 * i + 5, dtype=np.int64),
                arrival=float(i),
            )
            for i in range(3)
        ],
    )


def _config(trace, capacity_tokens: int) -> SimConfig:
    probe = build(trace, SimConfig(policy="marconi", model="qwen3.5-9b", capacity_bytes=10**15, mode="sequential"))
    per_entry = 110 * probe.tree.kv_bytes_per_token + 2 * probe.tree.state_bytes
    return SimConfig(
        policy="marconi", model="qwen3.5-9b", capacity_bytes=per_entry * capacity_tokens // 110, mode="sequential"
    )


class _EvictOnly:
    """An observer of evictions alone (no admit, no evict_kv)."""

    def __init__(self) -> None:
        self.evicted: list[int] = []

    def evict(self, t, checkpoint, position) -> None:
        self.evicted.append(position)


def test_an_observer_of_evictions_alone_hears_them():
    """``Simulation.observe`` (simulation.py L177): the tree reports to the observers when any of
    admit / evict / evict_kv has one (mutant: only when all three have). Room for about one and a
    half requests: the second insert evicts the first, the third the second."""
    trace = _pressure_trace()
    obs = _EvictOnly()
    sim = build(trace, _config(trace, 165), observers=(obs,))
    run(sim)
    assert sim.tree.stats.evictions > 0
    assert obs.evicted and len(obs.evicted) == sim.tree.stats.states_evicted


def test_set_eviction_attaches_the_new_policy_to_the_cache():
    """``Simulation.set_eviction`` (simulation.py L225, the tuners' candidate switch) attaches the
    new policy to the cache it then orders (mutant: ``policy.attach(tree)`` dropped)."""
    trace = _pressure_trace()
    sim = build(trace, _config(trace, 165))
    policy = sim.make_eviction("lru-leaf", 0.0)
    sim.set_eviction(policy)
    assert sim.tree.policy is policy and policy.tree is sim.tree
    run(sim)
    assert sim.tree.stats.evictions > 0


def test_hash_block_outputs_made_up_are_fresh_per_request():
    """``Simulation.output_symbols`` (simulation.py L300): a hash-block request whose trace gave
    no output symbols gets fresh ones, below every symbol already handed out (mutant: the counter
    is not advanced, so two requests with the same prompt store one shared output). Two requests,
    the same 2-block prompt (1,024 tokens), 600 output tokens each (2 symbols): the tree holds the
    prompt once and both outputs."""
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=np.array([1, 2]),
            output_tokens=np.array([], dtype=np.int64),
            arrival=float(i),
            input_len=1024,
            output_len=600,
        )
        for i in range(2)
    ]
    sim = build(
        Trace("t", reqs, block_tokens=512),
        SimConfig(policy="marconi", model="qwen3.5-9b", capacity_bytes=10**15, mode="sequential"),
    )
    run(sim)
    assert sim.tree.kv_tokens == 1024 + 2 * 600
    assert [list(s) for s in sim._out_symbols.values()] == [[-1, -2], [-3, -4]]
