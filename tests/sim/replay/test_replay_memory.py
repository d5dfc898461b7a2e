"""What replay keeps on the device, bounded by the hits' suffixes, not by layers x whole prompts
(issue 41: a full-depth qwen3-next-80b-a3b batched replay of the Mooncake sample ran out of the
H200's 140 GB inside its hit checks).

* ``forward_batch`` / ``run`` with ``keep_from`` keep each layer's rows from there on only, the
  same bits as the rows of a call that keeps every row.
* Batched replay of a long prompt with a short suffix: its reference call keeps no layer's
  outputs (it compares each layer's suffix rows as it makes them, ``SuffixOutputs``: the same
  measure as ``rel_error``); its queued check holds the restored KV (grown to the end in place:
  one copy), two states and the suffix's outputs, no more (hand-checked byte count); the check
  still validates.
* On a GPU, one line up front when the planned memory exceeds the free memory.
* A byte budget (``held_bytes``) runs the request queue and the check queue before they hold
  more; the replay's results do not change.
* The KV page pool grows by chunks and never moves a page it holds.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kernels._common import upload  # noqa: E402
from sim.replay import store as store_mod  # noqa: E402
from sim.replay.model import HybridModel, kept_rows  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.store import CheckpointStore  # noqa: E402
from sim.replay.tokens import page_keys, prefix_hash  # noqa: E402

from test_replay_validate import SHAPE  # noqa: E402

rng = np.random.default_rng(41)
LONG = rng.integers(0, 10_000, 2000)  # a long prompt
OUT = rng.integers(0, 10_000, 16)  # its response
USER = rng.integers(0, 10_000, 40)  # the next turn's short suffix
OTHER = rng.integers(0, 10_000, 300)  # an unrelated prompt
REQS = {
    0: (np.concatenate([LONG, OUT]), 2000),
    1: (np.concatenate([LONG, OUT, USER]), 2056),
    2: (OTHER, 300),
    3: (np.concatenate([LONG, OUT, USER, OTHER[:30]]), 2086),  # the turn after request 1
}


@pytest.fixture(scope="module")
def model():
    return HybridModel(SHAPE, device="cpu", dtype=torch.float32, seed=3, kernel="torch")


def test_kept_rows_offsets():
    # sequences [0, 100) from 0, [50, 80) from 50 keeping from 70, [10, 20) keeping from 40 (none)
    assert kept_rows([0, 100, 130, 140], [0, 50, 10], [None, 70, 40]) == [0, 100, 110, 110]


def test_keep_from_keeps_the_same_bits_of_fewer_rows(model):
    toks = torch.as_tensor(np.concatenate([LONG[:300], USER]))
    cu, starts, keep_from = [0, 300, 340], [0, 0], [250, 10]
    tok_b = torch.cat([toks[:300], toks[:40]])
    full = model.forward_batch(tok_b, cu, starts, keep_outputs=True)
    part = model.forward_batch(tok_b, cu, starts, keep_outputs=True, keep_from=keep_from)
    assert len(part.outs) == len(SHAPE.order) == 3
    for f, p in zip(full.outs, part.outs):
        assert p.shape == (50 + 30, SHAPE.hidden)
        assert torch.equal(p, torch.cat([f[250:300], f[310:340]]))
    # per request, split at two ragged positions (three calls): the rows from 120 on only (part
    # of the second call's, all of the third's)
    _, outs_full, calls = model.run(toks, None, 0, [100, 130], keep_outputs=True)
    _, outs_part, _ = model.run(toks, None, 0, [100, 130], keep_outputs=True, keep_from=120)
    assert calls == 3
    for f, p in zip(outs_full, outs_part):
        assert p.shape == (340 - 120, SHAPE.hidden) and torch.equal(p, f[120:])


def _turns(rp):
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 2000)
    rp.decode(0)
    rp.admit(4, 0, 2016, "")
    rp.lookup(1, 4, 2016)  # checkpoint 4 is queued: request 0 runs first
    rp.prefill(1, 2016, 2056)
    rp.decode(1)


def test_a_long_prompts_check_holds_its_suffix_not_its_prompt(model):
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], batch=8, eager=False)
    _turns(rp)
    rp.finish()
    assert rp.failures == [] and rp.records[1].validated and rp.kv_hits_validated == 1
    b = rp.batched
    assert b.peak_kept_rows == 0  # the reference compared each layer's suffix rows as it ran
    # the queued check: restored KV in its buffer grown to the end, 2056 tokens x 128 B (1
    # attention layer, K and V, 1 head of 16 fp32); the restored and the end state, each 4,096 B
    # of recurrent state (2 layers x 2 heads x 16 x 16 fp32) and 1,536 B of conv windows (2 x 64
    # x 3 fp32); the suffix's outputs, 3 layers x 40 rows x 32 fp32. Every layer's whole prompt
    # would be 3 x 2056 x 32 x 4 = 789,504 B more.
    assert b.peak_check_bytes == 2056 * 128 + 2 * (4096 + 1536) + 3 * 40 * 32 * 4 == 289_792
    assert rp.batch_flushes == {"dependency": 1, "finish": 1}


def test_a_byte_budget_runs_the_queues_early_and_changes_no_result(model):
    results = []
    for held in (None, 1):
        store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
        rp = Replayer(model, store, lambda r: REQS[r], batch=8, eager=False)
        if held:
            rp.batched.held_bytes = held
        _turns(rp)
        if held:  # request 0 ran when queued (request 1 is queued at its end: the next lookup)
            assert rp.batch_flushes == {"memory": 1}
        rp.finish()
        r = rp.records[1]
        assert rp.failures == [] and r.validated
        assert rp.batch_flushes == ({"memory": 2} if held else {"dependency": 1, "finish": 1})
        results.append((r.max_rec_error, r.max_out_error, r.max_kv_error, rp.kv_hits_validated))
    assert results[0] == results[1]


def test_the_plans_pool_rule_is_the_stores_own(model, monkeypatch):
    """``pool_pages_for`` (the plan's count of the pages a pool holds once N were live) against
    a real store growing page by page, with chunks capped at 40 pages' bytes: 16, 32, 64, then
    40 at a time; ``device_bytes`` is its slots and that pool (0 for a host store of a GPU run)."""
    from sim.replay.store import pool_pages_for

    page_bytes = SHAPE.kv_bytes_per_token(model.dtype) * 16
    monkeypatch.setattr(store_mod, "POOL_CHUNK_BYTES", 40 * page_bytes)
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    sizes = []
    for live in range(1, 200):
        store._page_slot()
        assert store.pool_pages == pool_pages_for(live, page_bytes), live
        sizes.append(store.pool_pages)
    assert sorted(set(sizes)) == [16, 32, 64, 104, 144, 184, 224]
    assert pool_pages_for(0, page_bytes) == 0
    store.reserve(1, 64, b"h")
    assert store.device_bytes == store.slot_bytes + 224 * page_bytes
    host = CheckpointStore(SHAPE, model.dtype, where="host", device="cuda", page_tokens=16)
    host.pool_pages = 3  # as if it had grown: pinned host memory is not the GPU's
    assert host.device_bytes == 0


def test_the_kv_pool_grows_by_chunks_and_never_moves_a_page(model, monkeypatch):
    # chunks of at most 3 pages' bytes, under the 16-page minimum: chunks of 16 pages
    page_bytes = SHAPE.kv_bytes_per_token(model.dtype) * 16
    monkeypatch.setattr(store_mod, "POOL_CHUNK_BYTES", 3 * page_bytes)
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    toks = np.concatenate([LONG, OUT])
    st, _, _ = model.run(torch.as_tensor(toks[:1024]), None, 0)  # 64 pages of 16 tokens
    store.reserve(1, 512, prefix_hash(toks, 512))
    store.put_kv(1, page_keys(toks, 512, 16), st.kv)
    first = store.page(1, 0).data_ptr()
    assert store.pool_pages == 32  # 32 pages in two chunks (a doubling pool: 16, then 32)
    store.reserve(2, 1024, prefix_hash(toks, 1024))
    store.put_kv(2, page_keys(toks, 1024, 16), st.kv)
    assert store.page(1, 0).data_ptr() == first  # the grown pool moved nothing
    assert store.pool_pages == 64 and len(store._chunks) == 4
    uploads = []
    monkeypatch.setattr(store_mod, "upload", lambda v, d: uploads.append(list(v)) or upload(v, d))
    assert torch.equal(store.restore_kv(2), st.kv[:, :, :1024])  # gathered across chunks
    assert torch.equal(store.restore_kv(1), st.kv[:, :, :512])
    # the gathers' page indices go up through kernels._common.upload (pinned, asynchronous on a
    # GPU: a pageable copy would wait for the device's queue, a sleep queued for a timed call too)
    # per chunk a gather touches: its pages' places in the chunk, then their rows of the result
    # (checkpoint 2: 64 pages in four 16-page chunks; checkpoint 1: 32 pages in the first two)
    places_and_rows = [[list(range(16)), list(range(16 * c, 16 * c + 16))] for c in (0, 1, 2, 3, 0, 1)]
    assert [[int(x) for x in u] for u in uploads] == [u for pair in places_and_rows for u in pair]


def test_the_memory_plan_warns_in_one_line_only_when_it_does_not_fit():
    from sim.cost import get_model
    from sim.replay.model import ReplayShape
    from sim.replay.pipeline import call_bytes_per_token, memory_warning

    s = ReplayShape.from_spec(get_model("qwen3-next-80b-a3b"))
    bf16 = torch.bfloat16
    # KV 24,576 (12 attention layers x K, V x 2 heads x 256 bf16) + residual 12 x 2,048 + projection
    # and conv output 2 x (12,352 + 8,192) + core 16 x 4,096 + MLP 3 x 2 x 5,824
    assert call_bytes_per_token(s, bf16) == 24_576 + 24_576 + 41_088 + 65_536 + 34_944 == 190_720
    # the call and one layer of the check's suffix outputs (a check holds as many layers as fit):
    # 2,048 fp32 = 8,192 B a token more
    fits = 40 * 10**9 + 10 * 10**9 + 100_000 * (190_720 + 8_192)  # 69.8912 GB
    assert memory_warning(s, bf16, 40 * 10**9, 10 * 10**9, 100_000, fits) == ""
    note = memory_warning(s, bf16, 40 * 10**9, 10 * 10**9, 100_000, fits - 1)
    assert len(note.splitlines()) == 1 and note.startswith("warning: replay may run out of GPU memory")
    assert "69.9 GB planned" in note and "call and check ~19.9 GB at 100000 tokens" in note
    assert "69.9 GB free" in note and "running requests" not in note
    # continuous batching: the running requests' bytes (the step executor's peak and the open
    # flights' bound) on top, named in the line
    assert memory_warning(s, bf16, 40 * 10**9, 10 * 10**9, 100_000, fits + 7 * 10**9, 7 * 10**9) == ""
    note = memory_warning(s, bf16, 40 * 10**9, 10 * 10**9, 100_000, fits + 7 * 10**9 - 1, 7 * 10**9)
    assert "76.9 GB planned" in note and "batch queues 10.0 GB, running requests 7.0 GB, the longest" in note


def test_suffix_outputs_measure_each_layer_as_rel_error_does_and_let_it_go():
    from sim.replay.checks import rel_error
    from sim.replay.hits import SuffixOutputs

    g = torch.Generator().manual_seed(0)
    ref = [torch.randn(50, 8, generator=g) for _ in range(3)]
    outs = [r[20:].clone() for r in ref]
    outs[1][5, 3] += 0.5  # one element of one row of layer 1
    want = max(rel_error(o, r[20:]) for o, r in zip(outs, ref))
    s = SuffixOutputs(list(outs), 20)
    s.compare(0, ref[0][20:])
    with pytest.raises(RuntimeError, match="1 of 3"):
        s.error()
    s.compare(1, ref[1][20:])
    s.compare(2, ref[2][20:])
    assert s.outs == [None, None, None] and s.error() == want > 0.01


def test_a_request_that_would_take_the_batch_past_the_budget_runs_the_queue_first(model):
    """Request 0 (its 2,000-token prompt, no hit: its KV and two states, 2,000 x 128 + 2 x 5,632 =
    267,264 B) fits a budget of 300,000 B and waits; request 2 (300 tokens: 49,664 B) would take
    the batch past it: the queue runs first, then request 2 waits for the end."""
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], batch=8, eager=False)
    rp.batched.held_bytes = 300_000
    for r, n in ((0, 2000), (2, 300)):
        rp.lookup(r, None, 0)
        rp.prefill(r, 0, n)
        rp.decode(r)
    assert rp.batch_flushes == {}  # request 0 queued (at request 2's lookup), nothing ran
    rp.finish()
    assert rp.batch_flushes == {"memory": 1, "finish": 1} and rp.failures == []
    assert [c.segments for c in rp.batch_log if c.kind == "suffix"] == [[(0, 2000)], [(0, 300)]]


@pytest.mark.parametrize("held", [None, 400_000])
def test_queued_checks_run_before_a_batch_that_would_take_them_past_the_budget(model, held):
    """Request 1's check (289,792 B, as above) waits in its queue; request 3 (its next turn: KV to
    2,086 tokens, two states, 30 suffix rows x 3 layers x 32 fp32 = 289,792 B as well) joins the
    request queue. Under a 400,000 B budget the check runs before request 3's batch; under the
    default both checks run together at the end."""
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], batch=8, eager=False)
    if held:
        rp.batched.held_bytes = held
    _turns(rp)
    rp.admit(5, 1, 2056, "")
    rp.lookup(3, 5, 2056)  # checkpoint 5 is queued: request 1 runs first, its check waits
    rp.prefill(3, 2056, 2086)
    rp.decode(3)
    rp.finish()
    assert rp.failures == [] and rp.records[1].validated and rp.records[3].validated
    log = [(c.kind, c.segments) for c in rp.batch_log]
    assert log[:2] == [("suffix", [(0, 2016)]), ("suffix", [(2016, 2056)])]
    if held:
        assert log[2:] == [("reference", [(0, 2056)]), ("suffix", [(2056, 2086)]), ("reference", [(0, 2086)])]
    else:
        assert log[2:] == [("suffix", [(2056, 2086)]), ("reference", [(0, 2056), (0, 2086)])]


def test_the_memory_plan_of_a_real_trace_counts_its_longest_request_and_the_stores_on_the_gpu():
    """The CUDA-only up-front note, on the CPU: mooncake:sample's longest request (input and
    output tokens, counted here from the trace itself), the store's capacity once per store on the
    GPU and the queues' budget only when batched."""
    from sim.config import SimConfig
    from sim.cost import get_model
    from sim.replay.batched import HELD_BYTES
    from sim.replay.model import ReplayShape
    from sim.replay.pipeline import call_bytes_per_token, planned_memory_note
    from sim.replay.session import ReplaySettings
    from traces.registry import load_trace

    trace = load_trace("mooncake:sample")
    bt = trace.block_tokens
    longest = max(r.n_input_tokens(bt) + r.n_output_tokens(bt) for r in trace.requests)
    s = ReplayShape.from_spec(get_model("qwen3-next-80b-a3b"))
    bf16 = torch.bfloat16
    cfg = SimConfig(policy="marconi", model="qwen3-next-80b-a3b", capacity_bytes=40 * 10**9)
    call = longest * (call_bytes_per_token(s, bf16) + 2_048 * 4)
    batched = ReplaySettings(device="cuda", batch=16, store="gpu")
    planned = 40 * 10**9 + HELD_BYTES + call
    assert planned_memory_note(trace, cfg, batched, 0, s, bf16, planned) == ""
    note = planned_memory_note(trace, cfg, batched, 0, s, bf16, planned - 1)
    assert f"store up to 40.0 GB, batch queues {HELD_BYTES / 1e9:.1f} GB" in note and f"at {longest} tokens" in note
    # two shadow stores beside the replayer's; a host store and no batch: the shadows alone
    assert "store up to 120.0 GB" in planned_memory_note(trace, cfg, batched, 2, s, bf16, 0)
    host = ReplaySettings(device="cuda", store="host")
    assert "store up to 0.0 GB, batch queues 0.0 GB" in planned_memory_note(trace, cfg, host, 0, s, bf16, 0)
    # a simulation's figures (``simulated_plan``): the running requests' bytes added as given, the
    # store as the simulation allocates it, below the capacity or past it (the pages' and the
    # pool's rounding: marconi-7b's 10 GB store allocates 11.3 GB)
    from sim.replay.pipeline import SimulatedPlan

    ample = SimulatedPlan(store_bytes=40 * 10**9, running_bytes=5)
    assert planned_memory_note(trace, cfg, batched, 0, s, bf16, planned + 5, ample) == ""
    assert "running requests 0.0 GB" in planned_memory_note(trace, cfg, batched, 0, s, bf16, planned + 4, ample)
    past = SimulatedPlan(store_bytes=41 * 10**9, running_bytes=0)
    assert planned_memory_note(trace, cfg, batched, 0, s, bf16, planned + 10**9, past) == ""
    assert "store up to 41.0 GB" in planned_memory_note(trace, cfg, batched, 0, s, bf16, planned + 10**9 - 1, past)
    small = SimulatedPlan(store_bytes=3 * 10**9, running_bytes=0)
    assert planned_memory_note(trace, cfg, batched, 0, s, bf16, planned - 37 * 10**9, small) == ""
    note = planned_memory_note(trace, cfg, batched, 0, s, bf16, planned - 37 * 10**9 - 1, small)
    assert "store up to 3.0 GB" in note and "running requests" not in note


