"""Benchmark: the project's chunked SSD (Mamba2) forward vs mamba_ssm's and FLA's on a CUDA GPU.

    python benchmarks/ssd_bench.py [--small] [--lengths 4096,8192] [--json out.json]
        [--no-mamba] [--no-fla] [--profile] [--variant NAME:VAR=VALUE]
    python benchmarks/ssd_bench.py --sweep [--lengths 32768]    (ours at each state-loop config)

Shapes: the Mamba2 layers of the presets (``SHAPES``: marconi-7b, Nemotron-H 8B; heads x head dim,
d_state, groups), one sequence, bf16 x / dt / B / C, fp32 A, D, dt_bias, dt softplus in the
kernel. Modes:

- ``states``: ours (``kernels.chunk_ssd``) with the fp32 state at every 64-token boundary (what a
  prefix cache needs), ``states128`` / ``states256``: the fp32 state at every 128 / 256 tokens
  (``boundary_stride`` 2 / 4: the grid of Nemotron-H's ``chunk_size`` and of mamba_ssm's default
  chunk, where the engines take a Mamba2 layer's prefix-cache states from the chunk scan's
  intermediate states), ``nostates``: ours without boundary states;
- ``mamba256`` / ``mamba128``: mamba_ssm's ``mamba_chunk_scan_combined`` at chunk 256 (mamba_ssm's
  default) / 128 (Nemotron-H's ``chunk_size``), final state returned, no chunk states emitted;
- ``fla``: FLA's ``chunk_simple_gla`` with the same recurrence written as gated linear attention
  (q = C, k = dt B, v = x per head, log decay g = dt A; the dt / softplus / D work done outside,
  not timed), final state returned;
- the peers doing our job, the fp32 state at every 64 tokens out (``STATE_PEERS``):
  ``mamba64-states``: mamba_ssm's forward pieces at chunk 64 (``_chunk_cumsum_fwd``,
  ``_chunk_state_fwd``, ``_state_passing_fwd`` with fp32 out, ``_bmm_chunk_fwd``,
  ``_chunk_scan_fwd``: ``_mamba_chunk_scan_combined_fwd`` with the chunk states kept in fp32, as an
  engine caching a Mamba2 layer's prefix takes them); ``fla-states``: FLA's pieces
  (``chunk_local_cumsum``, ``chunk_fwd_h`` with ``states_in_fp32=True``, ``chunk_fwd_o``, whose
  products take the states in the inputs' dtype: a bf16 copy of them, as our loop writes one).
  Each returns ``(y, final_state, chunk states [NT, H, P, N] fp32)``; ``state_peer_errors``
  checks them against ours (the GPU test ``test_gpu_state_emitting_peers_agree``).

Timing: ``triton.testing.do_bench`` (median, "plain") and ``do_bench_cudagraph`` (median, "graph").
The ratio columns divide each row by the faster of the peers (mamba256, mamba128, fla) in the
same timing; the issue's target is ``states`` <= 1.0x. ``x states-peer`` divides by the faster of
the state-emitting peers. Without torch, triton or a CUDA GPU the
script prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: (name, heads, head dim, d_state, groups)
SHAPES = (("marconi-7b", 128, 64, 128, 1), ("nemotron-h-8b", 128, 64, 128, 8))
PEERS = ("mamba256", "mamba128", "fla")
#: the peers that emit the fp32 state at every 64 tokens, as ``states`` does
STATE_PEERS = ("mamba64-states", "fla-states")
#: the chunk of the state-emitting peers (the tokens between emitted states)
STATE_CHUNK = 64
#: the tokens on which the state-emitting peers are checked against ours (a multiple of 64: the
#: last chunk state is the final one on both sides)
CHECK_T = 1024


def inputs(torch, T: int, H: int, P: int, N: int, G: int):
    """Seeded inputs scaled like a trained layer's (dt near softplus(-1), A in [-8, -1])."""
    import math

    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(1, T, H, P, device=dev, dtype=bf)
    dt = (torch.randn(1, T, H, device=dev) - 1).to(bf)
    A = -torch.exp(torch.rand(H, device=dev) * math.log(8.0))
    B = (torch.randn(1, T, G, N, device=dev) / math.sqrt(N)).to(bf)
    C = torch.randn(1, T, G, N, device=dev, dtype=bf)
    D = torch.randn(H, device=dev)
    bias = 0.5 * torch.randn(H, device=dev)
    return x, dt, A, B, C, D, bias


def load_mamba_chunk_scan():
    """mamba_ssm's ``mamba_chunk_scan_combined`` (``load_mamba_module``'s)."""
    return load_mamba_module().mamba_chunk_scan_combined


