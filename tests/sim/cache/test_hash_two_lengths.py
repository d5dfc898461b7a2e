"""A hash-block trace that gives one hash id two lengths: a whole block in one prompt, a partial
last block in another (Mooncake hashes a block's content, so its own traces never do; a
hand-made or converted one may).

The tree keeps each edge's tokens as the first insert counted them. Where a later sequence
matched such an edge whole and counted fewer tokens for it, the whole-edge step kept the edge's
end: rows ``(512 tokens, [0], no output)`` then ``(1 token + 3 output, [0])`` hung the second
request's output under the 512-token block, its decode state at 515 of its 4 tokens (``marconi
replay`` stopped with a ValueError), and its lookup hit the state at 512 (counted as a 1-token hit).
Rule: a hit is worth at most the request's own tokens for the block (the smaller length: a
transformer reuses the block's first tokens, a hybrid model has no state at the shorter length),
and no state or edge lies past the sequence's own tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.eviction import LRULeafEviction, MarconiEviction
from policies.sglang import SGLANG_RULES, UnifiedTwoListEviction
from sim.cache.engine_tree import EngineTree
from sim.cache.tree import HybridRadixTree, Span
from sim.cli import main
from sim.config import SimConfig
from sim.cost import get_model
from sim.engine.drivers import run as drive
from sim.engine.events import Admit, EventLog, Lookup
from sim.simulate import build
from traces.base import Request, Trace
from traces.registry import TraceOptions, load_trace

ROWS = [(5000, 512, 0, [0]), (6000, 1, 3, [0])]


def seq(*xs):
    return np.array(xs, dtype=np.int64)


def write_rows(path, rows):
    path.write_text(
        "".join(
            json.dumps(dict(timestamp=t, input_length=n, output_length=o, hash_ids=h)) + "\n" for t, n, o, h in rows
        )
    )
    return path


def trees(block=512, capacity=10**9):
    kw = dict(capacity_bytes=capacity, kv_bytes_per_token=1, state_bytes=10, block_tokens=block)
    return [HybridRadixTree(policy=LRULeafEviction(), **kw), EngineTree(policy=LRULeafEviction(), **kw)]


class Admits:
    """A listener keeping every admitted state's end position."""

    def __init__(self):
        self.positions = []

    def state_added(self, node, tag):
        self.positions.append(node.depth_tokens)

    def state_removed(self, node, tag):
        pass

    def kv_removed(self, tokens, tag):
        pass


# ------------------------------------------------------------------------------ the tree


@pytest.mark.parametrize("tree", trees(), ids=["core", "engine"])
def test_a_partial_block_after_the_same_hash_whole_adds_nothing_past_its_tokens(tree):
    """[0] as a whole 512-token prompt with its state at 512; then [0 (1 token), -1 (3 tokens)]
    with its decode state at 4: it is covered by the cached block's first token, and nothing of it
    can hang below the block (its output at 513..515, its state at 515, as before) nor sit at the
    block's end. Its lookup ([0] of 1 token) finds no state within its token; one of 512 tokens
    hits the state at 512."""
    log = Admits()
    tree.listener = log
    tree.insert(seq(0), 512, [1], now=1)
    planned = tree._planned_bytes(seq(0, -1), Span(2, 512, 4, (1, 1)), [2])
    res = tree.insert(seq(0, -1), 4, [2], now=2, cut=(1, 1))
    tree.check_invariants()
    assert res.inserted and (res.new_kv_tokens, res.new_states) == (0, 0) and planned == 0
    assert res.end_node.depth_tokens == 512  # the block it used
    assert log.positions == [512]
    assert tree.kv_tokens == 512 and tree.used_bytes == 512 + 10
    assert sorted(tree.checkpoints().values()) == [512]
    m = tree.match(seq(0), tokens=1)
    assert (m.hit_sym, m.hit_tokens, m.match_sym) == (0, 0, 1)
    m = tree.match(seq(0), tokens=512)
    assert (m.hit_sym, m.hit_tokens) == (1, 512)


