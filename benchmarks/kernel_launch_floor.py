"""The host cost floor under a kernel call on this machine: what one launch of an empty Triton
kernel costs through the raw C launcher that the direct path uses (``kernels/_launch.py``), with
one argument and with forty, with and without programmatic dependent launch (the output kernel's
launch option), four in a row (a call's count); through Triton's generic launch path; and what an
allocation and a stream query cost.

    python benchmarks/kernel_launch_floor.py [--calls 50] [--repeats 15]

Each figure is ``kernel_bench``'s host measure (a ~50 ms sleep kernel queued first, ``--calls``
calls enqueued back to back and timed on the host), the median of ``--repeats`` runs, in
microseconds per call. ``kernel_host_probe.py`` splits a real call into its parts; this says how
much of its launches' share is the driver's. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import os
import sys

from kernel_bench import cuda_modules, host_us_median  # noqa: E402 (this folder)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: arguments of the wide empty kernel (a call's kernels take 25-45)
WIDE_ARGS = 40


def floor_cases(torch, triton) -> dict:
    """``{name: no-argument callable}``: the cases timed."""
    from kernels._launch import raw_launcher

    @triton.jit
    def _one(x):
        pass

    @triton.jit
    def wide(
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9,
        c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9,
    ):  # fmt: skip
        pass

    x = torch.empty(16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    cases = {}
    for name, fn, args, pdl in (
        ("1 argument", _one, (x,), False),
        (f"{WIDE_ARGS} arguments", wide, (x,) * WIDE_ARGS, False),
        (f"{WIDE_ARGS} arguments, programmatic dependent launch", wide, (x,) * WIDE_ARGS, True),
    ):
        opts = {"launch_pdl": True} if pdl else {}
        ck = fn[(1,)](*args, **opts)
        launch = raw_launcher(ck)
        if launch is None:
            print(f"# {name}: this Triton's launcher form is not known to kernels/_launch.py", file=sys.stderr)
            continue
        ints = tuple(x.data_ptr() for _ in args)
        cases[f"raw launch, {name}"] = lambda launch=launch, ints=ints: launch(1, 1, 1, stream, ints)
        cases[f"four raw launches, {name}"] = lambda launch=launch, ints=ints: [
            launch(1, 1, 1, stream, ints) for _ in range(4)
        ]
        cases[f"Triton's launch path, {name}"] = lambda fn=fn, args=args, opts=opts: fn[(1,)](*args, **opts)
    dev = torch.device("cuda", torch.cuda.current_device())
    shape = (1, 8192, 32, 128)
    template = torch.empty(0, dtype=torch.bfloat16, device=dev)
    cases["torch.empty(shape, dtype=, device=)"] = lambda: torch.empty(shape, dtype=torch.bfloat16, device=dev)
    cases["empty.new_empty(shape)"] = lambda: template.new_empty(shape)
    query = torch._C._cuda_getCurrentRawStream
    cases["current stream query"] = lambda: query(dev.index)
    return cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50, help="calls enqueued per run")
    ap.add_argument("--repeats", type=int, default=15, help="runs per figure (their median)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        print("--calls and --repeats must be at least 1", file=sys.stderr)
        return 2
    modules = cuda_modules()
    if modules is None:
        return 2
    torch, triton = modules
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for name, fn in floor_cases(torch, triton).items():
        us, clean = host_us_median(torch, fn, args.calls, args.repeats)
        print(f"FLOOR {name}: {us:.2f} us per call{'' if clean else ' (queue drained)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
