"""The sleep queued ahead of a timed call (``--measure device``): sized per call kind and segment
count (``SleepWindows``), asked for in GPU cycles at a rate its measured sleeps refine
(``SleepRate``), and the device memory of the largest call reserved before anything is timed
(``warm.presize``). The CUDA paths are in ``test_replay_gpu.py``; here their logic, on the CPU."""

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from sim.replay.clock import (  # noqa: E402
    HOST_GUESS_MS,
    QUEUE_CAP_MS,
    QUEUE_MARGIN,
    QUEUE_PAD_MS,
    QUEUE_WINDOW,
    SleepRate,
    SleepWindows,
    Stopwatch,
    Timed,
    sleep_ms,
)

STALLS = Path(__file__).resolve().parents[3] / "benchmarks/results/2026-12-05-gpu-s12-h200/stalls.csv"


def sized(host: float) -> float:
    return min(QUEUE_CAP_MS, host * QUEUE_MARGIN + QUEUE_PAD_MS)


def test_slow_references_do_not_stretch_the_suffix_calls_sleep():
    w = SleepWindows()
    assert w.sleep_ms("suffix") == w.sleep_ms("reference") == sized(HOST_GUESS_MS)  # nothing seen yet
    w.record("reference", 1, 199.1)  # a reference that allocated (H200, 2026-12-05)
    w.record("suffix", 1, 9.0)
    w.record("suffix", 1, 8.0)
    assert w.sleep_ms("suffix") == pytest.approx(9.0 * 1.25 + 1.0)  # 12.25 ms
    assert w.sleep_ms("reference") == QUEUE_CAP_MS
    assert w.recent("suffix") == [9.0, 8.0] and w.recent("reference") == [199.1]
    assert w.sleep_ms("step") == sized(HOST_GUESS_MS)  # another kind starts from the guess


def test_an_unseen_segment_count_is_sized_per_segment_from_the_kinds_others():
    w = SleepWindows()
    w.record("suffix", 1, 8.0)
    w.record("suffix", 1, 10.0)
    assert w.longest("suffix", 2) == pytest.approx(20.0)  # 10 ms a segment, twice
    assert w.sleep_ms("suffix", 2) == pytest.approx(26.0)
    w.record("suffix", 2, 14.0)  # its own window from now on
    assert w.sleep_ms("suffix", 2) == pytest.approx(14.0 * 1.25 + 1.0)
    assert w.sleep_ms("suffix", 1) == pytest.approx(13.5)  # the one-segment calls keep theirs
    # three segments: the longest time a segment (10 / 1 against 14 / 2) times 3 = 30 ms
    assert w.longest("suffix", 3) == pytest.approx(30.0)
    assert w.sleep_ms("suffix", 3) == pytest.approx(38.5)
    assert w.longest("reference", 3) is None


def test_a_window_forgets_its_oldest_times():
    w = SleepWindows(window=3)
    for h in (40.0, 5.0, 6.0, 7.0):
        w.record("suffix", 1, h)
    assert w.recent("suffix") == [5.0, 6.0, 7.0]
    assert w.sleep_ms("suffix") == pytest.approx(7.0 * 1.25 + 1.0)
    assert SleepWindows().window == QUEUE_WINDOW
    with pytest.raises(ValueError):
        SleepWindows(window=0)


def test_a_window_of_one_sizes_each_sleep_from_the_last_call_alone():
    """The smallest window allowed (mutation run, session 17: ``window < 1`` -> ``<= 1`` refused
    it): each call's time replaces the one before."""
    w = SleepWindows(window=1)
    for h in (40.0, 5.0):
        w.record("suffix", 1, h)
    assert w.recent("suffix") == [5.0]
    assert w.sleep_ms("suffix") == pytest.approx(5.0 * 1.25 + 1.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["suffix", "reference", "step"]), st.integers(1, 3), st.floats(0.1, 300.0)),
        max_size=40,
    )
)
def test_a_kinds_sleeps_are_those_of_its_own_calls_alone(calls):
    """Whatever the other kinds' calls took, a kind's sleeps are the ones its calls alone would
    give (the property the shared window broke)."""
    mixed, alone = SleepWindows(), SleepWindows()
    for kind, segs, host in calls:
        if kind == "suffix":
            assert mixed.sleep_ms(kind, segs) == alone.sleep_ms(kind, segs)
            alone.record(kind, segs, host)
        mixed.record(kind, segs, host)
        assert mixed.sleep_ms(kind, segs) <= QUEUE_CAP_MS


