"""State-loop grids selected by the state launch config: the 3-d grid (sequence, head, V block;
``VFAST=0``) and a wider V block, against the default 1-d grid with a head's V blocks adjacent
(``VFAST=1``, itself tested against the oracle in test_chunk_gdn.py): K != V,
two sequences with initial states, one starting off a 64-multiple, boundary states. Interpreter,
fp32, atol = rtol = 1e-5 as in test_chunk_gdn.py.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels.chunk_gdn import chunk_gated_delta_rule  # noqa: E402
from kernels.reference import naive_gated_delta_rule  # noqa: E402
from test_chunk_gdn import close, make_inputs, rand_state  # noqa: E402

# the default config's results, computed once per module and shared by a test's parameters (the
# interpreter takes seconds a call; each parameter compares another config with the same call)
_DEFAULT = {}


def _default(name, q, k, v, g, beta, **kw):
    if name not in _DEFAULT:
        _DEFAULT[name] = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    return _DEFAULT[name]


@pytest.mark.triton_compat  # both state grids: the 3-d grid and a wider V block
@pytest.mark.parametrize("cfg", ["VFAST=0", "VFAST=1,BV=32"])
def test_state_grid_matches_default(cfg, monkeypatch):
    cu = [0, 70, 200]
    q, k, v, g, beta = make_inputs(200, h=1, hv=2, dk=128, dv=64, seed=9)
    h0 = rand_state(2, hv=2, dk=128, dv=64, seed=4)
    kw = dict(initial_state=h0, cu_seqlens=cu, start_positions=[0, 30], use_qk_l2norm=True)
    ref = _default("state grid", q, k, v, g, beta, **kw)
    monkeypatch.setenv("KERNELS_CONFIG_STATE", cfg)
    got = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    for a, b in zip(got, ref):
        close(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", ["VFAST=0", "VFAST=1,BV=32"])
def test_gpu_state_grid_equals_default(cfg, monkeypatch):
    """On a GPU at qwen3.5-9b's heads: the grids only map programs differently, so every output is
    the same to the bit (run on an H200 with the 3-d grid as the default and VFAST=1 as the
    variant, 2026-12-02)."""
    from kernels.chunk_gdn import prepare_chunk_metadata

    half = torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    cu, starts = [0, 1500, 4096], [0, 100]
    q, k, v, g, beta = make_inputs(4096, h=16, hv=32, dk=128, dv=128, seed=5, device="cuda", dtype=half)
    h0 = rand_state(2, hv=32, dk=128, dv=128, seed=6, device="cuda")
    meta = prepare_chunk_metadata(cu, starts, device="cuda")
    kw = dict(initial_state=h0, chunk_metadata=meta, use_qk_l2norm=True)
    ref = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    monkeypatch.setenv("KERNELS_CONFIG_STATE", cfg)
    got = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(16, 32), (4, 8)], ids=["16-32", "4-8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_gluon_state_loop_equals_triton(dtype, heads, monkeypatch):
    """On Hopper the Gluon state loop (``kernels.state_gluon``, the default there at K = 128,
    16-bit) gives the Triton loop's bits (``GLUON=0``) for every output: varlen with an initial
    state and a start off a 64-multiple, a boundary at every chunk, every third, none; at the wide
    V block (16/32 heads) and the narrow one (4/8). Equal bits carry the Triton loop's restore
    invariants over."""
    from kernels import chunk_gdn

    if not chunk_gdn.gluon_device(torch.device("cuda")):
        pytest.skip("needs a Hopper GPU and a Triton with Gluon")
    h, hv = heads
    cu, starts = [0, 1500, 4096], [0, 100]
    q, k, v, g, beta = make_inputs(4096, h=h, hv=hv, dk=128, dv=128, seed=5, device="cuda", dtype=dtype)
    h0 = rand_state(2, hv=hv, dk=128, dv=128, seed=6, device="cuda")
    lp = chunk_gdn.launch_params(128, 128, dtype, None, chunk_gdn.state_wide(2, hv, 128, q.device), True)
    assert lp["state"]["GLUON"] == 1
    for sel in (dict(boundary_stride=1), dict(boundary_stride=3), dict(boundary_stride=1, states=False)):
        states = sel.pop("states", True)
        kw = dict(initial_state=h0, use_qk_l2norm=True, boundary_states=states)
        meta = chunk_gdn.prepare_chunk_metadata(cu, starts, device="cuda", **sel)
        got = [chunk_gdn.chunk_gated_delta_rule(q, k, v, g, beta, chunk_metadata=meta, **kw) for _ in range(3)]
        monkeypatch.setenv("KERNELS_CONFIG_STATE", "GLUON=0")
        meta = chunk_gdn.prepare_chunk_metadata(cu, starts, device="cuda", **sel)
        ref = chunk_gdn.chunk_gated_delta_rule(q, k, v, g, beta, chunk_metadata=meta, **kw)
        monkeypatch.delenv("KERNELS_CONFIG_STATE")
        for run in got:  # the generic launch, the direct one, the bound one
            for a, b in zip(run, ref):
                assert (a is None and b is None) or torch.equal(a, b), sel


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(16, 32), (4, 8)], ids=["16-32", "4-8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_fused_output_loop_matches_the_four_kernels(dtype, heads, monkeypatch):
    """The Gluon loop and the output in one warp-specialised program (``FUSE=1``) against the
    four-kernel call: the final and boundary states bit for bit (the state partition runs the same
    products in the same order), the output to a bf16 / fp16 rounding (the same products; the
    norms' sums are reduced in another order). Varlen with an initial state and a start off a
    64-multiple, and one sequence of 8K tokens; a boundary at every chunk, every third, none; the
    generic, direct and bound launches. On the H200 (2026-12-04, fourth session) every case held,
    with the output's largest difference 2.8e-3 of its largest value (bf16)."""
    from kernels import chunk_gdn

    if not chunk_gdn.gluon_device(torch.device("cuda")):
        pytest.skip("needs a Hopper GPU and a Triton with Gluon")
    h, hv = heads
    for T, cu, starts in ((4096, [0, 1500, 4096], [0, 100]), (8192, [0, 8192], [0])):
        q, k, v, g, beta = make_inputs(T, h=h, hv=hv, dk=128, dv=128, seed=5, device="cuda", dtype=dtype)
        h0 = rand_state(len(cu) - 1, hv=hv, dk=128, dv=128, seed=6, device="cuda")
        for sel in (dict(boundary_stride=1), dict(boundary_stride=3), dict(boundary_stride=1, states=False)):
            states = sel.pop("states", True)
            kw = dict(initial_state=h0, use_qk_l2norm=True, boundary_states=states)
            monkeypatch.setenv("KERNELS_CONFIG_STATE", "FUSE=1")
            lp = chunk_gdn.launch_params(
                128, 128, dtype, None, chunk_gdn.state_wide(len(cu) - 1, hv, 128, q.device), True
            )
            assert lp["state"]["FUSE"] == 1
            meta = chunk_gdn.prepare_chunk_metadata(cu, starts, device="cuda", **sel)
            got = [chunk_gdn.chunk_gated_delta_rule(q, k, v, g, beta, chunk_metadata=meta, **kw) for _ in range(3)]
            monkeypatch.setenv("KERNELS_CONFIG_STATE", "FUSE=0")
            meta = chunk_gdn.prepare_chunk_metadata(cu, starts, device="cuda", **sel)
            ref = chunk_gdn.chunk_gated_delta_rule(q, k, v, g, beta, chunk_metadata=meta, **kw)
            for o, ht, hb in got:
                assert torch.equal(ht, ref[1]), sel
                assert (hb is None and ref[2] is None) or torch.equal(hb, ref[2]), sel
                err = (o.float() - ref[0].float()).abs().max() / ref[0].float().abs().max()
                assert err < 1e-2, (sel, err.item())


def test_discard_is_planned_only_where_one_program_owns_whole_lines(monkeypatch):
    """``KERNELS_CONFIG_OUT=DISCARD=1`` (opt-in: the output kernel drops its chunk-start state's and
    v' rows' L2 lines after reading them, ``discard.global.L2``): planned only on a compiled GPU
    (the Gluon flag; never in the interpreter) with a V block of the whole V and rows of whole
    128-byte lines; off by default."""
    from kernels import chunk_gdn

    bf16 = torch.bfloat16
    assert chunk_gdn.launch_params(128, 128, bf16, None, True, True)["out"]["DISCARD"] == 0  # default
    monkeypatch.setenv("KERNELS_CONFIG_OUT", "DISCARD=1")
    gpu = chunk_gdn.launch_params(128, 128, bf16, None, True, True)["out"]
    assert gpu["DISCARD"] == 1 and gpu["BV"] == 128
    assert chunk_gdn.launch_params(128, 128, bf16)["out"]["DISCARD"] == 0  # no GPU: the interpreter
    assert chunk_gdn.launch_params(128, 128, torch.float32, None, True, True)["out"]["DISCARD"] == 0  # BV 64
    assert chunk_gdn.launch_params(32, 32, bf16, None, True, True)["out"]["DISCARD"] == 0  # 64-byte rows
    assert chunk_gdn.launch_params(128, 100, bf16, None, True, True)["out"]["DISCARD"] == 0  # V padded
    assert chunk_gdn.launch_params(100, 128, bf16, None, True, True)["out"]["DISCARD"] == 0  # K padded
    monkeypatch.setenv("KERNELS_CONFIG_OUT", "DISCARD=1,BV=64")
    assert chunk_gdn.launch_params(128, 128, bf16, None, True, True)["out"]["DISCARD"] == 0  # two V blocks


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["OVL=1", "OVL=1,DISCARD=1"])
def test_gpu_overlapped_output_equals_the_sequential_one(monkeypatch, out):
    """The output kernel beside the Gluon loop (``OVL``: launched programmatically dependent,
    waiting on progress counters) gives the bits of the one launched after it (``OVL=0``):
    - with a workspace reused from a call on other data, whose counters that call left at its
      last chunk (a counter not zeroed would release every chunk at once);
    - over 48 sequences, where the loop's 6144 programs do not all fit on the GPU at once (the
      output may only start once every one of them has started);
    - replayed from a CUDA graph on new data;
    - with the outputs read on the stream right after the call (the last output program waits for
      the loop, so the final and boundary states are there too)."""
    from kernels import chunk_gdn, workspace_bytes

    if not chunk_gdn.gluon_device(torch.device("cuda")):
        pytest.skip("needs a Hopper GPU and a Triton with Gluon")
    # ``DISCARD=1``: the same bits with the scratch's L2 lines dropped after the output's reads
    # (ragged starts below: rows of a chunk outside its sequence are kept)
    monkeypatch.setenv("KERNELS_CONFIG_OUT", out)
    dt = torch.bfloat16
    T, N = 48 * 160, 48
    cu = [i * 160 for i in range(N + 1)]
    data = [make_inputs(T, h=16, hv=32, dk=128, dv=128, seed=s, device="cuda", dtype=dt) for s in (21, 22)]
    h0 = rand_state(N, hv=32, dk=128, dv=128, seed=23, device="cuda")
    meta = chunk_gdn.prepare_chunk_metadata(cu, [i % 3 * 50 for i in range(N)], device="cuda")
    dev = torch.device("cuda")
    lp_out = chunk_gdn.launch_params(128, 128, dt, None, chunk_gdn.state_wide(N, 32, 128, dev), True)["out"]
    assert lp_out["OVL"] == 1 and lp_out["DISCARD"] == int("DISCARD=1" in out)
    ws = torch.empty(workspace_bytes(data[0][0], data[0][2], meta), dtype=torch.uint8, device=dev)
    kw = dict(initial_state=h0, use_qk_l2norm=True, chunk_metadata=meta)

    def run(x, **extra):
        return chunk_gdn.chunk_gated_delta_rule(*x, **kw, **extra)

    first = run(data[0], workspace=ws)
    second = [t.clone() for t in run(data[1], workspace=ws)]  # the counters of ``first`` in ws
    static = [t.clone() for t in data[0]]
    run(static)  # compiled and planned before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(static)
    for dst, src in zip(static, data[1]):
        dst.copy_(src)
    graph.replay()
    replayed = [t.clone() for t in captured]
    monkeypatch.setenv("KERNELS_CONFIG_OUT", "OVL=0")
    ref0, ref1 = run(data[0]), run(data[1])
    for got, ref in ((first, ref0), (second, ref1), (replayed, ref1)):
        for a, b in zip(got, ref):
            assert torch.equal(a, b)


