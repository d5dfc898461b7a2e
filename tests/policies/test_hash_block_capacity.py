"""Every engine preset that accepts Mooncake's 512-token hash blocks keeps the cache within its
capacity on ``mooncake:sample`` under pressure (the model of ``marconi run``'s Mooncake examples);
the presets whose grid the blocks cannot carry refuse in one line."""

from __future__ import annotations

import dataclasses

import pytest

from policies.base import PRESETS
from sim.config import SimConfig, parse_size
from sim.engine.drivers import run as drive
from sim.errors import USER_ERRORS
from sim.simulate import build
from traces.registry import TraceOptions, load_trace

ENGINE_PRESETS = sorted(n for n, p in PRESETS.items() if p.engine not in ("paper", "bound", "baseline"))
# presets run as the README's Mooncake examples do: trtllm with snapshots on the block grid, lmdeploy
# with its block raised to the trace's and a decode checkpoint per 1024 tokens
CASES = [(n, {}) for n in ENGINE_PRESETS] + [
    ("trtllm", {"periodic_snapshot_interval": 512}),
    ("lmdeploy", {"block_size": 512}),
    ("lmdeploy", {"prefix_cache_decode_state_interval": 1024, "state_pool": "8"}),
]


CAPACITIES = ["1GB", "2GB", "5GB", "10GB"]
# trtllm without a snapshot placement commits nothing (reuse off): peak 0 and no eviction at any
# capacity, the same check four times; it runs at the tightest one only
GRID = [
    pytest.param(n, k, c, id=f"{n}-{'-'.join(map(str, k.values()))}-{c}")
    for n, k in CASES
    for c in CAPACITIES
    if not (n == "trtllm" and not k and c != CAPACITIES[0])
]


# the sample's first 150 requests: every preset still evicts at every capacity, and the LMDeploy
# overflow this file was written for (0356279: 10000539648 > 1e10, 5000331264 > 5e9 with block 512)
# shows in them at 10GB (default block) and at all four capacities (block 512), as in all 300
REQUESTS = 150


@pytest.fixture(scope="module")
def mooncake():
    trace = load_trace("mooncake:sample", TraceOptions())
    return dataclasses.replace(trace, requests=trace.requests[:REQUESTS])


@pytest.mark.parametrize(("policy", "knobs", "capacity"), GRID)
def test_engine_presets_stay_within_capacity_on_mooncake(mooncake, policy, knobs, capacity):
    config = SimConfig(policy=policy, model="qwen3-next-80b-a3b", capacity_bytes=parse_size(capacity), **knobs)
    try:
        sim = build(mooncake, config)
    except USER_ERRORS as exc:  # a grid finer than the blocks: refused, in one line
        assert "512-token blocks" in str(exc) and "\n" not in str(exc)
        return
    res = drive(sim)
    tree = sim.tree
    assert tree.stats.peak_bytes <= tree.capacity_bytes == config.capacity_bytes
    if policy == "trtllm" and not knobs:  # no snapshot placement: reuse off, nothing committed
        assert tree.stats.peak_bytes == 0 and tree.stats.evictions == 0
        return
    assert tree.stats.evictions > 0  # under pressure
    tree.check_invariants()
    assert len(res.requests) == len(mooncake.requests) == REQUESTS
