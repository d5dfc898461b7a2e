"""Why a timed replay call waited for the GPU: what happened inside each call the stopwatch timed.

A queued call (``--measure device``) is issued behind a GPU sleep, so its host should finish
issuing long before the sleep ends. Some calls' host time nevertheless reaches the sleep
(``sim.replay.measure.HOST_WAITED_MS``): something inside the call waited for the device. This
script runs ``marconi replay`` with its arguments, in this process, and wraps every timed call
(``sim.replay.clock.Stopwatch.start`` / ``stop``) with probes of what can make a host wait:

* synchronising CUDA operations, caught by ``torch.cuda.set_sync_debug_mode("warn")`` during the
  call, each with the replay's own frames of the stack that issued it;
* device allocations of the caching allocator (``cudaMalloc``: ``num_device_alloc``) and its
  retries after freeing its cache (``num_alloc_retries``: a device-wide synchronisation);
* pinned host allocations (``cudaHostAlloc``, ``torch.cuda.host_memory_stats``'s
  ``num_host_alloc``), which are slow and serialise with the device;
* Python garbage collections (host time, not a wait, but a long pause in the host's issue).

Per call it writes one CSV row (``--out``): the caller (file:line of the ``start`` call), host
ms, slack ms (``Stopwatch.slack_ms``), its kind (waited: host ms at or over ``HOST_WAITED_MS``;
host-bound; neither; unqueued where nothing was queued: a CPU, ``--measure wall``) and each
probe's count; then prints, per caller and kind, the counts' means and the synchronising sites
most often seen in waited calls. Needs a CUDA GPU for its figures; on a CPU every count is 0 and
the slack NaN (a smoke run)::

    python benchmarks/replay_stall_probe.py --out calls.csv -- --trace synthetic:agent \\
        --model qwen3.5-9b --requests 80 --policy sglang --mode sequential
    python benchmarks/replay_stall_probe.py --out calls.csv -- --device cpu --model replay-tiny \\
        --trace synthetic:chat --requests 6 --mode sequential
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import statistics
import sys
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: probe counters, in the CSV's column order
COUNTERS = ("syncs", "device_allocs", "alloc_retries", "host_allocs", "gc_runs")
#: how many of the replay's own frames name a synchronising site
SITE_FRAMES = 3
#: sites printed per caller
TOP_SITES = 5


def _own_frames(stack) -> str:
    """The innermost replay frames (this repository's, not torch's or this script's) of a stack."""
    here = os.path.abspath(__file__)
    own = [
        f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}"
        for f in stack
        if f.filename.startswith(str(ROOT)) and os.path.abspath(f.filename) != here
    ]
    return " < ".join(reversed(own[-SITE_FRAMES:])) or "(outside the replay)"


class Probe:
    """Counters sampled at a timed call's start and stop; sync warnings collected in between."""

    def __init__(self, torch, sync: bool) -> None:
        self.torch = torch
        self.cuda = torch.cuda.is_available()
        self.sync = sync and self.cuda
        self.rows: list[dict] = []
        self.sites: list[list[str]] = []
        self._open: list[tuple] = []
        self._gc = 0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase, info) -> None:
        if phase == "start":
            self._gc += 1

    def _counts(self) -> dict:
        out = {"device_allocs": 0, "alloc_retries": 0, "host_allocs": 0, "gc_runs": self._gc}
        if self.cuda:
            dev = self.torch.cuda.memory_stats()
            out["device_allocs"] = int(dev.get("num_device_alloc", 0))
            out["alloc_retries"] = int(dev.get("num_alloc_retries", 0))
            host_stats = getattr(self.torch.cuda, "host_memory_stats", None)
            if host_stats is not None:
                out["host_allocs"] = int(host_stats().get("num_host_alloc", 0))
        return out

    def started(self, caller: str) -> None:
        sites: list[str] = []
        old = (warnings.showwarning, warnings.filters[:])

        def hook(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message):
                sites.append(_own_frames(traceback.extract_stack()[:-1]))
            else:
                old[0](message, category, filename, lineno, file, line)

        warnings.showwarning = hook
        warnings.simplefilter("always")
        if self.sync:
            self.torch.cuda.set_sync_debug_mode("warn")
        self._open.append((caller, self._counts(), sites, old))

    def stopped(self, handle) -> None:
        if not self._open:
            return
        caller, before, sites, old = self._open.pop()
        if self.sync and not self._open:
            self.torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning, warnings.filters[:] = old[0], old[1]
        after = self._counts()
        row = {"caller": caller, "handle": handle, "syncs": len(sites)}
        row.update({k: after[k] - before[k] for k in before})
        self.rows.append(row)
        self.sites.append(sites)


