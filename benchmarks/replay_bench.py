"""GPU replay benchmark: whole-model replay (attention with a paged KV store, gated-delta layers,
MLP) at a preset's full depth, every hit validated; the hardware cost model fitted on one trace
and checked on traces the fit did not see.

Steps (each writes its results under --out as it goes, so a run cut short keeps what it did):
1. the device's ceilings: a large bf16 matrix product (TFLOP/s) and a device-to-device copy
   (bytes read + written per second);
2. the fit run: replay of the fit trace (a synthetic chat trace by default: long and short
   prompts, hits at every depth), ``--calibrate``: per-layer-type terms, each term's fraction of
   the device's peak; decode per token = the active bf16 weights over the measured copy rate;
3. held-out runs on the main trace (ShareGPT by default, packed with --prepare): per policy and
   state alignment, the per-request prefill error of the old estimate and of the calibrated
   model, measured vs modelled time saved, TTFT p50 / p95 (sequential mode: TTFT = the prefill),
   time shares per layer type, executed TFLOP/s over timed prefills and over the wall time.
   A run whose mode is ``continuous`` (e.g. ``marconi/exact/continuous``) replays the engine's
   continuous-batching scheduler (``--scheduler continuous``, des mode): every step executed as one
   batched forward and timed (``--coast-steps`` per coasted decode run); it adds the modelled vs
   measured step time (median / P95 error, old estimate and calibrated model) and executed TFLOP/s
   over the timed steps and over the wall time, and writes ``steps.parquet``.
   A sequential run with ``@N`` (e.g. ``marconi/exact/sequential@16``) is a batched replay
   (``--batch N``, ``--batch-tokens``): every hit still validated, requests run as varlen batches
   and their hits checked by batched from-scratch prefills; it reports the batch calls by kind and
   executed TFLOP/s over the timed calls and over the wall time, each as a share of the peak (no
   per-request times: compare its wall time with the same run without ``@N``).

    python benchmarks/replay_bench.py --prepare .replay_bench   # here: export the packed trace
    python benchmarks/replay_bench.py --packed .replay_bench/sharegpt.npz --out DIR   # on a GPU

The device machine has no tokenizer or dataset package: ``--prepare`` copies the tokenized
trace (the loader's on-disk cache, an .npz) so that it can travel with the working tree.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the fit traces (';'-separated): next-turn messages of a few dozen tokens on 2K-token prompts
# (launch-bound calls), and long documents with longer questions (compute-bound calls, contexts
# to ~10K tokens for the attention's quadratic term)
FIT_TRACE = (
    "synthetic:chat:sessions=24,turns=6,prompt_tokens=2000,user_tokens=30,output_tokens=150,prompts=4;"
    "synthetic:chat:sessions=12,turns=4,prompt_tokens=6000,user_tokens=600,output_tokens=100,prompts=6"
)


def load(spec, packed=None):
    if packed:
        from traces.packing import load_packed

        p = load_packed(Path(packed))
        if p is None:
            raise SystemExit(f"cannot read packed trace {packed}")
        return p.to_trace()
    from traces.registry import TraceOptions, load_trace

    return load_trace(spec, TraceOptions())


def ceilings(dev="cuda") -> dict:
    """Measured bf16 matmul rate and copy bandwidth (medians of timed repeats)."""
    import torch

    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        a @ b
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    tflops = 2 * n**3 / (ts[len(ts) // 2] * 1e-3) / 1e12
    x = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        y.copy_(x)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    bw = 2 * x.numel() / (ts[len(ts) // 2] * 1e-3)
    del x, y
    return dict(
        matmul_tflops=tflops,
        copy_bytes_per_s=bw,
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
    )


def print_device_memory(when: str) -> None:
    """Print what the GPU's caching allocator holds ``when`` (after a run, its result still
    referenced): session 31's H100 saw the free memory the replay plans with fall 77.5 -> 57.4 ->
    43.9 GB over three runs of qwen3-next-80b-a3b in one process. Nothing without CUDA."""
    import gc

    import torch

    if not torch.cuda.is_available():
        return
    gc.collect()
    gb = 1e9
    print(
        f"device memory {when}: allocated {torch.cuda.memory_allocated() / gb:.1f} GB, reserved "
        f"{torch.cuda.memory_reserved() / gb:.1f} GB, driver free {torch.cuda.mem_get_info()[0] / gb:.1f} GB",
        flush=True,
    )


def old_estimate(spec):
    """The estimate the simulator used before calibration (40 % of 989 TFLOP/s + 10 ms)."""
    from sim.cost import TimingModel

    return TimingModel(round(989.0 * 0.4, 1), 10.0, 1.0, source="estimate (before calibration)")


def errors_with(res, spec, timing, counts):
    import numpy as np

    from sim.replay import measure

    df = res.requests
    mod = np.array(
        [
            measure.modelled_ms(spec, timing, counts, h if r else 0, n, s)
            for h, r, n, s in zip(df["hit_tokens"], df["restored"], df["input_tokens"], df["splits"])
        ]
    )
    full = np.array([measure.modelled_ms(spec, timing, counts, 0, n) for n in df["input_tokens"]])
    meas = df["suffix_ms"].to_numpy()
    timed = np.isfinite(meas) & (meas > 0)
    # host-bound prefills (their device time holds host gaps: sim.replay.clock.Stopwatch) are
    # left out of the errors and TTFTs; the "_all" figures keep them
    held = measure.held_up(df).to_numpy()
    ok = timed & ~held
    err = np.abs(mod[ok] - meas[ok]) / meas[ok]
    err_all = np.abs(mod[timed] - meas[timed]) / meas[timed]
    val = (df["validated"] & df["full_ms"].notna()).to_numpy()
    saved_mod = float((full[val] - mod[val]).sum())
    saved_meas = float((df["full_ms"].to_numpy()[val] - meas[val]).sum())
    return dict(
        median=float(np.median(err)),
        p95=float(np.quantile(err, 0.95)),
        p95_all=float(np.quantile(err_all, 0.95)),
        host_bound=int((timed & held).sum()),
        saved_modelled=saved_mod,
        saved_measured=saved_meas,
        saved_error=(saved_mod - saved_meas) / saved_meas if saved_meas else float("nan"),
        ttft_p50_measured=float(np.quantile(meas[ok], 0.5)),
        ttft_p95_measured=float(np.quantile(meas[ok], 0.95)),
        ttft_p50_modelled=float(np.quantile(mod[ok], 0.5)),
        ttft_p95_modelled=float(np.quantile(mod[ok], 0.95)),
        ttft_p95_measured_all=float(np.quantile(meas[timed], 0.95)),
    )


def roofline(res, spec, counts, dev, dtype_bytes: int = 2) -> dict:
    """How far the timed prefills are from the device: each call's roofline (FLOPs at the measured
    matrix-product ceiling or the replayed layers' weight reads at the measured copy rate, whichever
    is longer), summed over the timed calls, against their measured time; and the share of the
    bf16 peak that the roofline itself allows for these calls (what one-request-at-a-time replay of
    this trace could reach at best)."""
    from sim.replay import measure

    df = res.requests
    ok = df["suffix_ms"].notna() & (df["suffix_ms"] > 0)
    wbytes = measure.replayed_weight_bytes(spec, counts, dtype_bytes)
    bound = measure.roofline_ms(
        df.loc[ok, "replay_flops"], wbytes, dev["matmul_tflops"] * 1e12, dev["copy_bytes_per_s"]
    )
    peak = measure.device_peak(dev["device"], "bf16") or float("nan")
    flops = float(df.loc[ok, "replay_flops"].sum())
    return dict(
        roofline_ms=float(bound.sum()),
        roofline_share=float(bound.sum() / df.loc[ok, "suffix_ms"].sum()),
        roofline_peak_share=flops / (bound.sum() * 1e-3) / (peak * 1e12),
    )


def validated(name, s) -> dict:
    """The columns every run has: what was replayed and validated, wall time, executed TFLOP/s."""
    return dict(
        run=name,
        requests=s["requests"],
        input_tokens=s["input_tokens"],
        hits=s["hits"],
        hit_tokens=s["hit_tokens"],
        hits_validated=s["hits_validated"],
        kv_hits_validated=s["kv_hits_validated"],
        failures=s["failures"],
        kv_failures=s["kv_failures"],
        max_rec_error=s["max_rec_error"],
        max_conv_error=s["max_conv_error"],
        max_out_error=s["max_out_error"],
        max_kv_error=s["max_kv_error"],
        wall_s=s["wall_s"],
        warmup_s=s["warmup_s"],
        tokens_per_s=s["tokens_per_s"],
        tflops_timed=s["replay_tflops_timed"],
        tflops_wall=s["replay_tflops_wall"],
    )


def row(name, res, before, after):
    s = res.summary
    by = s["measured_ms_by_layer_type"]
    tot = sum(by.values()) or 1.0
    split = res.requests[res.requests["splits"] > 0]["suffix_ms"]
    one = res.requests[(res.requests["splits"] == 0) & res.requests["suffix_ms"].notna()]["suffix_ms"]
    return dict(
        **validated(name, s),
        share_attention=by["attention"] / tot,
        share_gated_delta=by["gated_delta"] / tot,
        share_mlp=by["mlp"] / tot,
        share_other=by["other"] / tot,
        measured_ms_with_cache=s["measured_ms_with_cache"],
        measured_ms_without_cache=s["measured_ms_without_cache"],
        splits=s["splits"],
        split_median_ms=float(split.median()) if len(split) else float("nan"),
        one_call_median_ms=float(one.median()) if len(one) else float("nan"),
        measured_ms_saved=before["saved_measured"],
        modelled_ms_saved_before=before["saved_modelled"],
        modelled_ms_saved_after=after["saved_modelled"],
        saved_error_before=before["saved_error"],
        saved_error_after=after["saved_error"],
        err_median_before=before["median"],
        err_p95_before=before["p95"],
        err_median_after=after["median"],
        err_p95_after=after["p95"],
        err_p95_after_all=after["p95_all"],
        host_bound_prefills=after["host_bound"],
        ttft_p50_measured=after["ttft_p50_measured"],
        ttft_p50_modelled=after["ttft_p50_modelled"],
        ttft_p95_measured=after["ttft_p95_measured"],
        ttft_p95_modelled=after["ttft_p95_modelled"],
        ttft_p95_measured_all=after["ttft_p95_measured_all"],
        executed_flops_saved=s["measured_flops_saved"],
        simulated_flops_saved=s["simulated_flops_saved"],
        store_peak_gb=s["store_peak_bytes"] / 1e9,
        kv_tokens_live=s["kv_tokens_live"],
        late_admits=s["late_admits"],
    )


def step_row(res, spec, timing_before, timing_after, counts) -> dict:
    """A continuous run's step figures: modelled vs measured step time under both timing models,
    executed TFLOP/s over the timed steps and over the wall time."""
    from sim.replay import steps

    s = res.summary
    before = steps.error_stats(steps.with_model(res.steps, spec, timing_before, counts))
    after = steps.error_stats(steps.with_model(res.steps, spec, timing_after, counts))
    # the per-sequence term fitted on the run's first half of steps, errors on the second half
    seq = {}
    if steps.seq_fittable(timing_after):  # a one-preset additive fit (a committed --timing file keeps its own)
        _, seq = steps.calibrate_steps(res.steps, spec, timing_after, counts)
    return dict(
        step_events=s["step_events"],
        steps_simulated=s["steps_simulated"],
        steps_executed=s["steps_executed"],
        step_measured_p50_ms=s["step_measured_ms"]["p50"],
        step_measured_p95_ms=s["step_measured_ms"]["p95"],
        step_modelled_p50_ms=s["step_modelled_ms"]["p50"],
        step_err_median_before=before["median"],
        step_err_p95_before=before["p95"],
        step_err_median_after=after["median"],
        step_err_p95_after=after["p95"],
        steps_host_bound=s.get("steps_host_bound", 0),
        step_err_median_seq_fit_held_out=seq.get("median_error", float("nan")),
        step_err_p95_seq_fit_held_out=seq.get("p95_error", float("nan")),
        step_tflops_timed=s["step_tflops_timed"],
        step_tflops_wall=s["step_tflops_wall"],
        step_peak_share=s["step_peak_share"],
        step_check_failures=s["step_check_failures"],
    )


def batch_row(name, res) -> dict:
    """A batched run's figures: what was validated, the batch calls by kind, executed TFLOP/s."""
    s = res.summary
    r = dict(
        **validated(name, s),
        peak_share_timed=s["replay_peak_share_timed"],
        peak_share_wall=s["replay_peak_share_wall"],
        batch_calls_host_bound=s["batch_calls_host_bound"],
        batch_flushes=json.dumps(s["batch_flushes"]),
    )
    for kind, d in s["batch_calls"].items():
        for k in ("calls", "sequences_per_call", "tokens_per_call", "ms", "tflops", "peak_share"):
            r[f"{kind}_{k}"] = d[k]
    return r


