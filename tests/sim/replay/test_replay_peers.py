"""The peer backends' adapters (sim/replay/peers.py) on the CPU, without the peers: the boundary
splitting and the argument mapping driven by stand-ins built from kernels.torch_gdn, checked
against the project's torch backend at fp32 tolerance (outputs, final states, boundary states at
absolute positions; a call starting off a 64-multiple, varlen with 2 sequences); the checks that
refuse a backend in one line; `--kernel ours`; `--kernel fla` without FLA (a subprocess in which
importing it fails). The peers themselves on a GPU: test_replay_peers_gpu.py."""

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernels import torch_gdn  # noqa: E402
from kernels._common import prepare_chunk_metadata  # noqa: E402
from sim.errors import UsageError  # noqa: E402
from sim.replay import peers  # noqa: E402
from sim.replay.backends import (  # noqa: E402
    GDN_BACKENDS,
    KERNEL_ALIASES,
    GDNBackend,
    device_problem,
    kernel_choices,
    resolve_kernel,
)
from sim.replay.session import ReplaySettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
H, HV, K, V = 1, 2, 16, 8
TOL = 1e-5


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def inputs(T, seed=0, N=1):
    gen = torch.Generator().manual_seed(seed)

    def r(*s, std=1.0):
        return torch.randn(*s, generator=gen) * std

    return dict(
        q=r(1, T, H, K),
        k=r(1, T, H, K),
        v=r(1, T, HV, V),
        g=r(1, T, HV),
        beta=r(1, T, HV),
        A_log=r(HV, std=0.3),
        dt_bias=r(HV, std=0.3),
        h0=r(N, HV, K, V, std=0.5),
    )


def torch_run(calls):
    """A ``PeerRun`` from the torch backend (no boundary states; the peer's chunk grid starts at
    each sequence's first token, as FLA's and FlashQLA's do); records the calls."""

    def run(q, k, v, g, beta, h0, cu, flags):
        calls.append((q.shape[1], cu, h0 is not None))
        o, ht, _ = torch_gdn.chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            scale=flags.scale,
            initial_state=h0,
            cu_seqlens=cu,
            use_qk_l2norm=flags.use_qk_l2norm,
            boundary_states=False,
            A_log=flags.A_log,
            dt_bias=flags.dt_bias,
            use_gate_in_kernel=flags.use_gate_in_kernel,
            use_beta_sigmoid=flags.use_beta_sigmoid,
        )
        return o, ht

    return run


REPLAY_FLAGS = dict(use_qk_l2norm=True, use_gate_in_kernel=True, use_beta_sigmoid=True)


def both(x, meta, *, initial=True, boundary_states=True, core=None, **flags):
    """(reference: the torch backend with its boundary states, adapted: ``core`` or the split
    adapter over the torch stand-in, calls made)."""
    flags = {**REPLAY_FLAGS, **flags}
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    kw = dict(
        initial_state=x["h0"] if initial else None,
        chunk_metadata=meta,
        boundary_states=boundary_states,
        A_log=x["A_log"],
        dt_bias=x["dt_bias"],
        **flags,
    )
    ref = torch_gdn.chunk_gated_delta_rule(*args, **kw)
    calls = []
    if core is None:
        got = peers.adapted_chunk_gated_delta_rule(torch_run(calls), *args, **kw)
    else:
        got = core(*args, **kw)
    return ref, got, calls


def assert_same(ref, got, nb):
    (o, ht, hb), (o2, ht2, hb2) = ref, got
    assert o2.shape == o.shape and o2.dtype == o.dtype
    assert ht2.dtype == torch.float32 and ht2.shape == ht.shape
    assert rel(o2, o) < TOL and rel(ht2, ht) < TOL
    if nb is None:
        assert hb is None and hb2 is None
        return
    assert hb2.shape == hb.shape == (nb, HV, K, V) and hb2.dtype == hb.dtype
    for j in range(nb):
        assert rel(hb2[j], hb[j]) < TOL, j


def test_one_sequence_off_a_multiple_of_64_split_at_its_boundaries():
    # positions [100, 400): boundaries 128, 256, 384 (the first chunk ragged on the absolute grid)
    x = inputs(300)
    meta = prepare_chunk_metadata([0, 300], [100], boundary_indices=[128, 256, 384])
    assert meta.boundary_positions == [[128, 256, 384]]
    ref, got, calls = both(x, meta)
    assert_same(ref, got, 3)
    # four peer calls, each from the state the one before ended in: 28, 128, 128, 16 tokens
    assert [c[0] for c in calls] == [28, 128, 128, 16] and all(c[1] is None and c[2] for c in calls)
    # the boundary at 256 is the state after 156 tokens: the state of a call over those alone
    head = {k: v[:, :156] if v.dim() > 1 and k != "h0" else v for k, v in x.items()}
    (_, h156, _), _, _ = both(head, prepare_chunk_metadata([0, 156], [100]), boundary_states=False)
    assert rel(got[2][1], h156[0]) < TOL


