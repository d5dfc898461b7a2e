"""The ``belady`` offline bound (``policies/belady.py``) and its next-use index
(``sim/cache/future.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import TINY, cat, one_per_session, run, toks

from sim.cache.future import NEVER, NextUse


class _Node:
    """Just what NextUse reads of a tree node."""

    def __init__(self, key, parent, created):
        self.key = np.asarray(key, dtype=np.int64)
        self.parent = parent
        self.created = created
        self.children = {}
        self.has_state = True
        if parent is not None:
            parent.children[int(self.key[0]) if len(self.key) else -1] = self
        self.depth_sym = len(self.key) + (parent.depth_sym if parent is not None else 0)


def test_next_use_is_the_first_unserved_request_holding_the_path():
    inputs = [toks(0, 10), toks(100, 5), cat(toks(0, 6), toks(50, 4)), toks(0, 12)]
    nu = NextUse(inputs, max_depth=20)
    root = _Node([], None, 0)
    a = _Node(toks(0, 6), root, 1)  # [0, 6): in requests 0, 2 and 3
    b = _Node(toks(6, 4), a, 2)  # [0, 10): in requests 0 and 3
    c = _Node(toks(100, 5), root, 3)  # request 1 only
    d = _Node(toks(500, 3), root, 4)  # nobody
    # a's state serves request 2 first: requests 0 and 3 reach b's deeper state
    assert [nu.next_use(n) for n in (a, b, c, d)] == [2, 0, 1, NEVER]
    b.has_state = False  # without b's state, request 0 would use a's
    assert nu.next_use(a) == 0
    b.has_state = True
    nu.arrived(toks(0, 10))  # request 0
    assert [nu.next_use(n) for n in (a, b, c)] == [2, 3, 1]
    nu.arrived(cat(toks(0, 6), toks(50, 4)))  # request 2 arrives before request 1 (des)
    assert nu.next_use(a) == NEVER and nu.next_use(b) == 3 and nu.first_unserved == 1
    nu.arrived(toks(100, 5))
    nu.arrived(toks(0, 12))
    assert [nu.next_use(n) for n in (a, b, c)] == [NEVER, NEVER, NEVER] and nu.first_unserved == 4
    nu.arrived(toks(7, 3))  # not a request of the trace: ignored


def test_a_parents_next_use_moves_with_the_states_below_it():
    """A node's next use is the first request that would hit *its* state: a request reaching a
    deeper state under it uses that one. P = [0, 10) and its child C = [0, 15), both with a
    state; r0 = [0, 15) + 3 tokens reaches C, r1 = [0, 10) + 2 tokens only P. With C's state P's
    next user is r1; once C gives its state up, r0 falls back to P (P's next use: r0)."""
    from policies.base import EngineRules
    from policies.belady import BeladyEviction
    from sim.cache.engine_tree import EngineTree

    nu = NextUse([cat(toks(0, 15), toks(70, 3)), cat(toks(0, 10), toks(80, 2))], max_depth=20)
    pol = BeladyEviction()
    tree = EngineTree(
        EngineRules(future=True),
        future=nu,
        capacity_bytes=10**6,
        kv_bytes_per_token=2,
        state_bytes=16,
        block_tokens=1,
        policy=pol,
    )
    tree.insert(toks(0, 10), 10, [10], 1.0)
    tree.insert(toks(0, 15), 15, [15], 2.0)
    p = tree.root.children[0]
    (c,) = p.children.values()
    assert (p.depth_tokens, c.depth_tokens, p.has_state, c.has_state) == (10, 15, True, True)
    assert (pol._next[p.slot], pol._next[c.slot]) == (1, 0)
    tree.drop_state(c)
    assert pol._next[p.slot] == 0 and pol._next[c.slot] == NEVER  # c: a stateless leaf now
    tree.check_invariants()


@pytest.mark.parametrize("policy", ["belady", "belady-size"])
@pytest.mark.parametrize("mode", ["sequential", "des"])
def test_belady_keeps_the_state_needed_next(mode, policy):
    # 36 B per 10-token request (20 B KV + a 16-B state) in 80 B: the third request evicts one.
    # LRU (sglang+) evicts A, the oldest; belady evicts B, never used again, and A's follow-up
    # hits 10.
    trace = one_per_session(
        (toks(0, 10), toks(0, 0)),
        (toks(100, 10), toks(0, 0)),
        (toks(200, 10), toks(0, 0)),
        (cat(toks(0, 10), toks(50, 5)), toks(0, 0)),
    )
    got, sim = run(trace, policy, spec=TINY, capacity=80, mode=mode)
    assert got == [0, 0, 0, 10]
    assert sim.tree.match(toks(100, 11)).hit_tokens == 0
    sim.tree.check_invariants()
    assert run(trace, "sglang+", spec=TINY, capacity=80, mode=mode)[0] == [0, 0, 0, 0]


def test_belady_size_weighs_distance_by_bytes():
    # Room for 130 B. r0 = A (30 tokens: 76 B), r1 = B (5 tokens: 26 B); r2 = C (36 B) needs
    # room. A is next used by r3 (1 request ahead), B by r4 (2 ahead): distance x bytes is
    # 1 x 76 for A against 2 x 26 for B, so belady-size drops A: r3 misses, r4 reuses B's 5
    # tokens. belady drops B, the farther: r3 reuses A's 30 tokens, r4 misses.
    trace = one_per_session(
        (toks(0, 30), toks(0, 0)),
        (toks(100, 5), toks(0, 0)),
        (toks(200, 10), toks(0, 0)),
        (cat(toks(0, 30), toks(70, 2)), toks(0, 0)),
        (cat(toks(100, 5), toks(60, 2)), toks(0, 0)),
    )
    assert run(trace, "belady-size", spec=TINY, capacity=130)[0] == [0, 0, 0, 0, 5]
    assert run(trace, "belady", spec=TINY, capacity=130)[0] == [0, 0, 0, 30, 0]


def test_belady_size_counts_a_never_used_node_twice_the_trace_plus_two_requests_away():
    """belady-size scores a node never used again as 2n + 2 requests away (n requests in the
    trace), beyond every real next use. Four requests (horizon 10), room for 180 B: r0 = A (60
    tokens: 136 B, reused by r3), r1 = B (2 tokens: 20 B, never reused); r2 = C (36 B) needs room.
    A is next used 1 request ahead: 1 x 136 = 136; B scores 10 x 20 = 200, so B goes and r3 reuses
    A's 60 tokens (a horizon of 6 would score B 120 and drop A)."""
    trace = one_per_session(
        (toks(0, 60), toks(0, 0)),
        (toks(100, 2), toks(0, 0)),
        (toks(200, 10), toks(0, 0)),
        (cat(toks(0, 60), toks(70, 2)), toks(0, 0)),
    )
    got, sim = run(trace, "belady-size", spec=TINY, capacity=180)
    assert got == [0, 0, 0, 60]
    assert sim.tree.match(toks(100, 3)).hit_tokens == 0
    sim.tree.check_invariants()


def test_belady_needs_the_corrected_engine():
    from policies.base import PolicyError

    trace = one_per_session((toks(0, 10), toks(0, 0)), (toks(100, 10), toks(0, 0)), (toks(200, 10), toks(0, 0)))
    with pytest.raises(PolicyError, match="--compat corrected"):
        run(trace, "belady", spec=TINY, capacity=80, compat="paper")


@pytest.mark.parametrize("policy", ["belady", "belady-size"])
def test_slot_sizes_are_the_bytes_each_victim_frees(policy):
    """A leaf frees its edge's KV and its state (5 tokens x 2 B + 16 B = 26 B on TINY); an inner
    state holder frees its state only (16 B), its KV staying for its child."""
    trace = one_per_session((toks(0, 10), toks(0, 0)), (cat(toks(0, 10), toks(50, 5)), toks(0, 0)))
    got, sim = run(trace, policy, spec=TINY, capacity=10**6)
    assert got == [0, 10]
    pol = sim.tree.policy
    sizes = {n.depth_tokens: pol._size[n.slot] for n in sim.tree.iter_nodes() if n is not sim.tree.root}
    assert sizes == {10: 16.0, 15: 26.0}
    assert all(pol._cand[n.slot] for n in sim.tree.iter_nodes() if n is not sim.tree.root)


def test_belady_score_puts_distance_first_and_bytes_second():
    from policies.belady import BeladyEviction, BeladySizeEviction

    dist = np.array([3.0, 3.0, 2.0])
    size = np.array([10.0, 30.0, 1000.0])
    # equal distance: the bigger goes; a nearer use never outranks a farther one, whatever its size
    assert list(np.argsort(-BeladyEviction.score(dist, size))) == [1, 0, 2]
    assert list(BeladySizeEviction.score(dist, size)) == [30.0, 90.0, 2000.0]


@pytest.mark.parametrize("policy", ["belady", "belady-size"])
def test_ties_go_to_the_oldest_node_even_in_a_reused_slot(policy):
    # Room for two 36-B requests, none ever reused: every candidate ties. r2 evicts A (the oldest)
    # and C takes A's freed slot; r3 must then evict B (older than C), not the lower slot (C).
    trace = one_per_session(*[(toks(100 * i, 10), toks(0, 0)) for i in range(4)])
    got, sim = run(trace, policy, spec=TINY, capacity=80, mode="sequential")
    assert got == [0, 0, 0, 0]
    kept = sorted(int(n.key[0]) for n in sim.tree.iter_nodes() if n is not sim.tree.root)
    assert kept == [200, 300]
