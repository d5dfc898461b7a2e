"""``Seq.due``: the boundaries whose state block is freed at a step's end, found through the
``free_by_time`` index instead of a scan over every boundary of ``free_at`` (the scan ran for each
running request at every step, so its cost grew with the request's length)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.batching import Seq
from traces.base import Request

_TIMES = st.sampled_from([0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.25])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 12), _TIMES),
        st.tuples(st.just("due"), _TIMES, _TIMES),
        st.tuples(st.just("preempt"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


def _seq() -> Seq:
    r = Request(session_id=0, turn=0, input_tokens=np.arange(4), output_tokens=np.arange(2), request_id=0)
    return Seq(r, None, 4, 2)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_due_is_the_scan_of_free_at(ops):
    """Against the scan it replaces (``[p for p, v in free_at.items() if v == now]``), the caller
    setting each due boundary to a new time as ``_states_freed`` does."""
    s = _seq()
    for op, a, b in ops:
        if op == "set":
            s.set_free_at(a, b)
        elif op == "preempt":
            s.preempt()
        else:
            scan = {p for p, v in s.free_at.items() if v == a}
            due = s.due(a)
            assert len(due) == len(set(due))
            assert set(due) == scan
            for p in due:
                s.set_free_at(p, b)


def test_due_hand_checked():
    s = _seq()
    for p, t in ((16, 1.0), (32, 1.0), (48, 2.0), (32, 2.0)):
        s.set_free_at(p, t)
    assert s.due(1.0) == [16]  # 32 moved to 2.0 since
    s.set_free_at(16, 5.0)
    assert sorted(s.due(2.0)) == [32, 48]
    s.preempt()
    assert s.due(5.0) == [] and s.free_at == {}


def test_a_preempted_request_keeps_no_index_entries():
    """A preempted request starts over: its ``free_at`` and the index of it are both empty (an
    index kept across the preemption would only be filtered out by ``due``, but it holds memory for
    every boundary of the run before; mutation run, session 24: the index's reset survived)."""
    s = _seq()
    for p in range(8):
        s.set_free_at(p, 1.0 + p)
    s.preempt()
    assert s.free_at == {} and s.free_by_time == {}
    assert s.due(1.0) == []