def test_the_h200_agent_run_under_per_kind_windows():
    """The call order of the held-out qwen3.5-27b agent run (the 2026-12-05 stall probe): under
    the one shared window (the tail's unqueued calls entering it too, as they did) 21 of the 64
    suffix calls' sleeps sat at the 50 ms cap; sized from suffix calls alone, 12 (the suffix
    calls' own host times, up to 60 ms early on, keep it there at first), and the reference's
    slowest call (199 ms) no longer reaches any suffix call."""
    d = pd.read_csv(STALLS)
    kinds = {"sim/replay/runner.py:375": "suffix", "sim/replay/hits.py:195": "reference"}
    shared: list = []
    w = SleepWindows()
    old, new = [], []
    for r in d.itertuples():
        if r.kind == "unqueued":
            shared = (shared + [r.host_ms])[-QUEUE_WINDOW:]
            continue
        k = kinds[r.caller]
        if k == "suffix":
            old.append(sleep_ms(shared))
            new.append(w.sleep_ms(k))
        shared = (shared + [r.host_ms])[-QUEUE_WINDOW:]
        w.record(k, 1, r.host_ms)
    assert len(new) == 64
    assert sum(s >= QUEUE_CAP_MS for s in old) == 21
    assert sum(s >= QUEUE_CAP_MS for s in new) == 12
    assert max(w.recent("suffix")) < 40.0 and max(w.recent("reference")) < 40.0  # the run's end


def test_the_sleep_rate_keeps_the_fastest_clock_seen():
    r = SleepRate(window=2)
    assert not r.known
    with pytest.raises(RuntimeError):
        r.cycles(5.0)
    r.observe(10_000_000, 10.0)  # 1e6 cycles a ms
    assert r.known and r.cycles(5.0) == 5_000_000
    r.observe(10_000_000, 5.0)  # the clock doubled: a sleep asked in the old rate ran half as long
    assert r.cycles(5.0) == 10_000_000
    r.observe(10_000_000, float("nan"))  # not measurable: ignored
    r.observe(0, 3.0)
    assert r.cycles(1.0) == 2_000_000
    r.observe(10_000_000, 10.0)
    r.observe(10_000_000, 8.0)  # the window (2) forgot the fast one
    assert r.cycles(1.0) == 1_250_000


def test_a_cpu_stopwatch_hands_back_the_calls_kind_and_queues_nothing():
    clock = Stopwatch(torch.device("cpu"), queued=True)
    h = clock.stop(clock.start(kind="suffix", segments=2))
    assert isinstance(h, Timed) and h.kind == "suffix" and h.segments == 2
    assert h.sleep_ms == 0.0 and h.sleep_cycles == 0 and h.before is None
    assert clock.ms(h) >= 0 and clock.host_ms(h) >= 0
    assert clock.sleep_gpu_ms(h) != clock.sleep_gpu_ms(h)  # NaN: no sleep
    assert clock.windows.recent("suffix", 2) == []  # nothing queued: no time sizes a sleep
    assert not clock.rate.known  # never calibrated off a GPU


