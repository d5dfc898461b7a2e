"""Rules of the ``sglang`` preset found by the differential run against SGLang's own cache code
(``benchmarks/differential_sglang.py``, SGLang 0.5.23: ``UnifiedRadixCache`` with its mamba
component), each worked by hand on a tiny trace in sequential mode (request i at t = i).
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import BIG, TIMING, TINY, arrivals, cat, one_per_session, run, state_depths, toks

from policies.sglang import UnifiedTwoListEviction
from policies.sglang_current import SglangAdmission
from sim.config import SimConfig
from sim.engine import batching
from sim.engine.drivers import run as drive
from sim.engine.events import EventLog, Lookup, Step
from sim.engine.simulation import Simulation
from policies.base import PolicyError
from sim.simulate import build
from traces.base import Request, Trace


def test_decode_tracks_land_on_the_chunk_grid_too():
    """sgl-project/sglang 0.5.23 ``python/sglang/srt/runtime_context.py`` L1974-L1979
    (``mamba_track_grid`` = lcm(mamba_checkpoint_grid(page), --mamba-track-interval)), read by
    ``ScheduleBatch.prepare_for_decode`` (``managers/schedule_batch.py`` L3803-L3816: track when
    ``seq_lens % grid == 0``). With ``--mamba-track-interval 32`` and page 1 the grid is
    lcm(64, 32) = 64, not 32. r0: 70 prompt tokens, 30 output tokens, 99 stored; the prefill track
    is 64 and no multiple of 64 lies in (70, 99], so r1 (the 99 tokens and more) reuses 64, not 96."""
    trace = one_per_session(
        (toks(0, 70), toks(1000, 30)), (cat(toks(0, 70), toks(1000, 29), toks(5000, 10)), toks(9000, 3))
    )
    got, sim = run(trace, "sglang", mamba_track_interval=32)
    assert got == [0, 64]
    assert state_depths(sim.tree)[0] == 64
    # an interval on the chunk grid is unchanged: 128 tracks 128 in a 300 + 100 request
    trace = one_per_session(
        (toks(0, 100), toks(1000, 100)), (cat(toks(0, 100), toks(1000, 99), toks(5000, 5)), toks(9000, 3))
    )
    assert run(trace, "sglang", mamba_track_interval=128)[0] == [0, 128]


def _sessions(*groups):
    """Sessions of requests sent at once (think time 0): session k starts at t = k, so the
    requests of a group share one arrival time, served in the order given."""
    reqs = []
    for k, group in enumerate(groups):
        for turn, (inp, out) in enumerate(group):
            reqs.append(Request(session_id=k, turn=turn, input_tokens=inp, output_tokens=out))
    return Trace("t", reqs)


def test_requests_at_equal_times_are_ordered_as_served():
    """SGLang stamps recency from a counter (``unified_cache/components/base.py``
    ``get_and_increase_time_counter`` L161-L165), so two requests at the same trace time are
    ordered as they are served. no_buffer, a pool of 3 states: r0 = A at t = 0; r1 = C and r2 =
    A + 5 tokens both at t = 1 (r2 hits A's state, served after r1); r3 = D at t = 2 evicts the
    least recent state, C's (A's was refreshed after it), so r4 = A + 1 token reuses A's 10
    tokens. With equal stamps A's state, the older node, went instead (r4 reuses nothing).
    SGLang 0.5.23 driven with the same requests gives 0, 0, 10, 0, 10."""
    one = toks(9000, 1)
    a = toks(0, 10)
    trace = _sessions(
        [(a, one)],
        [(toks(100, 10), one), (cat(a, toks(300, 5)), one)],
        [(toks(200, 10), one)],
        [(cat(a, toks(500, 1)), one)],
    )
    knobs = {"mamba_radix_cache_strategy": "no_buffer", "max_mamba_cache_size": 3}
    assert run(trace, "sglang", **knobs)[0] == [0, 0, 10, 0, 10]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(UnifiedTwoListEviction, "strict_clock", False)
        assert run(trace, "sglang", **knobs)[0] == [0, 0, 10, 0, 0]


def test_a_node_is_never_merged_so_its_kv_outlives_its_child():
    """``unified_tree_core.py`` ``_iteratively_delete_tombstone_ancestors`` (L2289-L2312): "Only
    the Full (base) component decides whether a node survives", and the tree never merges a node
    into its child. Tiny model (a state = 16 B, a token = 2 B), 2 states and 40 tokens of KV,
    no_buffer: r0 = P (20 tokens) and r1 = P[:10] + Q share a stateless node of 10 tokens; r2 = R
    (10) evicts P's state, a leaf, whole; r3 = S (15) needs KV and evicts the least recent leaf,
    Q's 10 tokens, leaving the shared 10 as a stateless leaf: 35 tokens stay (SGLang 0.5.23: 35).
    A node merged into Q's would have given up all 20 (25 left)."""
    one = toks(9000, 1)
    p = toks(0, 20)
    trace = one_per_session((p, one), (cat(p[:10], toks(100, 10)), one), (toks(200, 10), one), (toks(300, 15), one))
    _, sim = run(
        trace,
        "sglang",
        spec=TINY,
        capacity=40 * 2 + 2 * 16,
        mamba_radix_cache_strategy="no_buffer",
        max_mamba_cache_size=2,
    )
    assert sim.tree.kv_tokens == 35 and state_depths(sim.tree) == [10, 15]
    leaves = [n for n in sim.tree.iter_nodes() if n.parent is not None and not n.children]
    assert sorted((n.depth_tokens, n.has_state) for n in leaves) == [(10, False), (10, True), (15, True)]
    sim.tree.check_invariants()


def test_only_the_hit_state_is_locked():
    """A request locks the KV of its whole path but the state of its hit node alone
    (``unified_cache/components/mamba.py`` ``acquire_component_lock`` L465: no walk up the path,
    unlike the full component's). Pool of 2 states, no_buffer: r0 = P (20), r1 = P + 10 (hit 20),
    r2 = P + 15 (hit 30): its new state at 35 evicts P's state at 20, above the locked hit, as a
    tombstone; so r3 (P + 18) reuses 35 and a prompt of P and one token reuses nothing (SGLang
    0.5.23: 0, 20, 30, 35, 0)."""
    one = toks(9000, 1)
    p = toks(0, 38)
    trace = one_per_session((p[:20], one), (p[:30], one), (p[:35], one), (p, one), (cat(p[:20], toks(500, 1)), one))
    got, _ = run(trace, "sglang", mamba_radix_cache_strategy="no_buffer", max_mamba_cache_size=2)
    assert got == [0, 20, 30, 35, 0]


def test_an_insert_at_a_held_state_refreshes_it():
    """``unified_cache/components/mamba.py`` ``commit_insert_component_data`` (L227-L252): an
    insert ending at a node that already holds a state moves it to most recent. Pool of 2 states,
    no_buffer: r0 = A, r1 = B (10 tokens each); r2 = A again reuses nothing (the lookup stops at 9
    tokens, #21158) but its insert refreshes A's state, so r3 = C evicts B's and r4 (A + 1)
    reuses 10 (SGLang 0.5.23: 0, 0, 0, 0, 10); without the refresh A's state went."""
    one = toks(9000, 1)
    a = toks(0, 10)
    trace = one_per_session((a, one), (toks(100, 10), one), (a, one), (toks(200, 10), one), (cat(a, toks(400, 1)), one))
    knobs = {"mamba_radix_cache_strategy": "no_buffer", "max_mamba_cache_size": 2}
    assert run(trace, "sglang", **knobs)[0] == [0, 0, 0, 0, 10]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(UnifiedTwoListEviction, "reinsert_refreshes_state", False)
        assert run(trace, "sglang", **knobs)[0] == [0, 0, 0, 0, 0]


def test_the_lookup_splits_the_node_it_ends_inside_and_refreshes_both_halves():
    """``unified_tree_core.py`` ``_match_prefix_helper`` L960 splits the node where the walk
    (capped at input - 1 tokens) ends, and ``_split_node`` (L1467-L1524) stamps both halves most
    recent. extra_buffer: r0 = A (100 tokens) keeps KV and a state up to 64; r1 = A[:40] + X (50
    tokens, too short to track a state, so it inserts nothing) still splits A's node at 40, and
    both halves carry r1's time."""
    one = toks(9000, 1)
    a = toks(0, 100)
    trace = one_per_session((a, one), (cat(a[:40], toks(300, 10)), one))
    got, sim = run(trace, "sglang", mamba_radix_cache_strategy="extra_buffer")
    assert got == [0, 0]
    nodes = {n.depth_tokens: n for n in sim.tree.iter_nodes() if n.parent is not None}
    assert sorted(nodes) == [40, 64] and nodes[64].has_state and not nodes[40].has_state
    assert nodes[40].last_access == nodes[64].last_access > 0
    sim.tree.check_invariants()


