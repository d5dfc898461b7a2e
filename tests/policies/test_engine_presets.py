"""Engine presets on tiny traces that encode their users' failure modes (engines.md §3-§6).

Every expected hit is worked out by hand in the comments. Sequential mode: request i of these
traces is its own session, so it runs at t = i (one lookup, then one insert of input + output
with the prefill and decode states).
"""

from __future__ import annotations

import numpy as np
import pytest

from policies.engines import TwoListLRUEviction, vllm_block_tokens
from policies.base import get_preset
from sim.config import UNLIMITED, SimConfig, parse_size
from sim.cost import ModelSpec, TimingModel, get_model
from sim.engine.drivers import run as run_sim
from sim.simulate import build, simulate
from sim.cache.tree import HybridRadixTree
from traces.base import Request, Trace

BIG = 10**15

# 2 bytes of KV per token (1 attention layer, 1 KV head of dim 1, 1-byte KV), one 16-byte state
# (1 GDN layer, 1 head, 2 x 2 fp32, no conv columns): a state costs the KV of 8 tokens.
TINY = ModelSpec(name="tiny", d_model=8, n_attn=1, attn_heads=1, attn_kv_heads=1, attn_head_dim=1,
                 kv_dtype_bytes=1, n_gdn=1, gdn_k_heads=1, gdn_v_heads=1, gdn_head_k_dim=2,
                 gdn_head_v_dim=2, gdn_conv_width=1)
TIMING = TimingModel(effective_tflops=1.0, overhead_ms=1.0, decode_ms_per_token=1.0)


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int64)


def cat(*parts):
    return np.concatenate(parts)


def one_per_session(*pairs):
    """Request i = (input, output) in session i, arriving at t = i."""
    return Trace("t", [Request(session_id=i, turn=0, input_tokens=inp, output_tokens=out)
                       for i, (inp, out) in enumerate(pairs)])


def run(trace, policy, *, spec=None, capacity=BIG, model="qwen3.5-9b", **cfg):
    config = SimConfig(policy=policy, model=model, capacity_bytes=capacity, mode="sequential", **cfg)
    sim = build(trace, config, spec=spec, timing=TIMING if spec is not None else None)
    res = run_sim(sim)
    return [int(h) for h in res.requests["hit_tokens"]], sim


def state_depths(tree):
    return sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state)


def test_tiny_spec_sizes():
    assert TINY.kv_bytes_per_token() == 2 and TINY.state_bytes() == 16


# ------------------------------------------------------------------------------------ vLLM

def test_vllm_block_is_the_attention_block_raised_to_the_state_page():
    # Qwen3.5-9B-like: state page 32 x 128 x 128 x 4 + (2*16*128 + 32*128) x 3 x 2 = 2,146,304 B;
    # attention page per token 2 x 4 x 256 x 2 = 4,096 B -> 524 tokens -> 16 x 33 = 528
    assert vllm_block_tokens(get_model("qwen3.5-9b")) == 528
    assert vllm_block_tokens(get_model("qwen3-next-80b-a3b")) == 1056  # 2 KV heads: 1,048 -> 1,056
    assert vllm_block_tokens(get_model("llama-7b")) == 16  # no state: the attention block
    cfg = SimConfig(policy="vllm-align", model="qwen3.5-9b")
    assert get_preset("vllm-align").grid_for(get_model("qwen3.5-9b"), cfg) == 528
    cfg.block_size = 64
    assert get_preset("vllm-all").grid_for(get_model("qwen3.5-9b"), cfg) == 64


def test_prompt_shorter_than_the_vllm_block_never_hits():
    # vLLM #40696: 500 tokens < the 528-token block: no whole block, nothing to match, 0 hits;
    # a token-grid policy reuses it from the third request (sglang+'s branch state at 500)
    same = [(toks(0, 500), toks(10_000 + 10 * i, 5)) for i in range(3)]
    for policy in ("vllm-align", "vllm-all"):
        got, sim = run(one_per_session(*same), policy)
        assert got == [0, 0, 0], policy
        assert sim.grid == 528 and sim.tree.n_states == 0
    assert run(one_per_session(*same), "sglang+")[0] == [0, 0, 500]
    # a 979-token prompt: vllm-all reuses its one whole block, 528 / 979 = 54%; vllm-align keeps
    # no state at all (one unchunked prefill ending off a block boundary)
    same = [(toks(0, 979), toks(10_000 + 10 * i, 5)) for i in range(3)]
    assert run(one_per_session(*same), "vllm-all")[0] == [0, 528, 528]
    assert run(one_per_session(*same), "vllm-align")[0] == [0, 0, 0]