def test_the_cyclic_collector_is_off_while_a_timed_call_is_issued(monkeypatch):
    """``Stopwatch._pause_gc``: Python's cyclic collector is off from a timed call's start to its
    stop (a collection inside a call's issue stalled session 28's H100 rows by 10-40 ms), off
    until the outermost of nested calls stops, and a collector the caller had turned off stays off."""
    import gc

    import sim.replay.clock as clock_mod

    assert gc.isenabled()
    clock = Stopwatch(torch.device("cpu"))
    outer = clock.start(kind="reference")
    assert not gc.isenabled()
    inner = clock.start(kind="suffix")
    clock.stop(inner)
    assert not gc.isenabled()  # the outer call is still being issued
    clock.stop(outer)
    assert gc.isenabled()
    # again(): the second call is paused too, and the collector back on after it
    seen = []
    clock.again(clock.stop(clock.start(kind="suffix")), lambda: seen.append(gc.isenabled()))
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        clock.stop(clock.start())
        assert not gc.isenabled()  # not this stopwatch's to turn on
        fresh = Stopwatch(torch.device("cpu"))  # nor a new one's
        fresh.stop(fresh.start())
        assert not gc.isenabled()
    finally:
        gc.enable()
    monkeypatch.setattr(clock_mod, "PAUSE_GC", False)
    h = clock.start()
    assert gc.isenabled()
    clock.stop(h)


def test_the_replayer_names_each_timed_calls_kind_and_segments(tiny_model, tiny_shape):
    """The suffix prefill is started as a ``suffix`` call of as many segments as it runs (the
    split at an exact-alignment checkpoint), the hit's check as a ``reference`` of one, the
    teacher-forced tail as an unqueued ``tail``; the records' segments agree."""
    from sim.replay.runner import Replayer
    from sim.replay.store import CheckpointStore
    from test_replay_runner import REQS, first_turn

    store = CheckpointStore(tiny_shape, torch.float32, device="cpu")
    rp = Replayer(tiny_model, store, lambda r: REQS[r])
    seen = []
    start = rp.clock.start

    def spy(queue=True, kind="call", segments=1):
        seen.append((kind, segments, queue))
        return start(queue, kind, segments)

    rp.clock.start = spy
    first_turn(rp)  # request 0: its prompt split at 90 (two calls), then its tail
    rp.lookup(1, 4, 130)
    rp.prefill(1, 130, 170)
    rp.decode(1)
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and recs[1].validated
    assert recs[0].suffix_segments == [(0, 90), (90, 100)] and recs[1].suffix_segments == [(130, 170)]
    assert seen == [("suffix", 2, True), ("tail", 1, False), ("suffix", 1, True), ("reference", 1, True)]


# --------------------------------------------------------------------------- the CUDA path, on a stand-in
class FakeGPU:
    """One CUDA stream for the Stopwatch on a CPU: an event takes the stream's clock (ms) when
    recorded; ``torch.cuda._sleep`` (at ``rates``' next cycles a ms, then ``rate``) and the test's
    ``work`` advance it. An event is complete once it or a later event of the stream has been
    synchronised, and ``elapsed_time`` with an incomplete event raises, as
    ``cudaEventElapsedTime`` does (``cudaErrorNotReady``). Synchronising blocks the host
    (``host.now`` moves on by ``sync_s``). Every call is logged in order."""

    def __init__(self, host, rate: float, rates=(), sync_s: float = 0.0):
        self.host, self.rate, self.rates, self.sync_s = host, rate, list(rates), sync_s
        self.now, self.recorded, self.complete, self.log = 0.0, 0, 0, []

    def Event(self, enable_timing=False):
        assert enable_timing
        return FakeEvent(self)

    def sleep(self, cycles):
        self.log.append(("sleep", cycles))
        self.now += cycles / (self.rates.pop(0) if self.rates else self.rate)

    def work(self, ms):
        self.now += ms

    def stamp(self):  # sim.replay.model.timestamp(True)
        ev = self.Event(enable_timing=True)
        ev.record()
        return ev


class FakeEvent:
    def __init__(self, gpu):
        self.gpu, self.n, self.t = gpu, None, None

    def record(self):
        self.gpu.recorded += 1
        self.n, self.t = self.gpu.recorded, self.gpu.now
        self.gpu.log.append(("record", self.n))

    def synchronize(self):
        self.gpu.log.append(("sync", self.n))
        self.gpu.complete = max(self.gpu.complete, self.n)
        self.gpu.host.now += self.gpu.sync_s

    def elapsed_time(self, end):
        if max(self.n, end.n) > self.gpu.complete:
            raise RuntimeError("CUDA error: device not ready")
        self.gpu.log.append(("elapsed", self.n, end.n))
        return end.t - self.t


