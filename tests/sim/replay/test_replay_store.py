"""The checkpoint store: slots per checkpoint id, reuse, peak bytes, restore copies."""

import pytest

torch = pytest.importorskip("torch")

from sim.replay.store import CheckpointStore, StoreError  # noqa: E402


@pytest.mark.parametrize("where", ["gpu", "host"])
def test_reserve_write_restore_free_and_peak(tiny_model, tiny_shape, where):
    store = CheckpointStore(tiny_shape, torch.float32, where=where, device="cpu")
    st = tiny_model.zero_state()
    st.rec.normal_(generator=torch.Generator().manual_seed(0))
    st.conv.fill_(0.5)
    store.reserve(10, 64, b"h", request=3)
    assert not store.info(10).filled
    with pytest.raises(StoreError):
        store.restore(10)  # not produced yet
    for layer in range(tiny_shape.layers):
        store.write(10, layer, st.rec[layer], st.conv[layer])
    assert store.info(10).filled
    got = store.restore(10)
    assert got.pos == 64 and torch.equal(got.rec, st.rec) and torch.equal(got.conv, st.conv)
    got.rec.zero_()  # a restore is a copy: the slot is untouched
    assert torch.equal(store.tensors(10)[0], st.rec)
    store.reserve(11, 128, b"g")
    store.put(11, st)
    assert store.ids() == {10, 11}
    assert store.peak_bytes == 2 * tiny_shape.state_bytes(torch.float32)
    store.free(10)
    store.reserve(12, 5, b"x")  # reuses the freed slot: the pool does not grow
    assert len(store._rec) == 2 and store.peak_slots == 2
    with pytest.raises(StoreError):
        store.reserve(11, 1, b"")  # double admit
    with pytest.raises(StoreError):
        store.free(99)


def test_slot_bytes_follow_the_shape(tiny_shape):
    s = tiny_shape
    want = s.layers * (s.v_heads * s.head_k_dim * s.head_v_dim * 4 + s.conv_dim * 3 * 2)
    assert CheckpointStore(s, torch.bfloat16).slot_bytes == want