def test_an_unbounded_store_plans_what_its_trace_can_fill_not_the_sentinel():
    """``--capacity inf`` (replay_bench's fit runs) printed "4611686020.3 GB planned": the store's
    plan is the lower of the capacity and every token's KV plus a state at every 64-token boundary
    and two more per request, hand-counted here on a 2-request trace of replay-tiny's shape."""
    from sim.config import UNLIMITED, SimConfig
    from sim.cost import get_model
    from sim.replay.model import ReplayShape
    from sim.replay.pipeline import planned_memory_note, produced_bytes
    from sim.replay.session import ReplaySettings
    import numpy as np

    from traces.base import Request, Trace

    s = ReplayShape.from_spec(get_model("replay-tiny"))
    f32 = torch.float32
    kv, state = s.kv_bytes_per_token(f32), s.state_bytes(f32)
    assert kv > 0 and state > 0
    # 200 tokens: 3 boundaries + 2; 64 tokens: 1 + 2
    assert produced_bytes([200, 64], s, f32) == 264 * kv + (5 + 3) * state
    assert produced_bytes([], s, f32) == 0
    trace = Trace(
        name="two",
        requests=[
            Request(0, 0, np.arange(150), np.arange(50)),
            Request(1, 0, np.arange(60), np.arange(4)),
        ],
    )
    fill = produced_bytes([200, 64], s, f32)
    gpu = ReplaySettings(device="cuda", store="gpu")
    inf = SimConfig(policy="marconi", model="replay-tiny", capacity_bytes=UNLIMITED)
    assert f"store up to {fill / 1e9:.1f} GB" in planned_memory_note(trace, inf, gpu, 0, s, f32, 0)
    small = SimConfig(policy="marconi", model="replay-tiny", capacity_bytes=fill - 1)
    note = planned_memory_note(trace, small, gpu, 1, s, f32, 0)
    assert f"store up to {2 * (fill - 1) / 1e9:.1f} GB" in note


