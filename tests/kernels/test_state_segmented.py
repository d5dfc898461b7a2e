"""The segmented (chunk-parallel) state pass, ``kernels.chunk_segmented`` (opt-in:
``state_segments=n`` / ``KERNELS_CONFIG_STATE=SEG=n``), against the per-token fp32 oracle and the
serial loop.

CPU tests run under TRITON_INTERPRET=1 at tiny shapes (one or two key heads, K = 16, V = 32, a few
64-token chunks, segments of 2 chunks) in fp32 and fp16 (the interpreter refuses bf16). The gate
has a long memory (about -0.25 a chunk) and beta is small (0.1 on average: each token erases
little of the state along its key) so that the state entering a segment really depends on the
segments before it: with the other kernel tests' gate (about -25 a chunk) the transitions are
~1e-20 and a wrong combine would go unnoticed.

Tolerances: fp32 atol = rtol = 1e-5 against the oracle, the serial kernel's (test_chunk_gdn.py);
fp16 1e-2 against the oracle fed the same fp16-rounded inputs (fp16 operands in every product, as
the serial kernel; it is observed at 1.6e-3 on values near 2.4, the segmented pass within 10 % of
that). Segmented against serial: the same tolerances.

Not bit-equal, by design: the segmented pass forms the state entering a segment as ``P S + Z``
(the segment's transition applied to the previous entering state, plus its zero-start end state)
instead of chunk by chunk, so its bits differ from the serial loop's; and a call resumed from an
emitted boundary state is not bit-equal to the uninterrupted segmented call either (its first
segment starts at the resume point, so the transitions and zero-start states of the segments it
spans cover other chunks and round differently; and the state emitted at a segment's end is the
loop's, not the combine's that the uninterrupted call carries on from). Both are asserted within
the tolerances above. The default call never runs this path (test_default_and_env_routes).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from kernels import chunk_segmented  # noqa: E402
from kernels.chunk_gdn import chunk_gated_delta_rule, prepare_chunk_metadata  # noqa: E402
from kernels.reference import naive_gated_delta_rule  # noqa: E402

H, HV, K, V = 1, 2, 16, 32
SEG = 2
TOL = {torch.float32: 1e-5, torch.float16: 1e-2}
#: the log decay's scale (about -0.25 per 64-token chunk) and beta's (long memory: module docstring)
GATE_SCALE, BETA_SCALE = 0.01, 0.2


def make_inputs(
    T,
    *,
    h=H,
    hv=HV,
    dk=K,
    dv=V,
    seed=0,
    dtype=torch.float32,
    device="cpu",
    gate_scale=GATE_SCALE,
    beta_scale=BETA_SCALE,
):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(1, T, h, dk, generator=gen)
    k = torch.randn(1, T, h, dk, generator=gen)
    v = torch.randn(1, T, hv, dv, generator=gen)
    g = F.logsigmoid(torch.randn(1, T, hv, generator=gen)) * gate_scale
    beta = torch.rand(1, T, hv, generator=gen) * beta_scale
    # beta in the inputs' dtype (a model's projection), g in fp32
    return [x.to(device=device, dtype=dtype) for x in (q, k, v)] + [g.to(device), beta.to(device, dtype)]


def rand_state(n, *, hv=HV, dk=K, dv=V, seed=1, device="cpu"):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return (0.1 * torch.randn(n, hv, dk, dv, generator=gen)).to(device)


def close(a, b, tol):
    torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])


@pytest.mark.triton_compat
@DTYPES
def test_one_sequence_matches_oracle_and_serial(dtype):
    """Five chunks (the last partial) in segments of two, from an initial state: outputs, final
    and boundary states against the oracle and against the serial loop; and (fp32) from zero
    against the oracle."""
    T = 300
    q, k, v, g, beta = make_inputs(T, seed=3, dtype=dtype)
    h0 = rand_state(1, seed=4)
    ro, rf, rb, rpos = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    so, sf, sb = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True, state_segments=SEG)
    assert rpos == [[64, 128, 192, 256]] and hb.shape == (4, HV, K, V) and o.dtype == dtype
    tol = TOL[dtype]
    for ours, serial, ref in ((o, so, ro), (ht, sf, rf), (hb, sb, rb)):
        close(ours, ref, tol)
        close(ours, serial, tol)
    if dtype != torch.float32:
        return
    # without an initial state (the combine starts from zero), against the oracle
    ref0 = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    for ours, ref in zip(chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, state_segments=SEG), ref0):
        close(ours, ref, tol)
    # the history really crosses segments: with and without the initial state the final states
    # differ far beyond the tolerance (a combine that dropped P S would pass nowhere)
    assert (rf - ref0[1]).abs().max() > 1e-3


def test_segment_tables_hand_checked():
    """Segments cut at absolute chunk numbers that are multiples of SEG: a sequence starting at
    70 (ragged, absolute chunks 1-3) gets [1] and [2, 3]; an empty one one empty segment; one of
    20 tokens at 130 (absolute chunk 2) one segment; one of 180 at 0 [0, 1] and [2]."""
    meta = prepare_chunk_metadata([0, 150, 150, 170, 350], [70, 0, 130, 0])
    tables = chunk_segmented.SegmentTables(meta, SEG, "cpu")
    assert tables.num == 6
    assert tables.host_info[:, 2:].tolist() == [[0, 1], [1, 3], [3, 3], [3, 4], [4, 6], [6, 7]]
    assert tables.host_info[:, :2].tolist() == [[0, 150], [0, 150], [150, 150], [150, 170], [170, 350], [170, 350]]
    assert tables.host_seq_segs.tolist() == [[0, 2], [2, 3], [3, 4], [4, 6]]
    assert tables.last.tolist() == [1, 2, 3, 5]
    assert tables.info.tolist() == tables.host_info.tolist()
    # the chunk table the output reads: the metadata's, with each chunk's segment as its sequence
    assert tables.chunk[:, 0].tolist() == [0, 1, 1, 3, 4, 4, 5]
    assert tables.chunk[:, 1:].tolist() == meta.chunk_info[:, 1:].tolist()
    # one segment per sequence where SEG covers it
    assert chunk_segmented.SegmentTables(meta, 64, "cpu").num == 4


@pytest.mark.triton_compat
@DTYPES
def test_varlen_ragged_starts_initial_states(dtype):
    """Four sequences: starts off the 64 grid, an empty one (its initial state passes through),
    one shorter than a segment, initial states for all; boundaries at every chunk."""
    cu = [0, 150, 150, 170, 350]
    starts = [70, 0, 130, 0]
    q, k, v, g, beta = make_inputs(350, seed=11, dtype=dtype)
    h0 = rand_state(4, seed=12)
    kw = dict(initial_state=h0, cu_seqlens=cu, start_positions=starts, use_qk_l2norm=True)
    ro, rf, rb, rpos = naive_gated_delta_rule(q, k, v, g, beta, **kw)
    assert rpos == [[128, 192], [], [], [64, 128]]
    so, sf, sb = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, state_segments=SEG, **kw)
    tol = TOL[dtype]
    for ours, serial, ref in ((o, so, ro), (ht, sf, rf), (hb, sb, rb)):
        close(ours, ref, tol)
        close(ours, serial, tol)
    assert torch.equal(ht[1], h0[1])  # the empty sequence: its state as given


@pytest.mark.triton_compat
def test_resume_from_emitted_states_within_tolerance():
    """Resumed at a segment start (128) and inside a segment (192) from the emitted fp32 state:
    the rest of the call within the tolerance of the uninterrupted segmented call and of the
    oracle. Not bit-equal (module docstring)."""
    T = 320
    q, k, v, g, beta = make_inputs(T, seed=21)
    h0 = rand_state(1, seed=22)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True, state_segments=SEG)
    ro, rf, _, _ = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    tol = TOL[torch.float32]
    for b in (128, 192):
        i = b // 64 - 1  # its row among the emitted states
        part = [x[:, b:] for x in (q, k, v, g, beta)]
        o2, ht2, hb2 = chunk_gated_delta_rule(
            *part, initial_state=hb[i : i + 1], start_positions=[b], use_qk_l2norm=True, state_segments=SEG
        )
        close(o2, o[:, b:], tol)
        close(ht2, ht, tol)
        close(hb2, hb[i + 1 :], tol)
        close(o2, ro[:, b:], tol)
        close(ht2, rf, tol)


# (not run again on the newest Triton: which pass runs is the library's own choice; each pass's
# bits there are the tests above)
def test_default_and_env_routes(monkeypatch):
    """The default call runs the serial loop (``state_segments=0`` gives its bits, even with
    ``KERNELS_CONFIG_STATE=SEG=n`` set, and so does "auto" on a CPU, where no multiprocessor count
    is known); ``KERNELS_CONFIG_STATE=SEG=n`` gives the keyword's bits; a bad value is a one-line ValueError."""
    q, k, v, g, beta = make_inputs(130, seed=31)  # three chunks: segments [0, 1] and [2]
    # an initial state: from zero the second segment's entering state is P 0 + Z, the first
    # segment's zero-start state, which is the serial loop's state to the bit
    kw = dict(use_qk_l2norm=True, initial_state=rand_state(1, seed=32))
    base = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    seg = chunk_gated_delta_rule(q, k, v, g, beta, state_segments=SEG, **kw)
    auto = chunk_gated_delta_rule(q, k, v, g, beta, state_segments="auto", **kw)  # a CPU: no SMs, serial
    monkeypatch.setenv("KERNELS_CONFIG_STATE", f"SEG={SEG}")
    env = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    env_off = chunk_gated_delta_rule(q, k, v, g, beta, state_segments=0, **kw)
    for a, c, d, e, f in zip(base, seg, env, env_off, auto):
        assert torch.equal(c, d) and torch.equal(a, e) and torch.equal(a, f)
    # the passes really ran and really differ from the serial loop somewhere (else the checks
    # above would not tell the routes apart)
    assert any(not torch.equal(a, c) for a, c in zip(base, seg))
    for bad in (-1, 1.5, "all", True):
        with pytest.raises(ValueError, match="state_segments"):
            chunk_gated_delta_rule(q, k, v, g, beta, state_segments=bad)


