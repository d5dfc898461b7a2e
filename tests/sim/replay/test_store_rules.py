"""The replay KV store and its validation (sim/replay/tokens.py, checks.py, store.py, runner.py) at
their edges (issue 44): KV page keys and the digests on their own; every validation mode combined
with ``validate_every``, batched replay and the store's placement, with a fault planted in a state
or a KV page on a hit that is and one that is not validated; the restorable-slot rule for states
and KV alike; page sharing and reuse. CPU, plain-torch gated delta, a few short requests."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.replay.checks import VALIDATE_MODES, digest, rel_error, state_error  # noqa: E402
from sim.replay.model import HybridModel, ReplayShape, StackState  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.store import CheckpointStore, StoreError  # noqa: E402
from sim.replay.tokens import block_tokens_for, page_keys, prefix_hash, request_tokens  # noqa: E402

SHAPE = ReplayShape(
    hidden=32,
    layers=2,
    k_heads=1,
    v_heads=2,
    head_k_dim=16,
    head_v_dim=16,
    conv_width=4,
    vocab_rows=512,
    attn_layers=1,
    attn_heads=2,
    attn_kv_heads=1,
    attn_head_dim=16,
    mlp_inter=48,
)


# ------------------------------------------------------------------------------ page keys


T = np.arange(1000, 1300, dtype=np.int64)


@pytest.mark.parametrize("p,pages", [(0, 0), (1, 1), (63, 1), (64, 1), (65, 2), (128, 2), (129, 3), (300, 5)])
def test_page_keys_cover_the_prefix_in_pages(p, pages):
    keys = page_keys(T, p, 64)
    assert len(keys) == pages and all(len(k) == 16 for k in keys)
    assert len(set(keys)) == pages


def test_page_keys_are_chained_digests_of_the_prefix():
    full, part = page_keys(T, 200, 64), page_keys(T, 130, 64)
    assert full[:2] == part[:2]  # the whole pages of a shorter prefix are the same pages
    assert full[2] != part[2]  # a partial last page keys its length (2 tokens, not 64)
    assert page_keys(T, 129, 64)[2] != page_keys(T, 130, 64)[2]
    # a change in page 1 changes that page's key and every later one, never an earlier one
    u = T.copy()
    u[100] += 1
    ku = page_keys(u, 200, 64)
    assert ku[0] == full[0] and all(a != b for a, b in zip(ku[1:], full[1:]))
    # the chain: the same page content after another first page is another page
    v = T.copy()
    v[0] += 1
    assert page_keys(v, 200, 64)[1] != full[1]
    # another page size is another key set; int32 input is keyed as int64
    assert page_keys(T, 128, 32)[1] != page_keys(T, 128, 64)[0]
    assert page_keys(T.astype(np.int32), 200, 64) == full
    # keys stop at p, whatever follows it
    w = T.copy()
    w[150:] = 0
    assert page_keys(w, 150, 64) == page_keys(T, 150, 64)


def test_prefix_hash_digests_exactly_the_first_p_tokens():
    assert len(prefix_hash(T, 10)) == 16
    assert prefix_hash(T, 10) == prefix_hash(np.concatenate([T[:10], [7, 7]]), 10)
    assert prefix_hash(T, 10) != prefix_hash(T, 11) != prefix_hash(T, 9)
    assert prefix_hash(T, 0) == prefix_hash(np.array([5]), 0)
    assert prefix_hash(T.astype(np.int32), 50) == prefix_hash(T, 50)


def test_hash_block_tokens_depend_on_seed_and_symbol_only():
    a = block_tokens_for(np.array([5, 9, 5]), 16, seed=1, vocab=1000)
    assert a.shape == (48,) and a.min() >= 0 and a.max() < 1000
    assert np.array_equal(a[:16], a[32:])  # equal hashes, equal tokens, wherever they sit
    assert not np.array_equal(a[:16], a[16:32])
    assert len(set(a[:16].tolist())) > 8  # the tokens of one block differ from each other
    assert not np.array_equal(a, block_tokens_for(np.array([5, 9, 5]), 16, seed=2, vocab=1000))
    assert np.array_equal(block_tokens_for(np.array([9]), 16, 1, 1000), a[16:32])
    big = block_tokens_for(np.array([2**62, -1]), 4, seed=0, vocab=1 << 17)
    assert big.min() >= 0 and big.max() < 1 << 17


def test_request_tokens_cut_partial_blocks_and_pass_token_traces_through():
    toks = request_tokens([3, 4], [8], block_tokens=16, input_len=20, output_len=5, seed=0)
    full = block_tokens_for(np.array([3, 4]), 16, 0, 1 << 17)
    assert toks.shape == (25,) and np.array_equal(toks[:20], full[:20])
    assert np.array_equal(toks[20:], block_tokens_for(np.array([8]), 16, 0, 1 << 17)[:5])
    # a partial block is a prefix of the full block: a longer prompt over the same hashes extends it
    longer = request_tokens([3, 4], [], block_tokens=16, input_len=32, output_len=0, seed=0)
    assert np.array_equal(longer[:20], toks[:20])
    same = request_tokens([1, 2, 3], [4, 5], block_tokens=1, input_len=3, output_len=2)
    assert same.tolist() == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------------------ digests


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.bfloat16, torch.float32, torch.float64])
def test_digest_rows_and_single_changes(dtype):
    t = (torch.arange(2 * 3 * 5) % 7).to(dtype).reshape(2, 3, 5)
    d2 = digest(t, 2)
    assert d2.shape == (2, 3) and d2.dtype == torch.int64
    assert digest(t, 0).shape == () and digest(t, 1).shape == (2,)
    for idx in ((0, 0, 0), (1, 2, 4), (0, 1, 3)):
        u = t.clone()
        u[idx] += 1
        changed = (digest(u, 2) != d2).nonzero().tolist()
        assert changed == [list(idx[:2])]
    # two changes that swap values within a row are seen (position-weighted)
    u = t.clone()
    u[0, 0, 0], u[0, 0, 1] = t[0, 0, 1], t[0, 0, 0]
    if not torch.equal(u, t):
        assert digest(u, 2)[0, 0] != d2[0, 0]
    assert torch.equal(digest(t[:, :, :0].contiguous(), 2), torch.zeros(2, 3, dtype=torch.int64))
    assert torch.equal(digest(t.transpose(0, 1), 0), digest(t.transpose(0, 1).contiguous(), 0))


def test_digest_sees_bits_not_values():
    z = torch.zeros(4)
    n = z.clone()
    n[2] = -0.0
    assert digest(z, 0) != digest(n, 0)
    assert digest(torch.full((3,), float("nan")), 0) == digest(torch.full((3,), float("nan")), 0)


def test_rel_error_is_row_wise_and_guards_zero_rows():
    b = torch.tensor([[1.0, 0.0], [0.0, 100.0]])
    a = b.clone()
    a[0, 0] = 1.1  # 10 % of a small row: not diluted by the large one
    assert rel_error(a, b) == pytest.approx(0.1)
    zero = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    near = zero.clone()
    near[0, 1] = 1e-6  # a change of a zero row is measured against the largest row (norm 5)
    assert rel_error(near, zero) == pytest.approx(2e-7)
    assert rel_error(torch.empty(0, 3), torch.empty(0, 3)) == 0.0
    with pytest.raises(ValueError, match="shape mismatch"):
        rel_error(torch.zeros(2), torch.zeros(3))
    rec = torch.ones(2, 2, 3, 3)
    conv = torch.ones(2, 5, 3)
    r2, c2 = rec.clone(), conv.clone()
    r2[1, 1] *= 1.5
    c2[0] *= 1.25
    assert state_error(r2, c2, rec, conv) == pytest.approx((0.5, 0.25))


# ------------------------------------------------------------------------------ the store on its own


def stack(seed: int, pos: int) -> StackState:
    g = torch.Generator().manual_seed(seed)
    rec = torch.randn(SHAPE.layers, SHAPE.v_heads, SHAPE.head_k_dim, SHAPE.head_v_dim, generator=g)
    conv = torch.randn(SHAPE.layers, SHAPE.conv_dim, SHAPE.conv_width - 1, generator=g)
    kv = torch.randn(SHAPE.attn_layers, 2, pos, SHAPE.attn_kv_heads, SHAPE.attn_head_dim, generator=g)
    return StackState(pos, rec, conv, kv)


def filled(store, cp, pos, seed, tokens=T):
    st = stack(seed, pos)
    store.reserve(cp, pos, prefix_hash(tokens, pos))
    store.put(cp, st)
    store.put_kv(cp, page_keys(tokens, pos, store.page_tokens), st.kv)
    return st


@pytest.mark.parametrize("where", ["gpu", "host"])
def test_a_slot_is_restorable_only_with_every_layer_and_its_kv(where):
    store = CheckpointStore(SHAPE, torch.float32, where=where, page_tokens=16, digests=True)
    st = stack(0, 40)
    store.reserve(1, 40, b"h")
    store.write(1, 0, st.rec[0], st.conv[0])
    assert not store.info(1).filled and store.unwritten(1) == [1]
    store.write(1, 1, st.rec[1], st.conv[1])
    assert not store.info(1).filled and store.unwritten(1) == []  # states complete, KV not yet
    with pytest.raises(StoreError, match="restored before its state was produced"):
        store.restore(1)
    assert store.verify(1, st)[-1] == "KV never written"
    store.put_kv(1, page_keys(T, 40, 16), st.kv)
    assert store.info(1).filled
    got = store.restore(1)
    assert torch.equal(got.rec, st.rec) and torch.equal(got.conv, st.conv) and torch.equal(got.kv, st.kv)
    assert store.verify(1, got) == []
    with pytest.raises(StoreError, match="written twice"):
        store.put_kv(1, page_keys(T, 40, 16), st.kv)
    # KV first, states second: the same rule
    store.reserve(2, 40, b"h")
    store.put_kv(2, page_keys(T, 40, 16), st.kv)
    assert not store.info(2).filled
    store.put(2, st)
    assert store.info(2).filled


def test_a_store_without_attention_needs_states_only():
    shape = ReplayShape(
        hidden=32, layers=2, k_heads=1, v_heads=2, head_k_dim=16, head_v_dim=16, conv_width=4, vocab_rows=512
    )
    store = CheckpointStore(shape, torch.float32, page_tokens=16)
    g = torch.Generator().manual_seed(1)
    rec = torch.randn(2, 2, 16, 16, generator=g)
    conv = torch.randn(2, shape.conv_dim, 3, generator=g)
    store.reserve(1, 30, b"h")
    store.put(1, StackState(30, rec, conv, None))
    assert store.info(1).filled and store.restore_kv(1) is None and store.restore(1).kv is None
    store.put_kv(1, page_keys(T, 30, 16), None)  # nothing to hold
    assert store.live_pages == 0 and store.peak_bytes == store.slot_bytes


def test_verify_names_each_bad_head_conv_and_page():
    store = CheckpointStore(SHAPE, torch.float32, page_tokens=16, digests=True)
    filled(store, 1, 40, seed=3)
    got = store.restore(1)
    got.rec[1, 0, 2, 3] += 1e-6
    got.conv[0, 5, 1] *= -1
    got.kv[0, 1, 33, 0, 4] += 1  # token 33: page 2 (tokens 32-39)
    assert store.verify(1, got) == ["layer 1 head 0", "layer 0 conv", "KV page 2"]
    with pytest.raises(StoreError, match="digests=True"):
        CheckpointStore(SHAPE, torch.float32).verify(1, got)


def test_pages_are_shared_by_prefix_and_freed_with_their_last_holder():
    store = CheckpointStore(SHAPE, torch.float32, page_tokens=16, digests=True)
    a = filled(store, 1, 40, seed=1)  # pages [0,16) [16,32) [32,40)
    # the same tokens to 50: its first two pages are the same pages (shared, not copied); the
    # third is another page (it ends at 48, not 40)
    filled(store, 2, 50, seed=2)
    assert store.page_keys_of(2)[:2] == store.page_keys_of(1)[:2]
    assert [s for _, s in store.info(2).pages][:2] == [s for _, s in store.info(1).pages][:2]
    assert store.live_pages == 3 + 2 and store.kv_tokens == 40 + 16 + 2
    # a shared page keeps the first writer's bits: checkpoint 2 restores 1's KV for tokens 0-31
    assert torch.equal(store.restore_kv(2)[:, :, :32], a.kv[:, :, :32])
    store.free(1)
    assert store.live_pages == 4 and store.kv_tokens == 16 + 16 + 16 + 2
    store.free(2)
    assert store.live_pages == 0 and store.kv_tokens == 0 and len(store) == 0
    assert store.peak_pages == 5
    assert store.peak_bytes == 2 * store.slot_bytes + 5 * store.page_bytes
    # freed slots and pages are reused: no growth
    filled(store, 3, 40, seed=4)
    assert len(store._rec) == 2 and store.pool_pages == 16
    with pytest.raises(StoreError, match="not in the store"):
        store.free(1)
    with pytest.raises(StoreError, match="not in the store"):
        store.info(1)


def test_a_growing_page_pool_keeps_every_page():
    store = CheckpointStore(SHAPE, torch.float32, page_tokens=4, digests=True)
    states = {
        cp: filled(store, cp, 10 + 7 * cp, seed=cp, tokens=np.arange(cp * 1000, cp * 1000 + 200)) for cp in range(6)
    }
    assert store.pool_pages > 16 and len(store._chunks) > 1  # grown at least once
    for cp, st in states.items():
        got = store.restore(cp)
        assert torch.equal(got.kv, st.kv) and store.verify(cp, got) == []


def test_a_partial_last_page_restores_only_the_prefix():
    store = CheckpointStore(SHAPE, torch.float32, page_tokens=16)
    st = filled(store, 1, 17, seed=5)
    kv = store.restore_kv(1)
    assert kv.shape[2] == 17 and torch.equal(kv, st.kv)
    store.reserve(2, 0, b"")
    store.put(2, st)
    store.put_kv(2, [], st.kv[:, :, :0])
    assert store.restore_kv(2).shape[2] == 0 and store.info(2).filled


# ------------------------------------------------------------------------------ validation matrix


rng = np.random.default_rng(44)
P = rng.integers(0, 10_000, 40)
REQS = {0: (np.concatenate([P, rng.integers(0, 10_000, 10)]), 40)}
for r in range(1, 5):
    REQS[r] = (np.concatenate([P, rng.integers(0, 10_000, 8), rng.integers(0, 10_000, 2)]), 48)
# request r hits checkpoint HIT[r]: 1 (24 tokens: pages 0-15, 16-23) or 2 (the prompt end, 40)
HIT = {1: (2, 40), 2: (1, 24), 3: (2, 40), 4: (1, 24)}


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)  # tiny ops: threads only add overhead on busy cores
    return HybridModel(SHAPE, device="cpu", dtype=torch.float32, seed=3, kernel="torch")


def replay(model, mode, every, batch, where, fault=None):
    """A sequential stream: request 0 admits checkpoints 1 (24), 2 (40), 3 (50); requests 1-4 hit
    2, 1, 2, 1. ``fault``: (request, part) plants a fault in the checkpoint that request hits, right
    before its lookup (its last hit on that checkpoint): ``state`` scales one head of one layer by
    3, ``kv`` one token of page 1 by 3."""
    store = CheckpointStore(SHAPE, model.dtype, where=where, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], validate=mode, validate_every=every, batch=batch, eager=False)
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 40)
    rp.decode(0)
    for cp, p in ((1, 24), (2, 40), (3, 50)):
        rp.admit(cp, 0, p, "")
    for r in range(1, 5):
        cp, p = HIT[r]
        if fault is not None and fault[0] == r:
            if rp.batched is not None:  # the checkpoint's producer has run (a queued one runs first)
                rp.batched.flush("test")
            if fault[1] == "state":
                store.tensors(cp)[0][1, 0].mul_(3.0)
            else:
                store.page(cp, 1)[0, 0, 3].mul_(3.0)
        rp.lookup(r, cp, p)
        rp.prefill(r, p, 48)
        rp.decode(r)
    rp.finish()
    return rp


def validated(i: int, every: int) -> bool:
    """Whether the i-th hit (1-based) is checked: every ``every``-th, starting with the first."""
    return (i - 1) % every == 0


MATRIX = [
    (mode, every, batch, where)
    for mode in VALIDATE_MODES
    for every, batch, where in ((1, 1, "gpu"), (2, 2, "host"), (3, 3, "gpu"))
]


@pytest.mark.parametrize("mode,every,batch,where", MATRIX)
def test_every_validation_mode_with_every_option_that_touches_it(model, mode, every, batch, where):
    clean = replay(model, mode, every, batch, where)
    assert clean.failures == []
    recs = clean.records
    checked = [r for r in range(1, 5) if validated(r, every)]
    assert [r for r in range(1, 5) if recs[r].validated] == checked
    assert all(recs[r].restored for r in range(1, 5))
    assert clean.integrity_checked == (len(checked) if mode != "tolerance" else 0)
    assert [r for r in range(1, 5) if recs[r].integrity_checked] == (checked if mode != "tolerance" else [])
    assert [r for r in range(1, 5) if recs[r].kv_validated] == checked
    calls = [(c.kind, c.segments) for c in clean.batch_log]
    if batch == 1:
        assert calls == [] and recs[0].suffix_ms == recs[0].suffix_ms  # timed per request
    else:
        # request 0 hands over a state at 24 (off a kernel boundary): it runs alone, timed; the
        # four hits run in batches of at most ``batch``; the checked hits' references are batched
        assert calls[0] == ("single", [(0, 24), (24, 40)])
        suffix = [segs for kind, segs in calls if kind == "suffix"]
        assert sum(len(x) for x in suffix) == 4 and max(len(x) for x in suffix) <= batch
        assert sum(len(segs) for kind, segs in calls if kind == "reference") == len(checked)
    # hit 3 is checked with every 1 and 2, hit 4 with every 1 and 3
    for request, part in ((3, "state"), (4, "kv")):
        rp = replay(model, mode, every, batch, where, fault=(request, part))
        got = [(f.kind, f.request) for f in rp.failures]
        if not validated(request, every):
            assert got == [], (request, part)
            continue
        if mode == "tolerance":
            want = "kv-numerics" if part == "kv" else "numerics"
        else:
            want = "kv-integrity" if part == "kv" else "integrity"
        assert got == [(want, request)], (request, part)


def test_exact_validation_refuses_a_store_that_did_not_digest_from_its_first_write(model):
    store = CheckpointStore(SHAPE, model.dtype, page_tokens=16)
    store.reserve(1, 10, b"")
    with pytest.raises(ValueError, match="digests from its first write"):
        Replayer(model, store, lambda r: REQS[r], validate="exact")
    Replayer(model, store, lambda r: REQS[r], validate="tolerance")  # numerics need no digests
    for bad in (dict(validate_every=0), dict(batch=0), dict(batch_tokens=0), dict(validate="bits")):
        with pytest.raises(ValueError):
            Replayer(model, CheckpointStore(SHAPE, model.dtype), lambda r: REQS[r], **bad)


def test_a_hit_whose_pages_are_keyed_for_other_tokens_is_a_kv_hash_failure(model):
    """Same position, same state prefix hash, KV pages of other tokens: ``kv-hash`` (bookkeeping,
    every mode, every hit, validated or not)."""
    for mode in VALIDATE_MODES:
        store = CheckpointStore(SHAPE, model.dtype, page_tokens=16)
        rp = Replayer(model, store, lambda r: REQS[r], validate=mode, validate_every=7, eager=False)
        rp.lookup(0, None, 0)
        rp.prefill(0, 0, 40)
        rp.decode(0)
        rp.admit(1, 0, 24, "")
        rp.lookup(1, None, 0)  # request 0's states are produced now
        info = store.info(1)
        key, slot = info.pages[1]
        info.pages[1] = (bytes(16), slot)
        store._pages[bytes(16)] = store._pages.pop(key)
        rp.lookup(2, 1, 24)
        rp.finish()
        assert [(f.kind, f.request, f.checkpoint) for f in rp.failures] == [("kv-hash", 2, 1)], mode


def test_a_state_admitted_where_the_request_stands_is_stored_with_its_kv(model):
    """A DES stream (eager): request 0's prompt runs at its decode (to 40), then the simulator
    admits the prompt-end state at 40, where the request stands: the store takes the running state
    and its KV at once, and a hit on it restores and checks both."""
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], validate="exact")
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 40)
    rp.decode(0)
    rp.admit(1, 0, 40, "prompt end")
    assert store.info(1).filled and store.info(1).kv_written
    rp.lookup(1, 1, 40)
    rp.prefill(1, 40, 48)
    rp.decode(1)
    rp.finish()
    assert rp.failures == [] and rp.records[1].kv_validated and rp.records[1].integrity_checked


def test_queued_checks_run_when_their_tokens_fill_a_batch():
    """Batched replay with a 100-token budget: the checks of the hits (48 tokens each) run as soon
    as their tokens reach the budget, in batches of at most 100 tokens, not all at the end."""
    m = HybridModel(SHAPE, device="cpu", dtype=torch.float32, seed=3, kernel="torch")
    store = CheckpointStore(SHAPE, m.dtype, device="cpu", page_tokens=16)
    rp = Replayer(m, store, lambda r: REQS[r], batch=2, batch_tokens=100, eager=False)
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 40)
    rp.decode(0)
    for cp, p in ((1, 24), (2, 40)):
        rp.admit(cp, 0, p, "")
    for r in range(1, 5):
        cp, p = HIT[r]
        rp.lookup(r, cp, p)
        rp.prefill(r, p, 48)
        rp.decode(r)
    rp.finish()
    refs = [c.segments for c in rp.batch_log if c.kind == "reference"]
    assert rp.failures == [] and sum(len(x) for x in refs) == 4
    assert all(sum(e - s for s, e in x) <= 100 for x in refs) and len(refs) == 2
