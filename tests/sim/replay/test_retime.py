"""A timed suffix prefill whose host issue outran the GPU sleep queued ahead of it is run again
and timed the second time (issue 41, session 17): the rule (``measure.outran_sleep``), the sleep
window that forgets the first call's stalled issue (``SleepWindows.drop``), and the replayer's
second call (``Replayer._retime``: same state, same boundaries, nothing handed to the store, the
first call's times kept beside). The stalls it answers: the H200 runs' host-bound prefills whose
host waited 53-136 ms against a 5-9 ms issue (``docs/results-replay.md``, session 17)."""

import math
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.cost import get_model  # noqa: E402
from sim.replay.clock import QUEUE_CAP_MS, SleepWindows, Stopwatch, Timed  # noqa: E402
from sim.replay.measure import outran_sleep, request_table, stalled_outside, summary  # noqa: E402
from sim.replay.records import RequestRecord  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.store import CheckpointStore  # noqa: E402

rng = np.random.default_rng(11)
P0 = rng.integers(0, 10_000, 100)
O0 = rng.integers(0, 10_000, 30)
U1 = rng.integers(0, 10_000, 40)
O1 = rng.integers(0, 10_000, 20)
REQS = {0: (np.concatenate([P0, O0]), 100), 1: (np.concatenate([P0, O0, U1, O1]), 170)}


@pytest.mark.parametrize(
    "host, asked, outran",
    [
        (9.0, 12.25, False),  # a steady issue under its sleep (window max 9 ms: 9 x 1.25 + 1)
        (12.25, 12.25, False),  # exactly the sleep: covered
        (12.26, 12.25, True),
        (62.4, QUEUE_CAP_MS, True),  # waited for the sleep at its cap (H200 27b request 16)
        (0.8, 0.5, True),  # any sleep asked, a sub-millisecond one too
        (5.0, 0.0, False),  # unqueued (--measure wall, the tail, the CPU): never
        (math.nan, 12.25, False),
    ],
)
def test_a_call_is_run_again_when_its_host_issue_outran_the_sleep(host, asked, outran):
    assert outran_sleep(host, asked) is outran
    h = Timed(None, None, host, object(), "suffix", 1, asked, 1000)
    assert Stopwatch.outran(h) is outran


def test_the_first_calls_stalled_issue_leaves_the_sleep_window():
    w = SleepWindows()
    for t in (8.0, 62.4, 9.0):
        w.record("suffix", 1, t)
    assert w.sleep_ms("suffix") == QUEUE_CAP_MS  # 62.4 x 1.25 + 1 capped: 8 calls would sleep 50 ms
    w.drop("suffix", 1, 62.4)
    assert w.recent("suffix") == [8.0, 9.0]
    assert w.sleep_ms("suffix") == pytest.approx(12.25)
    w.drop("suffix", 1, 7.0)  # not there: nothing changes
    w.drop("suffix", 2, 8.0)  # another segment count's window: nothing changes
    assert w.recent("suffix") == [8.0, 9.0]
    w.record("suffix", 1, 9.0)
    w.drop("suffix", 1, 9.0)  # the latest of two equal times
    assert w.recent("suffix") == [8.0, 9.0]
    # the oldest time, then the only one left, go too; a segment count below one is one (as record's)
    w.drop("suffix", 1, 8.0)
    assert w.recent("suffix") == [9.0]
    w.drop("suffix", 0, 9.0)
    assert w.recent("suffix") == []


def test_the_stopwatch_forgets_a_queued_calls_issue_only():
    """``Stopwatch.forget``: a queued call's host time leaves its kind's window; an unqueued call
    (no sleep ahead of it: ``before`` None) recorded nothing and takes nothing out; no handle is a
    no-op (mutation run, session 17: each of forget's conditions flipped survived)."""
    clock = Stopwatch(torch.device("cpu"))
    for t in (8.0, 62.4, 8.0):
        clock.windows.record("suffix", 2, t)
    clock.forget(Timed(None, None, 8.0, None, "suffix", 2, 0.0, 0))  # unqueued
    assert clock.windows.recent("suffix", 2) == [8.0, 62.4, 8.0]
    clock.forget(None)
    clock.forget(Timed(None, None, 62.4, object(), "suffix", 2, 12.25, 1000))
    assert clock.windows.recent("suffix", 2) == [8.0, 8.0]


