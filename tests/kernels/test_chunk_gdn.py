"""Chunked gated delta rule vs the per-token fp32 oracle, boundary states, restore invariants.

CPU tests run under TRITON_INTERPRET=1 in fp32 at small shapes (H=2, HV=4, K=V=32).
Tolerance against the oracle: atol = rtol = 1e-5. Both sides are fp32 evaluations of the same
recurrence, only the summation order differs (chunked WY form vs token by token); the observed
error is ~1e-7 on O(1) values, so 1e-5 leaves a 10-100x margin while still catching any indexing,
masking or decay mistake (those give O(1e-2..1) errors).
Restore invariants are asserted bit-exact on CPU: resuming at a boundary reuses the same chunk
grid, so the resumed call performs the very same fp32 operations on the very same values.
"""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from kernels.chunk_gdn import chunk_gated_delta_rule, prepare_chunk_metadata  # noqa: E402
from kernels.conv import causal_conv1d  # noqa: E402
from kernels.reference import (  # noqa: E402
    naive_causal_conv1d,
    naive_gated_delta_rule,  # noqa: E402
    naive_gdn_gate,
    naive_recurrent_step,
)

ATOL = RTOL = 1e-5
H, HV, K, V = 2, 4, 32, 32


def make_inputs(T, *, B=1, h=H, hv=HV, dk=K, dv=V, seed=0, device="cpu", dtype=torch.float32):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, T, h, dk, generator=gen)
    k = torch.randn(B, T, h, dk, generator=gen)
    v = torch.randn(B, T, hv, dv, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, hv, generator=gen)) * 0.5  # log decay in (-inf, 0)
    beta = torch.rand(B, T, hv, generator=gen)
    return [x.to(device=device, dtype=dtype) for x in (q, k, v)] + [g.to(device), beta.to(device)]


def rand_state(n, hv=HV, dk=K, dv=V, seed=1, device="cpu"):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return (0.1 * torch.randn(n, hv, dk, dv, generator=gen)).to(device)


def close(a, b, atol=ATOL, rtol=RTOL):
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


# one token, a partial chunk, exactly one chunk, one past it, two boundaries and a partial chunk
@pytest.mark.triton_compat  # the four kernels at every chunk edge, with and without an initial state
@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
def test_matches_oracle(T):
    q, k, v, g, beta = make_inputs(T, seed=T)
    h0 = rand_state(1, seed=T + 1) if T % 2 else None
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    ro, rf, rb, rpos = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    assert o.dtype == torch.float32 and o.shape == (1, T, HV, V)
    close(o, ro)
    close(ht, rf)
    assert hb.shape == (T // 64, HV, K, V) == rb.shape
    assert rpos == [[64 * (i + 1) for i in range(T // 64)]]
    close(hb, rb)


def test_varlen_three_sequences_with_initial_states():
    cu = [0, 50, 114, 200]  # lengths 50, 64, 86
    q, k, v, g, beta = make_inputs(200, seed=7)
    h0 = rand_state(3, seed=8)
    o, ht, hb = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=torch.tensor(cu), use_qk_l2norm=True
    )
    ro, rf, rb, rpos = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, use_qk_l2norm=True)
    assert rpos == [[], [64], [64]]
    close(o, ro)
    close(ht, rf)
    close(hb, rb)


def test_batched_inputs_and_no_l2norm_custom_scale():
    q, k, v, g, beta = make_inputs(70, B=2, seed=11)
    q, k = q * 0.2, k * 0.2  # keep un-normalised keys in a stable range
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, scale=0.3)
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, scale=0.3)
    close(o, ro)
    close(ht, rf)
    close(hb, rb)


def test_boundary_stride_and_index_list():
    q, k, v, g, beta = make_inputs(200, h=1, hv=2, seed=3)  # one key head: what is checked is which states
    _, _, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)  # 64,128,192
    meta = prepare_chunk_metadata([0, 200], boundary_stride=2)
    assert meta.boundary_positions == [[128]]
    _, _, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta)
    close(hb, rb[1:2])
    # an index list, stored in bf16 (one call checks both: the bf16 copy is rounded on store only)
    o, ht, hb16 = chunk_gated_delta_rule(
        q, k, v, g, beta, use_qk_l2norm=True, boundary_indices=[64, 192], state_dtype=torch.bfloat16
    )
    assert hb16.dtype == torch.bfloat16 and hb16.shape[0] == 2
    close(hb16, rb[[0, 2]], atol=1e-2, rtol=1e-2)
    o2, ht2, none = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, boundary_states=False)
    assert none is None
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    with pytest.raises(ValueError):
        prepare_chunk_metadata([0, 200], boundary_indices=[100])