class FakeHost:
    """``time`` for sim.replay.clock: ``perf_counter`` is ``now`` (seconds), moved by the test."""

    def __init__(self, now: float):
        self.now = now

    def perf_counter(self):
        return self.now


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA Stopwatch's world on the CPU: the stream above (calibration sleeps at 0.8, 1.0 and
    0.5 M cycles a ms, later sleeps at 2 M: the clock went up after calibration; a sync holds the
    host 0.5 s) and the host's clock, patched where sim.replay.clock reads them."""
    import sim.replay.clock as clock_mod

    host = FakeHost(100.0)
    gpu = FakeGPU(host, rate=2_000_000.0, rates=[800_000.0, 1_000_000.0, 500_000.0], sync_s=0.5)
    monkeypatch.setattr(clock_mod, "time", host)
    monkeypatch.setattr(clock_mod, "timestamp", lambda cuda: gpu.stamp() if cuda else host.perf_counter())
    monkeypatch.setattr(torch.cuda, "Event", gpu.Event, raising=False)
    monkeypatch.setattr(torch.cuda, "_sleep", gpu.sleep, raising=False)
    return gpu, host


def test_a_queued_gpu_call_calibrates_sleeps_and_resolves_its_events_in_order(fake_gpu):
    """Hand-worked: calibration's three 10 M-cycle sleeps ran 12.5, 10 and 20 ms (the fastest,
    1 M cycles a ms, counts), each event pair synchronised before it is read; the first suffix
    call (two segments, nothing seen yet) sleeps HOST_GUESS_MS x 1.25 + 1 = 38.5 ms = 38.5 M
    cycles. The GPU's clock has doubled: the sleep runs 19.25 ms, then the call 7 ms; the host
    issued it in 15.625 ms (the calibration's syncs not counted). Resolving the call measures its
    sleep at 2 M cycles a ms, and the next such call asks 15.625 x 1.25 + 1 = 20.53125 ms at that
    rate."""
    from sim.replay.clock import CALIBRATE_CYCLES, CALIBRATE_RUNS

    assert (CALIBRATE_CYCLES, CALIBRATE_RUNS) == (10_000_000, 3)
    gpu, host = fake_gpu
    clock = Stopwatch(torch.device("cuda"), queued=True)
    started = clock.start(kind="suffix", segments=2)
    calibration = []
    for a in (1, 3, 5):
        calibration += [("record", a), ("sleep", 10_000_000), ("record", a + 1), ("sync", a + 1), ("elapsed", a, a + 1)]
    # then the event before the sleep, the sleep, the call's first event
    assert gpu.log == calibration + [("record", 7), ("sleep", 38_500_000), ("record", 8)]
    assert clock.rate.per_ms() == 1_000_000.0
    assert host.now == 101.5  # three syncs held the host
    gpu.work(7.0)
    host.now += 0.015625
    h = clock.stop(started)
    assert gpu.log[-1] == ("record", 9)
    assert (h.kind, h.segments, h.sleep_ms, h.sleep_cycles) == ("suffix", 2, 38.5, 38_500_000)
    assert h.host == 15.625 and clock.host_ms(h) == 15.625
    assert clock.windows.recent("suffix", 2) == [15.625] and clock.windows.recent("suffix", 1) == []
    # slack, read first, resolves the events itself: sleep start to call end (19.25 + 7) - host
    n = len(gpu.log)
    assert clock.slack_ms(h) == 26.25 - 15.625
    assert gpu.log[n:] == [("sync", 9), ("elapsed", 7, 9)]
    assert clock.rate.per_ms() == 1_000_000.0  # only ms() refines the rate
    n = len(gpu.log)
    assert clock.ms(h) == 7.0
    assert gpu.log[n:] == [("sync", 9), ("elapsed", 7, 8), ("elapsed", 8, 9)]
    assert clock.rate.per_ms() == 2_000_000.0  # 38.5 M cycles in 19.25 ms
    assert clock.sleep_gpu_ms(h) == 19.25
    # the next suffix call of two segments: sized from its window, asked at the measured rate
    h2 = clock.stop(clock.start(kind="suffix", segments=2))
    assert (h2.sleep_ms, h2.sleep_cycles) == (20.53125, 41_062_500)
    assert gpu.log[-4:] == [("record", 10), ("sleep", 41_062_500), ("record", 11), ("record", 12)]
    # sleep_gpu_ms, read first on a handle, resolves the events itself too
    n = len(gpu.log)
    assert clock.sleep_gpu_ms(h2) == pytest.approx(20.53125)
    assert gpu.log[n:] == [("sync", 12), ("elapsed", 10, 11)]


