"""How replay times a call on a GPU: device time (the call queued behind a sleep) or wall time.

Needs torch.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from sim.replay.model import timestamp

#: how timed prefills are timed on a GPU (Stopwatch): device (queued) or wall (as issued)
MEASURE_MODES = ("device", "wall")
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


class Stopwatch:
    """Elapsed milliseconds of a timed call, and the host's time to issue it.

    On a GPU the device time comes from CUDA events (resolved lazily: timing adds no
    synchronisation). ``queued`` (``--measure device``, the default): before each timed call a GPU
    sleep as long as the host's recent issue times is queued, so the whole call is on the GPU's
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
        self.recent: list[float] = []
        self._cycles_per_ms: Optional[float] = None

    def _sleep_cycles(self) -> int:
        if self._cycles_per_ms is None:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(10_000_000)
            b.record()
            b.synchronize()
            self._cycles_per_ms = 10_000_000 / max(1e-3, float(a.elapsed_time(b)))
        return int(sleep_ms(self.recent) * self._cycles_per_ms)

    def start(self, queue: bool = True):
        t0 = time.perf_counter()
        before = None
        if self.queued and queue:
            before = timestamp(True)  # the GPU reaches it no earlier than t0
            torch.cuda._sleep(self._sleep_cycles())
        return (timestamp(self.cuda), t0, before)

    def stop(self, started):
        first, t0, before = started
        host = (time.perf_counter() - t0) * 1e3
        if self.queued:
            self.recent = (self.recent + [host])[-QUEUE_WINDOW:]
        if self.cuda:
            return (first, timestamp(True), host, before)
        return ((time.perf_counter() - first) * 1e3, None, host, None)

    def ms(self, handle) -> float:
        if handle is None:
            return float("nan")
        if self.cuda:
            a, b = handle[0], handle[1]
            b.synchronize()
            return float(a.elapsed_time(b))
        return float(handle[0])

    @staticmethod
    def slack_ms(handle) -> float:
        """GPU time from the sleep's start to the call's end, less the host's issue time: a lower
        bound of how long after the host's last launch the call ended (NaN unless queued)."""
        if handle is None or handle[3] is None:
            return float("nan")
        handle[1].synchronize()
        return float(handle[3].elapsed_time(handle[1])) - float(handle[2])

    @staticmethod
    def host_ms(handle) -> float:
        return float("nan") if handle is None else float(handle[2])
