"""Fit one timing across presets' shapes and score it on held-out presets and traces.

    python benchmarks/timing_fit.py DIR [DIR ...] [--fit-prefix fit] [--out timing.json] [--force]

Each DIR holds the run folders of ``benchmarks/timing_campaign.sh`` (each a ``marconi replay --out``
folder: ``summary.json``, ``requests.parquet``, for continuous runs ``steps.parquet``). Runs whose
name starts with ``--fit-prefix`` are fitted (``sim.replay.calibration.fit_across``); every run is
then scored with the committed timing (``before``) and the new fit (``after``): per-request
prefill error, median / P95, over the device-bound prefills, over all of them and over the
host-bound ones (priced with the later of the device and host issue times where the timing has a
host term: ``sim.replay.measure.call_model_ms``), and for continuous runs the step-time error; then
per run what the host did (``host_report``). ``--out`` writes the fitted timing file (as
``marconi replay --calibrate`` does; ``sim/data/h200-timing.json`` is written this way).
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.cost import LAYER_FORMS, MODELS, _h200_calibrated, get_model, read_timing_file, scale_timing, timing_to_dict  # noqa: E402
from sim.errors import UsageError  # noqa: E402
from sim.gpus import catalogue_name, get_gpu  # noqa: E402
from sim.replay.calibration import Run, calls_of, fit_across, host_calls, request_errors, saved_error  # noqa: E402
from sim.replay.measure import HOST_WAITED_MS, device_peak, held_up, replayed_spec  # noqa: E402
from sim.replay.steps import with_model  # noqa: E402
from sim.replay.summary import cost_counts  # noqa: E402


FEW_LAYERS = 4  # the campaign's --layers
HOME_GPU = "h200"  # the GPU of the committed calibration (sim/data/h200-timing.json)
#: what the fit keeps from the committed file: the replays it reads are one-request prefills
STEPS_SOURCE = (
    "per-sequence step times (seq_ms) and decode kept from the H200 calibration of 2026-12-02 "
    "(qwen3.5-9b full depth, fit traces synthetic:chat; seq_ms fitted on 704 steps of a continuous "
    "ShareGPT replay; decode = active bf16 weights / measured copy rate 4.17 TB/s)"
)


def read_table(path: Path) -> pd.DataFrame:
    """A ``requests.parquet`` or ``steps.parquet``, or its ``.xz`` (as benchmarks/results keeps
    large ones)."""
    if path.is_file():
        return pd.read_parquet(path)
    with lzma.open(path.with_name(path.name + ".xz")) as f:
        return pd.read_parquet(f)


def _has(d: Path, name: str) -> bool:
    return (d / name).is_file() or (d / (name + ".xz")).is_file()


def _preset_of(name: str) -> str:
    """The longest preset name that starts the folder name ``name``."""
    found = [m for m in MODELS if name.startswith(m + "-")]
    if not found:
        raise UsageError(f"{name}: no settings in its summary.json and no preset name starts it")
    return max(found, key=len)


def load_runs(root: Path) -> list[tuple[Run, dict, pd.DataFrame | None]]:
    out = []
    for d in sorted(p for p in root.iterdir() if (p / "summary.json").is_file() and _has(p, "requests.parquet")):
        s = json.loads((d / "summary.json").read_text())
        # a preset matrix row (``MARCONI_GPU_ROWS``) written before rows kept their settings: its
        # folder is named ``<preset>-<trace>-<scheduler>``
        settings, summ = s.get("settings") or {"model": _preset_of(d.name)}, s["summary"]
        steps = read_table(d / "steps.parquet") if _has(d, "steps.parquet") else None
        # a Mamba2 model's summary names its linear layers ``mamba2``; the cost model keys them
        # as the gated-delta slot
        counts = cost_counts(summ["layers_replayed"])
        run = Run(get_model(settings["model"]), counts, read_table(d / "requests.parquet"), d.name)
        out.append((run, settings, steps))
    return out


def stats(e: pd.Series) -> str:
    e = e.abs().replace([np.inf, -np.inf], np.nan).dropna()
    return f"{e.median():.1%} / {e.quantile(0.95):.1%}" if len(e) else "-"


def fit(
    roots,
    fit_prefix: str = "fit",
    versions: str = "",
    resume: bool = False,
    bandwidth_cap: bool = True,
    drop_resume: bool = False,
    form: str = "overlap",
):
    roots = [roots] if isinstance(roots, Path) else list(roots)
    runs = [r for root in roots for r in load_runs(root)]
    root = roots[0]
    # a run weighs by its depth: per-layer fixed times measured at full depth are what a model
    # runs (consecutive layers overlap their kernels' tails), a 4-layer replay's are longer
    fit_runs = [
        replace(r, weight=sum(r.counts.values()) / (2 * FEW_LAYERS))
        for r, _, _ in runs
        if r.name.startswith(fit_prefix)
    ]
    if not fit_runs:
        raise UsageError(f"{root}: no run folder starts with {fit_prefix!r}")
    settings = runs[0][1]
    base = _h200_calibrated()
    dtype = settings.get("dtype", "bf16")
    device = settings.get("device_name", "NVIDIA H200")
    gpu = catalogue_name(device)
    if not gpu:
        raise UsageError(f"{device!r} is not in the GPU catalogue (sim/gpus.py): a timing file names its GPU")
    if not versions and (root / "device.txt").is_file():  # the campaign's `torch.__version__ device-name`
        versions = "torch " + (root / "device.txt").read_text().split()[0]
    models = ", ".join(sorted({r.spec.name for r in fit_runs}))
    on = f"{len(fit_runs)} replays on {device}, {dtype}{', ' + versions if versions else ''}"
    if gpu == HOME_GPU:
        src = (
            f"benchmarks/timing_fit.py across {models} ({on}; "
            f"benchmarks/timing_campaign.sh and the qwen3.5-9b full-depth fit traces); {STEPS_SOURCE}"
        )
    else:
        # what the runs cannot show (steps, decode) comes from the H200 file carried to this GPU by the
        # datasheets, as `marconi run --gpu` prices an uncalibrated GPU (sim.cost.scale_timing)
        base = scale_timing(base, get_gpu(HOME_GPU), get_gpu(gpu))
        deep = any(sum(r.counts.values()) > 2 * FEW_LAYERS for r in fit_runs)
        src = (
            f"benchmarks/timing_fit.py across {models} ({on}; benchmarks/timing_campaign.sh"
            f"{' and qwen3.5-9b full-depth fit runs' if deep else ''}); {STEPS_SOURCE}, carried to {gpu} by the "
            "datasheets (decode at the memory-bandwidth ratio)"
        )
    if resume and drop_resume:
        src += (
            "; the resumed-call extra these runs measured (the conv's state read, fixed in e855240) taken out of "
            "their resumed calls and not priced (--drop-resume)"
        )
    if form != "additive":
        src += f"; layer form {form!r} (sim.replay.calibration.fit_overlap)"
    info_versions = versions
    timing, info = fit_across(
        fit_runs, base, peak_tflops=device_peak(device, dtype), device=gpu, dtype=dtype, source=src, resume=resume,
        bandwidth_tbs=get_gpu(gpu).hbm_bytes_per_s * 1e-12 if bandwidth_cap else 0.0, drop_resume=drop_resume,
        form=form,
    )  # fmt: skip
    info["versions"] = info_versions
    return runs, base, timing, info


def report(runs, base, timing, fit_prefix: str = "fit") -> pd.DataFrame:
    rows = []
    for run, _, steps in runs:
        row = dict(run=run.name, held_out="" if run.name.startswith(fit_prefix) else "yes")
        for label, t in (("before", base.with_gpus(1)), ("after", timing)):
            e = request_errors(run, t)
            if not len(e):
                continue
            row[f"{label} device-bound"] = stats(e.loc[~e["host_bound"], "error"])
            row[f"{label} all"] = stats(e["error"])
            row[f"{label} host-bound"] = stats(e.loc[e["host_bound"], "error"])
            err, lo, hi = saved_error(e)
            # with its 95 % bootstrap interval over the hits: what the measurement can pin
            row[f"{label} saved"] = f"{err:+.1%} [{lo:+.0%}, {hi:+.0%}]" if np.isfinite(err) else "-"
            if steps is not None and len(steps):
                st = with_model(steps, run.spec, t, run.counts)
                row[f"{label} steps"] = stats(st.loc[~st["host_bound"].astype(bool), "error"])
        row["requests"] = int(len(run.table))
        row["host-bound"] = int(held_up(run.table).sum())
        rows.append(row)
    return pd.DataFrame(rows)


#: call lengths (new tokens) of ``length_report``'s bins: a fit whose form follows one regime only
#: prices the other's calls off (the additive form's 512-4K-token calls at 1.07-1.14x, session 26)
LENGTH_BINS = ((0, 512, "<512"), (512, 4096, "512-4k"), (4096, 1 << 62, "4k+"))


def length_report(runs, timing, fit_prefix: str = "fit") -> pd.DataFrame:
    """Per layer kind and call length (``LENGTH_BINS``), the median modelled / measured per-layer
    time of the one-call prefills (``calibration.calls_of``: host-bound calls out), of the fit runs
    and of the held-out ones apart, with their counts: where a form misprices a length regime."""
    got: dict = {}
    for run, _, _ in runs:
        part = "fit" if run.name.startswith(fit_prefix) else "held-out"
        rspec = replayed_spec(run.spec, run.counts)
        for kind in ("attention", "gated_delta", "mlp"):
            _, y, where = calls_of(run, kind)
            for v, (p, L) in zip(y, where):
                label = next(b for lo, hi, b in LENGTH_BINS if lo <= L - p < hi)
                ratio = timing.prefill_layer_ms(rspec, p, L)[kind] / v
                got.setdefault((kind, label, part), []).append(ratio)
    rows = []
    for kind in ("attention", "gated_delta", "mlp"):
        for _, _, label in LENGTH_BINS:
            row = dict(kind=kind, length=label)
            for part in ("fit", "held-out"):
                r = got.get((kind, label, part), [])
                row[f"{part} calls"] = len(r)
                row[f"{part} modelled/measured"] = round(float(np.median(r)), 3) if r else float("nan")
            rows.append(row)
    return pd.DataFrame(rows)


def host_report(runs, timing) -> pd.DataFrame:
    """Per run, what its timed prefills' host did: the layer calls of a call, the host issue time
    (median of the calls whose host did not wait for the GPU: ``HOST_WAITED_MS``) against the
    host term's, and the host-bound calls: how many, how many of them waited (their host time
    holds the GPU sleep: a synchronisation inside the call), and the medians of their measured
    time over the modelled device time and over the modelled host issue time."""
    rows = []
    for run, _, _ in runs:
        t = run.table[run.table["suffix_ms"].notna() & (run.table["suffix_ms"] > 0)]
        n, steady = host_calls(run)
        rspec = replayed_spec(run.spec, run.counts)
        e = request_errors(run, timing)
        hb = t[held_up(t)]
        host = timing.host_issue_ms(rspec)
        rows.append(
            {
                "run": run.name,
                "layer calls": n,
                "host issue p50 ms": round(float(np.median(steady)), 2) if len(steady) else float("nan"),
                "modelled host ms": round(host, 2),
                "host-bound": int(len(hb)),
                "of which waited": int((hb["suffix_host_ms"] >= HOST_WAITED_MS).sum()),
                "measured/device p50": round(
                    float((e.loc[e["host_bound"], "measured_ms"] / e.loc[e["host_bound"], "modelled_ms"]).median()), 2
                )
                if len(hb)
                else float("nan"),
                "measured/host p50": round(float((hb["suffix_ms"] / host).median()), 2)
                if len(hb) and host > 0
                else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", type=Path, nargs="+", metavar="DIR")
    ap.add_argument("--fit-prefix", default="fit")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--before", type=Path, help="score this timing file as 'before' (default: the committed one)")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="fit the resumed-call term too (HardwareTiming.gdn_resume_ms_per_chunk, calibration.fit_resume)",
    )
    ap.add_argument(
        "--drop-resume",
        action="store_true",
        help="with --resume: take the fitted resumed-call term out of the runs' resumed calls, then price none "
        "(runs measured before the conv fix, e855240, whose resumed calls carried an extra the kernels no longer have)",
    )
    ap.add_argument(
        "--no-bandwidth-cap",
        action="store_true",
        help="let the weights-read term fit faster than the GPU's datasheet memory bandwidth (the old fit)",
    )
    ap.add_argument(
        "--form",
        choices=LAYER_FORMS,
        default="overlap",
        help="how a layer's terms combine (sim.cost.HardwareTiming.layer_form): overlap (default), the larger of "
        "the weights read and the per-token terms, then the core; additive, every term summed (the files "
        "fitted before 2026-12-07)",
    )
    ap.add_argument("--versions", default="", help='e.g. "torch 2.11.0+cu130, triton 3.6.0" (default: DIR/device.txt)')
    a = ap.parse_args(argv)
    try:
        for d in a.dirs:
            if not d.is_dir():
                raise UsageError(f"{d}: not a folder")
        if a.out is not None and a.out.exists() and not a.force:
            raise UsageError(f"{a.out} exists (pass --force to replace it)")
        if a.drop_resume and not a.resume:
            raise UsageError("--drop-resume takes the term --resume fits out of the runs: give both")
        runs, base, timing, info = fit(
            a.dirs, a.fit_prefix, a.versions, a.resume, not a.no_bandwidth_cap, a.drop_resume, a.form
        )
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pd.set_option("display.width", 200)
    before = read_timing_file(a.before) if a.before is not None else base
    print(report(runs, before, timing, a.fit_prefix).to_string(index=False))
    print("fraction of peak:", {k: round(v, 3) if v else v for k, v in info["fraction_of_peak"].items()})
    print(
        "per-weight-GB ms:",
        {k: round(v, 3) for k, v in timing.ms_per_weight_gb.items()},
        "per-activation-GB ms:",
        {k: round(v, 3) for k, v in timing.ms_per_act_gb.items()},
    )
    print(
        f"host issue: {timing.host_ms_per_call:.3f} ms per call + {timing.host_ms_per_layer:.4f} ms per layer call",
        {k: round(v["median_ms"], 2) for k, v in info["host"]["depths"].items()},
    )
    print(host_report(runs, timing).to_string(index=False))
    print(f"modelled / measured per layer by call length ({timing.layer_form} form):")
    print(length_report(runs, timing, a.fit_prefix).to_string(index=False))
    if a.resume:
        r = info.get("resume", {})
        held_us = r.get("median", timing.gdn_resume_ms_per_chunk) * 1e3
        print(
            f"resumed gated-delta calls: {held_us:.2f} us a chunk and layer"
            f"{' (taken out of the runs, not priced: --drop-resume)' if r.get('dropped') else ''} "
            f"(median of {r.get('pairs', 0)} suffix / reference pairs, quartiles "
            f"{r.get('q25', float('nan')) * 1e3:.2f}-{r.get('q75', float('nan')) * 1e3:.2f})"
        )
    if a.out is not None:
        d = timing_to_dict(timing)
        a.out.write_text(json.dumps(dict(d, versions=info["versions"], fit=info), indent=2, default=float) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
