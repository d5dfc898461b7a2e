"""Hand-worked cases for older rules of the engine tree (``sim/cache/engine_tree.py``), the core
tree (``sim/cache/tree.py``) and the drivers (``sim/engine/drivers.py``) that no test pinned:
each was a surviving mutant of ``benchmarks/mutation.py`` (issue 43; the run and the mutants:
``benchmarks/results/2026-12-05-mutation-older-tree/``). Each test states the behaviour, worked by
hand, not the mutant."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tree_cases import KV, STATE, Clocked, engine_tree

from policies.base import EngineRules
from policies.lmdeploy import TieredLRUEviction, block_rules
from sim.config import SimConfig
from sim.engine.drivers import run as drive
from sim.simulate import build

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "policies"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))
from engine_cases import TIMING, TINY, arrivals, cat, one_per_session, run, state_depths, toks  # noqa: E402  (tests/policies)


def _tree(rules, *, block_tokens=1, capacity=10**6, states=None):
    return engine_tree(rules, TieredLRUEviction(), capacity=capacity, block_tokens=block_tokens, states=states)


def test_an_insert_reports_the_frozen_tail_a_state_victim_gives_back():
    """LMDeploy's trie (16-token blocks, frozen partial blocks, one state slot): A (33 tokens, a
    checkpoint at 33) holds 33 trie tokens and a frozen block for its partial tail. B (32 tokens,
    a checkpoint at 32) needs the slot: A's state goes (a state victim: its KV stays) and with it
    the one token only A's frozen block held (the trie keeps whole blocks), so B's insert reports
    1 state and 1 KV token evicted. Mutation survivor ``-m engine_tree --seed 1``:
    ``drop_state``'s freed KV count (``kv += before - self.kv_tokens``) with the sign flipped."""
    rules = block_rules(16)
    tree = _tree(rules, capacity=64 * 16 * KV + STATE, states=1)
    a, b = np.full(33, 1, dtype=np.int64), np.full(32, 2, dtype=np.int64)
    assert tree.insert(a, 33, [33], tree.set_time(1.0)).evicted_kv_tokens == 0
    assert (tree.kv_tokens, tree.frozen_tokens) == (33, 15)
    res = tree.insert(b, 32, [32], tree.set_time(2.0))
    assert (res.inserted, res.evicted_states, res.evicted_kv_tokens) == (True, 1, 1)
    assert (tree.kv_tokens, tree.frozen_tokens, tree.stats.kv_tokens_evicted) == (64, 0, 1)
    assert state_depths(tree) == [32]
    tree.check_invariants()


def test_a_path_leaving_a_cached_edge_past_the_new_snapshot_does_not_keep_the_older_one():
    """TensorRT-LLM's one page per block on a hash-block trace (4 tokens a symbol, 32-token
    blocks): A = symbols 0..7 with a snapshot at symbol 1 (token 4); edges [0, 4) and [4, 32). N
    = symbols 0, 1, 2, 3, 9 with a snapshot at symbol 3 (token 12), in the same block: N leaves
    A's edge at symbol 3, token 4 + 3 x 4 = 16, past 12, so no cached path branches off between 4
    and 12 and N's page replaces A's (``replace_page``): one state, at 12. Mutation survivor
    ``-m engine_tree --seed 1``: the former ``_branches`` (before the first-created-block rule)
    placing the edge's branch point at ``m / block_tokens`` tokens (4.75, inside [4, 12): both
    kept)."""
    tree = _tree(EngineRules(snapshot_block=32), block_tokens=4)
    tree.insert(np.arange(8, dtype=np.int64), 32, [1], tree.set_time(1.0))
    assert state_depths(tree) == [4]
    tree.insert(np.array([0, 1, 2, 3, 9]), 20, [3], tree.set_time(2.0))
    assert state_depths(tree) == [12] and tree.states_replaced == 1
    tree.check_invariants()