@pytest.mark.parametrize(
    "call, first_arg, times, first, other",
    [
        ("suffix", "first", (1.25, 6.1, 0.9), (14.57, 65.07), "full"),  # a suffix prefill (session 17)
        ("full", "full_first", (2.0, 5.0, 1.0), (10.16, 64.03), "suffix"),  # its reference (session 20)
    ],
)
def test_a_record_keeps_the_first_calls_times_beside_the_second(call, first_arg, times, first, other):
    """``RequestRecord.timed``: a call timed once has no first call; one timed again keeps its
    first call's device and host ms beside the second's times, and flags only its own kind."""
    r = RequestRecord(request=3, input_tokens=1053, output_tokens=26)
    r.timed(**{call: times})
    assert not getattr(r, f"{call}_retimed") and math.isnan(getattr(r, f"{call}_first_ms"))
    r.timed(**{call: times, first_arg: first})
    assert getattr(r, f"{call}_retimed") and not getattr(r, f"{other}_retimed")
    assert (getattr(r, f"{call}_first_ms"), getattr(r, f"{call}_first_host_ms")) == first
    assert tuple(getattr(r, f"{call}_{k}") for k in ("ms", "host_ms", "slack_ms")) == times


def test_the_stopwatch_times_an_outrun_call_again_in_its_place():
    """``Stopwatch.again``: the first call's issue leaves its window, the call runs once more,
    and the second handle is of the first's kind and segment count (unqueued on the CPU)."""
    clock = Stopwatch(torch.device("cpu"))
    forgotten, ran = [], []
    clock.forget = forgotten.append
    first = Timed(None, None, 62.4, object(), "reference", 3, 12.25, 1000)
    second = clock.again(first, lambda: ran.append(1))
    assert forgotten == [first] and ran == [1]
    assert (second.kind, second.segments, second.before) == ("reference", 3, None)
    assert clock.ms(second) >= 0


def test_resolving_a_flights_times_forgets_its_handles():
    """``PendingTimes.resolve`` writes the times and drops every handle (the suffix, its first call
    when re-timed, the reference, their marks, the tail): a queued check that still holds the
    flight holds no events (mutation run, session 17: ``clear`` dropped survived)."""
    from sim.replay.flight import PendingTimes

    clock = SimpleNamespace(
        ms=lambda h: h[0], host_ms=lambda h: h[1], slack_ms=lambda h: h[2], sleep_ms=lambda h: 10 * h[0]
    )
    marks = SimpleNamespace(ms_by_type=lambda: {"gated_delta": 1.0})
    t = PendingTimes(suffix=(1.5, 6.0, 0.9), suffix_first=(14.0, 65.0, -3.0), suffix_marks=marks)
    t.full, t.full_marks, t.tail = (9.0, 7.0, 2.0), marks, [(0.5, 0.1, 0.0)]
    r = RequestRecord(request=1, input_tokens=170, output_tokens=5)
    t.resolve(r, clock)
    assert (r.suffix_ms, r.suffix_first_ms, r.suffix_first_host_ms, r.full_ms) == (1.5, 14.0, 65.0, 9.0)
    assert r.suffix_retimed and r.suffix_ms_by_type == {"gated_delta": 1.0}
    # the sleeps asked ahead of the kept calls (the clock's, here 10x their ms)
    assert (r.suffix_sleep_ms, r.full_sleep_ms) == (15.0, 90.0)
    assert (t.suffix, t.suffix_first, t.suffix_marks, t.full, t.full_marks, t.tail) == (None,) * 5 + ([],)