@pytest.mark.triton_compat  # the gate and beta computed inside the kernels
def test_in_kernel_gate_and_beta_sigmoid():
    q, k, v, a, b = make_inputs(130, seed=5)
    gen = torch.Generator().manual_seed(6)
    A_log = torch.log(torch.empty(HV).uniform_(1, 16, generator=gen)) - 2.0
    dt_bias = torch.randn(HV, generator=gen)
    o, ht, hb = chunk_gated_delta_rule(
        q,
        k,
        v,
        a * 4,
        b * 6 - 3,
        use_qk_l2norm=True,
        A_log=A_log,
        dt_bias=dt_bias,
        use_gate_in_kernel=True,
        use_beta_sigmoid=True,
    )
    g = naive_gdn_gate(a * 4, A_log, dt_bias)
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, torch.sigmoid(b * 6 - 3), use_qk_l2norm=True)
    close(o, ro)
    close(ht, rf)
    close(hb, rb)


def test_noncontiguous_fused_qkv_views():
    T = 100
    gen = torch.Generator().manual_seed(9)
    fused = torch.randn(1, T, 2 * H * K + HV * V + 7, generator=gen)  # padded row: odd stride
    q = fused[..., : H * K].view(1, T, H, K)
    k = fused[..., H * K : 2 * H * K].view(1, T, H, K)
    v = fused[..., 2 * H * K : 2 * H * K + HV * V].view(1, T, HV, V)
    gb = torch.randn(1, T, 2 * HV, generator=gen)
    gb = torch.cat([F.logsigmoid(gb[..., :HV]), torch.sigmoid(gb[..., HV:])], -1)
    g, beta = gb[..., :HV], gb[..., HV:]  # strided views too
    assert not q.is_contiguous() and not g.is_contiguous()
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    close(o, ro)
    close(ht, rf)
    close(hb, rb)


def test_ragged_first_chunk_nonaligned_start():
    """Split at p=100: the second call starts mid-chunk, its first chunk is ragged and its
    boundaries land on the absolute multiples of 64. (A start inside the first chunk, p=30, is
    covered by test_restore_invariant_every_boundary.)"""
    T = 200
    q, k, v, g, beta = make_inputs(T, h=1, hv=2, seed=21)  # two value heads on one key head: half the programs
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    for p in (100,):
        sl = lambda x, a, b: x[:, a:b]  # noqa: E731
        _, h1, _ = chunk_gated_delta_rule(*(sl(x, 0, p) for x in (q, k, v, g, beta)), use_qk_l2norm=True)
        o2, h2, hb2 = chunk_gated_delta_rule(
            *(sl(x, p, T) for x in (q, k, v, g, beta)), initial_state=h1, start_positions=[p], use_qk_l2norm=True
        )
        close(o2, ro[:, p:])
        close(h2, rf)
        first = p // 64  # boundaries above p
        close(hb2, rb[first:])


@pytest.mark.triton_compat  # varlen, ragged first chunks, initial states
def test_varlen_mixed_start_positions():
    cu = [0, 40, 170, 200]
    starts = [10, 64, 127]
    q, k, v, g, beta = make_inputs(200, seed=31)
    h0 = rand_state(3, seed=32)
    o, ht, hb = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, start_positions=starts, use_qk_l2norm=True
    )
    ro, rf, rb, rpos = naive_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, start_positions=starts, use_qk_l2norm=True
    )
    assert rpos == [[], [128, 192], [128]]
    meta = prepare_chunk_metadata(cu, starts)
    assert meta.boundary_positions == rpos
    close(o, ro)
    close(ht, rf)
    close(hb, rb)