def test_a_decode_track_stays_in_the_output_when_the_prompt_ends_inside_a_hash_block():
    """A decode track is taken where ``kv_committed_len`` (prompt + decoded tokens) reaches a
    multiple of ``mamba_track_grid`` (``runtime_context.py`` L1974-L1979; the track state is
    promoted in ``scheduler_components/batch_result_processor.py`` L1620-L1634,
    ``mamba_last_track_seqlen = track_seqlen``), so it lies past the prompt. 512-token hash
    blocks as in Mooncake: r0's prompt is 6 blocks, 2,651 tokens (the last block 91 tokens), with
    366 output tokens (3,016 stored): extend-time track at 2,624 (inside the last block, which the
    symbol grid cannot hold), decode track at 2,816 (lcm(64, 256) = 256), in the output. r1 shares
    r0's first 5 blocks (2,560 tokens) and reuses nothing: neither state is on its path. SGLang
    0.5.23 driven with the same requests (``benchmarks/differential_sglang.py``'s driver) gives
    0, 0. Before the rule the decode track was mapped back to block 2,816 // 512 = 5, a state at
    2,560 inside r0's prompt, and r1 reused 2,560 (``mooncake:sample`` requests 133, 134, 166, 180,
    201, 298)."""
    reqs = [
        Request(
            session_id=k,
            turn=0,
            input_tokens=np.array([1, 2, 3, 4, 5, 6 + k]),
            output_tokens=np.array([-1 - k]),
            arrival=float(k),
            input_len=n_in,
            output_len=n_out,
        )
        for k, (n_in, n_out) in enumerate([(2651, 366), (3024, 111)])
    ]
    got, sim = run(Trace("t", reqs, block_tokens=512), "sglang", mamba_radix_cache_strategy="extra_buffer")
    assert got == [0, 0]
    # r1's track at the branch point 2,560 (its KV match), r0's and r1's decode tracks in the outputs
    # (2,816 and 3,072, each at the first block boundary past it: r0's 3,016, r1's 3,134)
    assert state_depths(sim.tree) == [2560, 3016, 3134]


def _at_once(*reqs):
    """Open-loop requests all arriving at t = 0, queued in the order given."""
    return Trace(
        "t",
        [
            Request(session_id=k, turn=0, input_tokens=inp, output_tokens=out, arrival=0.0)
            for k, (inp, out) in enumerate(reqs)
        ],
        closed_loop=False,
    )


def _continuous(trace, **knobs):
    """Hit tokens per request and each request's prefill chunks under ``--scheduler continuous``."""
    log = EventLog()
    config = SimConfig(
        policy="sglang", model="qwen3.5-9b", capacity_bytes=10**15, mode="des", scheduler="continuous", **knobs
    )
    res = drive(build(trace, config, observers=(log,)))
    chunks: dict[int, list] = {}
    for ev in log.events:
        for rid, a, b in ev.prefills if isinstance(ev, Step) else ():
            chunks.setdefault(int(rid), []).append((a, b))
    return [int(h) for h in res.requests.sort_values("request_id")["hit_tokens"]], chunks


@pytest.fixture
def uncapped(monkeypatch):
    """A mamba pool smaller than SGLang serves these tests' running requests with: the engine runs
    at most states // 3 of them (rule 19, ``states_per_running_request``) and refuses to start
    under 3. The cache's own behaviour these tests pin (fed to SGLang's cache directly) is run with
    the cap off."""
    monkeypatch.setattr(SglangAdmission, "states_per_running_request", 0)


@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_a_chunk_inside_the_prompt_is_published_before_the_next_step_matches(strategy):
    """``Scheduler.get_next_batch_to_run`` stashes the chunked request before it matches new ones
    (``managers/scheduler.py`` L3919 -> ``stash_chunked_request`` L3772-L3776 ->
    ``checkpoint_kv_cache``, ``mem_cache/common.py`` L271-L281), so a request scheduled while
    another is half-way through its prefill can hit that prefill's chunks. 128-token steps: r0
    (300 tokens) runs 0..128, 128..256, 256..300; r1 (r0's first 200 tokens + 100 of its own)
    waits for budget until the third step, and then hits the state at 128 (no_buffer: a chunk
    end; extra_buffer: the step's track), not the one at 256 (past its 200 shared tokens). With
    chunks inserted only at the prompt's end it hit nothing. SGLang 0.5.23 fed the same steps
    (``differential_sglang.py --scheduler continuous``'s replay) gives 0, 128."""
    r0 = toks(0, 300)
    trace = _at_once((r0, toks(9000, 5)), (cat(r0[:200], toks(5000, 100)), toks(9100, 5)))
    knobs = {"mamba_radix_cache_strategy": strategy, "prefill_chunk_tokens": 128}
    got, chunks = _continuous(trace, **knobs)
    assert chunks[0] == [(0, 128), (128, 256), (256, 300)]
    assert chunks[1][0] == (128, 212)
    assert got == [0, 128]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "publishes_chunks", False)
        assert _continuous(trace, **knobs)[0] == [0, 0]


def test_a_step_holds_prefill_chunk_tokens_and_a_cut_chunk_ends_on_a_page():
    """``PrefillAdder`` (``managers/schedule_policy.py``): ``rem_chunk_tokens`` is
    ``--chunked-prefill-size`` less the decode tokens mixed into the step (L654-L655), each chunk
    is charged to it (L942-L943), and a truncated chunk ends on a page (L1665-L1670). Page 16,
    ``--prefill-chunk`` 128 under the default 8,192-token step budget: r0 (10 prompt tokens, 50
    output tokens) and r1 (300 tokens) arrive together. Step 1: r0 0..10, r1 gets 118 floored to
    the page, 0..112; step 2: r0 decodes one token, r1 gets 127, 112..239 floored to 224; step 3
    runs the last 76. Before, the step budget alone cut r1 (0..300 in one chunk)."""
    trace = _at_once((toks(0, 10), toks(9000, 50)), (toks(1000, 300), toks(9100, 5)))
    _, chunks = _continuous(trace, page_size=16, prefill_chunk_tokens=128)
    assert chunks[0] == [(0, 10)]
    assert chunks[1] == [(0, 112), (112, 224), (224, 300)]


def test_a_waiting_request_is_matched_again_when_it_is_scheduled():
    """SGLang matches each waiting request every time it tries to admit it
    (``_get_new_batch_prefill_raw``, ``managers/scheduler.py`` L4260:
    ``req.init_next_round_input(self.tree_cache)``), so what is cached while it waits counts.
    extra_buffer, page 16, 128-token steps: r0 (250 tokens) runs 0..128 (track 128) and 128..250
    (track 192, published at the prompt's end); r1 (r0's first 200 tokens + 100) is first tried in
    the second step with 6 tokens of budget left, which round to no page: it waits. Matched again
    in the third step it hits 192; the scheduler kept its first match before and hit 128. SGLang
    0.5.23 fed the same steps (page 16) gives 0, 192."""
    r0 = toks(0, 250)
    trace = _at_once((r0, toks(9000, 5)), (cat(r0[:200], toks(5000, 100)), toks(9100, 5)))
    got, chunks = _continuous(trace, page_size=16, prefill_chunk_tokens=128, max_num_batched_tokens=128)
    assert chunks[0] == [(0, 128), (128, 250)]
    assert chunks[1][0][0] == 192
    assert got == [0, 192]
    # the lookup given back let go of its lock on 128: no lock is left once every request has ended
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=10**15,
        mode="des",
        scheduler="continuous",
        page_size=16,
        prefill_chunk_tokens=128,
        max_num_batched_tokens=128,
    )
    sim = build(trace, config)
    drive(sim)
    assert all(n.lock == 0 for n in sim.tree.iter_nodes() if n.parent is not None)