def load_mamba_module():
    """mamba_ssm's ``ops.triton.ssd_combined`` module. Its Triton files need no CUDA build, but the
    package's ``__init__`` imports its CUDA extensions: where that import fails (a source tree on
    PYTHONPATH, or ``MAMBA_SKIP_CUDA_BUILD=TRUE`` install), the package is entered without running
    its ``__init__`` (an empty package module over the same folder). Raises ImportError if absent."""
    import importlib
    import importlib.util
    import types

    try:
        return importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
    except ImportError:
        for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or not spec.submodule_search_locations:
            raise
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["mamba_ssm"] = pkg
        return importlib.import_module("mamba_ssm.ops.triton.ssd_combined")


def _mamba():
    try:
        return load_mamba_module()
    except Exception as exc:  # noqa: BLE001 - absent, or its import fails on this torch / triton
        print(f"# mamba_ssm not importable ({type(exc).__name__}: {exc}); no mamba columns")
        return None


def _fla():
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as exc:  # noqa: BLE001
        print(f"# FLA not importable ({type(exc).__name__}: {exc}); no fla column")
        return None
    return chunk_simple_gla


def mamba_states_peer(mod, torch, x, dt, A, B, C, D, bias):
    """mamba_ssm's forward at chunk ``STATE_CHUNK`` with the chunk states kept in fp32 (``mod``:
    ``load_mamba_module()``): ``(y, final_state, states [NT, H, P, N])``, ``states[c]`` the state
    after chunk c (the last is the final state)."""
    cs = STATE_CHUNK
    dA, dtc = mod._chunk_cumsum_fwd(dt, A, cs, dt_bias=bias, dt_softplus=True)
    st = mod._chunk_state_fwd(B, x, dtc, dA, states_in_fp32=True)
    b, nc, h, p, n = st.shape
    start, final = mod._state_passing_fwd(st.reshape(b, nc, h, p * n), dA[:, :, :, -1], chunk_size=cs,
                                          out_dtype=torch.float32)  # fmt: skip
    start = start.reshape(b, nc, h, p, n)
    CB = mod._bmm_chunk_fwd(C, B, cs, output_dtype=torch.float32)
    y, _ = mod._chunk_scan_fwd(CB, x, dtc, dA, C, start, D=D)
    final = final.reshape(b, h, p, n)
    return y, final, torch.cat([start[0, 1:], final], 0)


def fla_pieces():
    """FLA's ``(chunk_local_cumsum, chunk_fwd_h, chunk_fwd_o, RCP_LN2)``, or None (a line why)."""
    try:
        from fla.ops.common.chunk_h import chunk_fwd_h
        from fla.ops.common.chunk_o import chunk_fwd_o
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2
    except Exception as exc:  # noqa: BLE001
        print(f"# FLA's chunk pieces not importable ({type(exc).__name__}: {exc}); no fla-states column")
        return None
    return chunk_local_cumsum, chunk_fwd_h, chunk_fwd_o, RCP_LN2


def fla_states_peer(pieces, torch, q, k, v, g):
    """FLA's gated linear attention at chunk ``STATE_CHUNK`` with the fp32 state of every chunk kept
    (``pieces``: ``fla_pieces()``; q, k, v, g as the ``fla`` peer's): ``(y, final_state, states
    [NT, H, P, N])`` in our layout, ``states[c]`` the state after chunk c. Its output kernel
    multiplies the states in the inputs' dtype (a bf16 copy made here)."""
    cumsum, fwd_h, fwd_o, rcp_ln2 = pieces
    cs = STATE_CHUNK
    gc = cumsum(g, chunk_size=cs, scale=rcp_ln2)
    h, ht = fwd_h(k=k, v=v, g=gc, output_final_state=True, chunk_size=cs, states_in_fp32=True)
    y = fwd_o(q=q, k=k, v=v, g=gc, h=h.to(k.dtype), scale=1.0, chunk_size=cs)
    # h: [B, NT, H, K=N, V=P], the state entering each chunk; ours: [P, N] after each chunk
    return y, ht.transpose(-1, -2), torch.cat([h[0, 1:], ht], 0).transpose(-1, -2)


def as_gla(torch, x, dt, A, B, C, bias):
    """The SSD written as gated linear attention per head: ``(q, k, v, g)`` = (C, dt B, x, dt A),
    B and C repeated over each group's heads (the dt softplus done here, in fp32)."""
    import torch.nn.functional as F

    H, G = x.shape[2], B.shape[2]
    d = F.softplus(dt.float() + bias)  # [1, T, H]
    rep = H // G
    q = C.repeat_interleave(rep, dim=2).contiguous()
    k = (B.float().repeat_interleave(rep, dim=2) * d[..., None]).to(B.dtype).contiguous()
    return q, k, x, (d * A).contiguous()