@pytest.mark.parametrize("tree", trees(), ids=["core", "engine"])
def test_the_same_hash_partial_then_whole_keeps_the_shorter_block(tree):
    """The other order: [0 (1 token), -1 (3 tokens)] with states at 1 and 4, then [0] whole (512
    tokens) with a state at its end: the block stays 1 token long (the 511 other tokens are not
    cached), the state at 1 serves both (no second state), and a 512-token lookup of [0] hits 1
    token (the smaller length)."""
    log = Admits()
    tree.listener = log
    tree.insert(seq(0, -1), 4, [1, 2], now=1, cut=(1, 1))
    res = tree.insert(seq(0), 512, [1], now=2)
    tree.check_invariants()
    assert (res.new_kv_tokens, res.new_states) == (0, 0)
    assert log.positions == [1, 4]
    assert tree.kv_tokens == 4
    m = tree.match(seq(0), tokens=512)
    assert (m.hit_sym, m.hit_tokens) == (1, 1)


def test_a_lookup_ending_after_a_partial_block_splits_the_edge_there():
    """SGLang's lookup splits the edge its walk ends inside; uncapped (a preempted request's
    re-lookup), a prompt [1, 2 (8 tokens)] ends after its partial block inside the stored
    [1, 2, -1, -2] (43 tokens). The cut went a whole block on (at 32, not 24), so the same prompt's
    next insert hung its output at 32 + 5, past its 29 tokens, with ids of one length throughout.
    The cut is at 24 and the request's state at its end, 29."""
    tree = EngineTree(
        SGLANG_RULES,
        capacity_bytes=10**6,
        kv_bytes_per_token=1,
        state_bytes=10,
        block_tokens=16,
        policy=UnifiedTwoListEviction(),
    )
    tree.insert(seq(1, 2, -1, -2), 43, [4], now=1, cut=(2, 24))
    tree.lookup(seq(1, 2), None, now=2, tokens=24)
    assert sorted((n.depth_sym, n.depth_tokens) for n in tree.iter_nodes()) == [(0, 0), (2, 24), (4, 43)]
    res = tree.insert(seq(1, 2, -3), 29, [3], now=3, cut=(2, 24))
    tree.check_invariants()
    assert (res.new_kv_tokens, res.new_states) == (5, 1)
    assert sorted(tree.checkpoints().values()) == [29, 43]


def test_a_pure_transformer_reuses_the_shorter_length_only():
    """Without states the hit is the matched KV: the engine caps it at the prompt (1 token of the
    cached 512), and the second insert adds none (no KV past 512 for a 4-token request)."""
    tree = HybridRadixTree(
        capacity_bytes=10**9,
        kv_bytes_per_token=1,
        state_bytes=10,
        block_tokens=512,
        policy=LRULeafEviction(),
        hybrid=False,
    )
    tree.insert(seq(0), 512, [], now=1)
    res = tree.insert(seq(0, -1), 4, [], now=2, cut=(1, 1))
    tree.check_invariants()
    assert res.new_kv_tokens == 0 and tree.kv_tokens == 512
    assert max(n.depth_tokens for n in tree.iter_nodes()) == 512


# ------------------------------------------------------------------------------ through the simulator


