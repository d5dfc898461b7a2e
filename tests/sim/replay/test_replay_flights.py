"""Requests that wait: a DES stream looks a request up at its arrival and runs it later, so more
requests are open than the replayer keeps device tensors for (``max_open``). Hand-written streams
check that a waiting hit keeps its restore (parked, restored again at its prefill) and is checked,
that a request past its prefill whose state is dropped runs its prompt once (the Mooncake
``FLOPs saved executed -1.255e+09, simulated 3.187e+09`` of issue 41 was a prompt run twice: a
flight dropped and made again from scratch), that a whole-prompt hit is checked, and that every
unchecked hit carries its reason."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.replay.checks import state_error  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.store import CheckpointStore  # noqa: E402

rng = np.random.default_rng(11)
P0 = rng.integers(0, 10_000, 100)
O0 = rng.integers(0, 10_000, 30)
U1 = rng.integers(0, 10_000, 40)
O1 = rng.integers(0, 10_000, 20)
U3 = rng.integers(0, 10_000, 25)
REQS = {
    0: (np.concatenate([P0, O0]), 100),
    1: (np.concatenate([P0, O0, U1, O1]), 170),
    3: (np.concatenate([P0, O0, U3, O1]), 155),  # another turn after the same first one
    5: (np.concatenate([P0, U1[:7]]), 100),  # request 0's prompt again: a whole-prompt hit
}


def make(model, shape, **kw):
    store = CheckpointStore(shape, torch.float32, device="cpu")
    return Replayer(model, store, lambda r: REQS[r], eager=True, **kw), store


def first_turn(rp):
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 100)
    rp.admit(3, 0, 100, "prompt end")
    rp.decode(0)
    rp.admit(4, 0, 130, "tail")


def reference_state(model, tokens, p):
    got = {}
    model.run(torch.as_tensor(tokens[:p]), None, 0, [p], lambda q, layer, r, c: got.__setitem__(layer, (r, c)))
    L = model.shape.layers
    return torch.stack([got[i][0] for i in range(L)]), torch.stack([got[i][1] for i in range(L)])


def finish_validated(rp, requests) -> None:
    """The replay finished without a failure or an open flight, ``requests`` restored and validated."""
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and rp.flights == {}
    for r in requests:
        assert recs[r].restored and recs[r].validated, r


def test_waiting_hits_beyond_max_open_are_restored_and_checked(tiny_model, tiny_shape):
    rp, store = make(tiny_model, tiny_shape, max_open=1)
    first_turn(rp)
    rp.lookup(1, 4, 130)  # both hit the tail state of request 0 and wait for a server
    rp.lookup(3, 4, 130)  # one flight holds tensors: request 1 gives its restore back
    assert rp.parked == 1
    rp.prefill(1, 130, 170)  # restored again before the simulator unlocks its hit
    rp.admit(6, 1, 170, "prompt end")
    rp.decode(1)
    rp.prefill(3, 130, 155)
    rp.decode(3)
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and rp.flights == {} and rp.pending == {}  # every flight closed
    for r, n in ((1, 170), (3, 155)):
        assert recs[r].restored and recs[r].validated, r
        assert recs[r].suffix_segments == [(130, n)], r  # from the hit, once
        assert recs[r].unvalidated == ""
    rec, conv = reference_state(tiny_model, REQS[1][0], 170)
    assert max(state_error(*store.tensors(6), rec, conv)) < 1e-4


@pytest.mark.parametrize("max_open, parked", [(2, 1), (3, 0)])
def test_as_many_flights_as_max_open_keep_their_states(tiny_model, tiny_shape, max_open, parked):
    """``max_open`` flights hold their restored states; one more, and the oldest parks: three
    waiting hits (two of request 0's tail, one of its prompt end) park one under ``max_open`` 2,
    none under 3, and all three are restored and checked at their prefills."""
    rp, store = make(tiny_model, tiny_shape, max_open=max_open)
    first_turn(rp)
    rp.lookup(1, 4, 130)
    rp.lookup(3, 4, 130)
    rp.lookup(5, 3, 100)
    assert rp.parked == parked
    for r, a, n in ((1, 130, 170), (3, 130, 155), (5, 100, 107)):
        rp.prefill(r, a, n)
        rp.decode(r)
    finish_validated(rp, (1, 3, 5))


def test_a_flight_run_and_dropped_leaves_room_for_the_next(tiny_model, tiny_shape):
    """Past ``max_open`` (2), the oldest flight is past its prefill: it runs its prompt and drops
    its state, and that is room enough: the waiting hits keep their restores (nothing parked)."""
    rp, store = make(tiny_model, tiny_shape, max_open=2)
    first_turn(rp)
    rp.lookup(1, 4, 130)
    rp.prefill(1, 130, 170)
    rp.admit(6, 1, 170, "prompt end")
    rp.lookup(3, 4, 130)
    rp.lookup(5, 3, 100)
    assert (rp.dropped, rp.parked) == (1, 0) and store.info(6).filled
    rp.decode(1)
    for r, a, n in ((3, 130, 155), (5, 100, 107)):
        rp.prefill(r, a, n)
        rp.decode(r)
    finish_validated(rp, (1, 3, 5))


def test_flights_let_go_count_off_the_byte_bound(tiny_model, tiny_shape):
    """Three waiting hits of one flight's bytes each, room for two and a half: the oldest parks,
    and the bytes it gave back are counted off, so the second keeps its restore."""
    rp, store = make(tiny_model, tiny_shape, max_open=100)
    first_turn(rp)
    rp.lookup(1, 4, 130)
    one = rp.flights[1].device_bytes()
    rp.lookup(3, 4, 130)
    assert rp.flights[3].device_bytes() == one
    rp.max_open_bytes = 2 * one + one // 2
    rp.lookup(5, 3, 100)  # a restore at 100 of the same layers' states: one flight's bytes too
    assert rp.flights[5].device_bytes() == one
    assert rp.parked == 1 and rp.flights[1].parked and not rp.flights[3].parked


@pytest.mark.parametrize("room", ["one flight", "two flights"])
def test_open_flights_past_their_byte_bound_give_their_states_back(tiny_model, tiny_shape, room):
    """``max_open_bytes`` bounds the device bytes the open flights hold (their restored and
    running states with KV, and token ids), whatever ``max_open`` allows: under continuous
    batching every running request's flight is open. Two waiting hits of one flight's bytes each:
    with room for one, the older gives its restore back (parked) and is restored again and checked
    at its prefill; with room for both, neither does."""
    rp, store = make(tiny_model, tiny_shape, max_open=100)
    first_turn(rp)
    rp.lookup(1, 4, 130)
    st = rp.flights[1].start
    assert st.kv is None  # gated-delta layers only here (KV counted in the matrix's continuous runs)
    assert rp.flights[1].device_bytes() == st.rec.nbytes + st.conv.nbytes  # its ids not uploaded yet
    one = rp.flights[1].device_bytes() + rp.flights[1].ids(tiny_model.device).nbytes
    assert rp.flights[1].device_bytes() == one
    rp.max_open_bytes = one + one // 2 if room == "one flight" else 2 * one
    rp.lookup(3, 4, 130)
    assert rp.parked == (1 if room == "one flight" else 0)
    rp.prefill(1, 130, 170)
    rp.admit(6, 1, 170, "prompt end")
    rp.decode(1)
    rp.prefill(3, 130, 155)
    rp.decode(3)
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and rp.flights == {}
    for r, n in ((1, 170), (3, 155)):
        assert recs[r].restored and recs[r].validated and recs[r].suffix_segments == [(130, n)], r


def test_a_dropped_request_runs_its_prompt_once_and_recomputes_for_a_later_state(tiny_model, tiny_shape):
    rp, store = make(tiny_model, tiny_shape, max_open=1)
    first_turn(rp)
    rp.lookup(1, 4, 130)
    rp.prefill(1, 130, 170)
    rp.admit(6, 1, 170, "prompt end")
    rp.lookup(3, 4, 130)  # request 1 is past its prefill: its prompt runs now, its state is dropped
    assert rp.dropped == 1 and store.info(6).filled
    rp.decode(1)  # nothing left to prefill
    rp.admit(7, 1, 190, "tail")  # needs the state at 170 again: recomputed from scratch, untimed
    rp.prefill(3, 130, 155)
    rp.decode(3)
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == []
    assert recs[1].suffix_segments == [(130, 170)] and recs[1].validated
    assert rp.recomputed_tokens == 170
    for cp, p in ((6, 170), (7, 190)):
        rec, conv = reference_state(tiny_model, REQS[1][0], p)
        assert max(state_error(*store.tensors(cp), rec, conv)) < 1e-4, cp


@pytest.mark.parametrize("corrupt", [False, True])
def test_a_whole_prompt_hit_is_checked(tiny_model, tiny_shape, corrupt):
    rp, store = make(tiny_model, tiny_shape, validate="tolerance")
    first_turn(rp)
    if corrupt:
        rec, _ = store.tensors(3)
        rec[0, 1] *= 1.01  # one head, 1 %: the restored state itself is compared
    rp.lookup(5, 3, 100)  # the whole prompt is cached: nothing to prefill
    rp.prefill(5, 100, 100)
    rp.decode(5)
    r5 = {r.request: r for r in rp.finish()}[5]
    assert r5.restored and r5.validated and r5.suffix_segments == []
    if corrupt:
        assert [(f.kind, f.request, f.checkpoint, f.hit_position) for f in rp.failures] == [("numerics", 5, 3, 100)]
        assert r5.unvalidated == "" and r5.failed
    else:
        assert rp.failures == [] and r5.max_rec_error < 1e-4


def test_every_unchecked_hit_has_a_reason(tiny_model, tiny_shape):
    from sim.cost import default_timing, get_model
    from sim.replay.measure import request_table, summary

    rp, _ = make(tiny_model, tiny_shape, validate_every=2)
    first_turn(rp)
    for r, n in ((1, 170), (3, 155), (5, 100)):
        rp.lookup(r, 4 if r != 5 else 3, 130 if r != 5 else 100)
        rp.prefill(r, 130, n)
        rp.decode(r)
    recs = rp.finish()
    assert [(r.request, r.validated, r.unvalidated) for r in recs if r.hit_tokens] == [
        (1, True, ""),
        (3, False, "validate-every"),
        (5, True, ""),
    ]
    spec = get_model("replay-tiny")
    df = request_table(recs, spec, default_timing("replay-tiny"), tiny_shape.layers)
    s = summary(df, failures=[], store_peak_bytes=0, wall_s=1.0)
    assert (s["hits"], s["hits_validated"], s["hits_unvalidated"]) == (3, 2, {"validate-every": 1})


@pytest.mark.parametrize("Tq, Tk", [(1, 700), (40, 700), (300, 700), (650, 700)])
def test_cpu_suffix_attention_in_blocks_equals_one_masked_call(monkeypatch, Tq, Tk):
    """The CPU's bottom-right causal attention, in query blocks (a long prompt's suffix) or as a
    whole prompt with zero queries ahead (a suffix that is most of it), against SDPA's masked call."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    from sim.replay import model as M

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(T, H, 16, generator=g) for T, H in ((Tq, 4), (Tk, 2), (Tk, 2)))
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.repeat_interleave(2, 1).transpose(0, 1)[None],
        v.repeat_interleave(2, 1).transpose(0, 1)[None],
        attn_mask=causal_lower_right(Tq, Tk),
    )[0].transpose(0, 1)
    monkeypatch.setattr(M, "CPU_SCORE_ELEMENTS", 4 * 700 * 7)  # blocks of 7 queries
    got = M._attend(q, k, v)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)