def test_a_boundary_at_the_end_of_the_call_is_its_final_state():
    x = inputs(284)
    meta = prepare_chunk_metadata([0, 284], [100], boundary_indices=[384])
    ref, got, calls = both(x, meta, initial=False)
    assert_same(ref, got, 1)
    assert len(calls) == 1 and calls[0][2] is False  # one call, from zeros
    assert torch.equal(got[2][0], got[1][0])


def test_every_boundary_and_no_boundary():
    x = inputs(200, seed=1)
    meta = prepare_chunk_metadata([0, 200], [0])  # every 64-multiple: 64, 128, 192
    ref, got, calls = both(x, meta)
    assert_same(ref, got, 3)
    assert [c[0] for c in calls] == [64, 64, 64, 8]
    ref, got, calls = both(x, meta, boundary_states=False)
    assert_same(ref, got, None)
    assert len(calls) == 1


def test_varlen_two_sequences_round_by_round():
    # sequence 0: 150 tokens at [30, 180), boundaries 64, 128; sequence 1: 250 at [64, 314): 128, 256
    x = inputs(400, seed=2, N=2)
    meta = prepare_chunk_metadata([0, 150, 400], [30, 64], boundary_indices=[[64, 128], [128, 256]])
    ref, got, calls = both(x, meta)
    assert_same(ref, got, 4)
    # round j runs the j-th piece of both sequences as one varlen call
    assert calls == [(98, [0, 34, 98], True), (192, [0, 64, 192], True), (110, [0, 52, 110], True)]
    # without initial states the first round starts from zeros
    ref, got, calls = both(x, meta, initial=False)
    assert_same(ref, got, 4)
    assert [c[2] for c in calls] == [False, True, True]
    # no boundary states: one varlen call over both sequences
    ref, got, calls = both(x, meta, boundary_states=False)
    assert_same(ref, got, None)
    assert calls == [(400, [0, 150, 400], True)]


def test_varlen_sequences_with_different_piece_counts_and_an_empty_one():
    x = inputs(230, seed=3, N=3)
    meta = prepare_chunk_metadata([0, 200, 200, 230], [0, 5, 64], boundary_indices=[[64, 128, 192], [], []])
    ref, got, calls = both(x, meta)
    assert_same(ref, got, 3)
    assert [c[1] for c in calls] == [[0, 64, 94], None, None, None]
    assert torch.equal(got[1][1], x["h0"][1])  # the empty sequence keeps its initial state


def test_bf16_inputs_and_state_dtype():
    x = {k: (v.bfloat16() if k in ("q", "k", "v") else v) for k, v in inputs(200, seed=4).items()}
    meta = prepare_chunk_metadata([0, 200], [0], boundary_indices=[128])
    ref, got, _ = both(x, meta)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == got[2].dtype == torch.float32
    assert rel(got[0], ref[0]) < 1e-2 and rel(got[1], ref[1]) < 1e-2 and rel(got[2], ref[2]) < 1e-2
    o, ht, hb = peers.adapted_chunk_gated_delta_rule(
        torch_run([]),
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        chunk_metadata=meta,
        state_dtype=torch.bfloat16,
        A_log=x["A_log"],
        dt_bias=x["dt_bias"],
        **REPLAY_FLAGS,
    )
    assert hb.dtype == torch.bfloat16 and ht.dtype == torch.float32


def test_metadata_from_arguments_and_batched_inputs():
    """Without chunk_metadata: cu_seqlens / start_positions / boundary_stride, and B > 1 (B sequences)."""
    x = inputs(256, seed=5)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    kw = dict(start_positions=[64], boundary_stride=2, A_log=x["A_log"], dt_bias=x["dt_bias"], **REPLAY_FLAGS)
    ref = torch_gdn.chunk_gated_delta_rule(*args, **kw)
    got = peers.adapted_chunk_gated_delta_rule(torch_run([]), *args, **kw)
    assert_same(ref, got, 2)  # 128, 256
    xb = [t.reshape(2, 128, *t.shape[2:]) for t in args]
    ref = torch_gdn.chunk_gated_delta_rule(*xb, initial_state=x["h0"].repeat(2, 1, 1, 1), **REPLAY_FLAGS, **kw_gate(x))
    got = peers.adapted_chunk_gated_delta_rule(
        torch_run([]), *xb, initial_state=x["h0"].repeat(2, 1, 1, 1), **REPLAY_FLAGS, **kw_gate(x)
    )
    assert got[0].shape == (2, 128, HV, V)
    assert_same(ref, got, 4)


