"""The chunked SSD (Mamba2) forward (``kernels.ssd``, Triton; ``kernels.torch_ssd``, plain torch)
against the per-token recurrence of ``kernels.ssd_reference``: outputs, final states, the states
at every emitted 64-token boundary; resuming from an emitted state gives the uninterrupted run's
bits; varlen with initial states and ragged (non-64-aligned) starts; fp32, fp16 and bf16.

Shapes are the Mamba2 layers of the presets scaled down for the interpreter: head dim 64, state
dim 64 / 128, 1 or 8 groups (marconi-7b: 128 heads x 64, d_state 128, 1 group in the paper's
formulas; Nemotron-H 8B: 128 heads x 64, d_state 128, 8 groups). The GPU tests run those shapes.

Tolerances: fp32 against the fp32 oracle 2e-4 relative to the output's scale (the chunked form
sums in another order and goes through exp(gamma_i - gamma_j); observed ~1e-6). 16-bit inputs are
fed to the oracle as the same rounded values; the kernels round the chunk products' operands to
the input dtype (as mamba_ssm does), so 2e-2 relative. In the interpreter a bf16 call multiplies
fp32 operands (its bf16 products are wrong, triton-lang/triton#11584), fp16 ones in fp16.
"""

import math
import warnings
import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


from kernels import prepare_chunk_metadata  # noqa: E402
from kernels.conv import causal_conv1d  # noqa: E402
import kernels.ssd as ssd  # noqa: E402
from kernels.ssd import chunk_ssd  # noqa: E402
from kernels.ssd_reference import naive_ssd  # noqa: E402
from kernels.torch_ssd import chunk_ssd as torch_chunk_ssd  # noqa: E402

IMPLS = {"triton": chunk_ssd, "torch": torch_chunk_ssd}
#: `make test` runs the Triton half of these tests on the newest Triton too (the torch half is the
#: same code whatever Triton is installed)
IMPL = pytest.mark.parametrize("impl", [pytest.param("triton", marks=pytest.mark.triton_compat), "torch"])
#: the tests that run no torch twin: on the newest Triton too
COMPAT = pytest.mark.triton_compat


def make(gen, T, H, P, N, G, *, dtype=torch.float32, device="cpu", nseq=1):
    """Inputs scaled like a trained Mamba2 layer's: dt near softplus(-2..0), A in [-8, -1]."""

    def r(*s):
        return torch.randn(*s, generator=gen)

    x = r(1, T, H, P)
    dt = r(1, T, H) - 1.0
    A = -torch.exp(torch.rand(H, generator=gen) * math.log(8.0))
    B = r(1, T, G, N) / math.sqrt(N)
    C = r(1, T, G, N)
    D = r(H)
    bias = 0.5 * r(H)
    h0 = 0.5 * r(nseq, H, P, N)
    cast = [t.to(device=device, dtype=dtype) for t in (x, dt, B, C)]
    rest = [t.to(device) for t in (A, D, bias, h0)]
    x, dt, B, C = cast
    A, D, bias, h0 = rest
    return x, dt, A, B, C, D, bias, h0


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item() if b.numel() else 0.0


def check(res, ref, tol):
    (y, ht, hb), (ry, rf, rb, _) = res, ref
    assert hb.shape == rb.shape
    assert rel(y, ry) < tol, rel(y, ry)
    assert rel(ht, rf) < tol, rel(ht, rf)
    assert rel(hb, rb) < tol, rel(hb, rb)


