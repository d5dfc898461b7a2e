"""The metrics recorder: the occupancy series keeps a uniform stride and its span when it halves."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import SimConfig
from sim.engine import metrics
from sim.simulate import build
from traces.base import Request, Trace


@pytest.mark.parametrize("samples", [10, 4 * 2000, 9 * 2000 + 7])
def test_occupancy_series_keeps_every_stride_th_sample(samples):
    sim = build(Trace("one", [Request(0, 0, np.arange(10), np.arange(10, 12))]), SimConfig())
    for k in range(samples):
        sim.rec.occupancy(float(k), 10 * k, 20 * k)
    occ = sim.rec.result(sim.trace, sim.tree, "marconi").occupancy
    t = occ["t_s"].to_numpy()
    stride = 1
    while samples > (2 * metrics._OCCUPANCY_POINTS - 1) * stride:  # halvings so far
        stride *= 2
    assert t[0] == 0 and np.all(np.diff(t) == stride)  # uniform: samples 0, s, 2s, ...
    assert t[-1] > samples - 1 - stride  # the span reaches the last stride
    assert len(t) < 2 * metrics._OCCUPANCY_POINTS
    assert list(occ["kv_bytes"]) == list(10 * t) and list(occ["state_bytes"]) == list(20 * t)


def test_summary_from_hand_fed_events_counts_a_one_token_hit_as_a_request_hit():
    """Three requests of 10 prompt tokens hitting 0, 1 and 5 tokens: two of three reused at least
    one cached token (a single token counts), 6 of 30 tokens hit (FLOPs saved over the prompts'
    FLOPs: the saved fraction); queueing is prefill start minus
    arrival; TTFT percentiles cover finished requests only; final bytes are count x size."""
    from types import SimpleNamespace

    from sim.cost import get_model
    from sim.engine.metrics import Recorder

    spec = get_model("marconi-7b")
    reqs = [Request(s, 0, np.arange(10), np.arange(2), request_id=s) for s in range(3)]
    rec = Recorder(3, spec)
    for r, hit, cp in zip(reqs, (0, 1, 5), (None, 4, 9)):
        t = float(r.request_id)
        rec.lookup(r, t, cp, hit, 10)
        rec.prefill(r, t + 0.5, t + 0.75, hit, 10, 0.25)
        if r.request_id < 2:  # the third never finishes decoding
            rec.decode(r, t + 0.75, t + 1.0, 10, 12, 0.25)
    stats = SimpleNamespace(
        evictions=4,
        states_admitted=6,
        states_evicted=3,
        kv_tokens_evicted=12,
        rejected_inserts=1,
        peak_bytes=99,
        overshoots=0,
    )
    tree = SimpleNamespace(stats=stats, kv_tokens=7, kv_bytes_per_token=3, n_states=2, state_bytes=5)
    res = rec.result(SimpleNamespace(requests=reqs), tree, "p")
    s = res.summary
    assert s["request_hit_rate"] == pytest.approx(2 / 3)
    assert s["token_hit_rate"] == pytest.approx(6 / 30) and s["hit_tokens"] == 6 and s["input_tokens"] == 30
    assert s["checkpoints_hit"] == 2 and s["checkpoints_admitted"] == 6 and s["checkpoints_evicted"] == 3
    assert s["flops_saved"] == pytest.approx(spec.flops(1) + spec.flops(5))
    assert s["flops_saved_frac"] == pytest.approx((spec.flops(1) + spec.flops(5)) / (3 * spec.flops(10)))
    assert s["ttft_p50_ms"] == pytest.approx(750.0) and s["ttft_mean_ms"] == pytest.approx(750.0)
    assert (s["final_kv_bytes"], s["final_state_bytes"]) == (21, 10)
    assert (s["evictions"], s["kv_tokens_evicted"], s["rejected_inserts"], s["peak_bytes"]) == (4, 12, 1, 99)
    assert list(res.requests["queue_s"]) == [0.5, 0.5, 0.5]
    assert list(res.requests["hit_tokens"]) == [0, 1, 5] and list(res.requests["state_hit"]) == [False, True, True]
    assert list(res.requests["arrival_s"]) == [0.0, 1.0, 2.0]


def test_tpot_and_step_histograms_from_hand_fed_events():
    """TPOT is (last token - first token) / (output tokens - 1), NaN for a one-token output and
    left out of its percentiles; step events add ``steps`` to their batch-size and token-count
    bins, and a histogram's percentile is the smallest value whose cumulative share reaches it.
    r0: first token at 1.0 s, 5 output tokens by 2.0 s -> 250 ms per token; r1: one token.
    Steps: 2 x (1 request, 100 tokens), 1 x (2 requests, 2 tokens, one preempted), 1 x (2
    requests, 100 tokens): batch sizes {1: 2, 2: 2}, tokens {100: 3, 2: 1}."""
    from types import SimpleNamespace

    from sim.cost import get_model
    from sim.engine.metrics import Recorder

    reqs = [Request(s, 0, np.arange(10), np.arange(5), request_id=s) for s in range(2)]
    rec = Recorder(2, get_model("marconi-7b"))
    rec.lookup(reqs[0], 0.0, None, 0, 10)
    rec.prefill(reqs[0], 0.5, 1.0, 0, 10, 0.5)
    rec.decode(reqs[0], 1.0, 2.0, 10, 15, 1.0)
    rec.lookup(reqs[1], 1.0, None, 0, 10)
    rec.prefill(reqs[1], 1.5, 2.0, 0, 10, 0.5)
    rec.decode(reqs[1], 2.0, 2.1, 10, 11, 0.1)
    rec.step(0.0, 1.0, 1.0, 2, ["a"], [], 100, [])
    rec.step(1.0, 1.5, 0.5, 1, [], ["a", "b"], 2, ["b"])
    rec.step(1.5, 2.0, 0.5, 1, ["a"], ["b"], 100, [])
    assert rec.batch_hist == {1: 2, 2: 2} and rec.token_hist == {100: 3, 2: 1}
    stats = SimpleNamespace(
        evictions=0,
        states_admitted=0,
        states_evicted=0,
        kv_tokens_evicted=0,
        rejected_inserts=0,
        peak_bytes=0,
        overshoots=0,
    )
    tree = SimpleNamespace(stats=stats, kv_tokens=0, kv_bytes_per_token=1, n_states=0, state_bytes=1)
    res = rec.result(SimpleNamespace(requests=reqs), tree, "p")
    tpot = res.requests["tpot_s"].to_numpy()
    assert tpot[0] == pytest.approx(0.25) and np.isnan(tpot[1])
    assert list(res.requests["output_tokens"]) == [5, 1]
    s = res.summary
    assert s["tpot_p50_ms"] == pytest.approx(250.0) and s["tpot_p95_ms"] == pytest.approx(250.0)
    assert s["e2e_p50_ms"] == pytest.approx(1550.0)  # 2.0 s and 1.1 s
    assert s["output_tokens_per_s"] == pytest.approx(6 / 2.1)
    assert (s["steps"], s["preemptions"]) == (4, 1)
    assert (s["batch_size_mean"], s["batch_size_p50"], s["batch_size_p95"], s["batch_size_max"]) == (1.5, 1.0, 2.0, 2)
    assert (s["step_tokens_mean"], s["step_tokens_p50"], s["step_tokens_max"]) == (75.5, 100.0, 100)


def test_histogram_percentiles_on_a_skewed_histogram():
    """{1: 3, 4: 1}: three quarters of the weight at 1, so p50 = 1 while p95 and the max are 4;
    the mean weighs each value by its count (7 / 4)."""
    assert metrics._hist_stats("x", {4: 1, 1: 3}) == {"x_mean": 1.75, "x_p50": 1.0, "x_p95": 4.0, "x_max": 4}
    assert metrics._hist_stats("x", {}) == {"x_mean": 0.0, "x_p50": 0.0, "x_p95": 0.0, "x_max": 0}


def test_latency_percentiles_without_values_are_none():
    """A percentile over no values is None (the tables' "-"; it was 0.0, which read as instant
    decoding): one finished request with a single output token has no TPOT, while its end-to-end
    latency (1.5 s) and queueing (0.5 s) are counted."""
    from types import SimpleNamespace

    from sim.cost import get_model
    from sim.engine.metrics import Recorder

    r = Request(0, 0, np.arange(10), np.arange(1), request_id=0)
    rec = Recorder(1, get_model("marconi-7b"))
    rec.lookup(r, 0.0, None, 0, 10)
    rec.prefill(r, 0.5, 1.0, 0, 10, 0.5)
    rec.decode(r, 1.0, 1.5, 10, 11, 0.5)
    stats = SimpleNamespace(
        evictions=0,
        states_admitted=0,
        states_evicted=0,
        kv_tokens_evicted=0,
        rejected_inserts=0,
        peak_bytes=0,
        overshoots=0,
    )
    tree = SimpleNamespace(stats=stats, kv_tokens=0, kv_bytes_per_token=1, n_states=0, state_bytes=1)
    s = rec.result(SimpleNamespace(requests=[r]), tree, "p").summary
    assert (s["tpot_p50_ms"], s["tpot_p95_ms"]) == (None, None)
    assert s["e2e_p50_ms"] == pytest.approx(1500.0) and s["queue_p95_ms"] == pytest.approx(500.0)
    assert (s["steps"], s["batch_size_p50"], s["step_tokens_max"]) == (0, 0.0, 0)