def test_marconi_run_on_the_two_rows_counts_no_hit_and_places_no_state_past_a_request(tmp_path):
    """``marconi run --trace mooncake:FILE --policy marconi``: request 1 (1 prompt token) has no
    state within its token (the one at 512 is request 0's whole block): token hit rate 0 (1/513
    before); its decode state is not admitted (it was, at 515 of its 4 tokens)."""
    p = write_rows(tmp_path / "two.jsonl", ROWS)
    out = CliRunner().invoke(
        main,
        [
            "run",
            "--trace",
            f"mooncake:{p}",
            "--policy",
            "marconi",
            "--no-progress",
            "--columns",
            "all",
            "--format",
            "json",
        ],
    )
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.output)
    assert row["token_hit_rate"] == 0.0 and row["request_hit_rate"] == 0.0 and row["requests"] == 2

    trace = load_trace(f"mooncake:{p}", TraceOptions())
    for mode, sched in (("sequential", "auto"), ("des", "fcfs"), ("des", "continuous")):
        log = EventLog()
        sim = build(trace, SimConfig(policy="marconi", mode=mode, scheduler=sched), observers=(log,))
        drive(sim)
        sim.tree.check_invariants()
        admits = [(e.request.request_id, e.position) for e in log.events if isinstance(e, Admit)]
        lookups = [(e.request.request_id, e.hit_checkpoint, e.hit_tokens) for e in log.events if isinstance(e, Lookup)]
        assert admits == [(0, 512)], mode
        assert lookups == [(0, None, 0), (1, None, 0)], mode
        assert sim.tree.kv_tokens == 512


def test_a_transformer_hits_the_shorter_length(tmp_path):
    """llama-7b (no states) on the two rows: request 1 reuses its one token of the cached block
    (the smaller of the two lengths): hit rate 1 / 513."""
    p = write_rows(tmp_path / "two.jsonl", ROWS)
    trace = load_trace(f"mooncake:{p}", TraceOptions())
    sim = build(trace, SimConfig(policy="marconi", model="llama-7b", mode="sequential"))
    res = drive(sim)
    sim.tree.check_invariants()
    assert list(res.requests["hit_tokens"]) == [0, 1]
    assert sim.tree.kv_tokens == 512


@pytest.mark.parametrize("compat", ["paper", "paper-fixed"])
def test_the_artifact_replay_of_the_two_rows_hits_nothing_past_a_prompt(compat, tmp_path):
    """The Marconi artifact's replay (``sim.compat``, its own lookup) on the two rows: request 1
    finds no state within its one token (it hit request 0's state at 512, counted 1 token), and
    its tail state is not admitted past its 4 tokens."""
    p = write_rows(tmp_path / "two.jsonl", ROWS)
    trace = load_trace(f"mooncake:{p}", TraceOptions())
    log = EventLog()
    sim = build(trace, SimConfig(policy="marconi", mode="sequential", compat=compat), observers=(log,))
    res = drive(sim)
    sim.tree.check_invariants()
    assert list(res.requests["hit_tokens"]) == [0, 0]
    assert [(e.request.request_id, e.position) for e in log.events if isinstance(e, Admit)] == [(0, 512)]
    assert [e.hit_checkpoint for e in log.events if isinstance(e, Lookup)] == [None, None]


# ------------------------------------------------------------------------------ the invariant

B = 16


@st.composite
def two_length_traces(draw):
    """Hash-block requests over a few hash ids, each prompt's last block of any length (1..16), so
    one id is whole in one prompt and partial in another; arrivals may overlap."""
    n = draw(st.integers(2, 8))
    reqs = []
    for i in range(n):
        ids = draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
        last = draw(st.integers(1, B))
        n_out = draw(st.integers(0, 40))
        reqs.append(
            Request(
                session_id=i,
                turn=0,
                input_tokens=np.array(ids, dtype=np.int64),
                output_tokens=np.empty(0, dtype=np.int64),
                input_len=(len(ids) - 1) * B + last,
                output_len=n_out,
                arrival=draw(st.sampled_from([0.0, 0.001, 1.0])) * i,
            )
        )
    return Trace("two-lengths", reqs, closed_loop=False, block_tokens=B)


