"""FLA's test grid for the chunked gated delta rule, ported (our code, FLA's scenarios).

Source of the scenarios: fla-org/flash-linear-attention ``tests/ops/test_gated_delta.py``,
``test_chunk`` (T in 1, 15, 63, 300; D in 32, 64, 100, 256, here also 128; gate logit normalisers
1, 0.1, 10; scale 1, 0.1; gate masks 0, 0.5; fp16; k l2-normalised outside the kernel, beta = 1,
zero initial state), ``test_fused_recurrent`` (q and k l2-normalised inside the kernel) and
``test_chunk_varlen`` (cu_seqlens [0, 122, 229, 400, 1000], D = 128, gate mask 0.5, random initial
states). As in FLA's newer GVA tests, q/k have H = 2 heads and v/g/beta/state HV = 4.

Metric and tolerances are FLA's ``assert_close``: ratio = RMS(ours - ref) / RMS(ref), which must be
below 0.005 for the output and the final state (FLA's chunk tolerance), unless the largest absolute
difference is at most 1e-6. The reference is ``kernels.reference.naive_gated_delta_rule`` (an fp32
per-token recurrence) fed the same dtype-rounded inputs. Beyond FLA, every 64-token boundary state
is checked with the same metric (FLA's API has no boundary states).

bf16 (FLA's grid is fp16 only) has 8x fp16's unit roundoff; it is checked with the same metric at
0.01. The CPU (interpreter) subset runs fp32, where the tolerance is 1e-5 (pure fp32 rounding).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from kernels import chunk_gated_delta_rule, naive_gated_delta_rule  # noqa: E402

H, HV = 2, 4
FLA_TOL = {torch.float16: 5e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def err_ratio(ours, ref):
    """FLA's metric: RMS of the difference over RMS of the reference; 0 when the largest
    absolute difference is at most 1e-6 (FLA's err_atol short-cut)."""
    ours, ref = ours.float(), ref.float()
    if ours.numel() == 0 or (ours - ref).abs().max().item() <= 1e-6:
        return 0.0
    return ((ours - ref).pow(2).mean().sqrt() / (ref.pow(2).mean().sqrt() + 1e-8)).item()


def fla_chunk_case(T, D, gate_norm, scale, mask_p, l2norm, dtype, device, seed=42):
    """Inputs as FLA's test_chunk builds them (GVA heads), with the q/k normalisation either
    outside the kernel (FLA's test_chunk: k normalised, q raw) or inside it."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, H, D, generator=gen)
    k = torch.randn(1, T, H, D, generator=gen)
    if l2norm == "outside":
        k = F.normalize(k, p=2, dim=-1)
    v = torch.randn(1, T, HV, D, generator=gen)
    beta = torch.ones(1, T, HV)
    g = F.logsigmoid(torch.rand(1, T, HV, generator=gen)) / gate_norm
    g = g * (torch.rand(1, T, HV, generator=gen) > mask_p)
    h0 = torch.zeros(1, HV, D, D)
    q, k, v, beta = (x.to(device=device, dtype=dtype) for x in (q, k, v, beta))
    return q, k, v, g.to(device), beta, h0.to(device)


def check_case(q, k, v, g, beta, h0, *, scale, l2norm, cu_seqlens=None, tol):
    inside = l2norm == "inside"
    o, ht, hb = chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=h0, cu_seqlens=cu_seqlens, use_qk_l2norm=inside
    )
    ro, rf, rb, _ = naive_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=h0, cu_seqlens=cu_seqlens, use_qk_l2norm=inside
    )
    assert hb.shape == rb.shape
    assert torch.isfinite(o).all() and torch.isfinite(ht).all() and torch.isfinite(hb).all()
    errs = {"o": err_ratio(o, ro), "ht": err_ratio(ht, rf), "boundaries": err_ratio(hb, rb)}
    errs["worst boundary"] = max((err_ratio(hb[i], rb[i]) for i in range(hb.shape[0])), default=0.0)
    assert errs["o"] < tol and errs["ht"] < tol and errs["boundaries"] < tol, errs
    return errs


# ---- CPU (interpreter, fp32): a reduced grid covering each axis at least once -----------------
CPU_CASES = [
    # T, D, gate_norm, scale, mask_p, l2norm
    (1, 32, 1, 1, 0, "outside"),
    (15, 100, 0.1, 0.1, 0.5, "inside"),
    (63, 64, 10, 1, 0.5, "outside"),
    (130, 32, 1, 0.1, 0, "inside"),
    (70, 100, 1, 1, 0.5, "inside"),
]


@pytest.mark.parametrize("T,D,gate_norm,scale,mask_p,l2norm", CPU_CASES)
def test_fla_chunk_grid_cpu(T, D, gate_norm, scale, mask_p, l2norm):
    """Reduced port of FLA ``test_gated_delta.py::test_chunk`` on the interpreter (fp32)."""
    case = fla_chunk_case(T, D, gate_norm, scale, mask_p, l2norm, torch.float32, "cpu")
    check_case(*case, scale=scale, l2norm=l2norm, tol=FLA_TOL[torch.float32])


def test_fla_chunk_varlen_cpu():
    """Port of FLA ``test_gated_delta.py::test_chunk_varlen`` (cu_seqlens shrunk to fit the
    interpreter, D = 32, fp32): random initial states per sequence, gate mask 0.5."""
    varlen_case([0, 22, 129, 150, 200], 32, torch.float32, "cpu", FLA_TOL[torch.float32])


def varlen_case(cu, D, dtype, device, tol):
    gen = torch.Generator().manual_seed(42)
    T, N = cu[-1], len(cu) - 1
    q = torch.randn(1, T, H, D, generator=gen)
    k = F.normalize(torch.randn(1, T, H, D, generator=gen), p=2, dim=-1)
    v = torch.randn(1, T, HV, D, generator=gen)
    g = F.logsigmoid(torch.rand(1, T, HV, generator=gen))
    g = g * (torch.rand(1, T, HV, generator=gen) > 0.5)
    beta = torch.rand(1, T, HV, generator=gen).sigmoid()
    h0 = torch.randn(N, HV, D, D, generator=gen)
    q, k, v, beta = (x.to(device=device, dtype=dtype) for x in (q, k, v, beta))
    # FLA rounds its initial state to the input dtype; so does the port
    h0 = h0.to(dtype).float().to(device)
    return check_case(q, k, v, g.to(device), beta, h0, scale=1.0, l2norm="outside", cu_seqlens=cu, tol=tol)


# ---- GPU: the whole grid, fp16 (FLA's dtype) and bf16 -----------------------------------------
def _gpu_dtypes():
    dts = [torch.float16]
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0):
        dts.append(torch.bfloat16)
    return dts


@pytest.mark.gpu
@pytest.mark.parametrize("l2norm", ["outside", "inside"])
@pytest.mark.parametrize("D", [32, 64, 100, 128, 256])
@pytest.mark.parametrize("T", [1, 15, 63, 300])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fla_chunk_grid_gpu(dtype, T, D, l2norm):
    """Port of FLA ``test_gated_delta.py::test_chunk`` (and the in-kernel l2norm of its
    ``test_fused_recurrent``): every gate normaliser x scale x gate mask combination for this
    (dtype, T, D, l2norm), compared with FLA's metric at FLA's tolerance; plus every boundary."""
    if dtype not in _gpu_dtypes():
        pytest.skip("bf16 is not supported on this GPU")
    worst = {}
    for gate_norm in (1, 0.1, 10):
        for scale in (1, 0.1):
            for mask_p in (0, 0.5):
                case = fla_chunk_case(T, D, gate_norm, scale, mask_p, l2norm, dtype, "cuda")
                errs = check_case(*case, scale=scale, l2norm=l2norm, tol=FLA_TOL[dtype])
                for key, val in errs.items():
                    worst[key] = max(worst.get(key, 0.0), val)
    print(
        f"FLAGRID {str(dtype)[6:]} T={T} D={D} l2norm={l2norm}: " + " ".join(f"{k}={v:.2e}" for k, v in worst.items())
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fla_chunk_varlen_gpu(dtype):
    """Port of FLA ``test_gated_delta.py::test_chunk_varlen``: cu_seqlens [0, 122, 229, 400,
    1000], D = 128, gate mask 0.5, random initial states (rounded to the input dtype)."""
    if dtype not in _gpu_dtypes():
        pytest.skip("bf16 is not supported on this GPU")
    errs = varlen_case([0, 122, 229, 400, 1000], 128, dtype, "cuda", FLA_TOL[dtype])
    print(f"FLAVARLEN {str(dtype)[6:]}: " + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
