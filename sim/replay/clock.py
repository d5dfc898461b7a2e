"""How replay times a call on a GPU: device time (the call queued behind a sleep) or wall time.

Needs torch.
"""

from __future__ import annotations

import gc
import time
from typing import NamedTuple

import torch

from sim.replay.measure import outran_sleep, stalled_outside
from sim.replay.model import timestamp

#: how timed prefills are timed on a GPU (Stopwatch): device (queued) or wall (as issued)
MEASURE_MODES = ("device", "wall")
#: Python's cyclic garbage collector is off while a timed call is issued (Stopwatch._pause_gc)
PAUSE_GC = True
#: host issue time assumed for the first timed call, before any was measured (ms)
HOST_GUESS_MS = 30.0
#: a queued call waits behind a GPU sleep of this many times the longest recent host issue
#: time, plus QUEUE_PAD_MS, so that the host has issued the whole call before the GPU starts it
QUEUE_MARGIN = 1.25
QUEUE_PAD_MS = 1.0
#: recent host issue times the sleep is sized from
QUEUE_WINDOW = 8
#: the longest sleep (ms). A full-depth call issues more launches than the GPU's launch queue
#: holds, so the host blocks until the sleep ends and its issue time then counts the sleep: sized
#: from such times alone the sleep would grow without end. A queue filled behind the sleep keeps
#: the GPU busy while the host issues the rest (measured on an H200: 4.7 ms of a 1-token call's
#: host time came after a 100 ms sleep; its device time was 7.0 ms against 34 ms as issued).
QUEUE_CAP_MS = 50.0


def sleep_ms(recent: list) -> float:
    """How long a queued call waits behind its GPU sleep: the longest of the recent host issue
    times (``HOST_GUESS_MS`` before any) times ``QUEUE_MARGIN`` plus ``QUEUE_PAD_MS``, at most
    ``QUEUE_CAP_MS``."""
    longest = max(recent) if recent else HOST_GUESS_MS
    return min(QUEUE_CAP_MS, longest * QUEUE_MARGIN + QUEUE_PAD_MS)


class SleepWindows:
    """The recent host issue times a queued call's sleep is sized from, one window per call kind
    and segment count (``sleep_ms(kind, segments)``, ``record(kind, segments, host_ms)``).

    One window for every call let the slow calls of one kind size the sleep of all: the
    from-scratch references of validated hits (their early calls allocate device memory, 40-200
    ms of host time) kept the suffix prefills' sleep at its cap (H200, 2026-12-05). A call split
    at ``segments`` calls runs every layer once per segment, so its issue time grows with them:
    a kind + count with no times yet is sized from the kind's other counts scaled per segment
    (the longest time per segment times ``segments``), else from ``HOST_GUESS_MS``."""

    def __init__(self, window: int = QUEUE_WINDOW) -> None:
        if window < 1:
            raise ValueError("a sleep window holds at least one time")
        self.window = int(window)
        self._by: dict[tuple[str, int], list[float]] = {}

    def recent(self, kind: str, segments: int = 1) -> list[float]:
        """The window of ``kind`` calls of ``segments`` segments (a copy; oldest first)."""
        return list(self._by.get((kind, max(1, int(segments))), ()))

    def record(self, kind: str, segments: int, host_ms: float) -> None:
        key = (kind, max(1, int(segments)))
        self._by[key] = (self._by.get(key, []) + [float(host_ms)])[-self.window :]

    def drop(self, kind: str, segments: int, host_ms: float) -> None:
        """Forget the most recent ``host_ms`` recorded for such a call (a call run again: its
        stalled issue must not size the next sleeps)."""
        key = (kind, max(1, int(segments)))
        times = self._by.get(key, [])
        for i in range(len(times) - 1, -1, -1):
            if times[i] == float(host_ms):
                del times[i]
                return

    def longest(self, kind: str, segments: int = 1) -> float | None:
        """The longest recent host time of such a call (scaled from the kind's other segment
        counts when it has none); None when the kind has no times."""
        segments = max(1, int(segments))
        own = self._by.get((kind, segments))
        if own:
            return max(own)
        per = [max(v) / n for (k, n), v in self._by.items() if k == kind and v]
        return max(per) * segments if per else None

    def sleep_ms(self, kind: str, segments: int = 1) -> float:
        """The sleep queued ahead of a ``kind`` call of ``segments`` segments (``sleep_ms`` of its
        window)."""
        longest = self.longest(kind, segments)
        return sleep_ms([] if longest is None else [longest])


#: the GPU sleep's first calibration: this many cycles, timed this many times (the fastest
#: clock seen counts: a GPU that idled before the first timed call runs its first spin slower)
CALIBRATE_CYCLES = 10_000_000
CALIBRATE_RUNS = 3
#: measured sleeps that refine the cycles-per-ms rate (the fastest recent one counts)
RATE_WINDOW = 16


