import numpy as np
import pytest

from traces.arrivals import poisson_response_times, sequential_timestamps, session_starts
from traces.base import Request, Trace, TraceError


def test_session_starts():
    assert session_starts(4, 2.0).tolist() == [0.0, 0.5, 1.0, 1.5]
    p = session_starts(1000, 4.0, poisson=True, seed=3)
    assert p[0] == 0.0 and (np.diff(p) > 0).all()
    assert p[-1] / 999 == pytest.approx(0.25, rel=0.1)
    assert np.array_equal(p, session_starts(1000, 4.0, poisson=True, seed=3))
    assert not np.array_equal(p, session_starts(1000, 4.0, poisson=True, seed=4))
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(TraceError, match=r"rate must be a finite number > 0 \(got "):
            session_starts(3, bad)
    with pytest.raises(TraceError, match=r"seed must be >= 0 \(got -1\)"):
        session_starts(3, 1.0, poisson=True, seed=-1)


def test_poisson_response_times_match_paper_draw():
    np.random.seed(42)
    paper = [np.random.poisson(lam=7.5) for _ in range(20)]
    assert poisson_response_times(20, 7.5).tolist() == paper
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(TraceError, match="mean response time must be a finite number >= 0"):
            poisson_response_times(3, bad)


def test_sequential_timestamps():
    def req(sid, turn, think):
        return Request(sid, turn, np.array([1]), np.array([2]), think_time=think)

    tr = Trace("t", [req(5, 0, 0.0), req(5, 1, 3.0), req(9, 0, 0.0), req(5, 2, 1.5), req(9, 1, 2.0)])
    ts = sequential_timestamps(tr, rate=0.5)
    assert ts.tolist() == [0.0, 3.0, 2.0, 4.5, 4.0]
    op = Trace("o", [Request(0, 0, np.array([1]), np.array([2]), arrival=7.0)], closed_loop=False)
    assert sequential_timestamps(op).tolist() == [7.0]
