#!/usr/bin/env python3
"""Re-price kept replay runs with a timing file and say which requests make the error's P95, and why.

    python benchmarks/reprice_requests.py RUN_DIR [RUN_DIR ...] [--timing FILE] [--first N] [--csv OUT]

Each RUN_DIR is a ``marconi replay --out`` folder (``summary.json``, ``requests.parquet``; a
``.xz`` beside is read too). Every timed prefill is priced as the replay summary prices it
(``sim.replay.calibration.request_errors``: the modelled device time on the replayed layers, a
host-bound prefill against the later of that and the host term, ``measure.call_model_ms``), with
``--timing`` (default: the committed ``sim/data/h200-timing.json``). Per request it prints the
suffix and context tokens, measured ms, modelled device and host ms, the measured host issue, the
host-bound flag, the error and its cause (first that applies):

- ``ran from scratch``: restored, yet the timed call started at 0 (a replay bug fixed in 8b28f6f:
  a parked request was dropped and run again from scratch; priced from its hit, it reads as the
  model's error). Its ``corrected`` error prices what ran.
- ``host waited``: the host's issue time reached ``measure.HOST_WAITED_MS`` (a synchronisation
  inside the call waited for the GPU sleep queued ahead of it, then issued the rest to an idle
  GPU): the device time holds host gaps no engine pays. Replay now runs such a call again
  (``measure.outran_sleep``).
- ``host outran``: not waited, but the host's issue took longer than the sleep a steady window
  gives (the run's median host issue x ``QUEUE_MARGIN`` + ``QUEUE_PAD_MS``: the kept tables do
  not record the sleep asked), or the call is flagged host-bound (the GPU ended just after the
  host's last launch): replay now runs these again too.
- ``resumed``: a device-bound call from a restored state (the gated-delta layers' per-chunk extra
  of such calls, ``HardwareTiming.gdn_resume_ms_per_chunk``).
- ``short``: a device-bound call from scratch of under 1,024 tokens.
- ``device``: the rest.

Then per run and cause: requests, median and max |error|, and the run's median / P95 over every
prefill, as priced and with the ``ran from scratch`` rows priced from where they ran (``corrected``),
and over the requests without each measurement cause (what a rerun that re-times them must show).
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

from sim.cost import HardwareTiming, get_model, read_timing_file  # noqa: E402
from sim.errors import UsageError  # noqa: E402
from sim.replay.calibration import Run, request_errors  # noqa: E402
from sim.replay.clock import QUEUE_MARGIN, QUEUE_PAD_MS  # noqa: E402
from sim.replay.measure import HOST_WAITED_MS, call_model_ms, replayed_spec  # noqa: E402

DEFAULT_TIMING = ROOT / "sim" / "data" / "h200-timing.json"
SHORT_TOKENS = 1024
CAUSES = ("ran from scratch", "host waited", "host outran", "resumed", "short", "device")
#: causes of the measurement (a rerun re-times or runs them right), not of the model
MEASUREMENT = ("ran from scratch", "host waited", "host outran")


def read_table(path: Path) -> pd.DataFrame:
    if path.is_file():
        return pd.read_parquet(path)
    with lzma.open(path.with_name(path.name + ".xz")) as f:
        return pd.read_parquet(f)


def load(run_dir: Path) -> Run:
    s = json.loads((run_dir / "summary.json").read_text())
    spec = get_model(s["settings"]["model"])
    return Run(spec, dict(s["summary"]["layers_replayed"]), read_table(run_dir / "requests.parquet"), run_dir.name)


def one_gpu(timing):
    """The timing as replay compares it: at one GPU (``calibration.replay_timing``)."""
    if isinstance(timing, HardwareTiming) and timing.gpus != 1:
        return replace(timing, gpus=1, comm_ms_per_call=0.0, comm_ms_per_token=0.0)
    return timing


def cause_of(row, sleep: float) -> str:
    """``row``'s cause (module docstring); ``sleep``: the sleep a steady window asks (ms)."""
    if row.restored_start != row.hit:
        return "ran from scratch"
    if row.host_ms >= HOST_WAITED_MS:
        return "host waited"
    if row.host_bound or row.host_ms > sleep:
        return "host outran"
    if row.hit > 0:
        return "resumed"
    if row.tokens < SHORT_TOKENS:
        return "short"
    return "device"


