"""The ``vllm`` preset's memory and eviction rules under pressure, each naming the vLLM 0.34.0 code
it follows (``benchmarks/differential_vllm.py`` drives that code with the same requests; the
agreement table is in docs/presets-engines.md).

Tree-level cases use a 1-token block, 1 byte of KV per token and 4-byte states; one time step per
call, as the engine frees one request's blocks after the previous one's.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import TIMING, TINY, cat, one_per_session, run, toks

from policies.base import EngineRules, PolicyError, get_preset
from policies.vllm_current import VllmAdmission, VllmFreeQueueEviction, mamba_groups
from sim.cache.engine_tree import EngineTree
from sim.config import SimConfig
from sim.cost import get_model
from sim.engine.drivers import run as drive
from sim.engine.events import Evict, EventLog
from sim.simulate import build
from traces.base import Request, Trace


class _Pool:
    def __init__(self, capacity: int, *, duplicate_kv: bool = False, block_tokens: int = 1):
        self.t = 0.0
        self.B = block_tokens
        self.tree = EngineTree(
            EngineRules(duplicate_kv=duplicate_kv),
            capacity_bytes=capacity,
            kv_bytes_per_token=1,
            state_bytes=4,
            block_tokens=block_tokens,
            policy=VllmFreeQueueEviction(),
        )

    def tick(self) -> float:
        self.t += 1
        return self.tree.set_time(self.t)

    def insert(self, ids, states) -> None:
        seq = np.array(ids, dtype=np.int64)
        now = self.tick()
        res = self.tree.insert(seq, len(seq) * self.B, states, now)
        assert res.inserted
        self.tree.refresh_inserted(res, now, final=True)

    def lookup(self, ids):
        return self.tree.lookup(np.array(ids, dtype=np.int64), now=self.tick())


def test_state_evicted_alone_before_its_kv_and_the_kv_still_matches():
    """A state and the KV it ends are separate blocks of vLLM's one free queue
    (``block_pool.py`` ``free_blocks`` L798-L837); a request's state block is freed once it has
    computed past it (``MambaManager.remove_skipped_blocks``, ``single_type_kv_cache_manager.py``
    L1634-L1662), before its attention blocks at its end, so the state goes first and the KV
    stays: a later lookup matches it token by token without a hit."""
    c = _Pool(capacity=6 + 4 + 4 + 4)
    c.insert([1, 2, 3, 4, 5, 6], [6])  # 6 KV + a state
    c.insert([20, 21, 22, 23], [4])  # 4 KV + a state: 18 bytes, full
    c.insert([30], [])  # 1 KV more: the oldest entry goes, the state at 6 alone
    m = c.lookup([1, 2, 3, 4, 5, 6, 7])
    assert (m.hit_tokens, m.match_tokens) == (0, 6)
    assert c.tree.n_states == 1 and c.tree.kv_tokens == 11
    c.insert([40, 41, 42, 43], [])  # 4 more: [1..6]'s KV, the oldest entry (a lookup without a hit moves nothing)
    assert c.lookup([1, 2, 3]).match_tokens == 0
    assert c.lookup([20, 21, 22, 23, 24]).hit_tokens == 4
    c.tree.check_invariants()


def test_hit_refreshes_the_path_to_the_hit_and_only_the_hit_state():
    """``MambaManager.find_longest_cache_hit`` (``single_type_kv_cache_manager.py`` L1475-L1552)
    returns null blocks before the hit's block and ``BlockPool.touch`` (``block_pool.py``
    L774-L792) skips null blocks: a hit moves the attention blocks up to it and its own state, not
    the states above it on the path nor the KV past it."""
    c = _Pool(capacity=8 + 3 * 4)
    c.insert([1, 2, 3, 4, 5, 6, 7, 8], [2, 4, 8])  # 8 KV + 3 states: full
    m = c.lookup([1, 2, 3, 4, 9])  # hits the state at 4
    assert m.hit_tokens == 4
    c.insert([50, 51, 52, 53], [])  # 4 bytes: the oldest entry is the state at 2 (t = 1)
    assert c.lookup([1, 2, 77]).hit_tokens == 0
    assert c.lookup([1, 2, 3, 4, 77]).hit_tokens == 4
    c.insert([60, 61, 62, 63], [])  # 4 more: the state at 8 (t = 1, before its KV [5..8])
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert (m.hit_tokens, m.match_tokens) == (4, 8)
    c.tree.check_invariants()


def test_recomputed_kv_is_cached_twice_and_the_older_copy_is_evicted_first():
    """``BlockHashToBlockMap.insert`` (``block_pool.py`` L78-L82) keeps a second block under a key
    already cached: the KV a request recomputes between its hit and its match holds two blocks,
    and the older copy stays where the queue had it (it frees memory, the key stays cached)."""
    c = _Pool(capacity=100, duplicate_kv=True)
    c.insert([1, 2, 3, 4, 5, 6], [2])  # KV to 6, a state at 2 only
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    assert (m.hit_tokens, m.match_tokens) == (2, 6)
    c.insert([1, 2, 3, 4, 5, 6, 7, 8], [8])
    c.tree.cache_again(m)
    assert c.tree.copy_tokens == 4  # tokens 3..6 cached again
    assert c.tree.used_bytes == 8 + 4 + 2 * 4
    c.tree.capacity_bytes = c.tree.used_bytes  # full: the next bytes come from the oldest entries
    c.insert([90, 91, 92], [])
    assert c.tree.copy_tokens == 1  # three older copies (t = 1) went first; nothing left the tree
    assert c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9]).hit_tokens == 8
    c.tree.check_invariants()


def test_kv_recomputed_inside_a_cached_edge_is_cached_twice_too():
    """The recomputed KV of a request whose match ends inside a cached edge (it shares only part
    of a cached node: the insert splits it) is cached a second time as well: vLLM hashes each
    block the request computes (``BlockHashToBlockMap.insert``, ``block_pool.py`` L78-L82), however
    the simulator's tree happens to cut its nodes; the older copies hang on the node that holds
    their blocks after the split. The note of the recomputed blocks counted only the nodes the
    match covered whole, so here no copy was made (found tracing ``benchmarks/differential_vllm.py
    --scheduler continuous``'s rule 16 test case)."""
    c = _Pool(capacity=100, duplicate_kv=True)
    c.insert([1, 2, 3, 4, 5, 6], [2, 6])  # KV to 6, states at 2 and 6
    m = c.lookup([1, 2, 3, 4, 70, 71])  # hit 2, KV match 4 (inside the edge 3..6)
    assert (m.hit_tokens, m.match_tokens) == (2, 4)
    c.insert([1, 2, 3, 4, 70, 71], [6])
    c.tree.cache_again(m)
    assert c.tree.copy_tokens == 2  # tokens 3 and 4 cached again
    upper = next(n for n in c.tree.iter_nodes() if n.depth_tokens == 4)
    assert sorted(-e[2] for e in c.tree._node_copies[upper]) == [3, 4]
    c.tree.check_invariants()


def test_dropping_older_copies_evicts_nothing_from_the_tree():
    """An older KV copy's block leaves the free queue without anything leaving the tree: an insert
    that makes its room from older copies only reports no state and no KV evicted. As above: A =
    1..6 with a state at 2, B caches 1..8 with a state at 8 and tokens 3..6 again (4 copies at
    t = 1); full, [90, 91, 92] takes three copies' blocks. Mutation survivor ``-m engine_tree
    --seed 2`` (2026-12-05): engine_tree.py L650, a dropped copy counted as an evicted state."""
    c = _Pool(capacity=100, duplicate_kv=True)
    c.insert([1, 2, 3, 4, 5, 6], [2])
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    c.insert([1, 2, 3, 4, 5, 6, 7, 8], [8])
    c.tree.cache_again(m)
    c.tree.capacity_bytes = c.tree.used_bytes
    res = c.tree.insert(np.array([90, 91, 92]), 3, [], c.tick())
    assert res.inserted and c.tree.copy_tokens == 1
    assert (res.evicted_states, res.evicted_kv_tokens) == (0, 0)
    assert (c.tree.n_states, c.tree.kv_tokens) == (2, 8 + 3)
    c.tree.check_invariants()


def test_vllm_rules_for_qwen35_9b():
    """vLLM groups Qwen3.5-9B's 8 attention and 24 Gated-DeltaNet layers in groups of 8
    (``kv_cache_planning.py`` ``_get_kv_cache_groups_uniform_page_size`` L567-L580): three Mamba
    groups; a state costs one padded page per layer (``MambaSpec.page_size_bytes`` returns
    ``page_size_padded``, ``kv_cache_interface.py`` L1156-L1162), three blocks' worth of KV; a
    running request holds a running-state block per Mamba group."""
    spec = get_model("qwen3.5-9b")
    preset = get_preset("vllm")
    config = SimConfig(policy="vllm", model="qwen3.5-9b")
    B = preset.grid_for(spec, config)
    rules = preset.engine_rules(spec, config)
    assert mamba_groups(spec) == (8, 3)
    assert B == 528
    assert rules.state_bytes == 3 * B * spec.kv_bytes_per_token() > spec.state_bytes()
    assert (rules.running_blocks, rules.duplicate_kv, rules.kv_extent) == (3, True, "blocks")
    assert get_preset("vllm-0.11-align").engine_rules(spec, config).running_blocks == 0


def test_running_request_blocks_evict_the_oldest_state_in_sequential_mode():
    """A running request's blocks come from the same pool (``KVCacheManager.allocate_slots``,
    ``kv_cache_manager.py`` L401: ``get_new_blocks`` pops the free queue's head, evicting it):
    one running-state block per Mamba group and the partial last block. TINY, 4-token blocks: a
    9-token prompt with 3 output tokens caches 8 tokens of KV (16 bytes) and the state at
    ``(9 - 1) // 4 * 4`` = 8 (16 bytes); running, it also holds one state block and its partial
    block (8 tokens, 16 bytes). With 64 bytes, B's run needs 16 bytes more than A and B's cached
    32 + 32: A's state goes (the oldest entry), A's KV stays, so C (A's prompt again) matches 8
    tokens and hits none."""
    a = (toks(0, 9), toks(500, 3))
    b = (toks(100, 9), toks(600, 3))
    hits, sim = run(one_per_session(a, b, a), "vllm", spec=TINY, capacity=64, block_size=4)
    assert hits == [0, 0, 0]
    assert sim.tree.running_blocks == 1
    roomy, _ = run(one_per_session(a, b, a), "vllm", spec=TINY, capacity=80, block_size=4)
    assert roomy == [0, 0, 8]


def test_a_hit_on_kv_cached_twice_touches_the_first_copy():
    """``get_cached_block`` answers with ``BlockHashToBlockMap.get_one_block``, the first block id
    cached under a key (``block_pool.py`` L66-L69, kept by ``insert``'s ``setdefault``): a later
    hit touches that older copy, and the newer copy keeps its place in the queue. So after C's hit
    the copies of B's recomputed blocks sit at B's time (t = 3), after E's entries (t = 2): E's
    state goes first, not a copy."""
    c = _Pool(capacity=100, duplicate_kv=True)
    c.insert([1, 2, 3, 4, 5, 6], [2])  # A, t = 1
    c.insert([50, 51], [2])  # E, t = 2
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8])  # B, t = 3: hit 2, KV to 6
    c.tree.set_time(c.t)
    res = c.tree.insert(np.array([1, 2, 3, 4, 5, 6, 7, 8]), 8, [8], c.t)
    c.tree.cache_again(m)
    c.tree.refresh_inserted(res, c.t, final=True)
    assert c.tree.copy_tokens == 4
    assert c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9]).hit_tokens == 8  # C, t = 4: touches the first copies
    c.tree.capacity_bytes = c.tree.used_bytes
    c.insert([90], [])
    assert c.tree.copy_tokens == 4
    m = c.lookup([50, 51, 52])
    assert (m.hit_tokens, m.match_tokens) == (0, 2)
    c.tree.check_invariants()