def _two_turns():
    # turn 1: 1,000-token prompt + 100 output; turn 2: turn 1 + its output + 500 new tokens
    t1 = Request(session_id=0, turn=0, input_tokens=toks(0, 1000), output_tokens=toks(1000, 100))
    t2 = Request(session_id=0, turn=1, input_tokens=toks(0, 1600), output_tokens=toks(5000, 10), think_time=1.0)
    return Trace("two-turns", [t1, t2])


def test_vllm_align_at_concurrency_1_has_no_intermediate_checkpoint():
    # vLLM #42317. Default step budget 8,192: turn 1 is one step ending at 1,000 (not a multiple
    # of 528) -> no state anywhere; turn 2 misses, its one step ends at 1,600 -> still none.
    got, sim = run(_two_turns(), "vllm-align")
    assert got == [0, 0] and sim.tree.n_states == 0
    # Chunked (a 528-token budget, as when other requests share the step): turn 1 runs 528 +
    # 472 -> a state at block 1; turn 2 hits 528, then runs 528 + 528 + 16 -> states at 2 and 3
    got, sim = run(_two_turns(), "vllm-align", prefill_chunk_tokens=528)
    assert got == [0, 528] and state_depths(sim.tree) == [528, 1056, 1584]
    # a 700-token budget is cut down to one block per non-final step: turn 1 runs 528 + 472
    # (block 1); turn 2 runs 528 + 544 (block 2, then the prompt end off the grid)
    got, sim = run(_two_turns(), "vllm-align", prefill_chunk_tokens=700)
    assert got == [0, 528] and state_depths(sim.tree) == [528, 1056]
    # a 1,000-token budget holds turn 1 whole: no state, turn 2 misses again
    got, sim = run(_two_turns(), "vllm-align", prefill_chunk_tokens=1000)
    assert got == [0, 0]
    # vllm-all keeps every block boundary even unchunked: turn 1 block 1, turn 2 blocks 2 and 3
    got, sim = run(_two_turns(), "vllm-all")
    assert got == [0, 528] and state_depths(sim.tree) == [528, 1056, 1584]


def test_vllm_block_aligned_repeat_hits_one_block_short():
    # a 1,056-token prompt (2 blocks) ends on a boundary -> a state at block 2; a repeat may reuse
    # at most 1,055 tokens (one token is recomputed) -> block 1, which has no state -> 0
    same = [(toks(0, 1056), toks(10_000 + 10 * i, 5)) for i in range(2)]
    got, sim = run(one_per_session(*same), "vllm-align")
    assert got == [0, 0] and state_depths(sim.tree) == [1056]


# ------------------------------------------------------------------------------------ SGLang

def test_sglang_v1_lookup_cap_leaves_an_identical_prompt_without_a_state():
    # SGLang #21158: r0 = X (10) + Y (5) leaves one state at 15; r1 and r2 send X + Y again.
    # The lookup stops at 14 tokens, inside the edge that ends at 15 -> no state -> 0 hits.
    trace = one_per_session((toks(0, 10), toks(10, 5)), (toks(0, 15), toks(100, 5)), (toks(0, 15), toks(200, 5)))
    assert run(trace, "sglang-v1")[0] == [0, 0, 0]
    assert run(trace, "sglang+")[0] == [0, 15, 15]  # no cap: the request-end state is used
    # chunked prefill (4 tokens): r0 keeps 4, 8 (chunk ends) and 15; r1 reuses 8 and adds 12
    # (8 + 4); r2 reuses 12
    got, sim = run(trace, "sglang-v1", prefill_chunk_tokens=4)
    assert got == [0, 8, 12]
    assert state_depths(sim.tree) == [4, 8, 12, 15, 20, 20]