def test_the_free_memory_counts_what_torch_holds_reserved_but_unused(monkeypatch):
    """replay_bench's held-out run after its fit runs was told "42.3 GB free" on an 80 GB H100 with
    2 GB of weights: the fit runs' blocks sat in torch's cache, which the replay's own tensors
    reuse. The plan's free memory is the driver's plus reserved minus allocated."""
    from sim.replay.pipeline import free_for_replay

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (42 * 10**9, 80 * 10**9))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 36 * 10**9)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 2 * 10**9)
    assert free_for_replay("cuda") == 76 * 10**9


def test_a_one_call_prefill_keeps_its_outputs_without_copying_them(model, monkeypatch):
    """A suffix prefill kept for its hit's check (``keep_outputs``) in one call returns the
    forward's own output tensors: no copy of every layer's output after the last time mark, which
    the from-scratch reference never makes (session 27: it was timed as the suffix's prefill). A
    split call joins its pieces, with the same values."""
    toks = torch.as_tensor(LONG[:150])
    joined = []
    real_cat = torch.cat

    def counting_cat(tensors, *a, **k):
        joined.append(len(tensors))
        return real_cat(tensors, *a, **k)

    monkeypatch.setattr(torch, "cat", counting_cat)
    seen = {}
    _, outs, calls = model.run(
        toks, None, 0, [128], keep_outputs=True, on_output=lambda layer, x, start: seen.setdefault(layer, x)
    )
    assert calls == 1 and all(o.shape == (150, SHAPE.hidden) for o in outs)
    assert 1 not in joined  # no layer's output "joined" from a single piece: a copy
    assert all(outs[layer] is seen[layer] for layer in range(len(outs)))  # the very tensors, no clone either
    _, split, calls = model.run(toks, None, 0, [100], keep_outputs=True)
    assert calls == 2 and len(split) == len(SHAPE.order)
    for a, b in zip(outs, split):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