def test_a_published_chunk_is_charged_to_the_cache_not_to_its_request():
    """What a published chunk holds moves from the running request to the cache (as the prompt's KV
    does at its end), so nothing is charged twice. Tiny model (a token 2 B, a state 16 B),
    no_buffer, 128-token steps, r0 alone: 300 prompt tokens, 3 output tokens. Chunks 0..128 and
    128..256 are published with their states (128, 256), the prompt's end adds KV to 300 and the
    state at 300; the two decode steps charge a token each; the request's working slot is held
    throughout. The peak, at the last decode step: 302 tokens of KV and 4 states (3 cached, 1
    running), 668 B. Charged twice, the third step would hold 256 + 300 tokens and 3 states."""
    trace = _at_once((toks(0, 300), toks(9000, 3)))
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=10**15,
        mode="des",
        scheduler="continuous",
        mamba_radix_cache_strategy="no_buffer",
        prefill_chunk_tokens=128,
        max_num_batched_tokens=128,
    )
    sim = build(trace, config, spec=TINY, timing=TIMING)
    res = drive(sim)
    assert sorted(n.depth_tokens for n in sim.tree.iter_nodes() if n.has_state) == [128, 256, 300, 302]
    assert (sim.tree.kv_bytes_per_token, sim.tree.state_bytes) == (2, 16)
    assert res.summary.peak_charged_bytes == 302 * 2 + 4 * 16


def test_an_insert_carries_one_state_so_the_end_does_not_refresh_the_prompt_state():
    """Each of SGLang's inserts hands the tree one state, at its end
    (``components/mamba.py`` ``commit_insert_component_data`` L227-L252 on the insert's last node;
    ``refresh_lru`` leaves the states the walk passes alone, L127-L149), so a request's end does
    not refresh its prompt-end state; and a request that ends in the step its prompt ends is
    released without a checkpoint (``scheduler_components/batch_result_processor.py`` L379-L395: ``release_kv_cache``
    when ``req.finished()``, else ``checkpoint_kv_cache``), handing its running slot to the tree.
    no_buffer, a pool of 4 states, continuous: r0 (A, 10 tokens, 5 out) and r1 (B, 10 tokens, 1
    out) run together: r0's prompt state at 10, then r1's end state at 10 (r1 ends at once, no
    eviction), then r0's end state at 14. r2 (C, 2 out) at t = 1 takes the free slot and its
    prompt state evicts the least recent state: r0's at 10. r3 (A + 5 tokens) at t = 2 reuses
    nothing. With r0's end refreshing its prompt state (the last insert carried every state),
    r1's went instead and r3 reused 10. SGLang 0.5.23 fed the same steps gives 0, 0, 0, 0."""
    a, b, c = toks(0, 10), toks(100, 10), toks(200, 10)
    reqs = [
        Request(session_id=k, turn=0, input_tokens=inp, output_tokens=out, arrival=t)
        for k, (inp, out, t) in enumerate(
            [
                (a, toks(9000, 5), 0.0),
                (b, toks(9100, 1), 0.0),
                (c, toks(9200, 2), 1.0),
                (cat(a, toks(300, 5)), toks(9300, 1), 2.0),
            ]
        )
    ]
    trace = Trace("t", reqs, closed_loop=False)
    got, _ = _continuous(trace, mamba_radix_cache_strategy="no_buffer", max_mamba_cache_size=4)
    assert got == [0, 0, 0, 0]


def test_a_request_that_ends_with_its_prompt_is_released_without_a_checkpoint(uncapped):
    """A request whose first sampled token is its last is released, not checkpointed
    (``scheduler_components/batch_result_processor.py`` L379-L395: ``release_kv_cache`` when ``req.finished()``), and a
    finished request hands its running slot to the tree (``unified_radix_cache.py`` L1167-L1168:
    "A finished request hands its component state (mamba) to the tree instead of forking it"): its
    one state needs no room of its own. no_buffer, a pool of 2 states, one output token each: X at
    t = 0 and Y at t = 1 leave their states at 10; Z at t = 2 evicts X's to run and leaves its own;
    Y + 5 tokens at t = 3 reuses Y's 10. Checkpointed at its prompt's end while its slot was still
    held, Z evicted Y's state too and the last request reused nothing. SGLang 0.5.23 fed the same
    steps gives 0, 0, 0, 10."""
    x, y, z = toks(0, 10), toks(100, 10), toks(200, 10)
    reqs = [
        Request(session_id=k, turn=0, input_tokens=inp, output_tokens=toks(9000 + 10 * k, 1), arrival=float(k))
        for k, inp in enumerate([x, y, z, cat(y, toks(300, 5))])
    ]
    trace = Trace("t", reqs, closed_loop=False)
    got, _ = _continuous(trace, mamba_radix_cache_strategy="no_buffer", max_mamba_cache_size=2)
    assert got == [0, 0, 0, 10]


def test_a_state_above_a_running_request_is_a_victim_once_its_lock_moves_on(uncapped):
    """A running request locks the state of the node its lock ends at only (``components/mamba.py``
    ``acquire_component_lock`` L465), and a checkpoint moves that lock to the node the insert ended
    on (``unified_radix_cache.py`` L1300-L1312: ``unlock(req.lock)``, ``lock(new_last_node)``), so
    the state it hit is a victim again while the request still runs. no_buffer, a pool of 3 states,
    continuous: r0 (A, 10 tokens, 1 out) leaves its state at 10; r1 (A + 10, 400 out) at t = 1
    hits it, runs (its slot) and leaves its prompt state at 20; r2 (C, 1 out) at t = 2 needs a slot
    while r1 decodes: A's state at 10 goes and r2 runs at once; r3 (A + 5) at t = 3 reuses nothing.
    The tree told the policy of a node's lock only when it went from 0 to 1 or back, so A's node,
    still locked by r1's path below it, stayed out of the state list and r2 waited 2 s for r1 to end.
    SGLang 0.5.23 fed the same steps gives 0, 10, 0, 0 (evicting A's state for r2)."""
    a = toks(0, 10)
    reqs = [
        Request(session_id=k, turn=0, input_tokens=inp, output_tokens=toks(9000 + 1000 * k, n), arrival=float(k))
        for k, (inp, n) in enumerate(
            [(a, 1), (cat(a, toks(100, 10)), 400), (toks(200, 10), 1), (cat(a, toks(300, 5)), 1)]
        )
    ]
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=10**15,
        mode="des",
        scheduler="continuous",
        mamba_radix_cache_strategy="no_buffer",
        max_mamba_cache_size=3,
    )
    res = drive(build(Trace("t", reqs, closed_loop=False), config)).requests.sort_values("request_id")
    assert list(res["hit_tokens"]) == [0, 10, 0, 0]
    assert res["queue_s"].iloc[2] < 0.1


def _memory_run(trace, capacity, scheduler="continuous", strategy="no_buffer", **knobs):
    """Hit tokens, queueing delays and memory overshoots of ``sglang`` (no_buffer by default) on
    the tiny model (a token 2 B, a state 16 B) with ``capacity`` bytes."""
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=capacity,
        mode="des",
        scheduler=scheduler,
        mamba_radix_cache_strategy=strategy,
        **knobs,
    )
    res = drive(build(trace, config, spec=TINY, timing=TIMING))
    req = res.requests.sort_values("request_id")
    return [int(h) for h in req["hit_tokens"]], list(req["queue_s"]), res.summary.memory_overshoots


def test_a_request_waiting_for_memory_holds_no_lock_and_is_matched_again():
    """A waiting request holds nothing: each pass matches it again (``_get_new_batch_prefill_raw``,
    ``managers/scheduler.py`` L4260, ``init_next_round_input``), ``PrefillAdder.add_one_req`` pins
    its hit only while it checks the budget (``with self._lock_node(req.last_node)``,
    ``schedule_policy.py`` L1431, the context manager L1225-L1239 unlocks on ``NO_TOKEN``) and
    locks it for the run only when it admits it (``_commit_prefill_admission``, L1690); the check
    compares with the free and evictable sizes and evicts nothing (``PrefillMemoryBudget``,
    ``mem_cache/prefill_budget.py`` L91-L97, L114-L130). Tiny model,
    180 B, continuous: r0 = H (10 tokens, 1 out) leaves H's 10 tokens and state (36 B); r1 = D (10
    tokens, 50 out) and r2 = W (H + 60 tokens) arrive at t = 1. D runs (its slot, its prompt's KV
    and state: 52 B); W needs 60 tokens and a slot (136 B) and waits. D's decode tokens fill the
    pool and evict H, which no one holds: W, matched again when D has ended, reuses nothing, and
    no step ran over the capacity. Keeping its first lookup, W's lock pinned H: D ran 3 steps over
    the capacity and W reused H's 10 tokens."""
    h = toks(0, 10)
    trace = arrivals([(h, 1, 0.0), (toks(100, 10), 50, 1.0), (cat(h, toks(200, 60)), 1, 1.0)])
    hits, queue, overshoots = _memory_run(trace, 180)
    assert (hits, overshoots) == ([0, 0, 0], 0)
    assert queue[2] > 0.04  # W waited for D's end
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "rematches_waiting", False)
        hits, _, overshoots = _memory_run(trace, 180)
        assert (hits, overshoots) == ([0, 0, 10], 3)


