"""``sim.replay.calibration.saved_error`` (``sim.replay.measure.saved_interval`` over a
``request_errors`` frame): the time saved's error over a run's validated hits and its seeded
bootstrap interval (how far the measurement pins the figure); the replay summary's
``time_saved_interval`` and the "saved on validated hits" line that prints it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.replay.calibration import SAVED_DRAWS, saved_error


def frame(measured, modelled) -> pd.DataFrame:
    return pd.DataFrame(dict(saved_ms=measured, modelled_saved_ms=modelled))


def test_hand_checked_error_and_a_degenerate_interval():
    # three hits each measured 2 ms and modelled 2.5: +25 % whatever the resample
    err, lo, hi = saved_error(frame([2.0, 2.0, 2.0], [2.5, 2.5, 2.5]))
    assert err == pytest.approx(0.25) and lo == pytest.approx(0.25) and hi == pytest.approx(0.25)


def test_the_sum_not_the_mean_of_ratios_and_unvalidated_rows_left_out():
    # hits of 1 and 3 ms measured, 2 and 2 modelled: 4 / 4 - 1 = 0 (the mean of ratios would be +33 %);
    # a row without a reference (NaN) does not count
    err, lo, hi = saved_error(frame([1.0, 3.0, float("nan")], [2.0, 2.0, float("nan")]))
    assert err == pytest.approx(0.0)
    # resamples of two hits: 2 / 1 - 1, 4 / 4 - 1, 2 / 3 - 1 -> an interval from -1/3 to +1
    assert lo == pytest.approx(-1 / 3) and hi == pytest.approx(1.0)


def test_nothing_saved_is_nan():
    for f in (
        pd.DataFrame([]),
        frame([], []),
        frame([float("nan")], [1.0]),
        frame([-1.0, 0.5], [1.0, 1.0]),
        frame([1.0, -1.0], [1.0, 1.0]),  # a measured total of exactly 0: no ratio
    ):
        assert all(math.isnan(x) for x in saved_error(f))


def test_seeded_and_noise_widens_it():
    rng = np.random.default_rng(3)
    modelled = np.full(60, 1.7)
    quiet = frame(modelled * (1 + 0.02 * rng.standard_normal(60)), modelled)
    # the Mooncake picture: a few long calls whose own spread is many times the 1.7 ms saved
    loud_measured = quiet["saved_ms"].to_numpy().copy()
    loud_measured[:3] += np.array([28.0, -4.0, -3.0])
    loud = frame(loud_measured, modelled)
    assert saved_error(quiet, seed=5) == saved_error(quiet, seed=5)
    _, qlo, qhi = saved_error(quiet)
    _, llo, lhi = saved_error(loud)
    assert qhi - qlo < 0.03 < 0.2 < lhi - llo


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.1, 50.0), st.floats(0.1, 50.0)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 2**31),
)
def test_the_interval_lies_between_the_hits_own_ratios(pairs, seed):
    measured, modelled = zip(*pairs)
    err, lo, hi = saved_error(frame(list(measured), list(modelled)), seed=seed, draws=SAVED_DRAWS)
    assert lo - 1e-12 <= hi
    # every resample's ratio is between the hits' smallest and largest own ratio
    ratios = np.array(modelled) / np.array(measured) - 1
    assert ratios.min() - 1e-9 <= lo and hi <= ratios.max() + 1e-9
    assert ratios.min() - 1e-9 <= err <= ratios.max() + 1e-9


def test_the_summary_carries_it_and_the_saved_line_prints_it():
    from test_host_term import COUNTS, DEVICE, TINY

    from sim.cli.replay import saved_line
    from sim.replay import measure
    from sim.replay.records import RequestRecord

    def hit(rid, suffix, full):
        r = RequestRecord(rid, 140, 4, hit_tokens=100, restored=True, validated=True, suffix_segments=[(100, 140)])
        r.suffix_ms, r.full_ms, r.suffix_slack_ms, r.full_slack_ms = suffix, full, 5.0, 5.0
        return r

    df = measure.request_table([hit(0, 1.0, 3.0), hit(1, 1.0, 3.0), hit(2, 1.0, 3.0)], TINY, DEVICE, COUNTS)
    out = measure.summary(df, failures=0, store_peak_bytes=0, wall_s=1.0)
    modelled = float((df["modelled_full_ms"] - df["modelled_ms"]).iloc[0])
    point = modelled / 2.0 - 1  # each hit saved 2 ms measured: identical hits, a degenerate interval
    assert out["time_saved_interval"] == pytest.approx([point, point, point])
    line = saved_line(dict(out, time_model_compared=True))
    assert line.endswith(f"(modelled {point:+.1%}, 95 % interval over the hits {point:+.0%} to {point:+.0%})")
    # not compared (a CPU, another GPU's timing): no error to qualify
    assert "interval" not in saved_line(dict(out, time_model_compared=False))
    # no validated hit: no interval
    miss = RequestRecord(3, 100, 4, suffix_segments=[(0, 100)], suffix_ms=1.0)
    none = measure.summary(
        measure.request_table([miss], TINY, DEVICE, COUNTS), failures=0, store_peak_bytes=0, wall_s=1.0
    )
    assert none["time_saved_interval"] is None


def test_resampled_a_block_at_a_time_gives_the_same_interval(monkeypatch):
    """``SAVED_BLOCK`` bounds the resampled indices held at once (a run of many hits); the draws
    are the same stream, so the interval is the one drawn whole."""
    import sim.replay.measure as measure

    rng = np.random.default_rng(1)
    measured = rng.gamma(2.0, 1.0, 300)
    modelled = measured * (1 + 0.1 * rng.standard_normal(300))
    whole = measure.saved_interval(measured, modelled, seed=4)
    monkeypatch.setattr(measure, "SAVED_BLOCK", 300 * 7)  # 7 draws a block, the last one short
    assert measure.saved_interval(measured, modelled, seed=4) == whole
    monkeypatch.setattr(measure, "SAVED_BLOCK", 1)  # fewer indices than one draw: a draw a block
    assert measure.saved_interval(measured, modelled, seed=4) == whole