# ---- a check whose suffix outputs do not fit: compared in groups of layers ---------------------


def test_output_groups_hold_as_many_consecutive_layers_as_fit():
    from sim.replay.hits import output_groups

    # 10 rows x 8 wide fp32: 320 B a layer, 1,600 B for 5 layers
    assert output_groups(range(5), 10, 8, None) == [[0, 1, 2, 3, 4]]
    assert output_groups(range(5), 10, 8, 1_600) == [[0, 1, 2, 3, 4]]
    assert output_groups(range(5), 10, 8, 1_599) == [[0, 1, 2, 3], [4]]
    assert output_groups(range(5), 10, 8, 640) == [[0, 1], [2, 3], [4]]
    assert output_groups(range(5), 10, 8, 1) == [[0], [1], [2], [3], [4]]  # one layer at least
    assert output_groups([1, 3, 4], 10, 8, 700) == [[1, 3], [4]]  # the layers still to compare
    assert output_groups([], 10, 8, 1) == []
    assert output_groups(range(3), 0, 8, 1) == [[0, 1, 2]]  # no rows: nothing to hold


def test_run_keeps_the_named_layers_outputs_the_same_bits_and_none_for_the_others(model):
    toks = torch.as_tensor(np.concatenate([LONG[:300], USER]))
    _, every, _ = model.run(toks, None, 0, [100, 250], lambda *a: None, keep_outputs=True, keep_from=90)
    _, some, calls = model.run(toks, None, 0, [100, 250], lambda *a: None, keep_outputs=[0, 2], keep_from=90)
    assert calls == 3 and some[1] is None  # split at 100 and 250: the kept rows joined
    for l in (0, 2):
        assert torch.equal(some[l], every[l]) and some[l].shape == (340 - 90, SHAPE.hidden)
    _, none_kept, _ = model.run(toks, None, 0, [], lambda *a: None, keep_outputs=[])
    assert none_kept == [None, None, None]
    _, empty, _ = model.run(toks[:0], None, 0, [], None, keep_outputs=[1])
    assert empty[0] is None and empty[2] is None and empty[1].shape == (0, SHAPE.hidden)
    with pytest.raises(ValueError, match="outside the model's 3"):
        model.run(toks, None, 0, [], None, keep_outputs=[3])


