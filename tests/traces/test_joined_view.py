"""``traces.base.joined``: a request's prompt and reply that meet in the trace's buffer come back as a
read-only slice of that buffer, holding no wrapper object of its own (``as_strided`` left one per
call, ~0.7 KB each that the miss ledger kept for every request: more than a copy of a short
hash-block row), and equal to the concatenation in every case."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.base import joined


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.integers(0, 10), st.integers(0, 10), st.integers(0, 3))
def test_joined_is_the_concatenation(start, n_a, n_b, gap):
    buf = np.arange(60, dtype=np.int32)
    a = buf[start : start + n_a]
    b = buf[start + n_a + gap : start + n_a + gap + n_b]
    out = joined(a, b)
    assert out.tolist() == np.concatenate((a, b)).tolist()
    assert out.dtype == a.dtype


def test_adjacent_halves_give_a_slice_of_the_buffer():
    buf = np.arange(20, dtype=np.int64)
    out = joined(buf[3:8], buf[8:12])
    assert out.tolist() == list(range(3, 12))
    assert out.base is buf  # a plain slice: no per-call wrapper
    assert not out.flags.writeable
    assert buf.flags.writeable  # the trace's buffer itself is untouched


def test_halves_apart_are_copied():
    buf = np.arange(20, dtype=np.int64)
    out = joined(buf[3:8], buf[9:12])
    assert out.tolist() == [3, 4, 5, 6, 7, 9, 10, 11]
    assert not np.shares_memory(out, buf)