def test_a_parked_hit_whose_slot_changed_or_left_fails_its_restore(tiny_model, tiny_shape):
    """A parked request is restored again at its prefill: bits that changed while it waited are an
    ``integrity`` failure, a checkpoint that left the store a ``missing`` one (stored position -1),
    as is a lookup of a checkpoint the store never held (mutation survivors of
    ``HitChecker.restore`` / ``restore_again``)."""
    from sim.replay.checks import Failure

    rp, store = make(tiny_model, tiny_shape, max_open=1)
    first_turn(rp)
    rp.lookup(1, 4, 130)
    rp.lookup(3, 4, 130)  # request 1 parked
    assert rp.parked == 1
    store.tensors(4)[0][0, 0].mul_(3.0)
    rp.prefill(1, 130, 170)
    assert rp.failures[0] == Failure("integrity", 1, 4, 130, 130, "restored bits changed while its request waited")
    rp, store = make(tiny_model, tiny_shape, max_open=1)
    first_turn(rp)
    rp.lookup(1, 4, 130)
    rp.lookup(3, 4, 130)
    rp.evict(4)
    rp.prefill(1, 130, 170)
    assert rp.failures == [Failure("missing", 1, 4, -1, 130, "left the store while its request waited")]
    rp.lookup(5, 99, 100)
    assert rp.failures[-1] == Failure("missing", 5, 99, -1, 100, "not in the store")
    assert [r.failed for r in rp.finish() if r.request in (1, 5)] == [True, True]


