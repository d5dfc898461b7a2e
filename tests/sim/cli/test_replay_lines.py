"""Hand-checked values of `marconi replay`'s summary lines that the end-to-end tests do not pin
(mutation seed 16 of ``sim/cli/replay.py`` left them unchecked)."""

from __future__ import annotations

import pytest

from sim.cli.replay import _duration, _unvalidated, flops_line


@pytest.mark.parametrize(
    "secs, text",
    [(0.2, "1 s"), (42.4, "42 s"), (89.4, "89 s"), (90, "2 min"), (600, "10 min"), (5399, "90 min"), (5400, "1.5 h")],
)
def test_the_cpu_warnings_duration(secs, text):
    """Seconds below 90, whole minutes to 90 minutes, hours with a decimal above (the CPU warning's
    "will take about ..."); at least one second."""
    assert _duration(secs) == text


def test_unvalidated_hits_are_counted_by_reason():
    s = {"hits_unvalidated": {"validate-every": 2, "no KV": 1_234}}
    assert _unvalidated(s) == "; not validated: validate-every 2, no KV 1,234"
    assert _unvalidated({"hits_unvalidated": {}}) == ""
    assert _unvalidated({}) == ""


def test_the_flops_line_without_a_padding_figure_is_the_two_figures():
    """A summary without ``padding_flops_saved`` (an older one, or a Mamba2 model's) has no chunk
    clause: its absence is 0, not a padding figure."""
    s = {"measured_flops_saved": 2.834e9, "simulated_flops_saved": 2.845e9}
    assert flops_line(s) == "executed 2.834e+09, simulated 2.845e+09"
