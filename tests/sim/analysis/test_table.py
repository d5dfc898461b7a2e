"""The text tables of `marconi run` / `sweep` / `report` and the saturation check (issue 45):
exact output on hand-built records, and the saturation rule on hand-checked request timings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from sim.analysis import table
from sim.cli import main


def test_two_line_header_groups_columns_and_right_aligns_numbers():
    recs = [
        {"policy": "a", "token_hit_rate": 0.5, "request_hit_rate": 1.0, "ttft_p50_ms": 12.34, "ttft_p95_ms": 100.0},
        {"policy": "longer", "token_hit_rate": 0.0625, "request_hit_rate": 0.5, "ttft_p50_ms": 1.0, "ttft_p95_ms": 2.0},
    ]
    text = table.format_table(recs, ["token_hit_rate", "request_hit_rate", "ttft_p50_ms", "ttft_p95_ms"])
    assert text.splitlines() == [
        "           cache hit       TTFT ms",
        "policy   token  request   p50    p95",
        "------  ------  -------  ----  -----",
        "a       50.00%  100.00%  12.3  100.0",
        "longer   6.25%   50.00%   1.0    2.0",
    ]


def test_batch_size_is_a_dash_without_engine_steps_and_nan_is_a_dash():
    recs = [
        {"policy": "fcfs", "batch_size_mean": 0.0, "steps": 0, "tpot_p50_ms": math.nan},
        {"policy": "cont", "batch_size_mean": 5.25, "steps": 10, "tpot_p50_ms": 3.0},
    ]
    lines = table.format_table(recs, ["batch_size_mean", "tpot_p50_ms"]).splitlines()
    assert lines[-2].split() == ["fcfs", "-", "-"]
    assert lines[-1].split() == ["cont", "5.2", "3.0"]  # 5.25 rounds half to even


def test_parse_columns_default_all_aliases_and_unknown():
    assert table.parse_columns("default") == list(table.DEFAULT_COLUMNS)
    assert table.parse_columns("all") == [c.key for c in table.METRICS]
    assert table.parse_columns("rejected,token_hit,rejected_inserts") == ["rejected_inserts", "token_hit_rate"]
    assert table.parse_columns("default,e2e_p95_ms")[-1] == "e2e_p95_ms"
    assert table.parse_columns("capacity_gb,token_hit", extra=["capacity_gb"]) == ["capacity_gb", "token_hit_rate"]
    with pytest.raises(ValueError, match="bogus"):
        table.parse_columns("token_hit,bogus")
    with pytest.raises(ValueError):
        table.parse_columns(" , ")


def test_best_first_sorts_each_metric_its_own_way_nan_last():
    recs = [
        {"id": i, "token_hit_rate": h, "ttft_p95_ms": t} for i, (h, t) in enumerate([(0.2, 5), (0.9, 9), (math.nan, 1)])
    ]
    assert [r["id"] for r in table.best_first(recs, "token_hit_rate")] == [1, 0, 2]
    assert [r["id"] for r in table.best_first(recs, "ttft_p95_ms")] == [2, 0, 1]


def _timings(queues):
    """Arrivals one second apart, each request served in exactly 1 s after its queueing delay."""
    arrival = np.arange(len(queues), dtype=float)
    queue = np.asarray(queues, dtype=float)
    return arrival, queue, queue + 1.0


def test_a_queue_that_grows_is_saturation_and_busy_time_is_the_union_of_spans():
    # starts 0,1,2,4,6,8,11,13,15, each 1 s long and disjoint: busy 9 s, 9 requests -> 1 request/s
    s = table.saturation(*_timings([0, 0, 0, 1, 2, 3, 5, 6, 7]))
    assert s.saturated
    assert (s.queue_first_s, s.queue_last_s, s.busy_s, s.served_rps) == (0.0, 6.0, 9.0, 1.0)


def test_a_steady_queue_is_not_saturation_and_overlaps_count_once():
    arrival = np.zeros(6)
    queue = np.array([0.0, 0.5, 0.5, 0.5, 0.5, 0.5])
    e2e = np.array([2.0, 1.0, 3.0, 1.0, 1.0, 1.0])  # spans [0,2], [0.5,1], [0.5,3]... union [0,3]
    s = table.saturation(arrival, queue, e2e)
    assert not s.saturated and s.busy_s == 3.0 and s.served_rps == 2.0
    # growth under a second is noise, not saturation
    assert not table.saturation(*_timings([0, 0, 0, 0.2, 0.3, 0.9])).saturated
    # unfinished requests (NaN) are left out; fewer than 6 finished: no verdict
    assert table.saturation(*_timings([0, 1, 2, 3, 4, math.nan])) is None


def test_warning_names_the_sustained_rate_and_the_setting_that_keeps_up():
    sat = table.saturation(*_timings([0, 0, 0, 1, 2, 3, 5, 6, 7]))
    line = table.saturation_warning([("marconi", sat), ("vanilla", None)], 10.0, 2.0, 5.0)
    assert line.startswith("warning: offered load exceeds what the engine serves (marconi)")
    assert "sustains about 1 requests/s" in line and "against 10 offered" in line
    assert line.endswith("--sessions-per-second 0.2 or less keeps up")  # 1 request/s / 5 a session
    open_loop = table.saturation_warning([("marconi", sat)], 4.0, None, 1.0, time_scale=1.5)
    assert open_loop.endswith("--time-scale 6 or more keeps up")  # 1.5 x 4 offered / 1 served
    quiet = table.saturation(*_timings([0.1] * 9))
    assert table.saturation_warning([("marconi", quiet)], 10.0, 2.0, 5.0) == ""
    # an open-loop burst (every request at one instant): no time scale spreads it, none is named
    burst = table.saturation_warning([("marconi", sat)], math.inf, None, 1.0, time_scale=1.5)
    assert burst.endswith(
        "against requests that all arrive at once (the trace's arrivals: no --time-scale spreads them)"
    )


SMALL = ["--no-progress", "--policy", "sglang+", "--capacity", "1GB"]


def test_run_warns_once_when_the_engine_saturates_and_json_says_so():
    args = ["run", *SMALL, "--trace", "synthetic:agent:sessions=10", "--sessions-per-second", "50"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    warnings = [x for x in res.stdout.splitlines() if x.startswith("warning: offered load")]
    assert len(warnings) == 1 and "--sessions-per-second" in warnings[0]
    res = CliRunner().invoke(main, [*args, "--format", "json"])
    row = json.loads(res.stdout)[0]
    assert row["saturated"] is True and 0 < row["sustainable_rps"] < 1
    assert row["preemptions"] > 0 and row["tpot_p50_ms"] > 0 and row["queue_p95_ms"] > 1000
    assert "warning: offered load" in res.stderr


def test_run_columns_choose_the_table_and_a_bad_name_is_one_line():
    base = ["run", *SMALL, "--trace", "synthetic:chat:sessions=5"]
    res = CliRunner().invoke(main, [*base, "--columns", "e2e_p95_ms,tokens_per_s"])
    assert res.exit_code == 0, res.output
    header = res.stdout.splitlines()[1:3]
    assert header[0].split() == ["e2e", "ms", "served"] and header[1].split() == ["policy", "p95", "tok/s"]
    assert "warning" not in res.stdout
    res = CliRunner().invoke(main, [*base, "--columns", "default,nope"])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "unknown column 'nope'" in res.stderr
