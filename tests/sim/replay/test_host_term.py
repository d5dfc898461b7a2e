"""The time model's host term (issue 41 item 3): the host's issue time of a call
(``HardwareTiming.host_ms_per_call`` + ``host_ms_per_layer`` per layer call), its fit from the host
issue times replay records (``sim.replay.measure.fit_host_depths``), and replay pricing a
host-bound prefill with the later of its device and host times, the headline error then counting
every prefill. Exact values on hand-built tables; the committed H200 file carries the term and
prices the committed campaign's host-bound calls with it."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cost import HardwareTiming, get_model, read_timing_file, timing_to_dict
from sim.errors import UsageError
from sim.replay import measure
from sim.replay.calibration import Run, fit_host, request_errors
from sim.replay.records import RequestRecord

ROOT = Path(__file__).resolve().parents[3]
TINY = get_model("replay-tiny")  # 1 attention, 3 gated-delta, 4 MLP layers: 8 layer calls
COUNTS = {"attention": 1, "gated_delta": 3, "mlp": 4}
DEVICE = HardwareTiming(
    ms_per_tflop={"attn_linear": 2.0, "attn_quadratic": 4.0, "gdn_linear": 2.5, "gdn_chunk": 9.0, "mlp_linear": 1.6},
    layer_call_ms={"attention": 0.05, "gated_delta": 0.09, "mlp": 0.03},
    call_ms=0.4,
    decode_ms_per_token=5.0,
)
HOSTED = replace(DEVICE, host_ms_per_call=2.0, host_ms_per_layer=0.5)  # 2 + 8 x 0.5 = 6 ms a call


def test_host_issue_time_and_the_call_a_host_issues():
    assert not DEVICE.has_host_term and HOSTED.has_host_term
    assert HOSTED.host_issue_ms(TINY) == pytest.approx(6.0)
    assert HOSTED.host_issue_ms(TINY, calls=2) == pytest.approx(12.0)  # a split call issues again
    dev = HOSTED.prefill_time_s(TINY, 0, 100)
    assert dev * 1e3 < 6.0  # replay-tiny's device time: far below its host's
    assert HOSTED.issued_time_s(TINY, 0, 100) == pytest.approx(6e-3)
    assert HOSTED.issued_time_s(TINY, 0, 100, splits=1) == pytest.approx(12e-3)
    # the device time where it is the longer; no host term: the device time, as before
    slow = replace(HOSTED, host_ms_per_call=0.0, host_ms_per_layer=dev * 1e3 / 16)
    assert slow.issued_time_s(TINY, 0, 100) == pytest.approx(dev)
    assert DEVICE.issued_time_s(TINY, 0, 100) == DEVICE.prefill_time_s(TINY, 0, 100)
    # the device model itself does not change (marconi run prices device time)
    assert HOSTED.prefill_time_s(TINY, 0, 100) == DEVICE.prefill_time_s(TINY, 0, 100)
    with pytest.raises(UsageError, match="non-negative"):
        replace(DEVICE, host_ms_per_layer=-0.1)


def test_a_timing_file_without_the_term_reads_as_before(tmp_path):
    d = timing_to_dict(DEVICE)
    assert "host_ms_per_call" not in d and "host_ms_per_layer" not in d
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    t = read_timing_file(p)
    assert not t.has_host_term and t == DEVICE
    d = timing_to_dict(HOSTED)
    assert (d["host_ms_per_call"], d["host_ms_per_layer"]) == (2.0, 0.5)
    p.write_text(json.dumps(d))
    assert read_timing_file(p) == HOSTED
    for bad in (-1.0, "nan", None):
        p.write_text(json.dumps(dict(d, host_ms_per_layer=bad)))
        with pytest.raises(UsageError, match="host_ms_per_layer must be a finite number >= 0"):
            read_timing_file(p)


def test_fit_host_depths_by_hand():
    # two depths: the line through their medians (7 at 8 layer calls, 24.5 at 64)
    call, layer, info = measure.fit_host_depths({8: [6.0, 8.0, 7.0], 64: [20.0, 23.0, 26.0, 29.0]})
    assert layer == pytest.approx(17.5 / 56) and call == pytest.approx(7.0 - 8 * 17.5 / 56)
    assert info["depths"] == {8: dict(calls=3, median_ms=7.0), 64: dict(calls=4, median_ms=24.5)}
    # one depth: all of it per layer call
    assert measure.fit_host_depths({8: [4.0, 8.0, 6.0]})[:2] == (0.0, 0.75)
    # a host time that falls with depth: one time per call (the calls' weighted mean of medians)
    assert measure.fit_host_depths({8: [10.0], 64: [5.0, 5.0, 5.0]})[:2] == (pytest.approx(6.25), 0.0)
    # a line below 0 at no layers: through the origin, weighted least squares
    call, layer, _ = measure.fit_host_depths({8: [1.0], 64: [20.0]})
    assert call == 0.0 and layer == pytest.approx((8 * 1.0 + 64 * 20.0) / (8 * 8 + 64 * 64))
    assert measure.fit_host_depths({}) == (0.0, 0.0, dict(depths={}))
    assert measure.fit_host_depths({8: []}) == (0.0, 0.0, dict(depths={}))


def test_the_fit_takes_the_one_call_prefills_whose_host_did_not_wait():
    table = pd.DataFrame(
        dict(
            suffix_host_ms=[5.0, 45.0, 7.0, float("nan"), 6.0, 9.0],  # 45: waited on the GPU's sleep
            kernel_calls=[1, 1, 1, 1, 2, 1],  # a split request's two calls are timed together
            suffix_ms=[1.0, 1.0, 1.0, 1.0, 1.0, float("nan")],  # the last one untimed
        )
    )
    assert measure.host_issue_times(table).tolist() == [5.0, 7.0]
    assert measure.host_issue_times(table.drop(columns="suffix_host_ms")).size == 0
    deep = table.assign(suffix_host_ms=[21.0, 45.0, 25.0, float("nan"), 1.0, 1.0])
    runs = [Run(TINY, COUNTS, table), Run(TINY, {"attention": 8, "gated_delta": 24, "mlp": 32}, deep)]
    call, layer, info = fit_host(runs)  # medians 6 at 8 layer calls, 23 at 64
    assert layer == pytest.approx(17.0 / 56) and call == pytest.approx(6.0 - 8 * 17.0 / 56)
    assert sorted(info["depths"]) == [8, 64]


def _records():
    """A device-bound miss and a host-bound hit (slack under HOST_BOUND_MARGIN_MS)."""
    miss = RequestRecord(0, 100, 4, suffix_segments=[(0, 100)], suffix_ms=1.0, suffix_host_ms=6.5)
    miss.suffix_slack_ms = 2.0
    hit = RequestRecord(1, 140, 4, hit_tokens=100, restored=True, suffix_segments=[(100, 140)])
    hit.suffix_ms, hit.suffix_host_ms, hit.suffix_slack_ms = 8.0, 30.0, 0.1
    return [miss, hit]


def test_replay_prices_a_host_bound_prefill_with_the_host_and_counts_it():
    dev = [measure.modelled_ms(TINY, HOSTED, COUNTS, 0, 100), measure.modelled_ms(TINY, HOSTED, COUNTS, 100, 140)]
    df = measure.request_table(_records(), TINY, HOSTED, COUNTS)
    assert df["suffix_host_bound"].tolist() == [False, True]
    assert df["suffix_slack_ms"].tolist() == [2.0, 0.1]  # recorded: how much the sleep covered
    assert df["modelled_ms"].tolist() == pytest.approx(dev)  # the device model, as before
    assert df["modelled_host_ms"].tolist() == pytest.approx([6.0, 6.0])
    assert df["modelled_call_ms"].tolist() == pytest.approx([dev[0], 6.0])
    errs = [(dev[0] - 1.0) / 1.0, (6.0 - 8.0) / 8.0]
    assert df["model_error"].tolist() == pytest.approx(errs)
    s = measure.summary(df, failures=0, store_peak_bytes=0, wall_s=1.0)
    # every prefill in the headline; the device-bound one's figures beside it
    assert s["time_model_host_term"] is True and s["host_bound_prefills"] == 1
    assert s["time_model_median_error"] == pytest.approx(float(np.median(np.abs(errs))))
    assert s["time_model_p95_error"] == pytest.approx(float(np.quantile(np.abs(errs), 0.95)))
    assert s["time_model_median_error_device_bound"] == pytest.approx(abs(errs[0]))
    # without a host term: as before, the host-bound one left out of the headline
    df0 = measure.request_table(_records(), TINY, DEVICE, COUNTS)
    assert df0["modelled_host_ms"].isna().all() and df0["modelled_call_ms"].tolist() == pytest.approx(dev)
    s0 = measure.summary(df0, failures=0, store_peak_bytes=0, wall_s=1.0)
    assert s0["time_model_host_term"] is False
    assert s0["time_model_median_error"] == pytest.approx(abs(dev[0] - 1.0))
    assert s0["time_model_p95_error_all"] == pytest.approx(
        float(np.quantile(np.abs([dev[0] - 1.0, (dev[1] - 8.0) / 8.0]), 0.95))
    )
    # the calibration's scoring prices it the same way
    e = request_errors(Run(TINY, COUNTS, df), HOSTED)
    assert e["modelled_call_ms"].tolist() == pytest.approx([dev[0], 6.0])
    assert e["error"].tolist() == pytest.approx(errs)


@pytest.mark.parametrize(
    "sleep,hidden", [(float("nan"), 0.0), (0.0, 0.0), (-3.0, 0.0), (0.5, 0.5), (2.5, 2.5), (50.0, 50.0)]
)
def test_a_host_bound_prefill_is_priced_less_the_sleep_queued_ahead_of_it(sleep, hidden):
    """A queued call's device time starts when the GPU sleep ahead of it ends, so the sleep hid
    that much of the host's issue: a host-bound call is priced at the later of its device time
    and the host's issue less the sleep (session 27: a full-depth qwen3.5-9b call issued in 59 ms
    behind a 50 ms sleep measured its 9.7 ms device time, priced at the 26.7 ms host term). No
    sleep recorded (a table of before, the CPU): the host's issue whole."""
    recs = _records()
    for r in recs:
        r.suffix_sleep_ms = sleep
    dev = [measure.modelled_ms(TINY, HOSTED, COUNTS, 0, 100), measure.modelled_ms(TINY, HOSTED, COUNTS, 100, 140)]
    df = measure.request_table(recs, TINY, HOSTED, COUNTS)
    want = [dev[0], max(dev[1], 6.0 - hidden)]  # the device-bound miss: its device time whatever the sleep
    assert df["modelled_call_ms"].tolist() == pytest.approx(want)
    assert df["model_error"].tolist() == pytest.approx([(want[0] - 1.0) / 1.0, (want[1] - 8.0) / 8.0])
    e = request_errors(Run(TINY, COUNTS, df), HOSTED)
    assert e["modelled_call_ms"].tolist() == pytest.approx(want)
    held = measure.call_model_ms(HOSTED, TINY, dev[1], 0, True, sleep)
    assert held == pytest.approx(want[1])
    assert measure.call_model_ms(HOSTED, TINY, dev[1], 0, False, sleep) == dev[1]
    # a split call (two calls issued): twice the issue, less the one sleep ahead of the first
    assert measure.call_model_ms(HOSTED, TINY, 0.0, 1, True, sleep) == pytest.approx(max(0.0, 12.0 - hidden))