def test_a_snapshot_at_a_node_is_given_up_for_a_deeper_state_on_another_branch_below_it():
    """TensorRT-LLM's blocks of 8: A = 0..7 with a snapshot at 7; B = 0..3, 99 (no snapshot)
    splits A's edge at 4. N = 0..3, 99, 100 with a snapshot at 4, where the split left a node:
    A's state at 7 is in the same block (0, 8] and extends N's first 4 tokens, though on the
    other branch below the node, so N's page is not kept (``_snapshotSsmToTreeBlock`` returns:
    the block's page covers as much). Mutation survivor ``-m engine_tree --seed 2``:
    the former ``_block_states`` walking past the node at exactly 4 (``>``) and looking below N's own branch
    only (both kept)."""
    tree = _tree(EngineRules(snapshot_block=8))
    tree.insert(np.arange(8, dtype=np.int64), 8, [7], tree.set_time(1.0))
    tree.insert(np.array([0, 1, 2, 3, 99]), 5, [], tree.set_time(2.0))
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n is not tree.root) == [4, 5, 7, 8]
    tree.insert(np.array([0, 1, 2, 3, 99, 100]), 6, [4], tree.set_time(3.0))
    assert state_depths(tree) == [7] and tree.states_replaced == 1
    tree.check_invariants()


def test_under_fcfs_a_paper_policy_pins_a_queued_requests_hit_from_its_arrival():
    """The paper's policies look a request up when it arrives and lock its hit while it queues
    (the Marconi artifact looks a request up once); only the engine presets that rematch are
    looked up when a server takes them. ``vllm+`` (32-token grid), the tiny model (a token 2 B, a
    state 16 B), 230 B, des, ``--scheduler fcfs``, one server: r0 = P (32 tokens) is cached; r1 =
    L (64 tokens) takes the server at t = 1; r2 = P + 16 tokens arrives at t = 1.0005 and queues,
    its hit (P's 32 tokens) pinned. L's inserts need the room P holds and are refused (2 rejected
    inserts), so r3 = L + 16 tokens (t = 3) reuses nothing. Unpinned, P went for L while r2 queued
    and r3 reused 32 of L's tokens. Mutation survivor ``-m drivers``: the fcfs lookup at the
    arrival with ``lock=False``."""
    p, big = toks(0, 32), toks(100, 64)
    trace = arrivals(
        [
            (p, 1, 0.0),
            (big, 1, 1.0),
            (np.concatenate([p, toks(300, 16)]), 1, 1.0005),
            (np.concatenate([big, toks(500, 16)]), 1, 3.0),
        ]
    )
    cfg = SimConfig(policy="vllm+", model="qwen3.5-9b", capacity_bytes=230, mode="des", scheduler="fcfs")
    res = drive(build(trace, cfg, spec=TINY, timing=TIMING))
    assert list(res.requests.sort_values("request_id")["hit_tokens"]) == [0, 0, 32, 0]
    assert res.summary.rejected_inserts == 2


def test_under_fcfs_the_replay_tuner_counts_arrivals_and_tunes():
    """des, ``--scheduler fcfs``: each arrival is handed to the tuner before its server takes it
    (``_tune_before``: the window counts arrivals). Marconi with ``--tuner replay`` on the FLOP-wins
    trace (4 shared 2,000-token documents between short one-off requests, 20 rounds; 1 GB): the
    first eviction comes at the 15th request, so the window is 5 x 15 and the tuner replays the
    first 75 requests and picks alpha 0.1 (LRU lets the short requests push the documents out).
    Without the arrivals counted the tuner saw no request and never tuned. Mutation survivor
    ``-m drivers``: the des ``_tune_before`` call dropped (the continuous scheduler calls it on its
    own, so only fcfs shows it)."""
    from test_tuning import GB, _flop_wins_trace  # tests/sim/tuning

    cfg = SimConfig(
        policy="marconi",
        mode="des",
        scheduler="fcfs",
        alpha="auto",
        tuner="replay",
        capacity_bytes=GB,
        tuning_workers=1,
    )
    sim = build(_flop_wins_trace(), cfg)
    summary = drive(sim).summary
    assert sim.tuner.n_before == 15
    assert [(h["at_request"], h["choice"]) for h in sim.tuner.history] == [(75, 0.1)]
    assert summary["tuned_choice"] == "0.1"


