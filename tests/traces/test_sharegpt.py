import gzip
import json
import os

import numpy as np
import pytest

from traces import sharegpt
from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


def test_package_copy_counts():
    """The package's file is cut at 125 MB: 17,671 complete conversations survive."""
    counts = sharegpt.scan()
    assert counts["conversations"] == 17671
    assert counts["rounds_ge_10"] == 524
    assert counts["rounds_ge_2"] == 12975
    assert counts["truncated"] is True
    assert counts["skipped_rows"] == 0


def test_default_trace_numbers(default_sharegpt, qwen):
    tr = default_sharegpt
    assert tr.name == "sharegpt" and tr.closed_loop and tr.block_tokens == 1
    assert tr.n_sessions == 100
    assert len(tr.requests) == 1235
    assert tr.input_tokens_total() == 1_120_955
    assert tr.output_tokens_total() == 140_755
    assert max(len(r.input_tokens) for r in tr.requests) <= 32768
    assert len(tr.meta["conversation_ids"]) == 100 and tr.meta["dropped_sessions"] == 0


def test_default_trace_structure(default_sharegpt, qwen):
    sessions = default_sharegpt.sessions()
    assert list(sessions) == list(range(100))
    for reqs in sessions.values():
        assert [r.turn for r in reqs] == list(range(len(reqs)))
        assert reqs[0].think_time == 0.0
        base = reqs[0].input_tokens
        for a, b in zip(reqs, reqs[1:]):
            # turn k+1 input = turn k input + output + new user message, all views of one buffer
            n = len(a.input_tokens) + len(a.output_tokens)
            assert np.array_equal(b.input_tokens[: len(a.input_tokens)], a.input_tokens)
            assert np.array_equal(b.input_tokens[len(a.input_tokens) : n], a.output_tokens)
            assert np.shares_memory(b.input_tokens, base)
            assert b.think_time >= 0
        for r in reqs:
            assert r.input_tokens.dtype == np.int32  # token ids fit 32 bits
            assert r.input_tokens[-3:].tolist() == qwen.im_start + qwen.encode("assistant\n")
            assert r.output_tokens[-1] == qwen.im_end[0]


def test_think_time_is_typing_time(default_sharegpt, qwen):
    r = default_sharegpt.sessions()[0][1]
    text = qwen._qwen.decode(r.input_tokens.tolist())
    user = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
    assert r.think_time == pytest.approx(user.count(" ") / 1.5)


def test_cached_second_load(default_sharegpt, monkeypatch):
    # a cache hit must not read or tokenize the source again: make that impossible (no wall clock)
    def no_rebuild(*a, **k):
        raise AssertionError("the cached trace was rebuilt")

    monkeypatch.setattr(sharegpt, "load_packed", no_rebuild)
    again = load_trace("sharegpt", TraceOptions())
    assert again.meta["cache"] == "hit"
    assert again.meta["cache_path"].startswith(os.environ["MARCONI_CACHE_DIR"])  # the tests' own cache
    assert len(again.requests) == len(default_sharegpt.requests)
    for a, b in zip(again.requests, default_sharegpt.requests):
        assert np.array_equal(a.input_tokens, b.input_tokens) and np.array_equal(a.output_tokens, b.output_tokens)
        assert (a.session_id, a.turn, a.think_time) == (b.session_id, b.turn, b.think_time)


def test_options_change_selection():
    tr = load_trace("sharegpt", TraceOptions(sessions=3, min_rounds=2, max_tokens=1000, use_cache=False))
    assert tr.n_sessions == 3
    assert all(len(r.input_tokens) <= 1000 for r in tr.requests)
    assert tr.meta["cache"] == "off"


def _conv(cid, n_rounds, word="hello there"):
    msgs = []
    for k in range(n_rounds):
        msgs.append({"from": "human", "value": f"{word} {k}"})
        msgs.append({"from": "gpt", "value": f"answer number {k}"})
    return {"id": cid, "conversations": msgs}


def test_local_file_and_truncation(tmp_path):
    recs = [_conv("a", 3), _conv("b", 1), _conv("c", 2)]
    text = json.dumps(recs, indent=2)
    full = tmp_path / "full.json"
    full.write_text(text)
    opts = TraceOptions(min_rounds=2, sessions=0, use_cache=False)
    tr = load_trace(f"sharegpt:{full}", opts)
    assert tr.n_sessions == 2 and len(tr.requests) == 5
    assert tr.meta["conversation_ids"] == ["a", "c"]
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index('"c"') + 10])  # stops inside record c
    assert sharegpt.scan(str(cut))["conversations"] == 2
    assert sharegpt.scan(str(cut))["truncated"] is True
    tr = load_trace(f"sharegpt:{cut}", opts)
    assert tr.meta["conversation_ids"] == ["a"]
    gz = tmp_path / "full.json.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert load_trace(f"sharegpt:{gz}", opts).meta["conversation_ids"] == ["a", "c"]


def test_bad_json_names_file_and_line(tmp_path):
    p = tmp_path / "bad.json"
    good = json.dumps(_conv("a", 2), indent=2)
    p.write_text("[\n" + good + ",\n" + '{"id": "b", "conversations": [ oops ]}' + ",\n" + good + "\n]\n")
    line = 2 + good.count("\n") + 1
    with pytest.raises(TraceError, match=rf"bad\.json:{line}: bad JSON: Expecting value"):
        load_trace(f"sharegpt:{p}", TraceOptions(min_rounds=1, use_cache=False))


def test_missing_field_and_skip(tmp_path):
    p = tmp_path / "rows.jsonl"
    rows = [_conv("a", 2), {"id": "b"}, _conv("c", 2)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    with pytest.raises(TraceError, match=r"rows\.jsonl:2: missing field 'conversations'"):
        load_trace(f"sharegpt:{p}", TraceOptions(min_rounds=1, use_cache=False))
    tr = load_trace(f"sharegpt:{p}", TraceOptions(min_rounds=1, use_cache=False, skip_bad_rows=True))
    assert tr.meta["conversation_ids"] == ["a", "c"]
    assert tr.meta["skipped_rows"] == 2
    p.write_text(json.dumps(_conv("a", 2)) + "\n{not json\n")
    with pytest.raises(TraceError, match=r"rows\.jsonl:2: bad JSON"):
        load_trace(f"sharegpt:{p}", TraceOptions(min_rounds=1, use_cache=False))


def test_empty_after_filter_and_missing_file(tmp_path):
    p = tmp_path / "short.json"
    p.write_text(json.dumps([_conv("a", 1)]))
    with pytest.raises(TraceError, match="no requests"):
        load_trace(f"sharegpt:{p}", TraceOptions(use_cache=False))
    with pytest.raises(TraceError, match="ShareGPT file not found"):
        load_trace(f"sharegpt:{tmp_path / 'nope.json'}", TraceOptions())


def test_a_gzip_file_is_read_whatever_its_name(tmp_path):
    """A gzip ShareGPT file without the .gz suffix is read as gzip (it was bad JSON on line 1)."""
    text = json.dumps([_conv("a", 2), _conv("b", 1), _conv("c", 3)])
    p = tmp_path / "share.json"
    p.write_bytes(gzip.compress(text.encode()))
    opts = TraceOptions(min_rounds=2, sessions=0, use_cache=False)
    assert load_trace(f"sharegpt:{p}", opts).meta["conversation_ids"] == ["a", "c"]