def replay_with_an_outrun_call(tiny_model, tiny_shape, monkeypatch, outrun_kind: str, nth: int, rule: str = "outran"):
    """Request 0 runs (a miss), request 1 hits its state at 130; the ``nth`` call of
    ``outrun_kind`` the stopwatch is asked about is declared outrun (``rule`` "outran"), or stalled
    outside its layers ("stalled": ``Stopwatch.stalled``, asked with the call's marks, kept in
    ``seen.marks``; the CPU's calls are never outrun). Returns what was seen: the
    model's calls ``(start, tokens, state position, wanted, sink, keywords)``, the kinds asked,
    the handles forgotten (the first call's issue leaving its sleep window; a no-op on the CPU,
    which queues nothing), the store's writes, the replayer and its records."""
    seen = SimpleNamespace(runs=[], asked=[], forgotten=[], writes=[], outputs=[], alive=[], marks=[])
    real_run, real_forget = tiny_model.run, Stopwatch.forget

    def run(tokens, state, start, wanted=(), on_state=None, **kw):
        pos = None if state is None else int(state.pos)
        seen.runs.append((int(start), int(tokens.shape[0]), pos, list(wanted), on_state, sorted(kw)))
        # which earlier calls' end states are still held as this one starts (weak references)
        seen.alive.append([w() is not None for w in seen.outputs])
        out = real_run(tokens, state, start, wanted, on_state, **kw)
        seen.outputs.append(weakref.ref(out[0].rec))
        return out

    def outran(h):
        seen.asked.append(h.kind)
        return h.kind == outrun_kind and seen.asked.count(outrun_kind) == nth

    def forget(self, h):
        seen.forgotten.append(h)
        real_forget(self, h)

    def stalled(self, h, marks):
        seen.marks.append(marks)
        return outran(h)

    monkeypatch.setattr(tiny_model, "run", run)
    if rule == "outran":
        monkeypatch.setattr(Stopwatch, "outran", staticmethod(outran))
    else:
        monkeypatch.setattr(Stopwatch, "stalled", stalled)
    monkeypatch.setattr(Stopwatch, "forget", forget)
    store = CheckpointStore(tiny_shape, torch.float32, device="cpu")
    real_write = store.write

    def write(cp, layer, r, c):
        seen.writes.append((cp, layer))
        real_write(cp, layer, r, c)

    monkeypatch.setattr(store, "write", write)
    rp = Replayer(tiny_model, store, lambda r: REQS[r])
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 100)
    rp.admit(1, 0, 100, "prompt end")
    rp.decode(0)
    rp.admit(2, 0, 130, "tail")
    rp.lookup(1, 2, 130)
    rp.prefill(1, 130, 170)
    rp.admit(3, 1, 170, "prompt end")
    rp.decode(1)
    seen.rp, seen.recs = rp, {r.request: r for r in rp.finish()}
    return seen


def test_the_replayer_runs_an_outrun_suffix_again_from_the_same_state(tiny_model, tiny_shape, monkeypatch):
    """Request 1 hits request 0's state at 130 and its suffix call is declared outrun: the
    suffix runs twice from the restored state, the store gets its state once, the check passes
    as without the second call, and the record keeps both calls' times."""
    # the second suffix call asked about: request 1's (request 0's is the first)
    seen = replay_with_an_outrun_call(tiny_model, tiny_shape, monkeypatch, "suffix", 2)
    rp, recs, runs, asked, forgotten, writes = seen.rp, seen.recs, seen.runs, seen.asked, seen.forgotten, seen.writes
    assert rp.failures == []
    r1 = recs[1]
    assert r1.validated and r1.suffix_retimed and not recs[0].suffix_retimed
    assert r1.full_ms > 0 and not r1.full_retimed  # the reference, not outrun, timed once
    assert r1.suffix_first_ms > 0 and r1.suffix_ms > 0 and r1.suffix_host_ms > 0
    assert r1.suffix_segments == [(130, 170)]  # one call's segments, not two
    assert [(h.kind, rp.clock.host_ms(h)) for h in forgotten] == [("suffix", r1.suffix_first_host_ms)]
    # the suffix [130, 170) ran twice, both times from the restored state at 130; the second
    # call hands its states to no one (a no-op sink), so checkpoint 3 was written once per layer
    suffix_runs = [x for x in runs if x[0] == 130 and x[1] == 40]
    assert [x[2] for x in suffix_runs[:2]] == [130, 130]
    assert writes.count((3, 0)) == writes.count((3, 1)) == 1
    # asked once per call: the second call is not asked again; the reference, not outrun, ran once
    assert asked == ["suffix", "suffix", "reference"]


