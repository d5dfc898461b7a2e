"""Benchmark: the causal conv (``kernels.conv.causal_conv1d``) from zeros and from a conv state.

    python benchmarks/conv_bench.py [--dims 8192,10240] [--lengths 8192,32768] [--rounds 2]
        [--variant NAME:KERNELS_CONFIG_CONV=BD=64,num_warps=4] [--profile] [--json out.json]

Why: on the H200 (session 25) the replay's gated-delta layers ran ~6 ns a token and layer slower
from position 0 than from a restored state (``replay_cost_probe.py``: the conv at 0.60 ms for three
qwen3-next-80b-a3b layers from 0, under 0.45 from a state), which the replay's from-scratch
references and misses pay and its resumed calls do not. This times the conv alone, as the replay
calls it (bf16 inputs a slice of a wider projection, silu, the boundary windows of a few positions
kept), in three modes: ``zero`` (start 0, no state), ``state`` (start 4096, a conv state) and
``start17`` (start 17, a state); each mode measured ``--rounds`` times, the modes interleaved (a
first-measured effect shows as a round that differs), CUDA-graphed medians. The bytes the call must
move (x read, y written) give the effective bandwidth. Without torch, triton or a CUDA GPU it prints
one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: the replay's projection around the conv's channels (q, k, v and the gates beside them): x is a
#: slice of a row this much wider, as ``sim.replay.model`` hands it over
ROW_EXTRA = 4160
MODES = {"zero": (0, False), "state": (4096, True), "start17": (17, True)}


def calls(torch, D: int, T: int) -> dict:
    """mode -> a no-argument conv call on seeded inputs of ``D`` channels and ``T`` tokens."""
    from kernels import prepare_chunk_metadata
    from kernels.conv import causal_conv1d

    gen = torch.Generator(device="cuda").manual_seed(D + T)
    row = torch.randn(T, D + ROW_EXTRA, device="cuda", dtype=torch.bfloat16, generator=gen)
    x = row[:, :D]  # strided rows, as the replay's projection slice
    w = torch.randn(D, 4, device="cuda", dtype=torch.bfloat16, generator=gen)
    cs = torch.randn(1, D, 3, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = {}
    for mode, (start, with_state) in MODES.items():
        end = start + T
        keep = [p for p in (end // 64 * 64,) if start < p <= end]  # one boundary, as a prompt end's
        meta = prepare_chunk_metadata([0, T], [start], boundary_indices=keep, device="cuda")
        state = cs if with_state else None
        out[mode] = lambda meta=meta, state=state: causal_conv1d(
            x[None], w, None, conv_state=state, chunk_metadata=meta, activation="silu"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="8192", help="comma-separated channel counts (default 8192: qwen3-next-80b-a3b)")
    ap.add_argument("--lengths", default="8192,32768", help="comma-separated token counts")
    ap.add_argument("--rounds", type=int, default=2, help="times each mode is measured, interleaved")
    ap.add_argument("--variant", action="append", default=[], help="NAME:KERNELS_CONFIG_CONV=... (repeatable)")
    ap.add_argument("--profile", action="store_true", help="the conv kernel's device time from torch.profiler too")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file (refuses an existing file)")
    args = ap.parse_args(argv)
    from kernel_bench import cuda_modules, environ, parse_variants  # this folder's, on sys.path above

    variants = {"default": {}, **parse_variants(args.variant)}
    try:
        dims = [int(v) for v in args.dims.split(",")]
        lengths = [int(v) for v in args.lengths.split(",")]
    except ValueError:
        print("--dims / --lengths: comma-separated integers", file=sys.stderr)
        return 2
    if args.rounds < 1 or min(dims + lengths) < 1:
        print("--rounds, --dims and --lengths must be positive", file=sys.stderr)
        return 2
    if args.json and os.path.exists(args.json):
        print(f"--json {args.json}: exists (not replaced)", file=sys.stderr)
        return 2
    mods = cuda_modules()
    if mods is None:
        return 2
    torch, triton = mods
    from triton.testing import do_bench_cudagraph

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"{'variant':<10} {'D':>6} {'T':>6} {'mode':<8} {'round':>5} {'graph ms':>9} {'GB/s':>7} {'kernel ms':>9}")
    rows = []
    for D in dims:
        for T in lengths:
            fns = calls(torch, D, T)
            for vname, env in variants.items():
                with environ(env):
                    for fn in fns.values():
                        fn()
                    torch.cuda.synchronize()
                    for rnd in range(args.rounds):
                        for mode, fn in fns.items():
                            with torch.cuda.stream(torch.cuda.Stream()):
                                ms = do_bench_cudagraph(fn, rep=50, return_mode="median")
                            kms = _kernel_ms(torch, fn) if args.profile else float("nan")
                            gbs = 2 * T * D * 2 / (ms * 1e-3) / 1e9  # bf16 x read + y written
                            rows.append(dict(variant=vname, D=D, T=T, mode=mode, round=rnd, graph_ms=ms, gbps=gbs,
                                             kernel_ms=kms))  # fmt: skip
                            print(
                                f"{vname:<10} {D:>6} {T:>6} {mode:<8} {rnd:>5} {ms:>9.4f} {gbs:>7.0f} {kms:>9.4f}",
                                flush=True,
                            )
    if args.json:
        with open(args.json, "x") as fh:
            json.dump(rows, fh, indent=1)
    return 0


def _kernel_ms(torch, fn, reps: int = 5) -> float:
    """The conv kernel's median device time over ``reps`` calls (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = sorted(
        e.device_time for e in prof.events() if "_conv_kernel" in e.name and getattr(e, "device_time", 0) > 0
    )
    return times[len(times) // 2] / 1e3 if times else float("nan")


if __name__ == "__main__":
    sys.exit(main())
