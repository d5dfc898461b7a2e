"""SimConfig validation: settings that cannot run together are refused with one clear message."""

from __future__ import annotations

import pytest

from sim.config import SimConfig
from sim.errors import UsageError


@pytest.mark.parametrize("compat", ["paper", "paper-fixed"])
def test_artifact_compat_needs_the_sequential_replay(compat):
    with pytest.raises(UsageError, match=f"--compat {compat} .* use it with --mode sequential"):
        SimConfig(compat=compat, mode="des").validate()
    SimConfig(compat=compat, mode="sequential").validate()


@pytest.mark.parametrize("mode", ["des", "sequential"])
def test_corrected_engine_runs_in_both_modes(mode):
    SimConfig(compat="corrected", mode=mode).validate()


@pytest.mark.parametrize("knob", ["max_num_batched_tokens", "max_num_seqs"])
def test_a_step_needs_one_token_and_one_sequence(knob):
    """The boundary: 1 runs, 0 is refused (a mutation survivor of sim/config.py's validate)."""
    SimConfig(**{knob: 1}).validate()
    with pytest.raises(UsageError, match="^--max-num-batched-tokens and --max-num-seqs must be >= 1$"):
        SimConfig(**{knob: 0}).validate()


def test_sizes_print_in_decimal_units_and_unlimited_as_inf():
    """format_size, the header's capacity (mutation survivors of sim/config.py): each unit from
    its own power of ten, the unlimited bound and anything above it as inf."""
    from sim.config import UNLIMITED, format_size, parse_size

    assert [format_size(n) for n in (999, 10**3, 2 * 10**6, 5 * 10**9, 2 * 10**12)] == [
        "999B",
        "1KB",
        "2MB",
        "5GB",
        "2TB",
    ]
    assert format_size(UNLIMITED) == format_size(UNLIMITED + 1) == "inf"
    assert format_size(UNLIMITED - 1) != "inf"
    assert parse_size("inf") == UNLIMITED and parse_size(format_size(7 * 10**9)) == 7 * 10**9


def test_range_bounds_are_inclusive_and_zero_capacity_or_rate_is_refused():
    """Mutation survivors of sim/config.py's validate (seed 1): a knob's max is allowed (--tensor-
    parallel 64), one above is not; a capacity and a session rate of 0 are refused, 1 runs."""
    SimConfig(tensor_parallel=64).validate()
    with pytest.raises(UsageError, match=r"^--tensor-parallel must be in 0\.\.64, not 65$"):
        SimConfig(tensor_parallel=65).validate()
    SimConfig(capacity_bytes=1, sessions_per_second=1e-6).validate()
    with pytest.raises(UsageError, match="^capacity must be positive$"):
        SimConfig(capacity_bytes=0).validate()
    with pytest.raises(UsageError, match="^--sessions-per-second must be a finite number > 0, not 0.0$"):
        SimConfig(sessions_per_second=0.0).validate()


def test_a_number_is_a_size_in_bytes_and_float_inf_is_unlimited():
    from sim.config import UNLIMITED, parse_size

    assert (parse_size(2.9), parse_size(7), parse_size(float("inf"))) == (2, 7, UNLIMITED)