def test_a_hit_of_one_block_on_kv_cached_twice_touches_the_first_copy():
    """As above with the shortest hit, one block: A caches block 1 without a state (t = 1); E
    caches [50] with a state (t = 2); B looks up [1, 2] (hit 0, match 1), caches [1] with a state
    at 1 and caches block 1 again (the older copy at A's time, t = 1); C's hit of one block (t = 4)
    touches the older copy, so the copy takes B's place (t = 3) and E's entries (t = 2) are now
    the oldest: E's state goes first, the copy stays. Mutation survivor ``-m engine_tree --seed 1``
    (2026-12-05): engine_tree.py L256, the copies' touch only for hits deeper than one block."""
    c = _Pool(capacity=100, duplicate_kv=True)
    c.insert([1], [])  # A, t = 1
    c.insert([50], [1])  # E, t = 2
    m = c.lookup([1, 2])  # B, t = 3
    assert (m.hit_tokens, m.match_tokens) == (0, 1)
    res = c.tree.insert(np.array([1]), 1, [1], c.t)
    c.tree.cache_again(m)
    c.tree.refresh_inserted(res, c.t, final=True)
    assert c.tree.copy_tokens == 1
    assert c.lookup([1, 9]).hit_tokens == 1  # C, t = 4
    c.tree.capacity_bytes = c.tree.used_bytes
    c.insert([90], [])
    assert c.tree.copy_tokens == 1
    m = c.lookup([50, 51])
    assert (m.hit_tokens, m.match_tokens) == (0, 1)
    c.tree.check_invariants()


def test_requests_at_equal_times_are_freed_in_the_order_served():
    """The free queue's order is the order of ``free_blocks`` calls (``block_pool.py``
    L798-L837), so of two requests at the same trace time the one served first is evicted first
    (the tree's clock steps past ties: ``strict_clock``). At equal recency the shallower state
    would go first: B's, served second."""
    c = _Pool(capacity=4 + 4 + 2 + 4)
    for ids, states in (([1, 2, 3, 4], [4]), ([10, 11], [2])):
        now = c.tree.set_time(1.0)
        res = c.tree.insert(np.array(ids), len(ids), states, now)
        c.tree.refresh_inserted(res, now, final=True)
    c.tree.set_time(2.0)
    assert c.tree.insert(np.array([20]), 1, [], 2.0).inserted
    assert c.lookup([1, 2, 3, 4, 5]).hit_tokens == 0
    assert c.lookup([10, 11, 12]).hit_tokens == 2


def test_caching_recomputed_kv_again_evicts_at_once_when_over_capacity():
    """vLLM's ``duplicate_kv`` rule (``BlockHashToBlockMap.insert``, ``block_pool.py`` L78-L82):
    the KV a request recomputes past its hit is cached a second time, and the room for those new
    blocks is made right then, from the oldest entries of the free queue. 18 bytes: A = tokens
    1..6 with a state at 2 (6 + 4 = 10 bytes); B looks up 1..8 (hit 2, match 6), then caches
    1..8 with a state at 8 (+2 KV + 4 = 16 bytes); cache_again adds copies of tokens 3..6 (4
    bytes: 20 > 18), so the two oldest entries go at once: two older copies (t = 1, copies first
    at equal recency), leaving 2 copy tokens, 18 bytes, and the tree whole (B's hit 8)."""
    c = _Pool(capacity=18, duplicate_kv=True)
    c.insert([1, 2, 3, 4, 5, 6], [2])
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    assert (m.hit_tokens, m.match_tokens) == (2, 6)
    c.insert([1, 2, 3, 4, 5, 6, 7, 8], [8])
    assert c.tree.used_bytes == 16
    c.tree.cache_again(m)
    assert (c.tree.copy_tokens, c.tree.used_bytes) == (2, 18)
    assert c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9]).hit_tokens == 8
    c.tree.check_invariants()


