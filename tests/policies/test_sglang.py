"""SGLang presets against SGLang's own tests and issues (``policies/sglang.py``,
``policies/sglang_pathrefresh.py``).

Sources: sgl-project/sglang ``test/registered/unit/mem_cache/test_mamba_unittest.py`` (stored
version 024f9a6860ce), ``python/sglang/srt/mem_cache/mamba_radix_cache.py`` (00df707e8de4),
``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``, issue #21158.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from engine_cases import TINY, cat, one_per_session, run, state_depths, toks

from policies.sglang import SGLANG_PATH_REFRESH, SGLANG_REFRESH, SGLANG_RULES, TwoListLRUEviction, v2_tracks
from sim.cache.engine_tree import EngineTree
from sim.cache.tree import HybridRadixTree


class _Tree:
    """A page-1 MambaRadixCache stand-in: each insert puts a state at its end, as the SGLang
    tests' ``tree.insert(InsertParams(key, value, mamba_value))`` do; one time step per call."""

    def __init__(self, refresh="split", states=20, kv_tokens=128):
        self.t = 0.0
        self.tree = EngineTree(
            capacity_bytes=kv_tokens * 2 + states * 16,
            kv_bytes_per_token=2,
            state_bytes=16,
            block_tokens=1,
            policy=TwoListLRUEviction(),
            state_capacity=states,
            rules=replace(SGLANG_RULES, refresh=SGLANG_REFRESH if refresh == "split" else SGLANG_PATH_REFRESH),
        )

    def tick(self):
        self.t += 1
        return self.tree.set_time(self.t)

    def insert(self, ids):
        seq = np.array(ids, dtype=np.int64)
        assert self.tree.insert(seq, len(seq), [len(seq)], self.tick()).inserted

    def match(self, ids):
        self.tick()
        return self.tree.lookup(np.array(ids, dtype=np.int64))

    def node(self, ids):  # a lookup that refreshes nothing (inspection only)
        return HybridRadixTree.match(self.tree, np.array(ids, dtype=np.int64)).hit_node


def test_mamba_radix_cache_1():
    """SGLang test_mamba_unittest.py::test_mamba_radix_cache_1, with a KV pool and a mamba pool."""
    c = _Tree()
    c.insert([1, 2, 3])
    c.insert([1, 2, 3, 4, 5, 6, 7])
    c.insert([10, 11, 12])
    c.insert([1, 2, 3, 4, 5, 60, 70])  # splits [4..7] at [4, 5]: the lower half [6, 7] is refreshed
    c.tick()
    # evict_full(1): the least recent leaf is [10, 11, 12] (not [6, 7], refreshed by the split)
    assert c.tree.evict_kv(1) == 3
    # evict_mamba(1): the least recent state is [1, 2, 3], an inner node: tombstoned, KV kept
    assert c.tree.evict_states(1) == 1
    assert c.match([1, 2, 3, 4, 5]).hit_tokens == 0
    assert c.match([1, 2, 3, 4, 5, 60, 70]).hit_tokens == 7
    assert c.match([1, 2, 3, 4, 5, 6, 7]).hit_tokens == 7
    # evict_mamba(1): the leaf [60, 70] (matched before [6, 7]) goes with its KV
    assert c.tree.evict_states(1) == 1
    assert c.match([1, 2, 3, 4, 5, 60, 70]).hit_tokens == 0
    assert c.tree.kv_tokens == 7 and c.tree.n_states == 1  # [1,2,3] + [4,5] + [6,7] with its state
    c.tree.check_invariants()


def test_mamba_radix_cache_kv_events():
    """SGLang test_mamba_unittest.py::test_mamba_radix_cache_kv_events (its KV accounting): evicting
    an inner state tombstones it and frees no KV; then one KV token of pressure removes the leaf
    and the tombstone left above it, every stored token."""
    c = _Tree()
    c.insert([1, 2, 3])
    c.insert([1, 2, 3, 4, 5])
    assert c.tree.evict_states(1) == 1 and c.tree.kv_tokens == 5
    assert c.match([1, 2, 3, 9]).hit_tokens == 0
    assert c.tree.evict_kv(1) == 5
    assert c.tree.kv_tokens == 0 and c.tree.n_states == 0 and not c.tree.root.children
    c.tree.check_invariants()