def kw_gate(x):
    return dict(A_log=x["A_log"], dt_bias=x["dt_bias"])


def test_bad_arguments_are_refused_like_the_kernels():
    x = inputs(64)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    with pytest.raises(ValueError, match="use_gate_in_kernel needs A_log and dt_bias"):
        peers.adapted_chunk_gated_delta_rule(torch_run([]), *args, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="initial_state must be"):
        peers.adapted_chunk_gated_delta_rule(torch_run([]), *args, initial_state=x["h0"][:, :1])
    with pytest.raises(ValueError, match="head dim K=16 is not supported"):
        peers.adapted_chunk_gated_delta_rule(torch_run([]), *args, max_head_dim=8)


# ---- the two adapters' argument mapping, the peers replaced by torch stand-ins of their API --------
def fla_standin(calls):
    """FLA's chunk_gated_delta_rule (its keyword names; cu_seqlens a long tensor with a host copy)."""

    def fn(
        q,
        k,
        v,
        g,
        beta,
        *,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel,
        cu_seqlens=None,
        cu_seqlens_cpu=None,
        use_gate_in_kernel=False,
        A_log=None,
        dt_bias=None,
    ):
        assert output_final_state is True
        if cu_seqlens is not None:
            assert cu_seqlens.dtype == torch.long and torch.equal(cu_seqlens.cpu(), cu_seqlens_cpu)
        calls.append(q.shape[1])
        o, ht, _ = torch_gdn.chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            scale=scale,
            initial_state=initial_state,
            cu_seqlens=cu_seqlens_cpu,
            use_qk_l2norm=use_qk_l2norm_in_kernel,
            use_beta_sigmoid=use_beta_sigmoid_in_kernel,
            use_gate_in_kernel=use_gate_in_kernel,
            A_log=A_log,
            dt_bias=dt_bias,
            boundary_states=False,
        )
        return o, ht

    return fn


def flashqla_standin(calls):
    """FlashQLA's chunk_gated_delta_rule: log decay and beta given, only the l2norm in its kernel."""

    def fn(q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens):
        assert output_final_state is True and g.dtype == beta.dtype == torch.float32
        assert q.dtype == k.dtype == v.dtype
        calls.append(q.shape[1])
        o, ht, _ = torch_gdn.chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            scale=scale,
            initial_state=initial_state,
            cu_seqlens=None if cu_seqlens is None else cu_seqlens.tolist(),
            use_qk_l2norm=use_qk_l2norm_in_kernel,
            boundary_states=False,
        )
        return o, ht

    return fn


@pytest.fixture
def standins(monkeypatch):
    calls = {"fla": [], "flashqla": []}
    monkeypatch.setitem(peers._FLA, "fn", fla_standin(calls["fla"]))
    monkeypatch.setitem(peers._FLASHQLA, "fn", flashqla_standin(calls["flashqla"]))
    return calls


@pytest.mark.parametrize("peer", ["fla", "flashqla"])
def test_adapters_map_the_project_signature_onto_the_peers(standins, peer):
    core = {"fla": peers.fla_chunk_gated_delta_rule, "flashqla": peers.flashqla_chunk_gated_delta_rule}[peer]
    x = inputs(400, seed=6, N=2)
    meta = prepare_chunk_metadata([0, 150, 400], [30, 64], boundary_indices=[[64, 128], [128, 256]])
    ref, got, _ = both(x, meta, core=core)
    assert_same(ref, got, 4)
    assert standins[peer] == [98, 192, 110]
    x1 = inputs(300, seed=7)
    ref, got, _ = both(x1, prepare_chunk_metadata([0, 300], [100], boundary_indices=[256]), core=core)
    assert_same(ref, got, 1)
    # the scale passes through; the gate and beta inputs taken raw or precomputed
    ref, got, _ = both(x1, prepare_chunk_metadata([0, 300], [0]), core=core, use_gate_in_kernel=False, scale=0.3)
    assert_same(ref, got, 4)