def test_an_unqueued_gpu_call_sleeps_for_nothing(fake_gpu):
    """``queue=False`` on a queued Stopwatch, and any call on an unqueued one: no calibration, no
    sleep, no event before it; its host time sizes no sleep and its device time refines no rate;
    slack and the sleep's time are NaN."""
    gpu, host = fake_gpu
    for clock, queue in (
        (Stopwatch(torch.device("cuda"), queued=True), False),
        (Stopwatch(torch.device("cuda")), True),
    ):
        gpu.log.clear()
        started = clock.start(queue=queue, kind="tail")
        gpu.work(3.0)
        host.now += 0.5
        h = clock.stop(started)
        assert [e[0] for e in gpu.log] == ["record", "record"]  # the call's two events only
        assert h.before is None and (h.sleep_ms, h.sleep_cycles) == (0.0, 0) and h.host == 500.0
        assert clock.ms(h) == 3.0 and not clock.rate.known
        assert clock.windows.recent("tail") == []
        assert clock.slack_ms(h) != clock.slack_ms(h) and clock.sleep_gpu_ms(h) != clock.sleep_gpu_ms(h)


def test_a_cpu_stopwatch_times_the_region_in_ms(fake_gpu):
    _, host = fake_gpu
    clock = Stopwatch(torch.device("cpu"), queued=True)
    started = clock.start(kind="suffix")
    host.now += 0.25
    h = clock.stop(started)
    assert clock.ms(h) == 250.0 and clock.host_ms(h) == 250.0 and h.last is None
    assert clock.slack_ms(h) != clock.slack_ms(h)  # NaN: nothing queued


def test_no_handle_reads_as_nan():
    clock = Stopwatch(torch.device("cpu"))
    for read in (clock.ms, clock.host_ms, clock.slack_ms, clock.sleep_gpu_ms):
        assert read(None) != read(None)


def test_a_segment_count_below_one_counts_as_one(fake_gpu):
    """Windows key a call by ``max(1, segments)``: 0 or -2 segments read and fill the one-segment
    window, and a Stopwatch hands back 1."""
    w = SleepWindows()
    w.record("suffix", 0, 8.0)
    assert w.recent("suffix", 1) == w.recent("suffix", 0) == w.recent("suffix", -2) == [8.0]
    w.record("suffix", 2, 30.0)  # 15 ms a segment: more than the one-segment calls' 8
    assert w.longest("suffix", 0) == w.longest("suffix", 1) == 8.0
    assert w.sleep_ms("suffix", 0) == w.sleep_ms("suffix", 1) == 11.0
    clock = Stopwatch(torch.device("cpu"))
    assert clock.stop(clock.start(segments=0)).segments == 1


def test_a_handle_says_the_sleep_asked_ahead_of_its_call():
    """``Stopwatch.sleep_ms``: the GPU sleep asked ahead of a timed call (what replay records as
    ``suffix_sleep_ms`` and a host-bound call's price takes off the host's issue); NaN without a
    handle; 0 for a CPU call (nothing queued)."""
    from sim.replay.clock import Stopwatch, Timed

    assert Stopwatch.sleep_ms(Timed(None, None, 3.0, None, "suffix", 1, 12.5, 100)) == 12.5
    assert Stopwatch.sleep_ms(None) != Stopwatch.sleep_ms(None)  # NaN
    clock = Stopwatch(torch.device("cpu"), queued=True)
    assert Stopwatch.sleep_ms(clock.stop(clock.start(kind="suffix"))) == 0.0