def test_suffix_outputs_held_in_groups_are_each_compared_once():
    from sim.replay.hits import SuffixOutputs

    g = torch.Generator().manual_seed(1)
    ref = [torch.randn(30, 8, generator=g) for _ in range(3)]
    outs = [r[10:] + 0.01 * (l + 1) for l, r in enumerate(ref)]
    s = SuffixOutputs([outs[0], None, None], 10)
    for l in range(3):  # the timed reference: layer 0 held, the others left for later
        s.compare(l, ref[l][10:])
    assert s.missing() == [1, 2] and s.compared == 1
    with pytest.raises(RuntimeError, match="1 of 3"):
        s.error()
    s.hold([None, outs[1], None])
    with pytest.raises(RuntimeError, match="layer 1's suffix outputs held twice"):
        s.hold([None, outs[1], None])
    with pytest.raises(RuntimeError, match="layer 0's suffix outputs held twice"):
        s.hold([outs[0], None, None])  # compared already
    for l in range(3):
        s.compare(l, ref[l][10:])
    assert s.missing() == [2]
    s.hold([None, None, outs[2]])
    s.compare(2, ref[2][10:])
    from sim.replay.checks import rel_error

    assert s.missing() == [] and s.error() == max(rel_error(o, r[10:]) for o, r in zip(outs, ref))


