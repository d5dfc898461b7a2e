"""benchmarks/replay_stall_probe.py's bookkeeping (its figures need a GPU): which profile events
fill the launch queue, how they are counted per timed call, how a launch-counting run is joined to
a timing run, and where a call's request and tokens are read from. The script's smoke run is in
tests/test_benchmarks.py."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import replay_stall_probe as probe  # noqa: E402


def ev(name, start, end=None):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=start if end is None else end))


def test_what_fills_the_launch_queue():
    kinds = {
        n: probe.launch_kind(n)
        for n in (
            "cudaLaunchKernel",
            "cudaLaunchKernelExC",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cudaMemcpyAsync",
            "cudaMemsetAsync",
            "cudaMemcpy",
            "cudaEventRecord",
            "cudaEventSynchronize",
            "aten::mm",
            "cudaMalloc",
        )
    }
    assert kinds == {
        "cudaLaunchKernel": "kernel",
        "cudaLaunchKernelExC": "kernel",
        "cuLaunchKernel": "kernel",
        "cuLaunchKernelEx": "kernel",
        "cudaMemcpyAsync": "copy",
        "cudaMemsetAsync": "copy",
        "cudaMemcpy": None,  # synchronous: the sync probe's business, not a queue entry
        "cudaEventRecord": "event",
        "cudaEventSynchronize": None,
        "aten::mm": None,
        "cudaMalloc": None,
    }


def test_launches_are_counted_inside_each_calls_range():
    assert probe.count_in_ranges([(0, 10), (5, 6), (20, 30)], [1, 5, 6, 6, 11, 30]) == [4, 3, 1]
    events = [
        ev(probe.RANGE + "0", 100, 200),
        ev("cudaLaunchKernel", 110),
        ev("aten::mm", 111),
        ev("cuLaunchKernel", 150),  # a Triton launch
        ev("cudaMemcpyAsync", 160),
        ev("cudaEventRecord", 199),
        ev("cudaLaunchKernel", 250),  # between the calls: nobody's
        ev(probe.RANGE + "1", 300, 400),
        ev("cudaLaunchKernel", 300),
    ]
    # call 2 has no range (a profile that lost it): -1, never a count of 0 that looks measured
    assert probe.launches_per_call(events, 3) == ([4, 1, -1], [2, 1, -1])


def test_ranges_of_a_real_profile_are_found():
    """On the CPU a profile holds the ranges (and no launches): every call counted, 0 each."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(3):
            with torch.profiler.record_function(f"{probe.RANGE}{i}"):
                torch.ones(8) @ torch.ones(8)
    assert probe.launches_per_call(prof.events(), 3) == ([0, 0, 0], [0, 0, 0])


def row(**kw):
    base = dict(caller="sim/replay/runner.py:377", call_kind="suffix", segments=1, request=4, start=130, tokens=40)
    return {**base, "launches": "", "kernel_launches": "", **kw}


def test_a_launch_count_is_joined_to_the_same_call_of_the_timing_run():
    timing = [
        {k: str(v) for k, v in row(host_ms=9.1).items()},  # as read back from its CSV
        {k: str(v) for k, v in row(call_kind="reference", start=0, tokens=170, host_ms=12.0).items()},
    ]
    counted = [row(host_ms=30.0, launches=212, kernel_launches=150), row(call_kind="reference", start=0, tokens=170)]
    joined = probe.join(timing, counted)
    assert [r["host_ms"] for r in joined] == ["9.1", "12.0"]  # the timing run's times
    assert [r["launches"] for r in joined] == [212, ""] and joined[0]["kernel_launches"] == 150
    assert probe.join(timing, counted[:1]) is None
    assert probe.join(timing, [row(segments=2), counted[1]]) is None  # another call: not joined


def test_a_calls_request_and_tokens_come_from_its_flight():
    f = SimpleNamespace(rid=7, pos=130, n_in=170)
    assert probe.where("suffix", {"f": f, "end1": 170}) == {"request": 7, "start": 130, "tokens": 40}
    assert probe.where("tail", {"f": f, "upto": 182}) == {"request": 7, "start": 130, "tokens": 52}
    assert probe.where("reference", {"f": f}) == {"request": 7, "start": 0, "tokens": 170}
    assert probe.where("batch", {"jobs": []}) == {"request": "", "start": "", "tokens": ""}