def test_auto_rule():
    """Segments only where the serial loop's programs fill under half the multiprocessors, into
    about four programs a multiprocessor, of at least 32 chunks, and at least four of them in the
    longest sequence: on an H200 (132 SMs, V = 128) what the session-10 runs measured fastest."""
    auto = chunk_segmented.auto_segments
    # 4/8 heads, one sequence, BV 16: 64 programs < 66; 9 pieces bring them to 576 (4.4 an SM)
    assert auto(1, 8, 128, 16, 512, 132) == 57  # 32K tokens: ceil(512 / 9), 9 segments
    assert auto(1, 8, 128, 16, 128, 132) == 32  # 8K: ceil(128 / 9) = 15 is under 32 chunks; 4 segments
    assert auto(1, 8, 128, 16, 97, 132) == 32  # 4 segments, the last of one chunk
    assert auto(1, 8, 128, 16, 96, 132) == 0  # 3 segments of 32: the serial loop
    assert auto(1, 8, 128, 16, 64, 132) == 0  # 4K tokens: 2 segments of 32
    # 16/32 heads at the wide block (32): 128 programs fill the GPU at any length
    assert auto(1, 32, 128, 32, 512, 132) == 0
    assert auto(2, 8, 128, 16, 512, 132) == 0  # two sequences at 4/8: 128 programs
    # 1/2 heads: 16 programs, 33 pieces; 1024 chunks (64K tokens) in segments of 32 (ceil(1024 / 33) = 32)
    assert auto(1, 2, 128, 16, 1024, 132) == 32 and auto(1, 2, 128, 16, 2048, 132) == 63
    assert auto(1, 8, 128, 16, 512, 0) == 0  # no multiprocessors known (a CPU)
    assert auto(0, 8, 128, 16, 0, 132) == 0  # no sequence