def _layer(x, conv_w, g, beta, *, conv_state=None, h0=None, start=0, T=None):
    """Conv -> split the fused conv output into q/k/v views -> gated delta rule."""
    y, cs, cb = causal_conv1d(x, conv_w, conv_state=conv_state, start_positions=[start])
    T = x.shape[1]
    q = y[..., : H * K].view(1, T, H, K)
    k = y[..., H * K : 2 * H * K].view(1, T, H, K)
    v = y[..., 2 * H * K :].view(1, T, HV, V)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, start_positions=[start], use_qk_l2norm=True)
    return o, ht, hb, cs, cb


@pytest.mark.triton_compat  # conv and gated delta rule together, restored bit-exactly
def test_restore_invariant_every_boundary():
    """Restore (boundary state, boundary conv window) at each boundary, run the suffix, and
    reproduce the suffix output and the terminal states bit-exactly. Also from the boundaries of
    a call that itself started at a non-aligned position (ragged first chunk)."""
    T, D = 130, 2 * H * K + HV * V
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(1, T, D, generator=gen)
    conv_w = torch.randn(D, 4, generator=gen) * 0.5
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen))
    beta = torch.rand(1, T, HV, generator=gen)
    o, ht, hb, cs, cb = _layer(x, conv_w, g, beta)
    assert hb.shape[0] == cb.shape[0] == 2
    for i, b in enumerate((64, 128)):
        o2, ht2, hb2, cs2, cb2 = _layer(
            x[:, b:], conv_w, g[:, b:], beta[:, b:], conv_state=cb[i : i + 1], h0=hb[i : i + 1], start=b
        )
        assert torch.equal(o2, o[:, b:])
        assert torch.equal(ht2, ht)
        assert torch.equal(cs2, cs)
        assert torch.equal(hb2, hb[i + 1 :]) and torch.equal(cb2, cb[i + 1 :])
    # the whole pipeline against the oracles
    ry, _, rcb, _ = naive_causal_conv1d(x, conv_w)
    rq = ry[..., : H * K].reshape(1, T, H, K)
    rk = ry[..., H * K : 2 * H * K].reshape(1, T, H, K)
    rv = ry[..., 2 * H * K :].reshape(1, T, HV, V)
    ro, rf, rb, _ = naive_gated_delta_rule(rq, rk, rv, g, beta, use_qk_l2norm=True)
    close(o, ro)
    close(hb, rb)
    close(cb, rcb)
    # non-aligned start: prefix [0, 30), then a call from 30 whose boundaries are restored
    p = 30
    _, h30, _, cs30, _ = _layer(x[:, :p], conv_w, g[:, :p], beta[:, :p])
    o3, ht3, hb3, cs3, cb3 = _layer(x[:, p:], conv_w, g[:, p:], beta[:, p:], conv_state=cs30, h0=h30, start=p)
    close(o3, ro[:, p:])
    close(hb3, rb)
    for i, b in ((1, 128),):  # the restore loop above covers each boundary; one from this call
        o4, ht4, _, cs4, _ = _layer(
            x[:, b:], conv_w, g[:, b:], beta[:, b:], conv_state=cb3[i : i + 1], h0=hb3[i : i + 1], start=b
        )
        assert torch.equal(o4, o3[:, b - p :])
        assert torch.equal(ht4, ht3) and torch.equal(cs4, cs3)


def test_prefill_to_decode_handoff():
    T = 130
    q, k, v, g, beta = make_inputs(T + 1, h=1, hv=2, seed=51)  # the other tests cover H = 2, HV = 4
    pre = [x[:, :T] for x in (q, k, v, g, beta)]
    _, h, _ = chunk_gated_delta_rule(*pre, use_qk_l2norm=True)
    ro, rf, _, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    # one recurrent oracle step from the kernel's final state
    od, hd = naive_recurrent_step(q[:, T], k[:, T], v[:, T], g[:, T], beta[:, T], h, use_qk_l2norm=True)
    close(od, ro[:, T])
    close(hd, rf)
    # the kernel itself as the decode step (T = 1, resuming at position 130)
    o1, h1, hb1 = chunk_gated_delta_rule(
        *(x[:, T:] for x in (q, k, v, g, beta)), initial_state=h, start_positions=[T], use_qk_l2norm=True
    )
    close(o1[:, 0], ro[:, T])
    close(h1, rf)
    assert hb1.shape[0] == 0