class SleepRate:
    """GPU clock cycles per millisecond, what a sleep of so many ms is asked for in
    (``torch.cuda._sleep`` spins for a count of SM clock cycles).

    The clock moves: calibrated once at a lower clock than the one the replay then runs at, every
    sleep is shorter than asked. An H200 run (2026-12-05) had suffix prefills whose sleep sized
    at its 50 ms cap ended with the host's issue at 30 ms: their time from the sleep's start to
    the call's end was 30 ms. So every queued call's sleep is measured as it is resolved
    (``observe``: cycles asked, GPU ms between the events around it) and the rate is the fastest
    of the recent measurements (a faster clock runs a shorter sleep: the fastest keeps every
    sleep at least as long as asked)."""

    def __init__(self, window: int = RATE_WINDOW) -> None:
        self.window = int(window)
        self._rates: list[float] = []

    @property
    def known(self) -> bool:
        return bool(self._rates)

    def observe(self, cycles: int, ms: float) -> None:
        """A sleep of ``cycles`` that ran ``ms`` on the GPU (ignored when not measurable)."""
        if cycles > 0 and ms == ms and ms > 1e-3:
            self._rates = (self._rates + [cycles / ms])[-self.window :]

    def per_ms(self) -> float:
        if not self._rates:
            raise RuntimeError("the sleep's rate is not calibrated")
        return max(self._rates)

    def cycles(self, ms: float) -> int:
        return int(ms * self.per_ms())


class Timed(NamedTuple):
    """A timed call's handle (``Stopwatch.stop``): ``first`` and ``last`` (CUDA events around
    the call; on the CPU ``first`` holds the elapsed ms and ``last`` is None), the host's issue
    ms, ``before`` (the event before the sleep; None unless queued), the call's ``kind`` and
    ``segments`` (what its sleep window is), the sleep asked for (``sleep_ms``, ``sleep_cycles``:
    0 unqueued)."""

    first: object
    last: object
    host: float
    before: object
    kind: str = "call"
    segments: int = 1
    sleep_ms: float = 0.0
    sleep_cycles: int = 0