def test_evicting_an_older_copy_frees_its_whole_block():
    """An older KV copy holds one block (``block_tokens`` tokens); evicting it frees all of them.
    2-token blocks, 19 bytes: A = blocks [1, 2, 3] (6 tokens) with a state after block 1 (10
    bytes); B looks up [1, 2, 3, 4] (hit 2 tokens, match 6), caches [1, 2, 3, 4] with a state at
    its end (+2 KV + 4 = 16 bytes); cache_again adds copies of blocks 2 and 3 (4 tokens: 20 > 19),
    so one copy goes, 2 tokens: 2 copy tokens, 18 bytes (a copy freeing 1 token would stop at
    3 copy tokens and 19 bytes)."""
    c = _Pool(capacity=19, duplicate_kv=True, block_tokens=2)
    c.insert([1, 2, 3], [1])
    m = c.lookup([1, 2, 3, 4])
    assert (m.hit_tokens, m.match_tokens) == (2, 6)
    c.insert([1, 2, 3, 4], [4])
    assert c.tree.used_bytes == 16
    c.tree.cache_again(m)
    assert (c.tree.copy_tokens, c.tree.used_bytes) == (2, 18)
    assert c.lookup([1, 2, 3, 4, 5]).hit_tokens == 8
    c.tree.check_invariants()


def test_a_simulated_request_caches_the_kv_it_recomputed_past_its_hit_again():
    """Through the simulator, not only the tree (``Simulation.insert_decode`` calls ``cache_again``
    for a request with a lookup): vLLM caches the blocks a request recomputes between its hit and
    its match a second time under the same hashes (``BlockHashToBlockMap.insert``, ``block_pool.py``
    L78-L82). TINY, 4-token blocks, retention 0: A (9 + 8 tokens) caches 16 tokens of KV and its
    prompt state at (9 - 1) // 4 * 4 = 8; B sends A's 17 tokens and 5 more, matches 16 tokens, hits
    the state at 8 and recomputes tokens 8..16: two blocks, 8 tokens, held twice."""
    a = (toks(0, 9), toks(500, 8))
    b = (np.concatenate([*a, toks(900, 5)]), toks(700, 2))
    hits, sim = run(one_per_session(a, b), "vllm", spec=TINY, block_size=4)
    assert hits == [0, 8]
    assert sim.tree.copy_tokens == 8


def test_a_state_on_a_running_path_stays_in_the_free_queue():
    """A running request holds its path's attention blocks, not its states: align mode frees a
    state block a step after the request has computed past it, the hit's included
    (``MambaManager.remove_skipped_blocks``, ``single_type_kv_cache_manager.py`` L1634-L1662;
    ``allocate_new_blocks`` L1802-L1928 records the hit's block as ``last_state_block_idx``), so
    a state on a running request's path keeps its place in the free queue. A (8 tokens, states
    at 4 and 8) and B (4 tokens, a state) fill the pool; a request runs on A (hit 8: A's KV and
    the state at 8 refreshed, the path locked); 4 more bytes take the queue's front, A's state at
    4, alone, and B keeps its state. Locking the path's states (the preset before, under the
    continuous scheduler, where requests run while others insert) took B's instead: found by
    ``benchmarks/differential_vllm.py --scheduler continuous --capacity 4GB``."""
    c = _Pool(capacity=8 + 2 * 4 + 4 + 4)
    c.insert([1, 2, 3, 4, 5, 6, 7, 8], [4, 8])
    c.insert([20, 21, 22, 23], [4])
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert m.hit_tokens == 8
    c.tree.refresh_hit(m, c.t)
    c.tree.lock(m.hit_node)  # the running request
    c.insert([30, 31, 32, 33], [])
    assert sorted(n.depth_tokens for n in c.tree.iter_nodes() if n.has_state) == [4, 8]
    assert c.lookup([20, 21, 22, 23, 24]).hit_tokens == 4
    assert c.lookup([1, 2, 3, 4, 77]).hit_tokens == 0  # A's KV stays, its state at 4 is gone
    c.tree.unlock(m.hit_node)
    c.tree.check_invariants()


def _engine(trace, *, timing=None, **cfg):
    """A ``vllm`` ContinuousEngine on ``trace`` (the tiny model, block 16, ample memory, ``cfg``
    more SimConfig fields), nothing arrived yet: the simulation and the engine."""
    from sim.engine.batching import ContinuousEngine  # noqa: PLC0415

    import simpy  # noqa: PLC0415

    config = SimConfig(policy="vllm", capacity_bytes=10**12, scheduler="continuous", block_size=16, **cfg)
    sim = build(trace, config, spec=TINY, timing=timing)
    noop = lambda *a: None  # noqa: E731
    return sim, ContinuousEngine(sim, simpy.Environment(), noop, noop, noop)


def test_a_running_request_holds_whole_blocks_and_one_state_a_second_when_entering_a_block():
    """Under the continuous scheduler a running ``vllm`` request holds what vLLM's pool gives it
    (``KVCacheManager.allocate_slots``, ``kv_cache_manager.py`` L401; ``get_num_blocks_to_allocate``
    ``cdiv(num_tokens, block_size)``): its attention KV in whole blocks, a block taken when its
    first token is computed, and one running-state block per Mamba group, a second one in a step
    after its first that enters a new block (``MambaManager.allocate_new_blocks``,
    ``single_type_kv_cache_manager.py`` L1802-L1928, takes the new block; ``remove_skipped_blocks``,
    L1634-L1662, frees the previous one at the next step). Block 16, budget 16, a 40-token prompt:
    chunks [0, 16), [16, 32), [32, 40) (the split stops at the last cacheable 32); then the cache
    keeps the whole blocks (32 tokens and the state at 32) and the request its partial block; its
    decode enters a block again at token 48. The preset before charged tokens (8 for the last
    chunk) and two state slots throughout."""
    trace = one_per_session((toks(0, 40), toks(500, 12)))
    sim, eng = _engine(trace, max_num_batched_tokens=16)
    start = sim.tree.capacity_bytes
    eng.arrive(trace.requests[0])
    held = []
    for _ in range(20):
        batch = eng.schedule()
        s = eng.running[0]
        held.append((s.pos, s.held_kv, s.held_states))
        eng._apply(batch, 1, 0.0, 0.0)
        if not eng.running:
            break
    assert held[:4] == [(0, 16, 1), (16, 32, 2), (32, 48, 2), (40, 16, 1)]
    assert held[9:12] == [(46, 16, 1), (47, 16, 1), (48, 32, 2)]  # token 48 opens a block
    assert held[12] == (49, 32, 1)
    assert not eng.running and (s.held_kv, s.held_states) == (0, 0) and sim.tree.capacity_bytes == start