def reprice(run: Run, timing, first: int = 0) -> pd.DataFrame:
    """The run's timed prefills priced by ``request_errors`` with ``timing``, and per request
    where its timed call started, its measured host issue, its cause and its ``corrected`` error
    (priced from where it ran)."""
    e = request_errors(run, timing)
    t = run.table
    timed = t[t["suffix_ms"].notna() & (t["suffix_ms"] > 0)].reset_index(drop=True)
    if first:
        keep = timed["request"] < timed["request"].min() + first
        e, timed = e[keep.to_numpy()].reset_index(drop=True), timed[keep].reset_index(drop=True)
    rspec = replayed_spec(run.spec, run.counts)
    e["request"] = timed["request"].to_numpy()
    e["suffix"] = e["tokens"] - e["hit"]
    e["host_ms"] = timed["suffix_host_ms"].to_numpy(float) if "suffix_host_ms" in timed else np.nan
    e["modelled_host_ms"] = (
        timing.host_issue_ms(rspec) if isinstance(timing, HardwareTiming) and timing.has_host_term else np.nan
    )
    # the GPU sleep asked ahead of each call (tables from session 27 on; before: none, NaN)
    e["sleep_ms"] = timed["suffix_sleep_ms"].to_numpy(float) if "suffix_sleep_ms" in timed else np.nan
    e["restored_start"] = [int(s[0][0]) if len(s) else 0 for s in timed["segments"]]
    host = e["host_ms"].to_numpy(float)
    steady = host[np.isfinite(host) & (host < HOST_WAITED_MS)]
    sleep = float(np.median(steady)) * QUEUE_MARGIN + QUEUE_PAD_MS if len(steady) else np.inf
    e["cause"] = [cause_of(r, sleep) for r in e.itertuples(index=False)]
    corrected = []
    for r in e.itertuples(index=False):
        if r.cause != "ran from scratch":
            corrected.append(r.error)
            continue
        # what ran: one call from its real start (the second segment of these rows is the prompt run again)
        dev = timing.prefill_time_s(rspec, r.restored_start, r.tokens) * 1e3
        priced = call_model_ms(timing, rspec, dev, 0, r.host_bound, r.sleep_ms)
        corrected.append((priced - r.measured_ms) / r.measured_ms)
    e["corrected"] = corrected
    return e


def stats(x: pd.Series) -> str:
    x = x.abs().replace([np.inf, -np.inf], np.nan).dropna()
    return f"{100 * x.median():.1f} / {100 * x.quantile(0.95):.1f} %" if len(x) else "-"


def causes_table(e: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for c in CAUSES:
        sub = e[e["cause"] == c]
        if not len(sub):
            continue
        a = sub["error"].abs()
        rows.append(
            {
                "cause": c,
                "requests": len(sub),
                "median |error|": f"{100 * a.median():.1f} %",
                "max |error|": f"{100 * a.max():.1f} %",
                "median |corrected|": f"{100 * sub['corrected'].abs().median():.1f} %",
                # a measurement cause's requests re-measured as their peers: the run without them
                "run without them (corrected)": stats(e.loc[e["cause"] != c, "corrected"]) if c in MEASUREMENT else "",
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR")
    ap.add_argument("--timing", type=Path, default=DEFAULT_TIMING, help="timing file (default: the committed H200 one)")
    ap.add_argument("--first", type=int, default=0, help="the first N requests only (0: all)")
    ap.add_argument("--csv", type=Path, help="write every run's per-request rows here")
    ap.add_argument("--quiet", action="store_true", help="the per-cause tables only")
    a = ap.parse_args(argv)
    try:
        timing = one_gpu(read_timing_file(a.timing))
        runs = [load(d) for d in a.runs]
    except (UsageError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 1000)
    cols = ["request", "suffix", "tokens", "measured_ms", "modelled_ms", "modelled_host_ms", "host_ms"]
    cols += ["host_bound", "error", "corrected", "cause"]
    out = []
    for run in runs:
        e = reprice(run, timing, a.first)
        out.append(e.assign(run=run.name))
        no_meas = e[~e["cause"].isin(MEASUREMENT)]
        print(
            f"\n{run.name} ({run.spec.name}, {len(e)} timed prefills, timing {a.timing.name}): error median / P95 "
            f"{stats(e['error'])} as priced, {stats(e['corrected'])} corrected, "
            f"{stats(no_meas['corrected'])} without the measurement causes ({len(e) - len(no_meas)} requests)"
        )
        if not a.quiet:
            print(e.sort_values("error", key=abs, ascending=False)[cols].round(3).to_string(index=False))
        print(causes_table(e).to_string(index=False))
    if a.csv is not None:
        pd.concat(out).to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