@IMPL
@pytest.mark.parametrize(
    "T,H,P,N,G",
    [
        (1, 4, 64, 64, 1),
        (64, 4, 64, 64, 2),
        (70, 8, 64, 128, 8),
        (130, 4, 64, 128, 1),
        (100, 2, 48, 40, 1),
        (70, 2, 64, 256, 1),
    ],  # d_state 256 (Falcon-H1): the P block drops to 32
)
def test_single_sequence_fp32(impl, T, H, P, N, G):
    gen = torch.Generator().manual_seed(T + H + N)
    x, dt, A, B, C, D, bias, _ = make(gen, T, H, P, N, G)
    res = IMPLS[impl](x, dt, A, B, C, D=D, dt_bias=bias)
    ref = naive_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
    assert ref[3] == [[64 * (i + 1) for i in range(T // 64)]]
    check(res, ref, 2e-4)
    assert res[0].dtype == x.dtype and res[1].dtype == res[2].dtype == torch.float32


@IMPL
def test_varlen_initial_states_ragged_starts(impl):
    """Four sequences, two with an incoming state, starts off the 64 grid (ragged first chunks),
    one empty: the per-sequence outputs, final and boundary states."""
    gen = torch.Generator().manual_seed(7)
    H, P, N, G = 4, 64, 64, 2
    cu, starts = [0, 50, 50, 180, 300], [0, 10, 64, 100]
    x, dt, A, B, C, D, bias, h0 = make(gen, 300, H, P, N, G, nseq=4)
    h0[0] = 0  # a fresh sequence beside resumed ones
    kw = dict(D=D, dt_bias=bias, initial_state=h0, cu_seqlens=cu, start_positions=starts)
    res = IMPLS[impl](x, dt, A, B, C, **kw)
    ref = naive_ssd(x, dt, A, B, C, **kw)
    assert ref[3] == [[], [], [128, 192], [128, 192]]
    check(res, ref, 2e-4)
    assert torch.equal(res[1][1], h0[1])  # the empty sequence keeps its state


@IMPL
def test_options_dt_limit_no_softplus_per_channel_D(impl):
    gen = torch.Generator().manual_seed(3)
    H, P, N, G, T = 4, 32, 64, 1, 140
    x, dt, A, B, C, _, _, _ = make(gen, T, H, P, N, G)
    Dp = torch.randn(H, P, generator=gen)
    dtp = torch.rand(1, T, H, generator=gen) * 0.3  # already positive: no softplus
    for kw in (dict(dt_softplus=False), dict(dt_limit=(0.05, 0.2))):
        res = IMPLS[impl](x, dtp, A, B, C, D=Dp, **kw)
        ref = naive_ssd(x, dtp, A, B, C, D=Dp, **kw)
        check(res, ref, 2e-4)
    res = IMPLS[impl](x, dt, A, B, C)  # neither D nor dt_bias
    check(res, naive_ssd(x, dt, A, B, C), 2e-4)


@IMPL
def test_boundary_selection_and_state_dtype(impl):
    gen = torch.Generator().manual_seed(4)
    H, P, N, G, T = 2, 32, 32, 1, 260
    x, dt, A, B, C, D, bias, _ = make(gen, T, H, P, N, G)
    _, rf, rb, pos = naive_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
    assert pos == [[64, 128, 192, 256]]
    f = IMPLS[impl]
    _, _, hb = f(x, dt, A, B, C, D=D, dt_bias=bias, boundary_indices=[128, 256])
    assert rel(hb, rb[[1, 3]]) < 2e-4
    _, _, hb = f(x, dt, A, B, C, D=D, dt_bias=bias, boundary_stride=2)
    assert rel(hb, rb[[1, 3]]) < 2e-4
    _, _, hb = f(x, dt, A, B, C, D=D, dt_bias=bias, state_dtype=torch.bfloat16)
    assert hb.dtype == torch.bfloat16 and rel(hb, rb) < 1e-2
    y, ht, hb = f(x, dt, A, B, C, D=D, dt_bias=bias, boundary_states=False)
    assert hb is None and rel(ht, rf) < 2e-4


@IMPL
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resume_from_an_emitted_state_equals_running_through(impl, dtype):
    """A call resumed at boundary b from the emitted state gives the suffix's outputs, the later
    boundary states and the final state bit for bit; so does a varlen batch of resumed calls in
    the Triton kernels (one program a chunk and head, whatever else the call holds). The torch
    implementation's batched products may round differently at another batch size: 1e-6 there."""
    gen = torch.Generator().manual_seed(5)
    H, P, N, G, T = 2, 32, 64, 2, 200
    x, dt, A, B, C, D, bias, _ = make(gen, T, H, P, N, G, dtype=dtype)
    f = IMPLS[impl]
    y, ht, hb = f(x, dt, A, B, C, D=D, dt_bias=bias)
    assert hb.shape[0] == 3
    for i, p in enumerate((64, 128, 192)):
        y2, h2, hb2 = f(
            *(t[:, p:] for t in (x, dt)), A, *(t[:, p:] for t in (B, C)), D=D, dt_bias=bias,
            initial_state=hb[i : i + 1], start_positions=[p],
        )  # fmt: skip
        assert torch.equal(y2, y[:, p:]) and torch.equal(h2, ht) and torch.equal(hb2, hb[i + 1 :])
    # the three resumes as one varlen call
    cat = lambda t: torch.cat([t[:, p:] for p in (64, 128, 192)], dim=1)  # noqa: E731
    n = [T - p for p in (64, 128, 192)]
    cu = [0, n[0], n[0] + n[1], sum(n)]
    y3, h3, hb3 = f(
        cat(x), cat(dt), A, cat(B), cat(C), D=D, dt_bias=bias, initial_state=hb, cu_seqlens=cu,
        start_positions=[64, 128, 192],
    )  # fmt: skip
    want = (cat(y), ht.expand(3, -1, -1, -1), torch.cat([hb[1:], hb[2:]]))
    for got, exp in zip((y3, h3, hb3), want):
        assert torch.equal(got, exp) if impl == "triton" else rel(got, exp) < 1e-6


@COMPAT
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype):
    gen = torch.Generator().manual_seed(6)
    H, P, N, G, T = 4, 64, 128, 2, 80
    x, dt, A, B, C, D, bias, h0 = make(gen, T, H, P, N, G, dtype=dtype)
    kw = dict(D=D, dt_bias=bias, initial_state=h0, start_positions=[30])
    ref = naive_ssd(x, dt, A, B, C, **kw)  # the oracle reads the same rounded inputs
    res = chunk_ssd(x, dt, A, B, C, **kw)
    assert res[0].dtype == dtype
    check(res, ref, 2e-2)
    check(torch_chunk_ssd(x, dt, A, B, C, **kw), ref, 8e-3)  # fp32 products; bf16 output rounding 2^-8


@COMPAT
@pytest.mark.parametrize("variant", ["FUSE=1", "PREP=1"])
def test_state_loop_variants(monkeypatch, variant):
    """``FUSE=1`` (the output computed in the state loop, opt-in) and ``PREP=1`` (dt and gamma from
    a parallel kernel ahead of the loop) against the oracle, and their resume from an emitted state
    bit for bit, on varlen with ragged starts."""
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", variant)
    gen = torch.Generator().manual_seed(11)
    H, P, N, G = 4, 32, 64, 2
    cu, starts = [0, 90, 200], [0, 30]
    x, dt, A, B, C, D, bias, h0 = make(gen, 200, H, P, N, G, nseq=2)
    kw = dict(D=D, dt_bias=bias, initial_state=h0, cu_seqlens=cu, start_positions=starts)
    res = chunk_ssd(x, dt, A, B, C, **kw)
    check(res, naive_ssd(x, dt, A, B, C, **kw), 2e-4)
    y, ht, hb = res  # boundaries: 64 (sequence 0), 64 and 128 (sequence 1)
    p = 64  # sequence 1 resumed at its boundary 64: its tokens from row 90 + 34
    y2, h2, hb2 = chunk_ssd(
        x[:, 124:], dt[:, 124:], A, B[:, 124:], C[:, 124:], D=D, dt_bias=bias, initial_state=hb[1:2],
        start_positions=[p],
    )  # fmt: skip
    assert torch.equal(y2, y[:, 124:]) and torch.equal(h2, ht[1:]) and torch.equal(hb2, hb[2:])
    # the step size's options go through the variant's dt path too (clamped, then without softplus)
    for opt in (dict(dt_limit=(0.05, 0.2)), dict(dt_softplus=False)):
        check(chunk_ssd(x, dt.abs(), A, B, C, **kw, **opt), naive_ssd(x, dt.abs(), A, B, C, **kw, **opt), 2e-4)


@COMPAT
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_boundary_states_by_bulk_copies_give_the_plain_bits(monkeypatch, dtype):
    """``TMA_B=1`` (opt-in): the loop writes each emitted boundary state by a bulk tensor copy
    through a descriptor of ``hb`` (skipping the chunks that emit none) instead of a masked store at
    every chunk: the same outputs, final and boundary states bit for bit, on ragged varlen with
    initial states, every boundary, every second one (chunks with no slot), bf16 states and none;
    the descriptor is made only where one program's block is one whole state."""
    gen = torch.Generator().manual_seed(21)
    H, P, N, G = 4, 64, 64, 2
    cu, starts = [0, 150, 330], [0, 40]
    x, dt, A, B, C, D, bias, h0 = make(gen, 330, H, P, N, G, nseq=2, dtype=dtype)
    kw = dict(D=D, dt_bias=bias, initial_state=h0, cu_seqlens=cu, start_positions=starts)
    opts = ({}, {"boundary_stride": 2}, {"state_dtype": torch.bfloat16}, {"boundary_states": False})
    made = []
    real = ssd._boundary_descriptor
    monkeypatch.setattr(ssd, "_boundary_descriptor", lambda *a: made.append(real(*a)) or made[-1])
    runs = {}
    for v in ("BP=64", "BP=64,TMA_B=1"):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", v)
        runs[v] = [chunk_ssd(x, dt, A, B, C, **kw, **opt) for opt in opts]
    assert len(made) == 3 and all(d is not None for d in made)  # not made without boundaries
    for plain, tma in zip(runs["BP=64"], runs["BP=64,TMA_B=1"]):
        assert torch.equal(plain[0], tma[0]) and torch.equal(plain[1], tma[1])
        assert (plain[2] is None and tma[2] is None) or torch.equal(plain[2], tma[2])
    assert runs["BP=64"][1][2].shape[0] == 2 and runs["BP=64"][2][2].dtype == torch.bfloat16
    # a block that is not one whole state: no descriptor (the plain store)
    hb = torch.empty(3, H, 48, 40)
    assert ssd._boundary_descriptor(hb, 32, 64, 48, 40) is None
    assert ssd._boundary_descriptor(hb, 64, 64, 48, 40) is None  # BN 64 over N 40
    assert ssd._boundary_descriptor(torch.empty(3, H, 32, 64), 32, 64, 32, 64) is not None


def test_bulk_copies_are_chosen_where_few_chunks_emit_a_state():
    """``TMA_B=2``, the overlapped loop's default: bulk copies only where at most one chunk in
    ``TMA_SPARSE_CHUNKS`` (4) emits a boundary state (measured faster there, slower at every
    chunk); 0 never, 1 wherever a state is stored; any other value is refused."""
    assert ssd.SSD_CONFIGS["state"]["half-ovl"]["TMA_B"] == ssd.TMA_SPARSE == 2
    assert ssd.SSD_CONFIGS["state"]["half"]["TMA_B"] == ssd.SSD_CONFIGS["state"]["fp32"]["TMA_B"] == 0
    # the fused program (WS) is the overlapped (Hopper) call's default, nowhere else's
    assert ssd.SSD_CONFIGS["state"]["half-ovl"]["WS"] == 1
    assert ssd.SSD_CONFIGS["state"]["half"]["WS"] == ssd.SSD_CONFIGS["state"]["fp32"]["WS"] == 0
    assert ssd.TMA_SPARSE_CHUNKS == 4
    assert ssd._bulk_boundaries(2, 4, 16) and ssd._bulk_boundaries(2, 1, 4)
    assert not ssd._bulk_boundaries(2, 5, 16) and not ssd._bulk_boundaries(2, 2, 7)
    assert not ssd._bulk_boundaries(2, 0, 16)  # nothing stored
    assert ssd._bulk_boundaries(1, 16, 16) and not ssd._bulk_boundaries(0, 1, 16)
    with pytest.raises(ValueError, match="TMA_B is 3, not 0, 1 or 2"):
        ssd._bulk_boundaries(3, 1, 16)


@COMPAT
def test_sparse_bulk_copies_follow_the_emitted_count(monkeypatch):
    """``TMA_B=2`` end to end: over 16 chunks the descriptor is made for a state every 4th chunk
    (4 of 16) and not for every 2nd (8) or every chunk; each gives the plain store's bits."""
    gen = torch.Generator().manual_seed(23)
    x, dt, A, B, C, D, bias, _ = make(gen, 1024, 2, 64, 64, 1, dtype=torch.bfloat16)
    made = []
    real = ssd._boundary_descriptor
    monkeypatch.setattr(ssd, "_boundary_descriptor", lambda *a: made.append(a[0].shape[0]) or real(*a))
    for stride in (1, 2, 4):
        runs = []
        for v in ("BP=64", "BP=64,TMA_B=2"):
            monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", v)
            runs.append(chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, boundary_stride=stride))
        assert all(torch.equal(a, b) for a, b in zip(*runs))
        assert runs[0][2].shape[0] == 16 // stride
    assert made == [4]


@COMPAT
def test_discard_is_a_gpu_option_the_interpreter_leaves_out(monkeypatch):
    """``KERNELS_CONFIG_SSD_OUT=DISCARD=1`` (opt-in: the output drops the chunk-start copy's L2
    lines after reading them, PTX ``discard.global.L2``, which the interpreter does not run): on the
    CPU the call runs without it and gives the default's bits; an unknown key is still refused."""
    gen = torch.Generator().manual_seed(22)
    x, dt, A, B, C, D, bias, _ = make(gen, 140, 2, 64, 64, 1)
    runs = []
    for v in ("DISCARD=0", "DISCARD=1"):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_OUT", v)
        runs.append(chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    monkeypatch.setenv("KERNELS_CONFIG_SSD_OUT", "DISCARDS=1")
    with pytest.raises(ValueError, match="unknown key 'DISCARDS'"):
        chunk_ssd(x, dt, A, B, C)


@COMPAT
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dt_from_the_prep_kernel_gives_the_loops_bits(monkeypatch, dtype):
    """``PREP=1`` computes dt and gamma in a kernel of their own with the loop's own code
    (``_chunk_dt``): the outputs, final and boundary states are the loop's bits (on the H200 too,
    session 16), with a clamp, a bias and ragged varlen starts."""
    gen = torch.Generator().manual_seed(12)
    H, P, N, G = 4, 32, 64, 2
    cu, starts = [0, 70, 230], [5, 64]
    x, dt, A, B, C, D, bias, h0 = make(gen, 230, H, P, N, G, nseq=2, dtype=dtype)
    kw = dict(D=D, dt_bias=bias, initial_state=h0, cu_seqlens=cu, start_positions=starts, dt_limit=(0.01, 2.0))
    runs = []
    for prep in ("PREP=0", "PREP=1"):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", prep)
        runs.append(chunk_ssd(x, dt, A, B, C, **kw))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@COMPAT
def test_inputs_with_a_strided_last_dim_give_the_contiguous_bits():
    """x, B and C as views whose last dimension is not unit-strided (every second element of a
    wider tensor, as a slice of a fused projection can be; or broadcast, stride 0) are made
    contiguous before the kernels, which index that dimension as unit-strided: the contiguous
    inputs' bits."""
    gen = torch.Generator().manual_seed(13)
    H, P, N, G, T = 2, 32, 32, 1, 70
    x, dt, A, B, C, D, bias, _ = make(gen, T, H, P, N, G)

    def strided(t):
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t
        view = wide[..., ::2]
        assert view.stride(-1) == 2
        return view

    want = chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
    got = chunk_ssd(strided(x), dt, A, strided(B), strided(C), D=D, dt_bias=bias)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    # a last dimension broadcast (stride 0): C the same across N
    c1 = C[..., :1]
    want = chunk_ssd(x, dt, A, B, c1.expand_as(C).contiguous(), D=D, dt_bias=bias)
    got = chunk_ssd(x, dt, A, B, c1.expand_as(C), D=D, dt_bias=bias)
    assert all(torch.equal(a, b) for a, b in zip(want, got))


@COMPAT
def test_triton_equals_torch_on_shared_metadata():
    """Both implementations on one prepared metadata (as a model step shares it across layers)."""
    gen = torch.Generator().manual_seed(8)
    H, P, N, G = 4, 64, 64, 1
    cu, starts = [0, 70, 200], [64, 3]
    x, dt, A, B, C, D, bias, h0 = make(gen, 200, H, P, N, G, nseq=2)
    meta = prepare_chunk_metadata(cu, starts, boundary_indices=[[128], [64, 128]])
    a = chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, initial_state=h0, chunk_metadata=meta)
    b = torch_chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, initial_state=h0, chunk_metadata=meta)
    assert a[2].shape[0] == 3
    for u, v in zip(a, b):
        assert rel(u, v) < 2e-5