def test_without_a_sleep_a_host_bound_prefill_is_priced_at_the_whole_issue():
    dev = measure.modelled_ms(TINY, HOSTED, COUNTS, 100, 140)
    assert measure.call_model_ms(HOSTED, TINY, dev, 0, True) == pytest.approx(max(dev, 6.0))
    assert measure.call_model_ms(DEVICE, TINY, dev, 0, True, 2.0) == dev  # no host term: the device time


def test_the_error_line_counts_every_prefill_with_a_host_term():
    from sim.cli.replay import _error_line

    s = dict(
        time_model_median_error=0.087,
        time_model_p95_error=0.619,
        host_bound_prefills=34,
        time_model_p95_error_all=0.619,
        time_model_host_term=True,
        time_model_median_error_device_bound=0.081,
        time_model_p95_error_device_bound=0.147,
    )
    assert _error_line(s) == (
        "median 8.7%, P95 61.9% over all prefills (34 host-bound, priced with the host's issue time; "
        "device-bound median 8.1%, P95 14.7%)"
    )


def test_a_depth_outside_the_host_terms_fit_is_said():
    t = replace(HOSTED, covers=dict(models=["qwen3.5-9b"], host_layer_calls=[8, 64]))
    assert t.coverage_note(TINY, layer_calls=8) == t.coverage_note(TINY, layer_calls=64) == ""
    assert t.coverage_note(TINY, layer_calls=120) == (
        "timing: replay-tiny lies outside the shapes the timing file was fitted on (qwen3.5-9b): "
        "120 layer calls a call (host issue time fitted at 8-64)"
    )
    assert replace(t, host_ms_per_call=0.0, host_ms_per_layer=0.0).coverage_note(TINY, layer_calls=120) == ""