def _refresh_trace():
    X = toks(0, 10)
    return one_per_session(
        (X, toks(10, 5)),                    # t0: A = [0, 15) with a state at 15
        (toks(0, 20), toks(20, 5)),          # t1: hits A (15); B = [15, 25) state at 25
        (toks(100, 10), toks(110, 5)),       # t2: C = [100, 115) state, unrelated
        (toks(0, 30), toks(30, 5)),          # t3: hits B (25); D = [25, 35) state at 35
        (toks(300, 10), toks(310, 5)),       # t4: needs 15 x 2 + 16 = 46 B, 10 B over capacity
    )


@pytest.mark.parametrize("policy, alpha", [("sglang-v1-consumed", 0.0), ("marconi", 0.0)])
def test_whole_path_refresh_and_consumed_node_refresh_evict_different_nodes(policy, alpha):
    # Bytes: A 46, B 36, C 46, D 36 = 164; E (t4) 46 -> 210 > 200.
    # Whole path (SGLang): t1 refreshes A with B, t3 refreshes A, B, D -> A = B = D = 3, C = 2:
    # C (a leaf) is the least recent -> evicted whole (15 tokens + its state).
    got, sim = run(_refresh_trace(), "sglang-v1", spec=TINY, capacity=200)
    assert got == [0, 15, 0, 25, 0]
    st = sim.tree.stats
    assert (st.evictions, st.states_evicted, st.kv_tokens_evicted) == (1, 1, 15)
    assert sim.tree.match(toks(0, 20)).hit_tokens == 15  # A's state survives
    assert sim.tree.match(toks(100, 16)).hit_tokens == 0  # C is gone
    # Consumed node (SGLang #31643, Marconi): t1 refreshes only A (1), t3 only B -> A = 1 is the
    # least recent: its state is dropped (tombstone; its KV merges into B), C survives.
    got, sim = run(_refresh_trace(), policy, spec=TINY, capacity=200, alpha=alpha)
    assert got == [0, 15, 0, 25, 0]
    st = sim.tree.stats
    assert (st.evictions, st.states_evicted, st.kv_tokens_evicted) == (1, 1, 0)
    assert sim.tree.match(toks(0, 20)).hit_tokens == 0
    assert sim.tree.match(toks(0, 30)).hit_tokens == 25  # B still reachable: A's KV was kept
    assert sim.tree.match(toks(100, 16)).hit_tokens == 15
    sim.tree.check_invariants()


def test_two_list_drops_a_branch_state_and_keeps_its_kv():
    tree = HybridRadixTree(capacity_bytes=94, kv_bytes_per_token=2, state_bytes=16, block_tokens=1,
                           policy=TwoListLRUEviction())
    tree.insert(toks(0, 10), 10, [5, 10], now=0.0)  # [0,5) S, [5,10) S: 20 + 32 = 52 B
    tree.insert(cat(toks(0, 5), toks(100, 5)), 10, [10], now=1.0)  # + [100,105) S: 78 B
    # 2 tokens + a state = 20 B -> 98 > 94: the least recent, shallowest candidate is the branch
    # node [0,5) (t0, depth 5; the leaf [5,10) is t0 too but deeper): its state goes, KV stays
    res = tree.insert(toks(200, 2), 2, [2], now=2.0)
    assert res.inserted and (res.evicted_states, res.evicted_kv_tokens) == (1, 0)
    assert tree.kv_tokens == 17 and tree.n_states == 3 and tree.used_bytes == 82
    assert tree.match(toks(0, 5)).hit_tokens == 0
    assert tree.match(toks(0, 10)).hit_tokens == 10
    tree.check_invariants()


def test_sglang_v2_track_interval_and_branch_points():
    trace = one_per_session(
        (toks(0, 300), toks(300, 300)),                     # prefill end 300 -> 256; decode -> 512
        (toks(0, 700), toks(5000, 10)),                     # hits 512; branch 600 -> 576; end 640
        (cat(toks(0, 200), toks(1000, 100)), toks(2000, 10)),  # diverges at 200 -> 192; end 256
        (cat(toks(0, 200), toks(3000, 50)), toks(4000, 10)),   # hits 192; decode crosses 256
    )
    got, sim = run(trace, "sglang-v2")
    assert got == [0, 512, 0, 192]
    assert state_depths(sim.tree) == [192, 256, 256, 256, 512, 576, 640]