def _grouped_replay(model, batch, output_bytes, spoil=None):
    """Requests 0 and 1 (its hit at 2016, a 40-token suffix: 40 x 32 fp32 = 5,120 B a layer's
    outputs) under a bound on what a check holds of them (``output_bytes``)."""
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], batch=batch, eager=False, output_bytes=output_bytes)
    if spoil is not None:
        rp.model = rp.checker.model = spoil
        if rp.batched is not None:
            rp.batched.model = spoil
    _turns(rp)
    rp.finish()
    return rp


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("output_bytes, groups", [(None, 1), (15_360, 1), (15_359, 2), (10_240, 2), (5_120, 3), (1, 3)])
def test_a_check_compares_its_outputs_in_groups_where_they_do_not_fit_with_the_same_result(
    model, batch, output_bytes, groups
):
    """Per-request (``batch`` 1) and batched replay: the hit's check under each bound validates
    with the same worst output error as holding every layer (the suffix and the reference run
    again for each group but the timed calls'; on the CPU the same bits); ``output_groups``
    counts the groups, and the checker the grouped checks."""
    rp = _grouped_replay(model, batch, output_bytes)
    want = _grouped_replay(model, batch, None).records[1]
    rec = rp.records[1]
    assert rp.failures == [] and rec.validated and rec.kv_validated
    assert rec.max_out_error == want.max_out_error and rec.max_rec_error == want.max_rec_error
    assert rec.output_groups == groups and rp.checker.grouped == (groups > 1)
    assert rp.records[0].output_groups == 1  # no hit: no check


class _Spoiled:
    """``model`` whose group reruns (a list of kept layers) return the last layer's outputs off by
    0.5: a later group's comparison is what catches it."""

    def __init__(self, model):
        self._m = model

    def __getattr__(self, name):
        return getattr(self._m, name)

    def run(self, *a, keep_outputs=False, **k):
        st, outs, calls = self._m.run(*a, keep_outputs=keep_outputs, **k)
        if isinstance(keep_outputs, list) and 2 in keep_outputs:
            outs[2] = outs[2] + 0.5
        return st, outs, calls


