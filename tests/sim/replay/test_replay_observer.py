"""``ReplayObserver``'s progress: each request counted once, at its end (its decode, or its
rejection), a request looked up again said beside the bar, and the last lookup kept for an
error's line (``sim.replay.pipeline.execute``)."""

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from sim.replay.observer import ReplayObserver  # noqa: E402


class _Replayer:
    """What the observer calls on a replayer, recorded; its records count each request's lookups
    (``Replayer._flight``: a new lookup's record carries the old one's count on)."""

    def __init__(self):
        self.calls = []
        self.eager = False
        self.records = {}

    def lookup(self, rid, *a):
        old = self.records.get(rid)
        self.records[rid] = SimpleNamespace(lookups=1 + (old.lookups if old else 0))
        self.calls.append(("lookup", rid, *a))

    def __getattr__(self, name):
        return lambda *a: self.calls.append((name, *a))


class _Bar:
    def __init__(self):
        self.n, self.postfix = 0, ""

    def update(self, k):
        self.n += k

    def set_postfix_str(self, s, refresh=True):
        self.postfix = s


def test_each_request_is_counted_once_at_its_end():
    bar, rp = _Bar(), _Replayer()
    obs = ReplayObserver(rp, mode="des", progress=bar)
    req = {i: SimpleNamespace(request_id=i) for i in range(3)}
    obs.lookup(req[0], 0.0, -1, 0, 100)
    obs.lookup(req[1], 0.0, -1, 0, 250)
    assert bar.n == 0 and obs.last_lookup == (1, 250)
    obs.reject(req[1], 1.0, "too long")  # a rejected request ends too
    assert bar.n == 1
    obs.lookup(req[0], 2.0, -1, 0, 100)  # preempted, looked up again
    assert bar.postfix == "1 lookups again (preempted)" and obs.looked_up_again == 1 and bar.n == 1
    obs.decode(req[0], 3.0, 3.0, 100, 110, 0.0)
    obs.decode(req[0], 3.0, 3.0, 100, 110, 0.0)  # an end said twice counts once
    obs.reject(req[1], 4.0, "again")
    assert bar.n == 2 and obs.last_lookup == (0, 100)
    assert ("reject", 1) in rp.calls and ("decode", 0) in rp.calls
    ReplayObserver(rp, mode="des").decode(req[2], 0.0, 0.0, 0, 1, 0.0)  # no bar: nothing to count
