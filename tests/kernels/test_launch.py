"""The direct launch path of ``chunk_gated_delta_rule``: the plan key (CPU) and, on a GPU, that a
plan's direct launches give the very results of Triton's own launch path, also for new lengths and
for inputs whose alignment or strides differ from the plan's (they get a plan of their own)."""

import functools
import inspect
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.triton_compat  # `make test` runs this module on the newest Triton too

from kernels import chunk_gdn, chunk_launch, chunk_plan  # noqa: E402
from kernels.chunk_gdn import chunk_gated_delta_rule, launch_params, prepare_chunk_metadata  # noqa: E402
from kernels.reference import naive_gated_delta_rule  # noqa: E402
from test_chunk_gdn import make_inputs  # noqa: E402


def _key(q, k, v, g, beta, h0=None, hb_dtype=torch.float32):
    lp = launch_params(q.shape[3], v.shape[3], q.dtype)
    ptrs = chunk_gdn._addresses(q, k, v, g, beta, h0)
    return chunk_launch._plan_key(
        lp, q.device, q.dtype, hb_dtype, q.shape[2], v.shape[2], False, False, q, k, v, g, beta, ptrs
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


def test_plan_key_of_the_general_path_equals_the_direct_paths():
    """The general path remembers a plan under the key of the fp32 gate parameters it converted
    (``A_log.float().contiguous()``); the direct path looks it up with the caller's own tensors:
    for the fp32 contiguous parameters the direct path takes, the two keys must agree."""
    q, k, v, g, beta = make_inputs(100, h=2, hv=4, dk=32, dv=32)
    lp = launch_params(32, 32, q.dtype)
    h0 = torch.empty(4 * 32 * 32 + 1)[1:].view(1, 4, 32, 32)  # misaligned: its own key bit
    a_log, dt_bias = torch.rand(4), torch.randn(4)
    for state, gate in ((None, (None, None)), (h0, (a_log, dt_bias))):
        args = (lp, q.device, q.dtype, torch.float32, 2, 4, gate[0] is not None, True, q, k, v, g, beta)
        converted = tuple(None if t is None else t.float().contiguous() for t in gate)
        general = chunk_launch._plan_key(*args, chunk_gdn._addresses(q, k, v, g, beta, state, *converted))
        direct = chunk_launch._plan_key(*args, chunk_gdn._addresses(q, k, v, g, beta, state, *gate))
        assert general == direct


def test_carve_keeps_every_tensor_aligned():
    offs, n = chunk_gdn._carve([1, 400, 0, 257, 7])
    assert offs == [0, 256, 768, 768, 1280] and n == 1536
    assert all(o % chunk_gdn._SCRATCH_ALIGN == 0 for o in offs)


def test_scratch_layout_holds_every_tensor_once():
    """One byte buffer: input-dtype tensors, then fp32 ones, none overlapping, each 256-aligned."""
    half, f32 = chunk_gdn._scratch_shapes(130, 3, 4, 32, 48)
    offs, n = chunk_gdn._scratch_layout(130, 3, 4, 32, 48, 2)
    sizes = [math.prod(s) * 2 for s in half] + [math.prod(s) * 4 for s in f32]
    ends = [o + s for o, s in zip(offs, sizes)]
    assert all(e <= o for e, o in zip(ends, offs[1:])) and ends[-1] <= n
    assert n - ends[-1] < chunk_gdn._SCRATCH_ALIGN and all(o % 256 == 0 for o in offs)


class _Compiled:
    """Stands in for a compiled kernel: what ``_remember_plan`` reads of one."""

    def __init__(self, i):
        self.run, self.function, self.packed_metadata = (lambda *a: None), i, (4, 1, 0)


def test_plan_gathers_each_kernels_arguments_in_order():
    """A plan's getters give every kernel its argument list: per-call values where the name is
    per call, the first call's values elsewhere (what the removed copy-and-patch loop did)."""
    chunk_gdn._PLANS.clear()
    lists = [[f"fixed-{fn.__name__}-{n}" for n in fn.arg_names] for fn in chunk_gdn._KERNELS]
    lp = launch_params(32, 32, torch.float16)
    compiled = [_Compiled(i) for i in range(4)]
    chunk_gdn._remember_plan(compiled, chunk_gdn._KERNELS, lists, lp, "key")
    plan = chunk_gdn._PLANS.pop("key")
    call = {n: f"call-{n}" for n in chunk_gdn._PER_CALL}
    for names in chunk_plan.SCRATCH_ARGS:  # a scratch buffer's names are one value
        call.update(dict.fromkeys(names, f"call-{names[0]}"))
    vals = chunk_launch._bound_values(call) + plan.fixed
    for fn, first, getter in zip(chunk_gdn._KERNELS, lists, plan.getters):
        want = [call[n] if n in chunk_gdn._PER_CALL else a for n, a in zip(fn.arg_names, first)]
        assert list(getter(vals)) == want
    # a tensor among the fixed values is a buffer the per-call names miss: no plan
    lists[2][-1] = torch.zeros(1)
    chunk_gdn._remember_plan(compiled, chunk_gdn._KERNELS, lists, lp, "key")
    assert "key" not in chunk_gdn._PLANS


def _bare_launcher(recorder, **sizes):
    """A ``CudaLauncher`` of the installed Triton without compiling one: the attributes its
    ``__call__`` reads, and the C ``launch`` replaced by ``recorder``."""
    from triton.backends.nvidia.driver import CudaLauncher

    run = object.__new__(CudaLauncher)
    run.launch, run.num_ctas = recorder, 1
    run.global_scratch_size = sizes.get("global_scratch_size", 0)
    run.profile_scratch_size = sizes.get("profile_scratch_size", 0)
    run.global_scratch_align = run.profile_scratch_align = 1
    run.launch_cooperative_grid, run.launch_pdl = False, True
    if "arg_annotations" in inspect.getsource(CudaLauncher.__init__):
        run.arg_annotations, run.kernel_signature, run.gsan_enabled = ("ann",), b"sig", False
    return run


def test_raw_launcher_passes_what_tritons_wrapper_passes(monkeypatch):
    """On the installed Triton (make test runs this on 3.6 and on 3.9): the raw launch hands the C
    launcher the very arguments ``CudaLauncher.__call__`` hands it."""
    from triton.runtime.driver import driver

    from kernels._launch import raw_launcher

    monkeypatch.setattr(driver, "_active", object())  # 3.9's wrapper looks the driver up first (no GPU here)
    calls = []
    ck = _Compiled(0)
    ck.function, ck.packed_metadata = 0xF00, (4, 1, 512)
    ck.run = _bare_launcher(lambda *a: calls.append(a))
    args = (0x1000, 7, 0.5, None, "constexpr")  # as a plan's itemgetter gives them
    ck.run(3, 2, 1, 0xABC, ck.function, ck.packed_metadata, None, None, None, *args)
    launch = raw_launcher(ck)
    assert launch is not None, "the installed Triton's launcher form is not recognised"
    launch(3, 2, 1, 0xABC, args)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert calls[0][:7] == (3, 2, 1, 0xABC, 0xF00, False, True)


def test_raw_launcher_declines_what_it_cannot_do():
    from kernels._launch import raw_launcher

    ck = _Compiled(0)
    ck.run = _bare_launcher(lambda *a: None, global_scratch_size=64)
    assert raw_launcher(ck) is None  # the wrapper allocates scratch: keep it
    ck.run = _bare_launcher(lambda *a: None, profile_scratch_size=64)
    assert raw_launcher(ck) is None
    assert raw_launcher(_Compiled(0)) is None  # not a CudaLauncher: unknown form


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
    _call(x, gate=gate, boundary_states=False)  # boundary stores are compile-time: a plan of its own
    assert len(chunk_gdn._PLANS) == 2

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
    assert len(chunk_gdn._PLANS) == 2  # initial state, lengths: runtime values
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
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gate-in-kernel"])
def test_gpu_a_plan_compiled_with_flags_at_one_serves_calls_at_zero(gated, monkeypatch):
    """Triton turns an int argument equal to 1 into a constant unless told not to. A plan first
    compiled with an initial state and l2norm (both flags 1) must, on the direct path, give a call
    without them (flags 0) what Triton's own launch path gives it. The final-state buffer, which
    stands in for the absent initial state, is filled with NaN first: a kernel that still reads it
    as the initial state returns NaN (the bf16 Gluon loop did, as replay found: its KV check failed
    wherever a request's first segment ran on a plan its later segments had compiled)."""
    chunk_gdn._PLANS.clear()
    dt = _half()
    q, k, v, g, beta = make_inputs(941, h=2, hv=4, dk=128, dv=128, seed=11, device="cuda", dtype=dt)
    # unit keys and queries: without l2norm the recurrence stays bounded (keys of norm ~11 make it
    # overflow), and with it the norms are re-taken, which changes the last bits
    q, k = (torch.nn.functional.normalize(t.float(), dim=-1).to(dt) for t in (q, k))
    gate = (torch.rand(4, device="cuda") + 0.5, torch.randn(4, device="cuda")) if gated else None
    extra = {} if gate is None else dict(A_log=gate[0], dt_bias=gate[1], use_gate_in_kernel=True, use_beta_sigmoid=True)
    h0 = torch.randn(1, 4, 128, 128, device="cuda") * 0.1

    def call(l2norm, **kw):
        meta = prepare_chunk_metadata([0, 941], device="cuda")
        ht = torch.full((1, 4, 128, 128), float("nan"), device="cuda")
        ws = torch.full((chunk_gdn.workspace_bytes(q, v, meta),), 255, dtype=torch.uint8, device="cuda")
        return chunk_gated_delta_rule(
            q, k, v, g, beta, use_qk_l2norm=l2norm, chunk_metadata=meta, final_state_out=ht, workspace=ws, **extra,
            **kw,
        )  # fmt: skip

    call(True, initial_state=h0)  # compiles with both flags at 1 and remembers the plan
    assert len(chunk_gdn._PLANS) == 1
    direct = [call(False), call(True), call(False, initial_state=h0)]
    assert len(chunk_gdn._PLANS) == 1  # the flags are runtime values of the one plan
    monkeypatch.setattr(chunk_gdn, "_DIRECT", False)
    triton_path = [call(False), call(True), call(False, initial_state=h0)]
    for ours, theirs in zip(direct, triton_path):
        for a, b in zip(ours, theirs):
            assert not torch.isnan(a.float()).any()
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


@pytest.mark.gpu
def test_gpu_bound_calls_equal_triton_launches_layer_after_layer(monkeypatch):
    """A model step's layers on one metadata: the first call binds, the later ones (other inputs,
    gate parameters, initial states; with and without the caller's buffers) take the bound path,
    never the plan key, and give Triton's launch path's results bit for bit. A layout the bound
    call declines (another token stride) still runs, through the full path."""
    chunk_gdn._PLANS.clear()
    dt = _half()
    cu, starts = [0, 100, 640, 1000], [0, 64, 7]
    meta = prepare_chunk_metadata(cu, starts, device="cuda")
    layers = []
    for seed in range(3):
        x = make_inputs(1000, h=2, hv=4, dk=128, dv=128, seed=10 + seed, device="cuda", dtype=dt)
        gate = (torch.rand(4, device="cuda") + 0.5, torch.randn(4, device="cuda"))
        h0 = torch.randn(3, 4, 128, 128, device="cuda") * 0.1 if seed else None
        layers.append((x, gate, h0))

    def step(m, bufs=None):
        return [
            chunk_gated_delta_rule(
                *x, use_qk_l2norm=True, chunk_metadata=m, initial_state=h0, A_log=gate[0], dt_bias=gate[1],
                use_gate_in_kernel=True, use_beta_sigmoid=True, **(bufs or {}),
            )
            for x, gate, h0 in layers
        ]  # fmt: skip

    step(meta)  # compiles, remembers the plan, binds
    assert len(meta.calls) == 1
    real_key = chunk_launch._plan_key

    def no_key(*a, **k):
        raise AssertionError("the plan key was built: the bound call was not used")

    with monkeypatch.context() as m:
        m.setattr(chunk_launch, "_plan_key", no_key)
        bound = step(meta)
        bufs = dict(
            out=torch.empty(1, 1000, 4, 128, device="cuda", dtype=dt),
            final_state_out=torch.empty(3, 4, 128, 128, device="cuda"),
            boundary_out=torch.empty(meta.num_boundaries, 4, 128, 128, device="cuda"),
            workspace=torch.empty(
                chunk_gdn.workspace_bytes(layers[0][0][0], layers[0][0][2], meta), dtype=torch.uint8, device="cuda"
            ),
        )
        given = tuple(t.clone() for t in step(meta, bufs)[-1])
    monkeypatch.setattr(chunk_gdn, "_DIRECT", False)
    reference = step(prepare_chunk_metadata(cu, starts, device="cuda"))
    for ours, ref in zip(bound, reference):
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
    for a, b in zip(given, reference[-1]):
        assert torch.equal(a, b)
    monkeypatch.setattr(chunk_gdn, "_DIRECT", True)
    monkeypatch.setattr(chunk_launch, "_plan_key", real_key)
    (q, k, v, g, beta), gate, h0 = layers[-1]
    wide = torch.empty(1, 1000, 2, 160, device="cuda", dtype=dt)[..., :128].copy_(k)  # another token stride
    other = chunk_gated_delta_rule(
        q, wide, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, initial_state=h0, A_log=gate[0],
        dt_bias=gate[1], use_gate_in_kernel=True, use_beta_sigmoid=True,
    )  # fmt: skip
    for a, b in zip(other, reference[-1]):  # its own plan: the same math, maybe other code
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_per_call_flags_are_never_specialised():
    """The per-call ints (``l2norm``, ``has_h0``) change between calls of one plan: every kernel
    of every launch table takes them as runtime values (``do_not_specialize``), or a plan compiled
    where a flag was 1 would treat it as the constant 1 for every later call (Triton specialises an
    int equal to 1)."""
    flags = {"l2norm", "has_h0"}
    kernels = set(chunk_gdn._KERNELS + chunk_gdn._KERNELS_GLUON + chunk_gdn._KERNELS_FUSED + chunk_gdn._GLUON_KERNELS)
    kernels.discard(None)
    seen = set()
    for fn in kernels:
        if hasattr(fn, "params"):  # compiled Triton, and Gluon (never interpreted)
            runtime = {p.name for p in fn.params if p.do_not_specialize}
        else:  # the interpreter's wrapper keeps the decorator's arguments
            given = fn.kwargs.get("do_not_specialize") or ()
            runtime = {fn.arg_names[a] if isinstance(a, int) else a for a in given}
        for name in flags & set(fn.arg_names):
            seen.add(name)
            assert name in runtime, (fn.fn.__name__, name)
    assert seen == flags


def test_per_call_names_cover_every_buffer_of_the_kernels():
    """A buffer the plan treated as fixed would be launched at the first call's address: every
    pointer argument of the four kernels must be a per-call name, and every per-call name a real
    argument. Scratch aliases (a writer's ``*_out`` and its readers) map to one buffer."""
    buffers = "w u vn A hbuf fd gcum glast prog".split()
    kw = dict(q="q", k="k", v="v", g="g", beta="b", A_log="a", dt_bias="d", o="o", h0="0", ht="t", hb="h", has_h0=0)
    kw.update(chunk_info="c", seq_info="s", store_slot="x", scale=1, l2norm=1)
    named = chunk_gdn._call_args(**kw, scratch=tuple(buffers))
    scratch = {n: b for n, b in named.items() if b in buffers}
    assert scratch["a_out"] == scratch["a_in"] == "A" and scratch["h_out"] == scratch["h"] == "hbuf"
    names = set().union(*(fn.arg_names for fn in chunk_gdn._KERNELS))
    pointers = set(scratch) | {"q", "k", "v", "g", "beta", "A_log", "dt_bias", "o", "h0", "ht", "hb"}
    pointers |= {"chunk_info", "seq_info", "store_slot"}
    assert pointers <= names
    assert chunk_gdn._PER_CALL == pointers | {"scale", "l2norm", "has_h0"}
    assert set(named) == chunk_gdn._PER_CALL  # both launch paths fill exactly the per-call names
    # the direct path's values hold each name's value in the place its plans read it from
    flat = chunk_launch._bound_values(named)
    assert len(flat) == len(set(chunk_launch._PLACE.values()))
    assert all(flat[chunk_launch._PLACE[n]] == val for n, val in named.items())
    # the per-call names are read off the kernels' signatures, in launch order, without the
    # arguments a plan fixes
    assert chunk_gdn._PER_CALL_ORDER[:5] == ("k", "g", "beta", "A_log", "dt_bias")
    assert chunk_gdn._PER_CALL_ORDER[-5:] == ("q", "h", "vn", "o", "scale")
    assert not chunk_gdn._PER_CALL & chunk_plan.PLAN_FIXED
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
        "STORE_B",
        "TRANS",
        "BCV",
        "TF32M",
        "KONCE",
        "OVL",
        "NVS",
        "DISCARD",
    }
    assert len(chunk_gdn._KERNELS) == len(chunk_gdn._KERNEL_KEYS) == 4