def test_under_fcfs_a_request_is_matched_when_the_server_takes_it():
    """The same rule under ``--scheduler fcfs``: SGLang matches a request when it schedules it
    (``scheduler.py`` L4260), not when it arrives. r0 = A (40 tokens, 3 out) and r1 = A + 5 tokens
    arrive together; r1 waits for the one server while r0's prefill runs and inserts A's state at
    40, and then reuses it. Looked up at its arrival (the paper's policies' queue), it reused
    nothing. Its queueing delay still counts from its arrival."""
    a = toks(0, 40)
    trace = _at_once((a, toks(9000, 3)), (cat(a, toks(300, 5)), toks(9300, 1)))
    hits, queue, _ = _memory_run(trace, BIG, scheduler="fcfs")
    assert hits == [0, 40]
    assert queue[1] > 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "rematches_waiting", False)
        assert _memory_run(trace, BIG, scheduler="fcfs")[0] == [0, 0]


def test_under_fcfs_the_request_end_carries_one_state_and_leaves_the_prompt_state_alone():
    """Rule 11 under ``--scheduler fcfs``: each of SGLang's inserts hands the tree one state, at its
    end (``components/mamba.py`` ``commit_insert_component_data`` L227-L252; ``refresh_lru`` leaves
    the states its walk passes alone, L127-L149), so a request's end does not refresh the prompt
    state its prefill inserted. no_buffer, a pool of 3 states, one server: r0 = A (10 tokens, 400
    out) inserts A's state at 10 at its prefill's end; r1 = B (t = 0.1, 1 out) its state at 10; r0
    ends (its state at 409); r2 = C (t = 1) takes the pool's last room by evicting the least recent
    state, A's at 10; r3 = A + 5 tokens (t = 2) reuses nothing. The end insert carried every state
    of r0 before and refreshed A's at 10: B's went instead and r3 reused 10.
    ``differential_sglang.py --scheduler fcfs --memory 10GB --pools`` found it: 1,224 -> 1,235 of
    1,235 requests equal."""
    a = toks(0, 10)
    trace = arrivals([(a, 400, 0.0), (toks(100, 10), 1, 0.1), (toks(200, 10), 1, 1.0), (cat(a, toks(300, 5)), 1, 2.0)])
    hits, _, _ = _memory_run(trace, BIG, scheduler="fcfs", max_mamba_cache_size=3)
    assert hits == [0, 0, 0, 0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "publishes_chunks", False)
        assert _memory_run(trace, BIG, scheduler="fcfs", max_mamba_cache_size=3)[0] == [0, 0, 0, 10]


def test_extra_buffer_end_without_a_track_since_the_prompt_inserts_nothing():
    """extra_buffer: a checkpoint clears the request's tracked length (``components/mamba.py``
    ``cleanup_after_caching_req`` L726-L727), so a request that takes no decode track after its
    prompt's checkpoint ends with a cache length of 0 (``prepare_for_caching_req`` L628-L633,
    ``_select_finished_checkpoint`` L582-L593) and ``checkpoint_into_tree`` inserts nothing
    (``unified_radix_cache.py`` L1220-L1225): the prompt's track is not refreshed at the request's
    end (``Simulation.end_state`` / ``end_without_insert``, under fcfs and continuous). fcfs, a
    pool of 2 states: r0 = A (130 tokens, 100 out: its decode ends at 229, below the first decode
    track at 256) tracks 128 at its prefill's end; r1 = B (130 tokens, t = 0.05) tracks its 128
    while r0 decodes; r0 ends; r2 = C (t = 1) evicts the least recent state, A's; r3 = A + 5 tokens
    (t = 2) reuses nothing. The end inserted A's track again before and refreshed it: B's went
    instead and r3 reused 128. Found by ``differential_sglang.py --scheduler fcfs --memory 10GB
    --pools`` (extra_buffer: SGLang's state LRU held a prompt track older than the simulator's)."""
    a = toks(0, 130)
    trace = arrivals(
        [(a, 100, 0.0), (toks(200, 130), 5, 0.05), (toks(400, 130), 5, 1.0), (cat(a, toks(600, 5)), 1, 2.0)]
    )
    knobs = {"scheduler": "fcfs", "strategy": "extra_buffer", "max_mamba_cache_size": 2}
    assert _memory_run(trace, BIG, **knobs)[0] == [0, 0, 0, 0]

    def every_time(self, f, prompt_in):  # the end inserting its deepest state whatever came before
        f.prefill_cps, f.decode_cps = [], sorted(set(f.prefill_cps) | set(f.decode_cps))[-1:]
        return f.decode_cps[-1] if f.decode_cps else -1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Simulation, "end_state", every_time)
        assert _memory_run(trace, BIG, **knobs)[0] == [0, 0, 0, 128]


def test_a_waiting_request_is_admitted_only_with_room_for_its_output_and_the_running_outputs():
    """SGLang 0.5.23 ``PrefillAdder.add_one_req`` (``managers/schedule_policy.py`` L1404-L1412)
    asks for the request's whole uncached prompt, its ``max_new_tokens`` (clipped at 4096,
    L89-L91) and a page (``per_req_token_overhead``, L733-L737), and ``check_prefill``
    (``mem_cache/prefill_budget.py`` L125-L130) admits it only below the free and evictable size
    less ``total_offset`` (L91-L106), which holds what each running request may still decode
    (``_get_running_request_total_token_offset``, L785-L794: ratio 1 under ``ignore_eos``, which
    SGLang's benchmark client sends with ``max_new_tokens`` = the output length,
    ``benchmark/serving.py`` L700-L703). After the refusal no pass tries the queue until a running
    request leaves (``batch_is_full``, ``managers/scheduler.py`` L4098-L4101, L4279-L4284). Tiny
    model (a token 2 B, a state 16 B), 240 B, no_buffer, continuous, steps of 1 ms: D (10 tokens,
    80 out, t = 0) decodes; W (20 tokens, 1 out) arrives at t = 0.02, when D has 20 output tokens
    and holds its slot and 30 tokens (76 B): free 164 B. W's chunk and slot (56 B) fit, but the
    engine asks 20 + 1 + 1 tokens for W, 59 for D's remaining output, one more for the strict
    ``<`` (82 tokens, 164 B) and W's slot (180 B): W waits for D's end (t = 0.080), 0.060 s.
    Charged its chunk alone, W ran at once."""
    trace = arrivals([(toks(100, 10), 80, 0.0), (toks(200, 20), 1, 0.02)])
    hits, queue, overshoots = _memory_run(trace, 240)
    assert (hits, overshoots) == ([0, 0], 0)
    assert queue[1] == pytest.approx(0.060, abs=1e-6)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "reserves_output", False)
        assert _memory_run(trace, 240)[1][1] < 1e-6
    # with the states in a pool of their own (6 states, 96 B: two running requests, rule 19) the KV
    # budget is SGLang's: a pool of 112 tokens (D's 30 and 82 free) admits W at once, 111 do not.
    # SGLang 0.5.23's own PrefillAdder fed D's state answers the same (CONTINUE with 83 tokens free
    # before D's token of the step, NO_TOKEN with 82):
    # benchmarks/results/2026-12-05-sglang-admission/verify_rule16.py
    assert _memory_run(trace, 96 + 112 * 2, max_mamba_cache_size=6)[1][1] < 1e-6
    assert _memory_run(trace, 96 + 111 * 2, max_mamba_cache_size=6)[1][1] == pytest.approx(0.060, abs=1e-6)