def test_a_state_enters_the_free_queue_when_the_request_has_computed_past_it():
    """Align mode frees a state's block at the step after the one that computed the next token
    (``MambaManager.remove_skipped_blocks``, ``single_type_kv_cache_manager.py`` L1634-L1662,
    called from ``allocate_slots``), so under the continuous scheduler a state the request placed
    takes its place in the free queue then, not when the simulator inserts it (the prompt's end
    for a chunk-end state, the request's end for a decode state): other requests' blocks freed
    meanwhile are more recent. Block 16, budget 16, retention -1, a 40-token prompt and 12
    output tokens: the state at 16 is freed at the end of the step computing token 16 (the second
    chunk's), 32 at the third's, and the decode state at 48 at the end of the decode step
    computing token 48. Found by ``benchmarks/differential_vllm.py --scheduler continuous
    --capacity 4GB`` (retention -1: the first admission whose hit differs, 314th -> 332nd)."""
    from sim.engine.drivers import run as drive  # noqa: PLC0415
    from sim.engine.events import EventLog, Step  # noqa: PLC0415
    from sim.simulate import build  # noqa: PLC0415

    from engine_cases import TIMING  # noqa: PLC0415

    trace = one_per_session((toks(0, 40), toks(500, 12)))
    config = SimConfig(
        policy="vllm",
        capacity_bytes=10**12,
        scheduler="continuous",
        block_size=16,
        max_num_batched_tokens=16,
        prefix_cache_retention_interval=-1,
    )
    log = EventLog()
    sim = build(trace, config, spec=TINY, timing=TIMING, observers=(log,))
    drive(sim)
    steps = [e for e in log.events if isinstance(e, Step)]
    ends = {}  # token computed -> end of its step
    for e in steps:
        for _, a, b in e.prefills:
            ends.update({p: e.t_end for p in range(a, b)})
        for _, ctx in e.decodes:
            ends.update({ctx + j: e.t_start + (j + 1) * e.seconds / e.steps for j in range(e.steps)})
    states = {n.depth_tokens: n.state_access for n in sim.tree.iter_nodes() if n.has_state}
    assert sorted(states) == [16, 32, 48]
    # each just after its step's end (after what that end freed: ``_states_freed``)
    assert ends[16] <= states[16] < ends[16] + 1e-9 < ends[32] <= states[32] < ends[32] + 1e-9 < states[48]
    assert abs(states[48] - ends[48]) < 1e-9
    assert states[48] < steps[-1].t_end  # before the request's end, when the simulator inserts it


def test_blocks_recomputed_between_the_hit_and_the_match_are_the_requests_and_the_older_copies_evictable():
    """A request recomputes the KV it matched past its state hit into new blocks of its own
    (``get_computed_blocks`` returns the reconciled hit; ``allocate_slots``, ``kv_cache_manager.py``
    L401, allocates the rest), cached a second time beside the older copy
    (``BlockHashToBlockMap.insert``, ``block_pool.py`` L78-L82) and held until the request ends;
    the older copy, which the lookup did not touch (``find_longest_cache_hit`` stops at the hit),
    stays in the free queue, evictable. Under the continuous scheduler the prompt's insert locks
    the request's path, which then stands for the request's copies, and the older copies go to
    the queue of copies at their old recency (``cache_again``). Block 16: A (64 tokens; its one
    state at 48) runs first; B shares A's first 40 tokens (no state there: hit 0, KV match 32) and
    has 56: after its prompt it holds its partial last block (16) and the cache 32 tokens of older
    copies. Rule 16 before held the 32 recomputed tokens as the request's and kept the older
    copies locked in the tree under its path (unevictable: vLLM evicted such a copy where the
    simulator could not, ``benchmarks/differential_vllm.py --scheduler continuous --capacity 4GB
    --retention -1``, 69.9 s); the preset before it handed all 48 whole-block tokens to the cache
    (holding 16, no older copy until the request ended)."""
    A = toks(0, 64)
    trace = one_per_session((A, toks(500, 4)), (cat(A[:40], toks(900, 16)), toks(600, 4)))
    sim, eng = _engine(trace)
    seen = []
    for r in trace.requests:
        eng.arrive(r)
        while eng.running or eng.waiting:
            batch = eng.schedule()
            s = eng.running[-1]
            eng._apply(batch, 1, 0.0, 0.0)
            if r is trace.requests[1] and s.inserted and s.decoded == 1:
                seen.append((s.f.hit_tokens, s.f.match_tokens, s.held_kv, sim.tree.copy_tokens))
    assert seen == [(0, 32, 16, 32)]
    assert sim.tree.copy_tokens == 32  # the older copies stay after B's end, at their place
    assert sim.tree.capacity_bytes == build(trace, sim.config, spec=TINY).tree.capacity_bytes


def _waiting_run(trace, capacity, scheduler="continuous"):
    """Hit tokens, queueing delays and the (time, position) of each state eviction of ``vllm``
    (block 16) on the tiny model (a block 32 B, a state one block)."""
    config = SimConfig(
        policy="vllm", model="qwen3.5-9b", capacity_bytes=capacity, mode="des", scheduler=scheduler, block_size=16
    )
    log = EventLog()
    req = drive(build(trace, config, spec=TINY, timing=TIMING, observers=(log,))).requests.sort_values("request_id")
    evicted = [(round(e.t, 6), e.position) for e in log.events if isinstance(e, Evict)]
    return [int(h) for h in req["hit_tokens"]], list(req["queue_s"]), evicted


def _open(*reqs):
    return Trace(
        "t",
        [
            Request(session_id=k, turn=0, input_tokens=inp, output_tokens=out, arrival=t)
            for k, (inp, out, t) in enumerate(reqs)
        ],
        closed_loop=False,
    )


def test_a_request_waiting_for_memory_holds_nothing_evicts_nothing_and_is_matched_again():
    """A waiting request holds no blocks and evicts none: ``Scheduler.schedule`` looks it up while
    ``num_computed_tokens`` is 0 (``get_computed_blocks``, ``vllm/v1/core/sched/scheduler.py``
    L1149-L1166, no references taken), ``allocate_slots`` compares the blocks it needs with the
    free queue (cached blocks included) and returns None before it touches the hit or evicts
    anything when the pool is short (``kv_cache_manager.py`` L605-L609; the touch is L611-L622),
    and the request stays waiting (``new_blocks is None``: break, L1516-L1523), to be looked up
    again at the next pass. Tiny model, 5 blocks, continuous: r0 = H (24 tokens, 1 out) leaves the
    block [0, 16) and the state at 16; r1 = D (16 tokens, 8 out) and r2 = W (H + 40 tokens) arrive
    at t = 1; D runs (1 block, its state), W's first chunk (16..48: 2 blocks and a state) does not
    fit even with H's state gone, so nothing is evicted for it. D's first decode token enters its
    second block (a block and a second state block) and takes the free queue's front, H's state,
    at t = 1.001. W, matched again at each pass, does not hit H's state. Before, W kept its first lookup and
    its failed reservation evicted H's state at t = 1.0, and W prefilled from that state (a hit of
    16 tokens on a state that was gone)."""
    h = toks(0, 24)
    trace = _open(
        (h, toks(9000, 1), 0.0), (toks(100, 16), toks(9100, 8), 1.0), (cat(h, toks(200, 40)), toks(9200, 1), 1.0)
    )
    hits, queue, evicted = _waiting_run(trace, 5 * 32)
    # W waited, then ran its first chunk (0..16) beside D's decode, was preempted at its next
    # (16..48 does not fit) and, matched again, hits the state at 16 it computed itself (vLLM
    # caches blocks as they are computed: test_a_preempted_request_leaves_what_it_computed_in_the_cache)
    assert hits == [0, 0, 16]
    assert queue[2] > 0.001  # W waited
    assert evicted[0] == (1.001, 16)  # H's state, for D's decode, not at W's first try (t = 1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VllmAdmission, "rematches_waiting", False)
        hits, _, evicted = _waiting_run(trace, 5 * 32)
        assert hits == [0, 0, 16] and evicted[0] == (1.0, 16)