@COMPAT
def test_mixer_core_resumes_with_conv_window_and_state():
    """The Mamba2 mixer's recurrent part: conv1d over xBC (x, B, C channels), then the SSD.
    Resuming at a boundary from the conv window and the SSD state emitted there (the same
    metadata's boundaries) reproduces the uninterrupted run's outputs and states exactly."""
    gen = torch.Generator().manual_seed(9)
    H, P, N, G, T = 2, 32, 32, 1, 200
    d_in = H * P
    dim = d_in + 2 * G * N
    xbc = torch.randn(1, T, dim, generator=gen)
    w, wb = torch.randn(dim, 4, generator=gen) * 0.5, torch.randn(dim, generator=gen) * 0.1
    dt = torch.randn(1, T, H, generator=gen) - 1
    A, D = -torch.rand(H, generator=gen) - 0.5, torch.randn(H, generator=gen)

    def core(xs, dts, start, conv_state, state):
        meta = prepare_chunk_metadata([0, xs.shape[1]], [start])
        u, cf, cb = causal_conv1d(xs, w, wb, conv_state=conv_state, chunk_metadata=meta)
        xx = u[..., :d_in].reshape(1, -1, H, P)
        Bm = u[..., d_in : d_in + G * N].reshape(1, -1, G, N)
        Cm = u[..., d_in + G * N :].reshape(1, -1, G, N)
        y, ht, hb = chunk_ssd(xx, dts, A, Bm, Cm, D=D, initial_state=state, chunk_metadata=meta)
        return y, ht, hb, cf, cb

    y, ht, hb, cf, cb = core(xbc, dt, 0, None, None)
    assert hb.shape[0] == cb.shape[0] == 3
    y2, ht2, hb2, cf2, cb2 = core(xbc[:, 128:], dt[:, 128:], 128, cb[1:2], hb[1:2])
    assert torch.equal(y2, y[:, 128:]) and torch.equal(ht2, ht) and torch.equal(cf2, cf)
    assert torch.equal(hb2, hb[2:]) and torch.equal(cb2, cb[2:])