def test_every_32nd_pass_touches_the_waiting_requests_prefixes():
    """SGLang 0.5.23 ``SchedulePolicy._touch_waiting_prefixes`` (``managers/schedule_policy.py``
    L280-L302; ``WAITING_PREFIX_REFRESH_INTERVAL`` 32, L139; ``SGLANG_ENABLE_WAITING_PREFIX_REFRESH``
    on, ``environ.py`` L645; fcfs and LRU, the defaults): ``calc_priority`` counts the passes that
    find requests waiting and, at the first and every 32nd, touches the prefixes of the first 128
    waiting requests, head last (``touch_waiting_prefix``, ``mem_cache/common.py`` L215-L218: the
    match's refresh, nothing held). no_buffer, a pool of 34 states, continuous, steps of 8 tokens
    (``--prefill-chunk 8``, ``--max-num-batched-tokens 8``): r0 = P (8 tokens, pass 0) and r1 = X
    (8 tokens, pass 1) leave their states; at t = 2 L (256 tokens, 2 out), W1 (3 tokens) and W2 =
    P + 2 tokens arrive. L's prompt takes 32 steps, each publishing its chunk's state; W1 and W2
    wait (each step's budget is spent). Pass k is L's step k - 1: at pass 32, before L's step 31,
    the pool holds P, X, L's states at 8 .. 240 and L's slot (33), and the touch makes P the most
    recent. L's state at 248 fills the pool, its state at 256 evicts the least recent, X; W1's
    slot (step 33) evicts L's state at 8, and W2 reuses P's 8 tokens. Without the touch P went
    first, then X: W2 reused nothing. SGLang 0.5.23 fed the test's steps and touches gives 0, 0, 0,
    0, 8 (without the touches 0, 0, 0, 0, 0): ``benchmarks/results/2026-12-05-sglang-admission/``
    ``verify_rule17.py``."""
    p = toks(0, 8)
    trace = arrivals(
        [
            (p, 1, 0.0),
            (toks(100, 8), 1, 1.0),
            (toks(1000, 256), 2, 2.0),
            (toks(500, 3), 1, 2.0),
            (cat(p, toks(300, 2)), 1, 2.0),
        ]
    )
    knobs = {"max_mamba_cache_size": 34, "prefill_chunk_tokens": 8, "max_num_batched_tokens": 8}
    assert _memory_run(trace, BIG, **knobs)[0] == [0, 0, 0, 0, 8]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "waiting_refresh", None)
        assert _memory_run(trace, BIG, **knobs)[0] == [0, 0, 0, 0, 0]
    # pass 32 is the one: with one state fewer L's state at 248 (its step 31, just after the touch)
    # evicts already, X, and W2 still reuses P (a touch at pass 33 came after that eviction: P went);
    # with two more nothing of P is evicted either way; with two fewer P went at L's step 30,
    # before the touch
    assert _memory_run(trace, BIG, **{**knobs, "max_mamba_cache_size": 33})[0][4] == 8
    assert _memory_run(trace, BIG, **{**knobs, "max_mamba_cache_size": 36})[0][4] == 8
    assert _memory_run(trace, BIG, **{**knobs, "max_mamba_cache_size": 32})[0][4] == 0


def test_the_waiting_prefixes_are_touched_head_last():
    """The same touch (``_touch_waiting_prefixes`` walks ``reversed(waiting_queue[:128])``,
    ``schedule_policy.py`` L301: "Head last, so LRU evicts in reverse admission order"), the head's
    prefix then the most recent. The KV list decides here: 100 states, 268 KV tokens, steps of 8
    tokens. r0 = P and r1 = X (8 tokens each) are cached; at t = 2 L (256 tokens, 2 out), W1 = X
    + 1 token (the head) and W2 = P + 2 tokens. Pass 32 touches W2's P, then W1's X. L's last
    chunk (248 -> 256) needs room: the KV list's least recent leaf, P, goes, and W1 reuses X's 8
    tokens. Touched head first, X went (and P after it for W1's own tokens): W1 reused nothing."""
    p, x = toks(0, 8), toks(100, 8)
    trace = arrivals(
        [
            (p, 1, 0.0),
            (x, 1, 1.0),
            (toks(1000, 256), 2, 2.0),
            (cat(x, toks(500, 1)), 1, 2.0),
            (cat(p, toks(300, 2)), 1, 2.0),
        ]
    )
    knobs = {"max_mamba_cache_size": 100, "prefill_chunk_tokens": 8, "max_num_batched_tokens": 8}
    assert _memory_run(trace, 100 * 16 + 268 * 2, **knobs)[0] == [0, 0, 0, 8, 0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batching, "reversed", list, raising=False)  # the queue's order: the head first
        assert _memory_run(trace, 100 * 16 + 268 * 2, **knobs)[0] == [0, 0, 0, 0, 0]


def test_a_chunk_that_ends_its_prompt_holds_back_its_output_in_the_pass():
    """``add_chunked_req`` charges the pass the continuing chunk, a page and, when the chunk ends
    the prompt, the request's output (``_update_prefill_budget(0, extend_len, max_new if not
    truncated else 0, ...)``, ``schedule_policy.py`` L1207-L1219 -> ``PrefillBudget.reserve``,
    ``mem_cache/prefill_budget.py`` L156-L168), before the waiting requests are tried. States in a
    pool of their own (6 states: two running requests, rule 19), steps of 8 tokens: D (20 tokens,
    80 out) and W (20 tokens, 1 out) arrive at t = 0; D's chunks take the first two steps whole;
    in the third D's last chunk (4 tokens) ends its prompt and leaves 4 for W, which needs 20 + 1
    + 1 + 1 (strict) tokens and D's page and 80 output tokens: 104 free beside D's 20. With 124
    KV tokens W starts then (t = 0.002); with 123 it waits for D's end (t = 0.082)."""
    trace = arrivals([(toks(100, 20), 80, 0.0), (toks(200, 20), 1, 0.0)])
    knobs = {"max_mamba_cache_size": 6, "prefill_chunk_tokens": 8, "max_num_batched_tokens": 8}
    assert _memory_run(trace, 96 + 124 * 2, **knobs)[1][1] == pytest.approx(0.002, abs=1e-6)
    assert _memory_run(trace, 96 + 123 * 2, **knobs)[1][1] == pytest.approx(0.082, abs=1e-6)


def test_an_output_is_held_back_up_to_the_clip():
    """``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (4096, ``schedule_policy.py`` L89-L91): the
    budget holds back at most 4096 tokens of a request's output, whatever its ``max_new_tokens``
    (the request still decodes them all); a page is the preset's ``--page-size``."""
    adm = SglangAdmission(SglangAdmission.Params(page_size=16))
    assert [adm.output_reserve(n) for n in (-3, 0, 100, 4096, 5000)] == [0, 0, 100, 4096, 4096]
    assert adm.page_reserve == 16


@pytest.mark.parametrize(("mode", "scheduler"), [("des", "continuous"), ("des", "fcfs"), ("sequential", "fcfs")])
def test_a_prompt_longer_than_the_engine_takes_is_aborted_at_arrival(mode, scheduler):
    """SGLang 0.5.23 ``TpModelWorker.get_worker_info`` (``managers/tp_worker.py`` L568-L572):
    ``max_req_input_len = min(context_len - 1, kv_pool - 1) - 5``; ``Scheduler._handle_generate_request``
    (``managers/scheduler.py`` L3246-L3254) calls ``validate_input_length`` (``managers/utils.py``
    L259-L289): a prompt of ``max_req_input_len`` tokens or more is truncated only with
    ``--allow-auto-truncate`` (default False, ``arg_groups/fields/serving.py`` L254-L257), else the
    request is finished with ``FINISH_ABORT`` (``Req.set_finish_with_abort``,
    ``managers/schedule_batch.py`` L2221-L2238): nothing of its prompt is computed or cached. Tiny
    model (a token 2 B, a state 16 B), 288 B with a mamba pool of 4 states: a KV pool of 224 B =
    112 tokens, so prompts of 106 tokens or more are aborted. no_buffer, chunks of 50: r0 = P (106
    tokens, t = 0) is aborted, so r1 = P[:50] + 10 tokens (t = 1) finds nothing; the summary counts
    r1's 60 prompt tokens only. Run (as before this rule), r0 left its chunk state at 50 and r1
    reused it; a 105-token P runs under the rule too."""
    from sim.cli.run import aborted_note, json_row

    def go(n):
        trace = arrivals([(toks(0, n), 1, 0.0), (cat(toks(0, 50), toks(500, 10)), 1, 1.0)])
        config = SimConfig(
            policy="sglang",
            model="qwen3.5-9b",
            capacity_bytes=288,
            max_mamba_cache_size=4,
            mode=mode,
            scheduler=scheduler,
            mamba_radix_cache_strategy="no_buffer",
            prefill_chunk_tokens=50,
        )
        return config, drive(build(trace, config, spec=TINY, timing=TIMING))

    config, res = go(106)
    req, s = res.requests, res.summary
    assert list(req["aborted"]) == [True, False]
    assert list(req["hit_tokens"]) == [0, 0]
    assert list(req["input_tokens"]) == [106, 60]
    assert list(req["output_tokens"]) == [0, 1]
    assert np.isnan(req["e2e_s"][0]) and not np.isnan(req["e2e_s"][1])
    assert (s.aborted_requests, s.input_tokens, s.token_hit_rate, s.request_hit_rate) == (1, 60, 0.0, 0.0)
    assert json_row(config, s)["aborted_requests"] == 1
    assert aborted_note([s]).endswith(": sglang 1")
    assert list(go(105)[1].requests["hit_tokens"]) == [0, 50]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "input_limit", lambda self, kv_pool_tokens: None)
        before = go(106)[1]
        assert list(before.requests["hit_tokens"]) == [0, 50]
        assert before.summary.aborted_requests == 0