def test_under_fcfs_a_request_is_matched_when_the_server_takes_it():
    """The same rule under ``--scheduler fcfs``: vLLM matches a request when its scheduler reaches it
    (``scheduler.py`` L1149-L1166), not when it arrives. r0 = A (40 tokens, 3 out) and r1 = A + 5
    tokens arrive together; r1 waits for the one server while r0's prefill runs and caches A's
    state at 32 ((40 - 1) // 16 * 16), and then reuses it. Looked up at its arrival, it reused
    nothing."""
    a = toks(0, 40)
    trace = _open((a, toks(9000, 3), 0.0), (cat(a, toks(300, 5)), toks(9300, 1), 0.0))
    hits, queue, _ = _waiting_run(trace, 10**12, scheduler="fcfs")
    assert hits == [0, 32] and queue[1] > 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VllmAdmission, "rematches_waiting", False)
        assert _waiting_run(trace, 10**12, scheduler="fcfs")[0] == [0, 0]


def test_could_reserve_promises_no_byte_that_reserve_cannot_give():
    """A 5-byte pool full of one 5-token path without a state, its node locked by a running
    request: nothing can be evicted, so even one KV token (1 byte) is refused by the check as by
    ``reserve``; an empty request always fits, and once the lock goes the token does."""
    c = _Pool(capacity=5)
    c.insert([1, 2, 3, 4, 5], [])
    node = c.lookup([1, 2, 3, 4, 5, 6]).path[-1]
    c.tree.lock(node)
    assert c.tree.used_bytes == 5
    assert c.tree.could_reserve(1, 0) is False and c.tree.reserve(1, 0) is False
    assert c.tree.could_reserve(0, 0) is True
    c.tree.unlock(node)
    assert c.tree.could_reserve(1, 0) is True


def test_could_reserve_counts_what_eviction_frees_and_evicts_nothing():
    """The admission check behind a waiting request (``HybridRadixTree.could_reserve``): vLLM's
    ``allocate_slots`` compares the blocks a request needs with the free queue, cached blocks
    included, before it evicts anything (``kv_cache_manager.py`` L605-L609). A (8 tokens, states
    at 4 and 8) and B (4 tokens, a state) hold 24 of 28 bytes; a request runs on A (its path
    locked: A's KV stays, A's states stay in the free queue). Free now: 4 B; once evicted: B's KV
    and state and A's two states, 16 B more: 20 B can be reserved, 21 cannot, and asking evicts
    nothing."""
    c = _Pool(capacity=28)
    c.insert([1, 2, 3, 4, 5, 6, 7, 8], [4, 8])
    c.insert([20, 21, 22, 23], [4])
    m = c.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9])
    c.tree.lock(m.hit_node)
    before = (c.tree.kv_tokens, c.tree.n_states)
    assert c.tree.could_reserve(4, 0) is True  # fits now
    assert c.tree.could_reserve(20, 0) is True
    assert c.tree.could_reserve(12, 2) is True  # 12 + 2 x 4
    assert c.tree.could_reserve(21, 0) is False
    assert c.tree.could_reserve(16, 2) is False
    assert (c.tree.kv_tokens, c.tree.n_states) == before
    assert c.tree.reserve(20, 0)  # what it promised, reserve does
    c.tree.unlock(m.hit_node)


def _decode_engine(prompt: int, output: int, retention: int = 0):
    """A ``vllm`` ContinuousEngine (block 16, budget 16, ``retention``) with one request, stepped
    through its prefill: the engine, its request, and the batch of its first decode step."""
    trace = one_per_session((toks(0, prompt), toks(500, output)))
    sim, eng = _engine(trace, timing=TIMING, max_num_batched_tokens=16, prefix_cache_retention_interval=retention)
    eng.arrive(trace.requests[0])
    while True:
        batch = eng.schedule()
        if not batch.prefills:
            return eng, eng.running[0], batch
        eng._apply(batch, 1, 0.0, 0.0)


def test_a_decode_run_stops_before_the_step_that_enters_a_block():
    """vLLM runs a decode run step by step: at the step whose token opens a new block,
    ``allocate_slots`` (``kv_cache_manager.py`` L401) takes the attention block and a new state
    block per Mamba group (``MambaManager.allocate_new_blocks``, ``single_type_kv_cache_manager.py``
    L1802-L1928) while the previous one is still held (``remove_skipped_blocks``, L1634-L1662,
    frees it at the next step), so the pool must give a block and a state at once, then. The
    simulator advanced such a run in one event, charging its blocks at the run's start (evicting
    for steps an arrival may cut off) and not their second state slots: a run now ends before
    that step, which is scheduled and charged on its own. A 40-token prompt, 13 output tokens,
    block 16: the run from token 40 takes 8 steps (tokens 40-47, nothing charged beyond the first
    step's), the step computing token 48 holds the new block and a second slot. Found by
    ``benchmarks/differential_vllm.py --scheduler continuous --capacity 4GB`` (retention 0: vLLM
    evicted four blocks at a decode run where the simulator evicted one; retention -1: the
    simulator evicted for a run an arrival cut short)."""
    eng, s, batch = _decode_engine(40, 13)
    tree = eng.sim.tree
    assert (s.pos, s.held_kv, s.held_states) == (40, 16, 1)
    before = tree.capacity_bytes
    dt = eng.sim.timing.step_time_s(eng.sim.spec, (), [40])
    k = eng._run_length(batch, [40], dt)
    assert k == 8
    assert (s.held_kv, tree.capacity_bytes) == (16, before)
    eng._apply(batch, k, 0.0, dt)
    batch = eng.schedule()
    assert (s.pos, s.held_kv, s.held_states) == (48, 32, 2)
    assert before - tree.capacity_bytes == 16 * tree.kv_bytes_per_token + tree.state_bytes
    assert eng._run_length(batch, [48], dt) == 4  # from the block's first step: the rest of the output

    eng, s, batch = _decode_engine(5, 20)  # a prompt inside the first block: the run stops before 16
    assert s.pos == 5 and eng._run_length(batch, [5], dt) == 11


@pytest.mark.parametrize("retention", [0, -1])
def test_a_kept_decode_state_goes_into_the_cache_the_step_after_it(retention):
    """With retention -1 vLLM keeps the state at every block boundary decode passes: the step
    computing token 48 takes a new state block per Mamba group (``allocate_new_blocks``), and the
    old one, holding the state at 48, is cached (``MambaManager.cache_blocks``) and freed into the
    free queue at the next step (``remove_skipped_blocks``, ``single_type_kv_cache_manager.py``
    L1634-L1662): it is in the pool, evictable, from then on, where the simulator inserted it only
    at the request's end (and gave the slot back: vLLM's pool held three blocks more, 65.0 s at
    -1), then held it as a slot to the end (never evictable: vLLM evicted such a state at 101.4 s).
    Now the request's sequence up to it goes into the cache then, locked by the request, and the
    request gives back the slot and the KV blocks the cache holds (``_publish_decode``); with
    retention 0 the state is not kept and the slot goes at the next step. A 40-token prompt, 16
    output tokens, block 16, step by step and across a decode run that stops before the block
    (``_run_cut``). Found by ``benchmarks/differential_vllm.py --scheduler continuous --capacity
    4GB --retention -1`` (982 -> 1,235 of 1,235 requests agree)."""
    kept = retention == -1
    eng, s, batch = _decode_engine(40, 16, retention)
    tree = eng.sim.tree
    held, states = [], {}
    while eng.running:
        held.append((s.pos, s.held_kv, s.held_states))
        eng._apply(batch, 1, 0.0, 0.0)
        states[s.pos] = sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state)
        batch = eng.schedule()
    assert held[7:11] == [(47, 16, 1), (48, 32, 2), (49, 16 if kept else 32, 1), (50, 16 if kept else 32, 1)]
    assert states[49] == ([16, 32, 48] if kept else [32])  # in the cache from the step after token 48
    assert states[48] == ([16, 32] if kept else [32])
    assert (s.held_kv, s.held_states) == (0, 0) and states[max(states)] == states[49]

    eng, s, batch = _decode_engine(40, 13, retention)
    dt = eng.sim.timing.step_time_s(eng.sim.spec, (), [40])
    k = eng._run_length(batch, [40], dt)
    assert k == 8  # up to token 47
    eng._apply(batch, k, 0.0, dt)
    batch = eng.schedule()
    assert (s.pos, s.held_kv, s.held_states) == (48, 32, 2)
    assert eng._run_length(batch, [48], dt) == 4
    eng._apply(batch, 4, 0.0, dt)  # its last step: the request ends, everything given back
    assert (s.pos, s.held_kv, s.held_states, eng.held_bytes) == (52, 0, 0, 0)