@pytest.mark.parametrize("refresh", ["split", "path"])
def test_mamba_lru_match_refreshes_only_used_node(refresh):
    """SGLang test_mamba_unittest.py::test_mamba_lru_match_refreshes_only_used_node: re-matching
    session 1's leaf b1 moves only b1's state to most recent; its ancestor a1 stays older than
    session 2's a2. Before #31643 (``sglang-v1-pathrefresh``) the whole path moved: a1 > a2."""
    c = _Tree(refresh)
    c.insert([1, 2, 3])
    c.insert([1, 2, 3, 4, 5, 6])
    c.insert([7, 8, 9])
    c.insert([7, 8, 9, 10, 11, 12])
    c.match([1, 2, 3, 4, 5, 6])
    c.match([7, 8, 9, 10, 11, 12])
    b1, b2 = c.node([1, 2, 3, 4, 5, 6]), c.node([7, 8, 9, 10, 11, 12])
    a1, a2 = b1.parent, b2.parent
    assert a1.state_access < a2.state_access
    c.match([1, 2, 3, 4, 5, 6])
    states = [n for n in c.tree.iter_nodes() if n.has_state]
    assert max(states, key=lambda n: (n.state_access, n.depth_tokens)) is b1
    assert (a1.state_access < a2.state_access) == (refresh == "split")
    # KV recency is refreshed along the whole path in both versions
    assert a1.last_access == b1.last_access == c.t


def test_insert_split_leaves_the_lower_half_most_recent():
    # _insert_helper refreshes the node it walks into, _split_node re-inserts it after the upper
    # half: [0, 10) inserted at t1, split at 5 by an insert at t2 -> the lower half [5, 10) is t2
    c = _Tree()
    c.insert(list(range(10)))
    c.insert(list(range(5)) + [100, 101])
    lower = c.node(list(range(10)))
    assert lower.depth_tokens == 10 and lower.last_access == 2.0
    core = HybridRadixTree(
        capacity_bytes=10**6, kv_bytes_per_token=2, state_bytes=16, block_tokens=1, policy=TwoListLRUEviction()
    )
    core.insert(np.arange(10), 10, [10], 1.0)
    core.insert(np.array([0, 1, 2, 3, 4, 100, 101]), 7, [7], 2.0)
    assert core.match(np.arange(10)).hit_node.last_access == 1.0  # the paper's tree keeps t1


def test_identical_prompt_reuses_the_prompt_end_state():
    # SGLang #21158: r0 = X (10) + Y (5); r1, r2 send X + Y as their prompt. After r0's prefill
    # cache_unfinished_req stores the state at 10 (the prompt end); the lookup of a 15-token
    # prompt stops at 14 tokens, inside the edge ending at 15 (the request-end state) -> 10.
    trace = one_per_session((toks(0, 10), toks(10, 5)), (toks(0, 15), toks(100, 5)), (toks(0, 15), toks(200, 5)))
    got, sim = run(trace, "sglang-v1")
    assert got == [0, 10, 10] and state_depths(sim.tree) == [10, 15, 20, 20]
    assert run(trace, "sglang+")[0] == [0, 15, 15]  # no cap: the request-end state is used
    # chunked prefill (4 tokens): r0 keeps 4, 8 (chunk ends), 10 (prompt end) and 15; r1 reuses
    # 10 and adds 14 (a chunk end); r2 reuses 14
    got, sim = run(trace, "sglang-v1", prefill_chunk_tokens=4)
    assert got == [0, 10, 14] and state_depths(sim.tree) == [4, 8, 10, 14, 15, 20, 20]


def _refresh_trace():
    return one_per_session(
        (toks(0, 10), toks(0, 0)),  # t0: A = [0, 10), state at 10: 20 + 16 = 36 B
        (toks(0, 20), toks(0, 0)),  # t1: hits A; B = [10, 20): 72 B
        (toks(100, 10), toks(0, 0)),  # t2: C = [100, 110), unrelated: 108 B
        (toks(0, 30), toks(0, 0)),  # t3: hits B; D = [20, 30): 144 B
        (toks(300, 10), toks(0, 0)),  # t4: E needs 36 B: 180 > 170
    )


