"""Batched replay (``marconi replay --mode sequential --batch N``, sim/replay/runner.py): requests
queued and run as varlen batches, hits checked against batched from-scratch prefills.

* ``forward_batch``'s boundary states equal ``forward_segment``'s on each sequence alone (both
  gated-delta backends).
* On hand-written event streams: a hit on a state a queued request still has to produce runs the
  queue first; the bf16-snapshot bug class and a planted KV error are caught through the batched
  path, a numerics error by its batched check; an evicted queued checkpoint is never written.
* On the simulator's streams (synthetic chat, both alignments): every hit validated, the store
  holds exactly the simulator's live checkpoints after every event, the same hits and executed
  FLOPs as the per-request replay; requests carry no per-request time, the batch calls do.
* ``batch_summary`` on hand-made calls; the CLI's one-line refusals and its batched table.
"""

import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

torch = pytest.importorskip("torch")

from sim.config import SimConfig  # noqa: E402
from sim.cost import get_model  # noqa: E402
from sim.replay.checks import rel_error  # noqa: E402
from sim.replay.measure import batch_summary  # noqa: E402
from sim.replay.model import HybridModel, ReplayShape  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.session import ReplaySettings, run_replay  # noqa: E402
from sim.replay.store import CheckpointStore  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces.registry import TraceOptions, load_trace  # noqa: E402

from test_replay_cli import marconi  # noqa: E402
from test_replay_validate import REQS, SHAPE, Bf16Snapshot, _plant  # noqa: E402


# ---- the batched forward's boundary states ---------------------------------------------------
@pytest.mark.parametrize("kernel", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_batched_forward_hands_over_each_sequences_boundary_states(kernel):
    if kernel == "triton":
        pytest.importorskip("triton")
        shape = ReplayShape(hidden=32, layers=1, k_heads=1, v_heads=2, head_k_dim=16, head_v_dim=16, vocab_rows=512)
    else:
        shape = ReplayShape.from_spec(get_model("replay-tiny"))
    m = HybridModel(shape, device="cpu", dtype=torch.float32, seed=3, kernel=kernel)
    g = torch.Generator().manual_seed(1)
    # (start, tokens, wanted boundaries): from scratch over two boundaries, from a restored state
    # at 100 (ragged first chunk) over one, and one with none
    specs = [(0, 150, [64, 128]), (100, 100, [128, 192]), (30, 20, [])]
    toks = [torch.randint(0, 10_000, (p + n,), generator=g) for p, n, _ in specs]
    starts = [m.run(t[:p], None, 0)[0] if p else None for (p, _, _), t in zip(specs, toks)]
    want: dict = {}
    for i, ((p, n, bnd), t, st) in enumerate(zip(specs, toks, starts)):

        def sink(q, layer, r, c, i=i):
            want[(i, q, layer)] = (r.clone(), c.clone())

        m.forward_segment(m.embed(t[p : p + n]), st, p, bnd, sink)
    got: dict = {}

    def on_state(n, q, layer, r, c):
        got[(n, q, layer)] = (r.clone(), c.clone())

    zero = m.zero_state()
    cu = np.cumsum([0] + [n for _, n, _ in specs]).tolist()
    m.forward_batch(
        torch.cat([t[p : p + n] for (p, n, _), t in zip(specs, toks)]),
        cu,
        [p for p, _, _ in specs],
        torch.stack([(st or zero).rec for st in starts], dim=1),
        torch.stack([(st or zero).conv for st in starts], dim=1),
        [None if st is None else st.kv for st in starts],
        boundaries=[b for _, _, b in specs],
        on_state=on_state,
    )
    assert sorted(got) == sorted(want) and len(want) == 4 * shape.layers
    for k, (r, c) in want.items():
        assert rel_error(got[k][0], r) < 1e-5 and rel_error(got[k][1], c) < 1e-5, k


def test_batched_forward_refuses_boundaries_of_the_wrong_length():
    m = HybridModel(ReplayShape.from_spec(get_model("replay-tiny")), device="cpu", dtype=torch.float32, seed=3)
    with pytest.raises(ValueError, match="boundary"):
        m.forward_batch(torch.arange(70), [0, 70], [0], boundaries=[[64], []])


# ---- hand-written streams --------------------------------------------------------------------
@pytest.fixture(scope="module", params=["fp32", "bf16"])
def model(request):
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[request.param]
    return HybridModel(SHAPE, device="cpu", dtype=dt, seed=3, kernel="torch")


def make(model, store_cls=CheckpointStore, batch=2, **kw):
    store = store_cls(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], batch=batch, eager=False, **kw)
    return rp, store