def test_metadata_reuse_and_validation():
    cu = [0, 64, 130]
    meta = prepare_chunk_metadata(cu, [0, 0])
    assert meta.num_chunks == 3 and meta.num_boundaries == 2
    outs = []
    for seed in (1, 2):  # two "layers" reuse one metadata object
        q, k, v, g, beta = make_inputs(130, seed=seed)
        o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, chunk_metadata=meta, use_qk_l2norm=True)
        ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True)
        close(o, ro)
        close(hb, rb)
        outs.append(o)
    q, k, v, g, beta = make_inputs(10)
    with pytest.raises(ValueError):
        chunk_gated_delta_rule(q, k, v, g, beta, chunk_metadata=meta)  # wrong token count
    with pytest.raises(ValueError):
        chunk_gated_delta_rule(q, k[:, :, :1], v, g, beta)


def test_empty_sequence_in_varlen_keeps_its_state():
    cu = [0, 70, 70, 100]
    q, k, v, g, beta = make_inputs(100, seed=61)
    h0 = rand_state(3, seed=62)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, use_qk_l2norm=True)
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, use_qk_l2norm=True)
    close(o, ro)
    close(ht, rf)
    assert torch.equal(ht[1], h0[1])
    close(hb, rb)


# ----------------------------------------------------------------------------------------------
# GPU: production shapes, bf16 and fp32, against the oracle and FLA (when importable)
# ----------------------------------------------------------------------------------------------


def _rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _max_rel_rows(a, b):
    """Worst relative error over the boundary states (each compared on its own)."""
    if a.shape[0] == 0:
        return 0.0
    a, b = a.float().flatten(1), b.float().flatten(1)
    return ((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)).max().item()


_ORACLE_CACHE = {}


def _gpu_case(h, hv, mode, T):
    key = (h, hv, mode, T)
    if key not in _ORACLE_CACHE:
        cu = None if mode == "single" else [0, T // 4, T // 2, 3 * T // 4, T]
        q, k, v, g, beta = make_inputs(T, h=h, hv=hv, dk=128, dv=128, seed=hv + T, device="cuda", dtype=torch.bfloat16)
        beta = beta.to(torch.bfloat16)
        with torch.no_grad():
            ref = naive_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True)
        _ORACLE_CACHE[key] = (q, k, v, g, beta, cu, ref)
    return _ORACLE_CACHE[key]


# tolerances (relative Frobenius error against the fp32 oracle fed the same bf16-rounded inputs):
# fp32 inputs (tf32x3 products by default, IEEE FMAs on request): fp32 rounding over up to 512
# chunk steps -> 1e-4.
# bf16 inputs: bf16 operands of every matmul (as in FLA) -> 2e-2; FLA itself is reported beside.
GPU_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


