"""Where a replayed prefill's time goes: host issue time vs device time, per call shape.

For each (prefix, suffix) shape the whole replayed model (``sim.replay.model.HybridModel`` at a
preset's shapes) runs one prefill of ``suffix`` tokens after a ``prefix``-token state, three ways:

* ``host_ms``: the CPU time to issue the call (Python, torch dispatch, kernel launches) while the
  GPU is held busy by a sleep kernel queued first, so no launch waits on the device;
* ``device_ms``: the device time between two CUDA events around the same call when the whole call
  was queued behind that sleep: the kernels back to back, no host bubbles (per layer type too);
* ``eager_ms``: the same call issued on an idle GPU, as replay times it (events, no sleep): the
  larger of host and device time where one dominates, more where they interleave.

The rows (``--out F.jsonl``) are what ``sim.replay.measure`` fits the whole-call cost model to
(``HardwareTiming``'s device terms from ``device_ms`` by layer type, its host terms from
``host_ms``), and what tells whether a trace's calls are host- or device-bound. On a CPU every op
is synchronous: the three times coincide and the run is only a smoke test.

    python benchmarks/replay_cost_probe.py --model qwen3.5-9b --out probe.jsonl   # on a GPU
    python benchmarks/replay_cost_probe.py --model replay-tiny --device cpu --small
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SUFFIXES = (1, 8, 25, 64, 100, 256, 512, 1024, 2048, 4096, 8192)
PREFIXES = (0, 1024, 4096, 16384)
SMALL_SUFFIXES = (1, 25, 100)
SMALL_PREFIXES = (0, 100)
#: a start this far past a 64-multiple makes the call's first kernel chunk ragged
UNALIGNED = 17


def random_state(model, pos: int, gen):
    """A state after ``pos`` tokens with random contents (its values do not change the timing)."""
    import torch

    from sim.replay.model import StackState

    z = model.zero_state()
    rec = torch.randn(z.rec.shape, generator=gen, device=model.device) * 0.1
    conv = (torch.randn(z.conv.shape, generator=gen, device=model.device) * 0.1).to(z.conv.dtype)
    kv = None
    if z.kv is not None:
        shape = list(z.kv.shape)
        shape[2] = pos
        kv = (torch.randn(shape, generator=gen, device=model.device) * 0.1).to(z.kv.dtype)
    return StackState(pos, rec, conv, kv)


def measure(model, tokens, state, start: int, reps: int, cuda: bool) -> dict:
    import torch

    from sim.replay.model import Marks

    def call(marks=None):
        return model.run(tokens, state, start, marks=marks)

    call()  # compile / plan this shape
    host, dev, eager, by_type = [], [], [], []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles: the whole call queues behind it
        marks = Marks(model.device)
        t0 = time.perf_counter()
        call(marks)
        host.append((time.perf_counter() - t0) * 1e3)
        ms = marks.ms_by_type()
        dev.append(sum(ms.values()))
        by_type.append(ms)
        if cuda:
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            call()
            e1.record()
            e1.synchronize()
            eager.append(float(e0.elapsed_time(e1)))
        else:
            eager.append(dev[-1])
    mid = sorted(range(reps), key=lambda i: dev[i])[reps // 2]
    return dict(
        host_ms=statistics.median(host),
        device_ms=statistics.median(dev),
        eager_ms=statistics.median(eager),
        device_ms_by_type=by_type[mid],
    )


def profile_call(model, tokens, state, start: int, label: str, reps: int = 3, top: int = 12) -> None:
    """One shape's kernels by device time per call (``reps`` calls under torch.profiler), the
    ``top`` longest printed as ``#`` lines."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model.run(tokens, state, start)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            model.run(tokens, state, start)
        torch.cuda.synchronize()
    evs = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    evs.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in evs) / reps / 1e3
    print(f"# profile {label}: {total:.3f} ms of kernels per call", flush=True)
    for e in evs[:top]:
        print(f"#   {e.self_device_time_total / reps / 1e3:8.3f} ms  x{e.count // reps:<4} {e.key[:90]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3.5-9b")
    ap.add_argument("--layers", type=int, default=None, help="mixer layers (default: all)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--suffixes", default=None, help="comma-separated suffix lengths")
    ap.add_argument("--prefixes", default=None, help="comma-separated prefix lengths")
    ap.add_argument("--small", action="store_true", help="a few shapes (smoke test)")
    ap.add_argument("--out", default=None, help="append one JSON row per shape to this file")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also each shape's kernels by device time (torch.profiler, CUDA): which kernel a resumed call spends more in",
    )
    args = ap.parse_args()

    import torch

    from sim.cost import get_model
    from sim.replay.model import DTYPES, HybridModel, ReplayShape

    spec = get_model(args.model)
    shape = ReplayShape.from_spec(spec, args.layers)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = DTYPES[args.dtype] if cuda else torch.float32
    model = HybridModel(shape, device=dev, dtype=dtype, seed=0)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    sfx = [int(x) for x in args.suffixes.split(",")] if args.suffixes else (SMALL_SUFFIXES if args.small else SUFFIXES)
    pfx = [int(x) for x in args.prefixes.split(",")] if args.prefixes else (SMALL_PREFIXES if args.small else PREFIXES)
    info = dict(
        model=args.model,
        counts=shape.counts(),
        dtype=args.dtype,
        device=torch.cuda.get_device_name() if cuda else "cpu",
        torch=torch.__version__,
    )
    print(json.dumps(info), flush=True)
    out = open(args.out, "a") if args.out else None
    n_vocab = shape.vocab_rows
    print(
        f"{'prefix':>7} {'suffix':>6} {'start':>6} {'host ms':>8} {'device ms':>9} {'eager ms':>8}  attn/gdn/mlp/other ms"
    )
    for p in pfx:
        for aligned in (True, False):
            start = p if aligned else p + UNALIGNED
            if not aligned and p == 0 and len(pfx) > 1:
                start = UNALIGNED
            state = random_state(model, start, gen) if start else None
            for t in sfx:
                tokens = torch.randint(0, n_vocab, (t,), generator=gen, device=dev)
                r = measure(model, tokens, state, start, args.reps, cuda)
                bt = r["device_ms_by_type"]
                print(
                    f"{p:>7} {t:>6} {start:>6} {r['host_ms']:>8.2f} {r['device_ms']:>9.2f} {r['eager_ms']:>8.2f}  "
                    + "/".join(f"{bt[k]:.2f}" for k in ("attention", "gated_delta", "mlp", "other")),
                    flush=True,
                )
                if out:
                    out.write(json.dumps(dict(info, prefix=start, suffix=t, **r)) + "\n")
                    out.flush()
                if args.profile and cuda:
                    profile_call(model, tokens, state, start, f"start {start} suffix {t}")
            del state
    if out:
        out.close()


if __name__ == "__main__":
    main()