class Stopwatch:
    """Elapsed milliseconds of a timed call, and the host's time to issue it.

    On a GPU the device time comes from CUDA events (resolved lazily: timing adds no
    synchronisation). ``queued`` (``--measure device``, the default): before each timed call a GPU
    sleep as long as the host's recent issue times of the same kind of call (``SleepWindows``)
    is queued (its length in GPU cycles from ``SleepRate``), so the whole call is on the GPU's
    queue before its first kernel starts and the events time the kernels back to back: the
    model's device time, what an engine whose host keeps up runs. Without it (``--measure
    wall``) a call issued to an idle GPU is timed as issued: at short lengths the replay's own
    Python and launch time per layer (tens of ms per full-depth call, depending on the host CPU)
    rather than the model's. On the CPU, ``perf_counter`` around a synchronous region. Every
    handle also carries the host's issue time (``host_ms``) and, when queued, the ``slack_ms``
    that says whether the GPU ran the call back to back or waited for the host.

    Host gaps: a call issues more launches than the GPU's launch queue holds, so on a slow host
    the GPU can finish the queued part before the host has issued the rest. The GPU then runs
    each later kernel as it arrives and ends just after the host's last launch. An event recorded
    before the sleep, no earlier than the host's start of issue, bounds that from below:
    ``slack_ms`` = (sleep start to call end, on the GPU) - (host issue time) is at most the true
    time between the host's last launch and the call's end, so a slack under
    ``sim.replay.measure.HOST_BOUND_MARGIN_MS`` flags every call the host held up (and,
    conservatively, some that merely finished close to it)."""

    def __init__(self, device: torch.device, queued: bool = False) -> None:
        self.cuda = device.type == "cuda"
        self.queued = queued and self.cuda
        self.windows = SleepWindows()  # recent host issue times, per call kind and segments
        self.rate = SleepRate()  # the sleep's cycles per ms, refined by every measured sleep
        self._open = 0  # timed calls started and not yet stopped
        self._gc_paused = False  # whether this stopwatch turned Python's cyclic collector off

    def _pause_gc(self) -> None:
        """Python's cyclic garbage collector off while a timed call is issued (``PAUSE_GC``): a
        collection that falls inside a call's issue stalls the host (a full one over the replay's
        heap, ~340K objects with the CLI and torch loaded, takes 160-190 ms on a 2-core CI
        machine; the younger generations' a few ms), which no engine's issue pays (engines freeze
        the collector once loaded), and makes the call host-bound: the likely cause of session
        28's H100 rows' three calls of 24-1,209 tokens issued in 18-47 ms against 5-8 ms typical,
        one of them twice. Collections wait for the call's stop; a collector already off stays off."""
        if self._open == 0 and PAUSE_GC and gc.isenabled():
            gc.disable()
            self._gc_paused = True
        self._open += 1

    def _resume_gc(self) -> None:
        self._open = max(0, self._open - 1)
        if self._open == 0 and self._gc_paused:
            self._gc_paused = False
            gc.enable()

    def _calibrate(self) -> None:
        """The sleep's first rate: ``CALIBRATE_RUNS`` sleeps of ``CALIBRATE_CYCLES``, timed
        (``SleepRate``: the fastest counts)."""
        for _ in range(CALIBRATE_RUNS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(CALIBRATE_CYCLES)
            b.record()
            b.synchronize()
            self.rate.observe(CALIBRATE_CYCLES, float(a.elapsed_time(b)))

    def start(self, queue: bool = True, kind: str = "call", segments: int = 1):
        """The start of a timed call of ``kind`` (``suffix``, ``reference``, ``batch``, ``step``
        ...) split into ``segments`` calls: with ``queue`` (and queued timing) behind a GPU sleep
        sized from such calls' recent host issue times (``SleepWindows``)."""
        self._pause_gc()
        t0 = time.perf_counter()
        before, ms, cycles = None, 0.0, 0
        if self.queued and queue:
            if not self.rate.known:
                self._calibrate()
                t0 = time.perf_counter()  # the calibration's sync is not the call's
            ms = self.windows.sleep_ms(kind, segments)
            cycles = self.rate.cycles(ms)
            before = timestamp(True)  # the GPU reaches it no earlier than t0
            torch.cuda._sleep(cycles)
        return (timestamp(self.cuda), t0, before, kind, max(1, int(segments)), ms, cycles)

    def stop(self, started) -> Timed:
        first, t0, before, kind, segments, ms, cycles = started
        host = (time.perf_counter() - t0) * 1e3
        self._resume_gc()
        if before is not None:  # a queued call: its host time sizes the next such call's sleep
            self.windows.record(kind, segments, host)
        if self.cuda:
            return Timed(first, timestamp(True), host, before, kind, segments, ms, cycles)
        return Timed((time.perf_counter() - first) * 1e3, None, host, None, kind, segments, ms, cycles)

    @staticmethod
    def outran(handle) -> bool:
        """Whether a queued call's host issue took longer than the sleep asked ahead of it
        (``sim.replay.measure.outran_sleep``; False unqueued). No device sync."""
        return handle is not None and outran_sleep(float(handle.host), float(handle.sleep_ms))

    def stalled(self, handle, marks) -> bool:
        """Whether a queued call's device time outside its layers' ``marks`` says the GPU stalled
        outside the model (``sim.replay.measure.stalled_outside``; False unqueued: the CPU, whose
        ``perf_counter`` times hold the host's pauses, and ``--measure wall``). Resolves the call's
        events: ask it only where the call is known done (after the hit's check), so that it adds
        no wait."""
        if handle is None or marks is None or handle.before is None:
            return False
        handle[1].synchronize()
        call = float(handle[0].elapsed_time(handle[1]))
        return stalled_outside(call, sum(marks.ms_by_type().values()))

    def again(self, first: Timed, call) -> Timed:
        """A queued call whose host issue outran its sleep (``outran``), or that stalled outside its
        layers (``stalled``), timed once more: its issue taken out of its kind's sleep window
        (``forget``), then ``call()`` run behind a fresh sleep of the same kind and segment count.
        Returns the second call's handle (the caller keeps ``first``'s: ``Replayer._retime``,
        ``HitChecker._retime_reference``)."""
        self.forget(first)
        t0 = self.start(kind=first.kind, segments=first.segments)
        call()
        return self.stop(t0)

    def forget(self, handle) -> None:
        """Take a call's host time out of its sleep window (the call is run again)."""
        if handle is not None and handle.before is not None:
            self.windows.drop(handle.kind, handle.segments, handle.host)

    def ms(self, handle) -> float:
        """The call's device time (resolving its events: a sync); a queued call's measured
        sleep refines the sleep's rate (``SleepRate.observe``)."""
        if handle is None:
            return float("nan")
        if self.cuda:
            a, b = handle[0], handle[1]
            b.synchronize()
            if handle[3] is not None and len(handle) > 7 and handle[7]:
                self.rate.observe(handle[7], float(handle[3].elapsed_time(a)))
            return float(a.elapsed_time(b))
        return float(handle[0])

    @staticmethod
    def sleep_gpu_ms(handle) -> float:
        """How long the sleep queued ahead of the call ran on the GPU (NaN unless queued)."""
        if handle is None or handle[3] is None:
            return float("nan")
        handle[1].synchronize()
        return float(handle[3].elapsed_time(handle[0]))

    @staticmethod
    def slack_ms(handle) -> float:
        """GPU time from the sleep's start to the call's end, less the host's issue time: a lower
        bound of how long after the host's last launch the call ended (NaN unless queued)."""
        if handle is None or handle[3] is None:
            return float("nan")
        handle[1].synchronize()
        return float(handle[3].elapsed_time(handle[1])) - float(handle[2])

    @staticmethod
    def sleep_ms(handle) -> float:
        """The GPU sleep asked ahead of a timed call (0 unqueued: the CPU, a tail; NaN: none).
        A queued call's device time starts when the sleep ends, so the sleep hides that much of
        the host's issue: a call whose host outran it shows the rest as device time."""
        return float("nan") if handle is None else float(handle.sleep_ms)

    @staticmethod
    def host_ms(handle) -> float:
        return float("nan") if handle is None else float(handle[2])