@IMPL
def test_bad_arguments_are_one_line_errors(impl):
    gen = torch.Generator().manual_seed(10)
    x, dt, A, B, C, D, bias, h0 = make(gen, 10, 4, 16, 16, 2)
    f = IMPLS[impl]
    cases = [
        (lambda: f(x, dt, A, B[:, :, :1].expand(1, 10, 3, 16), C), "bad shapes"),
        (lambda: f(x, dt[..., :2], A, B, C), "dt must be"),
        (lambda: f(x, dt, A[:2], B, C), "A must be"),
        (lambda: f(x, dt, A, B, C, D=D[:2]), "D must be"),
        (lambda: f(x, dt, A, B, C, dt_bias=bias[:1]), "dt_bias must be"),
        (lambda: f(x, dt, A, B, C, initial_state=h0[:, :2]), "initial_state must be"),
        (lambda: f(x, dt, A, B, C, state_dtype=torch.float64), "state_dtype"),
        (lambda: f(x.double(), dt, A, B, C), "dtype"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError, match=msg) as exc:
            call()
        assert "\n" not in str(exc.value)


# ---- GPU: the presets' shapes, compiled --------------------------------------------------------

#: (name, heads, head dim, d_state, groups): marconi-7b (Mamba2 defaults at d_model 4096, the
#: paper's one group), Nemotron-H 8B (mamba_num_heads 128, mamba_head_dim 64, ssm_state_size 128,
#: n_groups 8) and 56B (256 heads)
GPU_SHAPES = [("marconi-7b", 128, 64, 128, 1), ("nemotron-h-8b", 128, 64, 128, 8), ("nemotron-h-56b", 256, 64, 128, 8)]


def _cuda_case(name, H, P, N, G, dtype, T=2000):
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))  # str hash() varies by process
    cu, starts = [0, 700, T], [0, 100]
    x, dt, A, B, C, D, bias, h0 = make(gen, T, H, P, N, G, dtype=dtype, device="cuda", nseq=2)
    h0[0] = 0
    kw = dict(D=D, dt_bias=bias, initial_state=h0, cu_seqlens=cu, start_positions=starts)
    return (x, dt, A, B, C), kw


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,H,P,N,G", GPU_SHAPES)
def test_gpu_preset_shapes(name, H, P, N, G, dtype):
    args, kw = _cuda_case(name, H, P, N, G, dtype)
    ref = naive_ssd(*args, **kw)
    res = chunk_ssd(*args, **kw)
    tol = 1e-3 if dtype == torch.float32 else 2e-2  # bf16 outputs alone round by up to 2^-9
    check(res, ref, tol)
    check(torch_chunk_ssd(*args, **kw), ref, tol)


