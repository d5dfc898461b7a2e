"""Why a timed replay call waited for the GPU: what happened inside each call the stopwatch timed.

A queued call (``--measure device``) is issued behind a GPU sleep, so its host should finish
issuing long before the sleep ends. Some calls' host time nevertheless reaches the sleep
(``sim.replay.measure.HOST_WAITED_MS``), or the GPU ends the call just as the host ends its issue
(host-bound): something inside the call waited for the device, or the sleep did not cover the
issue. This script runs ``marconi replay`` with its arguments, in this process, and wraps every
timed call (``sim.replay.clock.Stopwatch.start`` / ``stop``) with probes of what can make a host
wait:

* synchronising CUDA operations, caught by ``torch.cuda.set_sync_debug_mode("warn")`` during the
  call, each with the replay's own frames of the stack that issued it;
* device allocations of the caching allocator (``cudaMalloc``: ``num_device_alloc``) and its
  retries after freeing its cache (``num_alloc_retries``: a device-wide synchronisation);
* pinned host allocations (``cudaHostAlloc``, ``torch.cuda.host_memory_stats``'s
  ``num_host_alloc``), which are slow and serialise with the device;
* Python garbage collections (host time, not a wait, but a long pause in the host's issue);
* the states the call hands to the checkpoint store (``state_writes``: each a digest and a copy
  per layer, launches of their own).

Per call it writes one CSV row (``--out``): its index, the caller (file:line of the ``start``
call), the call's kind as the replay names it (``call_kind``: suffix, reference, tail, batch,
step) and its ``segments`` (a suffix split at a checkpoint runs every layer once per segment),
the request, its first position and tokens (read off the caller's flight), the sleep queued ahead
of it as asked (``sleep_ms``) and as it ran on the GPU (``sleep_gpu_ms``), host ms, device ms,
slack ms (``Stopwatch.slack_ms``), its class (``kind``: waited, host ms at or over
``HOST_WAITED_MS``; host-bound; neither; unqueued where nothing was queued: a CPU, ``--measure
wall``, the tail) and each probe's count; then prints, per caller and class, the counts' means,
per call kind and segment count the host and launch figures, and the synchronising sites most
often seen in waited calls.

Launches (``--count-launches TIMING_CSV``): a second run of the same arguments under
``torch.profiler``, each timed call inside a ``record_function`` range, counts the CUDA API calls
that fill the launch queue inside each call (``launches``: kernels, async copies and memsets,
event records; ``kernel_launches``: kernels alone). The profiler slows the host, so its own
times are not the figures: the counts are joined, call by call, to ``TIMING_CSV`` (an earlier
``--out`` of the same arguments, in another process: the replay is deterministic, and the join
checks that each row's caller, kind and segments agree) and ``--out`` gets the joined table.
Needs a CUDA GPU for its figures; on a CPU every count is 0, the slack NaN and the launches empty
(a smoke run)::

    python benchmarks/replay_stall_probe.py --out calls.csv -- --trace synthetic:agent \\
        --model qwen3.5-9b --requests 80 --policy sglang --mode sequential
    python benchmarks/replay_stall_probe.py --count-launches calls.csv --out joined.csv -- \\
        --trace synthetic:agent --model qwen3.5-9b --requests 80 --policy sglang --mode sequential
    python benchmarks/replay_stall_probe.py --out calls.csv -- --device cpu --model replay-tiny \\
        --trace synthetic:chat --requests 6 --mode sequential
"""

from __future__ import annotations

import argparse
import bisect
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
COUNTERS = ("syncs", "device_allocs", "alloc_retries", "host_allocs", "gc_runs", "state_writes")
#: the CSV's columns
COLUMNS = (
    "index",
    "caller",
    "call_kind",
    "segments",
    "request",
    "start",
    "tokens",
    "kind",
    "sleep_ms",
    "sleep_gpu_ms",
    "host_ms",
    "device_ms",
    "slack_ms",
    *COUNTERS,
    "launches",
    "kernel_launches",
    "sites",
)
#: what a row of the timing CSV and of the launch-counting run must agree on to be joined
JOIN_KEYS = ("caller", "call_kind", "segments", "request", "start", "tokens")
#: how many of the replay's own frames name a synchronising site
SITE_FRAMES = 3
#: sites printed per caller
TOP_SITES = 5
#: the record_function range around each timed call of the launch-counting run
RANGE = "stall_probe_call:"