def turn(rp, request, cp=None, hit=0, admits=()):
    """One request of a sequential stream: lookup, prefill, decode, then its admits."""
    n_in = REQS[request][1]
    rp.lookup(request, cp, hit)
    rp.prefill(request, hit, n_in)
    rp.decode(request)
    for ck, p in admits:
        rp.admit(ck, request, p, "")


def test_a_hit_on_a_queued_checkpoint_runs_the_queue_first(model):
    rp, store = make(model, batch=8)
    turn(rp, 0, admits=[(1, 64), (4, 130)])  # 64: a kernel boundary; 130: the request's end
    turn(rp, 3, admits=[(7, 110)])
    assert rp.batch_flushes == {} and not store.info(4).filled  # queued, nothing ran
    turn(rp, 1, cp=4, hit=130)  # request 3 queued; checkpoint 4 is request 0's: the queue runs
    assert rp.batch_flushes == {"dependency": 1} and store.info(4).filled and store.info(1).filled
    assert rp.records[1].restored
    rp.finish()
    assert rp.failures == [] and rp.records[1].validated and rp.kv_hits_validated == 1
    assert rp.batch_flushes == {"dependency": 1, "finish": 1}
    kinds = Counter(c.kind for c in rp.batch_log)
    assert kinds == {"suffix": 2, "reference": 1}
    first = rp.batch_log[0]
    assert first.segments == [(0, 130), (0, 110)] and first.ms == first.ms  # timed
    assert all(math.isnan(r.suffix_ms) for r in rp.records.values())  # no per-request times
    assert rp.records[1].suffix_segments == [(130, 170)] and rp.records[0].suffix_segments == [(0, 100)]


def test_a_state_off_a_boundary_runs_the_request_alone(model):
    rp, store = make(model, batch=8)
    turn(rp, 0, admits=[(2, 90), (4, 130)])  # 90: a split, as the per-request replay makes it
    turn(rp, 1, cp=2, hit=90)
    rp.finish()
    assert rp.failures == [] and rp.records[1].validated
    singles = [c for c in rp.batch_log if c.kind == "single"]
    assert [c.segments for c in singles] == [[(0, 90), (90, 100)]]
    # request 1 (hit 90, no split) ran in a batch; its check joined the batched references
    assert [c.segments for c in rp.batch_log if c.kind == "reference"] == [[(0, 170)]]


def test_a_split_requests_hit_is_checked_in_the_batched_references(model):
    rp, store = make(model, batch=8)
    turn(rp, 0, admits=[(1, 64), (4, 130)])
    turn(rp, 1, cp=1, hit=64, admits=[(6, 150), (8, 170)])  # 150: a split of request 1's prompt
    turn(rp, 3)
    rp.finish()
    assert rp.failures == [] and rp.records[1].validated and rp.records[1].max_rec_error < 0.2
    assert [c.segments for c in rp.batch_log if c.kind == "single"] == [[(64, 150), (150, 170)]]
    assert [c.segments for c in rp.batch_log if c.kind == "reference"] == [[(0, 170)]]
    assert store.info(6).filled and store.info(8).filled


