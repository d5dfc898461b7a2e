"""Where a kernel call's host time goes: cProfile of ``chunk_gated_delta_rule`` with the device kept
busy, so that nothing in the profile waits for the GPU.

    python benchmarks/kernel_host_probe.py [--shapes 16/32,4/8] [--T 32768,8192] [--calls 200]
        [--top 25] [--fla]

For each shape: the host microseconds per call (the ``kernel_bench`` measure: a ~50 ms sleep kernel
queued first, 20 calls enqueued back to back, timed on the host; the median of seven such runs)
with metadata prepared beforehand (as a model step shares it across layers: the call is bound to
it after the first), the same with the bound call dropped before every call ("unbound": checks
and plan key every call), in replay's form (gate in the kernel, an initial state), with the
caller's buffers kept across calls (``out``, ``final_state_out``, ``boundary_out``,
``workspace``: the call allocates nothing), with Triton's own launch path for the same call (the
first launch of a plan always takes it; ``KERNELS_LAUNCH=triton`` forces it), with metadata built
in the call, and for the metadata alone; the direct path's parts timed alone (``PART`` lines:
checks, launch table, plan key, allocations, the call with its launches skipped, the launches
alone); then the profile's top functions by own time. ``--fla`` also prints the launch
configuration FLA's autotuner picked for each of its kernels at these shapes (what FLA runs on
this GPU). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

from kernel_bench import HOST_SLEEP_CYCLES, bench_inputs, cuda_modules, host_us_median  # noqa: E402 (this folder)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def profile_calls(torch, fn, calls: int, top: int) -> str:
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    out = io.StringIO()
    done = 0
    while done < calls:  # in slices of 20, each behind its own sleep
        torch.cuda._sleep(HOST_SLEEP_CYCLES)
        prof.enable()
        for _ in range(min(20, calls - done)):
            fn()
        prof.disable()
        done += 20
        torch.cuda.synchronize()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def components(torch, chunk_gdn, inputs, meta, call, call_buffers=None) -> dict:
    """The direct path's host time in parts, each timed alone like a whole call: the argument
    checks, the launch table, the plan key, the four allocations, the whole call with its
    launches skipped (the launches' share is the whole call less that), and, given
    ``call_buffers`` (the call into the caller's buffers), that call's launches alone with their
    arguments prepared (what Triton's C launcher and the driver cost)."""
    q, k, v, g, beta = inputs
    T, HV, K, V = q.shape[1], v.shape[2], q.shape[3], v.shape[3]
    wide = chunk_gdn.state_wide(meta.num_seqs, HV, V, q.device)
    gluon = chunk_gdn.gluon_device(q.device)
    lp = chunk_gdn.launch_params(K, V, q.dtype, None, wide, gluon)
    call()  # the plan exists from here on

    def key():
        return chunk_gdn._plan_key(
            lp, q.device, q.dtype, torch.float32, q.shape[2], HV, False, False, *inputs, chunk_gdn._addresses(*inputs)
        )

    plan = chunk_gdn._PLANS.get(key())  # None with KERNELS_LAUNCH=triton: no launches to skip
    nbytes = chunk_gdn._scratch_layout(T, meta.num_chunks, HV, K, V, q.element_size())[1]

    def allocations():
        torch.empty(1, T, HV, V, dtype=q.dtype, device=q.device)
        torch.empty(meta.num_seqs, HV, K, V, dtype=torch.float32, device=q.device)
        torch.empty(meta.num_boundaries, HV, K, V, dtype=torch.float32, device=q.device)
        torch.empty(nbytes, dtype=torch.uint8, device=q.device)

    def without_launches():
        real, plan.launches = plan.launches, tuple(lambda *a: None for _ in plan.launches)
        try:
            call()
        finally:
            plan.launches = real

    parts = {
        "check_args": lambda: chunk_gdn.check_args(q, k, v, g, beta),
        "launch_params": lambda: chunk_gdn.launch_params(K, V, q.dtype, None, wide, gluon),
        "addresses + plan key": key,
        "four allocations": allocations,
    }
    if plan is not None:
        parts["whole call, launches skipped"] = without_launches
    if plan is not None and call_buffers is not None:
        issued = []  # (launch, arguments) of one call into the caller's buffers (alive throughout)
        real = plan.launches
        plan.launches = tuple((lambda f: lambda *a: issued.append((f, a)))(f) for f in real)
        try:
            call_buffers()
        finally:
            plan.launches = real
        if len(issued) == len(real):
            parts[f"the {len(real)} launches alone"] = lambda: [f(*a) for f, a in issued]
    return parts


def fla_configs() -> list[str]:
    """The autotuned configs FLA's kernels hold after the calls so far."""
    from triton.runtime.autotuner import Autotuner

    lines = []
    for name, mod in sorted(sys.modules.items()):
        if not name.startswith("fla.") or mod is None:
            continue
        for attr, obj in vars(mod).items():
            for _ in range(4):  # through @triton.heuristics wrappers
                if isinstance(obj, Autotuner) or not hasattr(obj, "fn"):
                    break
                obj = obj.fn
            if isinstance(obj, Autotuner) and getattr(obj, "cache", None):
                for key, cfg in obj.cache.items():
                    lines.append(f"{name}.{attr} key={key} -> {cfg}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="16/32,4/8")
    ap.add_argument("--T", default="32768,8192")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--fla", action="store_true", help="also print FLA's autotuned configs")
    ap.add_argument("--repeats", type=int, default=7, help="runs of 20 calls per figure (their median)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.calls < 1:
        print("--repeats and --calls must be at least 1", file=sys.stderr)
        return 2
    modules = cuda_modules()
    if modules is None:
        return 2
    torch = modules[0]
    from kernels import chunk_gated_delta_rule, chunk_gdn, prepare_chunk_metadata, workspace_bytes

    direct = chunk_gdn._DIRECT

    fla = None
    if args.fla:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
    for shape in args.shapes.split(","):
        h, hv = (int(x) for x in shape.split("/"))
        for T in (int(x) for x in args.T.split(",")):
            q, k, v, g, beta = bench_inputs(torch, h, hv, T)
            dev = "cuda"
            meta = prepare_chunk_metadata([0, T], device=dev)

            def triton_launch(fn):
                def call():
                    chunk_gdn._DIRECT = False
                    try:
                        return fn()
                    finally:
                        chunk_gdn._DIRECT = direct

                return call

            cases = {
                "states+meta": lambda: chunk_gated_delta_rule(
                    q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta
                ),
                "nostates+meta": lambda: chunk_gated_delta_rule(
                    q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, boundary_states=False
                ),
                "states,cu_seqlens": lambda: chunk_gated_delta_rule(
                    q, k, v, g, beta, use_qk_l2norm=True, cu_seqlens=[0, T]
                ),
                "metadata only": lambda: prepare_chunk_metadata([0, T], device=dev),
            }
            # the caller's buffers, kept across calls (the call allocates nothing)
            bufs = dict(
                out=torch.empty_like(v),
                final_state_out=torch.empty(1, hv, q.shape[3], v.shape[3], device=dev),
                boundary_out=torch.empty(meta.num_boundaries, hv, q.shape[3], v.shape[3], device=dev),
                workspace=torch.empty(workspace_bytes(q, v, meta), dtype=torch.uint8, device=dev),
            )
            cases["states+meta, preallocated"] = lambda: chunk_gated_delta_rule(
                q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, **bufs
            )
            # the first call on a metadata binds the call to it (``ChunkMetadata.calls``); a call
            # on metadata that holds no bound call runs the argument checks and the plan key
            cases["states+meta, unbound"] = lambda: (
                meta.calls.clear(),
                chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta),
            )
            # replay's form: gate and beta sigmoid in the kernel, an initial state
            a_log, dt_bias = torch.rand(hv, device=dev) + 0.5, torch.randn(hv, device=dev)
            h0 = torch.zeros(1, hv, q.shape[3], v.shape[3], device=dev)
            cases["states+meta, replay's form"] = lambda: chunk_gated_delta_rule(
                q, k, v, g, beta, use_qk_l2norm=True, chunk_metadata=meta, initial_state=h0, A_log=a_log,
                dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid=True,
            )  # fmt: skip
            cases["states+meta, Triton's launch path"] = triton_launch(cases["states+meta"])
            if fla is not None:
                cases["fla"] = lambda: fla(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
            for name, fn in cases.items():
                us, clean = host_us_median(torch, fn, 20, args.repeats)
                print(f"HOST H={h} HV={hv} T={T} {name}: {us:.1f} us per call{'' if clean else ' (queue drained)'}")
            parts = components(
                torch, chunk_gdn, (q, k, v, g, beta), meta, cases["states+meta"], cases["states+meta, preallocated"]
            )
            for name, fn in parts.items():
                us, clean = host_us_median(torch, fn, 20, args.repeats)
                print(f"PART H={h} HV={hv} T={T} {name}: {us:.1f} us per call{'' if clean else ' (queue drained)'}")
            print(f"PROFILE H={h} HV={hv} T={T} states+meta, {args.calls} calls")
            print(profile_calls(torch, cases["states+meta"], args.calls, args.top))
    if fla is not None:
        print("FLA autotuned configs:")
        for line in fla_configs():
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