def test_whole_path_and_consumed_node_state_refresh_evict_different_nodes():
    # Before #31643 (sglang-v1-pathrefresh): t1 and t3 refresh every state on their path -> A = B
    # = D = t3, C = t2: C, the least recent leaf, goes whole (10 tokens and its state).
    got, sim = run(_refresh_trace(), "sglang-v1-pathrefresh", spec=TINY, capacity=170)
    assert got == [0, 10, 0, 20, 0]
    st = sim.tree.stats
    assert (st.evictions, st.states_evicted, st.kv_tokens_evicted) == (1, 1, 10)
    assert sim.tree.lookup(toks(0, 15)).hit_tokens == 10 and sim.tree.lookup(toks(100, 11)).hit_tokens == 0
    # Today (sglang-v1): a hit refreshes only the consumed state -> A's state is t1 (its hit),
    # older than C (t2): A is tombstoned (KV kept, merged into B), C survives; as Marconi does.
    for policy in ("sglang-v1", "marconi"):
        got, sim = run(_refresh_trace(), policy, spec=TINY, capacity=170, alpha=0.0)
        assert got == [0, 10, 0, 20, 0], policy
        st = sim.tree.stats
        assert (st.evictions, st.states_evicted, st.kv_tokens_evicted) == (1, 1, 0), policy
        assert sim.tree.lookup(toks(0, 15)).hit_tokens == 0
        assert sim.tree.lookup(toks(0, 25)).hit_tokens == 20  # B still reachable: A's KV was kept
        assert sim.tree.lookup(toks(100, 11)).hit_tokens == 10
        sim.tree.check_invariants()


def test_state_pool_evicts_states_not_kv():
    # --state-pool 2 (SGLang's mamba pool): r0, r1, r2 each leave one state (10 tokens, no
    # output); r2 takes r0's slot: r0 is a leaf and goes with its KV. r3 hits r1 (which refreshes
    # r1's state) and adds a state at 15: r2 (t2) is now the least recent and goes. r4 = r0's
    # prompt + more misses. Bytes never decide: the KV pool is large.
    trace = one_per_session(
        (toks(0, 10), toks(0, 0)),
        (toks(100, 10), toks(0, 0)),
        (toks(200, 10), toks(0, 0)),
        (cat(toks(100, 10), toks(50, 5)), toks(0, 0)),
        (cat(toks(0, 10), toks(60, 5)), toks(0, 0)),
    )
    for pool in ("2", "32B"):  # a count, or bytes (16 B a state)
        got, sim = run(trace, "sglang-v1", spec=TINY, capacity=10_000, state_pool=pool)
        assert got == [0, 0, 0, 10, 0], pool
        assert sim.tree.state_capacity == 2 and sim.tree.n_states == 2
        assert state_depths(sim.tree) == [15, 15]
        sim.tree.check_invariants()
    # one budget (no --state-pool): nothing is evicted at 10,000 B
    got, sim = run(trace, "sglang-v1", spec=TINY, capacity=10_000)
    assert got == [0, 0, 0, 10, 10] and sim.tree.stats.evictions == 0


def test_two_list_drops_a_branch_state_and_keeps_its_kv():
    tree = HybridRadixTree(
        capacity_bytes=94, kv_bytes_per_token=2, state_bytes=16, block_tokens=1, policy=TwoListLRUEviction()
    )
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


def test_v2_tracks_one_state_per_extend_step():
    # _mamba_radix_cache_v2_req_prepare_for_extend: a step of >= 64 tokens tracks its end rounded
    # down to 64 from its start; a branch point inside the step on that grid replaces it
    assert v2_tracks(0, 300, 8192, None, 64) == [256]
    assert v2_tracks(0, 300, 8192, 192, 64) == [192]  # replaced, not added
    assert v2_tracks(0, 300, 128, 192, 64) == [128, 192]  # steps [0,128), [128,256) (192 inside), [256,300) < 64
    assert v2_tracks(192, 250, 8192, None, 64) == []  # a 58-token step tracks nothing
    assert v2_tracks(512, 650, 8192, 576, 64) == [576]