def _chain(rp):
    turn(rp, 0, admits=[(1, 64), (4, 130)])
    turn(rp, 3, admits=[(7, 110)])
    turn(rp, 2)  # the queue holds two: it runs (batch=2)
    assert rp.batch_flushes == {"full": 1}


def test_the_bf16_snapshot_bug_is_caught_through_the_batched_path(model):
    rp, _ = make(model, Bf16Snapshot, validate="exact")
    _chain(rp)
    turn(rp, 1, cp=4, hit=130)
    rp.finish()
    assert [x.kind for x in rp.failures] == ["integrity"] and "layer 0 head 0" in rp.failures[0].detail


@pytest.mark.parametrize("where", ["state", "kv"])
def test_a_one_percent_store_error_is_caught_through_the_batched_path(model, where):
    rp, store = make(model, validate="exact")
    _chain(rp)
    assert _plant(store, where, 1.01)
    turn(rp, 1, cp=4, hit=130)
    rp.finish()
    assert [x.kind for x in rp.failures] == ["kv-integrity" if where == "kv" else "integrity"]


def test_a_numerics_error_is_caught_by_the_batched_check():
    """Tolerance mode (no bit check): the planted error reaches the batched from-scratch
    comparison, which fails it; the same stream clean passes."""
    model = HybridModel(SHAPE, device="cpu", dtype=torch.float32, seed=3, kernel="torch")
    for planted in (True, False):
        rp, store = make(model, validate="tolerance")
        _chain(rp)
        if planted:
            store.tensors(4)[0][1, 0] *= 1 + 4e-4
        turn(rp, 1, cp=4, hit=130)
        rp.finish()
        assert [x.kind for x in rp.failures] == (["numerics"] if planted else [])
        assert rp.records[1].validated and Counter(c.kind for c in rp.batch_log)["reference"] == 1
        if planted:
            assert 1e-4 < rp.records[1].max_rec_error < 1e-3


def test_an_evicted_queued_checkpoint_is_never_written(model):
    rp, store = make(model, batch=8)
    turn(rp, 0, admits=[(1, 64), (4, 130)])
    rp.evict(1)
    assert 1 not in store
    turn(rp, 3)
    rp.finish()
    assert rp.failures == [] and store.info(4).filled and 1 not in store


def test_batched_replay_refuses_des_streams(model):
    rp, _ = make(model)
    rp.eager = True
    turn(rp, 0, admits=[(4, 130)])
    with pytest.raises(ValueError, match="sequential"):
        rp.finish()


# ---- the simulator's streams -----------------------------------------------------------------
CHAT = "synthetic:chat:sessions=6,turns=4,prompt_tokens=40,user_tokens=24,output_tokens=16,prompts=2"


@pytest.fixture(scope="module")
def chat():
    return load_trace(CHAT, TraceOptions())


def _replay(trace, alignment, batch, capacity=40_000, requests=24):
    live_ok = []

    def after(name, sim, rp):
        live_ok.append(rp.store.ids() == set(sim.tree.checkpoints()))

    cfg = SimConfig(
        policy="marconi",
        model="replay-tiny",
        capacity_bytes=capacity,
        alpha=0.5,
        state_alignment=alignment,
        mode="sequential",
    )
    st = ReplaySettings(device="cpu", dtype="fp32", requests=requests, batch=batch)
    res = run_replay(trace, cfg, st, build=build, after_event=after)
    assert live_ok and all(live_ok)
    return res


