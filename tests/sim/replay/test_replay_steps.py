"""``--scheduler continuous`` replay (sim/replay/stepper.py, sim/replay/steps.py): the batched
forward of one engine step equals per-sequence forwards (outputs, end states, KV); a continuous
replay of a small chat trace executes every step, validates every hit and reports step times; a
preemption replays and finishes; the step rows and their modelled-vs-measured errors."""

import pytest

torch = pytest.importorskip("torch")

from sim.cost import get_model  # noqa: E402
from sim.replay.checks import rel_error  # noqa: E402
from sim.replay.model import HybridModel, ReplayShape  # noqa: E402


@pytest.fixture(scope="module")
def whole_tiny():
    """replay-tiny at its full depth: attention (grouped heads), gated delta and MLP layers."""
    return HybridModel(ReplayShape.from_spec(get_model("replay-tiny")), device="cpu", dtype=torch.float32, seed=3)


def test_batched_forward_equals_per_segment_forwards(whole_tiny):
    m = whole_tiny
    g = torch.Generator().manual_seed(0)
    # four sequences: a chunk from scratch [0, 150), a chunk [100, 230) after a 100-token prefix
    # (ragged first chunk), and two decode tokens at contexts 64 and 301 (one on a chunk boundary)
    specs = [(0, 150), (100, 130), (64, 1), (301, 1)]
    prefixes, starts_state = [], []
    for p, _ in specs:
        toks = torch.randint(0, 10_000, (p + 200,), generator=g)
        st = m.run(toks[:p], None, 0)[0] if p else None
        prefixes.append(toks)
        starts_state.append(st)
    ref_x, ref_states, ref_outs = [], [], []
    for (p, n), toks, st in zip(specs, prefixes, starts_state):
        x, fin, outs = m.forward_segment(m.embed(toks[p : p + n]), st, p, [], keep_outputs=True)
        ref_x.append(x)
        ref_states.append(fin)
        ref_outs.append(outs)
    cu = [0]
    for _, n in specs:
        cu.append(cu[-1] + n)
    tokens = torch.cat([toks[p : p + n] for (p, n), toks in zip(specs, prefixes)])
    zero = m.zero_state()
    rec0 = torch.stack([(st or zero).rec for st in starts_state], dim=1)  # [L, N, Hv, K, V]
    conv0 = torch.stack([(st or zero).conv for st in starts_state], dim=1)
    kv = [None if st is None else st.kv for st in starts_state]
    before = [None if k is None else k.clone() for k in kv]
    out = m.forward_batch(tokens, cu, [p for p, _ in specs], rec0, conv0, kv, keep_outputs=True)
    for i, ((p, n), ref) in enumerate(zip(specs, ref_states)):
        a, b = cu[i], cu[i + 1]
        assert rel_error(out.x[a:b], ref_x[i]) < 1e-5
        for lo, lr in zip(out.outs, ref_outs[i]):
            assert rel_error(lo[a:b], lr) < 1e-5
        st = out.state(i, p + n)
        assert rel_error(st.rec, ref.rec) < 1e-5 and rel_error(st.conv, ref.conv) < 1e-5
        assert st.kv.shape == ref.kv.shape and rel_error(st.kv, ref.kv) < 1e-5
        if before[i] is not None:  # a prefix without room is copied, never written in place
            assert torch.equal(kv[i], before[i])


def test_batched_forward_writes_a_buffer_with_room_in_place(whole_tiny):
    m = whole_tiny
    toks = torch.arange(90)
    st = m.run(toks[:80], None, 0)[0]
    buf = torch.zeros(st.kv.shape[0], 2, 100, *st.kv.shape[3:])
    buf[:, :, :80] = st.kv
    out = m.forward_batch(toks[80:90], [0, 10], [80], st.rec[:, None], st.conv[:, None], [buf])
    ref = m.run(toks[:90], None, 0)[0]
    assert out.kv[0].data_ptr() == buf.data_ptr() and rel_error(buf[:, :, :90], ref.kv) < 1e-5


def test_batched_forward_refuses_empty_sequences(whole_tiny):
    with pytest.raises(ValueError):
        whole_tiny.forward_batch(torch.arange(3), [0, 3, 3], [0, 5])
