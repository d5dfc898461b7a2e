"""ShareGPT files as users bring them (session 24's new-user hunt): the OpenAI-style ``messages``
list of ``role`` / ``content`` messages, and a file that goes on after its JSON array."""

import json

import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace


def _opts(tmp_path, **kw):
    return TraceOptions(cache_dir=str(tmp_path / "cache"), min_rounds=1, sessions=0, num_proc=1, **kw)


CONV = [("human", "What is two plus two?"), ("gpt", "Four."), ("human", "Und auf Deutsch? 你好"), ("gpt", "Vier.")]


def _sharegpt(cid):
    return {"id": cid, "conversations": [{"from": r, "value": v} for r, v in CONV]}


def _openai(cid):
    roles = {"human": "user", "gpt": "assistant"}
    return {"id": cid, "messages": [{"role": roles[r], "content": v} for r, v in CONV]}


@pytest.mark.parametrize("jsonl", [False, True])
def test_messages_with_role_and_content_read_as_conversations(tmp_path, jsonl):
    """A record's ``messages`` of ``{role, content}`` is the same conversation as ``conversations``
    of ``{from, value}``: the same tokens, request for request (it stopped at record 1: "missing
    field 'conversations'")."""
    recs_a = [_sharegpt("a"), _sharegpt("b")]
    recs_b = [_openai("a"), _openai("b")]
    a, b = tmp_path / "a.json", tmp_path / ("b.jsonl" if jsonl else "b.json")
    a.write_text(json.dumps(recs_a))
    b.write_text("\n".join(json.dumps(r) for r in recs_b) if jsonl else json.dumps(recs_b))
    ta = load_trace(f"sharegpt:{a}", _opts(tmp_path))
    tb = load_trace(f"sharegpt:{b}", _opts(tmp_path))
    assert tb.n_sessions == 2 and len(tb.requests) == 4  # two rounds a conversation
    for ra, rb in zip(ta.requests, tb.requests, strict=True):
        assert ra.input_tokens.tolist() == rb.input_tokens.tolist()
        assert ra.output_tokens.tolist() == rb.output_tokens.tolist()


def test_message_without_text_is_named(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}]))
    with pytest.raises(TraceError, match=r"t\.json:1: message 1 lacks 'from' and 'value' \(or 'role' and 'content'\)"):
        load_trace(f"sharegpt:{f}", _opts(tmp_path))


def test_second_array_after_the_first_is_an_error(tmp_path):
    """``cat a.json b.json > c.json``: the reader stopped at the first ``]`` and ran a's
    conversations alone, without a word; now one line names where the second array starts."""
    one = json.dumps([_sharegpt("a"), _sharegpt("b")])
    f = tmp_path / "cat.json"
    f.write_text(one + "\n" + one)
    with pytest.raises(TraceError, match=r"cat\.json:2: a second JSON array .* ends on line 1"):
        load_trace(f"sharegpt:{f}", _opts(tmp_path))
    g = tmp_path / "junk.json"
    g.write_text(one + "\n\n  trailing words\n")
    with pytest.raises(TraceError, match=r"junk\.json:3: more text after the JSON array"):
        load_trace(f"sharegpt:{g}", _opts(tmp_path))
    # whitespace after the array is no text
    h = tmp_path / "ok.json"
    h.write_text(one + "\n\n \r\n")
    assert len(load_trace(f"sharegpt:{h}", _opts(tmp_path)).requests) == 4


def test_words_per_minute_sets_the_think_times(tmp_path):
    """``TraceOptions.words_per_minute`` was in ShareGPT's cache key but never reached the
    tokenizer: think times stayed at 90 wpm whatever it said (LMSys passed it on)."""
    f = tmp_path / "a.json"
    f.write_text(json.dumps([_sharegpt("a")]))
    # turn 1's user message "Und auf Deutsch? 你好" has 3 spaces: 3 words at 45 wpm = 4 s (90 wpm: 2 s)
    slow = load_trace(f"sharegpt:{f}", _opts(tmp_path, words_per_minute=45.0))
    assert [r.think_time for r in slow.requests] == [0.0, 4.0]
    assert slow.meta["think_time"] == "typing at 45 wpm; first turn 0"
    assert [r.think_time for r in load_trace(f"sharegpt:{f}", _opts(tmp_path)).requests] == [0.0, 2.0]


def test_folder_of_shards_reads_as_one_file(tmp_path):
    """A dataset in shards (RyokoAI/ShareGPT52K: sg_90k_part1.json, sg_90k_part2.json) given as
    its folder: every .json / .jsonl (.gz) file in path order, the same trace as the files joined
    (it was "ShareGPT path is a directory, not a file")."""
    import gzip

    recs = [_sharegpt(c) for c in "abcde"]
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(recs))
    folder = tmp_path / "shards"
    (folder / "more").mkdir(parents=True)
    (folder / "part1.json").write_text(json.dumps(recs[:2]))
    (folder / "more" / "part2.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in recs[2:4]).encode())
    )
    (folder / "part3.jsonl").write_text(json.dumps(_openai("e")) + "\n")
    (folder / "README.md").write_text("not a shard")
    (folder / "dataset_info.json").write_text('{"features": {}}')  # a saved dataset's metadata: not records
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x.json").write_text("[]")
    ta = load_trace(f"sharegpt:{whole}", _opts(tmp_path))
    tb = load_trace(f"sharegpt:{folder}", _opts(tmp_path))
    # path order: more/part2.jsonl.gz, part1.json, part3.jsonl
    assert tb.meta["conversation_ids"] == ["c", "d", "a", "b", "e"]
    by_id = dict(zip(ta.meta["conversation_ids"], ta.sessions().values()))
    for cid, reqs in zip(tb.meta["conversation_ids"], tb.sessions().values()):
        assert [r.input_tokens.tolist() for r in reqs] == [r.input_tokens.tolist() for r in by_id[cid]]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match=r"no \.json or \.jsonl files under .*empty"):
        load_trace(f"sharegpt:{empty}", _opts(tmp_path))


def test_openai_content_parts_are_joined(tmp_path):
    """OpenAI-style content as a list of parts ({type: text, text}; an image part has no text) is the
    parts' text joined: the same tokens as the plain string (it stopped: "'content' is not a string")."""
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps(_openai("a")) + "\n")
    rec = _openai("a")
    text = rec["messages"][2]["content"]
    rec["messages"][2]["content"] = [
        {"type": "text", "text": text[:5]},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        {"type": "text", "text": text[5:]},
    ]
    parts = tmp_path / "parts.jsonl"
    parts.write_text(json.dumps(rec) + "\n")
    ta = load_trace(f"sharegpt:{plain}", _opts(tmp_path))
    tb = load_trace(f"sharegpt:{parts}", _opts(tmp_path))
    assert [r.input_tokens.tolist() for r in ta.requests] == [r.input_tokens.tolist() for r in tb.requests]
    rec["messages"][2]["content"] = {"text": "a dict is no content"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec) + "\n")
    with pytest.raises(
        TraceError, match=r"bad\.jsonl:1: message 2: 'content' is not a string \(or a list of text parts\)"
    ):
        load_trace(f"sharegpt:{bad}", _opts(tmp_path))
