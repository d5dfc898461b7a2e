"""Benchmark: the project's chunked gated-delta kernel vs FLA 0.6.0 and FlashQLA on a CUDA GPU.

    FLA_DISABLE_BACKEND_DISPATCH=1 python benchmarks/kernel_bench.py [--small] [--json out.json]
        [--no-fla] [--no-flashqla] [--host-calls N] [--seg 8,16,32]
    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/kernel_bench.py --coldstart plain|warmup

bf16 q/k/v, fp32 log-decay g, bf16 beta, in-kernel q/k l2norm, K = V = 128, one sequence.
Modes: ours with fp32 states at every 64-token boundary ("states"), the same call into buffers the
caller keeps (``out=``, ``final_state_out=``, ``boundary_out=``, ``workspace=``: what an engine's
step does, no allocation in the call; "states+buf", its host time is the engine's), ours with
boundary states off ("nostates"), FLA (`chunk_gated_delta_rule`, output_final_state=True, emits no chunk states),
FlashQLA (`flash_qla.chunk_gated_delta_rule`, the same call; where it imports: sm90 / sm100 /
sm120, TileLang; emits no chunk states, so compare it with "nostates", and "states" against it for
the cost of emitting them), ours with the segmented (chunk-parallel) state pass and fp32 states at every
boundary ("seg<N>": ``state_segments=N`` chunks a segment, ``--seg``; each row's outputs and states
are checked against "states" and the relative errors printed), and FlashQLA with ``auto_cp=False``
("flashqla-exact": one exact pass;
by default FlashQLA segments a long sequence and drops history older than a decay of e^-10,
docs/kernels.md). Ratios: each row over FLA (x FLA), over FlashQLA (x FQLA) and over FlashQLA exact
(x FQLAx). With ``--nometa`` the "states" and "seg<N>" calls again without ``chunk_metadata``
("-nometa" rows: the plain call as FLA's users make it, issue 48 item 2). With ``--resumed`` the
"states" call as a prefix hit runs it: from an fp32 initial state ("h0"), from absolute position
512 ("start512"), both ("resumed") and both without states ("resumed-nostates"): a replayed
gated-delta layer resumed from a restored state runs 11-21 % slower per chunk than from scratch.
Timing: triton.testing.do_bench (median) and do_bench_cudagraph (median; short shapes are
launch-bound without graphs). TFLOP/s uses 174,080 FLOP per token x value head.

Host overhead ("host us"): the time for the Python call to return while the GPU is kept busy, so
that no launch waits for the device: a ~50 ms sleep kernel (torch.cuda._sleep) is queued first,
then ``--host-calls`` calls (default 20) are enqueued back to back and timed on the host
(perf_counter), the sum divided by their number; the device is synchronised only after the
clock stops. The column is the median of seven such runs. The row is marked "*" if the sleep
had ended before the last call of any run returned (the figure may then include waiting for the
device; raise HOST_SLEEP_CYCLES).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

FLOP_PER_TOKEN_HEAD = 174_080
#: the sleep kernel that keeps the device busy while the host overhead is measured (~50 ms at
#: an H200's ~1.8 GHz; the clock rate only sets how long it lasts)
HOST_SLEEP_CYCLES = 100_000_000
#: FlashQLA's head dims (the benchmark's are these)
FLASHQLA_HEAD_DIM = 128
#: the modes every row is divided by: (mode, prefix of the row's ``_plain`` / ``_graph`` keys,
#: column title)
REFERENCES = (
    ("fla", "ratio", "x FLA"),
    ("flashqla", "ratio_fqla", "x FQLA"),
    ("flashqla-exact", "ratio_fqlax", "x FQLAx"),
)


def cuda_modules():
    """``(torch, triton)`` where both import and a CUDA GPU is present, else None with the reason
    printed in one line (the GPU benchmarks' common start)."""
    try:
        import torch
        import triton
    except ImportError:
        print("needs torch and triton: pip install 'marconi-sim[kernels]'", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return None
    return torch, triton


def host_overhead_us(torch, fn, calls: int) -> tuple[float, bool]:
    """Microseconds per call for ``fn`` to return on the host with the device queue busy (see the
    module docstring), and whether the device stayed busy throughout (the figure is clean)."""
    import time

    fn()
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    torch.cuda._sleep(HOST_SLEEP_CYCLES)
    done.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    busy = not done.query()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6, busy


def host_us_median(torch, fn, calls: int, repeats: int = 7) -> tuple[float, bool]:
    """The median of ``repeats`` runs of ``host_overhead_us`` (one run is at the mercy of the
    host's scheduler), and whether every run kept the device busy."""
    runs = [host_overhead_us(torch, fn, calls) for _ in range(repeats)]
    return sorted(us for us, _ in runs)[repeats // 2], all(clean for _, clean in runs)


#: the log decay's scale: ``g = GATE_SCALE * logsigmoid(N(0, 1))`` (FLA's tests' gate), about
#: -0.4 a token
GATE_SCALE = 0.5


def bench_inputs(torch, h: int, hv: int, T: int, gate_scale: float = GATE_SCALE):
    """The benchmark's inputs on the GPU (seed 0): bf16 q, k ``[1, T, h, 128]``, v ``[1, T, hv,
    128]``, fp32 log decay g (``gate_scale`` x logsigmoid of a normal), bf16 beta."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(1, T, h, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, T, h, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, T, hv, 128, device=dev, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(1, T, hv, device=dev)) * gate_scale
    beta = torch.rand(1, T, hv, device=dev).to(torch.bfloat16)
    return q, k, v, g, beta


#: the resumed rows' start: a 512-token prefix hit (Mooncake's block), chunk-aligned as replay's are
RESUME_AT = 512


def resumed_calls(torch, gdn, prepare, q, k, v, g, beta) -> dict:
    """``--resumed``'s calls, each with the fp32 state at every 64-token boundary unless named
    ``-nostates``: from an initial state (seed 1, the scale of a real state's entries), from
    absolute position ``RESUME_AT``, both, and both without states."""
    T, hv = q.shape[1], v.shape[2]
    torch.manual_seed(1)
    h0 = torch.randn(1, hv, q.shape[3], v.shape[3], device=q.device) * 0.05
    at0 = prepare([0, T], device=q.device)
    at = prepare([0, T], [RESUME_AT], device=q.device)

    def call(meta, state, **kw):
        return functools.partial(
            gdn, q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, initial_state=state, **kw
        )

    return {
        "h0": call(at0, h0),
        "start512": call(at, None),
        "resumed": call(at, h0),
        "resumed-nostates": call(at, h0, boundary_states=False),
    }


def _flashqla(torch):
    """FlashQLA's ``chunk_gated_delta_rule`` where it imports and runs on this GPU, else None
    (the reason printed)."""
    cap = tuple(torch.cuda.get_device_capability())
    if cap not in ((9, 0), (10, 0), (10, 3), (12, 0), (12, 1)):
        print(f"# FlashQLA: no kernels for sm{cap[0]}{cap[1]}; no FlashQLA column")
        return None
    try:
        from flash_qla import chunk_gated_delta_rule
    except Exception as exc:  # noqa: BLE001 - not installed, or its import refuses the GPU
        print(f"# FlashQLA not importable ({type(exc).__name__}: {exc}); no FlashQLA column")
        return None
    return chunk_gated_delta_rule


def parse_variants(specs) -> dict:
    """``--variant`` values, each ``NAME:VAR=VALUE[;VAR=VALUE]`` (the flag repeated for several)
    -> ``{NAME: {VAR: VALUE}}`` (a value may hold '=' and ','; ``ssd_bench.py`` takes the same)."""
    out = {}
    for spec in specs:
        name, _, envs = spec.partition(":")
        items = [e for e in envs.split(";") if e]
        if not name.strip() or not items or not all("=" in e and e.split("=", 1)[0].strip() for e in items):
            print(f"--variant {spec!r}: expected NAME:VAR=VALUE[;VAR=VALUE]", file=sys.stderr)
            sys.exit(2)
        out[name] = dict(e.split("=", 1) for e in items)
    return out


@contextlib.contextmanager
def environ(env: dict):
    """``env`` set for the block (the kernels read their launch configurations per call), the
    previous values back after it."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, val in saved.items():
            if val is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = val


def _profile(torch, fns, h, hv, T, reps=5):
    from torch.profiler import ProfilerActivity, profile

    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        evs = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
        evs.sort(key=lambda e: -e.self_device_time_total)
        total = sum(e.self_device_time_total for e in evs) / reps / 1e3
        print(f"# profile H={h} HV={hv} T={T} {name}: {total:.3f} ms of kernels per call")
        for e in evs[:8]:
            print(f"#   {e.self_device_time_total / reps / 1e3:8.3f} ms  x{e.count // reps:<3} {e.key[:70]}")


def _coldstart(torch, mode: str) -> None:
    """40 replay-like requests (random lengths 1..8192, seed 0): causal conv1d + gated delta rule
    with fp32 boundary states, bf16, H=16, HV=32, K=V=128, every other request with initial
    states. Times the first pass (compilations included) and a second pass; with mode "warmup"
    ``kernels.warmup`` runs first. Run it in a fresh process with an empty TRITON_CACHE_DIR."""
    import random
    import time

    import torch.nn.functional as F

    from kernels import causal_conv1d, chunk_gated_delta_rule, warmup

    H, HV, K, V = 16, 32, 128, 128
    CD = 2 * H * K + HV * V
    rng = random.Random(0)
    lens = [rng.randint(1, 8192) for _ in range(40)]
    dev = "cuda"
    wconv = torch.randn(CD, 4, device=dev, dtype=torch.bfloat16)

    def replay():
        t0 = time.perf_counter()
        for i, T in enumerate(lens):
            first = i % 2 == 1
            x = torch.randn(1, T, CD, device=dev, dtype=torch.bfloat16)
            cs = None if first else torch.zeros(1, CD, 3, device=dev, dtype=torch.bfloat16)
            y, _, _ = causal_conv1d(x, wconv, conv_state=cs)
            q = y[..., : H * K].view(1, T, H, K)
            k = y[..., H * K : 2 * H * K].view(1, T, H, K)
            v = y[..., 2 * H * K :].view(1, T, HV, V)
            g = F.logsigmoid(torch.randn(1, T, HV, device=dev))
            b = torch.rand(1, T, HV, device=dev).bfloat16()
            h0 = None if first else torch.zeros(1, HV, K, V, device=dev)
            chunk_gated_delta_rule(q, k, v, g, b, initial_state=h0, use_qk_l2norm=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    if mode == "warmup":
        w = warmup(num_heads=H, num_v_heads=HV, dtype=torch.bfloat16, conv_dim=CD)
        print(f"coldstart warmup() {w:.2f} s")
    first, second = replay(), replay()
    print(
        f"coldstart mode={mode} cache={os.environ.get('TRITON_CACHE_DIR')}: first 40 requests "
        f"{first:.2f} s, again {second:.3f} s"
    )


def _seg_errors(torch, fns, seg_sizes, h, hv, T) -> None:
    """Each segmented row's outputs, final and boundary states against the serial call's
    (relative Frobenius errors; boundaries: the worst one), printed as a comment line."""
    ref = fns["states"]()
    for n in seg_sizes:
        got = fns[f"seg{n}"]()
        errs = []
        for a, b in zip(got[:2], ref[:2]):
            errs.append(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item())
        a, b = got[2].float().flatten(1), ref[2].float().flatten(1)
        errs.append(((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)).max().item() if a.shape[0] else 0.0)
        print(f"# seg{n} vs states {h}/{hv} T={T}: o {errs[0]:.2e} final {errs[1]:.2e} boundaries(max) {errs[2]:.2e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--small", action="store_true", help="quick run: T=4096 and 8192 only")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--no-fla", action="store_true", help="no FLA column")
    ap.add_argument("--no-flashqla", action="store_true", help="no FlashQLA column")
    ap.add_argument(
        "--host-calls", type=int, default=20, help="calls enqueued per host-overhead measurement (0: not measured)"
    )
    ap.add_argument("--profile", action="store_true", help="per-kernel device times (torch.profiler) at the longest T")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="extra 'states' run with launch configs from the environment, e.g. "
        "'s64:KERNELS_CONFIG_STATE=BV=64,num_warps=4,num_stages=2' "
        "(several VAR=... joined by ';')",
    )
    ap.add_argument(
        "--seg",
        default="",
        help="comma-separated chunks per segment (or 'auto') for 'seg<N>' rows: 'states' with the segmented state pass",
    )
    ap.add_argument(
        "--nometa",
        action="store_true",
        help="also 'states-nometa' and 'seg<N>-nometa' rows: the calls without chunk_metadata, as FLA's users "
        "make them (the layout's metadata is remembered by the first)",
    )
    ap.add_argument(
        "--resumed",
        action="store_true",
        help="also the 'states' call resumed, as a prefix hit runs it: 'h0' (an fp32 initial state), 'start512' (the "
        "sequence starting at absolute position 512, no initial state), 'resumed' (both) and 'resumed-nostates'. A "
        "replayed gated-delta layer from a restored state runs 11-21 %% slower per chunk than from scratch "
        "(docs/replay-cost-model.md, 'A prefill resumed from a state'): these rows say whether the kernel is where",
    )
    ap.add_argument("--shapes", default="16/32,4/8", help="H/HV list")
    ap.add_argument(
        "--gate-scale",
        type=float,
        default=GATE_SCALE,
        help="log decay g = SCALE x logsigmoid(N(0,1)); smaller: longer memory (FlashQLA's CP warms up longer)",
    )
    ap.add_argument("--T", default=None, help="comma-separated token counts")
    ap.add_argument("--rep", type=int, default=200, help="timing window per measurement (ms)")
    ap.add_argument(
        "--coldstart",
        choices=["plain", "warmup"],
        default=None,
        help="instead of the table: time 40 replay-like requests from a cold start",
    )
    args = ap.parse_args(argv)
    modules = cuda_modules()
    if modules is None:
        return 2
    torch, triton = modules
    from triton.testing import do_bench, do_bench_cudagraph

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if args.coldstart:
        _coldstart(torch, args.coldstart)
        return 0
    from kernels import chunk_gated_delta_rule, prepare_chunk_metadata, workspace_bytes

    fla = None
    if not args.no_fla:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
        except Exception as exc:  # noqa: BLE001
            print(f"# FLA not importable ({type(exc).__name__}: {exc}); ours only")
    fqla = None if args.no_flashqla else _flashqla(torch)
    shapes = [tuple(int(x) for x in s.split("/")) for s in args.shapes.split(",")]
    Ts = [4096, 8192] if args.small else [32768, 8192, 4096]
    if args.T:
        Ts = [int(x) for x in args.T.split(",")]
    seg_sizes = [x if x == "auto" else int(x) for x in args.seg.split(",") if x]
    variants = parse_variants(args.variant)
    rows = []
    print(
        f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}"
        f" fla {'yes' if fla else 'no'} flashqla {'yes' if fqla else 'no'}"
    )
    for h, hv in shapes:
        for T in Ts:
            q, k, v, g, beta = bench_inputs(torch, h, hv, T, args.gate_scale)
            meta_all = prepare_chunk_metadata([0, T], device="cuda")
            flop = FLOP_PER_TOKEN_HEAD * T * hv
            bufs = dict(
                out=torch.empty_like(v),
                final_state_out=torch.empty(1, hv, 128, 128, device="cuda"),
                boundary_out=torch.empty(meta_all.num_boundaries, hv, 128, 128, device="cuda"),
                workspace=torch.empty(workspace_bytes(q, v, meta_all), dtype=torch.uint8, device="cuda"),
            )
            fns = {
                "states": lambda: chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta_all),
                "states+buf": lambda: chunk_gated_delta_rule(
                    q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta_all, **bufs
                ),
                "nostates": lambda: chunk_gated_delta_rule(
                    q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta_all, boundary_states=False
                ),
            }
            if args.resumed:
                fns.update(resumed_calls(torch, chunk_gated_delta_rule, prepare_chunk_metadata, q, k, v, g, beta))
            for vname in variants:
                fns[f"states[{vname}]"] = fns["states"]
            for n in seg_sizes:
                fns[f"seg{n}"] = functools.partial(
                    chunk_gated_delta_rule, q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta_all,
                    state_segments=n,
                )  # fmt: skip
            if args.nometa:
                fns["states-nometa"] = lambda: chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
                for n in seg_sizes:
                    fns[f"seg{n}-nometa"] = functools.partial(
                        chunk_gated_delta_rule, q, k, v, g, beta, use_qk_l2norm=True, state_segments=n
                    )
            if fla is not None:
                fns["fla"] = lambda: fla(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
            if fqla is not None:
                for name, cp in (("flashqla", True), ("flashqla-exact", False)):
                    fns[name] = functools.partial(
                        fqla, q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True, auto_cp=cp
                    )
            res, host = {}, {}
            for name, fn in fns.items():
                env = variants.get(name[7:-1], {}) if name.startswith("states[") else {}
                with environ(env):
                    fn()
                    torch.cuda.synchronize()  # compile outside the timed / captured region
                    plain = do_bench(fn, warmup=25, rep=args.rep, return_mode="median")
                    try:
                        graph = do_bench_cudagraph(fn, rep=args.rep, return_mode="median")
                    except Exception as exc:  # noqa: BLE001 - a call that syncs the host cannot be captured
                        print(f"# {name}: no CUDA-graph timing ({type(exc).__name__}: {exc})")
                        graph = float("nan")
                    if args.host_calls > 0 and not name.startswith("states["):
                        host[name] = host_us_median(torch, fn, args.host_calls)
                res[name] = (plain, graph)
            if seg_sizes:
                _seg_errors(torch, fns, seg_sizes, h, hv, T)
            if args.profile and T == max(Ts):
                _profile(torch, {n: f for n, f in fns.items() if not n.startswith("states[")}, h, hv, T)
            sbytes = meta_all.num_boundaries * hv * 128 * 128 * 4
            for name, (plain, graph) in res.items():
                row = dict(
                    H=h,
                    HV=hv,
                    T=T,
                    mode=name,
                    ms_plain=plain,
                    ms_graph=graph,
                    tflops_graph=flop / graph / 1e9,
                    state_bytes=sbytes if name.startswith(("states", "seg", "h0", "start")) or name == "resumed" else 0,
                )
                if name in host:
                    row["host_us"], row["host_clean"] = host[name]
                for ref, key, _ in REFERENCES:
                    if ref in res:
                        row[f"{key}_plain"] = plain / res[ref][0]
                        row[f"{key}_graph"] = graph / res[ref][1]
                rows.append(row)
                print("#", json.dumps(row), flush=True)
    titles = [f"{title} {kind}" for _, _, title in REFERENCES for kind in ("plain", "graph")]
    hdr = (
        f"{'H/HV':>6} {'T':>6} {'mode':>14} {'ms plain':>9} {'ms graph':>9} {'TFLOP/s':>8} {'states GB':>9} "
        + " ".join(titles)
        + f" {'host us':>8}"
    )
    print(hdr)

    def ratio(r, key, width):
        return f"{r[key]:>{width}.2f}" if key in r else f"{'-':>{width}}"

    for r in rows:
        hu = f"{r['host_us']:.1f}{'' if r['host_clean'] else '*'}" if "host_us" in r else "-"
        print(
            f"{r['H']:>2}/{r['HV']:<3} {r['T']:>6} {r['mode']:>14} {r['ms_plain']:>9.3f} "
            f"{r['ms_graph']:>9.3f} {r['tflops_graph']:>8.1f} {r['state_bytes'] / 1e9:>9.3f} "
            + " ".join(
                ratio(r, f"{key}_{kind}", len(f"{title} {kind}"))
                for _, key, title in REFERENCES
                for kind in ("plain", "graph")
            )
            + f" {hu:>8}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
