"""The typed replay summary (``sim.replay.summary``): ``to_dict()`` gives the figures in the
order ``summary.json`` has always had them, leaves out the figures a run does not have, adds the
batched replay's / step executor's groups (a key already there keeps its place, takes the group's
value) and ``--calibrate``'s errors last; dict-style reads see ``to_dict()``; the Mamba2 labels."""

from dataclasses import FrozenInstanceError, fields

import pytest

from sim.replay.summary import ReplaySummary, cost_counts, labelled


def _summary(**extra) -> ReplaySummary:
    values = {}
    for f in fields(ReplaySummary):
        if f.name in ("batch_figures", "step_figures", "calibrated") or f.metadata.get("optional"):
            continue
        values[f.name] = f.name  # each value its own name: the order is readable from them
    return ReplaySummary(**{**values, **extra})


def test_to_dict_keeps_the_order_and_leaves_out_what_a_run_has_not():
    s = _summary()
    d = s.to_dict()
    assert list(d)[:3] == ["requests", "input_tokens", "hits"]
    assert list(d)[-2:] == ["kernel", "measure"]
    assert all(k == v for k, v in d.items())
    for absent in ("integrity_checked", "shadow_failures", "layers_replayed", "replay_tflops_timed", "batch_calls"):
        assert absent not in d
    # an optional figure sits where measure.summary puts it: after restore_errors, before validation
    d = _summary(integrity_checked=3, integrity_failures=0, replay_tflops_wall=2.0).to_dict()
    keys = list(d)
    i = keys.index("restore_errors")
    assert keys[i + 1 : i + 3] == ["integrity_checked", "integrity_failures"]
    assert keys.index("replay_tflops_wall") == keys.index("validation") - 1


def test_groups_update_in_place_and_calibration_comes_last():
    s = _summary(
        replay_tflops_timed=1.0, replay_tflops_wall=2.0, batch_figures={"batch_calls": {}, "replay_tflops_timed": 9.0}
    )
    d = s.to_dict()
    keys = list(d)
    assert d["replay_tflops_timed"] == 9.0 and keys.index("replay_tflops_timed") < keys.index("validation")
    assert keys[-1] == "batch_calls"
    c = s.with_calibration(step_time_error_calibrated={"median": 0.1}).with_calibration(
        time_model_median_error_calibrated=0.2
    )
    assert list(c.to_dict())[-2:] == ["step_time_error_calibrated", "time_model_median_error_calibrated"]
    assert "step_time_error_calibrated" not in s  # a new summary: the old one is unchanged
    with pytest.raises(FrozenInstanceError):
        s.hits = 3


def test_dict_style_reads():
    s = _summary(step_figures={"steps_executed": 4})
    assert s["hits"] == "hits" and s.get("steps_executed") == 4 and s.get("nope", 7) == 7
    assert "steps_executed" in s and "step_figures" not in s and list(s.keys()) == list(s.to_dict())
    with pytest.raises(KeyError):
        s["nope"]


def test_mamba2_labels():
    by = {"attention": 1, "gated_delta": 3, "mlp": 4}
    assert labelled(by, False) == by and list(labelled(by, True)) == ["attention", "mamba2", "mlp"]
    assert cost_counts(labelled(by, True)) == by and cost_counts(by) == by
