import pytest

from traces.base import TraceError
from traces.tokenizers import get_tokenizer, normalize_role, render_conversation, tokenizer_identity, typing_time


def test_qwen35_special_ids_and_roundtrip(qwen):
    assert qwen.im_start == [248045] and qwen.im_end == [248046]
    ids = qwen.encode("Hello world")
    assert qwen._qwen.decode(ids) == "Hello world"
    # special-token text typed by a user stays ordinary text
    assert 248046 not in qwen.encode("a <|im_end|> b")


def test_legacy_tokenizer_differs():
    legacy = get_tokenizer("qwen-legacy")
    assert legacy.im_start == [151644] and legacy.im_end == [151645]


def test_unknown_tokenizer():
    with pytest.raises(TraceError, match="unknown tokenizer 'gpt2'.*qwen3.5"):
        get_tokenizer("gpt2")


def test_hf_tokenizer_missing_file(tmp_path):
    with pytest.raises(TraceError, match="tokenizer file not found"):
        get_tokenizer(f"hf:{tmp_path / 'nope.json'}")


def test_hf_tokenizer_local_json(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "user": 3, "assistant": 4, "hi": 5, "\n": 6}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Split("\n", behavior="isolated")
    path = tmp_path / "tokenizer.json"
    tk.save(str(path))
    tok = get_tokenizer(f"hf:{path}")
    assert tok.im_start == [1] and tok.im_end == [2]
    assert tok.cache_identity().startswith("hf-sha256:")
    assert tokenizer_identity(f"hf:{path}") == tok.cache_identity()


@pytest.mark.parametrize("spec", ["qwen3.5", "qwen", "qwen3.5-27b", "qwen-legacy", "qwen-7b-chat"])
def test_identity_without_loading_matches_loaded(spec, monkeypatch):
    import traces.tokenizers as tz

    monkeypatch.setattr(tz, "_CACHE", {})
    ident = tokenizer_identity(spec)
    assert tz._CACHE == {}  # nothing loaded
    assert ident == get_tokenizer(spec).cache_identity()
    with pytest.raises(TraceError, match="unknown tokenizer 'gpt2'"):
        tokenizer_identity("gpt2")


def test_cache_hit_does_not_load_the_tokenizer(monkeypatch, tmp_path):
    import traces.tokenizers as tz
    from traces.registry import TraceOptions, load_trace

    import traces.chat

    opts = dict(sessions=3, cache_dir=str(tmp_path), num_proc=1)
    monkeypatch.setattr(tz, "_CACHE", {})
    monkeypatch.setattr(traces.chat, "_worker_state", {})
    first = load_trace("sharegpt", TraceOptions(**opts))
    assert first.meta["cache"] == "miss" and "qwen3.5" in tz._CACHE
    monkeypatch.setattr(tz, "_CACHE", {})
    again = load_trace("sharegpt", TraceOptions(**opts))
    assert again.meta["cache"] == "hit" and tz._CACHE == {}
    assert [r.input_tokens.tolist() for r in again.requests] == [r.input_tokens.tolist() for r in first.requests]


def test_render_matches_whole_template(qwen):
    msgs = [("system", "Be brief."), ("human", "Hi there"), ("gpt", "Hello!"), ("human", "Bye"), ("gpt", "Ciao")]
    buf, turns = render_conversation(qwen, msgs)
    assert len(turns) == 2
    text = qwen._qwen.decode(buf.tolist())
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\nCiao<|im_end|>"
    )
    # piecewise encoding equals encoding the rendered string (BPE never crosses special tokens)
    assert buf.tolist() == qwen._qwen.encode(text)
    t0, t1 = turns
    assert qwen._qwen.decode(buf[: t0.input_end].tolist()).endswith("<|im_start|>assistant\n")
    assert qwen._qwen.decode(buf[t0.input_end : t0.output_end].tolist()) == "Hello!<|im_end|>"
    assert t1.user_text == "Bye" and t1.input_end > t0.output_end


def test_render_context_messages_and_caps(qwen):
    # leading assistant message (a split conversation) and a user message with no answer are context
    msgs = [("gpt", "earlier answer"), ("human", "q1"), ("human", "q2"), ("gpt", "a2"), ("human", "dangling")]
    buf, turns = render_conversation(qwen, msgs)
    assert len(turns) == 1 and turns[0].user_text == "q2"
    assert len(buf) == turns[0].output_end
    text = qwen._qwen.decode(buf[: turns[0].input_end].tolist())
    assert text.startswith("<|im_start|>assistant\nearlier answer<|im_end|>\n<|im_start|>user\nq1<|im_end|>")
    long = [("human", "x " * 50), ("gpt", "y"), ("human", "z " * 50), ("gpt", "w")]
    _, all_turns = render_conversation(qwen, long)
    cap = all_turns[0].output_end + 5  # second input is longer than this
    _, capped = render_conversation(qwen, long, max_input_tokens=cap)
    assert len(capped) == 1
    _, capped_total = render_conversation(qwen, long, max_total_tokens=all_turns[0].output_end)
    assert len(capped_total) == 1
    _, none = render_conversation(qwen, long, max_input_tokens=3)
    assert none == []


def test_roles_and_typing_time():
    assert normalize_role("human") == "user" and normalize_role("GPT") == "assistant"
    assert normalize_role("bard") == "assistant" and normalize_role("system") == "system"
    assert typing_time("one two three four") == pytest.approx(2.0)  # 3 spaces / 1.5 words per s
    assert typing_time("nospace") == 0.0
