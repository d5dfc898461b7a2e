#!/usr/bin/env python3
"""The replay's attention at the presets' shapes, against what torch's other SDPA backends do
with it (issue 41 item 4: qwen3-next-80b-a3b at full depth spends ~36 % of its FLOPs in attention
at head dim 256, which the replay's kernel runs at ~27 % of the peak).

    python benchmarks/attn_bench.py                       # on a GPU: the presets' shapes, 2K-32K tokens
    python benchmarks/attn_bench.py --model qwen3.5-9b --lengths 4096,16384 --json out.json

Per preset and prompt length (a whole prompt, causal, bf16), the device time of one call and its
TFLOP/s (causal: 2 x 2 x H x hd x T^2 / 2 FLOPs) as a share of the device's dense bf16 peak:

- ``replay``: ``sim.replay.model._attend`` as replay calls it (keys and values copied per query
  head, SDPA's flash / memory-efficient kernels);
- ``gqa``: the same kernels with SDPA sharing the key / value heads (``enable_gqa``, no copy);
- ``cudnn``: SDPA's cuDNN kernel (the first call of a new length builds its plan: its time is
  printed apart, ``plan ms``), with its largest difference from ``replay`` (``max |diff|``);
- ``cudnn-pad``: cuDNN with the length padded up to a multiple of ``--bucket`` (queries and keys
  padded at the end by the same count: under a causal mask no real query sees a padded key, so the
  real rows are exact), so a few plans serve every length.

Device times are CUDA-event medians of ``--reps`` calls after a warm-up. A backend torch cannot
run at a shape is a row saying so. Needs a CUDA GPU.
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

from sim.cost import get_model  # noqa: E402

MODELS = "qwen3-next-80b-a3b,qwen3.5-9b"
LENGTHS = "2048,8192,32768"


def attention_flops(heads: int, hd: int, T: int) -> float:
    """A causal whole-prompt attention's matmul FLOPs: QK^T and PV, half the square each."""
    return 2 * 2 * heads * hd * T * T / 2


def device_ms(torch, fn, reps: int) -> float:
    """Median CUDA-event time of ``fn`` over ``reps`` calls (after one warm-up call)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def rows_for(torch, model: str, T: int, bucket: int, reps: int, peak: float) -> list[dict]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sim.replay.model import _attend

    spec = get_model(model)
    H, KVH, hd = spec.attn_heads, spec.attn_kv_heads, spec.attn_head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(T, H, hd, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(T, KVH, hd, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(T, KVH, hd, device="cuda", dtype=torch.bfloat16, generator=g)
    flops = attention_flops(H, hd, T)
    ref = _attend(q, k, v)

    def sdpa(backend, n):
        def call():
            qh, kh, vh = (x[:n].transpose(0, 1)[None] for x in (q_pad, k_pad, v_pad))
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=H != KVH)[0]

        return call

    padded = -(-T // bucket) * bucket
    q_pad, k_pad, v_pad = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, padded - T)) for x in (q, k, v))
    cases = [
        ("replay", lambda: _attend(q, k, v), T),
        ("gqa", sdpa(SDPBackend.FLASH_ATTENTION, T), T),
        ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, T), T),
        (f"cudnn-pad{bucket}", sdpa(SDPBackend.CUDNN_ATTENTION, padded), padded),
    ]
    out = []
    for name, fn, n in cases:
        row = dict(model=model, T=T, backend=name, heads=f"{H}/{KVH}", hd=hd, tokens_run=n)
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            first = fn()
            torch.cuda.synchronize()
            row["first_ms"] = (time.perf_counter() - t0) * 1e3  # a new length: cuDNN builds its plan here
            got = first if name in ("replay",) else first.transpose(0, 1)[:T]
            row["max_abs_diff"] = float((got.float() - ref.float()).abs().max())
            ms = device_ms(torch, fn, reps)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run this shape is a row
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            out.append(row)
            continue
        row["ms"] = ms
        row["tflops"] = flops / (ms * 1e-3) / 1e12
        row["peak_share"] = row["tflops"] / peak if peak else None
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=MODELS, help="comma-separated presets (their attention shapes)")
    ap.add_argument("--lengths", default=LENGTHS, help="comma-separated prompt lengths (tokens)")
    ap.add_argument("--bucket", type=int, default=1024, help="cudnn-pad: lengths padded up to a multiple of this")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("attn_bench: needs torch and a CUDA GPU", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("attn_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    if a.bucket < 1:
        print(f"attn_bench: --bucket {a.bucket} must be at least 1", file=sys.stderr)
        return 2
    from sim.replay.measure import device_peak

    name = torch.cuda.get_device_name(0)
    peak = device_peak(name, "bf16")
    print(f"# {name}, torch {torch.__version__}, bf16 peak {peak:g} TFLOP/s")
    print(
        f"{'model':20s} {'T':>6s} {'backend':>14s} {'ms':>9s} {'TFLOP/s':>8s} {'of peak':>8s} {'plan ms':>8s} {'max|diff|':>9s}"
    )
    rows = []
    for model in a.model.split(","):
        for T in (int(x) for x in a.lengths.split(",")):
            for r in rows_for(torch, model, T, a.bucket, a.reps, peak):
                rows.append(r)
                if "error" in r:
                    print(f"{model:20s} {T:6d} {r['backend']:>14s}  {r['error']}")
                    continue
                share = f"{100 * r['peak_share']:.1f} %" if r["peak_share"] else "-"
                print(
                    f"{model:20s} {T:6d} {r['backend']:>14s} {r['ms']:9.3f} {r['tflops']:8.1f} {share:>8s} "
                    f"{r['first_ms']:8.1f} {r['max_abs_diff']:9.2e}"
                )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
