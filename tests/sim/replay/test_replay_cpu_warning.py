"""`marconi replay --device cpu`'s warning of a wide preset's wall time (sim.cli.replay)."""

from types import SimpleNamespace as N

from sim.cli.replay import cpu_time_warning
from sim.cost import get_model

TRACE = N(requests=[N(n_input_tokens=lambda B: 2000), N(n_input_tokens=lambda B: 6000)], block_tokens=1)


def test_continuous_batchings_steps_widen_the_cpu_estimate():
    """Under --scheduler continuous (the default) the engine steps execute every request's
    suffix again as batches: the range's top is three passes, not two, and the line says why
    (qwen3.5-9b at 2 layers, 6 synthetic:chat requests on 2 shared cores: 34 s under fcfs, 69 s
    under continuous batching, both warned as "14 s to 28 s")."""
    spec = get_model("qwen3.5-9b")
    fcfs = cpu_time_warning(spec, TRACE, 0, 4, "torch")
    cont = cpu_time_warning(spec, TRACE, 0, 4, "torch", steps=True)
    assert "about 2 min to 5 min" in fcfs and "engine steps" not in fcfs  # 143 s, twice that
    assert "about 2 min to 7 min" in cont  # 143 s, three times that
    assert "; the engine steps of continuous batching run the suffixes again)" in cont
    assert cont.endswith("--layers, --requests or --device cuda cut it") and "\n" not in cont
    assert cpu_time_warning(get_model("replay-tiny"), TRACE, 0, 4, "torch", steps=True) is None


def test_a_short_estimate_is_one_duration():
    """Both ends round to the same duration: said once ("about 1 s", not "about 1 s to 1 s")."""
    short = N(requests=[N(n_input_tokens=lambda B: 20)], block_tokens=1)
    line = cpu_time_warning(get_model("qwen3.5-9b"), short, 0, 2, "torch", steps=True)
    assert "will take about 1 s for 1 request of 2 layers" in line