@pytest.mark.gpu_long
@pytest.mark.parametrize("mode", ["single", "varlen"])
@pytest.mark.parametrize("h,hv", [(16, 32), (4, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_production_shapes(dtype, h, hv, mode):
    """32K tokens (one sequence, or four of 8K) against the oracle; FLA beside when importable."""
    _production_case(dtype, h, hv, mode, 32768, with_fla=True)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["single", "varlen"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gpu_production_shapes_short(dtype, mode):
    """The same check at 4K tokens, H=4 / HV=8 (Qwen3-Next at TP4), for the small-runner suite."""
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 is not supported on this GPU")
    _production_case(dtype, 4, 8, mode, 4096, with_fla=False)


def _production_case(dtype, h, hv, mode, T, with_fla):
    q, k, v, g, beta, cu, (ro, rf, rb, _) = _gpu_case(h, hv, mode, T)
    cu_t = None if cu is None else torch.tensor(cu, device="cuda", dtype=torch.int32)
    args = [x.to(dtype) for x in (q, k, v)] + [g, beta.to(dtype)]
    o, ht, hb = chunk_gated_delta_rule(*args, cu_seqlens=cu, use_qk_l2norm=True)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all() and torch.isfinite(hb).all()
    e_o, e_h, e_b = _rel(o, ro), _rel(ht, rf), _max_rel_rows(hb, rb)
    line = (
        f"GPUERR {str(dtype)[6:]} H={h} HV={hv} T={T} {mode}: ours o={e_o:.2e} final={e_h:.2e} "
        f"boundaries(max over {hb.shape[0]})={e_b:.2e}"
    )
    fla_gdn = None
    if with_fla:  # FLA's JIT autotuning alone takes ~30 s: only in the gpu_long suite
        try:
            os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
        except Exception:  # noqa: BLE001 - FLA is optional
            fla_gdn = None
    if fla_gdn is not None and dtype == torch.bfloat16:  # FLA's production dtype
        fo, fh = fla_gdn(*args, use_qk_l2norm_in_kernel=True, output_final_state=True, cu_seqlens=cu_t)
        line += f" | FLA o={_rel(fo, ro):.2e} final={_rel(fh, rf):.2e} | ours-vs-FLA o={_rel(o, fo):.2e}"
    print(line)
    tol = GPU_TOL[dtype]
    assert e_o < tol and e_h < tol and e_b < tol, line


def _half():
    """bf16 where the GPU has bf16 tensor cores (compute capability 8.0+), else fp16 (T4)."""
    return torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16


@pytest.mark.gpu
def test_gpu_metadata_call_does_not_sync():
    cu = [0, 1000, 5000, 8192]
    q, k, v, g, beta = make_inputs(8192, h=4, hv=8, dk=128, dv=128, seed=3, device="cuda", dtype=_half())
    meta = prepare_chunk_metadata(cu, [0, 100, 64], device="cuda")
    chunk_gated_delta_rule(q, k, v, g, beta, chunk_metadata=meta, use_qk_l2norm=True)  # tune
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, chunk_metadata=meta, use_qk_l2norm=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ro, rf, rb, _ = naive_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, start_positions=[0, 100, 64], use_qk_l2norm=True
    )
    assert _rel(o, ro) < 2e-2 and _rel(ht, rf) < 2e-2 and _max_rel_rows(hb, rb) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("h,hv", [(4, 8), (16, 32)])
def test_gpu_fp32_default_precision_is_as_accurate_as_ieee(h, hv):
    """fp32 inputs run three tf32 products per product by default (``FP32_PRECISION``, 14x faster
    than IEEE FMAs on an H200): against the per-token fp32 oracle its errors stay within 2x of the
    IEEE run's (H200: out 7.1e-8 against 8.2e-8 max), while plain tf32, which the check must be
    able to tell apart, is at least 10x worse. At 16/32 heads on an H200 the default runs the wide
    state block (``state_wide``), the other two the narrow one."""
    T = 2048
    q, k, v, g, beta = make_inputs(T, h=h, hv=hv, dk=128, dv=128, seed=11, device="cuda")
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    err = {}
    for prec in (None, "ieee", "tf32"):
        o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, input_precision=prec)
        err[prec] = (_rel(o, ro), _rel(ht, rf), _max_rel_rows(hb, rb))
    print("FP32ERR", err)
    for d, i, t in zip(err[None], err["ieee"], err["tf32"]):
        assert d < 1e-5 and d <= 2 * i + 1e-7 and t > 10 * d, err


@pytest.mark.gpu
@pytest.mark.parametrize("prec", [None, "ieee"], ids=["tf32x3", "ieee"])
def test_gpu_restore_fp32(prec):
    """Restore at boundaries on the GPU (fp32, the default products and IEEE): suffix output and
    terminal state agree to 1e-6 relative (same chunk grid and operations; another V split)."""
    T = 2048
    q, k, v, g, beta = make_inputs(T, h=4, hv=8, dk=128, dv=128, seed=5, device="cuda")
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, input_precision=prec)
    for i in (0, 7, 30):
        b = 64 * (i + 1)
        o2, h2, _ = chunk_gated_delta_rule(
            *(x[:, b:] for x in (q, k, v, g, beta)),
            initial_state=hb[i : i + 1],
            start_positions=[b],
            use_qk_l2norm=True,
            input_precision=prec,
        )
        assert _rel(o2, o[:, b:]) < 1e-6 and _rel(h2, ht) < 1e-6
