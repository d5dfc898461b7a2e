"""The miss ledger keeps each request's sequence (prompt + output) for as long as the run lasts:
where the trace holds them in one buffer it keeps a view of it, not a copy (a copy per request
held every chat or agent turn's whole history again: 100 MB more peak memory for 1,800 agent
requests)."""

import numpy as np

from sim.engine.misses import MissLedger
from traces.base import Request


def _ledger(n: int) -> MissLedger:
    return MissLedger(n, block_tokens=1, grid_tokens=1, stores_last_token=True, cap_minus_one=False)


def test_sequence_kept_as_a_view_of_the_trace_buffer():
    buf = np.arange(10, dtype=np.int64)
    first = Request(session_id=0, turn=0, input_tokens=buf[:3], output_tokens=buf[3:5], request_id=0)
    second = Request(session_id=0, turn=1, input_tokens=buf[:7], output_tokens=buf[7:10], request_id=1)
    ledger = _ledger(2)
    ledger.looked_up(first, 0, 3)
    ledger.looked_up(second, 0, 7)
    for r in (first, second):
        kept = ledger._seqs[r.request_id]
        assert np.shares_memory(kept, buf)
        assert kept.tolist() == buf[: len(r.input_tokens) + len(r.output_tokens)].tolist()
    # the second shares its first 5 symbols with the first (prompt + output), the rest is new
    assert ledger.counts["never_shared"].tolist() == [3, 2]


def test_sequence_apart_in_memory_is_copied_whole():
    r = Request(session_id=0, turn=0, input_tokens=np.array([1, 2, 3]), output_tokens=np.array([4, 5]), request_id=0)
    ledger = _ledger(1)
    ledger.looked_up(r, 0, 3)
    assert ledger._seqs[0].tolist() == [1, 2, 3, 4, 5]
