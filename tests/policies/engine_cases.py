"""Tiny traces and a tiny model for the engine-preset tests (each test works its hits by hand).

Sequential mode: request i of ``one_per_session`` is its own session and runs at t = i (one
lookup, then one insert of input + output with the prefill and decode states).
"""

from __future__ import annotations

import numpy as np

from policies.base import EngineRules
from policies.lmdeploy import TieredLRUEviction, block_rules
from policies.vllm_current import VllmFreeQueueEviction
from sim.cache.engine_tree import EngineTree
from sim.config import SimConfig
from sim.cost import ModelSpec, TimingModel
from sim.engine.drivers import run as drive
from sim.simulate import build
from traces.base import Request, Trace

BIG = 10**15

# 2 bytes of KV per token (1 attention layer, 1 KV head of dim 1, 1-byte KV), one 16-byte state
# (1 GDN layer, 1 head, 2 x 2 fp32, no conv columns): a state costs the KV of 8 tokens.
TINY = ModelSpec(
    name="tiny",
    d_model=8,
    n_attn=1,
    attn_heads=1,
    attn_kv_heads=1,
    attn_head_dim=1,
    kv_dtype_bytes=1,
    n_gdn=1,
    gdn_k_heads=1,
    gdn_v_heads=1,
    gdn_head_k_dim=2,
    gdn_head_v_dim=2,
    gdn_conv_width=1,
)
TIMING = TimingModel(effective_tflops=1.0, overhead_ms=1.0, decode_ms_per_token=1.0)


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int64)


def cat(*parts):
    return np.concatenate(parts)


def one_per_session(*pairs):
    """Request i = (input, output) in session i, arriving at t = i."""
    return Trace(
        "t", [Request(session_id=i, turn=0, input_tokens=inp, output_tokens=out) for i, (inp, out) in enumerate(pairs)]
    )


def arrivals(rows):
    """An open-loop trace of one request a session from ``(prompt, output tokens, arrival)`` rows;
    request k's output tokens are its own (``toks(9000 + 1000 k, n)``)."""
    reqs = [
        Request(session_id=k, turn=0, input_tokens=inp, output_tokens=toks(9000 + 1000 * k, n), arrival=t)
        for k, (inp, n, t) in enumerate(rows)
    ]
    return Trace("t", reqs, closed_loop=False)


def run(trace, policy, *, spec=None, capacity=BIG, model="qwen3.5-9b", **cfg):
    """Hit tokens per request and the simulation (its tree) after a sequential replay."""
    config = SimConfig(policy=policy, model=model, capacity_bytes=capacity, mode=cfg.pop("mode", "sequential"), **cfg)
    sim = build(trace, config, spec=spec, timing=TIMING if spec is not None else None)
    res = drive(sim)
    return [int(h) for h in res.requests["hit_tokens"]], sim


def state_depths(tree):
    return sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state)


def snapshot_tree() -> EngineTree:
    """A token tree with TensorRT-LLM's 32-token snapshot blocks (one token a symbol, 1 byte of KV
    a token, 4-byte states, ample room, vLLM's free-queue eviction)."""
    return EngineTree(
        EngineRules(snapshot_block=32),
        capacity_bytes=10**6,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=1,
        policy=VllmFreeQueueEviction(),
    )


LMDEPLOY_BLOCK = 16


def lmdeploy_trie(states=None, kv_blocks=64) -> EngineTree:
    """LMDeploy's block trie on the tiny model: ``kv_blocks`` 16-token blocks of 2-byte KV and a
    pool of ``states`` 16-byte states (None: one budget), frozen and anchor blocks of 16."""
    B = LMDEPLOY_BLOCK
    return EngineTree(
        capacity_bytes=kv_blocks * B * 2 + (states or 0) * 16,
        kv_bytes_per_token=2,
        state_bytes=16,
        block_tokens=1,
        policy=TieredLRUEviction(),
        state_capacity=states,
        rules=block_rules(B),
    )