def test_sglang_v2_keeps_one_state_per_step_and_kv_up_to_it():
    trace = one_per_session(
        (toks(0, 300), toks(300, 300)),  # track 256; decode crosses 512: [0, 512)
        (toks(0, 700), toks(5000, 10)),  # hits 512; step 188 -> 640
        (cat(toks(0, 200), toks(1000, 100)), toks(2000, 10)),  # branch 192 replaces 256: [0, 192) only
        (cat(toks(0, 200), toks(3000, 50)), toks(4000, 10)),  # hits 192; 58-token step: none; decode 256
        (cat(toks(0, 200), toks(1000, 100)), toks(6000, 10)),  # r2's prompt: its KV past 192 is gone -> 192
        (cat(toks(0, 600), toks(9000, 50)), toks(7000, 10)),  # hits 512; branch 576 replaces 640
    )
    got, sim = run(trace, "sglang-v2")
    assert got == [0, 512, 0, 192, 192, 512]
    # r4 tracks 256 on r2's branch, r3 256 on its own; r5 576
    assert state_depths(sim.tree) == [192, 256, 256, 256, 512, 576, 640]
    # KV stops at each insert's last state: no stateless leaf
    assert all(n.has_state for n in sim.tree.iter_nodes() if not n.children and n is not sim.tree.root)


def _node(parent, *, state, access, depth, created):
    node = SimpleNamespace(
        parent=parent,
        children={},
        lock=0,
        has_state=state,
        last_access=access,
        state_access=access,
        depth_tokens=depth,
        created=created,
        version=0,
    )
    if parent is not None:
        parent.children[created] = node
    return node


def test_two_lists_on_one_budget_evict_the_least_recent_of_kv_leaves_and_states():
    """SGLang's MambaRadixCache keeps a full (KV) LRU list of leaves and a mamba LRU list of states
    (python/sglang/srt/mem_cache/mamba_radix_cache.py, evict_full / evict_mamba); on one shared
    budget the least recently used head of the two goes. Hand-built: an inner node whose state was
    used at t=1 and a leaf used at t=5, so the inner state goes (state only: its KV stays for the
    leaf); with no state left anywhere the KV leaf goes."""
    pol = TwoListLRUEviction()
    pol.attach(SimpleNamespace())
    root = SimpleNamespace(
        parent=None, children={}, lock=0, has_state=False, last_access=0.0, depth_tokens=0, created=0, version=0
    )
    inner = _node(root, state=True, access=1.0, depth=10, created=1)
    leaf = _node(inner, state=True, access=5.0, depth=20, created=2)
    for node in (inner, leaf):
        pol.add(node)
    victim = pol.pop_victim()
    assert victim.node is inner and victim.drop_state_only

    lone = SimpleNamespace(
        parent=None, children={}, lock=0, has_state=False, last_access=0.0, depth_tokens=0, created=0, version=0
    )
    pol2 = TwoListLRUEviction()
    pol2.attach(SimpleNamespace())
    kv_only = _node(lone, state=False, access=3.0, depth=8, created=1)
    pol2.add(kv_only)
    victim = pol2.pop_victim()
    assert victim.node is kv_only and not victim.drop_state_only


# ---- admission lists on hand-counted cases (each guards one comparison or offset) ------------
from policies.base import ADMISSION, AdmissionContext  # noqa: E402


def test_v2_step_of_exactly_one_chunk_tracks_and_one_token_less_does_not():
    """``extend >= chunk``: a 64-token step tracks its end, a 63-token step tracks nothing."""
    assert v2_tracks(0, 64, 8192, None, 64) == [64]
    assert v2_tracks(0, 63, 8192, None, 64) == []
    assert v2_tracks(0, 128, 64, None, 64) == [64, 128]  # budget = chunk: every step tracks
    assert v2_tracks(0, 200, 100, None, 64) == [64, 164]  # steps [0,100) and [100,200): 64 from each start
    assert v2_tracks(10, 200, 8192, 128, 64) == [138]  # branch off the step's 64-grid: end kept


