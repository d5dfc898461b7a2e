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