def test_the_gate_in_torch_is_the_kernels_gate():
    x = inputs(64, seed=8)
    g, b = peers.torch_gate_beta(
        x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"], use_gate_in_kernel=True, use_beta_sigmoid=True
    )
    want = -torch.exp(x["A_log"]) * torch.log1p(torch.exp(x["g"] + x["dt_bias"]))
    assert torch.allclose(g, want, rtol=1e-6, atol=1e-7) and torch.allclose(b, torch.sigmoid(x["beta"]))
    g, b = peers.torch_gate_beta(x["g"].bfloat16(), x["beta"].bfloat16())
    assert g.dtype == b.dtype == torch.float32


# ---- the registry, the checks that refuse a backend, the replay model on an adapted backend --------
def test_registry_lists_the_peers_and_the_alias():
    assert kernel_choices() == ("auto", "triton", "torch", "fla", "flashqla", "ours")
    assert KERNEL_ALIASES == {"ours": "triton"} and resolve_kernel("ours", "cpu") == "triton"
    assert GDN_BACKENDS["fla"].cuda_only and GDN_BACKENDS["flashqla"].cuda_only
    assert not GDN_BACKENDS["triton"].cuda_only and not GDN_BACKENDS["torch"].cuda_only
    assert device_problem("fla", "cpu").startswith("--kernel fla needs a CUDA GPU")
    assert device_problem("flashqla", "cuda:0") is None and device_problem("ours", "cpu") is None
    with pytest.raises(UsageError, match="--kernel flashqla needs a CUDA GPU"):
        ReplaySettings(device="cpu", kernel="flashqla").validate()
    ReplaySettings(device="cpu", kernel="ours", dtype="fp32").validate()
    with pytest.raises(UsageError, match="triton#11584"):  # the interpreter's bf16 products are wrong
        ReplaySettings(device="cpu", kernel="ours", dtype="bf16").validate()
    ReplaySettings(device="cpu", kernel="torch", dtype="bf16").validate()


def test_checks_refuse_in_one_line(monkeypatch):
    f32, bf16 = torch.float32, torch.bfloat16
    assert "needs a CUDA GPU" in peers.fla_problem("cpu", f32, 128, 128)
    assert peers.fla_problem("cuda", f32, 512, 128).startswith("--kernel fla: FLA takes head dims up to 256")
    line = peers.flashqla_problem("cpu", bf16, 128, 128)
    assert line == "--kernel flashqla needs a Hopper or Blackwell GPU (sm90 / sm100 / sm103 / sm120); cpu is none"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    assert peers.flashqla_problem("cuda", bf16, 128, 128).endswith("; NVIDIA A100 is sm80")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert peers.flashqla_problem("cuda", f32, 128, 128) == (
        "--kernel flashqla runs bf16 / fp16 only (FlashQLA's kernels), not float32"
    )
    assert "K = V = 128" in peers.flashqla_problem("cuda", bf16, 16, 16)
    for lines in (peers.fla_problem("cpu", f32, 1, 1), peers.flashqla_problem("cpu", f32, 1, 1)):
        assert "\n" not in lines


