"""Package API: lazy exports, argument checks, head dims that are not powers of two, warmup."""

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.triton_compat  # `make test` runs this module on the newest Triton too

import torch.nn.functional as F  # noqa: E402
from without_torch import run_without_torch  # noqa: E402

import kernels  # noqa: E402
from kernels import (  # noqa: E402
    causal_conv1d,
    chunk_gated_delta_rule,
    naive_gated_delta_rule,  # noqa: E402
    prepare_chunk_metadata,
    warmup,
)
from kernels._common import INTERPRET  # noqa: E402
from test_chunk_gdn import make_inputs  # noqa: E402


def test_package_exports_are_the_module_functions():
    from kernels import chunk_gdn, conv
    from kernels import _common

    assert chunk_gated_delta_rule is chunk_gdn.chunk_gated_delta_rule
    assert causal_conv1d is conv.causal_conv1d
    assert prepare_chunk_metadata is _common.prepare_chunk_metadata
    assert set(kernels.__all__) <= set(dir(kernels))
    with pytest.raises(AttributeError):
        kernels.no_such_function  # noqa: B018


def test_import_without_torch_fails_only_on_use():
    out = run_without_torch(
        "import kernels, kernels.cli\n"
        "try:\n"
        "    from kernels import chunk_gated_delta_rule\n"
        "except ImportError as e:\n"
        "    print('ERR', e)\n"
    )
    assert "ERR kernels.chunk_gated_delta_rule needs torch and triton" in out
    assert "pip install 'marconi-sim[kernels]'" in out


def _inputs(T, H, HV, K, V, seed, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen))
    beta = torch.rand(1, T, HV, generator=gen)
    h0 = 0.1 * torch.randn(1, HV, K, V, generator=gen)
    return [x.to(device=device, dtype=dtype) for x in (q, k, v)] + [
        g.to(device),
        beta.to(device=device, dtype=dtype),
        h0.to(device),
    ]


@pytest.mark.parametrize("K,V,T", [(100, 100, 70), (8, 24, 65), (40, 200, 65), (64, 32, 65)])
def test_head_dims_not_powers_of_two(K, V, T):
    """Masked tiles: K and V are padded to the next power of two inside the kernels; and K's tile
    wider than V's (64 / 32: the w/u kernel's tiles follow K, the state's follow V). Two value
    heads on one key head: the masks are per tile, the head mapping is tested at H = 2, HV = 4
    in test_chunk_gdn.py (half the interpreted programs)."""
    q, k, v, g, beta, h0 = _inputs(T, 1, 2, K, V, seed=K + V)
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    assert o.shape == (1, T, 2, V) and ht.shape == (1, 2, K, V) and hb.shape == rb.shape
    for a, b in ((o, ro), (ht, rf), (hb, rb)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(K=257), "head dim K=257"),
        (dict(V=300), "head dim V=300"),
        (dict(HV=3), "HV a multiple of H"),
        (dict(dtype=torch.float64), "dtype"),
    ],
)
def test_refuses_what_it_cannot_run(bad, match):
    args = dict(T=4, H=2, HV=4, K=16, V=16, dtype=torch.float32)
    args.update(bad)
    dtype = args.pop("dtype")
    q, k, v, g, beta, _ = _inputs(**args, seed=0)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with pytest.raises(ValueError, match=match):
        chunk_gated_delta_rule(q, k, v, g, beta)


def test_refuses_bad_initial_state_shape():
    q, k, v, g, beta, h0 = _inputs(4, 2, 4, 16, 16, seed=0)
    with pytest.raises(ValueError, match="initial_state"):
        chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0[:, :2])


@pytest.mark.parametrize("state_dtype", ["float32", torch.int32, torch.float64, None])
def test_refuses_a_state_dtype_it_cannot_emit_in_one_line(state_dtype):
    """Boundary states come in fp32, bf16 or fp16: anything else is one ValueError line (it was
    torch.empty's multi-line TypeError, or an fp64 store the kernels were never tested with), in
    the Triton kernels and the plain-torch implementation alike."""
    from kernels.torch_gdn import chunk_gated_delta_rule as torch_gdn

    q, k, v, g, beta, _ = _inputs(70, 2, 4, 16, 16, seed=0)
    for fn in (chunk_gated_delta_rule, torch_gdn):
        with pytest.raises(ValueError, match="state_dtype must be one of") as e:
            fn(q, k, v, g, beta, state_dtype=state_dtype)
        assert "\n" not in str(e.value)