def test_a_pass_goes_on_during_a_chunked_prefill_though_the_batch_is_full():
    """SGLang 0.5.23 ``Scheduler._get_new_batch_prefill_raw`` returns before it matches anyone while
    the batch is full (``batch_is_full``, set on ``NO_TOKEN``, ``managers/scheduler.py``
    L4279-L4284) *and no chunked prefill goes on* (``and self.chunked_req is None``, L4098-L4100;
    with only the chunked request running, the decode batch is empty and the flag is cleared too,
    L4093-L4096): while a request's prefill is chunked, every pass matches the queue's head again
    (``init_next_round_input``, L4260). Tiny model (a token 2 B, a state 16 B), 300 B,
    extra_buffer (3 slots a running request), page 4, chunks of 10 tokens, steps of 1 ms: C (30
    tokens, 1 out, t = 0) runs in chunks of 8, 8, 8, 6 (a cut chunk ends on the page); W (2 tokens,
    100 out) arrives at t = 0.0005. At t = 0.001 C's chunk leaves 2 tokens of the step, W's whole
    prompt: W is matched and refused (the engine asks 2 + 100 + a page 4 + 1 tokens for W and C's
    page 4: 222 B, and W's 3 slots, against 300 B less C's 16 tokens and 3 slots, 220 B), so the
    batch is full; at t = 0.002 and 0.003 C's prefill is still chunked, so W is matched again and
    refused; C ends with its prompt, and W runs at t = 0.004, matched a fourth time. With the batch
    closed through the chunked prefill W was matched at 0.001 and 0.004 only."""
    trace = arrivals([(toks(0, 30), 1, 0.0), (toks(500, 2), 100, 0.0005)])
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=300,
        mode="des",
        scheduler="continuous",
        mamba_radix_cache_strategy="extra_buffer",
        page_size=4,
        prefill_chunk_tokens=10,
        max_num_batched_tokens=10,
    )
    log = EventLog()
    drive(build(trace, config, spec=TINY, timing=TIMING, observers=(log,)))
    steps = [e.prefills for e in log.events if isinstance(e, Step) and e.prefills]
    assert steps == [((0, 0, 8),), ((0, 8, 16),), ((0, 16, 24),), ((0, 24, 30),), ((1, 0, 2),)]
    w = [e.t for e in log.events if isinstance(e, Lookup) and e.request.request_id == 1]
    assert w == pytest.approx([0.001, 0.002, 0.003, 0.004], abs=1e-6)


def test_the_waiting_touch_of_a_preempted_request_walks_its_generated_tokens_too():
    """SGLang 0.5.23 ``touch_waiting_prefix`` (``mem_cache/common.py`` L215-L218) touches the radix
    key of ``req.origin_input_ids + req.output_ids``: a retracted request waiting again refreshes
    the state its prompt *and the tokens it generated* reach (``UnifiedRadixCache.touch_prefix``,
    ``unified_radix_cache.py`` L647-L652: the match's refresh, the consumed state only). The
    continuous scheduler touches ``Seq.target`` tokens, the prompt plus what was generated before a
    preemption (``ContinuousEngine._pass_open``); here ``Simulation.touch_prefix`` is driven
    directly between sequential requests. Tiny model, no_buffer, chunks of 8, a mamba pool of 4
    states, KV ample: r0 = P (16) + O[:8] + 8 tokens leaves states at 8, 16, 24 and 32 (the pool is
    full). R (prompt P, output O), preempted after generating 9 tokens, is touched at t = 1: its
    25 tokens reach the state at 24, which becomes the most recent. r1 (16 fresh tokens, t = 2)
    evicts the two least recent states for its own at 8 and 16: r0's at 8 and 16; r2 = P + O[:8]
    + 4 tokens (t = 3) reuses 24 tokens. Touched with its prompt alone, R refreshed the state at
    16, r1 evicted 8 and 24, and r2 reused 16."""
    p, o = toks(0, 16), toks(5000, 16)
    trace = one_per_session(
        (cat(p, o[:8], toks(700, 8)), toks(900, 1)),
        (toks(300, 16), toks(901, 1)),
        (cat(p, o[:8], toks(800, 4)), toks(902, 1)),
        (p, o),  # R: only touched
    )
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=BIG,
        mode="sequential",
        mamba_radix_cache_strategy="no_buffer",
        prefill_chunk_tokens=8,
        max_mamba_cache_size=4,
    )
    sim = build(trace, config, spec=TINY, timing=TIMING)
    reqs = trace.requests

    def serve(i, t):
        f = sim.sequential_lookup(reqs[i], t)
        sim.sequential_insert(f, t)
        return f.hit_tokens

    assert serve(0, 0.0) == 0
    assert state_depths(sim.tree) == [8, 16, 24, 32]
    sim.touch_prefix(reqs[3], 1.0, 16 + 9)
    assert serve(1, 2.0) == 0
    assert serve(2, 3.0) == 24


@pytest.mark.parametrize(
    ("policy", "knobs", "limit"),
    [
        ("sglang", {"mamba_radix_cache_strategy": "no_buffer", "max_mamba_cache_size": 4}, 106),
        ("sglang", {"gpu_memory": "400B"}, 106),
        ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}, 106),
        ("sglang", {"mamba_radix_cache_strategy": "extra_buffer"}, 90),
        ("sglang-0.5.9-no-buffer", {}, 106),
        ("sglang-0.5.9-extra-buffer", {}, 90),
        ("sglang-0.5.8-no-buffer-pathrefresh", {}, 106),
        ("sglang-0.5.9-no-buffer", {"state_pool": "4"}, 82),
        ("vllm", {}, None),
        ("marconi", {}, None),
    ],
)
def test_the_input_limit_is_the_kv_pool_less_six_tokens(policy, knobs, limit):
    """``max_req_input_len`` = min(context - 1, KV pool - 1) - 5 (SGLang 0.5.23
    ``managers/tp_worker.py`` L568-L572; 0.5.9 ``tp_worker.py`` L287-L291), the KV pool in tokens
    of a token 2 B and a state 16 B: 288 B less a mamba pool of 4 states, 224 B = 112 tokens ->
    106; ``--gpu-memory 400B``, whose split gives the mamba pool floor(400 x 0.9 / 1.9 / 16) = 11
    states, 224 B -> 106; with one budget (no pool) 240 B less one running request's state slots
    (no_buffer 1: 112 tokens -> 106; extra_buffer 3: 96 -> 90); ``--state-pool 4`` on 240 B: 88 ->
    82. Engines that accept any prompt (vLLM's preset, the paper's policies) have none."""
    capacity = 288 if knobs.get("max_mamba_cache_size") else 240
    config = SimConfig(policy=policy, model="qwen3.5-9b", capacity_bytes=capacity, mode="sequential", **knobs)
    sim = build(arrivals([(toks(0, 10), 1, 0.0)]), config, spec=TINY, timing=TIMING)
    assert sim.input_limit == limit


