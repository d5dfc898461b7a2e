"""The peer backends on a CUDA GPU (run with `pytest -m gpu`; each peer's tests skip, with its
one-line reason, where it is not installed or cannot run: FlashQLA needs sm90 / sm100 / sm120):
``fla`` and ``flashqla`` against the project's Triton backend at qwen3.5-9b's gated-delta head
shapes (K = V = 128, H = 16, HV = 32) in bf16, as replay calls them (raw gate and beta, q / k
l2norm, fp32 initial state): outputs, final states and boundary states at absolute positions, one
sequence starting off a 64-multiple and 2 varlen sequences; and a whole replay on each peer with
every hit validated."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels._common import prepare_chunk_metadata  # noqa: E402
from sim.config import SimConfig  # noqa: E402
from sim.replay.backends import GDN_BACKENDS  # noqa: E402
from sim.replay.session import ReplaySettings, run_replay  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces.registry import TraceOptions, load_trace  # noqa: E402

pytestmark = pytest.mark.gpu

PEERS = ("fla", "flashqla")
H, HV, K, V = 16, 32, 128, 128  # qwen3.5-9b's gated-delta heads
#: relative Frobenius difference allowed between two bf16 implementations (each is ~3e-3 from the
#: fp32 oracle at these shapes: docs/results-kernels.md)
BF16_TOL = 2e-2
CHAT = "synthetic:chat:sessions=3,turns=3,prompt_tokens=600,user_tokens=150,output_tokens=100,prompts=2"


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


@pytest.fixture(params=PEERS)
def peer(request):
    problem = GDN_BACKENDS[request.param].problem(torch.device("cuda"), torch.bfloat16, K, V)
    if problem:
        pytest.skip(problem)
    return request.param


def replay_inputs(T, N, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s, std=1.0, dtype=torch.bfloat16):
        return (torch.randn(*s, generator=gen, device="cuda") * std).to(dtype)

    return dict(
        q=r(1, T, H, K),
        k=r(1, T, H, K),
        v=r(1, T, HV, V),
        g=r(1, T, HV),  # the raw gate input a
        beta=r(1, T, HV),  # the beta logit b
        A_log=torch.log(torch.linspace(1.0, 16.0, HV, device="cuda")),
        dt_bias=r(HV, std=0.5, dtype=torch.float32),
        initial_state=r(N, HV, K, V, std=0.05, dtype=torch.float32),
    )


def call(name, x, meta):
    core = GDN_BACKENDS[name].load()[1]
    return core(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        initial_state=x["initial_state"],
        chunk_metadata=meta,
        use_qk_l2norm=True,
        A_log=x["A_log"],
        dt_bias=x["dt_bias"],
        use_gate_in_kernel=True,
        use_beta_sigmoid=True,
        boundary_states=True,
    )


@pytest.mark.parametrize(
    "cu, starts, wanted",
    [
        ([0, 2000], [100], [[128, 512, 1024, 2048]]),  # off a 64-multiple; a boundary at the end
        ([0, 700, 2000], [0, 300], [[64, 640], [384, 1024, 1536]]),  # varlen, 2 sequences
    ],
)
def test_peer_matches_the_triton_backend(peer, cu, starts, wanted):
    x = replay_inputs(cu[-1], len(starts))
    meta = prepare_chunk_metadata(cu, starts, boundary_indices=wanted, device="cuda")
    o, ht, hb = call("triton", x, meta)
    o2, ht2, hb2 = call(peer, x, meta)
    torch.cuda.synchronize()
    assert o2.dtype == o.dtype and ht2.dtype == hb2.dtype == torch.float32
    assert hb2.shape == hb.shape == (meta.num_boundaries, HV, K, V)
    errs = dict(o=rel(o2, o), final=rel(ht2, ht), boundaries=max(rel(hb2[j], hb[j]) for j in range(len(hb))))
    print(f"PEERERR {peer} cu={cu} starts={starts}: " + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    assert max(errs.values()) < BF16_TOL, errs


def test_whole_replay_on_the_peer(peer):
    cfg = SimConfig(
        policy="marconi", model="qwen3.5-9b", capacity_bytes=2 * 10**9, alpha=0.5, state_alignment="exact", mode="des"
    )
    chat = load_trace(CHAT, TraceOptions())
    res = run_replay(chat, cfg, ReplaySettings(layers=4, dtype="bf16", device="cuda", kernel=peer), build=build)
    s = res.summary
    assert res.failures == [], [f.message() for f in res.failures[:5]]
    assert s["kernel"] == peer and res.settings["kernel"] == peer
    assert s["hits"] > 0 and s["hits_validated"] == s["hits"]
    print(
        f"PEERREPLAY {peer}: hits {s['hits']}, max restore error {s['max_restore_error']:.2e}, wall {s['wall_s']:.1f} s"
    )
