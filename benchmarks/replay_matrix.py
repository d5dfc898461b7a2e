#!/usr/bin/env python3
"""Replay's contract as a table: one `marconi replay` per preset x trace x scheduler, every run's
hits, validated hits (with their KV), failures, FLOPs saved executed against simulated (and the
part the kernel's 64-token chunks explain), the time model's per-request error with every prefill
counted (median / P95, host-bound prefills included) and the executed TFLOP/s over the timed calls
as a share of the device's peak.

    python benchmarks/replay_matrix.py --out DIR                       # on a GPU: the real presets
    python benchmarks/replay_matrix.py --out DIR --device cpu --models replay-tiny --requests 20

Each run writes DIR/<name>/summary.json and its per-request table DIR/<name>/requests.parquet
(with ``continuous``, the per-step DIR/<name>/steps.parquet too: every timed prefill and step,
what the time model is re-scored on offline, ``benchmarks/reprice_requests.py``); a run whose
summary is already there is not run again, so a matrix cut short resumes. The table is printed
and written to DIR/matrix.md, and the tables each run kept are listed after it. A run that fails
(exit status not 0, or stopped by ``--per-run-s``: it writes nothing) is a row saying so, and the
script's exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = "qwen3.5-9b,qwen3.5-27b,qwen3-next-80b-a3b,qwen3.5-35b-a3b"
#: trace name -> (replay options); the ShareGPT slice is sessions the time model's fit never saw
TRACES = {
    "mooncake": ["--trace", "mooncake:sample"],
    "sharegpt": ["--trace", "sharegpt", "--session-range", "60:100"],
    "agent": ["--trace", "synthetic:agent"],
}
#: scheduler name -> replay options
SCHEDULERS = {
    "sequential": ["--mode", "sequential"],
    "fcfs": ["--mode", "des", "--scheduler", "fcfs"],
    "continuous": ["--mode", "des", "--scheduler", "continuous"],
}
COLUMNS = (
    "run",
    "hits",
    "validated (KV)",
    "failures",
    "FLOPs saved executed / simulated",
    "rest",
    "time error median / P95 (all)",
    "host-bound",
    "re-timed",
    "TFLOP/s timed (of peak)",
)
#: the tables a run's folder holds beside its summary.json (sim.replay.output)
TABLES = ("requests.parquet", "steps.parquet")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def row(name: str, summary: dict | None, peak_tflops: float) -> list[str]:
    """One table row from a run's summary (None: the run failed)."""
    if summary is None:
        return [name, "failed"] + [""] * (len(COLUMNS) - 2)
    s = summary
    exe, sim, pad = s["measured_flops_saved"], s["simulated_flops_saved"], s.get("padding_flops_saved", 0.0)
    rest = exe - sim - pad
    if s.get("time_model_compared", True):
        err = f"{_pct(s.get('time_model_median_error'))} / {_pct(s.get('time_model_p95_error_all'))}"
    else:
        err = "not compared"
    tf = s.get("replay_tflops_timed") or 0.0
    share = f" ({100 * tf / peak_tflops:.1f} %)" if peak_tflops else ""
    return [
        name,
        f"{s['hits']}",
        f"{s['hits_validated']} ({s['kv_hits_validated']})",
        f"{s['failures']}",
        f"{exe:.3e} / {sim:.3e}",
        f"{rest:.3g}",
        err,
        f"{s.get('host_bound_prefills', 0)}",
        # prefills whose first call's host issue outran its sleep, timed again (measure.outran_sleep)
        f"{s.get('retimed_prefills', 0)}",
        f"{tf:.1f}{share}",
    ]


def table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def peak_of(device: str) -> float:
    """The device's dense bf16 peak (TFLOP/s) from the replay's own table, 0 on a CPU."""
    if device != "cuda":
        return 0.0
    import torch

    from sim.replay.measure import device_peak

    return device_peak(torch.cuda.get_device_name(0), "bf16")  # already TFLOP/s (sim.replay.measure.PEAKS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="results folder (runs already in it are kept, not rerun)")
    ap.add_argument("--models", default=MODELS, help="comma-separated presets")
    ap.add_argument("--traces", default="mooncake,sharegpt", help=f"comma-separated, of {', '.join(TRACES)}")
    ap.add_argument("--schedulers", default="fcfs,continuous", help=f"comma-separated, of {', '.join(SCHEDULERS)}")
    ap.add_argument("--layers", type=int, default=4, help="mixer layers replayed (0: the whole model)")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--capacity", default="40GB")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--timing", default=None, help="timing file the runs are compared with (default: the replay's)")
    ap.add_argument("--per-run-s", type=float, default=0, help="stop a run after this many seconds (0: never)")
    args = ap.parse_args(argv)
    for what, names, known in (("trace", args.traces, TRACES), ("scheduler", args.schedulers, SCHEDULERS)):
        bad = [n for n in names.split(",") if n not in known]
        if bad:
            print(f"replay_matrix: unknown {what} {bad[0]!r} (known: {', '.join(known)})", file=sys.stderr)
            return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows, failed, names = [], 0, []
    peak = peak_of(args.device)
    for model in args.models.split(","):
        for trace in args.traces.split(","):
            for sched in args.schedulers.split(","):
                name = f"{model}-{trace}-{sched}"
                names.append(name)
                run_dir = out / name
                summary_path = run_dir / "summary.json"
                if not summary_path.exists():
                    cmd = [
                        sys.executable,
                        "-c",
                        "import sys; from sim.cli import main; sys.argv[0] = 'marconi'; main()",
                    ]
                    cmd += ["replay", "--model", model, *TRACES[trace], *SCHEDULERS[sched]]
                    cmd += ["--requests", str(args.requests), "--capacity", args.capacity, "--device", args.device]
                    if args.layers:
                        cmd += ["--layers", str(args.layers)]
                    if args.timing:
                        cmd += ["--timing", args.timing]
                    cmd += ["--no-progress", "--out", str(run_dir)]
                    t0 = time.perf_counter()
                    try:
                        proc = subprocess.run(
                            cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.per_run_s or None
                        )
                        rc, err = proc.returncode, proc.stderr
                    except subprocess.TimeoutExpired:
                        rc, err = -1, f"stopped after {args.per_run_s:.0f} s"
                    (out / f"{name}.log").write_text(err if rc else "")
                    print(f"{name}: exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
                    if rc:
                        print("  " + (err.strip().splitlines() or [""])[-1], flush=True)
                if summary_path.exists():
                    rows.append(row(name, json.loads(summary_path.read_text())["summary"], peak))
                else:
                    rows.append(row(name, None, peak))
                    failed += 1
    text = table(rows)
    print(text)
    (out / "matrix.md").write_text(text + "\n")
    for line in kept_tables(out, names):
        print(line)
    return 1 if failed else 0


def kept_tables(out: Path, names: list) -> list:
    """One line per run: the per-request / per-step tables its folder kept (or that it kept none:
    a failed or stopped run writes nothing)."""
    lines = []
    for name in names:
        have = [t for t in TABLES if (out / name / t).is_file()]
        lines.append(f"{name}: {', '.join(f'{name}/{t}' for t in have) if have else 'no tables kept'}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