def test_on_one_budget_a_state_above_a_locked_hit_goes_when_no_leaf_is_free():
    """One budget (no mamba pool knob): the two lists merged by recency, and when the KV list is
    empty the state list's head still goes. The ``sglang`` preset locks only the hit's state
    (``acquire_component_lock`` L465), so a state above a running request's hit is evictable while
    every leaf is locked. Tiny model (a state = 16 B, a token = 2 B), 92 bytes, no_buffer: r0 = P
    (10 tokens), r1 = P + 10 (hit 10): 20 tokens and 2 states = 72 B. r2 = P + 20 hits 20 (the one
    leaf, locked) and needs 36 B with 20 free: the only candidate is P's state at 10 (a tombstone,
    its KV kept), and r2's 30 tokens and 2 states fill the 92 B. r3 = P + 1 other token then
    reuses nothing. Had eviction stopped at the empty KV list, r2 stored nothing and r3 reused 10."""
    one = toks(9000, 1)
    p = toks(0, 30)
    trace = one_per_session((p[:10], one), (p[:20], one), (p, one), (cat(p[:10], toks(500, 1)), one))
    got, sim = run(trace, "sglang", spec=TINY, capacity=92, mamba_radix_cache_strategy="no_buffer")
    assert got == [0, 10, 20, 0]
    # r3's 18 B: the state at 20 goes first (refreshed by r2's hit, before r2's insert stamped the
    # leaf at 30), then the leaf at 30 whole; P + 10 stays as a stateless leaf: 21 tokens, 1 state
    assert state_depths(sim.tree) == [11] and sim.tree.kv_tokens == 21
    sim.tree.check_invariants()


@pytest.mark.parametrize(
    ("strategy", "pool", "queued", "uncapped"),
    [
        ("no_buffer", 6, [0.0, 0.0, 0.003], [0.0, 0.0, 0.0]),
        ("no_buffer", 5, [0.0, 0.003, 0.006], [0.0, 0.0, 0.0]),
        ("extra_buffer", 10, [0.0, 0.0, 0.003], [0.0, 0.0, 0.0]),
        ("extra_buffer", 9, [0.0, 0.003, 0.006], [0.0, 0.0, 0.0]),
        ("extra_buffer_lazy", 8, [0.0, 0.0, 0.003], [0.0, 0.0, 0.003]),
    ],
)
def test_sglang_runs_at_most_its_mamba_pool_over_the_slots_a_request_takes(strategy, pool, queued, uncapped):
    """Rule 19. SGLang 0.5.23 caps ``max_running_requests`` at ``max_mamba_cache_size // ratio``
    (``KVCacheConfigurator.resolve_max_num_reqs``, ``mem_cache/kv_cache_configurator.py``
    L3134-L3151), ratio 3 (``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``, L227) plus the tracking
    slots of extra_buffer (``_calculate_mamba_ratio`` L3062-L3088, ``get_mamba_tracking_slots``,
    ``mem_cache/allocation_sizing.py`` L11-L19: 2 under the default overlap schedule, 1 lazy), and
    under 1 refuses to start (L3153-L3160); its ``PrefillAdder`` has no mamba-slot check of its own
    outside ``--enable-unified-memory`` (``rem_mamba_slots`` is None, ``schedule_policy.py``
    L704-L714). Tiny model, KV ample, steps of 1 ms: three 10-token prompts with 3 output tokens
    each arrive at t = 0. A pool of 6 states (no_buffer) runs two: their prefills sample at
    t = 0.001, they decode to t = 0.003, and the third starts then; 5 states run one at a time
    (queued 0, 0.003, 0.006); extra_buffer needs 10 states for two (5 each), lazy 8 (4 each). With
    one budget (no pool of its own) all three start at once, and without the cap too, but lazy,
    whose running requests are charged 3 slots each (its lazy ping-pong slot is not modelled): 8
    states hold two."""
    trace = arrivals([(toks(100, 10), 3, 0.0), (toks(200, 10), 3, 0.0), (toks(300, 10), 3, 0.0)])
    _, got, _ = _memory_run(trace, BIG, strategy=strategy, max_mamba_cache_size=pool)
    assert got == pytest.approx(queued, abs=1e-6)
    assert _memory_run(trace, BIG, strategy=strategy)[1] == pytest.approx([0.0] * 3, abs=1e-6)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "states_per_running_request", 0)
        assert _memory_run(trace, BIG, strategy=strategy, max_mamba_cache_size=pool)[1] == pytest.approx(
            uncapped, abs=1e-6
        )
    with pytest.raises(PolicyError, match="serves no request"):
        _memory_run(trace, BIG, strategy=strategy, max_mamba_cache_size=2)


def test_a_retracted_request_is_matched_with_its_prompt_and_generated_tokens():
    """Rule 20. SGLang 0.5.23 retracts a decoding request when the next decode step does not fit
    (``update_running_batch``, ``managers/scheduler.py`` L4469-L4493 -> ``ScheduleBatch
    .retract_decode``, ``managers/schedule_batch.py`` L3451-L3539): ``release_req`` (L2360-L2395)
    frees its KV past what the tree holds and inserts nothing (``release_kv_cache(checkpoint=False)``,
    ``mem_cache/common.py`` L400-L444; "for preempted requests, we may want to insert into the
    tree" is a TODO, L2388), so the tree keeps what its prefill's checkpoint published (here its
    prompt and the state at its end, unlocked). Scheduled again, the request is matched with
    ``full_untruncated_fill_ids`` = prompt + the tokens it generated (``Req.init_next_round_input``,
    L1692-L1739), capped at their count - 1 (``_compute_max_prefix_len``, L1766-L1768): its whole
    prompt, state included, is reused. Tiny model (a token 2 B, a state 16 B), no_buffer, 6 states
    of their own (two running requests, rule 19) and 8,300 KV tokens; A and B (10-token prompts,
    4,200 output tokens each, ``ignore_eos``: the admission holds back 4,096 of each output, the
    clip) start at t = 0. After 4,140 decode steps the two prompts and 8,280 decoded tokens fill
    the pool, and at t = 4.141 B (the newer, as SGLang's retraction order takes it on equal
    lengths, L3542-L3579) is preempted with 4,141 tokens generated; A ends at t = 4.200 and B,
    matched with its 4,151 tokens, reuses its prompt's 10 (the state at 10). Matched with its
    prompt alone (capped at 9 tokens) it reused nothing."""
    trace = arrivals([(toks(100, 10), 4200, 0.0), (toks(200, 10), 4200, 0.0)])
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=6 * 16 + 8300 * 2,
        mode="des",
        scheduler="continuous",
        mamba_radix_cache_strategy="no_buffer",
        max_mamba_cache_size=6,
    )

    def hits():
        log = EventLog()
        res = drive(build(trace, config, spec=TINY, timing=TIMING, observers=(log,)))
        preempted = [(round(ev.t_start, 3), ev.preempted) for ev in log.events if isinstance(ev, Step) and ev.preempted]
        rerun = [(a, b) for ev in log.events if isinstance(ev, Step) for rid, a, b in ev.prefills if rid == 1]
        return list(res.requests.sort_values("request_id")["hit_tokens"]), preempted, rerun

    assert hits() == ([0, 10], [(4.141, (1,))], [(0, 10), (10, 4151)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "matches_generated", False)
        assert hits() == ([0, 0], [(4.141, (1,))], [(0, 10), (0, 4151)])


def _retract_run(rows, kv_tokens, **flags):
    """Hit tokens, queueing delays, preemptions (step start, ids) and prefill chunks (step start,
    chunks) of ``sglang`` no_buffer on the tiny model with 6 states of their own (two running
    requests, rule 19) and ``kv_tokens`` KV tokens; ``flags``: admission attributes set for the run."""
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=6 * 16 + kv_tokens * 2,
        mode="des",
        scheduler="continuous",
        mamba_radix_cache_strategy="no_buffer",
        max_mamba_cache_size=6,
    )
    log = EventLog()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in flags.items():
            mp.setattr(SglangAdmission, name, value)
        res = drive(build(arrivals(rows), config, spec=TINY, timing=TIMING, observers=(log,)))
    req = res.requests.sort_values("request_id")
    steps = [ev for ev in log.events if isinstance(ev, Step)]
    return (
        [int(h) for h in req["hit_tokens"]],
        [round(q, 6) for q in req["queue_s"]],
        [(round(ev.t_start, 3), ev.preempted) for ev in steps if ev.preempted],
        [(round(ev.t_start, 3), ev.prefills) for ev in steps if ev.prefills],
    )


