"""A synthetic spec that names a parameter twice (session 24's new-user hunt): the last value won
without a word."""

import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace
from traces.synthetic import parse_spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("chat:turns=3,turns=4", "synthetic:chat: turns is given twice ('turns=4' after turns=3): give it once"),
        ("chat:think=2.5,think=3", "synthetic:chat: think is given twice ('think=3' after think=2.5): give it once"),
        (
            "agent:obs-tokens=10,obs_tokens=20",
            "synthetic:agent: obs_tokens is given twice ('obs_tokens=20' after obs_tokens=10): give it once",
        ),
    ],
)
def test_parameter_given_twice(spec, message):
    with pytest.raises(TraceError) as err:
        parse_spec(spec)
    assert str(err.value) == message
    with pytest.raises(TraceError):
        load_trace(f"synthetic:{spec}", TraceOptions())


def test_each_parameter_once_still_reads():
    assert parse_spec("chat:turns=3,prompts=2,think=1.5") == ("chat", {"turns": 3, "prompts": 2, "think": 1.5})
    trace = load_trace("synthetic:chat:turns=3,sessions=4", TraceOptions())
    assert trace.n_sessions == 4 and len(trace.requests) == 12
