"""Every engine preset together: TensorRT-LLM, the bounds, the tree invariants under pressure
(with one budget and with a state pool) and the CLI. The engines' own tests are ported per
engine: test_vllm.py, test_sglang.py, test_lmdeploy.py, test_belady.py."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import TIMING, TINY, cat, one_per_session, run, state_depths, toks

from policies.base import ALIASES, PRESETS
from sim.cache.engine_tree import parse_state_pool
from sim.config import UNLIMITED, SimConfig, parse_size
from sim.engine.drivers import run as drive
from sim.errors import UsageError
from sim.simulate import build
from traces.base import Request, Trace

ENGINE_PRESETS = [
    "sglang",
    "vllm",
    "trtllm",
    "lmdeploy",
    "vllm-align",
    "vllm-all",
    "sglang-v1",
    "sglang-v1-pathrefresh",
    "sglang-v2",
    "lmdeploy-0.16-pytorch",
    "trtllm-1.2-interval",
    "infinite",
    "belady",
    "belady-size",
]
POOLED = ("sglang", "lmdeploy", "sglang-v1", "sglang-v1-pathrefresh", "sglang-v2", "lmdeploy-0.16-pytorch", "trtllm")


def test_every_engine_preset_is_registered():
    assert set(ENGINE_PRESETS) <= set(PRESETS) | set(ALIASES)
    assert {ALIASES[a] for a in ENGINE_PRESETS if a in ALIASES} <= set(PRESETS)


def test_trtllm_states_every_256_tokens_and_at_prompt_end():
    """The earlier TensorRT-LLM preset (``trtllm-1.2-interval``, the project's ``trtllm`` before
    issue 19): states every 256 prompt tokens and at the prompt end."""
    trace = one_per_session(
        (toks(0, 600), toks(600, 10)),  # states at 256, 512, 600
        (cat(toks(0, 550), toks(5000, 20)), toks(6000, 10)),  # hits 512; its own end 570
        (toks(0, 600), toks(7000, 5)),  # same prompt: capped at 599 -> 512
        (toks(0, 610), toks(8000, 5)),  # prompt + r0's output -> 600
    )
    got, sim = run(trace, "trtllm-1.2-interval")
    assert got == [0, 512, 512, 600]
    assert state_depths(sim.tree) == [256, 512, 570, 600, 610]


def test_infinite_never_evicts_and_capacity_inf_is_unlimited():
    shared = [(cat(toks(0, 100), toks(1000 + 100 * i, 20)), toks(5000 + 100 * i, 10)) for i in range(3)]
    got, sim = run(one_per_session(*shared), "infinite", spec=TINY, capacity=1)
    assert got == [0, 0, 100] and sim.tree.stats.evictions == 0
    assert parse_size("inf") == UNLIMITED
    got, sim = run(one_per_session(*shared), "sglang+", spec=TINY, capacity=parse_size("inf"))
    assert got == [0, 0, 100] and sim.tree.stats.evictions == 0
    # the same trace in 200 B evicts: r0's 130 tokens alone need 276 B -> rejected
    got, sim = run(one_per_session(*shared), "sglang+", spec=TINY, capacity=200)
    assert sim.tree.stats.rejected_inserts == 3


def test_state_pool_counts_or_bytes():
    assert parse_state_pool("200", 16) == 200
    assert parse_state_pool("1KB", 16) == 62  # 1000 B / 16 B, floored
    with pytest.raises(UsageError):
        parse_state_pool("8B", 16)  # less than one state
    with pytest.raises(UsageError):
        parse_state_pool("lots", 16)
    with pytest.raises(UsageError):
        parse_state_pool("0", 16)


def _pressure_trace():
    # 12 sessions x 3 turns over a shared 700-token prefix, in a cache that holds a fraction
    rng = np.random.default_rng(7)
    reqs = []
    for s in range(12):
        hist = toks(0, 700) if s % 2 else toks(0, 300)
        for turn in range(3):
            new = rng.integers(10_000, 20_000, size=int(rng.integers(50, 700)))
            inp = cat(hist, new)
            out = rng.integers(10_000, 20_000, size=int(rng.integers(5, 200)))
            reqs.append(Request(session_id=s, turn=turn, input_tokens=inp, output_tokens=out, think_time=0.5))
            hist = cat(inp, out)
    return Trace("pressure", reqs)


@pytest.mark.parametrize("policy", ENGINE_PRESETS)
@pytest.mark.parametrize("mode", ["sequential", "des"])
@pytest.mark.parametrize("pool", ["", "40"])
def test_every_preset_keeps_the_tree_invariants_under_pressure(policy, mode, pool):
    trace = _pressure_trace()
    # trtllm's default (no snapshot placement) turns reuse off and keeps nothing: give it an interval
    knobs = {"periodic_snapshot_interval": 64} if PRESETS.get(ALIASES.get(policy, policy)).admission == "trtllm" else {}
    config = SimConfig(
        policy=policy,
        capacity_bytes=9000,
        mode=mode,
        block_size=64,
        prefill_chunk_tokens=512,
        sessions_per_second=4.0,
        state_pool=pool,
        **knobs,
    )
    sim = build(trace, config, spec=TINY, timing=TIMING)
    res = drive(sim)
    sim.tree.check_invariants()
    assert res.summary["requests"] == len(trace.requests)
    if policy != "infinite":
        assert res.summary["evictions"] > 0
    pooled = pool and policy in POOLED
    assert getattr(sim.tree, "state_capacity", None) == (40 if pooled else None)
    if pooled:
        assert sim.tree.n_states <= 40 and sim.tree.kv_bytes <= 9000 - 40 * 16


def test_cli_prefill_chunk_block_size_state_pool_and_capacity_inf():
    import json

    from click.testing import CliRunner

    from sim.cli import main

    def hit(*args):
        res = CliRunner().invoke(
            main,
            [
                "run",
                "--trace",
                "synthetic:chat",
                "--sessions",
                "10",
                "--model",
                "qwen3.5-9b",
                "--format",
                "json",
                "--no-progress",
                *args,
            ],
        )
        assert res.exit_code == 0, res.output
        return {r["policy"]: r for r in json.loads(res.stdout)}

    # an unchunked prompt keeps its last full block's state; 2,048-token steps keep more
    whole = hit("--policy", "vllm-align")["vllm-align"]["token_hit_rate"]
    assert 0.0 < whole <= hit("--policy", "vllm-align", "--prefill-chunk", "2048")["vllm-align"]["token_hit_rate"]
    rows = hit("--policy", "vllm-all,sglang-v1", "--block-size", "64", "--capacity", "inf")
    assert all(r["evictions"] == 0 for r in rows.values())
    assert rows["vllm-all"]["token_hit_rate"] > 0.5
    # a state pool of 4 states in 5 GB: the states, not the bytes, run out
    pooled = hit("--policy", "sglang-v1", "--state-pool", "4")["sglang-v1"]
    shared = hit("--policy", "sglang-v1")["sglang-v1"]
    assert pooled["evictions"] > shared["evictions"] and pooled["token_hit_rate"] < shared["token_hit_rate"] / 2
    bad = CliRunner().invoke(
        main,
        [
            "run",
            "--trace",
            "synthetic:chat",
            "--sessions",
            "2",
            "--policy",
            "sglang-v1",
            "--state-pool",
            "many",
            "--no-progress",
        ],
    )
    assert bad.exit_code == 2 and "--state-pool" in bad.output and "Traceback" not in bad.output