def _own_frames(stack) -> str:
    """The innermost replay frames (this repository's, not torch's or this script's) of a stack."""
    here = os.path.abspath(__file__)
    own = [
        f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}"
        for f in stack
        if f.filename.startswith(str(ROOT)) and os.path.abspath(f.filename) != here
    ]
    return " < ".join(reversed(own[-SITE_FRAMES:])) or "(outside the replay)"


def where(kind: str, local: dict) -> dict:
    """The request, first position and tokens of a timed call, read off its caller's locals (the
    flight ``f``; ``end1`` the suffix prefill's end, ``upto`` the tail's; a reference runs the
    whole prompt from 0); empty values where the caller holds no flight (batched calls, steps)."""
    f = local.get("f")
    if f is None or not hasattr(f, "rid"):
        return {"request": "", "start": "", "tokens": ""}
    if kind == "reference":
        return {"request": f.rid, "start": 0, "tokens": f.n_in}
    end = local.get("end1" if kind == "suffix" else "upto")
    tokens = int(end) - int(f.pos) if end is not None else ""
    return {"request": f.rid, "start": int(f.pos), "tokens": tokens}


def launch_kind(name: str) -> str | None:
    """What a CUDA API call of a profile puts on the launch queue: ``kernel`` (runtime or driver
    launch: Triton launches through the driver), ``copy`` (an async memcpy or memset), ``event``
    (an event record: the timer's own); None for anything else."""
    if "LaunchKernel" in name or name.startswith("cuLaunch"):
        return "kernel"
    if name.startswith(("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset")) and "Async" in name:
        return "copy"
    if name.startswith(("cudaEventRecord", "cuEventRecord")):
        return "event"
    return None


def count_in_ranges(ranges: list[tuple[float, float]], stamps: list[float]) -> list[int]:
    """How many of ``stamps`` fall in each ``[start, end]`` of ``ranges`` (any order, may
    overlap)."""
    s = sorted(stamps)
    return [bisect.bisect_right(s, b) - bisect.bisect_left(s, a) for a, b in ranges]


def launches_per_call(events, calls: int) -> tuple[list[int], list[int]]:
    """``(launches, kernel launches)`` of each of ``calls`` timed calls from a profile's events
    (objects with ``name`` and ``time_range.start`` / ``.end``: ``torch.profiler``'s
    ``FunctionEvent``): the queue-filling API calls (``launch_kind``) that start inside the call's
    ``RANGE`` range; -1 for a call whose range is missing."""
    ranges: dict[int, tuple[float, float]] = {}
    every, kernels = [], []
    for e in events:
        name = e.name
        if name.startswith(RANGE):
            ranges[int(name[len(RANGE) :])] = (e.time_range.start, e.time_range.end)
            continue
        k = launch_kind(name)
        if k is not None:
            every.append(e.time_range.start)
            if k == "kernel":
                kernels.append(e.time_range.start)
    spans = [ranges.get(i, (0.0, -1.0)) for i in range(calls)]
    missing = {i for i in range(calls) if i not in ranges}
    a = [(-1 if i in missing else n) for i, n in enumerate(count_in_ranges(spans, every))]
    b = [(-1 if i in missing else n) for i, n in enumerate(count_in_ranges(spans, kernels))]
    return a, b


class Probe:
    """Counters sampled at a timed call's start and stop; sync warnings collected in between;
    with ``ranges`` each call inside a profiler range (the launch-counting run)."""

    def __init__(self, torch, sync: bool, ranges: bool = False) -> None:
        self.torch = torch
        self.cuda = torch.cuda.is_available()
        self.sync = sync and self.cuda
        self.ranges = ranges
        self.rows: list[dict] = []
        self.sites: list[list[str]] = []
        self._open: list[tuple] = []
        self._gc = 0
        self.writes = 0  # states handed to the checkpoint store (CheckpointStore.write)
        self._calls = 0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase, info) -> None:
        if phase == "start":
            self._gc += 1

    def _counts(self) -> dict:
        out = {"device_allocs": 0, "alloc_retries": 0, "host_allocs": 0, "gc_runs": self._gc}
        out["state_writes"] = self.writes
        if self.cuda:
            dev = self.torch.cuda.memory_stats()
            out["device_allocs"] = int(dev.get("num_device_alloc", 0))
            out["alloc_retries"] = int(dev.get("num_alloc_retries", 0))
            host_stats = getattr(self.torch.cuda, "host_memory_stats", None)
            if host_stats is not None:
                out["host_allocs"] = int(host_stats().get("num_host_alloc", 0))
        return out

    def started(self, caller: str, at: dict) -> None:
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
        rng = None
        if self.ranges:
            rng = self.torch.profiler.record_function(f"{RANGE}{self._calls}")
            rng.__enter__()
        self._calls += 1
        self._open.append((caller, at, self._counts(), sites, old, rng))

    def stopped(self, handle) -> None:
        if not self._open:
            return
        caller, at, before, sites, old, rng = self._open.pop()
        if rng is not None:
            rng.__exit__(None, None, None)
        if self.sync and not self._open:
            self.torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning, warnings.filters[:] = old[0], old[1]
        after = self._counts()
        row = {"caller": caller, "handle": handle, **at, "syncs": len(sites)}
        row.update({k: after[k] - before[k] for k in before})
        self.rows.append(row)
        self.sites.append(sites)