def test_sglang_retracts_the_fewest_outputs_then_the_longest_prompt():
    """Rule 21. ``ScheduleBatch._get_decode_retraction_order`` (SGLang 0.5.23
    ``managers/schedule_batch.py`` L3542-L3579) sorts the decode batch by (output tokens, -prompt
    tokens), reversed, and ``retract_decode`` (L3451-L3539) pops from its end until the rest fit
    (``check_decode_mem``), keeping one: the request with the fewest output tokens goes first,
    the longest prompt among equals, the latest in the batch among equals again. The rule-20 case
    with A's prompt 20 tokens (8,310 KV tokens): A and B generate in step, so at t = 4.141 A, the
    longer prompt, is retracted (4,141 tokens generated), not B, the newer; B ends at t = 4.200 and
    A, matched with its 4,161 tokens, reuses its prompt's 20. SGLang 0.5.23's own
    ``retract_decode`` on the same requests retracts A before decode step 4,141 and matches its 20
    tokens (``benchmarks/results/2026-12-05-sglang-retract/verify_retract.py``). Preempting the
    newest (vLLM's rule), B went."""
    rows = [(toks(100, 20), 4200, 0.0), (toks(200, 10), 4200, 0.0)]
    hits, _, preempted, chunks = _retract_run(rows, 8310)
    assert (hits, preempted) == ([20, 0], [(4.141, (0,))])
    assert chunks[-1] == (4.2, ((0, 20, 4161),))
    hits, _, preempted, chunks = _retract_run(rows, 8310, retracts_by_length=False)
    assert (hits, preempted) == ([0, 10], [(4.141, (1,))])
    assert chunks[-1] == (4.2, ((1, 10, 4151),))


def test_a_retracted_request_queues_behind_the_waiting_ones():
    """Rule 22. SGLang 0.5.23 puts a retracted request back with ``_add_request_to_queue``
    (``managers/scheduler.py`` L4539-L4540 -> L3480-L3495: ``waiting_queue.append``), and the
    default fcfs policy does not sort the queue (``SchedulePolicy.calc_priority``,
    ``managers/schedule_policy.py`` L231-L235, without priority scheduling): it waits behind the
    requests that arrived while it ran. The rule-20 case and C (10 tokens, 1 output token) at
    t = 1, held back by the two running requests (rule 19): B, retracted at t = 4.141, queues
    behind C; C fits beside A and starts at t = 4.142 (queued 3.142 s), B when A ends (t = 4.200).
    Back at the front (vLLM's rule), B was refused at t = 4.142 (its 4,151 tokens and A's output do
    not fit) and C, behind it, waited for A's end too (3.2 s)."""
    rows = [(toks(100, 10), 4200, 0.0), (toks(200, 10), 4200, 0.0), (toks(300, 10), 1, 1.0)]
    hits, queued, preempted, chunks = _retract_run(rows, 8300)
    assert (hits, queued[2], preempted) == ([0, 10, 0], 3.142, [(4.141, (1,))])
    assert chunks[1:] == [(4.142, ((2, 0, 10),)), (4.2, ((1, 10, 4151),))]
    hits, queued, preempted, chunks = _retract_run(rows, 8300, retracts_by_length=False)
    assert (hits, queued[2], preempted) == ([0, 10, 0], 3.2, [(4.141, (1,))])
    assert chunks[1:] == [(4.2, ((1, 10, 4151), (2, 0, 10)))]


def test_at_the_running_cap_a_pass_still_touches_while_a_chunked_prefill_goes_on():
    """Rule 23. At SGLang's running cap (rule 19) ``_get_new_batch_prefill_raw`` returns before
    ``calc_priority`` (``managers/scheduler.py`` L4116-L4124: ``get_num_allocatable_reqs`` <= 0
    sets ``batch_is_full``; a full batch returns at L4098-L4101), but both checks are skipped while
    a chunked prefill goes on (``self.chunked_req is None``): the pass reaches ``calc_priority``
    and its waiting-prefix touches (``_touch_waiting_prefixes``, ``schedule_policy.py``
    L280-L302), then admits no one (the same request-slot check in the admission loop,
    L4226-L4238). Tiny model, no_buffer, 3 states (one running request), steps of 8 tokens, the
    touches every pass (interval 1): L (24 tokens, 2 out) and W (10 tokens) arrive at t = 0; the
    first pass touches W and L (head last) and admits L; L's chunks at t = 0.001 and 0.002 run at
    the cap during its chunked prefill, so those passes touch W; at t = 0.003 L decodes and no pass
    runs; L ends and W is touched and admitted at t = 0.004. Without a pass at the cap W was
    touched at t = 0 and 0.004 only."""
    trace = arrivals([(toks(100, 24), 2, 0.0), (toks(200, 10), 1, 0.0)])
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=BIG,
        mode="des",
        scheduler="continuous",
        mamba_radix_cache_strategy="no_buffer",
        max_mamba_cache_size=3,
        prefill_chunk_tokens=8,
        max_num_batched_tokens=8,
    )
    touches = []
    touch = Simulation.touch_prefix

    def recorded(self, r, t, tokens):
        touches.append((round(t, 6), int(r.request_id)))
        touch(self, r, t, tokens)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SglangAdmission, "waiting_refresh", (1, 128))
        mp.setattr(Simulation, "touch_prefix", recorded)
        res = drive(build(trace, config, spec=TINY, timing=TIMING))
    assert touches == [(0.0, 1), (0.0, 0), (0.001, 1), (0.002, 1), (0.004, 1)]
    assert list(res.requests.sort_values("request_id")["queue_s"].round(6)) == [0.0, 0.004]


@pytest.mark.parametrize(
    ("strategy", "pool", "cap"), [("no_buffer", 7, 2), ("extra_buffer", 11, 2), ("no_buffer", 9, 3)]
)
def test_the_running_cap_is_reported_and_said_when_below_max_num_seqs(strategy, pool, cap):
    """The cap rule 19 puts on running requests (pool // 3 no_buffer, // 5 extra_buffer: 7 -> 2,
    11 -> 2, 9 -> 3) is the summary's ``running_cap`` and, being below ``--max-num-seqs`` (256),
    a note line names it, since the run's header states --max-num-seqs; a cap above the pool's
    (``--max-num-seqs 2`` with 9 states) is the flag's and says nothing; fcfs has no cap (0)."""
    from sim.cli.run import running_cap_note

    trace = arrivals([(toks(0, 40), 2, 0.0), (toks(100, 40), 2, 0.0)])

    def go(**kw):
        config = SimConfig(
            policy="sglang",
            model="qwen3.5-9b",
            capacity_bytes=BIG,
            max_mamba_cache_size=pool,
            mode="des",
            mamba_radix_cache_strategy=strategy,
            **kw,
        )
        return config, drive(build(trace, config, spec=TINY, timing=TIMING)).summary

    config, s = go(scheduler="continuous")
    assert s.running_cap == cap and s.to_dict()["running_cap"] == cap
    assert running_cap_note([s], [config]).endswith(f"): sglang {cap}")
    config, s = go(scheduler="continuous", max_num_seqs=2)
    assert s.running_cap == 2 and running_cap_note([s], [config]) == ""
    config, s = go(scheduler="fcfs")
    assert s.running_cap == 0 and running_cap_note([s], [config]) == ""


@pytest.mark.parametrize("scheduler", ["fcfs", "continuous"])
def test_extra_buffer_end_inserts_its_last_decode_track_alone(scheduler):
    """extra_buffer keeps a decoding request's tracked state in its ping-pong buffers, each track
    replacing the last (``_mamba_radix_cache_v2_req_prepare_for_extend``; the decode track every
    ``mamba_track_interval`` tokens, 256 by default), and the request's end commits the one it
    holds (``_select_finished_checkpoint``, ``components/mamba.py`` L582-L593): a 130-token prompt
    (its track at 128) decoding 600 tokens passes tracks at 256 and 512 and leaves 128 and 512 in
    the tree, not 256 (mutation survivor: ``Simulation.end_state`` keeping every pending decode
    checkpoint instead of the deepest)."""
    trace = arrivals([(toks(0, 130), 600, 0.0)])
    _, sim = run(trace, "sglang", spec=TINY, mode="des", scheduler=scheduler, mamba_radix_cache_strategy="extra_buffer")
    assert state_depths(sim.tree) == [128, 512]
