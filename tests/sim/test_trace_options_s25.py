"""``sim.trace_options.options_from_kwargs`` (session 25's mutation run on the CLI's trace options:
the default pop, a missing spec and the seed, each on a hand-made kwargs dict)."""

from __future__ import annotations

import pytest

from sim.errors import UsageError
from sim.trace_options import TRACE_OPTION_KEYS, options_from_kwargs
from traces.registry import TraceOptions


def test_pops_the_trace_options_by_default_and_keeps_the_rest():
    """trace_options.py:88 (``pop=False`` by default): run's kwargs kept --trace and the others."""
    kwargs = {"trace": "mooncake:sample", "sessions": 3, "trace_seed": 4, "policy": "vllm+", "out": None}
    spec, opts = options_from_kwargs(kwargs)
    assert kwargs == {"policy": "vllm+", "out": None}
    assert spec == "mooncake:sample" and opts.sessions == 3 and opts.seed == 4
    kept = {"trace": "lmsys", "sessions": 2}
    assert options_from_kwargs(kept, pop=False)[0] == "lmsys" and kept == {"trace": "lmsys", "sessions": 2}


def test_a_row_without_trace_options_is_the_default_trace_and_options():
    """trace_options.py:95-99 (the spec left None; the seed set from None, or not set): a sweep row
    or an advise problem without a trace axis is sharegpt with TraceOptions' defaults."""
    spec, opts = options_from_kwargs({})
    assert spec == "sharegpt" and opts == TraceOptions()
    spec, opts = options_from_kwargs(dict.fromkeys(TRACE_OPTION_KEYS))
    assert spec == "sharegpt" and opts == TraceOptions()
    spec, opts = options_from_kwargs({"trace": "synthetic:chat", "trace_seed": 0, "time_scale": 2.0})
    assert spec == "synthetic:chat" and opts.seed == 0 and opts.time_scale == 2.0
    spec, opts = options_from_kwargs({"trace_seed": 9})
    assert spec == "sharegpt" and opts.seed == 9


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_trace_is_refused(spec):
    with pytest.raises(UsageError, match=r"^--trace is empty: give a trace spec"):
        options_from_kwargs({"trace": spec})