def test_the_table_and_summary_count_the_retimed_prefills():
    spec = get_model("replay-tiny")
    recs = []
    for i, (ms, first) in enumerate(((2.0, None), (1.5, (12.0, 61.0)), (3.0, None))):
        r = RequestRecord(request=i, input_tokens=100 + i, output_tokens=5, suffix_segments=[(0, 100 + i)])
        r.timed(suffix=(ms, 4.0, 2.0), first=first)
        recs.append(r)
    from sim.cost import default_timing

    df = request_table(recs, spec, default_timing(spec.name), {"attention": 0, "gated_delta": 2, "mlp": 0})
    assert df["suffix_retimed"].tolist() == [False, True, False]
    assert df.loc[1, "suffix_first_ms"] == 12.0 and df.loc[1, "suffix_first_host_ms"] == 61.0
    assert math.isnan(df.loc[0, "suffix_first_ms"])
    s = summary(df, failures=0, store_peak_bytes=0, wall_s=1.0)
    assert s["retimed_prefills"] == 1
    # a table from before the column (a kept run re-priced): none re-timed
    old = summary(df.drop(columns=["suffix_retimed"]), failures=0, store_peak_bytes=0, wall_s=1.0)
    assert old["retimed_prefills"] == 0 and old["requests"] == 3


def test_the_time_model_line_says_how_many_prefills_were_timed_again():
    from sim.cli.replay import _error_line

    s = dict(time_model_median_error=0.063, time_model_p95_error=0.098, retimed_prefills=17)
    assert _error_line(s) == (
        "median 6.3%, P95 9.8% (17 prefills timed again: their first call's host issue outran its sleep, or the "
        "GPU stalled outside its layers)"
    )
    assert _error_line(dict(s, retimed_prefills=0)) == "median 6.3%, P95 9.8%"


# ------------------------------------------------------------- the from-scratch reference, session 20
# A reference call that outran its sleep measured the host's gap too: on the H100 campaign's
# ShareGPT runs (4 layers, short prompts) 40-51 of ~197 references were host-bound and the time
# saved measured 16-39 % over the model, against +6 / +8 % over the pairs where neither call was
# (docs/results-replay.md, session 20). It is now timed again like a suffix call.


def test_resolving_writes_the_first_reference_call_and_forgets_it():
    from sim.replay.flight import PendingTimes

    clock = SimpleNamespace(
        ms=lambda h: h[0], host_ms=lambda h: h[1], slack_ms=lambda h: h[2], sleep_ms=lambda h: 10 * h[0]
    )
    t = PendingTimes(suffix=(1.5, 6.0, 0.9), full=(2.0, 5.0, 1.0), full_first=(10.0, 64.0, -3.9))
    r = RequestRecord(request=1, input_tokens=170, output_tokens=5)
    t.resolve(r, clock)
    assert (r.full_ms, r.full_first_ms, r.full_first_host_ms) == (2.0, 10.0, 64.0)
    assert r.full_retimed and not r.suffix_retimed and t.full_first is None
    t.full_first = (1.0, 1.0, 1.0)
    t.clear()
    assert t.full_first is None


