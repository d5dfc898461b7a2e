"""A hash-block request's stored sequence: the prompt's partial last block inside it (issues 41, 44).

Mooncake hashes a prompt's partial last block on its own and the loader gives the output symbols
of its own after it (``traces/hashblock.py``), so a partial symbol sits *inside* the stored
sequence, not only at its end. The tree counted every symbol but the last as a whole block: a
state at the prompt's end landed at ``blocks x B`` (past the request: replay refused it), the
symbols after it were counted short (a negative edge in des mode: 1103 tokens stored for a
1300-token prompt) and des and sequential mode stored different extents. ``Span`` counts the
partial symbol where it is; ``Simulation`` gives an output without hash ids symbols of its own,
so that both modes store the rule of docs/presets-engines.md ("What a finished request leaves in
the cache"): input + output - 1 tokens for today's engine presets, input + output for the paper's
policies.

Hand-worked on 16-token blocks: a 40-token prompt is blocks [1, 2, 3], the last holding 8 tokens;
its 20 output tokens are two symbols of 16 and 4 tokens (3 once the engines' last token drops).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.eviction import LRULeafEviction
from sim.cache.engine_tree import EngineTree
from sim.cache.tree import HybridRadixTree, Span
from sim.config import SimConfig
from sim.engine.drivers import run as drive
from sim.simulate import build
from traces.base import Request, Trace
from traces.registry import TraceOptions, load_trace

B = 16


def seq(*xs):
    return np.array(xs, dtype=np.int64)


def trees():
    kw = dict(capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=B)
    return [HybridRadixTree(policy=LRULeafEviction(), **kw), EngineTree(policy=LRULeafEviction(), **kw)]


def depths(tree):
    return sorted(tree.checkpoints().values())


# ------------------------------------------------------------------------------ Span


def test_span_counts_a_partial_symbol_inside_the_sequence():
    # [1, 2, 3 (8 tokens), o1 (16), o2 (3)]: 59 tokens
    s = Span(5, B, 59, (3, 40))
    assert [s.tokens(j) for j in range(6)] == [0, 16, 32, 40, 56, 59]
    # no cut: whole blocks but the last
    assert [Span(3, B, 40).tokens(j) for j in range(4)] == [0, 16, 32, 40]
    # a cut at the end or past it is the last symbol's business (seq_tokens)
    assert [Span(3, B, 40, (3, 40)).tokens(j) for j in range(4)] == [0, 16, 32, 40]


# ------------------------------------------------------------------------------ the tree


@pytest.mark.parametrize("tree", trees(), ids=["core", "engine"])
def test_a_state_after_a_partial_block_sits_at_the_prompt_end(tree):
    """Request A stores prompt + output in one edge (59 tokens, tail state). A repeat of its prompt
    puts a state at the prompt's end inside that edge: at 40 (the partial block's end), not at
    3 x 16 = 48; the output below keeps its 19 tokens (not 11)."""
    tree.insert(seq(1, 2, 3, -1, -2), 59, [5], now=1, cut=(3, 40))
    assert (tree.kv_tokens, depths(tree)) == (59, [59])
    tree.insert(seq(1, 2, 3), 40, [3], now=2)
    tree.check_invariants()
    assert (tree.kv_tokens, depths(tree)) == (59, [40, 59])
    (top,) = tree.root.children.values()
    (low,) = top.children.values()
    assert (top.n_tokens, top.depth_tokens, low.n_tokens) == (40, 40, 19)
    # a branch off the first two blocks cuts at 32
    tree.insert(seq(1, 2, 5), 36, [2, 3], now=3)
    tree.check_invariants()
    assert (tree.kv_tokens, depths(tree)) == (63, [32, 36, 40, 59])
    # the repeat hits its whole prompt; capped at 2 symbols (the engines' input_len - 1), 32
    assert tree.match(seq(1, 2, 3)).hit_tokens == 40
    assert tree.match(seq(1, 2, 3), max_hit_sym=2).hit_tokens == 32


@pytest.mark.parametrize("tree", trees(), ids=["core", "engine"])
def test_output_symbols_after_a_stored_prompt_add_the_output_tokens(tree):
    """Des mode: the prompt at prefill end (state at 40), then prompt + output at decode end: the
    output's 19 tokens hang under it (before: 2 x 16 - 29 = 3 tokens... the edge was counted from
    the whole-block grid, 59 - 48 = 11, and des stored less than sequential)."""
    tree.insert(seq(1, 2, 3), 40, [3], now=1)
    tree.insert(seq(1, 2, 3, -1, -2), 59, [3, 5], now=2, cut=(3, 40))
    tree.check_invariants()
    assert (tree.kv_tokens, depths(tree)) == (59, [40, 59])
    # the same in one insert (sequential mode)
    one = type(tree)(
        capacity_bytes=10**9, kv_bytes_per_token=1, state_bytes=10, block_tokens=B, policy=LRULeafEviction()
    )
    one.insert(seq(1, 2, 3, -1, -2), 59, [3, 5], now=1, cut=(3, 40))
    one.check_invariants()
    assert (one.kv_tokens, depths(one)) == (59, [40, 59])


def test_room_planned_for_an_insert_after_a_partial_block_is_exact():
    """The planned KV of an insert counts the partial block once: a cache of exactly the stored
    bytes takes the insert without evicting (59 tokens + 2 states)."""
    t = HybridRadixTree(
        capacity_bytes=59 + 2 * 10, kv_bytes_per_token=1, state_bytes=10, block_tokens=B, policy=LRULeafEviction()
    )
    t.insert(seq(1, 2, 3), 40, [3], now=1)
    res = t.insert(seq(1, 2, 3, -1, -2), 59, [5], now=2, cut=(3, 40))
    assert res.inserted and (res.new_kv_tokens, res.evicted_kv_tokens, res.evicted_states) == (19, 0, 0)
    assert t.used_bytes == t.capacity_bytes


# ------------------------------------------------------------------------------ des and sequential


def hash_trace(n_in, n_out, reps=2, out_symbols=False, gap=100.0):
    """``reps`` identical prompts of ``n_in`` tokens in 16-token blocks, ``gap`` seconds apart;
    ``out_symbols``: the output carries symbols of its own (as the Mooncake loader gives)."""
    nsym, osym = -(-n_in // B), -(-n_out // B) if out_symbols else 0
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=np.arange(1, nsym + 1, dtype=np.int64),
            output_tokens=np.arange(-1000 * (i + 1), -1000 * (i + 1) - osym, -1, dtype=np.int64),
            input_len=n_in,
            output_len=n_out,
            arrival=gap * i,
        )
        for i in range(reps)
    ]
    return Trace("hb", reqs, closed_loop=False, block_tokens=B)


MODES = [("des", "fcfs"), ("des", "continuous"), ("sequential", "auto")]
POLICIES = [
    ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}, 1),
    ("vllm+", {}, 0),
    ("marconi", {}, 0),
    ("sglang+", {}, 0),
]


def go(trace, policy, mode, sched, **knobs):
    cfg = SimConfig(policy=policy, capacity_bytes=10**14, mode=mode, scheduler=sched, **knobs)
    sim = build(trace, cfg)
    res = drive(sim)
    return [int(h) for h in res.requests["hit_tokens"]], sim


@pytest.mark.parametrize("mode,sched", MODES)
@pytest.mark.parametrize("policy,knobs,drop", POLICIES)
@pytest.mark.parametrize("n_in", [40, 48, 33])
@pytest.mark.parametrize("out_symbols", [False, True])
def test_one_request_stores_the_rule_in_every_mode(mode, sched, policy, knobs, drop, n_in, out_symbols):
    """One request of ``n_in`` prompt tokens and 20 output tokens stores n_in + 20 - 1 tokens
    under an engine preset, n_in + 20 under a paper policy, whichever the mode, the scheduler and
    whether the trace gave the output symbols; the tail state sits at that extent and every state
    inside it (none past the prompt's partial block, as at 48 before)."""
    _, sim = go(hash_trace(n_in, 20, reps=1, out_symbols=out_symbols), policy, mode, sched, **knobs)
    sim.tree.check_invariants()
    stored = n_in + 20 - drop
    assert sim.tree.kv_tokens == stored
    ds = depths(sim.tree)
    assert ds[-1] == stored
    assert all(d in (16, 32, n_in, stored) or d > n_in for d in ds)


@pytest.mark.parametrize("mode,sched", MODES)
def test_a_repeated_prompt_with_a_partial_block_hits_it_in_every_mode(mode, sched):
    """Marconi, a 40-token prompt sent three times (100 s apart: one at a time). Request 0 stores
    [1, 2, 3, o, o] with its tail state (60 tokens). Request 1's lookup ends inside that edge
    after the partial block: no hit, and Marconi places a branch state there, at 40 (3 x 16 = 48
    before). Request 2 reuses its whole prompt (the paper's policies have no last-token cap).
    Stored: 60 + 20 + 20 tokens (each answer under its own symbols)."""
    hits, sim = go(hash_trace(40, 20, reps=3, out_symbols=True), "marconi", mode, sched)
    sim.tree.check_invariants()
    assert hits == [0, 0, 40]
    assert sim.tree.kv_tokens == 100
    assert depths(sim.tree) == [40, 60, 60, 60]


def test_an_engine_preset_stops_one_block_short_of_a_repeated_partial_prompt():
    """SGLang (no_buffer) on the same three prompts: its states sit at the prompt's end (40, one
    node for all three) and at each tail (59); the lookup stops at input_len - 1 = 39 tokens, 2
    whole blocks, where no state is: no hit in any mode. Stored: 40 + 3 x 19 tokens."""
    for mode, sched in MODES:
        hits, sim = go(
            hash_trace(40, 20, reps=3, out_symbols=True), "sglang", mode, sched, mamba_radix_cache_strategy="no_buffer"
        )
        sim.tree.check_invariants()
        assert hits == [0, 0, 0], (mode, sched)
        assert sim.tree.kv_tokens == 40 + 3 * 19
        assert depths(sim.tree) == [40, 59, 59, 59]


def test_an_output_of_one_token_leaves_no_empty_symbol():
    """An engine preset stores input + output - 1: a 1-token answer leaves the prompt alone (its
    output symbol would hold 0 tokens and is dropped), and 17 output tokens over 16-token blocks
    leave one whole output symbol."""
    for n_out, stored_syms in ((1, 3), (17, 4)):
        for mode, sched in MODES:
            _, sim = go(
                hash_trace(40, n_out, reps=1, out_symbols=True),
                "sglang",
                mode,
                sched,
                mamba_radix_cache_strategy="no_buffer",
            )
            sim.tree.check_invariants()
            assert sim.tree.kv_tokens == 40 + n_out - 1
            assert max(n.depth_sym for n in sim.tree.iter_nodes()) == stored_syms
            assert all(n.n_tokens > 0 for n in sim.tree.iter_nodes() if n is not sim.tree.root)


def test_the_shipped_mooncake_rows_store_the_same_in_des_and_sequential_mode(tmp_path):
    """The first Mooncake rows of 1300 and 1024 tokens (a partial last block and whole blocks), one
    at a time: des and sequential mode store input + output - 1 tokens each (1339 and 1063; des
    stored 1103 for the partial prompt before, sequential put the prompt-end state at 1536)."""
    rows = [(0, 1300, 40, [0, 1, 50]), (100_000, 1024, 40, [7, 8])]
    p = tmp_path / "rows.jsonl"
    p.write_text(
        "".join(
            json.dumps(dict(timestamp=t, input_length=n, output_length=o, hash_ids=h)) + "\n" for t, n, o, h in rows
        )
    )
    trace = load_trace(f"mooncake:{p}", TraceOptions())
    for mode, sched in MODES:
        _, sim = go(trace, "sglang", mode, sched, mamba_radix_cache_strategy="no_buffer")
        sim.tree.check_invariants()
        assert sim.tree.kv_tokens == 1339 + 1063
        assert depths(sim.tree) == [1024, 1063, 1300, 1339]


# ------------------------------------------------------------------------------ the invariant


@st.composite
def streams(draw):
    """A single stream of hash-block requests (one at a time) over a shared block chain: each
    prompt takes the chain's first k blocks, maybe a branch block and maybe a partial last block
    (reused by later prompts with the same path, as Mooncake hashes a block's content)."""
    n = draw(st.integers(2, 7))
    reqs = []
    for i in range(n):
        k = draw(st.integers(0, 4))
        branch = draw(st.sampled_from([[], [100], [101]]))
        ids = list(range(1, k + 1)) + branch
        rest = draw(st.sampled_from([0, 1, 7, 15]))
        if rest or not ids:
            part = rest or 5
            # the partial block's hash: one per path and length (a block's content)
            ids.append(10_000 + 1000 * k + 100 * (branch[0] - 99 if branch else 0) + part)
            n_in = (len(ids) - 1) * B + part
        else:
            n_in = len(ids) * B
        n_out = draw(st.integers(1, 40))
        osym = -(-n_out // B) if draw(st.booleans()) else 0
        reqs.append(
            Request(
                session_id=i,
                turn=0,
                input_tokens=np.array(ids, dtype=np.int64),
                output_tokens=np.arange(-100 * (i + 1), -100 * (i + 1) - osym, -1, dtype=np.int64),
                input_len=n_in,
                output_len=n_out,
                arrival=1000.0 * i,
            )
        )
    return Trace("stream", reqs, closed_loop=False, block_tokens=B)


def check_depths(sim) -> None:
    """Every node ends where the request whose sequence it lies on counts its symbols: whole blocks
    up to the prompt's (maybe partial) last one, then whole output blocks, and the stored total at
    the stored sequence's end (in trace blocks: a tree symbol of a coarser grid joins several)."""
    stored = []
    for r in sim.trace.requests:
        _, full, tok_in, tok_full = sim.symbols(r)
        seq_s, total = sim.stored(r, full, tok_full)
        stored.append((seq_s, len(r.input_tokens), tok_in, total))
    for node in sim.tree.iter_nodes():
        if node is sim.tree.root:
            continue
        keys, n = [], node
        while n is not sim.tree.root:
            keys.append(n.key)
            n = n.parent
        path = np.concatenate(keys[::-1])
        d = len(path)
        seq_s, n_in, tok_in, total = next(x for x in stored if np.array_equal(x[0][:d], path))
        j = d * sim.regrid  # trace blocks up to the node's end (a preset's grid may join several)
        want = total if d == len(seq_s) else min(j * B, tok_in) if j <= n_in else tok_in + (j - n_in) * B
        assert node.depth_tokens == want, (path, node.depth_tokens, want)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(streams(), st.sampled_from(POLICIES))
def test_des_and_sequential_agree_on_a_single_stream(trace, policy):
    """One request at a time with room for everything: des (both schedulers) and sequential mode
    give every request the same hit and leave the same extent and the same states, each node
    ending at the token its symbols count."""
    name, knobs, _ = policy
    runs = [go(trace, name, mode, sched, **knobs) for mode, sched in MODES]
    (h0, s0), *_ = runs
    for h, s in runs:
        s.tree.check_invariants()
        check_depths(s)
        assert h == h0
        assert s.tree.kv_tokens == s0.tree.kv_tokens
        assert depths(s.tree) == depths(s0.tree)


# ------------------------------------------------------------------------------ the miss ledger


def test_the_miss_ledger_marks_a_state_after_a_partial_block_at_that_block():
    """A state at the end of a 40-token prompt (blocks [1, 2, 3], the last 8 tokens) lies after
    block 3, not after block 2 (40 // 16): once it is evicted, a later prompt [1, 2, 9] that shares
    blocks 1 and 2 never had a state at 32 (``no_checkpoint``, not ``evicted``). A tail state at
    40 + 19 lies after the second output block (depth 5: 16 + 3 output tokens)."""
    from sim.engine.misses import MissLedger

    reqs = [
        Request(0, 0, seq(1, 2, 3), seq(-1, -2), input_len=40, output_len=20, arrival=0.0),
        Request(1, 0, seq(1, 2, 9), seq(-3), input_len=40, output_len=4, arrival=1.0),
    ]
    Trace("hb", reqs, closed_loop=False, block_tokens=B)
    led = MissLedger(2, B, B, stores_last_token=True, cap_minus_one=False)
    led.looked_up(reqs[0], 0, 40)
    led.admit(0.0, 7, reqs[0], 40, "prompt-end")
    led.admit(0.0, 8, reqs[0], 59, "tail")
    assert (led._ckpt[7][1], led._ckpt[8][1]) == (3, 5)
    led.evict(0.5, 7, 40)
    led.looked_up(reqs[1], 0, 40)
    row = {c: int(v[1]) for c, v in led.counts.items()}
    assert row["never_shared"] == 8 and row["no_checkpoint"] == 32 and row["evicted"] == 0


@pytest.mark.parametrize("tree", trees(), ids=["core", "engine"])
def test_a_hash_id_given_two_lengths_keeps_the_tree_whole(tree):
    """A trace that gives one hash id two lengths (a whole block here, 8 tokens there; the shipped
    Mooncake samples never do) cannot say where the edge's tokens split: the cut stays inside the
    edge, a token at least on each side, and the byte count stays exact."""
    tree.insert(seq(1, 2, 3, -1), 44, [4], now=1, cut=(3, 40))  # 3 holds 8 tokens, -1 holds 4
    tree.insert(seq(1, 2, 3, 4), 64, [3, 4], now=2)  # 3 claims a whole block: the cut would be at 48
    tree.check_invariants()
    (top,) = tree.root.children.values()
    assert (top.depth_tokens, top.n_tokens) == (43, 43)  # 44 - 1: the output keeps one token
    assert sorted(c.n_tokens for c in top.children.values()) == [1, 16]
    assert tree.kv_tokens == 44 + 16


@pytest.mark.parametrize("compat", ["paper", "paper-fixed"])
def test_the_artifact_replay_counts_the_partial_block_too(compat, tmp_path):
    """The Marconi artifact's replay (``sim.compat``) on Mooncake rows: 1300-token prompts [0, 1,
    50] (the last block 276 tokens) and a 1100-token [0, 1, 52]. Request 1 branches at 1024 (the
    artifact's branch state), request 2 hits it and leaves a state at its prompt's end, 1300 (not
    1536), which request 3 reuses whole. Stored: 1024 + (276 + 40) + (76 + 20) + 16 + 8 tokens."""
    rows = [
        (0, 1300, 40, [0, 1, 50]),
        (0, 1100, 20, [0, 1, 52]),
        (2000, 1300, 16, [0, 1, 50]),
        (4000, 1300, 8, [0, 1, 50]),
    ]
    p = tmp_path / "rows.jsonl"
    p.write_text(
        "".join(
            json.dumps(dict(timestamp=t, input_length=n, output_length=o, hash_ids=h)) + "\n" for t, n, o, h in rows
        )
    )
    trace = load_trace(f"mooncake:{p}", TraceOptions())
    sim = build(trace, SimConfig(policy="marconi", capacity_bytes=10**14, mode="sequential", compat=compat))
    res = drive(sim)
    assert list(res.requests["hit_tokens"]) == [0, 0, 1024, 1300]
    assert sim.tree.kv_tokens == 1024 + 316 + 96 + 16 + 8
    assert depths(sim.tree) == [1024, 1120, 1300, 1308, 1316, 1340]


@pytest.mark.parametrize("tree", trees(), ids=["core", "engine"])
def test_a_split_without_a_token_count_cuts_whole_blocks(tree):
    """``_split`` with no ``up_tokens`` (a caller cutting an edge outside an insert) counts the
    upper symbols as whole blocks: [1, 2, 3, 4] (64 tokens) cut after 2 symbols is 32 + 32 tokens
    (mutation survivor: the default dropped)."""
    tree.insert(seq(1, 2, 3, 4), 64, [4], now=1)
    (child,) = tree.root.children.values()
    upper = tree._split(child, 2, now=2)
    tree._add_state(upper)  # a state at the cut, as an insert's checkpoint there places one
    tree.check_invariants()
    assert (upper.n_tokens, upper.depth_tokens, child.n_tokens, child.depth_tokens) == (32, 32, 32, 64)
    assert tree.kv_tokens == 64


@pytest.mark.parametrize(
    "block,seq_,total,cut,cps,kept",
    [
        # token tree: 40 tokens in whole 16-token blocks keep 32; the state at 40 goes with the rest
        (1, np.arange(40), 40, None, [16, 40], (32, [16])),
        # hash blocks: [1, 2, 3 (8 tokens), o1, o2] in whole 32-token blocks keep the first 32
        # tokens, 2 symbols (symbol 3 ends at 40); the tail state at 59 goes
        (16, seq(1, 2, 3, -1, -2), 59, (3, 40), [2, 5], (32, [32])),
    ],
)
def test_an_extent_of_whole_blocks_drops_the_states_past_it_from_the_plan(block, seq_, total, cut, cps, kept):
    """vLLM's extent (``kv_extent="blocks"``): the insert keeps whole engine blocks, and only the
    states inside them are planned for, so a cache of exactly that KV and one state takes it
    without evicting (mutation survivor of engine_tree.py: the checkpoints past the extent kept)."""
    from policies.base import EngineRules

    rules = EngineRules(kv_extent="blocks", extent_block=32 if block > 1 else 16)
    tree = EngineTree(
        rules,
        capacity_bytes=kept[0] + 10,
        kv_bytes_per_token=1,
        state_bytes=10,
        block_tokens=block,
        policy=LRULeafEviction(),
    )
    res = tree.insert(seq_, total, cps, now=1, cut=cut)
    tree.check_invariants()
    assert res.inserted and (tree.kv_tokens, depths(tree)) == kept