@pytest.mark.parametrize("batch", [1, 8])
def test_a_later_groups_outputs_are_judged(model, batch):
    spoiled = _Spoiled(model)
    assert _grouped_replay(model, batch, 10_240, spoil=spoiled).failures[0].kind == "numerics"
    # held at once, the rerun never runs: nothing is spoiled
    assert _grouped_replay(model, batch, None, spoil=spoiled).failures == []


@pytest.mark.parametrize("batch", [1, 8])
def test_a_split_suffix_is_split_again_where_its_check_runs_it_again(model, batch):
    """Request 1's suffix ``[2016, 2056)`` split at 2040 (a state wanted there, off a 64-multiple;
    batched replay runs it alone and queues its check): each group's rerun splits there too, so
    the grouped check measures the same worst output error as the check that held every layer
    from the timed (split) call."""

    def run(output_bytes):
        store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
        rp = Replayer(model, store, lambda r: REQS[r], eager=False, output_bytes=output_bytes, batch=batch)
        rp.lookup(0, None, 0)
        rp.prefill(0, 0, 2000)
        rp.decode(0)
        rp.admit(4, 0, 2016, "")
        rp.lookup(1, 4, 2016)
        rp.admit(6, 1, 2040, "")
        rp.prefill(1, 2016, 2056)
        rp.decode(1)
        rp.finish()
        assert rp.failures == [] and rp.records[1].suffix_segments == [(2016, 2040), (2040, 2056)]
        assert rp.records[1].validated
        return rp.records[1]

    held, grouped = run(None), run(5_120)
    assert grouped.output_groups == 3 and held.output_groups == 1
    assert grouped.max_out_error == held.max_out_error > 0


def test_the_job_budget_counts_a_held_suffixs_outputs_only(model):
    """``_job_nbytes``: KV to the end, two states and, when its check holds them in the batch,
    the suffix's outputs (40 rows x 3 layers x 32 fp32 = 15,360 B); a check compared in groups
    holds none there."""
    from sim.replay.batched import Job

    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], batch=8, eager=False)
    f = type("F", (), {"pos": 2016})()
    base = 2056 * 128 + 2 * (4096 + 1536)
    assert rp.batched._job_nbytes(Job(f, 2056, {}, True, held=True)) == base + 15_360
    assert rp.batched._job_nbytes(Job(f, 2056, {}, True, held=False)) == base


def test_a_gpus_check_bound_is_what_is_free_less_one_call_and_the_margin(monkeypatch):
    from sim.replay import pipeline
    from sim.replay.session import ReplaySettings

    monkeypatch.setattr(pipeline, "free_for_replay", lambda device: 40 * 10**9)
    per = pipeline.call_bytes_per_token(SHAPE, torch.float32)
    room = pipeline.output_room(SHAPE, torch.float32, torch.device("cpu"))
    assert room(1_000) == 40 * 10**9 - 1_000 * per - pipeline.CHECK_MARGIN
    assert room(10**9) == 1  # nothing free: one layer a group all the same
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pipeline.check_bound(ReplaySettings(), SHAPE, torch.float32, cpu) is None
    assert pipeline.check_bound(ReplaySettings(check_memory=0.5), SHAPE, torch.float32, cpu) == 500_000_000
    assert pipeline.check_bound(ReplaySettings(), SHAPE, torch.float32, cuda)(1_000) == room(1_000)