def test_import_failures_name_the_package(monkeypatch):
    def missing(name):
        def imp(mod):
            raise ImportError(f"No module named {name!r}", name=name)

        return imp

    monkeypatch.delitem(peers._FLA, "fn", raising=False)
    monkeypatch.setattr(peers.importlib, "import_module", missing("fla"))
    assert peers.fla_problem("cuda", torch.bfloat16, 128, 128) == peers.FLA_HINT
    monkeypatch.setattr(peers.importlib, "import_module", missing("einops"))
    line = peers.fla_problem("cuda", torch.bfloat16, 128, 128)
    assert line.startswith(peers.FLA_HINT + ": importing it failed (ImportError") and "einops" in line
    monkeypatch.delitem(peers._FLASHQLA, "fn", raising=False)
    monkeypatch.setattr(peers.importlib, "import_module", missing("flash_qla"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert peers.flashqla_problem("cuda", torch.bfloat16, 128, 128) == peers.FLASHQLA_HINT


def test_a_peer_broken_inside_its_import_is_one_line(monkeypatch):
    """Seen on an H200 (2026-12-03): TileLang 0.1.15 beside apache-tvm-ffi 0.1.15.post2 raises a
    RuntimeError while importing, and FLA, which imports TileLang where installed, with it. The
    problem check says so in one line with the pin, instead of a traceback."""

    def broken(mod):
        raise RuntimeError("'tl.SwizzleMode' has no enum at string index 'NONE'\n  more detail")

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(peers.importlib, "import_module", broken)
    for problem, cache, hint in (
        (peers.fla_problem, peers._FLA, peers.FLA_HINT),
        (peers.flashqla_problem, peers._FLASHQLA, peers.FLASHQLA_HINT),
    ):
        monkeypatch.delitem(cache, "fn", raising=False)
        line = problem("cuda", torch.bfloat16, 128, 128)
        assert line == (
            f"{hint}: importing it failed (RuntimeError: 'tl.SwizzleMode' has no enum at string index 'NONE'); "
            f"{peers.TILELANG_PIN}"
        )

    def other(mod):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(peers.importlib, "import_module", other)
    monkeypatch.delitem(peers._FLA, "fn", raising=False)
    line = peers.fla_problem("cuda", torch.bfloat16, 128, 128)
    assert line == f"{peers.FLA_HINT}: importing it failed (OSError: libcuda.so.1: cannot open shared object file)"


def test_a_model_on_an_adapted_backend_matches_the_torch_backend(tiny_shape, standins, monkeypatch):
    """The replay stack on the fla adapter (FLA replaced by its torch stand-in): the same outputs,
    final and boundary states as on the torch backend, boundaries at 64-multiples and off them."""
    from sim.replay.model import HybridModel

    monkeypatch.setitem(
        GDN_BACKENDS,
        "fla-standin",
        GDNBackend(
            "fla-standin",
            "kernels.torch_gdn:causal_conv1d",
            "sim.replay.peers:fla_chunk_gated_delta_rule",
            triton=False,
            about="test",
        ),
    )
    models = {k: HybridModel(tiny_shape, device="cpu", seed=3, kernel=k) for k in ("torch", "fla-standin")}
    toks = torch.arange(7, 207) % 500
    got = {}
    for name, m in models.items():
        sink = {}
        keep = sink.setdefault
        st, _, _ = m.run(toks[:130], None, 0, [64, 100, 128], lambda p, l, r, c, keep=keep: keep((p, l), r.clone()))
        fin, outs, _ = m.run(toks[130:], st, 130, [192], lambda p, l, r, c, keep=keep: keep((p, l), r.clone()), True)
        got[name] = (sink, fin, outs)
    (s0, f0, o0), (s1, f1, o1) = got["torch"], got["fla-standin"]
    assert set(s0) == set(s1) == {(p, l) for p in (64, 100, 128, 192) for l in range(tiny_shape.layers)}
    for key in s0:
        assert rel(s1[key], s0[key]) < 1e-4, key
    assert rel(f1.rec, f0.rec) < 1e-4 and rel(o1[-1], o0[-1]) < 1e-4
    assert standins["fla"]  # the stand-in ran


def test_model_refuses_a_backend_that_cannot_run(tiny_shape):
    from sim.replay.model import HybridModel

    with pytest.raises(UsageError, match="--kernel fla needs a CUDA GPU"):
        HybridModel(tiny_shape, device="cpu", kernel="fla")


def test_shadow_falls_back_where_the_peer_has_no_fp32(tiny_shape, monkeypatch):
    from sim.replay.model import HybridModel

    m = HybridModel(tiny_shape, device="cpu", kernel="torch")
    monkeypatch.setattr(GDNBackend, "problem", lambda self, d, dt, k, v: "no fp32" if dt == torch.float32 else None)
    m.dtype = torch.bfloat16
    up = m.upcast(torch.float32)
    assert up.kernel == "torch" and up.dtype == torch.float32  # the device's default backend
    monkeypatch.setattr(GDNBackend, "problem", lambda self, d, dt, k, v: None)
    assert m.upcast(torch.float32).kernel == "torch"


# ---- the CLI ---------------------------------------------------------------------------------------
BLOCK_FLA = (
    # importing fla fails, whichever way it is imported (a finder ahead of the real ones)
    "import sys\n"
    "class NoFLA:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'fla':\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, NoFLA())\n"
    # a CUDA GPU as far as the checks before the model go: the refusal comes before any weights
    "import torch\n"
    "torch.cuda.is_available = lambda: True\n"
)


def test_kernel_fla_without_fla_is_one_line_exit_2():
    code = BLOCK_FLA + (
        "import sys\nfrom sim.cli import main\n"
        "sys.argv = ['marconi', 'replay', '--model', 'replay-tiny', '--trace', 'synthetic:chat', '--requests', '2',"
        " '--kernel', 'fla', '--no-progress']\nmain()\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == "Error: --kernel fla needs flash-linear-attention (pip install flash-linear-attention)"