def test_a_hit_that_fails_its_bookkeeping_check_holds_nothing(tiny_model, tiny_shape):
    """A hit whose prefix hash differs is a failure (its record marked failed) and runs from
    scratch holding no restored state: it parks no waiting flight past ``max_open``, and the
    waiting hit is restored once and checked; mutation survivors of ``HitChecker.fail`` (the
    record's flag) and ``HitChecker.restore`` (True after the hash failure: the failed flight
    held, the waiting one parked twice)."""
    reqs = {**REQS, 9: (np.concatenate([O0, P0]), 100)}  # 130 tokens, not request 0's prefix
    store = CheckpointStore(tiny_shape, torch.float32, device="cpu")
    rp = Replayer(tiny_model, store, lambda r: reqs[r], eager=True, max_open=1)
    first_turn(rp)
    rp.lookup(1, 4, 130)  # restored; waits for a server, the one flight holding tensors
    rp.lookup(9, 4, 130)  # same position, other tokens: the hash check fails
    assert rp.parked == 0
    rp.prefill(1, 130, 170)
    rp.decode(1)
    rp.prefill(9, 0, 100)
    rp.decode(9)
    recs = {r.request: r for r in rp.finish()}
    assert [(f.kind, f.request, f.checkpoint, f.stored_position, f.hit_position) for f in rp.failures] == [
        ("hash", 9, 4, 130, 130)
    ]
    assert rp.parked == 0
    assert recs[9].failed and not recs[9].restored
    assert recs[1].restored and recs[1].validated and not recs[1].failed
