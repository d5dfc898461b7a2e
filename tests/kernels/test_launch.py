"""The direct launch path of ``chunk_gated_delta_rule``: the plan key (CPU) and, on a GPU, that a
plan's direct launches give the very results of Triton's own launch path, also for new lengths and
for inputs whose alignment or strides differ from the plan's (they get a plan of their own)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels import chunk_gdn  # noqa: E402
from kernels.chunk_gdn import chunk_gated_delta_rule, launch_params, prepare_chunk_metadata  # noqa: E402
from kernels.reference import naive_gated_delta_rule  # noqa: E402
from test_chunk_gdn import make_inputs  # noqa: E402


def _key(q, k, v, g, beta, h0=None, hb_dtype=torch.float32):
    lp = launch_params(q.shape[3], v.shape[3], q.dtype)
    return chunk_gdn._plan_key(
        lp, q.device, q.dtype, hb_dtype, q.shape[2], v.shape[2], False, False, q, k, v, g, beta, h0
    )


def test_plan_key_follows_what_triton_specialises_on():
    base = make_inputs(100, h=2, hv=4, dk=32, dv=32)
    assert _key(*base) == _key(*make_inputs(700, h=2, hv=4, dk=32, dv=32, seed=5))  # length: same plan
    q, k, v, g, beta = base
    flat = torch.empty(q.numel() + 1)
    shifted = flat[1:].view_as(q).copy_(q)  # 4 bytes off a 16-byte boundary
    assert shifted.data_ptr() % 16 and _key(shifted, k, v, g, beta) != _key(*base)
    wide = torch.empty(1, 100, 2, 48)[..., :32].copy_(k)  # another token stride
    assert _key(q, wide, v, g, beta) != _key(*base)
    assert _key(q, k, v, g.half(), beta) != _key(*base)
    assert _key(*base, hb_dtype=torch.bfloat16) != _key(*base)
    assert _key(*make_inputs(100, h=2, hv=8, dk=32, dv=32)) != _key(*base)
    h0 = torch.empty(4 * 32 * 32 + 1)[1:].view(1, 4, 32, 32)
    assert _key(*base, h0=h0) != _key(*base)


def test_carve_keeps_every_tensor_aligned():
    offs, n = chunk_gdn._carve([1, 200, 0, 129, 7])
    assert offs == [0, 128, 384, 384, 640] and n == 768
    assert all(o % chunk_gdn._SCRATCH_ALIGN == 0 for o in offs)


# ---- GPU -------------------------------------------------------------------------------------
def _half():
    return torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16


def _call(x, cu=None, starts=None, gate=None, **kw):
    """One call as replay makes it: metadata prepared beforehand (the direct path needs it)."""
    q, k, v, g, beta = x
    meta = prepare_chunk_metadata(cu or [0, q.shape[1]], starts, device="cuda")
    extra = {} if gate is None else dict(A_log=gate[0], dt_bias=gate[1], use_gate_in_kernel=True, use_beta_sigmoid=True)
    return chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, **extra, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gate-in-kernel"])
def test_gpu_direct_launches_equal_triton_launches(gated, monkeypatch):
    chunk_gdn._PLANS.clear()
    dt = _half()
    x = make_inputs(300, h=2, hv=4, dk=128, dv=128, seed=1, device="cuda", dtype=dt)
    gate = (torch.rand(4, device="cuda") + 0.5, torch.randn(4, device="cuda")) if gated else None
    first = _call(x, gate=gate)  # compiles through Triton, remembers the plan
    assert len(chunk_gdn._PLANS) == 1

    def boom(*a, **k):
        raise AssertionError("Triton's launch path was used")

    other = make_inputs(1000, h=2, hv=4, dk=128, dv=128, seed=2, device="cuda", dtype=dt)
    h0 = torch.randn(3, 4, 128, 128, device="cuda") * 0.1
    cu, starts = [0, 100, 640, 1000], [0, 64, 7]
    with monkeypatch.context() as m:
        m.setattr(type(chunk_gdn._solve_kernel), "run", boom)
        direct = _call(x, gate=gate)
        direct_varlen = _call(other, cu, starts, gate=gate, initial_state=h0)
        direct_nostates = _call(other, cu, starts, gate=gate, initial_state=h0, boundary_states=False)
    assert len(chunk_gdn._PLANS) == 1  # boundary output, initial state, lengths: runtime values
    monkeypatch.setattr(chunk_gdn, "_DIRECT", False)
    triton_path = _call(x, gate=gate)
    triton_varlen = _call(other, cu, starts, gate=gate, initial_state=h0)
    triton_nostates = _call(other, cu, starts, gate=gate, initial_state=h0, boundary_states=False)
    for a, b, c in zip(first, direct, triton_path):
        assert torch.equal(a, b) and torch.equal(a, c)
    for a, b in zip(direct_varlen, triton_varlen):
        assert torch.equal(a, b)
    assert direct_nostates[2] is None and triton_nostates[2] is None
    for a, b in zip(direct_nostates[:2], triton_nostates[:2]):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_misaligned_inputs_get_their_own_plan():
    chunk_gdn._PLANS.clear()
    dt = _half()
    q, k, v, g, beta = make_inputs(200, h=2, hv=4, dk=64, dv=64, seed=3, device="cuda", dtype=dt)
    aligned = _call((q, k, v, g, beta))
    flat = torch.empty(q.numel() + 1, device="cuda", dtype=dt)
    q_off = flat[1:].view_as(q).copy_(q)  # 2 bytes off a 16-byte boundary
    shifted = _call((q_off, k, v, g, beta))
    assert len(chunk_gdn._PLANS) == 2
    again = _call((q_off, k, v, g, beta))  # the misaligned plan, launched directly
    ro, rf, _, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    for o in (aligned[0], shifted[0], again[0]):
        assert ((o.float() - ro).norm() / ro.norm()).item() < 2e-2
    assert torch.equal(shifted[0], again[0])


def test_per_call_names_cover_every_buffer_of_the_kernels():
    """A buffer the plan treated as fixed would be launched at the first call's address: every
    pointer argument of the four kernels must be a per-call name, and every per-call name a real
    argument. Scratch aliases (a writer's ``*_out`` and its readers) map to one buffer."""
    scratch = chunk_gdn._scratch_args(*"w u vn A hbuf fd gcum glast".split())
    assert scratch["a_out"] == scratch["a_in"] == "A" and scratch["h_out"] == scratch["h"] == "hbuf"
    names = set().union(*(fn.arg_names for fn in chunk_gdn._KERNELS))
    pointers = set(scratch) | {"q", "k", "v", "g", "beta", "A_log", "dt_bias", "o", "h0", "ht", "hb"}
    pointers |= {"chunk_info", "seq_info", "store_slot"}
    assert pointers <= names
    assert chunk_gdn._PER_CALL == pointers | {"scale", "l2norm", "has_h0", "store_b"}
    meta = prepare_chunk_metadata([0, 10])
    args = chunk_gdn._call_args(tuple("qkvgb"), ("a", "d"), tuple("wuvAhfcl"), tuple("o0th"), meta, 1, 1, 0, 1)
    assert set(args) == chunk_gdn._PER_CALL  # both launch paths fill exactly the per-call names
    # what a plan fixes: strides and head counts (in its key), compile-time constants
    strides = {f"s{x}{d}" for x in "qkvgb" for d in "th"}
    assert names - chunk_gdn._PER_CALL == strides | {"HV", "GROUP"} | {
        "K",
        "V",
        "BK",
        "BKS",
        "BVF",
        "BC",
        "BV",
        "USE_GATE",
        "BETA_SIGMOID",
        "PREC",
        "WHILE_LOOP",
        "VFAST",
    }
    assert len(chunk_gdn._KERNELS) == len(chunk_gdn._KERNEL_KEYS) == 4
