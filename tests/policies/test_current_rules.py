"""Today's presets and the last-token rule (policies/*_current.py, sim/engine/simulation.py) at their
edges (issue 44): the rule on every trace kind (token traces, hash-block traces with 16- and
512-token blocks, a real ``mooncake:sample`` row) under both schedulers, with prompts that are and
are not a whole number of blocks; TensorRT-LLM's snapshot points at the prompt end and off the
interval, its decode states under the last-token rule, and its chunk cuts; vLLM's retention, junction
and EAGLE shift at their boundaries; SGLang's capture chunk and pool split.

The expected hits are worked by hand in each test's docstring from the rules in the presets'
module docstrings: an engine's lookup stops at ``input_len - 1`` tokens (whole grid blocks), and
a finished request stores input + output - 1 tokens (hash-block traces: only the count drops)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import one_per_session, run, state_depths, toks

from policies.base import get_preset
from policies.trtllm_current import TrtllmAdmission, multiples, snapshot_offsets, snapshot_points
from policies.vllm_current import DENSE, junction_tokens, retained
from policies.sglang_current import (
    SglangAdmission,
    SglangParams,
    capture_chunk,
    mamba_pool_states,
    resolved_strategy,
)
from sim.config import SimConfig
from sim.engine.drivers import run as drive
from sim.engine.events import Admit, EventLog
from sim.simulate import build
from traces.base import Request, Trace

SCHEDULERS = ("fcfs", "continuous")


def hash_trace(n_in, n_out, reps=2, B=16, out_symbols=False):
    """``reps`` identical prompts of ``n_in`` tokens as hash blocks of ``B`` tokens (the last one
    partial when ``n_in % B``), one second apart; as in Mooncake's rows the output carries no hash
    ids (``out_symbols``: one per started block of the output, after the prompt's)."""
    nsym, osym = -(-n_in // B), -(-n_out // B) if out_symbols else 0
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=np.arange(1, nsym + 1, dtype=np.int64),
            output_tokens=np.arange(1000 * (i + 1), 1000 * (i + 1) + osym, dtype=np.int64),
            input_len=n_in,
            output_len=n_out,
            arrival=float(i),
        )
        for i in range(reps)
    ]
    return Trace("hb", reqs, closed_loop=False, block_tokens=B)


def go(trace, policy, sched, **knobs):
    log = EventLog()
    sim = build(trace, SimConfig(policy=policy, capacity_bytes=10**14, scheduler=sched, **knobs), observers=(log,))
    res = drive(sim)
    return [int(h) for h in res.requests["hit_tokens"]], sim, log.events


# ------------------------------------------------------------------------------ the last-token rule


HASH_CASES = [
    # 48 tokens = 3 whole blocks: an engine stops at 47 tokens = 2 blocks (32); the paper's
    # rule would reuse all 48
    (48, 32),
    # 40 tokens = 2 blocks + 8: the lookup stops at 39 tokens, 2 whole blocks (32)
    (40, 32),
    # 33 tokens: 33 - 1 = 32 tokens, exactly 2 blocks
    (33, 32),
    # 32 tokens: the lookup stops at 31 tokens, 1 block, but 16 and 32 share TensorRT-LLM's
    # 32-token radix block (0, 32], which keeps the deeper snapshot only (``_block_radix_tree.py``
    # ``Block.can_replace_page``): nothing at or below 31 remains
    (32, 0),
]


@pytest.mark.parametrize("sched", SCHEDULERS)
@pytest.mark.parametrize("n_in,hit_engine", HASH_CASES)
def test_the_last_token_rule_on_a_hash_block_trace(sched, n_in, hit_engine):
    """TensorRT-LLM with a 16-token interval snapshots at every block boundary of the prompt and
    keeps one per 32-token radix block, so the engine's hit is its lookup cap floored to a kept
    snapshot (identical prompts, 16-token hash blocks)."""
    hits, sim, _ = go(hash_trace(n_in, 20), "trtllm", sched, periodic_snapshot_interval=16)
    assert hits == [0, hit_engine]