def test_warmup_runs_every_bucket_on_cpu():
    secs = warmup(
        [(30, 40)],
        num_heads=1,
        num_v_heads=2,
        head_k_dim=16,
        head_v_dim=16,
        dtype=torch.float32,
        device="cpu",
        conv_dim=16,
    )
    assert secs > 0


def test_warmup_adds_the_batch_that_takes_the_wide_state_block(monkeypatch):
    """Where a batch of enough sequences takes the wide state block and one sequence does not,
    warmup adds varlen buckets of that many sequences (63 and 64 tokens each: without and with a
    boundary state), so both blocks compile before anything is timed; none where one sequence is
    already wide or on a CPU."""
    import importlib

    warmup_module = importlib.import_module("kernels.warmup")  # ``kernels.warmup`` is the function

    calls = []

    def record(q, k, v, g, beta, *, cu_seqlens, initial_state, **kw):
        calls.append((tuple(cu_seqlens), initial_state is not None))

    monkeypatch.setattr(warmup_module, "chunk_gated_delta_rule", record)
    kw = dict(num_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16, dtype=torch.float32, device="cpu")
    warmup_module.warmup(**kw)
    assert [c for c, _ in calls] == [(0, 63), (0, 63), (0, 64), (0, 64)]  # a CPU: never wide
    calls.clear()
    monkeypatch.setattr(warmup_module, "state_wide", lambda N, HV, V, device: N >= 3)
    warmup_module.warmup(**kw)
    assert [c for c, _ in calls][4:] == [(0, 63, 126, 189)] * 2 + [(0, 64, 128, 192)] * 2
    assert [h for _, h in calls][4:] == [False, True, False, True]
    calls.clear()
    warmup_module.warmup(**kw, wide_batches=False)
    assert len(calls) == 4
    calls.clear()
    monkeypatch.setattr(warmup_module, "state_wide", lambda N, HV, V, device: True)
    warmup_module.warmup(**kw)
    assert len(calls) == 4