def test_the_first_session_starts_at_zero_under_either_arrival_kind():
    """Session i starts at i / rate (``uniform``, the paper's) or after seeded exponential gaps of
    mean 1 / rate (``poisson``); either way session 0 starts at t = 0, so a Poisson run is not
    shifted against a uniform one. 20,000 sessions at 2 a second: gaps of mean 0.5 s (within 2 %).
    Mutation survivor ``-m drivers --seed 2``: the first gap 1.0 instead of 0."""
    from sim.engine.drivers import session_start_times

    assert list(session_start_times(3, 2.0, "uniform", 0)) == [0.0, 0.5, 1.0]
    starts = session_start_times(20_000, 2.0, "poisson", 0)
    assert starts[0] == 0.0 and (np.diff(starts) > 0).all()
    assert abs(starts[-1] / (len(starts) - 1) - 0.5) < 0.01
    assert list(session_start_times(4, 2.0, "poisson", 7)) == list(session_start_times(4, 2.0, "poisson", 7))


def test_belady_indexes_a_stored_output_longer_than_every_prompt():
    """``belady``'s next-use index hashes the tree's root paths, whose edges may hold a request's
    output too: its power table must reach the longest stored sequence, not only the longest
    prompt. The tiny model, 150 B, sequential: r0 = A (10 tokens, 30 out: an edge of 30 output
    tokens), r1, r2 two unrelated 10-token prompts, r3 = A + 5 tokens; r2's insert evicts (belady
    asks for every candidate's next use, A's output edge included). The run ends with hits 0, 0,
    0, 0 and states at 10, 10 and 15. Mutation survivor ``-m drivers --seed 2``: the table sized
    by the shortest stored sequence (an IndexError at depth 40)."""
    trace = one_per_session(
        (toks(0, 10), toks(1000, 30)),
        (toks(100, 10), toks(0, 0)),
        (toks(200, 10), toks(0, 0)),
        (cat(toks(0, 10), toks(50, 5)), toks(0, 0)),
    )
    got, sim = run(trace, "belady", spec=TINY, capacity=150)
    assert got == [0, 0, 0, 0]
    assert state_depths(sim.tree) == [10, 10, 15]


def test_the_blocks_under_a_block_count_one_path_inside_one_edge():
    """``EngineTree._block_children`` (what ``_reachable_hit`` compares with TensorRT-LLM's 32
    children of a block): the radix-tree blocks of 8 tokens that hang under a sequence's block.
    A = 0..23 and B = A's first 20 tokens, 100..103: one edge 0..20, two branches below it. The
    block (8, 16] lies inside that edge: one block, whatever hangs below 16; the block (16, 24]
    starts inside it and the edge branches inside the block: two. Mutation survivor ``-m
    engine_tree --seed 1``: the one-path test ``depth >= end or no children`` with ``and`` (the
    branches below 16 counted for (8, 16]); no caller reaches that case with the edge past the
    block's end (the hit it checks ends inside the block), so the count is pinned here."""
    tree = _tree(EngineRules(snapshot_block=8))
    a = np.arange(24, dtype=np.int64)
    tree.insert(a, 24, [24], tree.set_time(1.0))
    tree.insert(np.concatenate([np.arange(20), np.arange(100, 104)]), 24, [24], tree.set_time(2.0))
    assert sorted((n.depth_tokens, len(n.children)) for n in tree.iter_nodes() if n is not tree.root) == [
        (20, 2),
        (24, 0),
        (24, 0),
    ]
    assert (tree._block_children(a, 8), tree._block_children(a, 16)) == (1, 2)


