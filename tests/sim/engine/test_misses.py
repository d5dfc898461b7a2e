"""Why a request missed (``sim.engine.misses``, issue 43 item 3): hand-worked traces where each
cause is the only one, the causes adding up to the missed tokens on every request of real runs,
the shadow trie against a brute-force longest common prefix, and the outputs (requests.parquet
columns, ``--columns misses``, ``--format json``, ``marconi plot --kind misses``).

The tiny model (``tests/policies/engine_cases.TINY``): 2 bytes of KV per token, one 16-byte state.
X is a 10-token prompt, O its 5 output tokens; ``sglang+`` stores input + output with a state at
the end (the paper's rule, no lookup cap), so a request sending X + O again can hit all 15 tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "policies"))
from engine_cases import TINY, cat, one_per_session, run, toks  # noqa: E402

from sim.cli import main  # noqa: E402
from sim.config import SimConfig  # noqa: E402
from sim.engine.drivers import run as drive  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces import TraceOptions, load_trace  # noqa: E402
from traces.base import Request, Trace  # noqa: E402
from sim.engine.misses import CAUSES, ShadowTrie  # noqa: E402

X, O = toks(0, 10), toks(100, 5)
XO = cat(X, O)
W = (toks(500, 40), toks(600, 5))  # 40 + 5 unrelated tokens: 96 bytes with their state


def causes(trace, policy, **cfg):
    got, sim = run(trace, policy, spec=TINY, **cfg)
    cols = sim.misses.columns()
    rows = [{c: int(cols[f"miss_{c}"][i]) for c in CAUSES if cols[f"miss_{c}"][i]} for i in range(len(got))]
    return got, rows, cols["miss_evicted_at_s"]


def test_never_shared_is_the_first_request():
    got, rows, _ = causes(one_per_session((X, O)), "sglang+")
    assert got == [0] and rows == [{"never_shared": 10}]


def test_no_checkpoint_only():
    """A prompt that is the first 7 tokens of X: all shared, but sglang+ placed no state inside X
    (its only state is at 15, input + output)."""
    got, rows, _ = causes(one_per_session((X, O), (toks(0, 7), toks(200, 5))), "sglang+")
    assert got == [0, 0] and rows[1] == {"no_checkpoint": 7}


def test_last_token_rule_only():
    """SGLang no_buffer stores input + output - 1 = 14 tokens (state at 14): the follow-up sending
    X + O (15 tokens) hits 14; the 15th token is the previous request's last sampled token."""
    got, rows, _ = causes(one_per_session((X, O), (XO, toks(200, 5))), "sglang", mamba_radix_cache_strategy="no_buffer")
    assert got == [0, 14] and rows[1] == {"last_token_rule": 1}


def test_lookup_cap_is_the_last_token_rule():
    """An identical prompt under vLLM (block 16): align mode keeps one prompt state, at the last
    block boundary that leaves a token to recompute, ``(n - 1) // 16 * 16`` (vLLM 0.34.0
    ``get_mamba_prefill_checkpoint_position``). 33 tokens: the state at 32, the lookup stops at 32,
    and only the 33rd token, the lookup rule's, is missed. 32 tokens: the state sits at 16 (not at
    32, which the lookup could not reach anyway), so 15 tokens had no state and one is the rule's."""
    p = toks(0, 33)
    got, rows, _ = causes(one_per_session((p, O), (p, toks(200, 5))), "vllm", block_size=16)
    assert got == [0, 32] and rows[1] == {"last_token_rule": 1}
    p = toks(0, 32)
    got, rows, _ = causes(one_per_session((p, O), (p, toks(200, 5))), "vllm", block_size=16)
    assert got == [0, 16] and rows[1] == {"no_checkpoint": 15, "last_token_rule": 1}


def test_evicted_only_and_when():
    """Capacity 100 B: X + O with its state (46 B) is evicted at t = 1 to insert W (96 B); the
    third request sends X + O and finds nothing."""
    got, rows, when = causes(one_per_session((X, O), W, (XO, toks(200, 5))), "sglang+", capacity=100)
    assert got == [0, 0, 0] and rows[2] == {"evicted": 15} and when[2] == 1.0