@pytest.mark.parametrize("scheduler, layers", [("fcfs", None), ("fcfs", 2), ("continuous", 2)])
def test_the_plans_store_is_what_the_store_held_at_its_most(scheduler, layers):
    """``simulated_plan``'s store figure (``StorePeak`` on the tree's occupancy, priced at the
    replay's shape) against the store's own peak in the replay it plans: never below it, within
    10 %, at full depth and at 2 of replay-tiny's 4 mixer layers (the capacity counts the
    preset's bytes: a subsampled replay holds less). ``--capacity inf`` planned "482.4 GB" for
    replay_bench's fit runs of the 80b, which held a few."""
    from sim.config import SimConfig
    from sim.cost import get_model
    from sim.replay.model import ReplayShape
    from sim.replay.pipeline import simulated_plan
    from sim.replay.session import ReplaySettings, run_replay
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace(
        "synthetic:chat:sessions=4,turns=3,prompt_tokens=300,user_tokens=20,output_tokens=10,prompts=2", TraceOptions()
    )
    config = SimConfig(policy="marconi", model="replay-tiny", scheduler=scheduler, sessions_per_second=0.5)
    settings = ReplaySettings(device="cpu", dtype="fp32", layers=layers)
    res = run_replay(trace, config, settings, build=build)
    s = res.summary
    assert s["failures"] == 0 and s["hits"] > 0
    spec = get_model("replay-tiny")
    shape = ReplayShape.from_spec(spec, layers)
    plan = simulated_plan(trace, config, settings, spec, shape, torch.float32, simulate=build, timing=res.timing)
    # the plan counts the pool as it grows (by chunks): what the store allocated
    assert s["store_peak_bytes"] <= s["store_device_bytes"] <= plan.store_bytes <= 1.1 * s["store_device_bytes"]
    assert plan.running_bytes == 0 if scheduler == "fcfs" else plan.running_bytes > 0


def test_open_flights_are_bounded_in_bytes_under_continuous_batching_on_a_gpu():
    from sim.replay.pipeline import FLIGHT_BYTES, flight_bound

    gpu, cpu = torch.device("cuda"), torch.device("cpu")  # a device object, no GPU needed
    assert flight_bound(True, gpu) == FLIGHT_BYTES == 8 << 30
    assert flight_bound(False, gpu) is None and flight_bound(True, cpu) is None and flight_bound(False, cpu) is None


@pytest.mark.parametrize("scheduler", ["fcfs", "continuous"])
def test_the_plans_line_counts_the_simulated_store_and_running_requests(scheduler):
    """``plan_note`` (what a GPU replay prints before it starts) with the simulation's figures:
    the store at its simulated peak, not the capacity, and under continuous batching the running
    requests; without ``simulate``, the capacity and no running requests."""
    from sim.config import SimConfig
    from sim.cost import get_model
    from sim.replay.model import ReplayShape
    from sim.replay.pipeline import FLIGHT_BYTES, call_bytes_per_token, plan_note, produced_bytes, simulated_plan
    from sim.replay.session import ReplaySettings
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace(
        "synthetic:chat:sessions=4,turns=3,prompt_tokens=300,user_tokens=20,output_tokens=10,prompts=2", TraceOptions()
    )
    config = SimConfig(policy="marconi", model="replay-tiny", scheduler=scheduler, capacity_bytes=10**9)
    settings = ReplaySettings(device="cpu", dtype="fp32")
    spec = get_model("replay-tiny")
    shape = ReplayShape.from_spec(spec)
    f32 = torch.float32
    plan = simulated_plan(trace, config, settings, spec, shape, f32, simulate=build, timing=None)
    assert 0 < plan.store_bytes < 10**6
    note = plan_note(trace, config, settings, 0, spec, shape, f32, free=0, simulate=build, timing=None)
    assert f"store up to {plan.store_bytes / 1e9:.1f} GB" in note
    assert ("running requests" in note) == (scheduler == "continuous")
    if scheduler == "continuous":
        assert plan.running_bytes > FLIGHT_BYTES and f"running requests {plan.running_bytes / 1e9:.1f} GB" in note
    bare = plan_note(trace, config, settings, 0, spec, shape, f32, free=0, simulate=None, timing=None)
    lengths = [r.n_input_tokens(trace.block_tokens) + r.n_output_tokens(trace.block_tokens) for r in trace.requests]
    fill = produced_bytes(lengths, shape, f32)  # a state every 64 tokens: more than the store held
    assert fill > plan.store_bytes
    assert f"store up to {fill / 1e9:.1f} GB" in bare and "running requests" not in bare
    # to the byte: the plan is the simulated store, the running requests and the longest call
    call = max(lengths) * (call_bytes_per_token(shape, f32) + shape.hidden * 4)
    edge = plan.store_bytes + plan.running_bytes + call
    assert plan_note(trace, config, settings, 0, spec, shape, f32, free=edge, simulate=build, timing=None) == ""
    assert plan_note(trace, config, settings, 0, spec, shape, f32, free=edge - 1, simulate=build, timing=None) != ""
    assert plan_note(trace, config, settings, 0, spec, shape, f32, free=fill + call, simulate=None, timing=None) == ""
    assert plan_note(trace, config, settings, 0, spec, shape, f32, free=fill + call - 1, simulate=None, timing=None)
    # what fits is not said
    assert plan_note(trace, config, settings, 0, spec, shape, f32, free=10**11, simulate=build, timing=None) == ""