def _assert_resumes_exactly(args, kw):
    """A call of one sequence resumed at its 1st, 7th and 15th emitted boundary from that state gives
    the uninterrupted call's outputs, later boundary states and final state bit for bit; returns
    the uninterrupted call's (y, final state, boundary states)."""
    x, dt, A, B, C = args
    y, ht, hb = chunk_ssd(x, dt, A, B, C, **kw)
    for i in (0, 6, 14):
        p = 64 * (i + 1)
        y2, h2, hb2 = chunk_ssd(
            *(t[:, p:] for t in (x, dt)), A, *(t[:, p:] for t in (B, C)), initial_state=hb[i : i + 1],
            start_positions=[p], **kw,
        )  # fmt: skip
        assert torch.equal(y2, y[:, p:]) and torch.equal(h2, ht) and torch.equal(hb2, hb[i + 1 :])
    return y, ht, hb


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_resume_is_bit_exact(dtype):
    _, H, P, N, G = GPU_SHAPES[1]
    args, kw = _cuda_case("resume", H, P, N, G, dtype, T=1000)
    _assert_resumes_exactly(args, dict(D=kw["D"], dt_bias=kw["dt_bias"]))


def _mamba_ssm():
    """mamba_ssm's Triton chunked scan, through the benchmark's loader (which enters a source
    tree or a CUDA-less install without the package's ``__init__``), or None."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from ssd_bench import load_mamba_chunk_scan

        return load_mamba_chunk_scan()
    except Exception:  # noqa: BLE001 - absent, or its import fails on this torch / triton
        return None
    finally:
        sys.path.pop(0)


@pytest.mark.gpu
@pytest.mark.parametrize("name,H,P,N,G", GPU_SHAPES[:2])
def test_gpu_against_mamba_ssm(name, H, P, N, G):
    """mamba_ssm's chunked scan (its chunk 256, bf16) and ours agree within bf16 rounding on the
    output and the final state; varlen through its ``seq_idx`` / ``cu_seqlens``."""
    scan = _mamba_ssm()
    if scan is None:
        pytest.skip("mamba_ssm's Triton SSD is not importable")
    args, kw = _cuda_case(name, H, P, N, G, torch.bfloat16, T=2048)
    x, dt, A, B, C = args
    kw = dict(D=kw["D"], dt_bias=kw["dt_bias"])
    y, ht, _ = chunk_ssd(x, dt, A, B, C, **kw)
    ym, hm = scan(x, dt, A, B, C, 256, D=kw["D"], dt_bias=kw["dt_bias"], dt_softplus=True, return_final_states=True)
    ry, rf, _, _ = naive_ssd(x, dt, A, B, C, **kw)
    assert rel(ym, ry) < 2e-2 and rel(y, ry) < 2e-2  # both against the oracle
    assert rel(y, ym) < 2e-2 and rel(ht, hm) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name,H,P,N,G", GPU_SHAPES[:2])
def test_gpu_state_emitting_peers_agree(name, H, P, N, G):
    """``ssd_bench``'s state-emitting peers (mamba_ssm's and FLA's forward pieces at chunk 64 with
    the fp32 chunk states kept) compute what ours does: output, final state and the state at every
    64 tokens within bf16 rounding of ours, so the benchmark's "x st-peer" ratio compares the same
    job. Skips a peer that is not importable."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import ssd_bench

        errs = ssd_bench.state_peer_errors(torch, 1024, H, P, N, G)
    finally:
        sys.path.pop(0)
    if not errs:
        pytest.skip("neither mamba_ssm nor FLA is importable")
    for peer, e in errs.items():
        assert max(e.values()) < 2e-2, (peer, e)