@pytest.mark.gpu
def test_gpu_inputs_on_another_device_get_one_line_errors_not_bare_addresses():
    """The direct path hands the kernels bare addresses: an initial state, gate parameters or
    metadata off the inputs' device must never reach it (a host address read by a kernel is an
    illegal access that poisons the context). They take the general path, which says why."""
    chunk_gdn._PLANS.clear()
    x = make_inputs(200, h=2, hv=4, dk=64, dv=64, seed=4, device="cuda", dtype=_half())
    _call(x)  # the plan
    q, k, v, g, beta = x
    with pytest.raises(ValueError, match="chunk_metadata is on cpu"):
        chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=prepare_chunk_metadata([0, 200]))
    with pytest.raises((ValueError, RuntimeError)):
        _call(x, initial_state=torch.zeros(1, 4, 64, 64))  # a host initial state
    again = _call(x)  # the context is intact and the plan still serves
    assert torch.isfinite(again[0].float()).all()


def test_host_probe_parts_time_the_direct_path_without_its_launches(monkeypatch):
    """``benchmarks/kernel_host_probe.py``'s parts (run on a GPU) work on a remembered plan: the
    whole call with its launches skipped issues none of them and puts the plan's launches back."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    probe = __import__("kernel_host_probe")
    chunk_gdn._PLANS.clear()
    q, k, v, g, beta = make_inputs(100, h=2, hv=4, dk=32, dv=32, dtype=torch.float16)
    meta = prepare_chunk_metadata([0, 100])
    lp = launch_params(32, 32, q.dtype)
    ptrs = chunk_gdn._addresses(q, k, v, g, beta)
    key = chunk_launch._plan_key(lp, q.device, q.dtype, torch.float32, 2, 4, False, False, q, k, v, g, beta, ptrs)
    lists = [[0] * len(fn.arg_names) for fn in chunk_gdn._KERNELS]
    chunk_gdn._remember_plan([_Compiled(i) for i in range(4)], chunk_gdn._KERNELS, lists, lp, key)
    plan = chunk_gdn._PLANS[key]
    launched = []

    def launcher(i):
        return lambda *a: launched.append(i)

    plan.launches = tuple(launcher(i) for i in range(4))
    real = plan.launches

    def call():  # stands in for the GPU call: the direct path's launches, as it issues them
        for launch in chunk_gdn._PLANS[key].launches:
            launch()

    parts = probe.components(torch, chunk_gdn, (q, k, v, g, beta), meta, call)
    assert set(parts) == {"check_args", "launch_params", "addresses + plan key", "four allocations",
                          "whole call, launches skipped"}  # fmt: skip
    launched.clear()
    for fn in parts.values():
        fn()
    assert launched == [] and plan.launches is real
    call()
    assert launched == [0, 1, 2, 3]
    # with the call into the caller's buffers: its launches, issued again without the call
    sent = []

    def call_buffers():
        for i, launch in enumerate(chunk_gdn._PLANS[key].launches):
            launch(i, "args")

    plan.launches = tuple((lambda i: lambda *a: sent.append(a))(i) for i in range(4))
    real = plan.launches
    parts = probe.components(torch, chunk_gdn, (q, k, v, g, beta), meta, call, call_buffers)
    assert plan.launches is real and (0, "args") not in sent  # the buffers' call was recorded, not issued
    sent.clear()
    parts["the 4 launches alone"]()
    assert sent == [(i, "args") for i in range(4)]
    del sys.modules["kernel_host_probe"]


# ---- calls bound to their metadata (CPU, stand-in plan) ----------------------------------------
def _stand_in_plan(monkeypatch, x, h0, gate, hb_dtype=torch.float32):
    """A remembered plan whose four launches record their arguments, and a runtime whose current
    stream is 7 and that has no launch hooks: ``_direct_call`` and the bound path run on the CPU."""
    import types

    q, k, v, g, beta = x
    lp = launch_params(q.shape[3], v.shape[3], q.dtype)
    ptrs = chunk_gdn._addresses(q, k, v, g, beta, h0, *(gate or (None, None)))
    key = chunk_launch._plan_key(
        lp, q.device, q.dtype, hb_dtype, q.shape[2], v.shape[2], gate is not None, False, q, k, v, g, beta, ptrs
    )
    lists = [[f"fixed-{n}" for n in fn.arg_names] for fn in chunk_gdn._KERNELS]
    chunk_gdn._remember_plan([_Compiled(i) for i in range(4)], chunk_gdn._KERNELS, lists, lp, key)
    plan = chunk_gdn._PLANS[key]
    record = []

    def recorder(i):
        return lambda *a: record.append((i, a))

    plan.launches = tuple(recorder(i) for i in range(4))
    hooks = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(chunk_launch, "_RUNTIME", [lambda index: 7, hooks])
    return lp, record, hooks


def _bound_inputs(T=200, seed=0):
    return [t.contiguous() for t in make_inputs(T, h=2, hv=4, dk=32, dv=32, seed=seed, dtype=torch.float16)]


def _bind_one(monkeypatch):
    """One call bound to fresh metadata on a stand-in plan (no initial state, no gate, boundary
    states, scale 0.25): ``(inputs, metadata, bound call, launch record, launch hooks)``."""
    chunk_gdn._PLANS.clear()
    x = _bound_inputs()
    lp, record, hooks = _stand_in_plan(monkeypatch, x, None, None)
    meta = prepare_chunk_metadata([0, 200], [0])
    chunk_gdn._direct_call(*x, 0.25, None, True, torch.float32, meta, 1, lp, None, False, None)
    (bound,) = meta.calls.values()
    return x, meta, bound, record, hooks


def test_bound_call_launches_what_the_direct_path_launches(monkeypatch):
    """The first direct call binds itself to the metadata; the next call of the layout (another
    layer: other inputs, gate parameters and initial state) takes the bound path and passes the
    four kernels exactly the arguments the direct path passes for the same inputs and buffers."""
    chunk_gdn._PLANS.clear()
    x = _bound_inputs()
    h0 = torch.zeros(1, 4, 32, 32)
    gate = (torch.rand(4), torch.randn(4))
    lp, record, _ = _stand_in_plan(monkeypatch, x, h0, gate)
    meta = prepare_chunk_metadata([0, 200], [0], boundary_stride=1)
    given = (
        torch.empty(1, 200, 4, 32, dtype=torch.float16),
        torch.empty(1, 4, 32, 32),
        torch.empty(meta.num_boundaries, 4, 32, 32),
        torch.empty(chunk_gdn.workspace_bytes(x[0], x[2], meta), dtype=torch.uint8),
    )
    args = (0.25, h0, True, torch.float32, meta, 1, lp, gate, False, given)
    first = chunk_gdn._direct_call(*x, *args)
    assert first is not None and len(meta.calls) == 1 and len(record) == 4
    (bound,) = meta.calls.values()
    o, ht, hb, ws = given
    offs, _ = chunk_gdn._scratch_layout(200, meta.num_chunks, 4, 32, 32, 2)
    scratch = tuple(ws.data_ptr() + off for off in offs)

    def expected(x, h0, gate):
        """Each kernel's arguments by name, written out independently of the launch code."""
        named = chunk_gdn._call_args(
            **dict(zip(("q", "k", "v", "g", "beta"), (t.data_ptr() for t in x))),
            A_log=gate[0].data_ptr(), dt_bias=gate[1].data_ptr(), scratch=scratch, o=o.data_ptr(),
            h0=ht.data_ptr() if h0 is None else h0.data_ptr(), ht=ht.data_ptr(), hb=hb.data_ptr(),
            has_h0=int(h0 is not None), chunk_info=meta.chunk_info.data_ptr(), seq_info=meta.seq_info.data_ptr(),
            store_slot=meta.store_slot.data_ptr(), scale=0.25, l2norm=1,
        )  # fmt: skip
        return [
            (i, (*grid, 7, tuple(named.get(n, f"fixed-{n}") for n in fn.arg_names)))
            for i, (fn, grid) in enumerate(zip(chunk_gdn._KERNELS, chunk_gdn._grids(lp, 1, meta.num_chunks, 4, 32)))
        ]

    assert record == expected(x, h0, gate)
    layer2, h0b, gate2 = _bound_inputs(seed=1), torch.ones(1, 4, 32, 32), (torch.rand(4), torch.randn(4))
    for state in (h0b, None):  # without one, has_h0 is 0 and the final state's address stands in
        record.clear()
        assert bound.run(*layer2, state, gate2, given) == (o, ht, hb)
        assert record == expected(layer2, state, gate2)