def test_insert_rejected_only():
    """Capacity 40 B: X + O with its state needs 46 B, so its insert is rejected."""
    got, rows, _ = causes(one_per_session((X, O), (XO, toks(200, 5))), "sglang+", capacity=40)
    assert got == [0, 0] and rows[1] == {"insert_rejected": 15}


def test_held_by_running_only():
    """Continuous batching, capacity 100 B: W's prefill reserves its 40 tokens of KV and a state
    slot (96 B) while it runs, evicting X + O's entry at t = 1; the third request misses it."""
    got, rows, when = causes(
        one_per_session((X, O), W, (XO, toks(200, 5))), "sglang+", capacity=100, mode="des", scheduler="continuous"
    )
    assert got == [0, 0, 0] and rows[2] == {"held_by_running": 15} and when[2] == 1.0


@pytest.mark.parametrize(
    "policy,cfg",
    [
        ("sglang", {}),
        ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}),
        ("vllm", {}),
        ("trtllm", {"periodic_snapshot_interval": 256}),
        ("lmdeploy", {}),
        ("marconi", {"alpha": 1.0}),
        ("vanilla", {}),
    ],
)
@pytest.mark.parametrize("scheduler", ["fcfs", "continuous"])
def test_causes_add_up_to_the_missed_tokens(policy, cfg, scheduler):
    """On 6 sessions of synthetic:chat at a capacity that evicts: per request, hit + every cause =
    the prompt, each cause >= 0, never_shared = 0 only when the prompt is shared entirely."""
    trace = load_trace("synthetic:chat", TraceOptions(sessions=6))
    config = SimConfig(policy=policy, model="qwen3.5-9b", capacity_bytes=10**9, scheduler=scheduler, **cfg)
    res = drive(build(trace, config))
    df = res.requests
    total = df["hit_tokens"] + sum(df[f"miss_{c}"] for c in CAUSES)
    assert (total == df["input_tokens"]).all()
    assert all((df[f"miss_{c}"] >= 0).all() for c in CAUSES)
    assert df["miss_never_shared"].iloc[0] == df["input_tokens"].iloc[0]
    s = res.summary
    assert s.missed_evicted == df["miss_evicted"].sum() and s.missed_never_shared == df["miss_never_shared"].sum()


@pytest.mark.parametrize("capacity", [10**9, 228])
def test_two_losses_split_the_gap(capacity):
    """vLLM with EAGLE, block 16, a 50-token prompt P sent again by the third request: the prompt's
    state at 48 is kept one block earlier, at 32 (the 16 tokens between are the speculative loss);
    at 228 B the 80-token second request evicts that state too, so (0, 32] is evicted, (32, 48]
    speculative, 49 the grid and 50 the lookup cap. (vLLM's running blocks and its padded state
    page are charged: below 228 B the first request's own blocks leave no room to cache it.)"""
    P = toks(0, 50)
    trace = one_per_session((P, O), (toks(500, 80), toks(600, 5)), (P, toks(200, 5)))
    got, rows, when = causes(trace, "vllm", block_size=16, speculative_method="eagle", capacity=capacity)
    if capacity > 10**6:
        assert got[2] == 32 and rows[2] == {"speculative": 16, "no_checkpoint": 1, "last_token_rule": 1}
    else:
        assert got[2] == 0 and rows[2] == {"evicted": 32, "speculative": 16, "no_checkpoint": 1, "last_token_rule": 1}
        assert when[2] == 1.0


def hb(*pairs) -> Trace:
    """A 16-token hash-block trace of (prompt symbols, prompt tokens) pairs, outputs as lengths only
    (5 tokens), one session each, as Mooncake's rows."""
    return Trace(
        "hb",
        [
            Request(session_id=i, turn=0, input_tokens=s, output_tokens=toks(0, 0), input_len=n, output_len=5)
            for i, (s, n) in enumerate(pairs)
        ],
        block_tokens=16,
    )