#: the overlapped output (``OVL``: launched programmatically dependent on the state loop, each of
#: its programs waiting on the loop's progress counters; the 16-bit default on Hopper) at the
#: signalling periods and loop configurations ``ssd_bench`` measures
OVL_VARIANTS = [
    "OVL=1",
    "OVL=1,SIG=1",
    "OVL=1,BP=32,num_stages=3",
    "OVL=1,SIG=8,num_warps=4",
    "OVL=1,num_stages=2",
    "OVL=1,TMA_B=1",
]


@pytest.mark.gpu
@pytest.mark.parametrize("state", ["OVL=0", "OVL=1"])
def test_gpu_discarded_start_copies_give_the_plain_bits(monkeypatch, state):
    """``DISCARD=1``: the output kernel drops each chunk-start copy's L2 lines after its one read;
    outputs, final and boundary states are the default's bits, with the output after the loop and
    beside it, over repeated calls (the scratch reused), with every boundary, a stride and none."""
    _, H, P, N, G = GPU_SHAPES[1]
    args, kw = _cuda_case("discard", H, P, N, G, torch.bfloat16, T=3000)
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", f"{state},WS=0")  # the two kernels (WS: no copies to drop)
    runs = {}
    for v in ("DISCARD=0", "DISCARD=1"):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_OUT", v)
        runs[v] = [chunk_ssd(*args, **kw, **opt) for opt in ({}, {"boundary_stride": 4}, {"boundary_states": False})]
        runs[v] += [chunk_ssd(*args, **kw) for _ in range(2)]
    for plain, dropped in zip(runs["DISCARD=0"], runs["DISCARD=1"]):
        assert torch.equal(plain[0], dropped[0]) and torch.equal(plain[1], dropped[1])
        assert (plain[2] is None and dropped[2] is None) or torch.equal(plain[2], dropped[2])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", OVL_VARIANTS)
def test_gpu_overlapped_output_gives_the_plain_bits(monkeypatch, variant):
    """The output kernel beside the state loop reads the chunk-start states as the loop writes
    them: outputs, final and boundary states bit for bit those of the output run after the loop,
    on varlen with a ragged start and initial states, with every boundary, a selection and none,
    and the call repeated (the counters zeroed per call)."""
    _, H, P, N, G = GPU_SHAPES[1]
    args, kw = _cuda_case("overlap", H, P, N, G, torch.bfloat16, T=3000)
    runs = {}
    for v in ("OVL=0", variant):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", f"{v},WS=0")  # the two kernels, not the fused program
        runs[v] = [chunk_ssd(*args, **kw, **opt) for opt in ({}, {"boundary_stride": 4}, {"boundary_states": False})]
        runs[v].append(chunk_ssd(*args, **kw))
    for plain, ovl in zip(runs["OVL=0"], runs[variant]):
        assert torch.equal(plain[0], ovl[0]) and torch.equal(plain[1], ovl[1])
        assert (plain[2] is None and ovl[2] is None) or torch.equal(plain[2], ovl[2])


@pytest.mark.gpu
@pytest.mark.parametrize("name,H,P,N,G", GPU_SHAPES)
@pytest.mark.parametrize("sig", [1, 4])
@pytest.mark.parametrize("variant", ["GLUON=1", "GLUON=2", "GLUON=2,TMA_B=1"])
def test_gpu_gluon_loop_gives_the_triton_loops_bits(monkeypatch, name, H, P, N, G, sig, variant):
    """``GLUON=1`` (``kernels.ssd_gluon``: both state stores straight from the wgmma accumulator)
    runs the Triton loop's recurrence with the decayed state as the product's accumulator, as
    Triton folds it: outputs, final and boundary states bit for bit the Triton loop's, beside the
    output kernel (releases every chunk and every 4), on varlen with a ragged start and initial
    states, with every boundary, a stride and none, the call repeated; and it ran (no fallback).
    So too with the state's columns over two warpgroups (``GLUON=2``) and with the boundary states
    by bulk copies from the two-buffer ring (``TMA_B=1``)."""
    args, kw = _cuda_case(f"gluon-{name}", H, P, N, G, torch.bfloat16, T=3000)
    x, _, _, B, _ = args
    # the Gluon loop takes these inputs on this GPU (else GLUON=1 would run the Triton loop and the
    # comparison below hold trivially: mutation run, session 25, the capability check 9 -> 10 survived)
    assert ssd._gluon_fits(x.device, x.reshape(-1, H, P), B.reshape(-1, G, N), P, N)
    launched = []  # the Gluon loop's launches: it ran, not the Triton loop on both sides
    real = ssd._gluon_loop
    monkeypatch.setattr(ssd, "_gluon_loop", lambda *a, **k: launched.append(k) or real(*a, **k))
    runs = {}
    for v in ("GLUON=0", variant):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", f"{v},SIG={sig},WS=0")
        runs[v] = [chunk_ssd(*args, **kw, **opt) for opt in ({}, {"boundary_stride": 4}, {"boundary_states": False})]
        runs[v].append(chunk_ssd(*args, **kw))
    assert not ssd._GLUON_FAILED, ssd._GLUON_FAILED
    assert len(launched) == 4 and {k["WG"] for k in launched} == {int(variant.split(",")[0].split("=")[1])}
    for tri, glu in zip(runs["GLUON=0"], runs[variant]):
        assert torch.equal(tri[0], glu[0]) and torch.equal(tri[1], glu[1])
        assert (tri[2] is None and glu[2] is None) or torch.equal(tri[2], glu[2])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["GLUON=1", "GLUON=2,TMA_B=1"])