def test_output_blocks_of_128_match_blocks_of_64_in_fp16(monkeypatch):
    """16-bit inputs take the output kernel's V block of 128: at V = 256 two blocks, against four
    blocks of 64 (the block only splits the output's columns among programs, so the outputs agree
    to fp16 rounding and the states, which the output kernel never touches, to the bit) and
    against the fp32 oracle; K != V, varlen with an initial state. Interpreter, fp16: its bf16
    arithmetic is not trustworthy (outputs of 1e10 where the oracle's are 0.15, before and after
    this change), the GPU suite runs bf16."""
    from kernels import chunk_gdn

    assert chunk_gdn.launch_params(64, 256, torch.float16)["out"]["BV"] == 128
    cu = [0, 70, 150]
    q, k, v, g, beta = make_inputs(150, h=1, hv=1, dk=64, dv=256, seed=12, dtype=torch.float16)
    h0 = rand_state(2, hv=1, dk=64, dv=256, seed=13)
    kw = dict(initial_state=h0, cu_seqlens=cu, use_qk_l2norm=True)
    o128, ht128, hb128 = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    monkeypatch.setenv("KERNELS_CONFIG_OUT", "BV=64")
    o64, ht64, hb64 = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    assert o128.dtype == torch.float16
    close(o128.float(), o64.float(), atol=1e-3, rtol=1e-3)
    assert torch.equal(ht128, ht64) and torch.equal(hb128, hb64)
    ro, rf, rb, _ = naive_gated_delta_rule(q.float(), k.float(), v.float(), g, beta, **kw)
    close(o128, ro, atol=2e-3, rtol=2e-3)
    close(ht128, rf, atol=2e-3, rtol=2e-3)
    close(hb128, rb, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize(
    "env,cfg", [("SOLVE", "TRANS=0"), ("SOLVE", "TF32M=1"), ("SOLVE", "BKS=32,TRANS=0"), ("WU", "KONCE=0")]
)
def test_solve_and_wu_knobs_match_the_default(env, cfg, monkeypatch):
    """The solve kernel's knobs (the keys' transpose loaded instead of made in registers, tf32
    block-inverse merges, a key block of 32) and w / u's (the keys in two passes over blocks of 64
    instead of one read of the whole tile) against the default, K != V, varlen with initial
    states, fp16 inputs (the ones TF32M applies to; the interpreter computes tf32 products in
    fp32, so this pins the code path, not tf32's rounding). Interpreter."""
    cu = [0, 70, 200]
    q, k, v, g, beta = make_inputs(200, h=1, hv=2, dk=128, dv=64, seed=14, dtype=torch.float16)
    h0 = rand_state(2, hv=2, dk=128, dv=64, seed=15)
    kw = dict(initial_state=h0, cu_seqlens=cu, use_qk_l2norm=True)
    ref = _default("solve and wu", q, k, v, g, beta, **kw)
    monkeypatch.setenv(f"KERNELS_CONFIG_{env}", cfg)
    got = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    for a, b in zip(got, ref):
        close(a, b, atol=1e-3, rtol=1e-3)