def test_older_copies_of_recomputed_blocks_hang_on_the_node_holding_each_block():
    """vLLM's duplicate KV (``BlockHashToBlockMap.insert``, ``block_pool.py`` L78-L82): a request
    that hit the state at 2 of A = 1..6 (KV to 6) computes tokens 3..6 again and caches them a
    second time; the older copies stay in the free queue, each on the node that holds its block.
    Another request's insert (1..4, 70, 71) splits A's edge at 4 before the request's own insert
    (1..8, extending the lower part in place to 8): blocks 3 and 4 are the upper node's (depth
    4), 5 and 6 the node ending at 8. Mutation survivor ``-m engine_tree --seed 2`` (at 3636826):
    the recomputed blocks' ends counted up from the node's end (``+ j``), which put all four on
    the lower node."""
    from policies.vllm_current import VllmFreeQueueEviction

    c = Clocked(engine_tree(EngineRules(duplicate_kv=True), VllmFreeQueueEviction(), capacity=100, kv=1, state=4))
    tree, insert = c.tree, c.insert
    insert([1, 2, 3, 4, 5, 6], [2])
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    assert (m.hit_tokens, m.match_tokens) == (2, 6)
    insert([1, 2, 3, 4, 70, 71], [])
    insert([1, 2, 3, 4, 5, 6, 7, 8], [8])
    tree.cache_again(m)
    assert tree.copy_tokens == 4
    copies = {n.depth_tokens: sorted(-e[2] for e in tree._node_copies.get(n, [])) for n in tree.iter_nodes()}
    assert (copies[4], copies[8]) == ([3, 4], [5, 6])
    tree.check_invariants()


def test_older_copies_at_equal_recency_go_deepest_block_first_whoever_queued_them():
    """vLLM's duplicate KV, the order of older copies in the free queue: at equal recency the
    deeper block goes first, then the copy queued first, whether a request's insert queued it
    (``cache_again``) or a later hit re-queued it (``refresh_hit``: the hit touches the first copy
    cached, which takes the node's place). P = 1..6; A = P, 10, 11 (states at 2 and 8) and B = P,
    20, 21 (a state at 8) make N = (2, 6] a branch node. R1 = P, 30, 31 hits 2 and computes 3..6
    again; its insert (a state at 8) refreshes N (t = 4) and queues R1's older copies. R2 = P, 40,
    41 looks up at t = 5 (N at 4); X (unrelated) goes in; H = P, 10, 11, 12 hits A's state and
    re-queues R1's copies at N's recency before it, 4; R2's insert queues its own at 4. Full: six
    tokens take B's leaf, two more the two copies of block 6 (R1's, then R2's); H again re-queues
    R2's copies of 5, 4, 3 at 8; four tokens take R1's copies of 5, 4, 3 and R1's state at 8 (t =
    4), so P, 30, 31, 32 reuses 2, not 8. Mutation survivor ``-m engine_tree --seed 2`` (at
    3636826 ``engine_tree.py:272``): ``cache_again``'s copies keyed ``(recency, 0, ...)``, ahead
    of every re-queued copy of their recency (R2's copies of 6 and 5 went first, R1's state
    stayed)."""
    from policies.vllm_current import VllmFreeQueueEviction

    c = Clocked(engine_tree(EngineRules(duplicate_kv=True), VllmFreeQueueEviction(), capacity=1000, kv=1, state=4))
    tree, insert, lookup = c.tree, c.insert, c.lookup

    def queued():
        return sorted((e[0], -e[2], e[5]) for e in tree.copies if e[3] not in tree._gone)

    p = [1, 2, 3, 4, 5, 6]
    insert([*p, 10, 11], [2, 8])
    insert([*p, 20, 21], [8])
    r1 = lookup([*p, 30, 31])
    insert([*p, 30, 31], [8])
    tree.cache_again(r1)
    r2 = lookup([*p, 40, 41])
    insert([90, 91, 92], [3])
    assert lookup([*p, 10, 11, 12]).hit_tokens == 8
    insert([*p, 40, 41], [8])
    tree.cache_again(r2)
    assert queued() == [(4.0, b, first) for b in (3, 4, 5, 6) for first in (False, True)]
    tree.capacity_bytes = tree.used_bytes
    insert([50, 51, 52, 53, 54, 55], [])
    insert([56, 57], [])
    assert tree.copy_tokens == 6 and all(b != 6 for _, b, _ in queued())
    lookup([*p, 10, 11, 12])
    insert([60, 61, 62, 63], [])
    assert queued() == [(8.0, 3, False), (8.0, 4, False), (8.0, 5, False)]
    assert (lookup([*p, 30, 31, 32]).hit_tokens, lookup([90, 91, 92, 93]).hit_tokens) == (2, 3)
    tree.check_invariants()