@pytest.mark.parametrize("retention", [0, -1])
def test_a_kept_prefill_state_stays_in_the_pool_from_the_step_after_it_to_the_prompts_insert(retention):
    """A prefill step that ends on a state vLLM keeps (with retention -1 every block-aligned step
    end; at 0 the junction and the prompt's last cacheable block) leaves that state's block cached
    in the pool from the next step on (``MambaManager.cache_blocks``; ``remove_skipped_blocks``,
    ``single_type_kv_cache_manager.py`` L1634-L1662, frees it into the free queue), while the
    simulator inserts the prompt's states only with the prompt: the request holds it as a state
    slot until then. Block 16, budget 16, a 40-token prompt: chunks [0, 16), [16, 32), [32, 40);
    at -1 the state at 16 is kept, so the third step holds three slots (the running state, the
    state at 16 and the new block's), at 0 two; after the prompt's insert one. Found by
    ``benchmarks/differential_vllm.py --scheduler continuous --capacity 4GB`` (retention 0: a
    junction state at 528, cached at the step after its chunk, 79.7 s)."""
    trace = one_per_session((toks(0, 40), toks(500, 4)))
    sim, eng = _engine(trace, max_num_batched_tokens=16, prefix_cache_retention_interval=retention)
    eng.arrive(trace.requests[0])
    held = []
    while True:
        batch = eng.schedule()
        s = eng.running[0]
        held.append((s.pos, s.held_kv, s.held_states))
        eng._apply(batch, 1, 0.0, 0.0)
        if s.pos >= 40:
            break
    assert held == [(0, 16, 1), (16, 32, 2), (32, 48, 3 if retention == -1 else 2)]
    assert (s.held_kv, s.held_states, s.kept_prefill) == (16, 1, 0)
    assert sorted(n.depth_tokens for n in sim.tree.iter_nodes() if n.has_state) == (
        [16, 32] if retention == -1 else [32]
    )


@pytest.mark.parametrize(("retention", "kept"), [(0, [32]), (-1, [16, 32])])
def test_a_preempted_request_leaves_what_it_computed_in_the_cache(retention, kept):
    """vLLM caches a request's blocks as it computes them (``allocate_slots`` -> ``cache_blocks``,
    ``kv_cache_manager.py``; ``MambaManager.cache_blocks`` for the states it keeps), so a request
    preempted for recompute (``_preempt_request`` -> ``KVCacheManager.free``) leaves its whole
    blocks and kept states in the cache, in the free queue. Block 16, budget 16, a 40-token prompt
    preempted after two chunks (32 tokens): the tree keeps its 32 tokens and the states it reached
    that the preset keeps (at 0 the prompt's last cacheable block, 32; at -1 also 16), and the
    request holds nothing. The simulator dropped all of it. Found by
    ``benchmarks/differential_vllm.py --scheduler continuous --capacity 4GB --retention -1`` (a
    request looked up again after its preemption found its own state in vLLM, 106.4 s)."""
    trace = one_per_session((toks(0, 40), toks(500, 4)))
    sim, eng = _engine(trace, max_num_batched_tokens=16, prefix_cache_retention_interval=retention)
    start = sim.tree.capacity_bytes
    eng.arrive(trace.requests[0])
    for _ in range(2):
        eng._apply(eng.schedule(), 1, 0.0, 0.0)
    s = eng.running.pop()
    assert s.pos == 32 and not s.inserted
    eng._preempt(s, [])
    assert sorted(n.depth_tokens for n in sim.tree.iter_nodes() if n.has_state) == kept
    assert sim.tree.kv_tokens == 32 and (s.held_kv, s.held_states) == (0, 0)
    assert sim.tree.capacity_bytes == start and not any(n.lock for n in sim.tree.iter_nodes() if n.parent)


@pytest.mark.parametrize(("retention", "kept"), [(0, [32]), (-1, [16, 32, 48])])
def test_a_request_preempted_while_decoding_leaves_the_decode_states_it_reached(retention, kept):
    """The same rule once the prompt is in and the request decodes: block 16, budget 16, a
    40-token prompt, preempted when its decode reaches the block boundary at 48 (the step that
    computed the block; the decode publishes its state only with the next step) and, again, past
    it at 52. With retention -1 vLLM keeps every block-aligned state the request reached
    (``MambaManager.cache_blocks``), the decode's at 48 too, and ``_preempt_request`` leaves them
    cached; at 0 only the prompt's last cacheable block's. The prompt's states went in with the
    prompt; the preemption adds the decode ones it reached (``f.decode_cps``), not the prompt's
    again."""
    for stop in (48, 52):
        trace = one_per_session((toks(0, 40), toks(500, 30)))
        sim, eng = _engine(trace, max_num_batched_tokens=16, prefix_cache_retention_interval=retention)
        eng.arrive(trace.requests[0])
        while eng.running == [] or eng.running[0].pos < stop:
            eng._apply(eng.schedule(), 1, 0.0, 0.0)
        s = eng.running.pop()
        assert (s.pos, s.inserted) == (stop, True)
        eng._preempt(s, [])
        assert sorted(n.depth_tokens for n in sim.tree.iter_nodes() if n.has_state) == kept, stop
        assert (s.held_kv, s.held_states) == (0, 0)


def test_a_request_preempted_after_a_kept_prefill_state_holds_only_what_its_recompute_takes():
    """Retention -1, block 16, budget 16, a 56-token prompt preempted after two chunks: it held the
    state at 16 as a kept prefill slot (vLLM cached that block the step after it), and the
    preemption left it in the cache (``_cache_computed``), so the request no longer owes it. Looked
    up again, it hits its own 32 tokens and recomputes [32, 48) and [48, 56) (holding the state at
    48 as a kept slot in that second step); the prompt's insert gives back that one kept slot, not
    the one the preemption already settled: after each step it holds its running state alone, to
    its end (mutation survivor: ``Seq.preempt`` not clearing ``kept_prefill`` made the insert
    hand back a slot the request no longer held, leaving it none while it decoded)."""
    trace = one_per_session((toks(0, 56), toks(500, 4)))
    sim, eng = _engine(trace, max_num_batched_tokens=16, prefix_cache_retention_interval=-1)
    eng.arrive(trace.requests[0])
    for _ in range(2):
        eng._apply(eng.schedule(), 1, 0.0, 0.0)
    s = eng.running.pop()
    assert (s.pos, s.held_states, s.kept_prefill) == (32, 2, 1)  # the running state and the kept one at 16
    eng._preempt(s, [])
    held = []
    while not s.finished:
        batch = eng.schedule()
        s = eng.running[0]
        eng._apply(batch, 1, 0.0, 0.0)
        held.append((s.pos, s.held_states))
    assert s.f.hit_tokens == 32
    assert held == [(48, 1), (56, 1), (57, 1), (58, 1), (59, 0)]
    sim.tree.check_invariants()


