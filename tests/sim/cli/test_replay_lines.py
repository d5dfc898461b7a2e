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


def test_the_cpu_warnings_time_is_its_tflop_at_the_cpus_rate():
    """qwen3.5-9b, 4 of its 32 mixer layers, prompts of 2,000 and 6,000 tokens: 14.3 TFLOP of
    from-scratch prefills at ~0.1 TFLOP/s is 143 s, "2 min", and twice that "5 min" (mutation run,
    session 17: ``CPU_TFLOPS * 1e12`` -> ``/ 1e12`` survived: only the duration's unit was pinned)."""
    from types import SimpleNamespace as N

    from sim.cli.replay import cpu_time_warning
    from sim.cost import get_model

    trace = N(requests=[N(n_input_tokens=lambda B: 2000), N(n_input_tokens=lambda B: 6000)], block_tokens=1)
    line = cpu_time_warning(get_model("qwen3.5-9b"), trace, 0, 4, "torch")
    assert line == (
        "warning: --device cpu: qwen3.5-9b (d_model 4096) will take about 2 min to 5 min for 2 requests of 4 "
        "layers (14 TFLOP of from-scratch prefills at ~0.1 TFLOP/s); --layers, --requests or --device cuda cut it"
    )
    assert cpu_time_warning(get_model("replay-tiny"), trace, 0, 4, "torch") is None  # narrow: no warning


def test_the_validation_line_gives_each_restore_errors_median_and_p95():
    """The tolerance check's errors by kind (mutation run, session 17: the clause dropped survived)."""
    from sim.cli.replay import _validation_line

    errors = {"rec": {"p50": 1.2e-6, "p95": 3.25e-5}, "out": {"p50": 0.0, "p95": 0.004}}
    assert (
        _validation_line({"restore_errors": errors})
        == "tolerance; error p50 / p95: rec 1.2e-06 / 3.2e-05, out 0 / 0.004"
    )
    assert _validation_line({}) == "tolerance"