def test_bound_call_declines_every_other_layout(monkeypatch):
    """A call whose layout differs from the bound one in anything the plan key holds is declined
    (None: the full path decides), as is one while a launch hook is installed."""
    x, meta, bound, record, hooks = _bind_one(monkeypatch)
    q, k, v, g, beta = x
    assert bound.run(q, k, v, g, beta, None, None, None) is not None
    flat = torch.empty(q.numel() + 1, dtype=q.dtype)
    shifted = flat[1:].view_as(q).copy_(q)  # 2 bytes off a 16-byte boundary
    wide = torch.empty(1, 200, 2, 48, dtype=k.dtype)[..., :32].copy_(k)  # another token stride
    declined = {
        "misaligned q": (shifted, k, v, g, beta, None, None),
        "token stride of k": (q, wide, v, g, beta, None, None),
        "dtype of g": (q, k, v, g.half(), beta, None, None),
        "dtype of v": (q, k, v.float(), g, beta, None, None),
        "length": (*_bound_inputs(T=260), None, None),
        "initial state shape": (q, k, v, g, beta, torch.zeros(1, 4, 32, 16), None),
        "initial state dtype": (q, k, v, g, beta, torch.zeros(1, 4, 32, 32, dtype=torch.float16), None),
        "initial state strides": (q, k, v, g, beta, torch.zeros(1, 4, 32, 32).transpose(2, 3), None),
        "gate in fp16": (q, k, v, g, beta, None, (torch.rand(4).half(), torch.randn(4))),
        "gate missing a tensor": (q, k, v, g, beta, None, (None, torch.randn(4))),
        "gate strided": (q, k, v, g, beta, None, (torch.rand(8)[::2], torch.randn(4))),
    }
    for name, call in declined.items():
        assert bound.run(*call, None) is None, name
    hooks.launch_enter_hook = lambda *a: None
    assert bound.run(q, k, v, g, beta, None, None, None) is None


