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
