"""Attention KV in replay: restored from the paged KV store on every hit and checked like the
states (page keys against the prompt's prefix, then the restored keys / values and the suffix's
outputs against a from-scratch prefill). A planted corruption of one KV page, a page shifted by
one token, a block table pointing at the wrong page and a page keyed for another prefix are each
caught. The model here has attention and MLP layers only; the whole tiny preset, gated-delta
layers included, runs in test_replay_whole.py."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.replay.checks import rel_error  # noqa: E402
from sim.replay.model import HybridModel, ReplayShape  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.store import CheckpointStore  # noqa: E402
from sim.replay.tokens import page_keys  # noqa: E402

rng = np.random.default_rng(3)
P0 = rng.integers(0, 10_000, 100)
O0 = rng.integers(0, 10_000, 30)
U1 = rng.integers(0, 10_000, 40)
REQS = {
    0: (np.concatenate([P0, O0]), 100),
    1: (np.concatenate([P0, O0, U1]), 170),
    2: (np.concatenate([P0[:90], U1[:20]]), 110),
}
SHAPE = ReplayShape(
    hidden=32,
    layers=0,
    k_heads=1,
    v_heads=2,
    head_k_dim=16,
    head_v_dim=16,
    vocab_rows=512,
    attn_layers=2,
    attn_heads=4,
    attn_kv_heads=2,
    attn_head_dim=16,
    mlp_inter=48,
)


@pytest.fixture(scope="module")
def model():
    return HybridModel(SHAPE, device="cpu", dtype=torch.float32, seed=11)


def make(model, **kw):
    store = CheckpointStore(SHAPE, torch.float32, device="cpu", page_tokens=16)
    return Replayer(model, store, lambda r: REQS[r], **kw), store


def first_turn(rp):
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 100)
    rp.admit(1, 0, 90, "branch")
    rp.admit(2, 0, 100, "prompt end")
    rp.decode(0)
    rp.admit(3, 0, 130, "tail")


def test_kv_pages_are_shared_freed_and_restored_exactly(model):
    rp, store = make(model)
    first_turn(rp)
    # pages of 16 tokens: [0, 90) is 5 full pages + one of 10; 100 and 130 share the 6 full
    # pages below 96 and add their own partial pages: 96..100, then 96..112, 112..128, 128..130
    assert store.kv_tokens == 96 + 10 + 4 + 16 + 16 + 2
    full, _, _ = model.run(torch.as_tensor(REQS[0][0][:130]), None, 0)
    for cp, p in ((1, 90), (2, 100), (3, 130)):
        # (the first turn ran as two calls, split at 90: equal up to fp32 rounding)
        assert rel_error(store.restore_kv(cp), full.kv[:, :, :p]) < 1e-5
        assert store.page_keys_of(cp) == page_keys(REQS[0][0], p, 16)
    rp.lookup(1, 3, 130)
    rp.decode(1)
    rp.lookup(2, 1, 90)
    rp.decode(2)
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and rp.kv_hits_validated == 2
    assert recs[1].kv_validated and recs[1].max_kv_error < 1e-5 and recs[1].max_out_error < 1e-5
    rp.evict(2)
    rp.evict(3)
    assert store.kv_tokens == 90  # what checkpoint 1 alone still needs
    rp.evict(1)
    assert store.kv_tokens == 0 and store.live_pages == 0


def _corrupt(store, how):
    if how == "value":  # one head of one layer of one page, 1 % off
        store.page(3, 2)[1, 0, :, 1] *= 1.01
    elif how == "shifted":  # a page's tokens shifted by one position
        page = store.page(3, 4)
        page.copy_(torch.roll(page, 1, dims=2))
    elif how == "block-table":  # the block table points at the neighbouring page
        info = store.info(3)
        (k3, s3), (k4, s4) = info.pages[3], info.pages[4]
        info.pages[3], info.pages[4] = (k3, s4), (k4, s3)
    elif how == "key":  # a page keyed for another prefix
        info = store.info(3)
        info.pages[5] = (b"x" * 16, info.pages[5][1])


@pytest.mark.parametrize("validate", ["exact", "tolerance"])
@pytest.mark.parametrize(
    "how, kind",
    [("value", "kv-numerics"), ("shifted", "kv-numerics"), ("block-table", "kv-numerics"), ("key", "kv-hash")],
)
def test_planted_kv_faults_are_caught(model, how, kind, validate):
    """Each fault is caught by the bit-exact check (``--validate exact``) and, the store's
    digests aside, by the numerics check alone (``tolerance``); the page key by bookkeeping."""
    if validate == "exact" and kind == "kv-numerics":
        kind = "kv-integrity"
    rp, store = make(model, validate=validate)
    first_turn(rp)
    _corrupt(store, how)
    rp.lookup(1, 3, 130)
    rp.decode(1)
    rp.finish()
    assert len(rp.failures) == 1
    f = rp.failures[0]
    assert (f.kind, f.request, f.checkpoint, f.hit_position) == (kind, 1, 3, 130)
    assert "request 1, checkpoint 3" in f.message()