def test_bound_calls_are_keyed_by_options_and_never_copied_with_the_metadata(monkeypatch):
    import dataclasses

    chunk_gdn._PLANS.clear()
    x = _bound_inputs()
    lp, _, _ = _stand_in_plan(monkeypatch, x, None, None)
    _stand_in_plan(monkeypatch, x, None, None, hb_dtype=None)  # the plan without boundary stores
    meta = prepare_chunk_metadata([0, 200], [0])
    chunk_gdn._direct_call(*x, 0.25, None, True, torch.float32, meta, 1, lp, None, False, None)
    chunk_gdn._direct_call(*x, 0.25, None, False, torch.float32, meta, 1, lp, None, False, None)
    assert len(meta.calls) == 2  # with and without boundary states
    assert dataclasses.replace(meta).calls == {} and meta == dataclasses.replace(meta)
    assert "calls" not in repr(meta)


def test_bound_calls_stay_off_with_tritons_launch_path(monkeypatch):
    """``KERNELS_LAUNCH=triton`` (``_DIRECT`` off) sends every call through Triton's launcher:
    a call bound to the metadata before must not be used."""
    chunk_gdn._PLANS.clear()
    x = _bound_inputs()
    lp, record, _ = _stand_in_plan(monkeypatch, x, None, None)
    meta = prepare_chunk_metadata([0, 200], [0])
    chunk_gdn._direct_call(*x, 32**-0.5, None, True, torch.float32, meta, 1, lp, None, False, None)
    assert len(meta.calls) == 1
    record.clear()
    monkeypatch.setattr(chunk_gdn, "_DIRECT", False)
    o, _, _ = chunk_gated_delta_rule(*x, use_qk_l2norm=True, chunk_metadata=meta)
    assert record == []
    ro, _, _, _ = naive_gated_delta_rule(*x, use_qk_l2norm=True)
    assert ((o.float() - ro).norm() / ro.norm()).item() < 1e-2