POLICIES = [
    ("marconi", {}),
    ("sglang+", {}),
    ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}),
    ("vanilla", {}),
]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    two_length_traces(),
    st.sampled_from(POLICIES),
    st.sampled_from([("sequential", "auto"), ("des", "fcfs"), ("des", "continuous")]),
    st.sampled_from([10**14, 3_000_000_000]),
    st.sampled_from(["marconi-7b", "llama-7b"]),
)
def test_no_state_or_hit_lies_past_its_request(trace, policy, mode, capacity, model):
    """Every admitted state lies within its request's tokens, every hit within its prompt, a
    hybrid hit exactly at its state's position, and the tree's totals stay exact."""
    name, knobs = policy
    log = EventLog()
    cfg = SimConfig(policy=name, capacity_bytes=capacity, mode=mode[0], scheduler=mode[1], model=model, **knobs)
    sim = build(trace, cfg, observers=(log,))
    drive(sim)
    sim.tree.check_invariants()
    at = {}
    for e in log.events:
        r = e.request if hasattr(e, "request") else None
        if isinstance(e, Admit):
            assert 0 < e.position <= r.input_len + r.output_len, (r, e)
            at[e.checkpoint] = e.position
        elif isinstance(e, Lookup):
            assert 0 <= e.hit_tokens <= r.input_len, (r, e)
            if e.hit_checkpoint is not None:
                assert at[e.hit_checkpoint] == e.hit_tokens, (r, e)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=4),  # prompt hash ids
            st.integers(1, 4),  # prompt's last block: tokens
            st.integers(0, 2),  # output symbols (the last one 1..4 tokens)
            st.integers(1, 4),
            st.booleans(),  # a state at the prompt's end
        ),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from([10**9, 60, 25]),
    st.sampled_from(["lru", "marconi", "sglang", "engine-lru"]),
    st.booleans(),
)
def test_random_inserts_of_two_length_ids_keep_the_tree_exact(ops, capacity, kind, capped):
    """Direct inserts (4-token blocks) of prompts whose ids take any length as the last block, with
    output symbols after it (``cut``), each after its lookup (SGLang's splits the edge its walk
    ends inside; ``capped``: at input_len - 1): each insert adds exactly the bytes it planned,
    admits no state past its own tokens, and a lookup with the prompt's token count never hits
    past it."""
    kw = dict(capacity_bytes=capacity, kv_bytes_per_token=1, state_bytes=3, block_tokens=4)
    if kind == "marconi":
        tree = HybridRadixTree(policy=MarconiEviction(get_model("marconi-7b"), MarconiEviction.Params(alpha=1.0)), **kw)
    elif kind == "sglang":
        tree = EngineTree(SGLANG_RULES, policy=UnifiedTwoListEviction(), **kw)
    else:
        tree = (EngineTree if kind == "engine-lru" else HybridRadixTree)(policy=LRULeafEviction(), **kw)
    log = Admits()
    tree.listener = log
    out = -1
    for i, (ids, last, n_out_sym, out_last, prompt_state) in enumerate(ops):
        tok_in = (len(ids) - 1) * 4 + last
        outs = list(range(out, out - n_out_sym, -1))
        out -= n_out_sym
        s = seq(*ids, *outs)
        total = tok_in + (max(n_out_sym - 1, 0) * 4 + out_last if n_out_sym else 0)
        cut = (len(ids), tok_in) if n_out_sym else None
        m = tree.lookup(seq(*ids), (tok_in - 1) // 4 if capped else None, tokens=tok_in, now=float(i))
        assert m.hit_tokens <= tok_in
        cps = sorted({len(ids), len(s)} if prompt_state else {len(s)})
        planned = tree._planned_bytes(s, Span(len(s), 4, total, cut), cps)
        before, log.positions = tree.used_bytes, []
        res = tree.insert(s, total, cps, now=float(i) + 0.5, cut=cut)
        tree.check_invariants()
        assert all(0 < p <= total for p in log.positions), (log.positions, total)
        if res.inserted and res.evicted_states == 0 and res.evicted_kv_tokens == 0:
            assert tree.used_bytes - before == planned
        assert all(n.depth_tokens <= n.depth_sym * 4 for n in tree.iter_nodes())  # a block at most a symbol
