"""A preset tuned in hindsight over several simulations (``PolicyPreset.hindsight``) is recognised by
that property, not by the name ``marconi-oracle``: a second such preset, registered here, is run by
the oracle path, keeps its tuning knobs in a sweep and is refused by replay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies.base import PRESETS, PolicyError, PolicyPreset, get_preset, register_preset
from sim.config import SimConfig
from sim.errors import UsageError
from sim.experiments.grid import make_task
from sim.simulate import build, hindsight_preset, simulate
from traces.base import Request, Trace

GB = 10**9
NAME = "test-hindsight-bound"


@pytest.fixture
def second_bound():
    """A copy of marconi-oracle under another name, registered for one test."""
    assert NAME not in PRESETS
    preset = register_preset(dataclasses.replace(get_preset("marconi-oracle"), name=NAME, description="test bound"))
    try:
        yield preset
    finally:
        del PRESETS[NAME]


def _trace(rounds: int = 3, docs: int = 3, doc_len: int = 1500, shorts: int = 10) -> Trace:
    rng = np.random.default_rng(2)
    doc_tokens = [rng.integers(1, 50_000, doc_len) for _ in range(docs)]
    reqs, t = [], 0.0
    for _ in range(rounds):
        for d in doc_tokens:
            reqs.append(
                Request(
                    len(reqs),
                    0,
                    np.concatenate((d, rng.integers(1, 50_000, 20))),
                    rng.integers(1, 50_000, 10),
                    arrival=t,
                )
            )
            t += 1.0
        for _ in range(shorts):
            reqs.append(Request(len(reqs), 0, rng.integers(1, 50_000, 100), rng.integers(1, 50_000, 10), arrival=t))
            t += 1.0
    return Trace("hindsight-test", reqs, closed_loop=False)


def test_marconi_oracle_declares_the_property():
    preset = get_preset("marconi-oracle")
    assert preset.tuned_in_hindsight and preset.hindsight == "oracle" and preset.hindsight_of == "marconi"
    assert not any(get_preset(n).tuned_in_hindsight for n in ("vanilla", "sglang+", "vllm+", "marconi"))
    assert hindsight_preset("marconi") is None and hindsight_preset("no-such-policy") is None


def test_a_second_bound_runs_the_oracle_path(second_bound):
    trace = _trace()
    kw = dict(capacity_bytes=GB // 4, alpha_grid="0,1,2", tuning_workers=1)
    ours = simulate(trace, SimConfig(policy=NAME, **kw)).summary
    theirs = simulate(trace, SimConfig(policy="marconi-oracle", **kw)).summary
    assert ours["policy"] == NAME
    assert "oracle_hit_rates" in ours and set(ours["oracle_hit_rates"]) == {"0", "1", "2"}
    for key in ("token_hit_rate", "tuned_alpha", "tuned_choice", "oracle_hit_rates"):
        assert ours[key] == theirs[key]


def test_a_second_bound_keeps_its_tuning_knobs_in_a_sweep(second_bound):
    assert make_task({}, policy=NAME, alpha_grid="0,1").config.alpha_grid == "0,1"
    assert make_task({}, policy="sglang+", alpha_grid="0,1").config.alpha_grid == SimConfig().alpha_grid


def test_replay_refuses_a_second_bound(second_bound):
    from sim.replay.session import ReplaySettings, run_replay

    for name in ("marconi-oracle", NAME):
        with pytest.raises(UsageError) as err:
            run_replay(
                _trace(rounds=1), SimConfig(policy=name, model="replay-tiny"), ReplaySettings(device="cpu"), build=build
            )
        assert str(err.value) == f"replay follows one simulation: {name} (one per alpha) is not replayable"


def test_a_bound_names_the_preset_it_runs():
    with pytest.raises(PolicyError, match="hindsight_of"):
        register_preset(PolicyPreset(NAME, "no base", eviction="marconi", hindsight="oracle"))
    assert NAME not in PRESETS