# ---------------------------------------------------------------------------------------------
# GPU: the production head dim at 8K tokens, segmented against serial and the oracle
# ---------------------------------------------------------------------------------------------


def _rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _max_rel_rows(a, b):
    if a.shape[0] == 0:
        return 0.0
    a, b = a.float().flatten(1), b.float().flatten(1)
    return ((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)).max().item()


#: relative Frobenius tolerances against the fp32 oracle (test_chunk_gdn.GPU_TOL)
GPU_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


_GPU_CASES: dict = {}


def _gpu_case(h, hv, mode, T):
    """Inputs rounded to bf16 (the fp32 case runs on the same values), the call's keywords and the
    oracle's output, final and boundary states: computed once per shape for both dtypes."""
    key = (h, hv, mode, T)
    if key not in _GPU_CASES:
        inputs = make_inputs(
            T, h=h, hv=hv, dk=128, dv=128, seed=hv, dtype=torch.bfloat16, device="cuda", gate_scale=0.002,
            beta_scale=1.0,
        )  # fmt: skip
        kw = dict(use_qk_l2norm=True)
        if mode == "varlen":
            kw.update(
                cu_seqlens=[0, 1000, 5000, 5100, T],
                start_positions=[0, 100, 64 * 7 + 5, 640],
                initial_state=rand_state(4, hv=hv, dk=128, dv=128, device="cuda"),
            )
        else:
            kw.update(initial_state=rand_state(1, hv=hv, dk=128, dv=128, device="cuda"))
        with torch.no_grad():
            ref = naive_gated_delta_rule(*inputs, **kw)[:3]
        _GPU_CASES[key] = (inputs, kw, ref)
    return _GPU_CASES[key]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["single", "varlen"])
