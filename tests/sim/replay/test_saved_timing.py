"""``--saved-timing alternate``: a validated hit's suffix prefill and from-scratch reference are each
timed twice, in the order suffix, reference, reference, suffix, and each kept as the mean of its two
calls (``Replayer._time_again``, ``PendingTimes.resolve``): a drift across back-to-back long calls
(session 28: on an H100 the reference of the Mooncake sample's 87K-token prompt, run right after its
suffix, took 0.3-13 % longer per layer kind in 21 of 24 comparisons) cancels out of the time saved."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from sim.cli import main  # noqa: E402
from sim.replay.flight import PendingTimes  # noqa: E402
from sim.replay.records import CHECK, RequestRecord  # noqa: E402


def test_a_validated_hit_is_timed_suffix_reference_reference_suffix(tiny_model, tiny_shape):
    from sim.replay.runner import Replayer
    from sim.replay.store import CheckpointStore
    from test_replay_runner import REQS, first_turn

    store = CheckpointStore(tiny_shape, torch.float32, device="cpu")
    rp = Replayer(tiny_model, store, lambda r: REQS[r], alternate=True)
    seen = []
    start = rp.clock.start

    def spy(queue=True, kind="call", segments=1):
        seen.append(kind)
        return start(queue, kind, segments)

    rp.clock.start = spy
    first_turn(rp)  # request 0 (no hit): its suffix and tail, nothing timed again
    runs = []  # (tokens, position) of each model call of request 1
    real = tiny_model.run

    def run(tokens, start, pos, *a, **k):
        runs.append((len(tokens), pos))
        return real(tokens, start, pos, *a, **k)

    tiny_model.run = run
    try:
        rp.lookup(1, 4, 130)
        rp.prefill(1, 130, 170)
        rp.decode(1)
    finally:
        del tiny_model.run
    recs = {r.request: r for r in rp.finish()}
    assert rp.failures == [] and recs[1].validated
    assert seen == ["suffix", "tail", "suffix", "reference", "reference", "suffix"]
    # the second suffix call runs the suffix again (from the hit), as the first did
    hit, n_in = recs[1].hit_tokens, recs[1].input_tokens
    assert hit > 0 and runs.count((n_in - hit, hit)) == 2 and runs.count((n_in, 0)) == 2
    assert recs[1].alternated and not recs[0].alternated
    r = recs[1]
    assert all(math.isfinite(x) and x > 0 for x in (r.suffix_ms, r.full_ms, r.suffix_again_ms, r.full_again_ms))
    assert math.isnan(recs[0].suffix_again_ms)


def test_off_by_default_and_under_batched_replay(tiny_model, tiny_shape):
    from sim.replay.runner import Replayer
    from sim.replay.store import CheckpointStore

    store = CheckpointStore(tiny_shape, torch.float32, device="cpu")
    assert not Replayer(tiny_model, store, lambda r: None).alternate
    # batched replay times batches, not a request's own calls: nothing to alternate
    assert not Replayer(tiny_model, store, lambda r: None, batch=4, alternate=True).alternate
    assert Replayer(tiny_model, store, lambda r: None, alternate=True).alternate


class _Clock:
    """A resolved stand-in: a handle is its own ms."""

    def ms(self, h):
        return float(h)

    def host_ms(self, h):
        return 1.0 + h / 100

    def slack_ms(self, h):
        return 2.0 + h / 100

    def sleep_ms(self, h):
        return 0.5


class _Marks:
    def __init__(self, by):
        self.by = by

    def ms_by_type(self):
        return dict(self.by)


def test_each_call_and_its_splits_are_the_means_the_check_the_first_calls():
    t = PendingTimes()
    t.suffix, t.suffix_marks = 10.0, _Marks({"attention": 4.0, "mlp": 6.0})
    t.full, t.full_marks = 21.0, _Marks({"attention": 8.0, "mlp": 12.0, CHECK: 1.0})  # 20 ms of prefill
    t.full_again = (24.0, _Marks({"attention": 10.0, "mlp": 14.0}))
    t.suffix_again = (14.0, _Marks({"attention": 5.0, "mlp": 8.0, "gated_delta": 1.0}))
    rec = RequestRecord(request=0, input_tokens=100, output_tokens=1)
    t.resolve(rec, _Clock())
    assert rec.suffix_ms == 12.0 and rec.full_ms == 22.0  # (10 + 14) / 2, (20 + 24) / 2
    assert rec.suffix_again_ms == 14.0 and rec.full_again_ms == 24.0 and rec.alternated
    assert rec.suffix_ms_by_type == {"attention": 4.5, "gated_delta": 0.5, "mlp": 7.0}
    assert rec.full_ms_by_type == {"attention": 9.0, "mlp": 13.0, CHECK: 1.0}
    # the host issue and slack stay the first calls' (what marks a call host-bound)
    assert rec.suffix_host_ms == 1.1 and rec.full_slack_ms == 2.21
    # the handles are let go
    assert t.suffix_again is None and t.full_again is None and t.suffix is None


def test_splits_from_the_second_calls_alone_where_the_first_had_none():
    t = PendingTimes()
    t.suffix, t.full = 10.0, 20.0  # the first calls unmarked
    t.suffix_again = (14.0, _Marks({"attention": 6.0}))
    t.full_again = (24.0, None)
    rec = RequestRecord(request=0, input_tokens=100, output_tokens=1)
    t.resolve(rec, _Clock())
    assert rec.suffix_ms_by_type == {"attention": 3.0} and rec.full_ms_by_type == {}
    assert rec.suffix_ms == 12.0 and rec.full_ms == 22.0


def test_the_second_reference_stops_at_the_checks_boundary(tiny_model, tiny_shape):
    """``HitChecker.time_reference`` runs the whole prompt with the check's kernel boundary (the
    chunk multiple below the hit), as the checked reference did."""
    from sim.replay.flight import Flight
    from sim.replay.hits import HitChecker, check_boundary
    from sim.replay.runner import Replayer
    from sim.replay.store import CheckpointStore

    assert [check_boundary(h) for h in (0, 63, 64, 130, 191, 192)] == [0, 0, 64, 128, 128, 192]
    store = CheckpointStore(tiny_shape, torch.float32, device="cpu")
    clock = Replayer(tiny_model, store, lambda r: None).clock
    checker = HitChecker(tiny_model, store, clock)
    seen = []
    real = tiny_model.run

    def spy(tokens, start, pos, bounds, *a, **k):
        seen.append((len(tokens), start, pos, list(bounds)))
        return real(tokens, start, pos, bounds, *a, **k)

    tiny_model.run = spy
    try:
        for hit in (40, 130):
            f = Flight(0, torch.arange(170).numpy() % 50, 170)
            f.hit = hit
            checker.time_reference(f, f.ids(tiny_model.device))
    finally:
        del tiny_model.run
    assert seen == [(170, None, 0, []), (170, None, 0, [128])]


def test_without_a_second_pair_nothing_is_averaged():
    t = PendingTimes()
    t.suffix, t.full = 10.0, 21.0
    t.suffix_again = (14.0, None)  # a reference never timed again: the pair is not used
    rec = RequestRecord(request=0, input_tokens=100, output_tokens=1)
    t.resolve(rec, _Clock())
    assert rec.suffix_ms == 10.0 and rec.full_ms == 21.0 and not rec.alternated


TRACE = "synthetic:chat:sessions=2,turns=3,prompt_tokens=300,user_tokens=40,output_tokens=16,prompts=1"
ARGS = ["replay", "--device", "cpu", "--model", "replay-tiny", "--trace", TRACE, "--no-progress"]


def test_the_cli_option_and_its_table(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, [*ARGS, "--saved-timing", "alternate", "--format", "json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["hits"] > 0 and s["hits"] == s["hits_validated"] and s["failures"] == 0
    t = pd.read_parquet(out / "requests.parquet")
    v = t[t["validated"].astype(bool)]
    assert len(v) == s["hits_validated"] and v["alternated"].all()
    assert (v["suffix_again_ms"] > 0).all() and (v["full_again_ms"] > 0).all()
    assert not t.loc[~t["validated"].astype(bool), "alternated"].any()
    bad = CliRunner().invoke(main, [*ARGS, "--saved-timing", "twice"])
    assert bad.exit_code == 2 and "--saved-timing" in bad.output and "Traceback" not in bad.output


def test_the_saved_spread_is_each_hits_two_pairs_in_quadrature():
    """``measure.saved_spread`` on hand-made hits. Hit A: suffix 9 then 11 ms (mean 10),
    reference 22 then 18 (mean 20): pairs save 13 and 7, spread 3. Hit B: suffix 5 and 5,
    reference 7 then 9: pairs save 2 and 4, spread 1. Together sqrt(9 + 1); a hit timed once
    adds nothing, and none alternated is None."""
    from sim.replay.measure import saved_spread

    df = pd.DataFrame(
        dict(
            suffix_ms=[10.0, 5.0, 3.0],
            full_ms=[20.0, 8.0, 9.0],
            suffix_again_ms=[11.0, 5.0, float("nan")],
            full_again_ms=[18.0, 9.0, float("nan")],
            alternated=[True, True, False],
        )
    )
    assert saved_spread(df) == pytest.approx(10**0.5)
    assert saved_spread(df.iloc[[0]]) == pytest.approx(3.0)
    assert saved_spread(df.iloc[[2]]) is None and saved_spread(df.iloc[:0]) is None
    assert saved_spread(df.drop(columns=["alternated"])) is None
    # a row without the mark (None: tables of runs before it, concatenated) is not alternated
    unmarked = df.assign(alternated=pd.Series([True, True, None], dtype=object))
    assert saved_spread(unmarked) == pytest.approx(10**0.5)


def test_the_saved_line_says_the_spread_where_hits_were_alternated():
    from sim.cli.replay import saved_line

    s = dict(measured_ms_saved_validated=52.3, modelled_ms_saved_validated=40.8, time_saved_spread_ms=7.94)
    assert saved_line(s).startswith(
        "measured 52.3 ms +/- 7.9 ms (the spread of each hit's two alternated pairs), modelled 40.8 ms"
    )
    assert saved_line(dict(s, time_saved_spread_ms=None)).startswith("measured 52.3 ms, modelled 40.8 ms")


def test_an_alternated_run_reports_its_spread_and_a_once_run_none(tmp_path):
    """The summary's ``time_saved_spread_ms`` from a real alternated replay equals the spread of
    its own requests' table; a run timed once has none."""
    from sim.replay.measure import saved_spread

    out = tmp_path / "alt"
    res = CliRunner().invoke(main, [*ARGS, "--saved-timing", "alternate", "--format", "json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    t = pd.read_parquet(out / "requests.parquet")
    v = t[t["validated"].astype(bool) & t["full_ms"].notna() & t["suffix_ms"].notna()]
    assert s["time_saved_spread_ms"] == pytest.approx(saved_spread(v)) and s["time_saved_spread_ms"] > 0
    once = CliRunner().invoke(main, [*ARGS, "--format", "json"])
    assert once.exit_code == 0 and "time_saved_spread_ms" not in json.loads(once.stdout)
