"""The typed run summary (``RunSummary``): its fields are the keys of the dict the simulator
reported before it had a type, in the same order, for every scheduler and tuner; ``to_dict()``
is that dict; old dict-style reads still work."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from sim.config import SimConfig
from sim.cost import get_model
from sim.engine.metrics import DuelTuning, OracleTuning, Recorder, ReplayTuning, RunSummary
from sim.engine.misses import CAUSES
from sim.simulate import simulate
from traces.base import Request, Trace

#: the keys of the summary dict of old, in order (every run has these)
BASE_KEYS = [
    "policy",
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "flops_saved_frac",
    "ttft_p5_ms",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_mean_ms",
    "requests",
    "input_tokens",
    "hit_tokens",
    "evictions",
    "checkpoints_admitted",
    "checkpoints_hit",
    "checkpoints_evicted",
    "kv_tokens_evicted",
    "rejected_inserts",
    "peak_bytes",
    "capacity_overshoots",
    "final_kv_bytes",
    "final_state_bytes",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "queue_p50_ms",
    "queue_p95_ms",
    "throughput_rps",
    "output_tokens_per_s",
    "steps",
    "batch_size_mean",
    "batch_size_p50",
    "batch_size_p95",
    "batch_size_max",
    "step_tokens_mean",
    "step_tokens_p50",
    "step_tokens_p95",
    "step_tokens_max",
    "preemptions",
    "memory_overshoots",
    "peak_charged_bytes",
    "missed_never_shared",
    "missed_no_checkpoint",
    "missed_last_token_rule",
    "missed_evicted",
    "missed_insert_rejected",
    "missed_held_by_running",
    "missed_speculative",
    "hit_after_preemption",
    "aborted_requests",
    "running_cap",
]
#: the keys the tuners (and the hindsight oracle) appended, in order
DUEL_KEYS = [
    "tuned_alpha",
    "tuned_choice",
    "tuned_at_request",
    "tuning_rounds",
    "tuning_switches",
    "tuning_seconds",
    "first_eviction_request",
]
REPLAY_KEYS = [k for k in DUEL_KEYS if k != "tuning_switches"]
ORACLE_KEYS = ["tuned_alpha", "tuned_choice", "tuned_at_request", "oracle_hit_rates"]


def _trace(sessions: int = 12, turns: int = 3) -> Trace:
    """Multi-turn sessions, each turn extending its history: prefix hits, and evictions at 300 MB."""
    rng = np.random.default_rng(0)
    reqs, hist, t = [], {}, 0.0
    for turn in range(turns):
        for s in range(sessions):
            inp = np.concatenate((hist.get(s, np.zeros(0, dtype=np.int64)), rng.integers(1, 50_000, 30)))
            out = rng.integers(1, 50_000, 40)
            reqs.append(Request(s, turn, inp, out, arrival=t))
            hist[s] = np.concatenate((inp, out))
            t += 1
    return Trace("summary-keys", reqs, closed_loop=False)


@pytest.mark.parametrize(
    ("kw", "tuning", "extra"),
    [
        ({}, None, []),
        ({"scheduler": "continuous", "mode": "des"}, None, []),
        ({"alpha": "auto"}, DuelTuning, DUEL_KEYS),  # --alpha auto: the duel tuner by default
        ({"alpha": "auto", "tuner": "replay"}, ReplayTuning, REPLAY_KEYS),
        ({"policy": "marconi-oracle"}, OracleTuning, ORACLE_KEYS),
    ],
    ids=["fcfs", "continuous", "alpha-auto", "alpha-auto-replay", "marconi-oracle"],
)
def test_fields_are_the_old_keys_for_each_scheduler_and_tuner(kw, tuning, extra):
    kw = {"policy": "marconi", "mode": "sequential", **kw}
    s = simulate(_trace(), SimConfig(capacity_bytes=300 * 10**6, tuning_workers=1, **kw)).summary
    assert isinstance(s, RunSummary)
    assert [f.name for f in dataclasses.fields(RunSummary) if f.name != "tuning"] == BASE_KEYS
    assert s.tuning is None if tuning is None else isinstance(s.tuning, tuning)
    if tuning is not None:
        assert [f.name for f in dataclasses.fields(tuning)] == extra
    assert list(s.to_dict()) == BASE_KEYS + extra == list(s.keys())
    assert all(s[k] == getattr(s, k) for k in BASE_KEYS)
    assert s.policy == kw["policy"] and s.requests == 36


def test_to_dict_is_the_old_dict_on_a_hand_checked_run():
    """Three requests of 10 prompt tokens hitting 0, 1 and 5 tokens, each queued 0.5 s and
    prefilled in 0.25 s (TTFT 750 ms); the first two decode 2 tokens by 0.25 s after their first
    token (TPOT 250 ms, end to end 1 s); 2 finished over a 2 s span: 1 request/s, 2 tokens/s.
    No engine steps (fcfs): the step fields are 0."""
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
    s = rec.result(SimpleNamespace(requests=reqs), tree, "p").summary
    saved = spec.flops(1) + spec.flops(5)
    old = {
        "policy": "p",
        "token_hit_rate": 6 / 30,
        "request_hit_rate": 2 / 3,
        "flops_saved": saved,
        "flops_saved_frac": saved / (3 * spec.flops(10)),
        "ttft_p5_ms": 750.0,
        "ttft_p50_ms": 750.0,
        "ttft_p95_ms": 750.0,
        "ttft_mean_ms": 750.0,
        "requests": 3,
        "input_tokens": 30,
        "hit_tokens": 6,
        "evictions": 4,
        "checkpoints_admitted": 6,
        "checkpoints_hit": 2,
        "checkpoints_evicted": 3,
        "kv_tokens_evicted": 12,
        "rejected_inserts": 1,
        "peak_bytes": 99,
        "capacity_overshoots": 0,
        "final_kv_bytes": 21,
        "final_state_bytes": 10,
        "e2e_p50_ms": 1000.0,
        "e2e_p95_ms": 1000.0,
        "tpot_p50_ms": 250.0,
        "tpot_p95_ms": 250.0,
        "queue_p50_ms": 500.0,
        "queue_p95_ms": 500.0,
        "throughput_rps": 1.0,
        "output_tokens_per_s": 2.0,
        "steps": 0,
        "batch_size_mean": 0.0,
        "batch_size_p50": 0.0,
        "batch_size_p95": 0.0,
        "batch_size_max": 0,
        "step_tokens_mean": 0.0,
        "step_tokens_p50": 0.0,
        "step_tokens_p95": 0.0,
        "step_tokens_max": 0,
        "preemptions": 0,
        "memory_overshoots": 0,
        "peak_charged_bytes": 0,
        # a Recorder without a miss ledger (no Simulation): the miss totals are 0
        **{f"missed_{c}": 0 for c in CAUSES},
        "hit_after_preemption": 0,
        "aborted_requests": 0,
        "running_cap": 0,
    }
    d = s.to_dict()
    assert list(d) == list(old) == BASE_KEYS
    assert d["policy"] == "p"
    assert {k: v for k, v in d.items() if k != "policy"} == pytest.approx(
        {k: v for k, v in old.items() if k != "policy"}, rel=1e-12
    )
    assert [type(v) for v in d.values()] == [type(v) for v in old.values()]
    # a tuning group appends its fields; dict-style reads see the same dict
    tuned = dataclasses.replace(s, tuning=OracleTuning(0.5, "0.5", None, {"0": 0.1, "0.5": 0.2}))
    assert tuned.to_dict() == {
        **d,
        "tuned_alpha": 0.5,
        "tuned_choice": "0.5",
        "tuned_at_request": None,
        "oracle_hit_rates": {"0": 0.1, "0.5": 0.2},
    }
    assert tuned["tuned_choice"] == "0.5" and tuned.get("tuning_rounds", 7) == 7 and "oracle_hit_rates" in tuned
    assert dict(tuned) == tuned.to_dict() and {**s} == d
    with pytest.raises(KeyError):
        s["tuned_alpha"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.policy = "q"