def install(probe: Probe) -> None:
    """Wrap ``Stopwatch.start`` / ``stop`` with the probe (the replay's only timed regions)."""
    from sim.replay.clock import Stopwatch

    start, stop = Stopwatch.start, Stopwatch.stop

    def probed_start(self, queue: bool = True):
        f = sys._getframe(1)
        caller = f"{os.path.relpath(f.f_code.co_filename, ROOT)}:{f.f_lineno}"
        handle = start(self, queue)  # the sleep is queued first: the probe's own work is not timed
        probe.started(caller)
        return handle

    def probed_stop(self, started):
        handle = stop(self, started)
        probe.stopped(handle)
        return handle

    Stopwatch.start, Stopwatch.stop = probed_start, probed_stop


def finish(probe: Probe) -> list[dict]:
    """Host and slack ms of every probed call (resolving the events: after the run) and its kind."""
    from sim.replay.clock import Stopwatch
    from sim.replay.measure import HOST_WAITED_MS, host_bound

    out = []
    for row in probe.rows:
        h = row.pop("handle")
        host, slack = Stopwatch.host_ms(h), Stopwatch.slack_ms(h)
        if slack != slack:  # not queued (the CPU, --measure wall): nothing to wait for
            kind = "unqueued"
        else:
            kind = "waited" if host >= HOST_WAITED_MS else "host-bound" if host_bound(slack) else "neither"
        out.append({"caller": row["caller"], "kind": kind, "host_ms": host, "slack_ms": slack, **row})
    return out


def report(rows: list[dict], sites: list[list[str]]) -> str:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[(r["caller"], r["kind"])].append(i)
    lines = [f"{'caller':<34} {'kind':<10} {'calls':>6} {'host ms p50':>11} " + " ".join(f"{c:>13}" for c in COUNTERS)]
    for (caller, kind), idx in sorted(groups.items()):
        host = statistics.median(rows[i]["host_ms"] for i in idx)
        means = [sum(rows[i][c] for i in idx) / len(idx) for c in COUNTERS]
        lines.append(f"{caller:<34} {kind:<10} {len(idx):>6} {host:>11.2f} " + " ".join(f"{m:>13.2f}" for m in means))
    for caller in sorted({c for c, _ in groups}):
        waited = Counter(s for i in groups.get((caller, "waited"), []) for s in sites[i])
        other = Counter(s for k in ("host-bound", "neither") for i in groups.get((caller, k), []) for s in sites[i])
        if waited or other:
            lines.append(f"\nsynchronising sites in {caller}'s calls (waited / other calls):")
            for site, _ in (waited + other).most_common(TOP_SITES):
                lines.append(f"  {waited[site]:>5} / {other[site]:<5} {site}")
    lines.append(f"\n{len(rows)} timed calls probed")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--out CSV] [--no-sync-debug] -- MARCONI_REPLAY_ARGS...",
    )
    ap.add_argument("--out", type=Path, help="per-call CSV (not overwritten: an existing file is refused)")
    ap.add_argument("--no-sync-debug", action="store_true", help="leave torch's sync debug mode off")
    ap.add_argument("replay_args", nargs=argparse.REMAINDER, help="arguments of `marconi replay`, after --")
    args = ap.parse_args(argv)
    rest = args.replay_args[1:] if args.replay_args[:1] == ["--"] else args.replay_args
    if args.out is not None and args.out.exists():
        print(f"Error: {args.out} exists; name a new file", file=sys.stderr)
        return 2
    import torch

    from sim.cli import main as marconi

    probe = Probe(torch, sync=not args.no_sync_debug)
    install(probe)
    try:
        marconi.main(args=["replay", *rest], prog_name="marconi", standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            return int(exc.code)
    rows = finish(probe)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "x", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["caller", "kind", "host_ms", "slack_ms", *COUNTERS, "sites"])
            w.writeheader()
            for r, s in zip(rows, probe.sites):
                w.writerow({**r, "sites": " | ".join(s)})
    print(report(rows, probe.sites))
    return 0


if __name__ == "__main__":
    sys.exit(main())
