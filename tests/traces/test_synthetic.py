from collections import Counter

import numpy as np
import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


@pytest.mark.parametrize(
    "kind, sessions, requests",
    [
        ("system-prompt", 100, 100),
        ("few-shot", 100, 100),
        ("chat", 100, 800),
        ("agent", 100, 3000),
    ],
)
def test_kinds_default_sizes(kind, sessions, requests):
    tr = load_trace(f"synthetic:{kind}", TraceOptions())
    assert tr.n_sessions == sessions and len(tr.requests) == requests and tr.closed_loop


def test_parameters_and_seed():
    tr = load_trace("synthetic:chat:sessions=5,turns=3,prompts=1,prompt_tokens=100,think=2", TraceOptions(seed=7))
    assert tr.n_sessions == 5 and len(tr.requests) == 15
    first = [s[0].input_tokens[:100] for s in tr.sessions().values()]
    assert all(np.array_equal(first[0], f) for f in first)  # one shared system prompt
    for reqs in tr.sessions().values():
        assert reqs[0].think_time == 0.0
        for a, b in zip(reqs, reqs[1:]):
            n = len(a.input_tokens)
            assert np.array_equal(b.input_tokens[:n], a.input_tokens)
            assert np.array_equal(b.input_tokens[n : n + len(a.output_tokens)], a.output_tokens)
    same = load_trace("synthetic:chat:sessions=5,turns=3,prompts=1,prompt_tokens=100,think=2", TraceOptions(seed=7))
    other = load_trace("synthetic:chat:sessions=5,turns=3,prompts=1,prompt_tokens=100,think=2", TraceOptions(seed=8))
    assert all(
        np.array_equal(a.input_tokens, b.input_tokens) and a.think_time == b.think_time
        for a, b in zip(tr.requests, same.requests)
    )
    assert not np.array_equal(tr.requests[-1].input_tokens, other.requests[-1].input_tokens)


@pytest.mark.parametrize("prompts", [1, 2, 4])
def test_system_prompt_sharing(prompts):
    tr = load_trace(
        f"synthetic:system-prompt:sessions=40,prompts={prompts},prompt_tokens=50,user_tokens=20", TraceOptions()
    )
    heads = Counter(tuple(r.input_tokens[:50].tolist()) for r in tr.requests)
    assert len(heads) == prompts  # every prompt is drawn (40 sessions), no other head appears
    assert min(heads.values()) >= 2  # and each is shared
    # after its prompt, every session's user message is its own
    assert len({tuple(r.input_tokens[50:].tolist()) for r in tr.requests}) == len(tr.requests)


def _agent_thinks(response_time: float, seed: int = 0) -> list[list[float]]:
    tr = load_trace("synthetic:agent:sessions=20,turns=30", TraceOptions(response_time=response_time, seed=seed))
    return [[r.think_time for r in turns] for turns in tr.sessions().values()]


@pytest.mark.parametrize("mean", [10.0, 3.0])
def test_agent_think_times_are_poisson_with_the_response_time_as_mean(mean):
    sessions = _agent_thinks(mean)
    assert len(sessions) == 20 and all(len(s) == 30 for s in sessions)
    assert all(s[0] == 0.0 for s in sessions)  # a session starts at once
    draws = np.array([t for s in sessions for t in s[1:]])  # 580 draws
    assert np.all(draws >= 0) and np.all(draws == np.round(draws))
    # Poisson: mean = variance = the response time. Over 580 draws one standard error is
    # sqrt(mean / 580) for the mean and ~sqrt((mean + 3 mean^2) / 580) for the variance: allow 5
    assert abs(draws.mean() - mean) < 5 * np.sqrt(mean / 580)
    assert abs(draws.var(ddof=1) - mean) < 5 * np.sqrt((mean + 3 * mean**2) / 580)
    assert len(np.unique(draws)) > 5  # not a constant


def test_agent_think_times_follow_the_seed():
    assert _agent_thinks(10.0, seed=1) == _agent_thinks(10.0, seed=1)
    assert _agent_thinks(10.0, seed=1) != _agent_thinks(10.0, seed=2)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("synthetic:nope", "unknown synthetic kind 'nope'"),
        ("synthetic:chat:turns", "bad parameter 'turns'"),
        ("synthetic:chat:colour=3", r"bad parameter 'colour=3' \(valid: output_tokens"),
        ("synthetic:chat:turns=x", "turns must be a number"),
        ("synthetic:chat:turns=-1", r"turns must be >= 1 \(got -1\)"),
        ("synthetic:chat:sessions=0", "sessions must be >= 1"),
        ("synthetic:chat:turns=nan", "turns must be a finite number"),
        ("synthetic:chat:think=inf", "think must be a finite number"),
        ("synthetic:chat:vocab=1e30", r"vocab must be <= 2\^31"),
        # chat: 10^12 prompt + 8 turns of at most 226 + 451 tokens
        (
            "synthetic:chat:prompt_tokens=1e12",
            "a request can reach 1,000,000,005,416 tokens, more than the limit of 10,000,000",
        ),
        ("synthetic:system-prompt:sessions=1e12", r"1,000,000,000,000 sessions need up to [\d,.]+ GB, more than the"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(TraceError, match=message):
        load_trace(spec, TraceOptions())