@pytest.mark.parametrize("alignment", ["exact", "chunk"])
def test_batched_replay_validates_what_the_per_request_replay_validates(chat, alignment):
    one, many = _replay(chat, alignment, 1), _replay(chat, alignment, 4)
    for res in (one, many):
        assert res.failures == [], [f.message() for f in res.failures]
        assert res.summary["hits"] > 0 and res.summary["hits_validated"] == res.summary["hits"]
        assert res.summary["max_restore_error"] < 1e-4
    for k in ("hits", "hits_validated", "kv_hits_validated", "hit_tokens", "replay_flops_executed", "splits"):
        assert one.summary[k] == many.summary[k], k
    assert "batch_calls" not in one.summary
    s = many.summary
    calls = s["batch_calls"]
    assert calls["suffix"]["calls"] >= 1 and calls["reference"]["calls"] >= 1
    assert calls["suffix"]["sequences_per_call"] > 1  # batched
    assert calls["reference"]["sequences"] + calls.get("single", {}).get("calls", 0) >= s["hits_validated"] // 2
    assert many.requests["suffix_ms"].isna().all()
    assert s["replay_tflops_timed"] > 0 and s["replay_tflops_wall"] > 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions=hst.integers(2, 4),
    turns=hst.integers(2, 4),
    prompt=hst.integers(20, 140),
    user=hst.integers(5, 70),
    output=hst.integers(1, 40),
    capacity=hst.sampled_from([15_000, 40_000, 10**6]),
    alignment=hst.sampled_from(["exact", "chunk"]),
    batch=hst.integers(2, 6),
)
def test_batched_replay_matches_the_per_request_replay_on_random_chat_traces(
    sessions, turns, prompt, user, output, capacity, alignment, batch
):
    """Whatever the conversations, the cache size (evictions of queued checkpoints included) and
    the batch size: no failure, every hit validated, the same hits and executed FLOPs as one
    request at a time, and the store in step with the simulator after every event."""
    trace = load_trace(
        f"synthetic:chat:sessions={sessions},turns={turns},prompt_tokens={prompt},user_tokens={user},"
        f"output_tokens={output},prompts=2",
        TraceOptions(),
    )
    one = _replay(trace, alignment, 1, capacity=capacity, requests=None)
    many = _replay(trace, alignment, batch, capacity=capacity, requests=None)
    for res in (one, many):
        assert res.failures == [], [f.message() for f in res.failures]
        assert res.summary["hits_validated"] == res.summary["hits"]
    for k in ("hits", "hit_tokens", "kv_hits_validated", "replay_flops_executed", "splits", "late_admits"):
        assert one.summary[k] == many.summary[k], k


# ---- the summary and the CLI -----------------------------------------------------------------
def test_batch_summary_on_hand_made_calls():
    spec = get_model("qwen3.5-9b")
    counts = {"attention": 8, "gated_delta": 24, "mlp": 32}
    from sim.replay.flops import replayed_flops

    calls = [
        SimpleNamespace(kind="suffix", segments=[(0, 100), (64, 128)], ms=2.0, slack_ms=3.0),
        SimpleNamespace(kind="reference", segments=[(0, 128)], ms=1.0, slack_ms=0.1),
    ]
    f_s = replayed_flops(spec, counts, [(0, 100), (64, 128)])
    f_r = replayed_flops(spec, counts, [(0, 128)])
    s = batch_summary(calls, spec, counts, wall_s=0.01, peak_tflops=1000.0, flushes={"full": 1})
    d = s["batch_calls"]["suffix"]
    assert (d["calls"], d["sequences"], d["tokens"], d["sequences_per_call"]) == (1, 2, 164, 2.0)
    assert d["tflops"] == pytest.approx(f_s / 2e-3 / 1e12)
    assert s["replay_tflops_timed"] == pytest.approx((f_s + f_r) / 3e-3 / 1e12)
    assert s["replay_tflops_wall"] == pytest.approx((f_s + f_r) / 0.01 / 1e12)
    assert s["replay_peak_share_wall"] == pytest.approx(s["replay_tflops_wall"] / 1000.0)
    assert s["batch_calls_host_bound"] == 1 and s["batch_flushes"] == {"full": 1}