@pytest.mark.parametrize("capacity", [10**9, 228])
def test_two_losses_split_the_gap_on_a_hash_block_trace(capacity):
    """The same three requests on a 16-token hash-block trace (symbols are blocks, the prompt's
    last block partial: 50 tokens in 4 symbols, outputs given as lengths only, as Mooncake's): the
    ledger works in symbols and prices in tokens, so the split is the token trace's, token for token
    (the speculative state at block 3 = token 48, the evicted one at block 2 = token 32)."""

    P = toks(0, 4)
    trace = hb((P, 50), (toks(500, 5), 80), (P, 50))
    got, rows, when = causes(trace, "vllm", block_size=16, speculative_method="eagle", capacity=capacity)
    assert rows[0] == {"never_shared": 50} and rows[1] == {"never_shared": 80}
    if capacity > 10**6:
        assert got[2] == 32 and rows[2] == {"speculative": 16, "no_checkpoint": 1, "last_token_rule": 1}
    else:
        assert got[2] == 0 and rows[2] == {"evicted": 32, "speculative": 16, "no_checkpoint": 1, "last_token_rule": 1}
        assert when[2] == 1.0


def test_a_state_at_a_hash_block_prompts_partial_end_is_counted_where_it_went():
    """A 50-token prompt in 4 blocks of 16 (the last partial) sent twice, then an unrelated request,
    then the prompt again. Marconi keeps a state at the prompt's end (token 50, block 4) on the
    second request's branch; with room the fourth request hits all 50 tokens. At 300 B the third
    request evicts that state at t = 2: the 50 tokens are ``evicted`` (as on a token trace), not
    ``no_checkpoint`` (the state sits inside the prompt's last block, not on a whole-block depth)."""

    P = toks(0, 4)
    trace = hb((P, 50), (P, 50), (toks(500, 5), 80), (P, 50))
    got, rows, _ = causes(trace, "marconi")
    assert got == [0, 0, 0, 50] and rows[1] == {"no_checkpoint": 50} and rows[3] == {}
    got, rows, when = causes(trace, "marconi", capacity=300)
    assert got[3] == 0 and rows[3] == {"evicted": 50} and when[3] == 2.0


@pytest.mark.parametrize("tokens", [50, 64])  # the prompt's last block partial, or whole
@pytest.mark.parametrize("output_symbols", [True, False])
def test_a_state_past_a_hash_block_prompt_is_no_checkpoint_for_it(tokens, output_symbols):
    """sglang+ keeps one state per request, at the end of input + output (past the prompt, in the
    output's block). At 150 B, W (80 tokens) finds no room beside the first request: its insert is
    rejected, or the first request's state evicted. Either way the third request, the first prompt
    again, had no state inside its prompt to find: no_checkpoint, as with room to spare, whether the
    trace gives the outputs symbols (as the Mooncake loader does) or lengths only (the simulation
    numbers them; the ledger had placed such a state at the prompt's last block)."""

    def hb(*pairs):
        reqs = [
            Request(session_id=i, turn=0, input_tokens=s, input_len=n, output_len=5, output_tokens=out)
            for i, (s, n, out) in enumerate(pairs)
        ]
        return Trace("hb", reqs, block_tokens=16)

    P = toks(0, 4)
    out = (lambda i: toks(-10 * i - 10, 1)) if output_symbols else (lambda i: toks(0, 0))
    trace = hb((P, tokens, out(0)), (toks(500, 5), 80, out(1)), (P, tokens, out(2)))
    for capacity in (10**9, 150):
        got, rows, when = causes(trace, "sglang+", capacity=capacity)
        assert got[2] == 0 and rows[2] == {"no_checkpoint": tokens} and np.isnan(when[2])