def install(probe: Probe) -> None:
    """Wrap ``Stopwatch.start`` / ``stop`` with the probe (the replay's only timed regions) and
    ``CheckpointStore.write`` with its count."""
    from sim.replay.clock import Stopwatch
    from sim.replay.store import CheckpointStore

    start, stop, write = Stopwatch.start, Stopwatch.stop, CheckpointStore.write

    def probed_start(self, queue: bool = True, kind: str = "call", segments: int = 1):
        f = sys._getframe(1)
        caller = f"{os.path.relpath(f.f_code.co_filename, ROOT)}:{f.f_lineno}"
        handle = start(self, queue, kind, segments)  # the sleep is queued first: the probe's own work is not timed
        probe.started(caller, where(kind, f.f_locals))
        return handle

    def probed_stop(self, started):
        handle = stop(self, started)
        probe.stopped(handle)
        return handle

    def counted_write(self, *args, **kw):
        probe.writes += 1
        return write(self, *args, **kw)

    Stopwatch.start, Stopwatch.stop, CheckpointStore.write = probed_start, probed_stop, counted_write


def _device_ms(h) -> float:
    if h is None:
        return float("nan")
    if h.last is None:  # the CPU: the elapsed ms itself
        return float(h.first)
    h.last.synchronize()
    return float(h.first.elapsed_time(h.last))


def finish(probe: Probe) -> list[dict]:
    """Every probed call's times (resolving the events: after the run) and its class."""
    from sim.replay.clock import Stopwatch
    from sim.replay.measure import HOST_WAITED_MS, host_bound

    out = []
    for i, row in enumerate(probe.rows):
        h = row.pop("handle")
        host, slack = Stopwatch.host_ms(h), Stopwatch.slack_ms(h)
        if slack != slack:  # not queued (the CPU, --measure wall, the tail): nothing to wait for
            kind = "unqueued"
        else:
            kind = "waited" if host >= HOST_WAITED_MS else "host-bound" if host_bound(slack) else "neither"
        out.append(
            {
                **row,
                "index": i,
                "call_kind": h.kind,
                "segments": h.segments,
                "kind": kind,
                "sleep_ms": h.sleep_ms,
                "sleep_gpu_ms": Stopwatch.sleep_gpu_ms(h),
                "host_ms": host,
                "device_ms": _device_ms(h),
                "slack_ms": slack,
                "launches": "",
                "kernel_launches": "",
            }
        )
    return out


def join(timing: list[dict], counted: list[dict]) -> list[dict] | None:
    """The timing CSV's rows with the launch-counting run's counts, call by call; None when the
    two runs' calls differ (count, or a row's ``JOIN_KEYS``)."""
    if len(timing) != len(counted):
        return None
    out = []
    for t, c in zip(timing, counted):
        if any(str(t.get(k, "")) != str(c.get(k, "")) for k in JOIN_KEYS):
            return None
        out.append({**t, "launches": c["launches"], "kernel_launches": c["kernel_launches"]})
    return out


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _p50(values) -> float:
    v = [x for x in map(_num, values) if x == x]
    return statistics.median(v) if v else float("nan")


