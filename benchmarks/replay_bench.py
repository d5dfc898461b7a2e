"""GPU replay benchmark: the default ShareGPT trace (1,235 requests, 1.12M input tokens) replayed
with qwen3.5-9b shapes (all 24 gated-delta layers), marconi and sglang+ at 5 GB, exact and chunk
state alignment; every hit validated.

Prints per run: replay wall time and tokens/s, hits validated and failures, measured prefill time
saved vs the simulator's modelled claim, executed vs simulated FLOPs saved, the time model's
median / P95 error before and after calibration (the fit comes from the first run and is then
applied to every run, so later runs are out-of-sample), and exact vs chunk hit tokens and time.

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load(args):
    if args.packed:
        from traces.packing import load_packed

        packed = load_packed(Path(args.packed))
        if packed is None:
            raise SystemExit(f"cannot read packed trace {args.packed}")
        return packed.to_trace()
    from traces.registry import load_trace

    return load_trace(args.trace)


def row(name, res, before, after):
    s = res.summary
    return dict(
        run=name, requests=s["requests"], input_tokens=s["input_tokens"], hits=s["hits"],
        hit_tokens=s["hit_tokens"], hits_validated=s["hits_validated"], failures=s["failures"],
        max_restore_error=s["max_restore_error"], max_rec_error=s["max_rec_error"],
        max_conv_error=s["max_conv_error"], max_out_error=s["max_out_error"],
        wall_s=s["wall_s"], tokens_per_s=s["tokens_per_s"],
        warmup_s=s["warmup_s"],
        measured_ms_with_cache=s["measured_ms_with_cache"],
        measured_ms_without_cache=s["measured_ms_without_cache"],
        measured_ms_saved=s["measured_ms_saved_validated"],
        modelled_ms_saved_default=s["modelled_ms_saved_validated"],
        modelled_ms_saved_calibrated=after["saved"],
        executed_flops_saved=s["measured_flops_saved"], simulated_flops_saved=s["simulated_flops_saved"],
        replay_flops_executed=s["replay_flops_executed"], replay_flops_simulated=s["replay_flops_simulated"],
        err_median_before=before["median"], err_p95_before=before["p95"],
        err_median_after=after["median"], err_p95_after=after["p95"],
        store_peak_gb=s["store_peak_bytes"] / 1e9, late_admits=s["late_admits"],
    )


def errors_with(res, spec, timing, layers):
    from sim.replay import measure

    df = res.requests.copy()
    df["modelled_ms"] = [measure.modelled_ms(spec, timing, layers, h if r else 0, n)
                         for h, r, n in zip(df["hit_tokens"], df["restored"], df["input_tokens"])]
    df["modelled_full_ms"] = [measure.modelled_ms(spec, timing, layers, 0, n) for n in df["input_tokens"]]
    df["model_error"] = (df["modelled_ms"] - df["suffix_ms"]) / df["suffix_ms"]
    med, p95 = measure.error_stats(df)
    val = df[df["validated"] & df["full_ms"].notna()]
    return dict(median=med, p95=p95, saved=float((val["modelled_full_ms"] - val["modelled_ms"]).sum()))


def print_table(runs, trace, args, results, total, final=False):
    cols = [("run", "{}"), ("requests", "{}"), ("hits", "{}"), ("hit_tokens", "{:,}"),
            ("hits_validated", "{}"), ("failures", "{}"), ("max_restore_error", "{:.2e}"),
            ("max_rec_error", "{:.2e}"), ("max_conv_error", "{:.2e}"), ("max_out_error", "{:.2e}"),
            ("late_admits", "{}"),
            ("wall_s", "{:.1f}"), ("tokens_per_s", "{:,.0f}"),
            ("measured_ms_with_cache", "{:,.0f}"), ("measured_ms_without_cache", "{:,.0f}"),
            ("measured_ms_saved", "{:,.0f}"), ("modelled_ms_saved_default", "{:,.0f}"),
            ("modelled_ms_saved_calibrated", "{:,.0f}"),
            ("executed_flops_saved", "{:.3e}"), ("simulated_flops_saved", "{:.3e}"),
            ("err_median_before", "{:.1%}"), ("err_p95_before", "{:.1%}"),
            ("err_median_after", "{:.1%}"), ("err_p95_after", "{:.1%}"), ("store_peak_gb", "{:.2f}")]
    first = next(iter(results.values()))
    dev, layers = first.settings.get("device_name", ""), first.settings["layers"]
    print(f"\n=== replay benchmark: {trace.name}, {args.model} ({layers} gated-delta layers), {args.capacity}, "
          f"mode {args.mode}, {args.dtype} on {dev}, {'total' if final else 'so far'} {total:.0f} s", flush=True)
    for key, fmt in cols:
        print(f"{key:>30} " + " ".join(f"{fmt.format(r[key]):>16}" for r in runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", help="export the tokenized trace into this folder and stop")
    ap.add_argument("--trace", default="sharegpt")
    ap.add_argument("--packed", help="a packed trace (.npz) written by --prepare")
    ap.add_argument("--model", default="qwen3.5-9b")
    ap.add_argument("--layers", type=int, default=None, help="replayed layers (default: all)")
    ap.add_argument("--capacity", default="5GB")
    ap.add_argument("--policies", default="marconi,sglang+")
    ap.add_argument("--alignments", default="exact,chunk")
    ap.add_argument("--mode", default="des")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", default=None, help="folder for bench.json, the timing file and the first run's output")
    ap.add_argument("--save-all", action="store_true", help="write every run's output folder (not only the first)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip the runs that would end past this many seconds (estimated from the last run)")
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
    from sim.cost import get_model
    from sim.replay import output
    from sim.replay.session import ReplaySettings, calibrate, run_replay
    from sim.simulate import build

    trace = load(args)
    spec = get_model(args.model)
    out = Path(args.out) if args.out else None
    runs, results = [], {}
    calibrated = None
    t_all = time.perf_counter()
    for policy in args.policies.split(","):
        for align in args.alignments.split(","):
            config = SimConfig(policy=policy, model=args.model, capacity_bytes=parse_size(args.capacity),
                               state_alignment=align, mode=args.mode)
            settings = ReplaySettings(layers=args.layers, device=args.device, dtype=args.dtype,
                                      requests=args.requests, warmup=not results)
            name = f"{policy}/{align}"
            elapsed = time.perf_counter() - t_all
            if args.budget_s and runs and elapsed + 1.15 * runs[-1]["wall_s"] > args.budget_s:
                print(f"--- {name}: skipped (time budget {args.budget_s:.0f} s)", flush=True)
                continue
            print(f"--- {name}", flush=True)
            res = run_replay(trace, config, settings, build=build)
            layers = res.settings["layers"]
            if calibrated is None:
                calibrate(res, config, out / "timing.json" if out else None)
                calibrated = res.calibrated
                print(f"calibrated on {name}: {calibrated.effective_tflops:.1f} TFLOP/s, "
                      f"{calibrated.overhead_ms:.2f} ms overhead (whole model); "
                      f"in-sample median error {res.calibration['median_error']:.1%}", flush=True)
            before = errors_with(res, spec, res.timing, layers)
            after = errors_with(res, spec, calibrated, layers)
            r = row(name, res, before, after)
            runs.append(r)
            results[name] = res
            print(json.dumps(r), flush=True)
            for f in res.failures[:5]:
                print("  FAIL", f.message(), flush=True)
            print_table(runs, trace, args, results, time.perf_counter() - t_all)
            if out and (args.save_all or len(runs) == 1):
                output.write(out / name.replace("/", "-").replace("+", "plus"), res.summary,
                             res.settings, res.requests)
    print_table(runs, trace, args, results, time.perf_counter() - t_all, final=True)
    if out:
        (out / "bench.json").write_text(json.dumps(dict(runs=runs, total_s=time.perf_counter() - t_all,
                                                        calibrated=dict(tflops=calibrated.effective_tflops,
                                                                        overhead_ms=calibrated.overhead_ms)),
                                                   indent=2) + "\n")


if __name__ == "__main__":
    main()