@pytest.mark.parametrize(
    "policy,cfg,hit,row",
    [
        # stores X + O less its last token (14) with the state there: the 15th is the rule's
        ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}, 14, {"last_token_rule": 1}),
        # a state at X's end (10) and the store's end (14): 4 tokens without one, then the rule's
        ("lmdeploy", {}, 10, {"no_checkpoint": 4, "last_token_rule": 1}),
        ("sglang+", {}, 15, {}),  # the paper's rule stores the last token too
    ],
)
def test_last_token_rule_where_an_earlier_request_ends_inside_the_prompt(policy, cfg, hit, row):
    """The next turn of a chat: X + O + Y (20 tokens) after X -> O. The prompt shares all of the
    first request (15 tokens) and goes on, so the lookup cap (19) takes nothing: the token lost is
    the first request's last one, which an engine storing input + output - 1 never stored."""
    Y = toks(300, 5)
    got, rows, _ = causes(one_per_session((X, O), (cat(XO, Y), toks(200, 5))), policy, **cfg)
    assert got == [0, hit] and rows[1] == {"never_shared": 5, **row}


def test_a_preempted_request_keeps_its_first_shared_prefix():
    """mooncake:sample at 40GB under continuous batching preempts requests; looked up again, a
    request finds itself in the trie, so the shared prefix of its first lookup is kept: never-shared
    tokens are the same per request as under fcfs (where nothing is preempted), except the tokens a
    preempted request reuses from its own prefill chunks (SGLang publishes every chunk, so they
    are in the cache when it comes back): those are a hit past the shared prefix. SGLang's own
    admission holds back every running request's remaining output (``reserves_output``), so it
    all but never preempts (none here): the scenario turns that reservation off, and SGLang's
    retraction (``retracts_by_length``: it retracts decoding requests only, fewest outputs first,
    to the end of the queue, where their prompts are evicted before they come back: none reuses
    its own here) for vLLM's, which preempts the newest, often mid-prefill, back to the front."""
    from policies.sglang_current import SglangAdmission

    trace = load_trace("mooncake:sample", TraceOptions())
    rows = {}
    for scheduler in ("fcfs", "continuous"):
        config = SimConfig(policy="sglang", model="qwen3-next-80b-a3b", capacity_bytes=40 * 10**9, scheduler=scheduler)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(SglangAdmission, "reserves_output", False)
            mp.setattr(SglangAdmission, "retracts_by_length", False)
            res = drive(build(trace, config))
        rows[scheduler] = res
    assert rows["continuous"].summary.preemptions > 0
    fcfs, cont = rows["fcfs"].requests, rows["continuous"].requests
    shared = fcfs["input_tokens"] - fcfs["miss_never_shared"]
    own = (cont["hit_tokens"] - shared).clip(lower=0)
    assert (own > 0).any()
    assert (fcfs["miss_never_shared"] == cont["miss_never_shared"] + own).all()
    # the ledger's own count of that reuse: the same tokens, request by request, and none under fcfs
    assert (cont["hit_after_preemption"] == own).all() and (fcfs["hit_after_preemption"] == 0).all()
    assert rows["continuous"].summary.hit_after_preemption == int(own.sum()) > 0
    assert rows["fcfs"].summary.hit_after_preemption == 0


def test_run_says_when_reuse_after_preemptions_is_a_material_share_of_the_hits():
    """``marconi run`` notes a policy whose preempted requests' reuse past their first lookup's
    shared prefix is at least 5 % of its hit tokens (``PREEMPTION_NOTE_SHARE``), not below."""
    from types import SimpleNamespace

    from sim.cli.run import preemption_note

    def row(policy, hit, after):
        return SimpleNamespace(policy=policy, hit_tokens=hit, hit_after_preemption=after)

    assert preemption_note([row("vllm+", 1000, 49), row("marconi", 0, 0)]) == ""
    line = preemption_note([row("vllm+", 1000, 49), row("sglang", 1000, 50), row("lmdeploy", 200, 200)])
    assert line.startswith("note: share of hit tokens reused by preempted requests")
    assert line.endswith(": sglang 5.0%, lmdeploy 100.0%")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=12))
def test_shadow_trie_walk_is_the_longest_common_prefix(seqs):
    """Against brute force: after inserting some sequences, walking any sequence gives the longest
    prefix it shares with one of them."""
    trie = ShadowTrie()
    arrays = [np.array(s, dtype=np.int64) for s in seqs]
    for k, a in enumerate(arrays):
        want = 0
        for b in arrays[:k]:
            m = 0
            while m < min(len(a), len(b)) and a[m] == b[m]:
                m += 1
            want = max(want, m)
        assert trie.walk(a)[0] == want
        trie.insert(a)
        # the deepest node's max_end is the longest sequence through it
        n, path = trie.walk(a)
        assert n == len(a) and path[-1].max_end >= len(a)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=10))