CAMPAIGN = ROOT / "benchmarks" / "results" / "2026-12-04-timing-campaign-h200" / "after-moe-fix"


def test_the_committed_h200_timing_prices_host_bound_calls():
    t = read_timing_file(ROOT / "sim" / "data" / "h200-timing.json")
    raw = json.loads((ROOT / "sim" / "data" / "h200-timing.json").read_text())
    assert t.has_host_term and t.covers["host_layer_calls"] == [8, 64]
    # a four-layer replay of qwen3.5-27b (1 attention, 3 gated-delta, 4 MLP: 8 layer calls)
    rspec = measure.replayed_spec(get_model("qwen3.5-27b"), COUNTS)
    assert t.host_issue_ms(rspec) == pytest.approx(raw["host_ms_per_call"] + 8 * raw["host_ms_per_layer"])
    assert 5.0 < t.host_issue_ms(rspec) < 10.0  # the campaign's steady issue: 5-10 ms at 8 layer calls
    run_dir = CAMPAIGN / "agent-qwen3.5-27b"
    if not (run_dir / "requests.parquet").is_file():
        pytest.skip("the committed campaign run is absent")
    run = Run(get_model("qwen3.5-27b"), COUNTS, pd.read_parquet(run_dir / "requests.parquet"), "agent-qwen3.5-27b")
    e = request_errors(run, t)
    held = e[e["host_bound"]]
    assert len(held) == 23
    assert (held["modelled_call_ms"] == np.maximum(held["modelled_ms"], t.host_issue_ms(rspec))).all()
    free = e[~e["host_bound"]]
    assert (free["modelled_call_ms"] == free["modelled_ms"]).all()
    # all prefills counted: P95 67.0 % with device time alone, 53.2 % with the host term (the
    # committed timing with its resumed-call term, session 19; without that term 67.7 / 53.6 %:
    # benchmarks/results/2026-12-05-time-model-host-term/timing_fit-after-moe-fix.txt; session 25,
    # the MLP's weights read held at the bandwidth and the resumed-call term not priced (these runs'
    # resumed calls carried the conv's extra, fixed since): 67.7 / 53.7 %)
    before = request_errors(run, replace(t, host_ms_per_call=0.0, host_ms_per_layer=0.0))
    assert before["error"].abs().quantile(0.95) == pytest.approx(0.677, abs=5e-4)
    assert e["error"].abs().quantile(0.95) == pytest.approx(0.537, abs=5e-4)


def test_the_request_table_carries_each_requests_shadow_and_the_summary_the_simulated_flops_saved():
    """``--validate shadow``'s columns come from the shadow record of the same request (absent:
    not validated, not failed, NaN errors); the summary's simulated FLOPs saved are the full
    prefills' FLOPs less the hit's suffix FLOPs the simulator priced (mutation -m host_term --seed 1
    survivors measure.py L267 and L356)."""
    miss, hit = _records()
    shadow_hit = RequestRecord(1, 140, 4, hit_tokens=100, restored=True)
    shadow_hit.validated, shadow_hit.failed, shadow_hit.max_out_error = True, True, 0.25
    df = measure.request_table([miss, hit], TINY, DEVICE, COUNTS, shadow=[shadow_hit])
    assert df["shadow_validated"].tolist() == [False, True]
    assert df["shadow_failed"].tolist() == [False, True]
    assert np.isnan(df["shadow_max_out_error"][0]) and df["shadow_max_out_error"][1] == 0.25
    s = measure.summary(df, failures=0, store_peak_bytes=0, wall_s=1.0)
    assert s["simulated_flops_saved"] == pytest.approx(TINY.flops(140) - TINY.prefill_flops(100, 140))
    assert s["simulated_flops_saved"] > 0