@pytest.mark.parametrize("n_in", [48, 40, 33, 32])
def test_a_hash_block_request_stores_input_plus_output_minus_one_in_sequential_mode(n_in):
    """One insert of the whole request (sequential mode): the engines store input + output - 1
    tokens' worth (the output carries no hash ids, only the count), the paper's rule one more."""
    knobs = {"mamba_radix_cache_strategy": "no_buffer"}
    _, one, _ = go(hash_trace(n_in, 20, reps=1), "sglang", "fcfs", mode="sequential", **knobs)
    assert one.tree.kv_tokens == n_in + 20 - 1
    _, paper, _ = go(hash_trace(n_in, 20, reps=1), "sglang+", "fcfs", mode="sequential")
    assert paper.tree.kv_tokens == n_in + 20


@pytest.mark.parametrize("n_in", [48, 40, 33, 32])
@pytest.mark.parametrize("sched", SCHEDULERS)
def test_trtllm_stores_kv_up_to_its_last_snapshot_point(n_in, sched):
    """TensorRT-LLM commits KV only up to its last snapshot point: ``try_commit_blocks``
    (``mamba_cache_manager_v2.py`` at 28295084972c) commits ``tokens[num_committed:commit_end]``
    with ``commit_limit = min(max(expect_snapshot_points), prompt_len)`` and stops committing when
    the context ends, so neither the prompt past the last point nor the answer is kept. Interval
    16: 48 tokens keep 48 (the prompt end is a multiple), 40, 33 and 32 keep 32."""
    _, sim, _ = go(hash_trace(n_in, 20, reps=1), "trtllm", sched, periodic_snapshot_interval=16)
    assert sim.tree.kv_tokens == n_in // 16 * 16


def test_trtllm_without_snapshots_keeps_no_kv():
    """No snapshot placement (the engine's default): hybrid block reuse is off and the manager
    commits nothing, so the cache stays empty."""
    _, sim, _ = go(hash_trace(48, 20), "trtllm", "fcfs")
    assert sim.tree.kv_tokens == 0 and sim.tree.n_states == 0


@pytest.mark.parametrize("sched", SCHEDULERS)
@pytest.mark.parametrize("out_symbols", [False, True])
def test_a_hash_block_request_stores_the_same_in_des_mode_as_in_sequential_mode(sched, out_symbols):
    """Des mode inserts the prompt at prefill end, then input + output - 1 at decode end. An output
    without hash ids gets symbols of its own (``Simulation.output_symbols``, as the hash-block
    loaders number them): before, the decode-end insert met the path the prefill had stored and
    added nothing (the prompt only, 40 tokens). The prompt's partial block (8 of 16 tokens) sits
    inside the stored sequence: 40 + 19 tokens, not 3 x 16 + 19."""
    knobs = {"mamba_radix_cache_strategy": "no_buffer"}
    _, one, _ = go(hash_trace(40, 20, reps=1, out_symbols=out_symbols), "sglang", sched, **knobs)
    assert one.tree.kv_tokens == 40 + 20 - 1
    assert sorted(one.tree.checkpoints().values()) == [40, 59]  # prompt end, tail (input + output - 1)


@pytest.mark.parametrize("sched", SCHEDULERS)
def test_the_last_token_rule_on_a_real_mooncake_row(sched):
    """Mooncake's first row (6,758 tokens in 14 blocks of 512, the last partial; 500 output tokens
    and no output hashes) sent twice: the engines stop at 6,757 tokens = 13 whole blocks (6,656)."""
    from traces.registry import load_trace

    r0 = load_trace("mooncake:sample").requests[0]
    assert (r0.input_len, len(r0.input_tokens), r0.output_len) == (6758, 14, 500)
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=r0.input_tokens,
            output_tokens=np.array([], dtype=np.int64),
            input_len=r0.input_len,
            output_len=r0.output_len,
            arrival=float(i),
        )
        for i in range(2)
    ]
    trace = Trace("mc", reqs, closed_loop=False, block_tokens=512)
    hits, _, _ = go(trace, "trtllm", sched, periodic_snapshot_interval=512)
    assert hits == [0, 6656]
    hits, sim, _ = go(trace, "vllm", sched, block_size=512)
    assert hits == [0, 6656]