def state_peer_errors(torch, T, H, P, N, G, use_mamba=True, use_fla=True) -> dict:
    """Each state-emitting peer's largest difference from ours (``chunk_ssd``, the fp32 state at
    every 64 tokens) on the benchmark's inputs, relative to ours' largest magnitude: ``{peer: {"y",
    "final", "states"}}`` (D x taken out of ours against FLA, which has no D term)."""
    from kernels import chunk_ssd

    x, dt, A, B, C, D, bias = inputs(torch, T, H, P, N, G)
    y0, f0, s0 = chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
    got = {}
    mod = _mamba() if use_mamba else None
    if mod is not None:
        got["mamba64-states"] = (y0, mamba_states_peer(mod, torch, x, dt, A, B, C, D, bias))
    pieces = fla_pieces() if use_fla else None
    if pieces is not None:
        q, k, v, g = as_gla(torch, x, dt, A, B, C, bias)
        got["fla-states"] = (
            y0.float() - D[None, None, :, None] * x.float(),
            fla_states_peer(pieces, torch, q, k, v, g),
        )

    def rel(a, b):
        return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))

    return {
        name: dict(y=rel(y.reshape(ref.shape), ref), final=rel(fin.reshape(f0.shape), f0),
                   states=rel(st.reshape(s0.shape), s0))
        for name, (ref, (y, fin, st)) in got.items()
    }  # fmt: skip


def _in_env(fn, env: dict):
    """``fn`` called with ``env`` set (``kernel_bench.environ``)."""
    from kernel_bench import environ  # this folder's, on sys.path above

    def call():
        with environ(env):
            return fn()

    return call


def calls(torch, T, H, P, N, G, use_mamba=True, use_fla=True, variants=None) -> dict:
    """mode -> a no-argument call on the shape's inputs (``variants``: extra ``states-NAME``,
    ``states256-NAME`` and ``nostates-NAME`` modes run with the variant's environment)."""
    from kernels import chunk_ssd, prepare_chunk_metadata

    x, dt, A, B, C, D, bias = inputs(torch, T, H, P, N, G)
    meta = prepare_chunk_metadata([0, T], device="cuda")  # prepared once: the calls do not sync
    meta2 = prepare_chunk_metadata([0, T], device="cuda", boundary_stride=2)
    meta4 = prepare_chunk_metadata([0, T], device="cuda", boundary_stride=4)
    fns = {
        "states": lambda: chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, chunk_metadata=meta),
        "states128": lambda: chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, chunk_metadata=meta2),
        "states256": lambda: chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, chunk_metadata=meta4),
        "nostates": lambda: chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias, chunk_metadata=meta, boundary_states=False),
    }
    for name, env in (variants or {}).items():
        fns[f"states-{name}"] = _in_env(fns["states"], env)
        fns[f"states256-{name}"] = _in_env(fns["states256"], env)
        fns[f"nostates-{name}"] = _in_env(fns["nostates"], env)
    mod = _mamba() if use_mamba else None
    if mod is not None:
        scan = mod.mamba_chunk_scan_combined
        for cs in (256, 128):
            fns[f"mamba{cs}"] = lambda cs=cs: scan(
                x, dt, A, B, C, cs, D=D, dt_bias=bias, dt_softplus=True, return_final_states=True
            )
        fns["mamba64-states"] = lambda: mamba_states_peer(mod, torch, x, dt, A, B, C, D, bias)
    gla = _fla() if use_fla else None
    if gla is not None:
        q, k, v, g = as_gla(torch, x, dt, A, B, C, bias)
        fns["fla"] = lambda: gla(q, k, v, g=g, scale=1.0, output_final_state=True)
        pieces = fla_pieces()
        if pieces is not None:
            fns["fla-states"] = lambda: fla_states_peer(pieces, torch, q, k, v, g)
    return fns


#: the state loop's configurations ``--sweep`` times (``KERNELS_CONFIG_SSD_STATE``); the first is the
#: default (kernels.ssd.SSD_CONFIGS, the fastest of these on the H200 in session 10), the second the
#: default before it
SWEEP = (
    "BP=32,num_warps=8,num_stages=3",
    "BP=64,num_warps=8,num_stages=2",
    "BP=64,num_warps=8,num_stages=3",
    "BP=64,num_warps=4,num_stages=2",
    "BP=32,num_warps=4,num_stages=2",
    "BP=16,num_warps=4,num_stages=2",
    "BP=64,num_warps=8,num_stages=2,FUSE=1",
    "BP=32,num_warps=4,num_stages=2,FUSE=1",
)