def _v2(hit, match, n_input, G=1, input_tokens=-1, budget=8192):
    pol = ADMISSION["sglang-v2"](ADMISSION["sglang-v2"].Params(prefill_chunk_tokens=budget))
    ctx = AdmissionContext(n_input=n_input, n_full=n_input, block_tokens=G, input_tokens=input_tokens)
    return pol.prefill_checkpoints(SimpleNamespace(hit_sym=hit, match_sym=match), ctx)


def test_v2_prefill_branch_point_and_hit_offsets():
    # KV matched to 130 tokens, no state: branch 130 // 64 * 64 = 128 replaces the step end 192
    assert _v2(0, 130, 200) == [128]
    assert _v2(0, 0, 200) == [192]
    # 16-token symbols: a hit at symbol 4 (64 tokens), 208-token prompt: 64 + 128 = 192 = symbol 12
    assert _v2(4, 4, 13, G=16) == [12]


def test_v1_chunk_ends_when_the_chunk_is_finer_than_a_symbol():
    """A prefill step shorter than one symbol (hash-block traces) still advances one symbol."""
    pol = ADMISSION["sglang-v1"](ADMISSION["sglang-v1"].Params(prefill_chunk_tokens=8))
    ctx = AdmissionContext(n_input=3, n_full=5, block_tokens=16)
    assert pol.prefill_checkpoints(SimpleNamespace(hit_sym=0, match_sym=0), ctx) == [1, 2, 3]
    assert pol.decode_checkpoints(SimpleNamespace(hit_sym=0, match_sym=0), ctx) == [5]
    pol = ADMISSION["sglang-v1"](ADMISSION["sglang-v1"].Params(prefill_chunk_tokens=32))
    assert pol.prefill_checkpoints(SimpleNamespace(hit_sym=1, match_sym=1), AdmissionContext(7, 8, 16)) == [3, 5, 7]


def test_two_list_keys_leave_the_root_and_locked_nodes_out_and_list_states():
    pol = TwoListLRUEviction()
    root = SimpleNamespace(
        parent=None, children={}, lock=0, has_state=False, last_access=0.0, depth_tokens=0, created=0, version=0
    )
    inner = _node(root, state=True, access=1.0, depth=10, created=1)
    leaf = _node(inner, state=True, access=5.0, depth=20, created=2)
    bare = _node(root, state=False, access=2.0, depth=5, created=3)
    assert pol.keys(root) == {}
    assert pol.keys(inner) == {"state": (1.0, 10)}
    assert pol.keys(leaf) == {"kv": (5.0, 20), "state": (5.0, 20)}
    assert set(pol.keys(bare)) == {"kv"} and pol.keys(bare)["kv"][1] == 5
    leaf.lock = 1
    assert pol.keys(leaf) == {}


def test_v2_branch_point_of_an_identical_prompt_comes_from_its_first_input_minus_one_tokens():
    """SGLang 0.5.9 matches only ``fill_ids[:input_len - 1]`` (``Req.init_next_round_input``,
    ``managers/schedule_batch.py`` L897-L901), so the KV match, and with it the branch point
    (``mamba_radix_cache.py`` ``match_prefix`` L983-L995: the match rounded down to 64), stops one
    token short of the prompt. The simulator's KV match walks the whole prompt, so the admission
    caps it at ``n - 1``. extra_buffer: r0 = A (128 tokens) tracks 128; r1 = A again cannot use
    that state (128 > 127) and its branch is 127 // 64 * 64 = 64, which replaces the step end 128
    (a branch at 128 would lie at the step's end, not inside it); r2 = A[:100] + X reuses r1's
    state at 64. With the match uncapped, r1 tracked 128 again and r2 reused nothing."""
    a = toks(0, 128)
    one = toks(9000, 1)
    trace = one_per_session((a, one), (a, toks(9100, 1)), (cat(a[:100], toks(5000, 50)), one))
    got, sim = run(trace, "sglang-v2")
    assert got == [0, 0, 64]
    # r2: hit 64, a step of 86 tokens tracks 64 + 64 = 128 on its own branch
    assert state_depths(sim.tree) == [64, 128, 128]