def test_gpu_gluon_loop_resumes_exactly_and_takes_unaligned_rows(monkeypatch, variant):
    """The Gluon loop resumed from an emitted state gives the uninterrupted run's bits; x rows that
    are not 16-byte aligned (a slice one element in) run the Triton loop instead, with its bits."""
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", f"{variant},WS=0")
    _, H, P, N, G = GPU_SHAPES[1]
    args, kw = _cuda_case("gluon-resume", H, P, N, G, torch.bfloat16, T=1000)
    x, dt, A, B, C = args
    kw = dict(D=kw["D"], dt_bias=kw["dt_bias"])
    y, ht, hb = _assert_resumes_exactly(args, kw)
    wide = torch.zeros(*x.shape[:3], P + 1, dtype=x.dtype, device=x.device)
    wide[..., 1:] = x
    xs = wide[..., 1:]  # rows of 65 elements, each starting 2 bytes in
    assert not ssd._gluon_fits(xs.device, xs.reshape(-1, H, P), B.reshape(-1, G, N), P, N)
    res = chunk_ssd(xs, dt, A, B, C, **kw)
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", "GLUON=0,WS=0")
    ref = chunk_ssd(xs, dt, A, B, C, **kw)
    assert all(torch.equal(a, b) for a, b in zip(res, ref))
    assert all(torch.equal(a, b) for a, b in zip(res, (y, ht, hb)))


def _close_in_the_last_place(a, b):
    """``a`` and ``b`` (16-bit) equal but for a few elements a rounding apart: at most 2 % differ, none by
    more than two units in the last place of the larger (bf16: 2^-7 relative) plus 1e-3."""
    a, b = a.float(), b.float()
    diff = (a - b).abs()
    assert (diff > 0).float().mean().item() <= 0.02, (diff > 0).float().mean().item()
    bound = 2.0**-7 * torch.maximum(a.abs(), b.abs()) + 1e-3
    assert bool((diff <= bound).all()), (diff - bound).max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("name,H,P,N,G", GPU_SHAPES)
@pytest.mark.parametrize("dper", [False, True])
def test_gpu_fused_gluon_program_gives_the_loops_states(monkeypatch, name, H, P, N, G, dper):
    """``WS=1`` (``kernels.ssd_fused_gluon``: the loop and its output in one warp-specialised program,
    the chunk-start states through shared memory): final and boundary states bit for bit the
    default's (its state partition is the Gluon loop, whose bits are the Triton loop's), outputs the
    default's but for the last place of a few (it adds the output's two products instead of
    accumulating one onto the other), on varlen with a ragged start and initial states, D per head
    and per channel, with every boundary, a stride and none, the call repeated; and it ran."""
    args, kw = _cuda_case(f"fused-{name}", H, P, N, G, torch.bfloat16, T=3000)
    if dper:
        kw["D"] = torch.linspace(-1.0, 1.0, H * P, device="cuda").reshape(H, P)
    x, _, _, B, C = args
    assert ssd._gluon_fits(x.device, x.reshape(-1, H, P), C.reshape(-1, G, N), P, N)
    launched = []
    real = ssd._fused_gluon
    monkeypatch.setattr(ssd, "_fused_gluon", lambda *a, **k: launched.append(k) or real(*a, **k))
    runs = {}
    for v in ("WS=0", "WS=1"):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", v)
        runs[v] = [chunk_ssd(*args, **kw, **opt) for opt in ({}, {"boundary_stride": 4}, {"boundary_states": False})]
        runs[v].append(chunk_ssd(*args, **kw))
    assert not ssd._GLUON_FAILED, ssd._GLUON_FAILED
    assert len(launched) == 4 and all(k["D_PER_P"] == dper for k in launched)
    for ref, ws in zip(runs["WS=0"], runs["WS=1"]):
        _close_in_the_last_place(ws[0], ref[0])
        assert torch.equal(ref[1], ws[1])
        assert (ref[2] is None and ws[2] is None) or torch.equal(ref[2], ws[2])
    # and against the per-token oracle, as the default is checked
    check(runs["WS=1"][0], naive_ssd(*args, **kw), 2e-2)


@pytest.mark.gpu
def test_gpu_fused_gluon_program_resumes_exactly(monkeypatch):
    """The fused program resumed from an emitted state gives the uninterrupted run's bits (its
    outputs too: the same program on both sides)."""
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", "WS=1")
    _, H, P, N, G = GPU_SHAPES[1]
    args, kw = _cuda_case("fused-resume", H, P, N, G, torch.bfloat16, T=1000)
    _assert_resumes_exactly(args, dict(D=kw["D"], dt_bias=kw["dt_bias"]))