def sweep(torch, do_bench, do_bench_cudagraph, lengths) -> int:
    _, H, P, N, G = SHAPES[1]
    print(f"{'state config':<34} {'T':>6} {'plain ms':>9} {'graph ms':>9}")
    for T in lengths:
        fn = calls(torch, T, H, P, N, G, False, False)["states"]
        for cfg in SWEEP:
            os.environ["KERNELS_CONFIG_SSD_STATE"] = cfg
            fn()
            torch.cuda.synchronize()
            plain = do_bench(fn, warmup=25, rep=100, return_mode="median")
            with torch.cuda.stream(torch.cuda.Stream()):
                graph = do_bench_cudagraph(fn, rep=100, return_mode="median")
            print(f"{cfg:<34} {T:>6} {plain:>9.3f} {graph:>9.3f}")
    os.environ.pop("KERNELS_CONFIG_SSD_STATE", None)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="quick run: T = 4096 and 8192")
    ap.add_argument("--lengths", default=None, help="comma-separated token counts (default 4096,8192,32768)")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--no-mamba", action="store_true")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="extra 'states-NAME' / 'states256-NAME' rows run with launch configs from the environment, "
        "e.g. 'prep:KERNELS_CONFIG_SSD_STATE=PREP=1' (several VAR=... joined by ';'; repeat the flag for "
        "several variants, as kernel_bench.py's)",
    )
    ap.add_argument("--profile", action="store_true", help="per-kernel device times (torch.profiler) at the longest T")
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="instead: ours ('states') at each state-loop configuration of SWEEP (Nemotron-H 8B shape)",
    )
    args = ap.parse_args(argv)
    from kernel_bench import cuda_modules, parse_variants  # this folder's, on sys.path above

    variants = parse_variants(args.variant)
    mods = cuda_modules()
    if mods is None:
        return 2
    torch, triton = mods
    from triton.testing import do_bench, do_bench_cudagraph

    if args.lengths:
        lengths = [int(v) for v in args.lengths.split(",")]
    else:
        lengths = [4096, 8192] if args.small else [4096, 8192, 32768]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if args.sweep:
        return sweep(torch, do_bench, do_bench_cudagraph, lengths)
    rows = []
    # rows print as each shape and length is measured (a run cut by a time limit keeps what it did)
    print(
        f"{'shape':<14} {'T':>6} {'mode':<14} {'plain ms':>9} {'graph ms':>9} {'x best':>7} {'x best(g)':>9}"
        f" {'x st-peer(g)':>12}"
    )
    for name, H, P, N, G in SHAPES:
        errs = state_peer_errors(torch, CHECK_T, H, P, N, G, not args.no_mamba, not args.no_fla)
        for peer, e in errs.items():
            print(f"# {name} T={CHECK_T} {peer} vs ours (rel. to ours' max): "
                  f"y {e['y']:.2e}, final state {e['final']:.2e}, every state {e['states']:.2e}")  # fmt: skip
        for T in lengths:
            fns = calls(torch, T, H, P, N, G, not args.no_mamba, not args.no_fla, variants)
            times = {}
            for mode, fn in fns.items():
                fn()
                torch.cuda.synchronize()
                plain = do_bench(fn, warmup=25, rep=100, return_mode="median")
                with torch.cuda.stream(torch.cuda.Stream()):
                    graph = do_bench_cudagraph(fn, rep=100, return_mode="median")
                times[mode] = (plain, graph)
            best = [min((times[p][i] for p in PEERS if p in times), default=None) for i in (0, 1)]
            sbest = min((times[p][1] for p in STATE_PEERS if p in times), default=None)
            for mode, (plain, graph) in times.items():
                rows.append(
                    dict(
                        shape=name, H=H, P=P, N=N, G=G, T=T, mode=mode, plain_ms=plain, graph_ms=graph,
                        ratio_plain=plain / best[0] if best[0] else None,
                        ratio_graph=graph / best[1] if best[1] else None,
                        ratio_state_peer_graph=graph / sbest if sbest else None,
                    )
                )  # fmt: skip
                print(_table_row(rows[-1]), flush=True)
            if args.profile and T == max(lengths):
                # after the shape's rows: the profile takes longer than the timings
                from kernel_bench import _profile  # this folder's, on sys.path above

                _profile(torch, fns, H, f"{P}x{N} {name}", T)
    if args.json:
        with open(args.json, "x") as fh:
            json.dump(rows, fh, indent=1)
    return 0


def _table_row(r: dict) -> str:
    rp = f"{r['ratio_plain']:.2f}" if r["ratio_plain"] else "-"
    rg = f"{r['ratio_graph']:.2f}" if r["ratio_graph"] else "-"
    rs = f"{r['ratio_state_peer_graph']:.2f}" if r.get("ratio_state_peer_graph") else "-"
    return (
        f"{r['shape']:<14} {r['T']:>6} {r['mode']:<14} {r['plain_ms']:>9.3f} {r['graph_ms']:>9.3f} {rp:>7} {rg:>9}"
        f" {rs:>12}"
    )


if __name__ == "__main__":
    sys.exit(main())
