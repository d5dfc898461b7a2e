"""Session 29 (CPU): should ``marconi replay --calibrate`` (one run, one preset) fit the overlap form?

For each preset of session 27's H100 campaign with fit runs, calibrate on one fit run as ``--calibrate``
does (``calibration.calibrate_run``: the additive form) and in the overlap form
(``calibration.fit_across`` on that one run, ``form="overlap"``), then score both and the committed H100
file (fitted on the whole campaign) on the same preset's other runs: per-request prefill error over all
prefills, median / P95, and the time saved's error (%). From the repository root:

    .venv/bin/python benchmarks/results/2026-12-07-calibrate-forms-s29/forms.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import timing_fit as tf  # noqa: E402
from sim.cost import read_timing_file  # noqa: E402
from sim.replay.calibration import calibrate_run, fit_across, request_errors  # noqa: E402

S27 = ROOT / "benchmarks" / "results" / "2026-12-07-gpu-s27"
ROOTS = (S27 / "callA" / "campaign", S27 / "callD" / "fulldepth", S27 / "callB" / "rows")
DEVICE, PEAK = "NVIDIA H100 80GB HBM3", 989.0


def score(run, timing) -> str:
    e = request_errors(run, timing)
    a = e["error"].abs().replace([np.inf, -np.inf], np.nan).dropna()
    saved, modelled = e["saved_ms"].sum(), e["modelled_saved_ms"].sum()
    err = 100 * (modelled / saved - 1) if saved > 0 else float("nan")
    return f"{100 * a.median():5.1f} /{100 * a.quantile(0.95):5.1f} /{err:+5.0f}"


def main() -> int:
    runs = [r for root in ROOTS if root.is_dir() for r, _, _ in tf.load_runs(root)]
    base = read_timing_file(ROOT / "sim" / "data" / "h100-timing.json")
    by: dict[str, list] = {}
    for r in runs:
        by.setdefault(r.spec.name, []).append(r)
    print("run: median / P95 / time saved error (%) under the committed file | one-run additive | one-run overlap")
    for model, rs in by.items():
        for f in [r for r in rs if r.name.startswith("fit") and not r.name.startswith("fit-")][:2]:
            additive, _ = calibrate_run(f.table, f.spec, base, f.counts, device=DEVICE, peak_tflops=PEAK)
            overlap, _ = fit_across(
                [f], base, peak_tflops=PEAK, device=DEVICE, resume=bool(f.spec.n_gdn), form="overlap"
            )
            print(f"## {model}: calibrated on {f.name} ({len(f.table)} requests)")
            for r in rs:
                if r is not f:
                    line = f"committed {score(r, base)} | additive {score(r, additive)} | overlap {score(r, overlap)}"
                    print(f"  {r.name:40s} {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