# ---- GPU -------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("D", [16, 32])
@pytest.mark.parametrize("T", [1, 15, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_small_head_dims(dtype, T, D):
    """Regression for the illegal memory access (issue 11: B=1, T=1, H=2, HV=4, K=V=32, bf16, no
    initial state): small head dims in half precision, against the oracle."""
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 is not supported on this GPU")
    q, k, v, g, beta, _ = _inputs(T, 2, 4, D, D, seed=T, dtype=dtype, device="cuda")
    o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    torch.cuda.synchronize()
    ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    for a, b in ((o, ro), (ht, rf), (hb, rb)):
        if b.numel():
            assert ((a.float() - b).norm() / b.norm()).item() < 2e-2


@pytest.mark.gpu
def test_gpu_warmup_then_new_lengths_compile_nothing():
    """After ``warmup`` a call with a length never seen before compiles no kernel (nor does
    switching l2norm or initial state, runtime flags, or boundary output, whose two state-loop
    variants warmup compiles)."""
    from kernels import chunk_gdn, conv

    jits = (
        chunk_gdn._solve_kernel,
        chunk_gdn._wu_kernel,
        chunk_gdn._state_kernel,
        chunk_gdn._output_kernel,
        conv._conv_kernel,
    )

    def compiled():
        # JITFunction.device_caches[device] = (kernel_cache, ...) in triton 3.6 .. 3.9
        return sum(len(c[0]) for j in jits for c in j.device_caches.values())

    half = torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    warmup(num_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64, dtype=half, conv_dim=64)
    before = compiled()
    assert before > 0
    for T, h0, norm in ((1000, True, True), (37, False, True), (4097, True, False)):
        q, k, v, g, beta, s0 = _inputs(T, 2, 4, 64, 64, seed=T, dtype=half, device="cuda")
        chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=s0 if h0 else None, use_qk_l2norm=norm, boundary_states=T > 100
        )
    torch.cuda.synchronize()
    assert compiled() == before


def test_metadata_tables_are_aligned_views_of_one_copy():
    """``prepare_chunk_metadata`` moves its three tables in one copy (pinned and asynchronous on a
    GPU): each a view starting on a 16-byte boundary (Triton's pointer specialisation), the same
    values as tables built one by one; and the launch table is built once per shape."""
    from kernels import chunk_gdn
    from kernels._common import prepare_chunk_metadata

    for cu, starts in (([0, 5], [0]), ([0, 130, 131, 400], [3, 64, 70]), ([0, 0], [0])):
        m = prepare_chunk_metadata(cu, starts, boundary_stride=2)
        tables = (m.chunk_info, m.seq_info, m.store_slot)
        assert len({t.untyped_storage().data_ptr() for t in tables}) == 1
        assert all(t.data_ptr() % 16 == 0 and t.is_contiguous() and t.dtype == torch.int32 for t in tables)
        assert m.chunk_info.shape == (m.num_chunks, 4) and m.seq_info.shape == (m.num_seqs, 4)
        assert m.store_slot.shape == (m.num_chunks,)
        assert int((m.store_slot >= 0).sum()) == m.num_boundaries
        ends = m.chunk_info[:, 3].tolist()
        assert m.seq_info[:, 1].tolist() == cu[1:] and (not ends or ends[-1] == cu[-1])
    a = chunk_gdn.launch_params(128, 128, torch.bfloat16)
    assert chunk_gdn.launch_params(128, 128, torch.bfloat16) is a


def test_launch_table_follows_the_config_environment(monkeypatch):
    from kernels import chunk_gdn

    before = chunk_gdn.launch_params(64, 64, torch.float16)
    monkeypatch.setenv("KERNELS_CONFIG_STATE", "BV=32,num_warps=8")
    changed = chunk_gdn.launch_params(64, 64, torch.float16)
    assert changed["state"]["BV"] == 32 and changed["state"]["num_warps"] == 8
    assert before["state"]["num_warps"] == chunk_gdn.CONFIGS["state"]["num_warps"]
    monkeypatch.delenv("KERNELS_CONFIG_STATE")
    assert chunk_gdn.launch_params(64, 64, torch.float16) is before


def test_wide_state_block_where_its_programs_fill_the_gpu(monkeypatch):
    """``state_wide``: the state loop takes V blocks of ``STATE_BV_WIDE`` where ``N * HV *
    ceil(V / 32)`` programs fill ``STATE_WIDE_FILL`` of the multiprocessors (H200: one sequence at
    32 value heads, four at 8), never on a CPU; the launch table follows, an explicit
    ``KERNELS_CONFIG_STATE`` BV wins, the block never exceeds the padded V, and fp32 inputs keep
    the default block."""
    from kernels import chunk_gdn, chunk_plan

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert not chunk_gdn.state_wide(64, 64, 128, cpu)
    monkeypatch.setattr(chunk_plan, "INTERPRET", False)
    monkeypatch.setattr(chunk_plan, "_multiprocessors", lambda index: 132)
    assert chunk_gdn.state_wide(1, 32, 128, gpu)  # 128 programs >= 99
    assert not chunk_gdn.state_wide(1, 8, 128, gpu) and not chunk_gdn.state_wide(3, 8, 128, gpu)  # 32, 96
    assert chunk_gdn.state_wide(4, 8, 128, gpu)  # 128
    assert not chunk_gdn.state_wide(1, 32, 64, gpu) and chunk_gdn.state_wide(2, 32, 64, gpu)  # 64, 128
    assert not chunk_gdn.state_wide(1, 32, 128, cpu)
    narrow = chunk_gdn.launch_params(128, 128, torch.bfloat16)
    wide = chunk_gdn.launch_params(128, 128, torch.bfloat16, None, True)
    assert narrow["state"]["BV"] == chunk_gdn.CONFIGS["state"]["BV"] == 16
    assert wide["state"]["BV"] == chunk_gdn.STATE_BV_WIDE and wide is not narrow
    # the other kernels' entries are the same, but for the output's count of the loop's V blocks
    assert narrow["out"]["NVS"] == 8 and wide["out"]["NVS"] == 4
    same = {k: v for k, v in wide.items() if k != "state"}
    assert {**same, "out": {**same["out"], "NVS": 8}} == {k: v for k, v in narrow.items() if k != "state"}
    assert chunk_gdn.launch_params(16, 16, torch.bfloat16, None, True)["state"]["BV"] == 16  # padded V
    # fp32 goes wide only in tf32x3 (its default): IEEE FMAs spill more wide, plain tf32 needs
    # 240 KB of shared memory there (an H200 has 227)
    for prec, bv in ((None, 32), ("tf32x3", 32), ("ieee", 16), ("tf32", 16)):
        assert chunk_gdn.launch_params(128, 128, torch.float32, prec, True)["state"]["BV"] == bv
    monkeypatch.setenv("KERNELS_CONFIG_STATE", "BV=16")
    assert chunk_gdn.launch_params(128, 128, torch.bfloat16, None, True)["state"]["BV"] == 16
    monkeypatch.setenv("KERNELS_CONFIG_STATE", "num_warps=8")
    assert chunk_gdn.launch_params(128, 128, torch.bfloat16, None, True)["state"]["BV"] == chunk_gdn.STATE_BV_WIDE


def test_gluon_state_loop_where_it_applies(monkeypatch):
    """The Gluon state loop (``kernels.state_gluon``) is chosen for 16-bit inputs at K = 128 on a
    device that runs it (``gluon`` True: Hopper), at either V block; never for fp32 inputs, another
    K, the 3-d grid, other than four warps, nor with ``GLUON=0``; never on a CPU."""
    from kernels import chunk_gdn, state_gluon

    if state_gluon.gluon is None:
        pytest.skip("this Triton has no Gluon")
    lp = chunk_gdn.launch_params
    for dt in (torch.bfloat16, torch.float16):
        for wide in (False, True):
            assert lp(128, 128, dt, None, wide, True)["state"]["GLUON"] == 1
        assert lp(128, 128, dt, None, False, False)["state"]["GLUON"] == 0
        assert lp(128, 64, dt, None, True, True)["state"]["GLUON"] == 1  # K = 128, V any multiple
        assert lp(64, 128, dt, None, True, True)["state"]["GLUON"] == 0
        assert lp(128, 100, dt, None, True, True)["state"]["GLUON"] == 0  # V not a multiple of 32
    assert lp(128, 128, torch.float32, None, True, True)["state"]["GLUON"] == 0
    for cfg in ("GLUON=0", "VFAST=0", "num_warps=8"):
        monkeypatch.setenv("KERNELS_CONFIG_STATE", cfg)
        assert lp(128, 128, torch.bfloat16, None, True, True)["state"]["GLUON"] == 0, cfg
    monkeypatch.delenv("KERNELS_CONFIG_STATE")
    assert not chunk_gdn.gluon_device(torch.device("cpu"))
    assert "GLUON" in chunk_gdn.HOST_KEYS  # not a constexpr of any kernel
    assert all("GLUON" not in fn.arg_names for fn in chunk_gdn._KERNELS if fn is not None)


_FALLBACK_REF = {}


@pytest.mark.parametrize("which", ["solve", "loop", "fused"])
def test_gluon_compile_failure_falls_back_to_the_triton_loop(which, monkeypatch):
    """Where a Gluon kernel cannot be built (here: the interpreter, which does not run Gluon; on
    a GPU, a Triton whose Gluon API moved on), the call warns once, runs the Triton kernels with
    the same results, and the process stops choosing Gluon. The solve is the first to fail where
    it runs Gluon; with it off (``KERNELS_CONFIG_SOLVE=GLUON=0``) the state loop is. The output
    kernel then does not overlap the loop (``OVL``: the Triton loop releases no progress, so an
    overlapped output would wait for ever; here the interpreter could not run it either). With the
    fused loop (``FUSE=1``: three launches) the fallback adds the output kernel's launch after the
    Triton loop."""
    from kernels import chunk_gdn, chunk_plan, state_gluon

    if state_gluon.gluon is None:
        pytest.skip("this Triton has no Gluon")
    from test_chunk_gdn import make_inputs, rand_state

    q, k, v, g, beta = make_inputs(130, h=1, hv=2, dk=128, dv=32, seed=3, dtype=torch.float16)
    h0 = rand_state(1, hv=2, dk=128, dv=32, seed=4)
    kw = dict(initial_state=h0, use_qk_l2norm=True)
    if "ref" not in _FALLBACK_REF:  # the Triton kernels' result, the same for the three cases
        _FALLBACK_REF["ref"] = chunk_gdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    ref = _FALLBACK_REF["ref"]
    failed = []
    monkeypatch.setattr(chunk_plan, "_GLUON_FAILED", failed)
    monkeypatch.setattr(chunk_plan, "gluon_device", lambda device: not failed)
    if which != "solve":
        monkeypatch.setenv("KERNELS_CONFIG_SOLVE", "GLUON=0")
    if which == "fused":
        monkeypatch.setenv("KERNELS_CONFIG_STATE", "FUSE=1")
    lp = chunk_gdn.launch_params(128, 32, torch.float16, None, False, True)
    assert lp["solve"]["GLUON"] == (which == "solve")
    if which == "fused":
        assert lp["state"]["GLUON"] == lp["state"]["FUSE"] == 1 and lp["out"]["OVL"] == 0
        assert chunk_gdn._kernel_fns(lp)[-1] is chunk_gdn._gluon_fused_kernel
    else:
        assert lp["state"]["GLUON"] == lp["out"]["OVL"] == 1 and lp["out"]["launch_pdl"]
    what = "solve" if which == "solve" else "state loop"
    with pytest.warns(UserWarning, match=f"Gluon {what} did not compile"):
        got = chunk_gdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    assert len(failed) == 1
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = chunk_gdn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    assert all(torch.equal(a, b) for a, b in zip(again, ref))


def test_gluon_solve_where_it_applies(monkeypatch):
    """The Gluon solve (``kernels.solve_gluon``) runs where the device runs Gluon, for 16-bit
    inputs at K = 128 (any V), one warpgroup, a program per chunk and pair of value heads (the
    last program of an odd head count has one); ``KERNELS_CONFIG_SOLVE=GLUON=0`` or a solve warp
    count other than 4 keeps the Triton solve (two warps, a program per chunk and head). The pair
    shares a key head where the group size is even (``PAIR``, the call's argument)."""
    from kernels import chunk_gdn, solve_gluon

    if solve_gluon._gluon_solve_kernel is None:
        pytest.skip("this Triton has no Gluon")
    lp = chunk_gdn.launch_params
    for dt in (torch.bfloat16, torch.float16):
        for V in (128, 64, 100):
            on = lp(128, V, dt, None, False, True)["solve"]
            assert on["GLUON"] == 1 and on["num_warps"] == solve_gluon.SOLVE_WARPS == 4, (dt, V)
        assert lp(128, 128, dt, None, False, False)["solve"]["GLUON"] == 0  # no Gluon device
        assert lp(64, 128, dt, None, False, True)["solve"]["GLUON"] == 0
        assert lp(256, 128, dt, None, False, True)["solve"]["GLUON"] == 0
    assert lp(128, 128, torch.float32, None, False, True)["solve"]["GLUON"] == 0
    on = lp(128, 128, torch.bfloat16, None, False, True)
    fns = chunk_gdn._kernel_fns(on)
    assert fns[0] is chunk_gdn._gluon_solve_kernel and fns[1:] == chunk_gdn._KERNELS_GLUON[1:]
    for HV, progs in ((32, 16), (8, 4), (3, 2), (1, 1)):
        assert chunk_gdn._grids(on, 1, 7, HV, 128)[0] == (7, progs, 1)
    off = lp(128, 128, torch.bfloat16, None, False, False)
    assert chunk_gdn._grids(off, 1, 7, 32, 128)[0] == (7, 32, 1) and off["solve"]["num_warps"] == 2
    assert "PAIR" in chunk_gdn._gluon_solve_kernel.arg_names
    assert all("PAIR" not in fn.arg_names for fn in chunk_gdn._KERNELS)
    for cfg in ("GLUON=0", "num_warps=2", "num_warps=8"):
        monkeypatch.setenv("KERNELS_CONFIG_SOLVE", cfg)
        got = lp(128, 128, torch.bfloat16, None, False, True)
        assert got["solve"]["GLUON"] == 0 and chunk_gdn._kernel_fns(got)[0] is chunk_gdn._solve_kernel, cfg
    monkeypatch.setenv("KERNELS_CONFIG_SOLVE", "num_warps=4")
    assert lp(128, 128, torch.bfloat16, None, False, True)["solve"]["GLUON"] == 1


def test_output_block_is_a_whole_head_of_128_for_16_bit_inputs(monkeypatch):
    """The output kernel's V block: 128 for 16-bit inputs (20 % faster than 64 on an H200),
    ``OUT_BV_FP32`` for fp32 (it spills more at 128), never more than the padded V; an explicit
    ``KERNELS_CONFIG_OUT`` BV wins for every dtype."""
    from kernels import chunk_gdn

    assert chunk_gdn.launch_params(128, 128, torch.bfloat16)["out"]["BV"] == 128
    assert chunk_gdn.launch_params(256, 256, torch.float16)["out"]["BV"] == 128  # two blocks
    assert chunk_gdn.launch_params(40, 24, torch.bfloat16)["out"]["BV"] == 32  # padded V
    assert chunk_gdn.launch_params(128, 128, torch.float32)["out"]["BV"] == chunk_gdn.OUT_BV_FP32 == 64
    assert chunk_gdn.launch_params(128, 16, torch.float32)["out"]["BV"] == 16
    monkeypatch.setenv("KERNELS_CONFIG_OUT", "BV=32")
    assert chunk_gdn.launch_params(128, 128, torch.float32)["out"]["BV"] == 32
    assert chunk_gdn.launch_params(128, 128, torch.bfloat16)["out"]["BV"] == 32


def test_solve_and_wu_knobs_follow_the_shape(monkeypatch):
    """The launch table's solve / w-u knobs: the keys' in-register transpose only up to a padded K
    of 128 (it spills at 256), tf32 block-inverse merges only where asked and only for 16-bit
    inputs or fp32 with input_precision tf32, the key and u column blocks clamped to the padded
    dims, the keys read once by w / u (``KONCE``) for 16-bit inputs up to a padded K of 128."""
    from kernels import chunk_gdn

    lp = chunk_gdn.launch_params(128, 128, torch.bfloat16)
    assert lp["solve"]["TRANS"] == 1 and lp["solve"]["TF32M"] == 0 and lp["solve"]["BKS"] == 64
    assert lp["wu"]["BCV"] == 128 and chunk_gdn.launch_params(128, 128, torch.float32)["wu"]["BCV"] == 64
    assert chunk_gdn.launch_params(256, 256, torch.float16)["solve"]["TRANS"] == 0
    small = chunk_gdn.launch_params(40, 24, torch.bfloat16)
    assert small["solve"]["BKS"] == 64 and small["wu"]["BCV"] == 32  # padded K 64, padded V 32
    assert chunk_gdn.launch_params(16, 16, torch.bfloat16)["solve"]["BKS"] == 16
    monkeypatch.setenv("KERNELS_CONFIG_SOLVE", "TF32M=1")
    assert chunk_gdn.launch_params(128, 128, torch.bfloat16)["solve"]["TF32M"] == 1
    assert chunk_gdn.launch_params(128, 128, torch.float32)["solve"]["TF32M"] == 0
    assert chunk_gdn.launch_params(128, 128, torch.float32, "ieee")["solve"]["TF32M"] == 0
    assert chunk_gdn.launch_params(128, 128, torch.float32, "tf32")["solve"]["TF32M"] == 1
    # w / u reads the key tile once for norms and w: 16-bit inputs up to a padded K of 128
    assert lp["wu"]["KONCE"] == 1 and chunk_gdn.launch_params(40, 24, torch.float16)["wu"]["KONCE"] == 1
    assert chunk_gdn.launch_params(256, 128, torch.bfloat16)["wu"]["KONCE"] == 0
    assert chunk_gdn.launch_params(128, 128, torch.float32)["wu"]["KONCE"] == 0
    monkeypatch.setenv("KERNELS_CONFIG_WU", "KONCE=0")
    assert chunk_gdn.launch_params(128, 128, torch.bfloat16)["wu"]["KONCE"] == 0


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's refusal")
def test_interpreter_refuses_bf16_inputs_with_one_line():
    """The Triton interpreter's ``tl.dot`` multiplies bf16 operands' bit patterns
    (triton-lang/triton#11584: a 16 x 16 product off by 1e10), so a bf16 call under it would return
    garbage: it is refused with one line instead; fp16 runs."""
    from kernels.chunk_gdn import INTERPRETER_BF16

    q, k, v, g, beta = make_inputs(70, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="11584") as err:
        chunk_gated_delta_rule(q, k, v, g, beta)
    assert str(err.value) == INTERPRETER_BF16 and "\n" not in INTERPRETER_BF16
    o, _, _ = chunk_gated_delta_rule(*make_inputs(70, dtype=torch.float16)[:3], g, beta, use_qk_l2norm=True)
    assert o.dtype == torch.float16 and torch.isfinite(o).all()


def test_fp32_products_default_to_tf32x3_and_a_bad_precision_is_one_line():
    """fp32 inputs take three tf32 tensor-core products per product unless the call says
    otherwise (``FP32_PRECISION``: IEEE FMA products spilled 17-56 KB per kernel and ran 14x
    slower on an H200 at the same error); 16-bit inputs always tf32; a precision Triton does not
    know is refused with one line before anything compiles."""
    from kernels import chunk_gdn

    assert chunk_gdn.FP32_PRECISION == "tf32x3"
    assert {chunk_gdn.launch_params(128, 128, torch.float32)[n]["PREC"] for n in ("solve", "wu", "state", "out")} == {
        "tf32x3"
    }
    assert chunk_gdn.launch_params(128, 128, torch.float32, "ieee")["state"]["PREC"] == "ieee"
    assert chunk_gdn.launch_params(128, 128, torch.float32, "tf32")["out"]["PREC"] == "tf32"
    assert chunk_gdn.launch_params(128, 128, torch.bfloat16, "ieee")["state"]["PREC"] == "tf32"
    q, k, v, g, beta = make_inputs(70)
    with pytest.raises(ValueError, match="input_precision must be one of") as err:
        chunk_gated_delta_rule(q, k, v, g, beta, input_precision="fp64")
    assert "\n" not in str(err.value)


def test_output_overlaps_only_the_gluon_loop(monkeypatch):
    """``OVL``: the output kernel overlaps the state loop (programmatically dependent launch,
    progress counters) only where the Gluon loop runs, the only loop that releases progress; the
    solve kernel zeroes the counters then, the output's grid is 1-d and chunk-major, and
    ``KERNELS_CONFIG_OUT=OVL=0`` turns it off. Without it nothing is launched dependent."""
    from kernels import chunk_gdn

    on = chunk_gdn.launch_params(128, 128, torch.bfloat16, None, True, True)
    assert on["state"]["GLUON"] == on["state"]["OVL"] == on["out"]["OVL"] == on["solve"]["OVL"] == 1
    assert on["out"]["launch_pdl"] is True and on["out"]["NVS"] == 128 // on["state"]["BV"] == 4
    assert on["state"]["SIG"] == chunk_gdn.CONFIGS["state"]["SIG"] == 16
    NT, HV = 7, 32
    grids = chunk_gdn._grids(on, 1, NT, HV, 128)
    assert grids[3] == (NT * HV, 1, 1)  # one program per chunk and head (a V block of 128)
    for lp in (
        chunk_gdn.launch_params(128, 128, torch.bfloat16),  # no Gluon device
        chunk_gdn.launch_params(128, 128, torch.float32, None, True, True),  # fp32: the Triton loop
        chunk_gdn.launch_params(64, 64, torch.bfloat16, None, True, True),  # K = 64: the Triton loop
    ):
        assert lp["state"]["GLUON"] == lp["out"]["OVL"] == lp["solve"]["OVL"] == 0
        assert "launch_pdl" not in lp["out"] and chunk_gdn._grids(lp, 1, NT, HV, 128)[3][0] == NT
    monkeypatch.setenv("KERNELS_CONFIG_OUT", "OVL=0")
    off = chunk_gdn.launch_params(128, 128, torch.bfloat16, None, True, True)
    assert off["state"]["GLUON"] == 1 and off["out"]["OVL"] == off["state"]["OVL"] == 0
    assert "launch_pdl" not in off["out"]


def test_fused_output_loop_is_opt_in_and_replaces_the_output_kernel(monkeypatch):
    """``KERNELS_CONFIG_STATE=FUSE=1`` runs the Gluon loop and the output in one warp-specialised
    program (``kernels.fused_gluon``): three launches, no overlapped output kernel (``OVL`` 0, so
    the solve kernel zeroes no progress counters). Off by default (slower on an H200 so far:
    docs/results-kernels.md), and never where the Gluon loop does not run (no Hopper, fp32 inputs,
    another head dim)."""
    from kernels import chunk_gdn, fused_gluon

    if fused_gluon._gluon_fused_kernel is None:
        pytest.skip("this Triton has no Gluon")
    lp = chunk_gdn.launch_params(128, 128, torch.bfloat16, None, True, True)
    assert lp["state"]["FUSE"] == 0 and lp["out"]["OVL"] == 1
    assert chunk_gdn._kernel_fns(lp) == (chunk_gdn._gluon_solve_kernel,) + chunk_gdn._KERNELS_GLUON[1:]
    monkeypatch.setenv("KERNELS_CONFIG_STATE", "FUSE=1")
    lp = chunk_gdn.launch_params(128, 128, torch.bfloat16, None, True, True)
    assert lp["state"]["FUSE"] == 1 and lp["out"]["OVL"] == 0 and lp["solve"]["OVL"] == 0
    assert "launch_pdl" not in lp["out"]
    fns = chunk_gdn._kernel_fns(lp)
    assert len(fns) == 3 and fns[-1] is chunk_gdn._gluon_fused_kernel
    assert set(fns[-1].arg_names) >= {"q", "gc", "o", "scale", "l2norm", "sqt", "sqh"}
    for args in ((128, 128, torch.bfloat16, None, True, False), (128, 128, torch.float32, None, True, True),
                 (64, 64, torch.bfloat16, None, True, True)):  # fmt: skip
        lp = chunk_gdn.launch_params(*args)
        assert lp["state"]["FUSE"] == 0 and chunk_gdn._kernel_fns(lp)[-1] is not chunk_gdn._gluon_fused_kernel


def test_rows_copied_where_gluon_cannot_prove_them_aligned():
    """``_rows(..., aligned=True)`` (16-bit inputs at K = 128 on a Gluon device): the queries and
    keys reach the kernels as a copy where a row's start is not provably 16-byte aligned (an
    address off 16 bytes, a token or head stride that is not a multiple of 16 elements: a padded
    fused-projection row), and as a view otherwise; without ``aligned`` only a last dim that is
    not contiguous is copied, as before."""
    from kernels import chunk_gdn

    T, H, K = 5, 2, 128
    base = torch.zeros(T * 2 * H * K + 16, dtype=torch.bfloat16)
    ok = base[: T * H * K].view(1, T, H, K)
    padded = base[: T * (H * K + 8)].view(1, T, H * K + 8)[..., : H * K].view(1, T, H, K)  # stride 264
    shifted = base[8 : 8 + T * H * K].view(1, T, H, K)  # 16 bytes in: aligned
    odd = base[1 : 1 + T * H * K].view(1, T, H, K)  # 2 bytes in
    heads = base[: T * 2 * H * K].view(1, T, 2 * H, K)[:, :, ::2]  # head stride 256: aligned
    assert odd.data_ptr() % 16 and padded.stride(1) % chunk_gdn.GLUON_STRIDE
    for x, copied in ((ok, False), (padded, True), (shifted, False), (odd, True), (heads, False)):
        got = chunk_gdn._rows(x, T, H, K, aligned=True)
        assert (got.data_ptr() != x.data_ptr()) == copied
        assert got.shape == (T, H, K) and torch.equal(got, x.reshape(T, H, K))
        if copied:
            assert got.is_contiguous() and got.data_ptr() % 16 == 0
        assert chunk_gdn._rows(x, T, H, K).data_ptr() == x.data_ptr()  # not aligned: a view
