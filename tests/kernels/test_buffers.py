"""Preallocated outputs and workspace of ``chunk_gated_delta_rule`` (``out``, ``final_state_out``,
``boundary_out``, ``workspace``; ``kernels.workspace_bytes``): the same bits as fresh allocations,
the caller's tensors written and returned as given, one workspace reused across calls of other
sizes, and a one-line ValueError for each kind of wrong buffer. CPU tests run the Triton
interpreter; the GPU test runs the direct launch path (``pytest -m gpu``)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels import workspace_bytes  # noqa: E402
from kernels.chunk_gdn import _PLANS, chunk_gated_delta_rule, prepare_chunk_metadata  # noqa: E402
from test_chunk_gdn import make_inputs, rand_state  # noqa: E402

H, HV, DK, DV = 1, 2, 16, 32  # K != V: a buffer of the wrong one of the two is caught


def _inputs(T, seed=0, device="cpu", dtype=torch.float32):
    return make_inputs(T, h=H, hv=HV, dk=DK, dv=DV, seed=seed, device=device, dtype=dtype)


def _call(x, meta, **kw):
    q, k, v, g, beta = x
    return chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, **kw)


def _buffers(x, meta, device="cpu"):
    q, v = x[0], x[2]
    return dict(
        out=torch.empty(1, q.shape[1], HV, DV, dtype=q.dtype, device=device),
        final_state_out=torch.empty(meta.num_seqs, HV, DK, DV, device=device),
        boundary_out=torch.empty(meta.num_boundaries, HV, DK, DV, device=device),
        workspace=torch.empty(workspace_bytes(q, v, meta), dtype=torch.uint8, device=device),
    )


@pytest.mark.triton_compat  # the caller's buffers and workspace
def test_given_buffers_are_written_and_returned_with_the_same_bits():
    x = _inputs(150, seed=1)
    cu, starts = [0, 70, 150], [0, 30]
    meta = prepare_chunk_metadata(cu, starts)
    h0 = rand_state(2, hv=HV, dk=DK, dv=DV, seed=2)
    fresh = _call(x, meta, initial_state=h0)
    bufs = _buffers(x, meta)
    for b in bufs.values():
        b.fill_(7) if b.dtype != torch.uint8 else b.fill_(255)  # leftovers must not leak through
    got = _call(x, meta, initial_state=h0, **bufs)
    assert got[0] is bufs["out"] and got[1] is bufs["final_state_out"] and got[2] is bufs["boundary_out"]
    for a, b in zip(fresh, got):
        assert torch.equal(a, b)


def test_one_workspace_serves_calls_of_other_sizes():
    big, small = _inputs(200, seed=3), _inputs(70, seed=4)
    m_big, m_small = prepare_chunk_metadata([0, 200]), prepare_chunk_metadata([0, 70])
    need = workspace_bytes(big[0], big[2], m_big)
    assert need > workspace_bytes(small[0], small[2], m_small) > 0
    ws = torch.empty(need, dtype=torch.uint8)
    fresh = {id(m): _call(x, m) for x, m in ((big, m_big), (small, m_small))}  # without a workspace
    for x, m in ((big, m_big), (small, m_small), (big, m_big)):
        for a, b in zip(fresh[id(m)], _call(x, m, workspace=ws)):
            assert torch.equal(a, b)
    # the least workspace works, one byte less is refused
    exact = torch.empty(workspace_bytes(small[0], small[2], m_small), dtype=torch.uint8)
    _call(small, m_small, workspace=exact)
    with pytest.raises(ValueError, match="workspace must be 1-d uint8 with at least"):
        _call(small, m_small, workspace=exact[:-1])


def test_only_some_buffers_given():
    x = _inputs(100, seed=5)
    meta = prepare_chunk_metadata([0, 100])
    fresh = _call(x, meta)
    out = torch.empty(1, 100, HV, DV)
    got = _call(x, meta, out=out)
    assert got[0] is out and all(torch.equal(a, b) for a, b in zip(fresh, got))
    got = _call(x, meta, boundary_states=False, boundary_out=torch.empty(0, HV, DK, DV))  # unused: ignored
    assert got[2] is None and torch.equal(got[1], fresh[1])


def _wrong(x, meta, name):
    bufs = _buffers(x, meta)
    b = bufs[name]
    return {
        "dtype": dict(bufs, **{name: b.to(torch.float64 if b.dtype != torch.uint8 else torch.int8)}),
        # a workspace may be longer than needed: a 2-d one is the wrong shape there
        "shape": dict(
            bufs,
            **{name: b.new_empty(2, b.numel()) if name == "workspace" else b.new_empty(*b.shape[:-1], b.shape[-1] + 1)},
        ),
        "strided": dict(bufs, **{name: b.new_empty(*b.shape[:-1], 2 * b.shape[-1])[..., ::2]}),
        "misaligned": dict(bufs, **{name: b.new_empty(b.numel() + 64).view(-1)[1 : 1 + b.numel()].view(b.shape)}),
    }


@pytest.mark.parametrize("name", ["out", "final_state_out", "boundary_out", "workspace"])
@pytest.mark.parametrize("fault", ["dtype", "shape", "strided", "misaligned"])
def test_a_wrong_buffer_is_one_line(name, fault):
    x = _inputs(100, seed=6)
    meta = prepare_chunk_metadata([0, 100])
    bufs = _wrong(x, meta, name)[fault]
    with pytest.raises(ValueError) as e:
        _call(x, meta, **bufs)
    msg = str(e.value)
    assert name in msg and "\n" not in msg, msg


@pytest.mark.gpu
def test_gpu_direct_path_with_given_buffers_equals_fresh_allocations():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _PLANS.clear()
    dt = torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    x = make_inputs(1000, h=2, hv=4, dk=128, dv=128, seed=7, device="cuda", dtype=dt)
    q, v = x[0], x[2]
    meta = prepare_chunk_metadata([0, 100, 640, 1000], [0, 64, 7], device="cuda")
    h0 = torch.randn(3, 4, 128, 128, device="cuda") * 0.1
    fresh = _call(x, meta, initial_state=h0)  # compiles, remembers the plan
    fresh2 = _call(x, meta, initial_state=h0)  # the direct path
    assert len(_PLANS) == 1
    bufs = dict(
        out=torch.full_like(fresh[0], 3.0),
        final_state_out=torch.full_like(fresh[1], 3.0),
        boundary_out=torch.full_like(fresh[2], 3.0),
        workspace=torch.full((workspace_bytes(q, v, meta) + 4096,), 255, dtype=torch.uint8, device="cuda"),
    )
    for _ in range(2):
        got = _call(x, meta, initial_state=h0, **bufs)
        assert got[0] is bufs["out"] and got[2] is bufs["boundary_out"]
        for a, b, c in zip(fresh, fresh2, got):
            assert torch.equal(a, b) and torch.equal(a, c)
    assert len(_PLANS) == 1  # the given buffers use the same plan
    with pytest.raises(ValueError, match="out must be"):
        _call(x, meta, initial_state=h0, out=bufs["out"].float())
