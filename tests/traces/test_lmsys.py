import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.base import TraceError
from traces.lmsys import non_ascii_fraction
from traces.registry import TraceOptions, load_trace

SCHEMA = pa.schema(
    [
        ("conversation_id", pa.string()),
        ("model", pa.string()),
        ("conversation", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("turn", pa.int64()),
        ("language", pa.string()),
        ("openai_moderation", pa.list_(pa.struct([("flagged", pa.bool_())]))),
        ("redacted", pa.bool_()),
    ]
)


def _conv(cid, turns, text="question number {k} with some words", answer="answer {k}"):
    conv = []
    for k in range(turns):
        conv.append({"role": "user", "content": text.format(k=k)})
        conv.append({"role": "assistant", "content": answer.format(k=k)})
    return {
        "conversation_id": cid,
        "model": "vicuna-13b",
        "conversation": conv,
        "turn": turns,
        "language": "English",
        "openai_moderation": [{"flagged": False}] * (2 * turns),
        "redacted": False,
    }


ROWS = [
    _conv("c0", 10),
    _conv("c1", 3),
    _conv("c2", 10, text="这是一个中文问题{k}", answer="这是答案"),
    _conv("c3", 11),
]


@pytest.fixture
def shard(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:2], schema=SCHEMA), d / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[2:], schema=SCHEMA), d / "train-00001-of-00002.parquet")
    return d


def _rendered(conv, upto):
    """The ChatML text of a request's input (turn ``upto``), built independently of the loader."""
    text = ""
    for m in conv[: 2 * upto]:
        text += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return text + f"<|im_start|>user\n{conv[2 * upto]['content']}<|im_end|>\n<|im_start|>assistant\n"


def test_folder_filter_and_tokens(shard, qwen):
    tr = load_trace(f"lmsys:{shard}", TraceOptions(sessions=0))
    assert tr.meta["conversation_ids"] == ["c0", "c3"]
    assert tr.meta["non_ascii_dropped"] == 1 and tr.meta["rows"] == 4
    assert tr.n_sessions == 2 and len(tr.requests) == 21
    s0 = tr.sessions()[0]
    for k, r in enumerate(s0):
        assert r.input_tokens.tolist() == qwen._qwen.encode(_rendered(ROWS[0]["conversation"], k))
        assert r.output_tokens.tolist() == qwen.encode(f"answer {k}") + qwen.im_end
        assert r.think_time == (0.0 if k == 0 else 5 / 1.5)  # 5 spaces at 90 wpm
    expected_in = sum(
        len(qwen._qwen.encode(_rendered(ROWS[i]["conversation"], k))) for i, n in ((0, 10), (3, 11)) for k in range(n)
    )
    assert tr.input_tokens_total() == expected_in


def test_single_file_sessions_and_options(shard):
    f = shard / "train-00001-of-00002.parquet"
    assert load_trace(f"lmsys:{f}", TraceOptions()).meta["conversation_ids"] == ["c3"]
    tr = load_trace(f"lmsys:{shard}", TraceOptions(sessions=1))
    assert tr.meta["conversation_ids"] == ["c0"]
    tr = load_trace(f"lmsys:{shard}", TraceOptions(sessions=0, min_rounds=3, max_non_ascii=1.0))
    assert tr.meta["conversation_ids"] == ["c0", "c1", "c2", "c3"]


def test_total_token_cap(shard, qwen):
    full = load_trace(f"lmsys:{shard}", TraceOptions(sessions=1))
    r2 = full.requests[2]
    cap = len(r2.input_tokens) + len(r2.output_tokens)  # turn 2 fits exactly, turn 3 does not
    tr = load_trace(f"lmsys:{shard}", TraceOptions(sessions=1, max_tokens=cap))
    assert len(tr.requests) == 3


def test_non_ascii_fraction():
    assert non_ascii_fraction(["abcd"]) == 0.0
    assert non_ascii_fraction(["ab", "中文"]) == 0.5
    assert non_ascii_fraction([]) == 0.0


def test_bad_inputs(tmp_path, shard):
    with pytest.raises(TraceError, match="LMSys path not found"):
        load_trace(f"lmsys:{tmp_path / 'missing'}", TraceOptions())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match=r"no \.parquet \(or \.json / \.jsonl\) files under"):
        load_trace(f"lmsys:{empty}", TraceOptions())
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"conversation_id": ["x"], "turn": [10]}), bad)
    with pytest.raises(TraceError, match=r"bad\.parquet: missing column 'conversation'"):
        load_trace(f"lmsys:{bad}", TraceOptions())
    broken = tmp_path / "broken.parquet"
    conv_t = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
    pq.write_table(
        pa.table(
            {
                "conversation_id": ["a", "b"],
                "turn": [10, 10],
                "conversation": pa.array([[{"content": None, "role": "user"}], ROWS[0]["conversation"]], type=conv_t),
            }
        ),
        broken,
    )
    with pytest.raises(TraceError, match=r"broken\.parquet: row 0: message 0 lacks a string 'role' or 'content'"):
        load_trace(f"lmsys:{broken}", TraceOptions())
    tr = load_trace(f"lmsys:{broken}", TraceOptions(skip_bad_rows=True))
    assert tr.meta["skipped_rows"] == 1 and tr.meta["conversation_ids"] == ["b"]
    with pytest.raises(TraceError, match="no requests"):
        load_trace(f"lmsys:{shard}", TraceOptions(min_rounds=50))


def test_hub_path_reports_gated_dataset(monkeypatch):
    """The real datasets.load_dataset path runs; offline, it must fail with one clear line."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    pytest.importorskip("datasets")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    with pytest.raises(TraceError, match="cannot load lmsys/lmsys-chat-1m from the Hugging Face hub.*HF_TOKEN"):
        load_trace("lmsys", TraceOptions(use_cache=False))