@pytest.mark.parametrize(
    "args, says",
    [
        (["--mode", "des", "--batch", "4"], "--batch > 1 batches a sequential replay"),
        (["--mode", "sequential", "--batch", "0"], "--batch must be >= 1"),
        (["--mode", "sequential", "--batch", "4", "--calibrate", "t.json"], "--calibrate fits per-request times"),
    ],
)
def test_bad_batch_options_exit_2_with_one_line(args, says, tmp_path):
    p = marconi(
        "replay", "--device", "cpu", "--model", "replay-tiny", "--trace", "synthetic:chat", "--requests", "2",
        *[str(tmp_path / a) if a.endswith(".json") else a for a in args],
        check=False,
    )  # fmt: skip
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "t.json").exists()


def test_batched_table_shows_the_batch_calls_and_its_folder_has_no_request_figure(tmp_path):
    p = marconi(
        "replay", "--device", "cpu", "--model", "replay-tiny", "--trace", CHAT, "--requests", "12",
        "--mode", "sequential", "--batch", "4", "--no-progress", "--out", tmp_path / "run",
    )  # fmt: skip
    out = p.stdout
    assert "batched calls" in out and "suffix" in out and "reference" in out
    assert "time model error" not in out and "measured prefill with cache" not in out
    assert "failures (KV)                   0 (0)" in out
    wall = next(ln for ln in out.splitlines() if ln.startswith("wall "))
    assert " TFLOP/s over the timed calls" in wall and "timed prefills" not in wall, wall
    p = marconi("plot", tmp_path / "run", "--kind", "replay", "--out", tmp_path / "fig", check=False)
    assert p.returncode == 2 and "a batched replay" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "fig" / "replay.png").exists()


def test_hit_checks_wait_across_flushes_until_their_queue_is_full(model):
    """Checks queued by two flushes of the request queue run as one batch of references at the
    end (their queue holds up to ``CHECKS_QUEUED`` x ``batch`` of them); mutation survivor of
    ``BatchedReplay.run_checks_when_full``."""
    rp, _ = make(model, batch=2)
    turn(rp, 0, admits=[(1, 64), (4, 130)])
    turn(rp, 1, cp=4, hit=130)  # request 0 is queued and produces 4: the queue runs alone
    turn(rp, 2, cp=1, hit=64)
    turn(rp, 3)  # requests 1 and 2 queued: the queue is full and runs; their checks wait
    turn(rp, 1, cp=4, hit=130)  # request 1 again (a new lookup): 3 and it fill the queue at finish
    rp.finish()
    assert rp.failures == [] and rp.batch_flushes == {"dependency": 1, "full": 2}
    refs = [c.segments for c in rp.batch_log if c.kind == "reference"]
    assert refs == [[(0, 170), (0, 110), (0, 170)]]
    assert rp.records[1].validated and rp.records[2].validated and rp.records[1].lookups == 2


def test_a_later_group_of_hit_checks_holds_exactly_batch_tokens(model):
    """The queued checks run in groups of up to ``batch_tokens`` tokens, a group after the first
    as full as the first may be: 170 alone (170 + 110 > 220), then 110 + 110 = 220 as one
    reference call; mutation survivor of ``BatchedReplay.run_checks`` (a new group counted from
    1 token, not 0, splits the second group)."""
    rp, _ = make(model, batch=2, batch_tokens=220)
    turn(rp, 0, admits=[(1, 64), (4, 130)])
    turn(rp, 1, cp=4, hit=130)  # request 0 produces 4: it runs alone
    turn(rp, 3)  # 1 and 3 run; 1's check (170 tokens) waits: 170 < 220
    turn(rp, 2, cp=1, hit=64)
    turn(rp, 2, cp=1, hit=64)  # the queue runs; two checks of 110 join: 390 >= 220, the checks run
    rp.finish()
    assert rp.failures == [] and rp.batch_flushes == {"dependency": 1, "full": 2}
    refs = [c.segments for c in rp.batch_log if c.kind == "reference"]
    assert refs == [[(0, 170)], [(0, 110), (0, 110)]]