def test_the_checker_times_an_outrun_reference_again(tiny_model, tiny_shape, monkeypatch):
    """Request 1 hits request 0's state at 130; its from-scratch reference is declared outrun:
    the reference [0, 170) runs twice from nothing, the check passes as without the second call,
    the second call captures and compares nothing and hands its states to no one, the first
    call's issue leaves its sleep window, and the record keeps both calls' times."""
    seen = replay_with_an_outrun_call(tiny_model, tiny_shape, monkeypatch, "reference", 1)
    rp, recs, runs, asked, forgotten = seen.rp, seen.recs, seen.runs, seen.asked, seen.forgotten
    assert rp.failures == []
    r1 = recs[1]
    assert r1.validated and r1.full_retimed and not r1.suffix_retimed
    assert not recs[0].full_retimed and math.isnan(recs[0].full_first_ms)  # a miss has no reference
    assert r1.full_first_ms > 0 and r1.full_ms > 0 and r1.full_host_ms > 0
    assert r1.full_segments == [(0, 170)]
    assert [(h.kind, rp.clock.host_ms(h)) for h in forgotten] == [("reference", r1.full_first_host_ms)]
    refs = [x for x in runs if x[0] == 0 and x[1] == 170 and x[2] is None]
    assert seen.writes.count((3, 0)) == seen.writes.count((3, 1)) == 1  # the suffix's states, once
    assert len(refs) == 2
    # the second ran after the check (the untimed call carrying the reference's state from 128 to
    # the hit at 130 comes between them): one reference's results in memory at a time
    carry = [x for x in runs if x[0] == 128 and x[1] == 2]
    assert len(carry) == 1 and runs.index(refs[0]) < runs.index(carry[0]) < runs.index(refs[1])
    first, second = refs
    assert first[3] == second[3] == [128]  # the same boundary (the 64-multiple under the hit)
    assert "on_output" in first[5] and "on_output" not in second[5]  # the second compares nothing
    # its sink takes states and keeps none (the first call's captured the boundary state)
    assert second[4] is not first[4] and second[4](128, 0, None, None) is None
    # as the second starts, the first call's end state is gone, and so are the boundary states
    # its sink captured (the check's): one reference's results in memory at a time
    i, k = runs.index(first), runs.index(second)
    assert seen.alive[k][i] is False
    captured = [c.cell_contents for c in first[4].__closure__ if isinstance(c.cell_contents, dict)]
    assert captured == [{}]
    assert asked.count("reference") == 1  # the second call is not asked again


def test_the_table_summary_and_saved_line_count_the_retimed_references():
    from sim.cli.replay import saved_line
    from sim.cost import default_timing

    spec = get_model("replay-tiny")
    recs = []
    for i, first in enumerate((None, (10.0, 64.0), (11.0, 60.0))):
        r = RequestRecord(request=i, input_tokens=100 + i, output_tokens=5, suffix_segments=[(0, 100 + i)])
        r.timed(suffix=(1.0, 4.0, 2.0), full=(2.0, 4.0, 2.0), full_first=first)
        recs.append(r)
    df = request_table(recs, spec, default_timing(spec.name), {"attention": 0, "gated_delta": 2, "mlp": 0})
    assert df["full_retimed"].tolist() == [False, True, True]
    assert df.loc[2, "full_first_ms"] == 11.0 and df.loc[2, "full_first_host_ms"] == 60.0
    s = summary(df, failures=0, store_peak_bytes=0, wall_s=1.0)
    assert (s["retimed_references"], s["retimed_prefills"]) == (2, 0)
    old = summary(df.drop(columns=["full_retimed"]), failures=0, store_peak_bytes=0, wall_s=1.0)
    assert old["retimed_references"] == 0
    line = dict(measured_ms_saved_validated=2.0, modelled_ms_saved_validated=1.5, retimed_references=2)
    assert saved_line(line) == (
        "measured 2.0 ms, modelled 1.5 ms (2 from-scratch references timed again: their first call's host "
        "issue outran its sleep, or the GPU stalled outside its layers)"
    )
    assert saved_line(dict(line, retimed_references=0)) == "measured 2.0 ms, modelled 1.5 ms"