@pytest.mark.parametrize("sched", SCHEDULERS)
def test_the_last_token_rule_on_the_shipped_mooncake_sample(sched):
    """Every request of the first 60 rows of ``mooncake:sample`` under each engine preset: no hit
    reaches the prompt's end."""
    from traces.registry import load_trace

    t = load_trace("mooncake:sample")
    t = Trace(t.name, t.requests[:60], closed_loop=t.closed_loop, block_tokens=t.block_tokens)
    inp = [r.input_len for r in t.requests]
    for policy, knobs in (("trtllm", {"periodic_snapshot_interval": 512}), ("vllm", {"block_size": 512})):
        hits, _, _ = go(t, policy, sched, **knobs)
        assert sum(h > 0 for h in hits) > 10
        assert all(h <= n - 1 for h, n in zip(hits, inp))


@pytest.mark.parametrize("sched", SCHEDULERS)
@pytest.mark.parametrize("n_in", [2, 17, 64])
def test_the_last_token_rule_on_a_token_trace(sched, n_in):
    """Block 1, TensorRT-LLM with an interval of 1 (a snapshot at every prompt token): its radix
    tree keeps one per 32-token block, the deepest (``_block_radix_tree.py``
    ``Block.can_replace_page``), so an identical prompt, whose lookup stops at ``n_in - 1``,
    reuses the last kept one below: 2 and 17 tokens keep only their prompt end (0), 64 keeps 32
    and 64 (32); the KV kept ends at the last snapshot, the prompt end. The same as the engine's
    own tree driven by ``benchmarks/differential_trtllm.py``'s harness."""
    reqs = [
        Request(
            session_id=i, turn=0, input_tokens=toks(0, n_in), output_tokens=toks(500 + 50 * i, 3), arrival=100.0 * i
        )
        for i in range(2)
    ]
    trace = Trace("tok", reqs, closed_loop=False)
    hits, sim, _ = go(trace, "trtllm", sched, periodic_snapshot_interval=1)
    assert hits == [0, (n_in - 1) // 32 * 32]
    one = Trace("tok1", reqs[:1], closed_loop=False)
    assert go(one, "trtllm", sched, periodic_snapshot_interval=1)[1].tree.kv_tokens == n_in
    lone = Trace(
        "one",
        [
            Request(session_id=i, turn=0, input_tokens=toks(0, 1), output_tokens=toks(9, 2), arrival=float(i))
            for i in range(2)
        ],
        closed_loop=False,
    )
    assert go(lone, "trtllm", sched, periodic_snapshot_interval=1)[0] == [0, 0]


def test_a_request_without_output_stores_its_prompt_whole():
    """``stored``: with no output token beyond the prompt nothing is dropped."""
    trace = one_per_session((toks(0, 40), toks(0, 0)))
    _, sim = run(trace, "trtllm", periodic_snapshot_interval=8)
    assert sim.tree.kv_tokens == 40


# ------------------------------------------------------------------------------ TensorRT-LLM


def test_snapshot_points_at_the_prompt_end_and_off_the_interval():
    # an interval that divides the prompt: the prompt end is a point
    assert snapshot_points(192, 64, (), ()) == [64, 128, 192]
    # one that does not: no point at the prompt end
    assert snapshot_points(192, 50, (), ()) == [50, 100, 150]
    # a start offset equal to the prompt is its end; one past it is ignored
    assert snapshot_points(192, 0, (192, 193), ()) == [192]
    # end offsets: 0 is the end, prompt - 1 is token 1, the prompt length itself is ignored
    assert snapshot_points(192, 0, (), (0, 191, 192, 500)) == [1, 192]
    # union, deduplicated, sorted
    assert snapshot_points(192, 64, (64, 100), (0, 92)) == [64, 100, 128, 192]
    assert snapshot_points(1, 1, (1,), (0,)) == [1]


@pytest.mark.parametrize(
    "lo,hi,step,want",
    [(0, 10, 0, []), (0, 10, 3, [3, 6, 9]), (3, 9, 3, [6, 9]), (4, 8, 3, [6]), (6, 6, 3, []), (5, 6, 3, [6])],
)
def test_multiples_are_open_below_and_closed_above(lo, hi, step, want):
    assert multiples(lo, hi, step) == want


def test_offsets_parse_signs_spaces_and_duplicates():
    assert snapshot_offsets(" 7, +3 ,7 ", "--f", 1) == (3, 7)
    assert snapshot_offsets("0", "--f", 0) == (0,)
    assert snapshot_offsets("   ", "--f", 1) == ()
    from policies.base import PolicyError

    for bad, least in (("0", 1), ("-1", 0), ("1,,2", 1), ("1.5", 1), ("0x10", 1)):
        with pytest.raises(PolicyError, match="--f"):
            snapshot_offsets(bad, "--f", least)


@pytest.mark.parametrize("n_in,n_out", [(100, 29), (100, 28), (128, 1), (128, 66)])
def test_trtllm_takes_no_decode_states(n_in, n_out):
    """Only the prompt's multiples of the interval hold states, however far the answer runs:
    TensorRT-LLM's ``MambaHybridCacheManagerV2.try_commit_blocks`` (``mamba_cache_manager_v2.py``
    at 28295084972c) commits up to ``min(max(expect_snapshot_points), prompt_len)`` and calls
    ``stop_committing()`` when ``context_remaining_length`` reaches 0 (found by
    ``benchmarks/differential_trtllm.py``; before, 128 and 192 were decode states here)."""
    trace = one_per_session((toks(0, n_in), toks(5000, n_out)))
    _, sim = run(trace, "trtllm", periodic_snapshot_interval=64)
    assert state_depths(sim.tree) == [p for p in (64, 128) if p <= n_in]


@pytest.mark.skipif("schedule_chunk" not in TrtllmAdmission.__dict__, reason="trtllm cuts no chunks at this commit")
def test_trtllm_chunks_end_at_the_next_snapshot_point_inside_them():
    """Interval 100 and an end offset 30 on a 250-token prompt: points 100, 200, 220. Budget 150:
    chunks 0-100 (cut at 100), 100-200 (cut at 200), 200-220, 220-250."""
    reqs = [Request(session_id=0, turn=0, input_tokens=toks(0, 250), output_tokens=toks(900, 2), arrival=0.0)]
    log = EventLog()
    cfg = SimConfig(
        policy="trtllm",
        capacity_bytes=10**14,
        scheduler="continuous",
        max_num_batched_tokens=150,
        periodic_snapshot_interval=100,
        additional_snapshot_offsets_from_end="30",
    )
    drive(build(Trace("t", reqs, closed_loop=False), cfg, observers=(log,)))
    chunks = [p for e in log.events if type(e).__name__ == "Step" for p in e.prefills]
    assert chunks == [(0, 0, 100), (0, 100, 200), (0, 200, 220), (0, 220, 250)]
    admits = [e.position for e in log.events if isinstance(e, Admit)]
    assert admits == [100, 220]  # 200 and 220 share the block (192, 224]: one snapshot, the deepest


# ------------------------------------------------------------------------------ vLLM


@pytest.mark.parametrize(
    "match,n,B,want",
    [
        (0, 100, 16, 0),
        (-5, 100, 16, 0),
        (15, 100, 16, 0),
        (16, 100, 16, 16),
        (47, 100, 16, 32),
        (99, 100, 16, 96),
        (100, 100, 16, 96),
        (500, 100, 16, 96),
        (96, 97, 16, 96),
        (97, 97, 16, 96),
    ],
)
def test_vllm_junction_is_the_match_floored_to_the_block_below_the_last_token(match, n, B, want):
    assert junction_tokens(match, n, B) == want


def test_vllm_retention_keeps_semantic_states_and_the_grid():
    pos = [16, 32, 48, 64, 80, 96]
    assert retained(pos, set(), DENSE) == pos
    assert retained(pos, {48}, 0) == [48]
    assert retained(pos, {48}, 32) == [32, 48, 64, 96]
    assert retained(pos, set(), 40) == [80]  # an interval off the block grid keeps its common multiples
    assert retained(pos, {16, 96}, 0) == [16, 96]


# ------------------------------------------------------------------------------ SGLang


def test_sglang_capture_chunk_pool_and_strategy():
    assert [capture_chunk(p) for p in (1, 63, 64, 65, 256)] == [64, 64, 64, 65, 256]
    assert mamba_pool_states(1900, 0.9, 100) == 9  # 1900 * 0.9 / 1.9 = 900 -> 9 states
    assert mamba_pool_states(1899, 0.9, 100) == 8
    assert mamba_pool_states(10**6, 1.0, 0) == 500_000  # no division by zero for a 0-byte state
    assert resolved_strategy(SglangParams()) == "extra_buffer"
    assert resolved_strategy(SglangParams(mamba_radix_cache_strategy="no_buffer")) == "no_buffer"
    assert resolved_strategy(SglangParams(mamba_radix_cache_strategy="extra_buffer_lazy")) == "extra_buffer_lazy"


def test_every_current_preset_caps_its_lookup_and_the_papers_do_not():
    for name in ("sglang", "vllm", "trtllm", "lmdeploy"):
        p = get_preset(name)
        assert p.lookup_cap_minus_one and not p.stores_last_token and p.caching, name
    for name in ("sglang+", "marconi"):
        p = get_preset(name)
        assert not p.lookup_cap_minus_one and p.stores_last_token, name
    assert not get_preset("vanilla").caching


def test_trtllm_admission_refuses_a_start_offset_of_zero_and_takes_an_end_offset_of_zero():
    from policies.base import PolicyError
    from policies.trtllm_current import TrtllmParams

    with pytest.raises(PolicyError, match="--additional-snapshot-offsets-from-start offsets must be positive"):
        TrtllmAdmission(TrtllmParams(additional_snapshot_offsets_from_start="0"))
    a = TrtllmAdmission(
        TrtllmParams(additional_snapshot_offsets_from_start="1", additional_snapshot_offsets_from_end="0")
    )
    assert (a.from_start, a.from_end) == ((1,), (0,))
    with pytest.raises(PolicyError, match="from-end offsets must be non-negative"):
        TrtllmAdmission(TrtllmParams(additional_snapshot_offsets_from_end="-1"))


def test_a_cache_of_exactly_one_state_is_allowed_and_one_byte_less_is_not():
    from sim.cost import get_model
    from sim.errors import UsageError

    S = get_model("qwen3.5-9b").state_bytes()
    trace = one_per_session((toks(0, 40), toks(100, 3)))
    for policy in ("sglang", "vllm", "trtllm", "lmdeploy", "marconi"):
        run(trace, policy, capacity=S)
        with pytest.raises(UsageError, match="smaller than one state checkpoint"):
            run(trace, policy, capacity=S - 1)
    run(trace, "vanilla", capacity=1)  # caches nothing: any capacity


@pytest.mark.parametrize("sched", SCHEDULERS)
def test_the_lookup_event_names_the_checkpoint_of_a_one_block_hit(sched):
    """A hit of exactly one 32-token radix block (a 48-token prompt of 16-token hash blocks sent
    twice: the lookup stops at 47 tokens; 16 gave way to 32 in its block) reports the checkpoint
    it restores; a miss reports none."""
    from sim.engine.events import Lookup

    hits, sim, events = go(hash_trace(48, 20), "trtllm", sched, periodic_snapshot_interval=16)
    looks = [e for e in events if isinstance(e, Lookup)]
    assert hits == [0, 32] and [e.hit_tokens for e in looks] == [0, 32]
    assert looks[0].hit_checkpoint is None and looks[1].hit_checkpoint is not None


@pytest.mark.parametrize("sched", SCHEDULERS)
@pytest.mark.parametrize(
    "policy,knobs",
    [
        ("sglang", {}),
        ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}),
        ("vllm", {"block_size": 16}),
        ("trtllm", {"periodic_snapshot_interval": 16}),
        ("lmdeploy", {"block_size": 16}),
        ("marconi", {}),
    ],
)
def test_every_lock_a_request_takes_is_given_back(sched, policy, knobs):
    """Follow-up turns hit their history (the lookup locks the hit, the prefill insert moves the
    lock to the prompt's end, the decode insert releases it): at the end no node is locked and the
    tree's invariants hold."""
    base = toks(0, 100)
    reqs = [Request(session_id=0, turn=0, input_tokens=base, output_tokens=toks(500, 20), arrival=0.0)]
    for i in range(1, 4):
        prompt = np.concatenate([base, toks(500, 19), toks(1000 * i, 30 + 7 * i)])
        reqs.append(
            Request(session_id=i, turn=0, input_tokens=prompt, output_tokens=toks(2000 * i, 9), arrival=float(i))
        )
    hits, sim, _ = go(Trace("locks", reqs, closed_loop=False), policy, sched, **knobs)
    assert sum(hits[1:]) > 0
    assert sum(n.lock for n in sim.tree.iter_nodes() if n is not sim.tree.root) == 0
    sim.tree.check_invariants()