def test_a_hit_state_enters_the_free_queue_after_the_step_and_after_the_requests_that_ended_in_it():
    """vLLM holds a hit's state block through the request's first step (``allocate_new_blocks``
    records it as ``last_state_block_idx``, ``single_type_kv_cache_manager.py`` L1842-L1844) and
    frees it at the next step's ``allocate_slots`` (``remove_skipped_blocks``, L1645-L1661), after
    the blocks of the requests that ended in that step (freed when its output is processed). A
    (20 tokens; its state at 16) runs alone; then C (16 new tokens, one output token) and B (A's
    first 16 tokens and 40 more: hit 16, a first chunk to 48) share a step, C ending in it: B's
    hit state takes its
    place in the queue after C's blocks, not at B's lookup (before C's). Found by
    ``benchmarks/differential_vllm.py --scheduler continuous --capacity 4GB --retention -1`` (a
    KV block ended in a step went before a hit's state in vLLM, 81.5 s)."""
    A = toks(0, 20)
    trace = one_per_session(
        (A, toks(500, 2)), (toks(100, 16), toks(600, 1)), (cat(A[:16], toks(900, 40)), toks(700, 3))
    )
    sim, eng = _engine(trace, max_num_batched_tokens=64)
    eng.arrive(trace.requests[0])
    while eng.running or eng.waiting:
        eng._apply(eng.schedule(), 1, 0.0, 0.0)
    eng.arrive(trace.requests[1])
    eng.arrive(trace.requests[2])
    batch = eng.schedule()
    assert [(s.req.request_id, a, b) for s, a, b in batch.prefills] == [(1, 0, 16), (2, 16, 48)]
    b = batch.prefills[1].seq
    hit = b.f.match.hit_node
    looked_up = hit.state_access
    eng._apply(batch, 1, 0.0, 0.0)
    c_leaf = next(n for n in sim.tree.iter_nodes() if n.depth_tokens == 16 and n is not hit and n.parent)
    assert c_leaf.last_access > looked_up  # C ended after B's lookup ...
    assert hit.has_state and hit.state_access > c_leaf.last_access  # ... and B's hit state went after it


def test_a_state_computed_past_in_a_prompts_last_step_goes_after_the_requests_that_ended_in_it():
    """The state a request computed past in its prompt's last step (here the prompt's last
    cacheable block, where the split stopped the first chunk) is freed by ``remove_skipped_blocks``
    at the next step's ``allocate_slots`` (``single_type_kv_cache_manager.py`` L1634-L1662), so it
    takes its place in the queue after the blocks of a request that ended in that step, though
    the simulator inserts it with the prompt, before that request's end. D (20 tokens: chunks
    [0, 16) and [16, 20)) and, in D's second step, E (16 tokens, one output token, ending in it)."""
    trace = one_per_session((toks(0, 20), toks(500, 3)), (toks(100, 16), toks(600, 1)))
    sim, eng = _engine(trace, max_num_batched_tokens=64)
    eng.arrive(trace.requests[0])
    eng._apply(eng.schedule(), 1, 0.0, 0.0)
    eng.arrive(trace.requests[1])
    batch = eng.schedule()
    assert [(s.req.request_id, a, b) for s, a, b in batch.prefills] == [(0, 16, 20), (1, 0, 16)]
    eng._apply(batch, 1, 0.0, 0.0)
    d_state = next(n for n in sim.tree.iter_nodes() if n.has_state and n.depth_tokens == 16)
    e_leaf = next(n for n in sim.tree.iter_nodes() if n.depth_tokens == 16 and n is not d_state and n.parent)
    assert d_state.state_access > e_leaf.last_access


def test_a_preempted_request_frees_its_hit_path_into_the_queue_even_with_nothing_new():
    """``_preempt_request`` frees all the request's blocks (``KVCacheManager.free``, tail first),
    the hit's included, so its path takes the queue's end at the preemption even when the request
    computed no whole block past its hit. A (20 tokens; its state at 16), then B (A's first 16
    tokens and 20 more, step budget 4: its first chunk is [16, 20)) preempted after that chunk:
    the path to B's hit is refreshed at the preemption, not left at B's lookup."""
    A = toks(0, 20)
    trace = one_per_session((A, toks(500, 2)), (cat(A[:16], toks(900, 20)), toks(700, 3)))
    sim, eng = _engine(trace, max_num_batched_tokens=4)
    eng.arrive(trace.requests[0])
    while eng.running or eng.waiting:
        eng._apply(eng.schedule(), 1, 0.0, 0.0)
    eng.arrive(trace.requests[1])
    batch = eng.schedule()
    assert [(s.req.request_id, a, b) for s, a, b in batch.prefills] == [(1, 16, 20)]
    eng._apply(batch, 1, 0.0, 0.0)
    s = eng.running.pop()
    hit = s.f.match.hit_node
    before = hit.last_access
    eng._preempt(s, [])
    assert hit.last_access > before and hit.has_state and not hit.lock


def test_a_prompt_state_evicted_while_the_request_decodes_stays_gone_at_its_end():
    """Once the prompt's insert put its states in the cache, vLLM's request no longer holds them
    (``remove_skipped_blocks`` freed their blocks into the free queue): one evicted while the
    request decodes is gone, and the request's end (``KVCacheManager.free``) caches nothing of it
    again. The simulator's end insert took the prompt's states again and brought such a state
    back (at its old place, the queue's front: evicted again at the next need). A (20 tokens;
    its state at 16), its state dropped during decode. Found by ``benchmarks/differential_vllm.py
    --scheduler continuous --capacity 4GB`` (retention 0: first differing admission 771st ->
    862nd)."""
    trace = one_per_session((toks(0, 20), toks(500, 4)))
    sim, eng = _engine(trace, max_num_batched_tokens=64)
    eng.arrive(trace.requests[0])
    while not (eng.running and eng.running[0].prompt_in):
        eng._apply(eng.schedule(), 1, 0.0, 0.0)
    node = next(n for n in sim.tree.iter_nodes() if n.has_state)
    assert node.depth_tokens == 16
    listener, sim.tree.listener = sim.tree.listener, None
    sim.tree.drop_state(node)  # evicted while the request decodes
    sim.tree.listener = listener
    while eng.running:
        eng._apply(eng.schedule(), 1, 0.0, 0.0)
    assert not any(n.has_state for n in sim.tree.iter_nodes())
    assert sim.tree.kv_tokens == 16


def test_a_published_decode_state_evicted_while_the_request_decodes_stays_gone_at_its_end():
    """A decode state in the cache since the step after it (``_publish_decode``) and evicted while
    the request decodes on is gone in vLLM; the request's end (``KVCacheManager.free``) caches
    nothing of it again, so the end insert takes only the decode states past it. Retention -1, a
    40-token prompt, 16 output tokens, block 16: the state at 48 dropped at token 50."""
    eng, s, batch = _decode_engine(40, 16, -1)
    tree = eng.sim.tree
    while eng.running:
        eng._apply(batch, 1, 0.0, 0.0)
        if s.pos == 50:
            node = next(n for n in tree.iter_nodes() if n.has_state and n.depth_tokens == 48)
            listener, tree.listener = tree.listener, None
            tree.drop_state(node)
            tree.listener = listener
        batch = eng.schedule()
    assert sorted(n.depth_tokens for n in tree.iter_nodes() if n.has_state) == [16, 32]


def _block_pool(capacity: int) -> _Pool:
    """A pool with vLLM's block-granular leaf eviction on 2-token blocks (1-token symbols)."""
    c = _Pool(capacity=capacity)
    c.tree = EngineTree(
        EngineRules(kv_extent="blocks", extent_block=2, block_evict=True),
        capacity_bytes=capacity,
        kv_bytes_per_token=1,
        state_bytes=4,
        block_tokens=1,
        policy=VllmFreeQueueEviction(),
    )
    return c