@pytest.mark.parametrize("h,hv", [(4, 8), (16, 32)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_segmented_matches_serial_and_oracle(dtype, h, hv, mode):
    """8K tokens, K = V = 128, a long memory (gate about -0.1 a chunk, beta about 0.5), segments
    of 16 chunks (8 a sequence; varlen: four sequences with ragged starts and initial states):
    outputs, final and boundary states within the serial kernel's tolerance of the oracle and of
    the serial call."""
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 is not supported on this GPU")
    T = 8192
    (q, k, v, g, beta), kw, (ro, rf, rb) = _gpu_case(h, hv, mode, T)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    so, sf, sb = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, state_segments=16, **kw)
    torch.cuda.synchronize()
    tol = GPU_TOL[dtype]
    errs = dict(
        o=_rel(o, ro), final=_rel(ht, rf), boundaries=_max_rel_rows(hb, rb),
        o_serial=_rel(so, ro), final_serial=_rel(sf, rf), boundaries_serial=_max_rel_rows(sb, rb),
        o_vs_serial=_rel(o, so), final_vs_serial=_rel(ht, sf), boundaries_vs_serial=_max_rel_rows(hb, sb),
    )  # fmt: skip
    # "auto" (auto_segments): segments at 4/8 heads and one sequence on an H200 (32 chunks), the
    # serial loop where the programs fill the GPU (16/32 heads, and four sequences at 4/8)
    ao, aht, ahb = chunk_gated_delta_rule(q, k, v, g, beta, state_segments="auto", **kw)
    errs.update(o_auto=_rel(ao, ro), final_auto=_rel(aht, rf), boundaries_auto=_max_rel_rows(ahb, rb))
    print(f"SEGERR {str(dtype)[6:]} H={h} HV={hv} T={T} {mode}: " + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    assert all(e < tol for e in errs.values()), errs


# ---------------------------------------------------------------------------------------------
# A plain call at graphed speed: the segmented call bound to its metadata (issue 48 item 2)
# ---------------------------------------------------------------------------------------------


def _tensor_at(address: int, like: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the memory at ``address`` with ``like``'s dtype, shape and strides (what
    the interpreter needs to run a kernel on an address the bound call passes)."""
    import ctypes

    import numpy as np

    extent = 1 + sum((n - 1) * s for n, s in zip(like.shape, like.stride())) if like.numel() else 0
    raw = (ctypes.c_char * max(1, extent * like.element_size())).from_address(address)
    flat = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8)).view(like.dtype)
    return flat.as_strided(like.shape, like.stride())


def _interpreting_launcher(first_record, i):
    """A stand-in for a compiled kernel's C launcher (``make_launcher``) that runs launch ``i`` in
    the interpreter: each address where the first call passed a tensor becomes a tensor over that
    memory shaped like the first call's, so the bound call computes for real on the CPU."""
    _, fn, _, first_args, _ = first_record[i]

    def launch(gx, gy, gz, stream, args):
        assert stream == 7
        real = [_tensor_at(a, f) if torch.is_tensor(f) else a for a, f in zip(args, first_args)]
        fn[(gx, gy, gz)](*real)

    return launch


@pytest.fixture(scope="module")
def segmented_full_path():
    """Two layers' inputs, two initial states, a prepared metadata and the reference bits: the
    full path (no binding) on that metadata for (layer 1, state a), (layer 2, state b), (layer 2,
    no state). Shared by both cases below (the interpreted calls are most of their time)."""
    layer1, layer2 = make_inputs(300, seed=41), make_inputs(300, seed=42)
    h0a, h0b = rand_state(1, seed=43), rand_state(1, seed=44)
    meta = prepare_chunk_metadata([0, 300], [0])
    want = [
        [t.clone() for t in chunk_gated_delta_rule(*x, initial_state=h0, use_qk_l2norm=True, chunk_metadata=meta,
                                                    state_segments=SEG)]
        for x, h0 in ((layer1, h0a), (layer2, h0b), (layer2, None))
    ]  # fmt: skip
    assert meta.calls == {}  # nothing binds on a CPU
    return layer1, layer2, h0a, h0b, meta, want


# on the newest Triton only on prepared metadata: the remembered metadata ("plain") is the
# library's own bookkeeping, the same whatever Triton runs the kernels
@pytest.mark.parametrize(
    "plain", [pytest.param(False, id="metadata", marks=pytest.mark.triton_compat), pytest.param(True, id="plain")]
)
def test_second_segmented_call_is_bound_and_bit_equal(monkeypatch, plain, segmented_full_path):
    """The first segmented call on a metadata plans (Triton's launch path, the segment tables)
    and binds itself to the metadata; the second call of the layout (another layer: other inputs
    and initial state) takes the binding: no planning, no Triton launch path, one launch per
    kernel with the first call's fixed values and the new call's addresses, and (run by the
    interpreter on those addresses) the bits of the full path on the same inputs. A third with
    another initial state and without one, the same. ``plain``: the calls pass no metadata (as
    FLA's users call it): the layout's remembered metadata carries the binding (its full path
    gives the prepared metadata's bits: checked on the first layer)."""
    import types

    from kernels import _common, chunk_gdn, chunk_launch, chunk_segmented_launch

    monkeypatch.setattr(_common, "_REMEMBERED", {})
    layer1, layer2, h0a, h0b, meta, want = segmented_full_path
    if plain:
        kw = dict(use_qk_l2norm=True, state_segments=SEG)
        meta = _common.remembered_metadata(layer1[0], None, None, 1, None)
        full = chunk_gated_delta_rule(*layer1, initial_state=h0a, **kw)
        assert all(torch.equal(a, b) for a, b in zip(full, want[0]))
        assert meta.calls == {}  # nothing binds on a CPU
    else:
        kw = dict(use_qk_l2norm=True, chunk_metadata=meta, state_segments=SEG)
    records = []
    real_launches = chunk_segmented.launches

    def recording(*a, **k):
        records.append(real_launches(*a, **k))
        return records[-1]

    monkeypatch.setattr(chunk_segmented, "launches", recording)
    monkeypatch.setattr(chunk_gdn, "_segmented_binds", lambda *a: True)
    launchers = []  # make_launcher is called once a kernel, in launch order

    def interpreting(ck):
        launchers.append(_interpreting_launcher(records[0], len(launchers)))
        return launchers[-1]

    monkeypatch.setattr(chunk_segmented_launch, "make_launcher", interpreting)
    hooks = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(chunk_launch, "_RUNTIME", [lambda index: 7, hooks])
    bindings = chunk_segmented_launch.BINDINGS[0]
    got = [t.clone() for t in chunk_gated_delta_rule(*layer1, initial_state=h0a, **kw)]
    assert chunk_segmented_launch.BINDINGS[0] == bindings + 1 and len(records) == 1 and len(launchers) == 6
    (key,) = meta.calls
    assert key[:2] == ("segmented", SEG)
    assert isinstance(meta.calls[key], chunk_segmented_launch.SegmentedBound)
    for a, b in zip(got, want[0]):
        assert torch.equal(a, b)

    def no_planning(*a, **k):
        raise AssertionError("a bound call planned again")

    real_triton_call, real_tables = chunk_gdn._triton_call, chunk_segmented.SegmentTables
    monkeypatch.setattr(chunk_gdn, "_triton_call", no_planning)
    monkeypatch.setattr(chunk_segmented, "SegmentTables", no_planning)
    for (x, h0), expected in zip(((layer2, h0b), (layer2, None)), want[1:]):
        got = chunk_gated_delta_rule(*x, initial_state=h0, **kw)
        assert len(records) == 1 and chunk_segmented_launch.BINDINGS[0] == bindings + 1
        for a, b in zip(got, expected):
            assert torch.equal(a, b)
    # the serial call on the same metadata is not served by the segmented binding
    monkeypatch.setattr(chunk_gdn, "_triton_call", real_triton_call)
    monkeypatch.setattr(chunk_segmented, "SegmentTables", real_tables)
    serial = chunk_gated_delta_rule(*layer2, initial_state=h0b, use_qk_l2norm=True, chunk_metadata=meta)
    assert not torch.equal(serial[1], want[1][1])


def test_segmented_launchers_take_the_c_launcher_or_tritons_wrapper():
    """``make_launcher``: None for what is not a compiled kernel (the interpreter's launches), the
    C launcher where ``raw_launcher`` knows its form, else Triton's wrapper called as
    ``CompiledKernel.run`` takes it."""
    from kernels import chunk_segmented_launch

    assert chunk_segmented_launch.make_launcher(None) is None
    calls = []
    ck = type("Compiled", (), {})()
    ck.run, ck.function, ck.packed_metadata = (lambda *a: calls.append(a)), 0xF00, (4, 1, 0)
    launch = chunk_segmented_launch.make_launcher(ck)  # a plain function: no C launcher form known
    launch(3, 2, 1, 7, (0x1000, 5))
    assert calls == [(3, 2, 1, 7, 0xF00, (4, 1, 0), None, None, None, 0x1000, 5)]
    del ck.packed_metadata
    assert chunk_segmented_launch.make_launcher(ck) is None


def test_segmented_binding_keys_apart_from_the_serial_one():
    """A segmented binding's key never equals a serial binding's (the options tuple), and holds
    ``state_segments`` as given (None: the environment's, which the options hold)."""
    from kernels import chunk_gdn, chunk_segmented_launch

    options = chunk_gdn._bound_key(0.25, 1, True, torch.float32, False, False, torch.float16, None)
    keys = {chunk_segmented_launch.bound_key(s, options) for s in (None, 8, 16, "auto")}
    assert len(keys) == 4 and options not in keys


@pytest.mark.gpu
@pytest.mark.parametrize(
    "h,hv,seg,plain", [(4, 8, 16, False), (4, 8, 32, True), (4, 8, "auto", True), (16, 32, "auto", True)]
)
def test_gpu_plain_segmented_calls_are_bound_and_bit_equal(h, hv, seg, plain, monkeypatch):
    """8K tokens, K = V = 128, bf16, on prepared metadata or (``plain``) none: the first calls
    plan, later ones take the binding (no new one made; at 16/32 heads "auto" picks the serial loop
    and its binding serves "auto"), and every call's output, final and boundary states equal, bit
    for bit, those of Triton's launch path (``KERNELS_LAUNCH=triton``) on the same inputs, layer
    after layer (other inputs, with and without an initial state)."""
    from kernels import _common, chunk_gdn, chunk_launch, chunk_segmented_launch

    T = 8192
    layers = [
        make_inputs(T, h=h, hv=hv, dk=128, dv=128, seed=s, dtype=torch.bfloat16, device="cuda", gate_scale=0.002,
                    beta_scale=1.0)
        for s in (51, 52)
    ]  # fmt: skip
    if plain:
        meta, meta_kw = _common.remembered_metadata(layers[0][0], None, None, 1, None), {}
    else:
        meta = prepare_chunk_metadata([0, T], device="cuda")
        meta_kw = dict(chunk_metadata=meta)
    states = [rand_state(1, hv=hv, dk=128, dv=128, seed=53, device="cuda"), None]
    kw = dict(use_qk_l2norm=True, state_segments=seg)
    monkeypatch.setattr(chunk_gdn, "_DIRECT", False)
    want = [[t.clone() for t in chunk_gated_delta_rule(*x, initial_state=h0, **kw)] for x in layers for h0 in states]
    monkeypatch.setattr(chunk_gdn, "_DIRECT", True)
    made = []
    for rnd in range(3):
        for i, (x, h0) in enumerate((x, h0) for x in layers for h0 in states):
            got = chunk_gated_delta_rule(*x, initial_state=h0, **meta_kw, **kw)
            for a, b in zip(got, want[i]):
                assert torch.equal(a, b), (rnd, i)
        made.append(chunk_segmented_launch.BINDINGS[0])
    assert made[1] == made[2]  # nothing planned after the first rounds
    bound = meta.calls[chunk_segmented_launch.bound_key(seg, chunk_gdn._bound_key(
        128**-0.5, 1, True, torch.float32, False, False, torch.bfloat16, None))]  # fmt: skip
    serial = hv == 32
    assert isinstance(bound, chunk_launch._Bound)
    assert isinstance(bound, chunk_segmented_launch.SegmentedBound) != serial
    if serial:  # "auto" ran the serial loop: its bits
        plain_serial = chunk_gated_delta_rule(*layers[0], initial_state=states[0], use_qk_l2norm=True)
        assert all(torch.equal(a, b) for a, b in zip(plain_serial, want[0]))


def test_plain_calls_remember_their_layouts_metadata():
    """A call without ``chunk_metadata`` builds its layout's metadata once: a second call of the
    layout (offsets as a list or a CPU tensor alike) builds none and gives the same bits; another
    start position or boundary selection is another layout; offsets that do not fit the inputs
    are the call's own one-line errors, remembering nothing."""
    from kernels import _common

    x = make_inputs(200, seed=61)
    builds = _common.REMEMBERED_BUILDS[0]
    a = chunk_gated_delta_rule(*x, cu_seqlens=[0, 70, 200], start_positions=[5, 0], use_qk_l2norm=True)
    assert _common.REMEMBERED_BUILDS[0] in (builds, builds + 1)  # another test may have built it
    builds = _common.REMEMBERED_BUILDS[0]
    meta = _common.remembered_metadata(x[0], torch.tensor([0, 70, 200]), (5, 0), 1, None)
    b = chunk_gated_delta_rule(
        *x, cu_seqlens=torch.tensor([0, 70, 200]), start_positions=torch.tensor([5, 0]), use_qk_l2norm=True
    )
    assert _common.REMEMBERED_BUILDS[0] == builds
    assert meta is _common.remembered_metadata(x[0], [0, 70, 200], [5, 0], 1, None)
    assert meta.cu_seqlens == [0, 70, 200] and meta.start_positions == [5, 0]
    fresh = chunk_gated_delta_rule(*x, chunk_metadata=prepare_chunk_metadata([0, 70, 200], [5, 0]), use_qk_l2norm=True)
    for p, q2, r in zip(a, b, fresh):
        assert torch.equal(p, r) and torch.equal(q2, r)
    other = _common.remembered_metadata(x[0], [0, 70, 200], [6, 0], 1, None)
    assert other is not meta and other.start_positions == [6, 0]
    sparse = _common.remembered_metadata(x[0], [0, 70, 200], [5, 0], 2, None)
    assert sparse is not meta and sparse.num_boundaries < meta.num_boundaries
    assert _common.remembered_metadata(x[0], [0, 70, 200], [5, 0], 1, [[64], [128]]).num_boundaries == 2
    with pytest.raises(ValueError, match="start_positions has 1 entries for 2 sequences"):
        chunk_gated_delta_rule(*x, cu_seqlens=[0, 70, 200], start_positions=[5])
    assert _common.remembered_metadata(x[0], [0, 70, 200], [5], 1, None) is None
    x2 = [torch.cat([t, t]) for t in x]  # two sequences as a batch: offsets need B == 1
    with pytest.raises(ValueError, match="cu_seqlens needs B == 1"):
        chunk_gated_delta_rule(*x2, cu_seqlens=[0, 70, 200])
    assert _common.remembered_metadata(x2[0], [0, 70, 200], None, 1, None) is None


def test_offsets_that_are_not_plain_ints_are_never_remembered():
    """Offsets given as neither ints nor a CPU tensor (here numpy integers, a list of them) are no
    layout ``remembered_metadata`` keys on: None, and nothing remembered under the call without
    offsets, which keeps its one sequence of 200 (mutation survivor of ``_common._host_ints``: its
    last ``False`` as None read such offsets as none and remembered the varlen metadata as the
    dense layout's)."""
    import numpy as np

    from kernels import _common

    x = make_inputs(200, seed=62)
    odd = [np.int64(0), np.int64(70), np.int64(200)]
    assert _common.remembered_metadata(x[0], odd, None, 1, None) is None
    assert _common.remembered_metadata(x[0], None, [np.int64(5)], 1, None) is None
    dense = _common.remembered_metadata(x[0], None, None, 1, None)
    assert dense.cu_seqlens == [0, 200] and dense.start_positions == [0]