def test_refresh_path_says_whether_a_hit_moves_the_walked_path():
    """Only the paper's refresh ("consumed": the hit node alone) keeps the path still."""
    trace = one_per_session((toks(0, 40), toks(100, 3)))
    for policy in ("sglang", "vllm", "trtllm", "lmdeploy", "sglang-0.5.8-no-buffer-pathrefresh"):
        assert run(trace, policy)[1].refresh_path is True, policy
    assert run(trace, "marconi")[1].refresh_path is False


def test_sglang_extra_buffer_tracks_decode_only_past_the_prompt():
    """extra_buffer under the batching scheduler with a 100-token budget: one tracked state per
    step at the step start + whole 64-token chunks (64, 164, ..., 464); the last step (500-512) is
    shorter than a chunk, so the prompt end holds no state, and a decode track (every 256 tokens)
    is taken only past the prompt: none at 512 for 10 output tokens (stored 521), 768 for 300."""
    for n_out, decode in ((10, []), (300, [768])):
        _, sim = run(
            one_per_session((toks(0, 512), toks(9000, n_out))),
            "sglang",
            mode="des",
            scheduler="continuous",
            max_num_batched_tokens=100,
        )
        assert state_depths(sim.tree) == [64, 164, 264, 364, 464] + decode


@pytest.mark.parametrize("sched", SCHEDULERS)
def test_the_prefill_insert_reports_occupancy_and_a_rejection(sched):
    """SGLang no_buffer inserts at prefill end and at the request end: two occupancy reports per
    request, the first after the prompt's insert; with room for the prompt's state but not its KV
    the prefill insert is rejected and said so."""

    class Seen:
        def __init__(self):
            self.occupied, self.rejects = [], []

        def occupancy(self, t, kv_bytes, state_bytes):
            self.occupied.append((kv_bytes, state_bytes))

        def reject(self, request, t, why):
            self.rejects.append((request.request_id, why))

    from sim.cost import get_model

    spec = get_model(SimConfig().model)
    for cap, rejected in ((10**14, []), (spec.state_bytes() + 10 * spec.kv_bytes_per_token(), [(0, "no room")])):
        seen = Seen()
        trace = Trace("one", [Request(session_id=0, turn=0, input_tokens=toks(0, 40), output_tokens=toks(99, 3))])
        conf = SimConfig(policy="sglang", capacity_bytes=cap, scheduler=sched, mamba_radix_cache_strategy="no_buffer")
        with pytest.MonkeyPatch.context() as mp:
            # SGLang aborts a prompt its KV pool cannot take (docs/presets-engines.md rule 18): off
            # here, to drive the insert that finds no room
            mp.setattr(SglangAdmission, "input_limit", lambda self, kv_pool_tokens: None)
            drive(build(trace, conf, observers=(seen,)))
        assert len(seen.occupied) == 2
        assert seen.rejects[: len(rejected)] == rejected
        if not rejected:
            assert seen.occupied[0] == (40 * spec.kv_bytes_per_token(), spec.state_bytes())