def test_a_leaf_loses_one_block_per_block_needed_its_last_first():
    """vLLM's pool evicts one cached block for each block it hands out, from its free queue's head
    (``BlockPool.get_new_blocks``, ``block_pool.py`` L681-L696, ``_maybe_evict_cached_block``
    L751), and a request frees its blocks tail first (``SingleTypeKVCacheManager.free``,
    ``single_type_kv_cache_manager.py`` L596-L604): a two-block leaf needed for one block loses
    its last block and keeps the first (the tree evicted the leaf whole: 4 tokens for 2)."""
    c = _block_pool(capacity=6)
    c.insert([1, 2, 3, 4], [])  # one leaf of two blocks
    c.insert([20, 21], [])  # full
    c.insert([30, 31], [])  # one block needed: [3, 4] goes, [1, 2] stays
    assert c.tree.kv_tokens == 6
    assert c.lookup([1, 2, 3, 4, 5]).match_tokens == 2
    c.insert([40, 41], [])  # one more: the leaf's first block (t = 1) is the queue's head
    assert c.lookup([1, 2, 3]).match_tokens == 0
    assert c.lookup([20, 21, 22]).match_tokens == 2
    c.tree.check_invariants()


def test_a_state_at_the_evicted_block_end_goes_with_it():
    """A state's KV block evicted (``_maybe_evict_cached_block``, ``block_pool.py`` L751) leaves
    the state unreachable (vLLM's hit needs every attention block up to it,
    ``FullAttentionManager.find_longest_cache_hit``): the leaf shrinks by its last block and the
    state at that end goes; the block before it stays cached."""
    c = _block_pool(capacity=100)
    c.insert([1, 2, 3, 4], [4])
    (leaf,) = c.tree.root.children.values()
    assert c.tree.evict(leaf) == (1, 2)
    assert (leaf.depth_tokens, leaf.has_state, c.tree.n_states, c.tree.kv_tokens) == (2, False, 0, 2)
    assert c.tree.evict(leaf) == (0, 2)  # one block left: the leaf goes
    assert c.tree.kv_tokens == 0 and not c.tree.root.children
    c.tree.check_invariants()


def test_block_eviction_is_vllms_and_lmdeploys_alone():
    """Only ``vllm`` and ``lmdeploy`` evict a leaf a block at a time (LMDeploy's
    ``block_trie/kv_lifecycle.py`` L131-L139 at 1263d5cd8, rule 9 of tests/policies/test_lmdeploy.py);
    every other preset, their older versions included, evicts a leaf whole."""
    from policies.base import PRESETS

    spec = get_model("qwen3.5-9b")
    on = []
    for name in PRESETS:
        preset = get_preset(name)
        config = SimConfig(policy=name, model="qwen3.5-9b")
        try:
            rules = preset.engine_rules(spec, config)
        except PolicyError:  # a preset that refuses this model
            continue
        if rules is not None and rules.block_evict:
            on.append(name)
    assert sorted(on) == ["lmdeploy", "vllm"]


def test_a_state_victim_on_the_inserts_own_path_is_room_planned_again():
    """A running request's path holds its attention blocks, not its states (``keys``: the state of
    a locked node stays in the free queue, ``remove_skipped_blocks``), so the insert that makes room
    may evict the very state it planned as cached; ``_apply`` then adds it again, and the room is
    counted again after such a victim. Capacity 9 (1 byte a token, 4-byte states): [1,2,3] with its
    state (7) and [9] (1) hold 8; [1..5] with the state at 3, its path locked, needs 2 more.
    The oldest entry, the state at 3, goes (4 used, 4 + 2 <= 9 by the first plan), but adding it
    back needs 4 + 2: [9]'s KV goes too, and the tree ends at exactly 9 bytes (5 KV + one state),
    not 10 (the capacity assertion)."""
    c = _Pool(capacity=9)
    c.insert([1, 2, 3], [3])
    c.insert([9], [])
    assert c.tree.used_bytes == 8
    m = c.tree.match(np.array([1, 2, 3, 4, 5], dtype=np.int64))  # no refresh: the state stays the oldest
    assert m.hit_tokens == 3
    c.tree.lock(m.hit_node)
    res = c.tree.insert(np.array([1, 2, 3, 4, 5], dtype=np.int64), 5, [3], c.tick(), protect=m.hit_node)
    c.tree.unlock(m.hit_node)
    assert res.inserted and (res.evicted_states, res.evicted_kv_tokens) == (1, 1)
    assert (c.tree.used_bytes, c.tree.kv_tokens, c.tree.n_states) == (9, 5, 1)
    assert c.tree._grown() == 0  # the insert's replan ended with it: a later eviction plans no extra room
    assert c.lookup([1, 2, 3, 4]).hit_tokens == 3 and c.lookup([9]).match_tokens == 0
    c.tree.check_invariants()


def test_vllm_fcfs_agent_trace_at_60kb_stays_within_capacity():
    """The tester's command: under ``--scheduler fcfs`` a finished request's insert evicted the
    state of its own hit (its path locked, its state in the free queue) and added it back, 61440
    bytes in a 58368-byte cache (the capacity assertion); it now runs to the end."""
    from click.testing import CliRunner

    from sim.cli import main

    trace = (
        "synthetic:agent:sessions=2,turns=6,prompt_tokens=400,task_tokens=120,output_tokens=10,obs_tokens=60,prompts=1"
    )
    args = ["run", "--model", "replay-tiny", "--trace", trace, "--policy", "vllm", "--capacity", "60KB"]
    for extra in (["--scheduler", "fcfs"], ["--scheduler", "continuous"], ["--mode", "sequential"]):
        res = CliRunner().invoke(main, args + extra)
        assert res.exit_code == 0, (extra, res.output, res.exception)
        assert "vllm" in res.output


def test_with_older_kv_copies_a_state_victim_on_the_inserts_path_is_planned_again_too():
    """The same rule where older KV copies share the budget (``duplicate_kv``: the eviction takes
    the oldest of a copy and the policy's victim, ``_evict_with_copies``). Capacity 14: [1..4] with
    a state at 2 (8 bytes); [1..5] looked up (hit 2, match 4: tokens 3, 4 recomputed) is cached
    with states at 2 and 5 (13) and its recomputed blocks a second time (15: the oldest copy goes,
    14). [1..7] with states at 2 and 5, its path locked, needs 7 KV and 2 states, 15 bytes alone:
    the copy and both states on its path go and it is refused (5 bytes left); planned once, it
    was applied, 15 bytes in 14."""
    c = _Pool(capacity=14, duplicate_kv=True)
    c.insert([1, 2, 3, 4], [2])
    m = c.lookup([1, 2, 3, 4, 5])
    assert (m.hit_tokens, m.match_tokens) == (2, 4)
    now = c.tick()
    res = c.tree.insert(np.array([1, 2, 3, 4, 5], dtype=np.int64), 5, [2, 5], now)
    c.tree.cache_again(m)
    c.tree.refresh_inserted(res, now, final=True)
    assert (c.tree.used_bytes, c.tree.copy_tokens) == (14, 1)
    seq = np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.int64)
    m = c.tree.match(seq)
    assert m.hit_tokens == 5
    c.tree.lock(m.hit_node)
    res = c.tree.insert(seq, 7, [2, 5], c.tick(), protect=m.hit_node)
    c.tree.unlock(m.hit_node)
    assert not res.inserted and res.evicted_states == 2
    assert (c.tree.used_bytes, c.tree.kv_tokens, c.tree.n_states, c.tree.copy_tokens) == (5, 5, 0, 0)
    c.tree.check_invariants()