def test_bound_call_checks_the_callers_buffers_like_the_full_path(monkeypatch):
    """A bound call into the caller's buffers takes them where all four fit (the launches get
    their addresses), allocates what is not given, and a wrong one (dtype, shape, strides,
    address) is the full path's one-line ValueError naming it, never a launch."""
    x, meta, bound, record, _ = _bind_one(monkeypatch)
    ws_bytes = chunk_gdn.workspace_bytes(x[0], x[2], meta)
    good = dict(
        out=torch.empty(1, 200, 4, 32, dtype=torch.float16),
        final_state_out=torch.empty(1, 4, 32, 32),
        boundary_out=torch.empty(meta.num_boundaries, 4, 32, 32),
        workspace=torch.empty(ws_bytes + 100, dtype=torch.uint8),
    )
    record.clear()
    o, ht, hb = bound.run(*x, None, None, tuple(good.values()))
    assert o is good["out"] and ht is good["final_state_out"] and hb is good["boundary_out"]
    sent = {n: a for n, a in zip(chunk_gdn._wu_kernel.arg_names, record[1][1][-1])}
    assert (
        sent["w_out"]
        == good["workspace"].data_ptr() + chunk_gdn._scratch_layout(200, meta.num_chunks, 4, 32, 32, 2)[0][0]
    )
    record.clear()
    o, ht, hb = bound.run(*x, None, None, (good["out"], None, None, None))  # the rest allocated
    assert o is good["out"] and ht.shape == (1, 4, 32, 32) and hb.shape == (meta.num_boundaries, 4, 32, 32)
    assert len(record) == 4
    o, ht, hb = bound.run(*x, None, None, None)  # all allocated
    assert (o.shape, o.dtype, ht.shape, ht.dtype) == ((1, 200, 4, 32), torch.float16, (1, 4, 32, 32), torch.float32)
    assert (hb.shape, hb.dtype) == ((meta.num_boundaries, 4, 32, 32), torch.float32)
    assert o.is_contiguous() and ht.is_contiguous() and hb.is_contiguous()
    for name, b in good.items():
        wrong = {
            "dtype": b.to(torch.int16 if b.dtype == torch.uint8 else torch.float64),
            "shape": b.new_empty(2, b.numel()) if name == "workspace" else b.new_empty(*b.shape[:-1], b.shape[-1] + 1),
            "strided": b.new_empty(*b.shape[:-1], 2 * b.shape[-1])[..., ::2],
            "misaligned": b.new_empty(b.numel() + 64).view(-1)[1 : 1 + b.numel()].view(b.shape),
        }
        for fault, t in wrong.items():
            record.clear()
            with pytest.raises(ValueError) as e:
                bound.run(*x, None, None, tuple(t if n == name else g for n, g in good.items()))
            assert name in str(e.value) and "\n" not in str(e.value) and record == [], (name, fault)


def test_bound_key_follows_the_launch_tables_inputs(monkeypatch):
    """The bound lookup skips the launch table: its key holds what picks the table besides the
    shapes the bound call checks. A ``KERNELS_CONFIG_*`` change, another fp32 precision or a
    failed Gluon compile gives another key (the full path then builds the table anew)."""
    key = functools.partial(chunk_gdn._bound_key, 0.25, 1, True, torch.float32, False, False)
    base = key(torch.float16, None)
    assert key(torch.float16, None) == base
    assert key(torch.float32, None) != base and key(torch.float16, "ieee") != base
    monkeypatch.setenv("KERNELS_CONFIG_STATE", "BV=32")
    assert key(torch.float16, None) != base
    monkeypatch.delenv("KERNELS_CONFIG_STATE")
    assert key(torch.float16, None) == base
    monkeypatch.setattr(chunk_plan, "_GLUON_FAILED", [RuntimeError("no Gluon")])
    assert key(torch.float16, None) != base
