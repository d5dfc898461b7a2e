#!/usr/bin/env python3
"""What share of the GPU's peak a preset's prefills of a trace can reach, by the time model.

    python benchmarks/replay_peak_share.py --models qwen3-next-80b-a3b,qwen3.5-9b \
        --trace mooncake:sample --trace sharegpt --requests 50

For each preset x trace: every request's from-scratch prefill at full depth on one GPU (as replay
runs the model; the preset's timing at one GPU, as ``sim.replay.calibration.replay_timing``
takes it), priced by the hardware-shaped time model's FLOP terms (``HardwareTiming.work_tflop``: each term's measured
fraction of the peak, plus the activation bytes; per-call fixed times and host issue left out),
against the FLOPs those terms count. The result is the share of the peak the replayed kernels can
reach on these shapes: what ``replay_bench.py``'s "share of peak over the timed calls" should come
near on a GPU, and where the time goes (per layer kind: its share of the FLOPs and the share of
the peak it runs at; the attention's context-quadratic part). No GPU needed. Bad input: one line,
exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KINDS = ("attention", "gated_delta", "mlp")


def one_gpu(timing):
    """``timing`` on one GPU, as replay compares with it (a preset's default spans its GPU count)."""
    from dataclasses import replace

    from sim.cost import HardwareTiming

    if isinstance(timing, HardwareTiming) and timing.gpus != 1:
        return replace(timing, gpus=1, comm_ms_per_call=0.0, comm_ms_per_token=0.0)
    return timing


def prompt_tokens(request) -> int:
    """A request's prompt length (a hash-block request carries it; a token trace its ids)."""
    return request.input_len if request.input_len > 0 else len(request.input_tokens)


def modelled_share(spec, timing, lengths) -> dict:
    """FLOPs and modelled FLOP-term time per layer kind for from-scratch prefills of ``lengths``."""
    from sim.cost import attn_run_b, gdn_chunks

    layers = timing._layers(spec)  # the timing's own layer counts per kind (Mamba2 in the mixer's)
    mixer_a = spec.linear_layer_a
    # the attention core's FLOPs as the timing prices them: an overlap-form timing prices what the
    # causal kernel runs (half the paper's full square for marconi-7b), an additive one the count
    quad_b = attn_run_b(spec) if getattr(timing, "layer_form", "additive") == "overlap" else spec.attn_layer_b
    flops = dict.fromkeys(KINDS, 0.0)
    ms = dict.fromkeys(KINDS, 0.0)
    quadratic = 0.0
    for L in lengths:
        chunks = gdn_chunks(0, L)
        work = timing.work_tflop(spec, 0, L, chunks)
        per_layer = {
            "attention": spec.attn_layer_a * L + quad_b * L * L,
            "gated_delta": mixer_a * L + spec.linear_chunk_flops * chunks,
            "mlp": spec.mlp_layer_a * L,
        }
        quadratic += quad_b * L * L * layers["attention"]
        for k in KINDS:
            flops[k] += per_layer[k] * layers[k]
            ms[k] += work[k] * layers[k]
    return {"flops": flops, "ms": ms, "quadratic": quadratic}


def row(name: str, trace: str, lengths: list, r: dict, peak_tflops: float) -> str:
    total_f, total_ms = sum(r["flops"].values()), sum(r["ms"].values())
    if total_f <= 0 or total_ms <= 0:
        return f"{name:<20} {trace:<24} no prefill work"
    share = total_f / (total_ms * 1e-3) / (peak_tflops * 1e12)
    kinds = ", ".join(
        f"{k} {r['flops'][k] / total_f:.0%} at {r['flops'][k] / (r['ms'][k] * 1e-3) / (peak_tflops * 1e12):.0%}"
        for k in KINDS
        if r["flops"][k] > 0 and r["ms"][k] > 0
    )
    mean = sum(lengths) / len(lengths)
    return (
        f"{name:<20} {trace:<24} {len(lengths):>5} {mean:>9,.0f}  {share:>6.1%}  "
        f"{r['quadratic'] / total_f:>5.0%}  {kinds}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-next-80b-a3b,qwen3.5-27b,qwen3.5-9b", help="comma-separated presets")
    ap.add_argument(
        "--trace", action="append", default=None, help="a trace spec (repeatable; default mooncake:sample, sharegpt)"
    )
    ap.add_argument("--requests", type=int, default=50, help="the first N requests of each trace")
    ap.add_argument("--timing", default=None, help="a timing file (default: each preset's default timing)")
    args = ap.parse_args(argv)
    from sim.cost import default_timing, get_model, read_timing_file
    from sim.errors import USER_ERRORS
    from traces.registry import load_trace

    try:
        if args.requests < 1:
            raise ValueError("--requests must be >= 1")
        specs = [get_model(m.strip()) for m in args.models.split(",") if m.strip()]
        traces = {t: load_trace(t) for t in (args.trace or ["mooncake:sample", "sharegpt"])}
        timings = {
            s.name: read_timing_file(args.timing, model=s.name) if args.timing else one_gpu(default_timing(s.name))
            for s in specs
        }
    except USER_ERRORS as exc:
        print(f"replay_peak_share: {exc}", file=sys.stderr)
        return 2
    print(
        f"{'model':<20} {'trace':<24} {'reqs':>5} {'mean len':>9}  {'share':>6}  {'quad':>5}  per kind: FLOPs at % of peak"
    )
    for spec in specs:
        timing = timings[spec.name]
        if not hasattr(timing, "work_tflop"):
            print(f"{spec.name:<20} {'-':<24} its timing has no hardware terms ({type(timing).__name__})")
            continue
        for name, trace in traces.items():
            lengths = [prompt_tokens(r) for r in trace.requests[: args.requests]]
            r = modelled_share(spec, timing, lengths)
            print(row(spec.name, name, lengths, r, timing.peak_tflops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
