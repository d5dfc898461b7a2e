"""What replay did for one request (``sim.replay.records.RequestRecord``, no torch): the resolved
times write only what was timed, the check's errors, a new lookup carries the earlier runs'
failures and late admits, and every hit left unchecked has its reason once replay is done."""

import math

from sim.replay.records import RequestRecord


def test_timed_writes_only_what_was_timed():
    r = RequestRecord(3, 100, 20)
    r.timed(suffix=(2.0, 0.5, 1.5), suffix_by_type={"gated_delta": 1.5, "other": 0.5})
    assert (r.suffix_ms, r.suffix_host_ms, r.suffix_slack_ms) == (2.0, 0.5, 1.5)
    assert r.suffix_ms_by_type == {"gated_delta": 1.5, "other": 0.5}
    assert math.isnan(r.full_ms) and math.isnan(r.tail_ms) and r.full_ms_by_type == {}
    r.timed(full=(4.0, 1.0, 3.0), full_by_type={"mlp": 4.0}, tail_ms=0.25)
    assert (r.full_ms, r.full_host_ms, r.full_slack_ms, r.tail_ms) == (4.0, 1.0, 3.0, 0.25)
    assert r.full_ms_by_type == {"mlp": 4.0} and r.suffix_ms == 2.0  # the suffix's times stay
    assert r.suffix_ms_by_type == {"gated_delta": 1.5, "other": 0.5}


def test_judged_and_again():
    r = RequestRecord(1, 50, 5)
    r.judged(0.1, 0.2, 0.3, 0.0, False)
    assert (r.max_rec_error, r.max_conv_error, r.max_out_error, r.max_kv_error) == (0.1, 0.2, 0.3, 0.0)
    assert not r.kv_validated
    r.judged(0.1, 0.2, 0.3, 0.4, True)
    assert r.kv_validated and r.max_kv_error == 0.4
    r.failed, r.late_admits = True, 2
    again = RequestRecord(1, 50, 5)
    again.again(r)
    assert (again.failed, again.late_admits, again.lookups) == (True, 2, 2)
    assert again.max_rec_error == 0.0 and not again.kv_validated  # this run's checks are its own


def test_close_gives_every_unchecked_hit_a_reason_and_a_miss_none():
    miss = RequestRecord(0, 10, 2)
    miss.close()
    assert miss.unvalidated == ""
    failed = RequestRecord(1, 10, 2, hit_tokens=4, failed=True)
    sampled = RequestRecord(2, 10, 2, hit_tokens=4, unvalidated="validate-every")
    never = RequestRecord(3, 10, 2, hit_tokens=4)
    checked = RequestRecord(4, 10, 2, hit_tokens=4, validated=True, unvalidated="validate-every")
    for r in (failed, sampled, never, checked):
        r.close()
    assert [r.unvalidated for r in (failed, sampled, never, checked)] == [
        "failed a check",
        "validate-every",
        "never checked",
        "",
    ]