def test_a_saving_under_a_twentieth_of_a_millisecond_keeps_its_digits():
    """A hit the model prices 6 microseconds dearer than the full prefill (replay-tiny's 2 layers,
    a 1,024-token hit of 1,100) printed 'modelled -0.0 ms': a negative zero."""
    from sim.cli.replay import saved_line

    line = {"measured_ms_saved_validated": 7.5, "modelled_ms_saved_validated": -0.00588}
    assert saved_line(line) == "measured 7.5 ms, modelled -0.0059 ms"
    assert saved_line(dict(line, modelled_ms_saved_validated=0.0)) == "measured 7.5 ms, modelled 0.0 ms"
    assert saved_line(dict(line, modelled_ms_saved_validated=0.05)) == "measured 7.5 ms, modelled 0.1 ms"


# ------------------------------------------------------------------ a stall outside the layers, session 30
# One reference on session 30's H100 matrix rows (qwen3.5-35b-a3b, Mooncake, fcfs; request 28, 7,238 tokens) took
# 288.6 ms, 275 ms of it outside every layer's mark, its host issue (5.1 ms) under its sleep (7.6 ms): not outrun,
# so kept, and its row's time saved was measured 12x the model's. Such a call is now timed again too.


@pytest.mark.parametrize(
    "call, marked, stalled",
    [
        (288.6, 13.4, True),  # the H100 reference
        (527.6, 525.0, False),  # the rows' largest time outside the marks otherwise: 2.6 ms
        (30.0, 9.0, True),  # 21 ms outside, 70 % of the call
        (50.0, 29.0, False),  # 21 ms outside, 42 %: under half
        (50.0, 25.0, False),  # 25 ms outside, exactly half: not over STALL_SHARE
        (50.0, 24.5, True),
        (20.0, 0.0, False),  # 20 ms outside: not over STALL_MS
        (20.5, 0.0, True),
        (8.0, 1.0, False),  # most of a short call, but 7 ms
        (math.nan, 1.0, False),
    ],
)
def test_a_call_that_stalled_outside_its_layers_is_run_again(call, marked, stalled):
    assert stalled_outside(call, marked) is stalled


class _Event:
    """A CUDA event's stand-in: ``elapsed_time`` from its own ms stamp; ``synchronize`` counted."""

    def __init__(self, at: float, synced: list):
        self.at, self.synced = at, synced

    def elapsed_time(self, other) -> float:
        return other.at - self.at

    def synchronize(self) -> None:
        self.synced.append(self.at)


def test_the_stopwatch_asks_queued_calls_only_from_their_events_and_marks():
    """``Stopwatch.stalled``: a queued call's device time from its two events (the end event
    synchronised first) against its marks' sum, the hit check's bucket included; never for an
    unqueued call (the CPU's: ``before`` None), nor without a handle or marks; the sleep's rate is
    not refined by it (``ms`` does that, once)."""
    clock = Stopwatch(torch.device("cpu"))
    synced: list = []
    h = Timed(_Event(100.0, synced), _Event(388.6, synced), 5.1, object(), "reference", 1, 7.6, 1000)
    marks = SimpleNamespace(ms_by_type=lambda: {"attention": 3.3, "gated_delta": 6.1, "mlp": 3.5, "check": 0.5})
    observed = []
    clock.rate.observe = lambda *a: observed.append(a)
    assert clock.stalled(h, marks) is True and synced == [388.6] and observed == []
    busy = SimpleNamespace(ms_by_type=lambda: {"gated_delta": 200.0, "mlp": 70.0, "check": 10.0})
    assert clock.stalled(h, busy) is False  # 8.6 ms outside
    assert clock.stalled(h._replace(before=None), marks) is False  # unqueued
    assert clock.stalled(None, marks) is False and clock.stalled(h, None) is False


