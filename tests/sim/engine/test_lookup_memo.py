"""The lookup's per-request symbol memo (``Simulation._lookup_symbols``): a batching scheduler
looks a waiting request up again at each step it cannot start it, and the memo spares re-hashing
its prompt. It must change nothing: the same requests through a memo of one request, of none and
of the default size give the same hits, steps and times; the memo holds at most its size, oldest
first out; and what it returns is what ``symbols`` then ``stored`` give."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import SimConfig
from sim.engine.drivers import run
from sim.engine.simulation import Simulation
from sim.simulate import build
from traces.base import Request, Trace


def _trace() -> Trace:
    """Twelve requests over three shared prefixes (two of 700 tokens, one of 90), arriving
    together so that most wait through many steps under a small budget."""
    rng = np.random.default_rng(7)
    bases = [rng.integers(0, 50_000, size=n) for n in (700, 700, 90)]
    reqs = []
    for i in range(12):
        own = rng.integers(50_000, 60_000, size=40 + 37 * i)
        reqs.append(
            Request(
                session_id=i // 3,  # not a key of the memo: three requests a session
                turn=i % 3,
                input_tokens=np.concatenate((bases[i % 3], own)).astype(np.int64),
                output_tokens=rng.integers(60_000, 61_000, size=5 + i).astype(np.int64),
                arrival=0.01 * (i // 4),
            )
        )
    return Trace("memo", reqs, closed_loop=False)


def _outcome(policy: str, memo: int, monkeypatch, **cfg):
    monkeypatch.setattr(Simulation, "LOOKUP_MEMO", memo)
    conf = SimConfig(policy=policy, scheduler="continuous", capacity_bytes=4 * 10**9, max_num_batched_tokens=300, **cfg)
    sim = build(_trace(), conf)
    res = run(sim)
    return res.requests, res.summary.steps, len(sim._looked_up)


@pytest.mark.parametrize(
    "policy,cfg",
    [("vllm", {}), ("sglang", {}), ("marconi", {}), ("trtllm", {"periodic_snapshot_interval": 256}), ("lmdeploy", {})],
)
def test_memo_changes_no_hit_and_no_time(policy, cfg, monkeypatch):
    base, steps0, held0 = _outcome(policy, 0, monkeypatch, **cfg)
    one, steps1, held1 = _outcome(policy, 1, monkeypatch, **cfg)
    full, steps, held = _outcome(policy, 4096, monkeypatch, **cfg)
    assert base.equals(one) and base.equals(full) and steps0 == steps1 == steps > 12
    assert sum(base["hit_tokens"]) > 0  # the prefixes are shared: the lookups matter
    assert (held0, held1, held) == (0, 1, 12)


def test_memo_keeps_the_newest_requests_up_to_its_size(monkeypatch):
    monkeypatch.setattr(Simulation, "LOOKUP_MEMO", 3)
    sim = build(_trace(), SimConfig(policy="vllm", capacity_bytes=4 * 10**9))
    reqs = sim.trace.requests
    for r in reqs[:5]:
        sim._lookup_symbols(r)
    assert list(sim._looked_up) == [2, 3, 4]
    again = sim._lookup_symbols(reqs[3])
    assert again is sim._looked_up[3]  # served from the memo, not re-made
    seq_in, seq_full, tok_in, tok_done = sim.symbols(reqs[3])
    stored, tok_full = sim.stored(reqs[3], seq_full, tok_done)
    assert np.array_equal(again[0], seq_in) and np.array_equal(again[1], stored)
    assert again[2:] == (tok_in, tok_done, tok_full)