# ------------------------------------------------------------------------------------ LMDeploy

def test_lmdeploy_evicts_frozen_partial_checkpoints_first():
    # 64-token forwards. r0: forward ends 64 and 100 -> states at 64 (aligned) and 100 (frozen:
    # its partial block was copied aside): 105 x 2 + 2 x 16 = 242 B.
    # r1 (unrelated, 10 + 5 tokens, state at its prompt end 10): + 46 -> 288 > 280: the frozen
    # state at 100 goes first (16 B), although the stateless tail [100,105) is just as old.
    # r2 = the first 110 tokens: reuses 64 (not 100); adds 5 tokens + a state at 110 (26 B):
    # 298 > 280 -> r1's frozen state at 10 (16 B): 282, still over -> r1's stateless leaf (30 B).
    # Left: [0,64) + state = 144 B and [64,110) + state = 108 B.
    trace = one_per_session((toks(0, 100), toks(100, 5)), (toks(500, 10), toks(510, 5)),
                            (toks(0, 110), toks(0, 0)))
    got, sim = run(trace, "lmdeploy", spec=TINY, capacity=280, prefill_chunk_tokens=64)
    assert got == [0, 0, 64]
    st = sim.tree.stats
    assert (st.states_evicted, st.kv_tokens_evicted) == (2, 15)
    assert state_depths(sim.tree) == [64, 110] and sim.tree.used_bytes == 144 + 108


# ------------------------------------------------------------------------------------ TRT-LLM

def test_trtllm_states_every_256_tokens_and_at_prompt_end():
    trace = one_per_session(
        (toks(0, 600), toks(600, 10)),                     # states at 256, 512, 600
        (cat(toks(0, 550), toks(5000, 20)), toks(6000, 10)),  # hits 512; its own end 570
        (toks(0, 600), toks(7000, 5)),                     # same prompt: capped at 599 -> 512
        (toks(0, 610), toks(8000, 5)),                     # prompt + r0's output -> 600
    )
    got, sim = run(trace, "trtllm")
    assert got == [0, 512, 512, 600]
    assert state_depths(sim.tree) == [256, 512, 570, 600, 610]


# ------------------------------------------------------------------------------------ bounds

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


@pytest.mark.parametrize("policy", ["vllm-align", "vllm-all", "sglang-v1", "sglang-v1-consumed", "sglang-v2",
                                    "lmdeploy", "trtllm", "infinite"])
@pytest.mark.parametrize("mode", ["sequential", "des"])
def test_every_preset_keeps_the_tree_invariants_under_pressure(policy, mode):
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
    trace = Trace("pressure", reqs)
    config = SimConfig(policy=policy, capacity_bytes=9000, mode=mode, block_size=64, prefill_chunk_tokens=512,
                       sessions_per_second=4.0)
    sim = build(trace, config, spec=TINY, timing=TIMING)
    res = run_sim(sim)
    sim.tree.check_invariants()
    assert res.summary["requests"] == len(reqs)
    if policy != "infinite":
        assert res.summary["evictions"] > 0


def test_cli_prefill_chunk_block_size_and_capacity_inf():
    import json

    from click.testing import CliRunner

    from sim.cli import main

    def hit(*args):
        res = CliRunner().invoke(main, ["run", "--trace", "synthetic:chat", "--sessions", "10", "--model", "qwen3.5-9b",
                                        "--format", "json", "--no-progress", *args])
        assert res.exit_code == 0, res.output
        return {r["policy"]: r for r in json.loads(res.stdout)}

    # unchunked prompts leave vllm-align no state; 2,048-token steps leave some
    assert hit("--policy", "vllm-align")["vllm-align"]["token_hit_rate"] == 0.0
    assert hit("--policy", "vllm-align", "--prefill-chunk", "2048")["vllm-align"]["token_hit_rate"] > 0.2
    rows = hit("--policy", "vllm-all,sglang-v1", "--block-size", "64", "--capacity", "inf")
    assert all(r["evictions"] == 0 for r in rows.values())
    assert rows["vllm-all"]["token_hit_rate"] > 0.5