def test_the_checker_times_a_stalled_reference_again(tiny_model, tiny_shape, monkeypatch):
    """Request 1's reference is declared stalled once its check has run: it runs a second time,
    comparing and capturing nothing, after the check's untimed carry; the record keeps both
    calls' times; asked with the reference's own marks, and about the suffix after the check."""
    seen = replay_with_an_outrun_call(tiny_model, tiny_shape, monkeypatch, "reference", 1, rule="stalled")
    rp, recs, runs = seen.rp, seen.recs, seen.runs
    assert rp.failures == []
    r1 = recs[1]
    assert r1.validated and r1.full_retimed and not r1.suffix_retimed and not recs[0].full_retimed
    assert r1.full_first_ms > 0 and r1.full_ms > 0
    refs = [x for x in runs if x[0] == 0 and x[1] == 170 and x[2] is None]
    carry = [x for x in runs if x[0] == 128 and x[1] == 2]
    assert len(refs) == 2 and runs.index(refs[0]) < runs.index(carry[0]) < runs.index(refs[1])
    assert "on_output" in refs[0][5] and "on_output" not in refs[1][5]
    # asked once each: the reference (in the check), then the suffix (after the check); the miss
    # (request 0, no check) never
    assert seen.asked == ["reference", "suffix"]
    assert all(m is not None and m.labels for m in seen.marks)
    assert [(h.kind, rp.clock.host_ms(h)) for h in seen.forgotten] == [("reference", r1.full_first_host_ms)]


def test_the_replayer_times_a_stalled_suffix_again_after_its_check(tiny_model, tiny_shape, monkeypatch):
    """Request 1's suffix prefill is declared stalled: asked after the hit's check (the reference
    ran), it runs once more from the restored state at the hit with the same boundaries, hands its
    states to no one, and the record keeps both calls' times."""
    seen = replay_with_an_outrun_call(tiny_model, tiny_shape, monkeypatch, "suffix", 1, rule="stalled")
    rp, recs, runs, writes = seen.rp, seen.recs, seen.runs, seen.writes
    assert rp.failures == []
    r1 = recs[1]
    assert r1.validated and r1.suffix_retimed and not r1.full_retimed
    assert r1.suffix_first_ms > 0 and r1.suffix_ms > 0 and r1.suffix_segments == [(130, 170)]
    suffix_runs = [x for x in runs if x[0] == 130 and x[1] == 40]
    ref = next(x for x in runs if x[0] == 0 and x[1] == 170)
    assert [x[2] for x in suffix_runs] == [130, 130]
    assert runs.index(suffix_runs[0]) < runs.index(ref) < runs.index(suffix_runs[1])  # after the check
    assert suffix_runs[0][3] == suffix_runs[1][3]  # the same boundaries
    assert suffix_runs[1][4] is not suffix_runs[0][4] and suffix_runs[1][4](150, 0, None, None) is None
    assert writes.count((3, 0)) == writes.count((3, 1)) == 1
    assert seen.asked == ["reference", "suffix"]  # the second call is not asked again


def test_a_batched_replay_asks_no_suffix_about_a_stall(tiny_model, tiny_shape, monkeypatch):
    """Batched replay queues a hit's check (``BatchedReplay.queue_check``), so a request run alone
    there (a state wanted off the 64-token grid: not batchable) is not asked after its suffix
    call, which would wait for the GPU."""
    asked = []
    monkeypatch.setattr(Stopwatch, "stalled", lambda self, h, marks: asked.append(h.kind) or False)
    store = CheckpointStore(tiny_shape, torch.float32, device="cpu")
    rp = Replayer(tiny_model, store, lambda r: REQS[r], batch=2, eager=False)
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 100)
    rp.decode(0)
    rp.admit(1, 0, 100, "prompt end")
    rp.lookup(1, 1, 100)
    rp.prefill(1, 100, 170)
    rp.decode(1)
    rp.admit(2, 1, 150, "off the grid")  # not batchable: request 1 runs alone
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and recs[1].validated
    # request 0 in a batch, request 1 alone (its timed call in the log), the check's reference batched
    assert [c.kind for c in rp.batch_log] == ["suffix", "single", "reference"]
    assert asked == []  # its check ran queued, its reference in a batch: nothing to ask about