@COMPAT
def test_the_fused_gluon_program_is_a_hopper_option_the_interpreter_leaves_out(monkeypatch):
    """``KERNELS_CONFIG_SSD_STATE=WS=1``: on the CPU the call runs the two kernels and gives the
    default's bits; fp32 inputs (which neither Gluon program takes) accept the keys and ignore them,
    so one setting serves a process's calls of every dtype."""
    gen = torch.Generator().manual_seed(29)
    for dtype in (torch.float16, torch.float32):
        x, dt, A, B, C, D, bias, _ = make(gen, 140, 2, 64, 64, 1, dtype=dtype)
        runs = []
        for v in ("WS=0", "WS=1,GLUON=1"):
            monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", v)
            runs.append(chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias))
        assert all(torch.equal(a, b) for a, b in zip(*runs))


@COMPAT
@pytest.mark.parametrize("compiles", [True, False])
def test_the_fused_program_is_launched_where_it_fits_and_falls_back_whole(monkeypatch, compiles):
    """The host path of ``WS=1``, in the interpreter with the GPU's checks and the Gluon program stubbed:
    where the call overlaps and x, B and C fit the program, it is launched once, a program a sequence
    and head, with the call's strides, shape and flags (the boundary states, D per channel), and its
    output is the call's (nothing else launched); where it does not compile, one warning names the
    error's last line, the failure is remembered, and the two kernels run after each other (not
    beside: no progress counters) and give the oracle's result; C's rows are checked as B's."""
    from kernels import ssd_fused_gluon

    gen = torch.Generator().manual_seed(31)
    H, P, N, G = 4, 64, 64, 2  # two groups: B's and C's row strides (G * N) differ from their column's
    x, dt, A, B, C, D, bias, _ = make(gen, 150, H, P, N, G, dtype=torch.float16)
    D = torch.linspace(-1.0, 1.0, H * P).reshape(H, P)
    ref = naive_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
    calls = []

    class Program:  # the Gluon program as launched: ``kernel[grid](*args, **consts)``
        def __getitem__(self, grid):
            def launch(*a, **k):
                calls.append((grid, a, k))
                if not compiles:
                    raise RuntimeError("ptxas failed\nout of registers")
                a[6].fill_(7.0)  # y: the program's output stands for the call's

            return launch

    failed = []
    monkeypatch.setattr(ssd, "_GLUON_FAILED", failed)
    monkeypatch.setattr(ssd, "_overlaps", lambda dev: True)
    # the device first (a call that swapped it with x would not take the program)
    monkeypatch.setattr(ssd, "_gluon_fits", lambda dev, x2, t2, P, N: isinstance(dev, torch.device))
    monkeypatch.setattr(ssd_fused_gluon, "_gluon_ssd_fused_kernel", Program())
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", "WS=1")
    if compiles:
        y, ht, hb = chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
        assert bool((y == 7.0).all()) and not failed
    else:
        with pytest.warns(UserWarning, match=r"did not compile \(RuntimeError: out of registers\)") as rec:
            y, ht, hb = chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
        assert len(rec) == 1 and len(failed) == 1
        check((y, ht, hb), ref, 2e-2)
    assert len(calls) == 1
    grid, a, k = calls[0]
    assert grid == (1, H) and a[13:20] == (H * P, P, G * N, N, G * N, N, 0)
    assert a[6] is y and a[8] is ht and a[9] is hb  # the program writes the call's own tensors
    assert k == dict(H=H, GROUP=H // G, P=P, N=N, STORE_B=True, HAS_D=True, D_PER_P=True, num_warps=4)
    # no boundary states asked for: the program stores none
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, boundary_states=False)
    assert calls[-1][2]["STORE_B"] is False and len(calls) == 2
    assert calls[-1][1][9] is calls[-1][1][8]  # no boundary tensor: the final state's stands in
    # the program takes C's rows by cp.async too: rows that do not fit (the B check alone would pass)
    # keep the call off it
    x2, B2, C2 = (t.reshape(-1, *t.shape[2:]) for t in (x, B, C))
    monkeypatch.setattr(ssd, "_gluon_fits", lambda dev, xx, t2, P, N: isinstance(dev, torch.device) and t2 is not C2)
    assert not ssd._fused_fits(x.device, x2, B2, C2, P, N) and ssd._fused_fits(x.device, x2, B2, B2, P, N)


@COMPAT
def test_the_gluon_loop_is_a_hopper_option_the_interpreter_leaves_out(monkeypatch):
    """``KERNELS_CONFIG_SSD_STATE=GLUON=1`` (the Gluon loop, sm_90a only): on the CPU the call runs
    the Triton loop and gives the default's bits; the loop takes 16-bit inputs, P = 64, N of 64 or
    128, the prep kernel's dt, and nothing else."""
    from kernels import ssd_gluon

    gen = torch.Generator().manual_seed(23)
    x, dt, A, B, C, D, bias, _ = make(gen, 140, 2, 64, 64, 1, dtype=torch.float16)
    runs = []
    for v in ("GLUON=0", "GLUON=1"):
        monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", v)
        runs.append(chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert not ssd._gluon_fits(x.device, x.reshape(-1, 2, 64), B.reshape(-1, 1, 64), 64, 64)
    if ssd_gluon.gluon is not None:
        assert ssd_gluon.applies(64, 128, 16, True) and ssd_gluon.applies(64, 64, 16, True)
    for args in ((64, 128, 32, True), (48, 128, 16, True), (64, 256, 16, True), (64, 128, 16, False)):
        assert not ssd_gluon.applies(*args)
    # a warpgroup count the loop is not written for is refused, naming the key
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", "GLUON=3")
    with pytest.raises(ValueError, match="GLUON=3"):
        chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