def report(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["caller"], r["kind"])].append(r)
    head = f"{'caller':<34} {'kind':<10} {'calls':>6} {'host ms p50':>11} {'sleep ms p50':>12} {'ran p50':>8} "
    lines = [head + " ".join(f"{c:>13}" for c in COUNTERS)]
    for (caller, kind), rs in sorted(groups.items()):
        means = [sum(_num(r[c]) for r in rs) / len(rs) for c in COUNTERS]
        lines.append(
            f"{caller:<34} {kind:<10} {len(rs):>6} {_p50(r['host_ms'] for r in rs):>11.2f} "
            f"{_p50(r['sleep_ms'] for r in rs):>12.2f} {_p50(r['sleep_gpu_ms'] for r in rs):>8.2f} "
            + " ".join(f"{m:>13.2f}" for m in means)
        )
    # per call kind and segment count: does issue time follow segments, launches, the sleep?
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["call_kind"], int(_num(r["segments"])))].append(r)
    lines.append(
        f"\n{'call kind':<16} {'segments':>8} {'calls':>6} {'host-bound':>10} {'waited':>6} {'host ms p50':>11} "
        f"{'launches p50':>12} {'writes p50':>10} {'sleep ms p50':>12} {'ran p50':>8}"
    )
    for (ck, segs), rs in sorted(by.items()):
        lines.append(
            f"{ck:<16} {segs:>8} {len(rs):>6} {sum(r['kind'] == 'host-bound' for r in rs):>10} "
            f"{sum(r['kind'] == 'waited' for r in rs):>6} {_p50(r['host_ms'] for r in rs):>11.2f} "
            f"{_p50(r['launches'] for r in rs):>12.1f} {_p50(r['state_writes'] for r in rs):>10.1f} "
            f"{_p50(r['sleep_ms'] for r in rs):>12.2f} {_p50(r['sleep_gpu_ms'] for r in rs):>8.2f}"
        )
    for caller in sorted({c for c, _ in groups}):
        waited = Counter(s for r in groups.get((caller, "waited"), []) for s in r["_sites"])
        other = Counter(s for k in ("host-bound", "neither") for r in groups.get((caller, k), []) for s in r["_sites"])
        if waited or other:
            lines.append(f"\nsynchronising sites in {caller}'s calls (waited / other calls):")
            for site, _ in (waited + other).most_common(TOP_SITES):
                lines.append(f"  {waited[site]:>5} / {other[site]:<5} {site}")
    lines.append(f"\n{len(rows)} timed calls probed")
    return "\n".join(lines)


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["_sites"] = [s for s in (r.get("sites") or "").split(" | ") if s]
    return rows


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "sites": " | ".join(r["_sites"])})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--out CSV] [--count-launches TIMING_CSV] [--no-sync-debug] -- MARCONI_REPLAY_ARGS...",
    )
    ap.add_argument("--out", type=Path, help="per-call CSV (not overwritten: an existing file is refused)")
    ap.add_argument(
        "--count-launches",
        type=Path,
        metavar="TIMING_CSV",
        help="run under torch.profiler, count each call's launches and join them to TIMING_CSV (an "
        "earlier --out of the same arguments)",
    )
    ap.add_argument("--no-sync-debug", action="store_true", help="leave torch's sync debug mode off")
    ap.add_argument("replay_args", nargs=argparse.REMAINDER, help="arguments of `marconi replay`, after --")
    args = ap.parse_args(argv)
    rest = args.replay_args[1:] if args.replay_args[:1] == ["--"] else args.replay_args
    if args.out is not None and args.out.exists():
        print(f"Error: {args.out} exists; name a new file", file=sys.stderr)
        return 2
    if args.count_launches is not None and not args.count_launches.is_file():
        print(f"Error: {args.count_launches} is not a file (the timing run's --out)", file=sys.stderr)
        return 2
    import torch

    from sim.cli import main as marconi

    counting = args.count_launches is not None
    probe = Probe(torch, sync=not args.no_sync_debug and not counting, ranges=counting)
    install(probe)
    prof = None
    if counting:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=acts)
        prof.__enter__()
    try:
        marconi.main(args=["replay", *rest], prog_name="marconi", standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            return int(exc.code)
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
    rows = finish(probe)
    for r, s in zip(rows, probe.sites):
        r["_sites"] = s
    note = ""
    if prof is not None:
        if torch.cuda.is_available():  # on a CPU nothing is launched: the counts stay empty
            every, kernels = launches_per_call(prof.events(), len(rows))
            for r, a, b in zip(rows, every, kernels):
                r["launches"], r["kernel_launches"] = a, b
        joined = join(_read(args.count_launches), rows)
        if joined is None:
            note = (
                f"\nthe calls differ from {args.count_launches}'s: the launches stand beside this run's own "
                "(profiled: slower) times"
            )
        else:
            rows = joined
    if args.out is not None:
        _write(args.out, rows)
    print(report(rows) + note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