def print_table(runs, header):
    print(f"\n=== {header}", flush=True)
    keys = list(dict.fromkeys(k for r in runs for k in r))  # continuous runs add step columns
    for k in keys:
        vals = []
        for r in runs:
            v = r.get(k, "-")
            if isinstance(v, float):
                v = f"{v:.3g}" if abs(v) < 1e5 else f"{v:.4g}"
            vals.append(f"{v:>22}")
        print(f"{k:>28} " + " ".join(vals), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", help="export the tokenized trace into this folder and stop")
    ap.add_argument("--trace", default="sharegpt")
    ap.add_argument("--packed", help="a packed trace (.npz) written by --prepare")
    ap.add_argument("--fit-trace", default=FIT_TRACE)
    ap.add_argument("--fit-requests", type=int, default=None)
    ap.add_argument("--timing", help="use this timing file instead of fitting one (skips step 2)")
    ap.add_argument("--model", default="qwen3.5-9b")
    ap.add_argument("--layers", type=int, default=None, help="mixer layers replayed (default: all)")
    ap.add_argument("--capacity", default="5GB")
    ap.add_argument(
        "--runs", default="marconi/exact/sequential,marconi/chunk/sequential,sglang+/exact/des,marconi/exact/des"
    )
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--batch-tokens", type=int, default=16384, help="batched runs (@N): tokens per batched call")
    ap.add_argument(
        "--coast-steps", type=int, default=4, help="continuous runs: steps timed per coasted decode run (default 4)"
    )
    ap.add_argument("--sessions-per-second", type=float, default=1.0, help="closed-loop session starts (default 1)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument(
        "--attention",
        default="sdpa",
        choices=("sdpa", "cudnn"),
        help="prefills' attention (marconi replay --attention)",
    )
    ap.add_argument(
        "--elementwise",
        default="torch",
        choices=("torch", "fused"),
        help="norms, gates and activations (marconi replay --elementwise)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip the runs that would end past this many seconds (estimated from the last run)",
    )
    args = ap.parse_args()

    if args.prepare:
        from traces.registry import load_trace

        t = load_trace(args.trace)
        src = t.meta.get("cache_path")
        if not src or not Path(src).is_file():
            raise SystemExit(f"{args.trace} has no packed cache file to export")
        dst = Path(args.prepare)
        dst.mkdir(parents=True, exist_ok=True)
        name = args.trace.split(":")[0] + ".npz"
        shutil.copyfile(src, dst / name)
        print(f"wrote {dst / name} ({len(t.requests)} requests, {t.input_tokens_total():,} input tokens)")
        return

    from sim.config import SimConfig, parse_size
    from sim.cost import get_model, read_timing_file
    from sim.replay import measure, output
    from sim.replay.session import ReplaySettings, run_replay
    from sim.simulate import build

    import torch

    if not torch.cuda.is_available():
        print("replay_bench: needs a CUDA GPU (steps 1-3 time the device)", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    spec = get_model(args.model)
    t_all = time.perf_counter()
    dev = ceilings()
    print("device:", json.dumps(dev), flush=True)
    bw = dev["copy_bytes_per_s"]
    # batch-1 decode reads the active weights (embedding row aside, the LM head included) once
    decode_ms = spec.active_params() * 2 / bw * 1e3
    if out:
        (out / "device.json").write_text(json.dumps(dict(dev, decode_ms_per_token=decode_ms), indent=2) + "\n")
    warmed = False
    if args.timing:
        calibrated = read_timing_file(args.timing)
        fit_info = {}
    else:
        import pandas as pd

        cfg = SimConfig(
            policy="marconi",
            model=args.model,
            capacity_bytes=parse_size("inf"),
            state_alignment="exact",
            mode="sequential",
        )
        tables, names = [], []
        for i, spec_fit in enumerate(args.fit_trace.split(";")):
            fit = load(spec_fit)
            st = ReplaySettings(
                layers=args.layers,
                dtype=args.dtype,
                requests=args.fit_requests,
                warmup=not warmed,
                attention=args.attention,
                elementwise=args.elementwise,
            )
            print(f"--- fit run {i} on {spec_fit}", flush=True)
            res = run_replay(fit, cfg, st, build=build)
            warmed = True
            tables.append(res.requests)
            names.append(spec_fit)
            print("fit run summary:", json.dumps(res.summary, default=float), flush=True)
            print_device_memory(f"after fit run {i}")
            if out:
                output.write(out / f"fit-run-{i}", res.summary, res.settings, res.requests)
        counts = res.settings["layers_replayed"]
        calibrated, fit_info = measure.calibrate(
            pd.concat(tables, ignore_index=True),
            spec,
            res.timing,
            counts,
            device=dev["device"],
            peak_tflops=measure.device_peak(dev["device"], args.dtype),
            decode_ms_per_token=decode_ms,
        )
        calibrated = replace(
            calibrated,
            source=(
                f"marconi replay --calibrate on {dev['device']} (torch {dev['torch']}, triton {dev['triton']}), "
                f"{args.model} full depth {counts}, {args.dtype}, fit traces: {' + '.join(names)}; decode = "
                f"active bf16 weights / measured copy rate {bw / 1e12:.2f} TB/s"
            ),
        )
        if out:
            measure.write_timing(
                out / "timing.json",
                calibrated,
                spec,
                dict(fit_info, fit_traces=names, device=dev, measured_matmul_tflops=dev["matmul_tflops"]),
            )
        print(
            "fit:",
            json.dumps(
                dict(
                    fit_info,
                    ms_per_tflop=calibrated.ms_per_tflop,
                    layer_call_ms=calibrated.layer_call_ms,
                    layer_floor_ms=calibrated.layer_floor_ms,
                ),
                default=float,
            ),
            flush=True,
        )
    runs = []
    trace = load(args.trace, args.packed)
    for spec_run in args.runs.split(","):
        base_run, _, at = spec_run.partition("@")
        policy, align, mode = base_run.split("/")
        batch = int(at) if at else 1
        elapsed = time.perf_counter() - t_all
        if args.budget_s and runs and elapsed + 1.1 * runs[-1]["wall_s"] > args.budget_s:
            print(f"--- {spec_run}: skipped (time budget {args.budget_s:.0f} s)", flush=True)
            continue
        print(f"--- {spec_run}", flush=True)
        continuous = mode == "continuous"
        config = SimConfig(
            policy=policy,
            model=args.model,
            capacity_bytes=parse_size(args.capacity),
            state_alignment=align,
            mode="des" if continuous else mode,
            scheduler="continuous" if continuous else "fcfs",
            sessions_per_second=args.sessions_per_second,
        )
        # a continuous run warms its step batches up even after an earlier run warmed the rest
        settings = ReplaySettings(
            layers=args.layers,
            dtype=args.dtype,
            requests=args.requests,
            warmup=not warmed or continuous or batch > 1,
            coast_steps=args.coast_steps,
            batch=batch,
            batch_tokens=args.batch_tokens,
            attention=args.attention,
            elementwise=args.elementwise,
        )
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        res = run_replay(trace, config, settings, build=build, timing=calibrated)
        print_device_memory(f"after {spec_run}")
        warmed = True
        counts = res.settings["layers_replayed"]
        if batch > 1:
            r = batch_row(spec_run, res)
        else:
            before = errors_with(res, spec, old_estimate(spec), counts)
            after = errors_with(res, spec, calibrated, counts)
            r = row(spec_run, res, before, after)
            r.update(roofline(res, spec, counts, dev))
            if res.steps is not None:
                r.update(step_row(res, spec, old_estimate(spec), calibrated, counts))
        if torch.cuda.is_available():  # the run's device memory high-water mark (issue 41: an OOM)
            r["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        runs.append(r)
        print(json.dumps(r, default=float), flush=True)
        for f in res.failures[:5]:
            print("  FAIL", f.message(), flush=True)
        if out:
            output.write(
                out / spec_run.replace("/", "-").replace("+", "plus").replace("@", "-b"),
                res.summary,
                res.settings,
                res.requests,
                steps=res.steps,
            )
            (out / "bench.json").write_text(
                json.dumps(
                    dict(device=dev, fit=fit_info, runs=runs, total_s=time.perf_counter() - t_all),
                    indent=2,
                    default=float,
                )
                + "\n"
            )
        print_table(
            runs,
            f"{trace.name}, {args.model}, {args.capacity}, {args.dtype} on {dev['device']}, "
            f"{time.perf_counter() - t_all:.0f} s",
        )


if __name__ == "__main__":
    from sim.errors import UsageError

    try:
        main()
    except UsageError as e:  # a refused calibration, a bad option: one line, exit 2
        print(f"replay_bench: {e}", file=sys.stderr)
        raise SystemExit(2) from None
