"""The replayer on hand-written event streams: states produced where admitted (exact and
64-aligned, prompt end, tail, late), every hit checked, and both checks shown to fail: a planted
corruption of one stored state and a hit position shifted by one token are caught and reported
with request id, checkpoint id and both positions."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.replay.checks import state_error  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.store import CheckpointStore  # noqa: E402

rng = np.random.default_rng(5)
P0 = rng.integers(0, 10_000, 100)
O0 = rng.integers(0, 10_000, 30)
U1 = rng.integers(0, 10_000, 40)
O1 = rng.integers(0, 10_000, 20)
REQS = {
    0: (np.concatenate([P0, O0]), 100),
    1: (np.concatenate([P0, O0, U1, O1]), 170),
    2: (np.concatenate([P0[:80], U1[:30], O1[:5]]), 110),
}


def make(model, shape, **kw):
    store = CheckpointStore(shape, torch.float32, device="cpu")
    return Replayer(model, store, lambda r: REQS[r], **kw), store


def first_turn(rp):
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 100)
    rp.admit(1, 0, 64, "chunk")
    rp.admit(2, 0, 90, "branch")  # exact: splits the prefill call at 90
    rp.admit(3, 0, 100, "prompt end")
    rp.decode(0)
    rp.admit(4, 0, 130, "tail")


def reference_state(model, tokens, p):
    got = {}
    model.run(torch.as_tensor(tokens[:p]), None, 0, [p], lambda q, layer, r, c: got.__setitem__(layer, (r, c)))
    L = model.shape.layers
    return torch.stack([got[i][0] for i in range(L)]), torch.stack([got[i][1] for i in range(L)])


def test_states_are_produced_where_admitted_and_hits_validate(tiny_model, tiny_shape):
    rp, store = make(tiny_model, tiny_shape)
    first_turn(rp)
    rp.admit(5, 0, 50, "late")  # the prompt already ran past 50: recomputed
    rp.lookup(1, 4, 130)
    rp.prefill(1, 130, 170)
    rp.admit(6, 1, 170, "prompt end")
    rp.evict(1)
    rp.decode(1)
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == []
    assert store.ids() == {2, 3, 4, 5, 6}
    assert rp.late_admits == 1
    for cp, p, r in ((2, 90, 0), (3, 100, 0), (4, 130, 0), (5, 50, 0), (6, 170, 1)):
        rec, conv = reference_state(tiny_model, REQS[r][0], p)
        got_r, got_c = store.tensors(cp)
        e = state_error(got_r, got_c, rec, conv)
        assert max(e) < 1e-4, (cp, e)
        assert store.info(cp).position == p
    r1 = recs[1]
    assert r1.restored and r1.validated and not r1.failed and r1.hit_tokens == 130
    assert 0 < max(r1.max_rec_error, r1.max_out_error) < 1e-4
    assert r1.suffix_segments == [(130, 170)] and r1.full_segments == [(0, 170)]
    # request 0: one split at 90, the boundary at 64 came from the kernel
    assert recs[0].suffix_segments == [(0, 90), (90, 100)]
    assert recs[0].full_ms == recs[0].suffix_ms > 0


def test_aligned_hit_compares_the_restored_state_itself(tiny_model, tiny_shape):
    rp, store = make(tiny_model, tiny_shape)
    first_turn(rp)
    rp.lookup(2, 1, 64)
    rp.decode(2)
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and recs[2].validated
    # evicting a checkpoint that is still to be produced drops it from the work
    rp2, store2 = make(tiny_model, tiny_shape)
    rp2.lookup(0, None, 0)
    rp2.admit(1, 0, 64)
    rp2.evict(1)
    rp2.decode(0)
    rp2.finish()
    assert store2.ids() == set() and rp2.pending == {}


@pytest.mark.parametrize("validate, kind", [("exact", "integrity"), ("tolerance", "numerics")])
def test_planted_corruption_is_caught(tiny_model, tiny_shape, validate, kind):
    rp, store = make(tiny_model, tiny_shape, validate=validate)
    first_turn(rp)
    assert store.info(4).filled  # the tail state was produced when admitted
    rec, _ = store.tensors(4)
    rec[1, 0] *= 1.01  # one head of one layer of one stored state, off by 1 %
    rp.lookup(1, 4, 130)
    rp.decode(1)
    rp.finish()
    assert len(rp.failures) == 1
    f = rp.failures[0]
    assert (f.kind, f.request, f.checkpoint, f.stored_position, f.hit_position) == (kind, 1, 4, 130, 130)
    if validate == "exact":  # the layer and head are named
        assert "layer 1 head 0" in f.detail
    assert "request 1, checkpoint 4" in f.message()


@pytest.mark.parametrize("check_hash", [True, False])
def test_hit_shifted_by_one_token_is_caught(tiny_model, tiny_shape, check_hash):
    rp, store = make(tiny_model, tiny_shape, check_hash=check_hash)
    first_turn(rp)
    rp.lookup(1, 4, 131)  # the simulator claims one token more than stored
    rp.decode(1)
    rp.finish()
    assert len(rp.failures) == 1
    f = rp.failures[0]
    assert (f.request, f.checkpoint, f.hit_position) == (1, 4, 131)
    if check_hash:
        assert f.kind == "hash" and f.stored_position == 130
    else:  # numerics alone also see it
        assert f.kind == "numerics"
