import numpy as np
import pytest

from traces.base import Request, Trace, TraceError
from traces.stats import prefix_hashes, trace_stats, upper_bounds


def _open(reqs, block=1, lens=None):
    out = []
    for i, (sid, inp, outp) in enumerate(reqs):
        il, ol = lens[i] if lens else (-1, -1)
        out.append(
            Request(
                sid,
                0,
                np.array(inp, dtype=np.int64),
                np.array(outp, dtype=np.int64),
                arrival=float(i),
                input_len=il,
                output_len=ol,
            )
        )
    return Trace("t", out, block_tokens=block, closed_loop=False)


def test_prefix_hashes_distinguish_prefixes():
    h = prefix_hashes(np.array([1, 2, 3, 1, 2, 3]))
    assert len(set(h.tolist())) == 6
    assert prefix_hashes(np.array([1, 2]))[1] == h[1]
    assert prefix_hashes(np.array([2, 1]))[1] != h[1]


def test_hand_computed_bounds():
    tr = _open(
        [
            (0, [1, 2, 3, 4], [5, 6]),  # hit 0
            (1, [1, 2, 3, 4, 5, 6, 7], []),  # hit 6: earlier input + output
            (2, [1, 2, 9], [3]),  # hit 2
            (3, [8], [1]),  # hit 0
            (4, [1, 2, 9, 3, 4], []),  # hit 4 (the previous request's output counts)
        ]
    )
    ub = upper_bounds(tr, boundary=4)
    assert ub["kv_hit_tokens"] == 6 + 2 + 4
    assert ub["kv_hit_rate"] == pytest.approx(12 / 20)
    assert ub["hybrid_every_hit_rate"] == ub["kv_hit_rate"]
    assert ub["hybrid_4_hit_tokens"] == 4 + 0 + 4
    assert ub["request_hit_rate"] == pytest.approx(3 / 5)


def test_64_token_boundary():
    tr = _open([(0, list(range(100)), list(range(100, 110))), (1, list(range(130)), [])])
    st = trace_stats(tr)
    assert st["kv_hit_tokens"] == 110 and st["hybrid_64_hit_tokens"] == 64
    assert st["kv_hit_rate"] == pytest.approx(110 / 230)
    assert st["hybrid_64_hit_rate"] == pytest.approx(64 / 230)
    assert st["requests"] == 2 and st["sessions"] == 2 and st["input_tokens"] == 230


def test_block_tokens_and_partial_last_block():
    tr = _open(
        [(0, [0, 1], [-1]), (1, [0, 1], [-2]), (2, [0, 2, 3], [])], block=512, lens=[(700, 10), (700, 10), (1300, 0)]
    )
    st = trace_stats(tr)
    assert st["input_tokens"] == 2700 and st["output_tokens"] == 20
    assert st["kv_hit_tokens"] == 700 + 512  # the full (partial-block) input, then one block
    assert st["hybrid_64_hit_tokens"] == 640 + 512


def test_closed_loop_replay_order():
    a = Request(0, 0, np.array([1, 2]), np.array([3]), think_time=0.0)
    b = Request(0, 1, np.array([1, 2, 3, 4]), np.array([5]), think_time=5.0)
    c = Request(1, 0, np.array([1, 2, 3, 4, 5, 6]), np.array([7]), think_time=0.0)
    tr = Trace("c", [a, b, c])
    # rate 1: c (t=1) comes before b (t=5): c hits 3 tokens, b then hits 4 (c's input)
    assert upper_bounds(tr, rate=1.0)["kv_hit_tokens"] == 3 + 4
    # rate 0.1: c starts at 10 s, after b (t=5): b hits 3, c hits 5
    assert upper_bounds(tr, rate=0.1)["kv_hit_tokens"] == 3 + 5


def test_default_sharegpt_bounds(default_sharegpt):
    st = trace_stats(default_sharegpt)
    assert st["sessions"] == 100 and st["requests"] == 1235
    assert 0.9 < st["hybrid_64_hit_rate"] < st["kv_hit_rate"] < 1.0


def test_a_large_trace_shows_a_progress_bar_while_its_bounds_are_computed(monkeypatch, capsys):
    """640,000 Mooncake rows spent 13-20 s in the bounds after the reading bar closed, with nothing
    on the screen; a trace of PROGRESS_REQUESTS or more shows a bar (with progress on), and the
    numbers are the same with or without it."""
    import traces.stats as stats

    tr = _open([(0, [1, 2, 3, 4], [5, 6]), (1, [1, 2, 3, 4, 5, 6, 7], []), (2, [1, 2, 9], [3])])
    quiet = upper_bounds(tr, progress=True)  # below the threshold: no bar
    assert "infinite-cache bounds" not in capsys.readouterr().err
    monkeypatch.setattr(stats, "PROGRESS_REQUESTS", 3)
    assert upper_bounds(tr, progress=False) == quiet
    assert "infinite-cache bounds" not in capsys.readouterr().err
    assert trace_stats(tr, progress=True)["kv_hit_tokens"] == quiet["kv_hit_tokens"] == 6 + 2
    assert "infinite-cache bounds" in capsys.readouterr().err


def test_bounds_that_would_outgrow_memory_stop_in_one_line(monkeypatch):
    """The bounds keep every distinct prefix in a set (~70 bytes each): a token each for a trace
    spelled out with --hash-block-tokens, which filled the machine. Once the set would outgrow the
    memory available at the start, one TraceError says so (and, spelled, the way out)."""
    import traces.stats as stats

    # 4 requests of 10 fresh symbols: 10, 20, 30, 40 distinct prefixes; room for 25
    tr = _open([(i, list(range(100 * i, 100 * i + 10)), []) for i in range(4)])
    monkeypatch.setattr(stats, "available_memory", lambda: int(25 * stats.PREFIX_BYTES / 0.9) + 1)
    with pytest.raises(
        TraceError, match=r"^t: the infinite-cache bounds keep every distinct prefix, 30 after 30 prompt"
    ):
        upper_bounds(tr)
    tr.meta["hash_block_tokens"] = 512
    with pytest.raises(TraceError, match=r"without --hash-block-tokens they keep one a hash block, not one a token$"):
        upper_bounds(tr)
    monkeypatch.setattr(stats, "available_memory", lambda: int(40 * stats.PREFIX_BYTES / 0.9) + 1)
    assert upper_bounds(tr)["distinct_prefixes"] == 40