def test_walk_then_add_builds_the_same_trie_as_insert(seqs):
    """The ledger walks a sequence once and adds it where the walk ended (``add``): every later
    walk answers as with ``insert``, and the longest sequence through each point is kept."""
    a, b = ShadowTrie(), ShadowTrie()
    arrays = [np.array(s, dtype=np.int64) for s in seqs]
    for x in arrays:
        a.insert(x)
        pos, path = b.walk(x)
        b.add(x, pos, path)
    for x in arrays:
        for cut in (len(x), len(x) // 2 + 1):
            y = x[:cut]
            (pa, qa), (pb, qb) = a.walk(y), b.walk(y)
            assert pa == pb and qa[-1].max_end == qb[-1].max_end  # (insert may split where add need not)


def test_run_prints_and_writes_the_misses(tmp_path):
    base = ["run", "--trace", "synthetic:chat", "--sessions", "3", "--model", "qwen3.5-9b", "--no-progress"]
    res = CliRunner().invoke(
        main, [*base, "--policy", "sglang,vllm", "--columns", "misses", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    head = res.stdout.splitlines()
    assert "missed tokens by cause" in head[1] and "never shared" in head[2] and "last token" in head[2]
    import pandas as pd

    df = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert {f"miss_{c}" for c in CAUSES} | {"miss_evicted_at_s"} <= set(df.columns)
    res = CliRunner().invoke(main, [*base, "--policy", "sglang", "--format", "json"])
    row = json.loads(res.stdout)[0]
    assert all(f"missed_{c}" in row for c in CAUSES)
    # and the reuse after preemptions, as summary.json has it (docs/misses.md: it was in summary.json
    # only, though both said `--format json` carries it)
    written = {r["policy"]: r for r in json.loads((tmp_path / "o" / "summary.json").read_text())}
    assert row["hit_after_preemption"] == written["sglang"]["hit_after_preemption"]


def _marks_oracle_ops():
    """Interleaved inserts and marks: (sequence, [(depth, kind), ...]) per step."""
    seq = st.lists(st.integers(0, 2), min_size=1, max_size=10)
    return st.lists(st.tuples(seq, st.lists(st.integers(1, 10), max_size=3)), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(_marks_oracle_ops(), st.booleans())
@example([([0, 0, 0, 0], [1, 4]), ([0, 0, 1], [])], False)  # a split at 2 between the marks at 1 and 4
@example([([0, 0, 0, 0], [1, 4]), ([0, 0, 1], [])], True)
def test_marks_survive_the_splits_of_later_sequences(ops, walk_then_add):
    """A mark names a prefix (the symbols up to its depth): whatever sequences come later and split
    the edge holding it, ``node_at`` finds it at that prefix, the latest mark of the prefix, with
    ``insert`` and with ``walk`` + ``add`` alike. Oracle: a dict keyed by the prefix itself."""
    trie, want, k = ShadowTrie(), {}, 0
    for s, depths in ops:
        x = np.array(s, dtype=np.int64)
        if walk_then_add:
            trie.add(x, *trie.walk(x))
        else:
            trie.insert(x)
        for d in depths:
            d = min(d, len(x))
            k += 1
            trie.mark(x, d, "evicted", float(k))
            want[tuple(s[:d])] = ("evicted", float(k))
    for prefix, mark in want.items():
        x = np.array(prefix, dtype=np.int64)
        node = trie.node_at(x, len(prefix))
        assert node is not None and node.marks is not None and node.marks.get(len(prefix)) == mark
    # and no mark is held twice (a split hands each to exactly one side)
    held = [d for node in _nodes(trie.root) if node.marks for d in node.marks]
    assert len(held) == len(want)


def _nodes(node):
    yield node
    for c in node.children.values():
        yield from _nodes(c)
