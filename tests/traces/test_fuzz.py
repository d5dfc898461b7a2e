"""Fuzzing every file trace format: random rows and random bytes give a valid trace or one
``TraceError`` naming FILE:LINE (FILE: row N for parquet, or a whole-file message naming the file),
never another exception and never a hang (each example has a deadline).

Rows are drawn as a valid row with 0-3 fields replaced by junk (huge or negative integers, NaN,
Infinity, strings, lists, nulls), so both valid traces and every kind of bad field are reached.
A hang fails the example: each load runs under a 30 s alarm (an example takes milliseconds); the
hypothesis deadline (10 s) flags a slow one without flaking on a loaded machine.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import signal
import threading
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from traces.base import Trace, TraceError
from traces.registry import TraceOptions, load_trace

FUZZ = settings(
    max_examples=40,
    deadline=timedelta(seconds=10),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**30, -1, 2**31, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(-(2**64), 2**64), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
TEXT = st.text(max_size=30)  # any unicode, lone surrogates included


@st.composite
def mutated(draw, row: dict) -> dict:
    """``row`` with up to 3 fields replaced by junk or deleted."""
    row = dict(row)
    for key in draw(st.lists(st.sampled_from(sorted(row)), max_size=3, unique=True)):
        if draw(st.booleans()):
            row[key] = draw(JUNK)
        else:
            del row[key]
    return row


@st.composite
def mooncake_row(draw, ts):
    il = draw(st.integers(0, 3000))
    return {
        "timestamp": ts,
        "input_length": il,
        "output_length": draw(st.integers(0, 2000)),
        "hash_ids": draw(st.lists(st.integers(0, 20), min_size=-(-il // 512), max_size=-(-il // 512))),
    }


@st.composite
def bailian_row(draw, ts):
    il = draw(st.integers(0, 100))
    return {
        "chat_id": draw(st.integers(0, 8)),
        "parent_chat_id": draw(st.integers(-1, 8)),
        "turn": draw(st.integers(0, 5)),
        "timestamp": float(ts),
        "input_length": il,
        "output_length": draw(st.integers(0, 50)),
        "type": draw(st.sampled_from(["text", "image"])),
        "hash_ids": draw(st.lists(st.integers(0, 20), min_size=-(-il // 16), max_size=-(-il // 16))),
    }


@st.composite
def marconi_row(draw, ts):
    inp = draw(st.lists(st.integers(0, 300), max_size=8))
    out = draw(st.lists(st.integers(0, 300), max_size=4))
    return {
        "session_id": draw(st.one_of(st.integers(0, 3), st.text(max_size=2))),
        "turn_id": draw(st.integers(0, 4)),
        "ts": ts / 10,
        "num_input_tokens": len(inp),
        "num_output_tokens": len(out),
        "input_tokens": inp,
        "output_tokens": out,
    }


@st.composite
def sharegpt_record(draw):
    roles = st.sampled_from(["human", "gpt", "user", "assistant", "system", "tool", "HUMAN"])
    pair = st.tuples(st.sampled_from(["human", "user"]), TEXT, st.sampled_from(["gpt", "assistant"]), TEXT)
    msgs = []
    for item in draw(st.lists(st.one_of(pair, st.tuples(roles, TEXT)), max_size=5)):
        msgs += [{"from": item[k], "value": item[k + 1]} for k in range(0, len(item), 2)]
    rec = {"id": draw(st.text(max_size=4)), "conversations": msgs}
    return draw(mutated(rec)) if draw(st.integers(0, 3)) == 0 else rec


ROWS = {"mooncake": mooncake_row, "bailian": bailian_row, "marconi-jsonl": marconi_row}


@st.composite
def jsonl_lines(draw, kind):
    n = draw(st.integers(1, 6))
    stamps = sorted(draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)))
    lines = []
    for ts in stamps:
        choice = draw(st.integers(0, 9))
        if choice == 0:
            lines.append(draw(st.text(max_size=20)).replace("\n", " "))  # not JSON (or not an object)
        else:
            row = draw(ROWS[kind](ts))
            if choice > 5:
                row = draw(mutated(row))
            lines.append(json.dumps(row))  # NaN / Infinity written as JSON's extensions
    return "\n".join(lines) + "\n"


def _file_level(msg: str) -> bool:
    # a chat trace says why it has none (traces.chat._why_empty), the others "(after filtering)"
    return bool(
        re.search(r"has no requests( \(after filtering\)$|: )|: empty file$|^cannot read |: missing column ", msg)
    )


class Hang(BaseException):
    """Raised by the alarm; a BaseException so no loader's ``except Exception`` can swallow it."""


@contextmanager
def no_hang(seconds: float = 30.0):
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(*_):
        raise Hang(f"the loader ran for more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _check(path, spec: str, options: TraceOptions, row_label: str = r"\d+") -> Trace | None:
    try:
        with no_hang():
            tr = load_trace(spec, options)
    except TraceError as exc:
        msg = str(exc)
        assert "\n" not in msg, msg
        assert str(path) in msg, msg
        assert re.match(rf"{re.escape(str(path))}:{row_label}: ", msg) or _file_level(msg), msg
        event("TraceError")
        return None
    event("valid trace")
    dtypes = {a.dtype for r in tr.requests for a in (r.input_tokens, r.output_tokens)}
    assert len(dtypes) == 1 and dtypes <= {np.dtype(np.int32), np.dtype(np.int64)}
    if not tr.closed_loop:
        arrivals = [r.arrival for r in tr.requests]
        assert all(math.isfinite(a) for a in arrivals)
    for r in tr.requests:
        assert r.n_input_tokens(tr.block_tokens) >= 0 and r.n_output_tokens(tr.block_tokens) >= 0
        assert r.n_input_tokens(tr.block_tokens) + r.n_output_tokens(tr.block_tokens) <= options.max_request_tokens
    return tr


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def _opts(**kw) -> TraceOptions:
    return TraceOptions(sessions=0, min_rounds=0, use_cache=False, num_proc=1, **kw)


# ---------------------------------------------------------------------------- JSONL formats


@pytest.mark.parametrize("kind", ["mooncake", "bailian", "marconi-jsonl"])
@pytest.mark.parametrize("skip", [False, True], ids=["strict", "skip-bad-rows"])
@FUZZ
@given(data=st.data())
def test_jsonl_random_rows(fuzz_dir, kind, skip, data):
    text = data.draw(jsonl_lines(kind))
    path = fuzz_dir / f"{kind}.jsonl"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _check(path, f"{kind}:{path}", _opts(skip_bad_rows=skip))


@pytest.mark.parametrize("kind", ["mooncake", "bailian", "marconi-jsonl"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@FUZZ
@given(blob=st.binary(max_size=300))
def test_jsonl_random_bytes(fuzz_dir, kind, gz, blob):
    path = fuzz_dir / (f"{kind}.jsonl.gz" if gz else f"{kind}.jsonl")
    path.write_bytes(blob)
    _check(path, f"{kind}:{path}", _opts())


# ---------------------------------------------------------------------------- ShareGPT


@pytest.mark.parametrize("layout", ["array", "jsonl"])
@FUZZ
@given(
    records=st.lists(st.one_of(sharegpt_record(), sharegpt_record(), sharegpt_record(), JUNK), max_size=5),
    cut=st.integers(0, 40),
)
def test_sharegpt_random_records(fuzz_dir, qwen, layout, records, cut):
    if layout == "array":
        text = json.dumps(records, indent=1)
        text = text[: len(text) - cut] if cut < 20 else text  # sometimes cut inside the last record
    else:
        text = "\n".join(json.dumps(r) for r in records) + "\n"
    path = fuzz_dir / f"sharegpt.{layout}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _check(path, f"sharegpt:{path}", _opts())
    _check(path, f"sharegpt:{path}", _opts(skip_bad_rows=True))


@pytest.mark.parametrize("prefix", [b"", b"[", b"[\n{"], ids=["bytes", "array", "record"])
@FUZZ
@given(blob=st.binary(max_size=300))
def test_sharegpt_random_bytes(fuzz_dir, qwen, prefix, blob):
    path = fuzz_dir / "sharegpt.bin"
    path.write_bytes(prefix + blob)
    _check(path, f"sharegpt:{path}", _opts())


def test_sharegpt_gz_random_bytes(fuzz_dir):
    path = fuzz_dir / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceError, match=f"^cannot read {re.escape(str(path))}: "):
        load_trace(f"sharegpt:{path}", _opts())
    path.write_bytes(gzip.compress(b'[{"id": 1, "conversations": [')[:-6])  # stream cut short
    with pytest.raises(TraceError, match=f"^cannot read {re.escape(str(path))}: "):
        load_trace(f"sharegpt:{path}", _opts())


# ---------------------------------------------------------------------------- LMSys parquet


@st.composite
def lmsys_table(draw):
    import pyarrow as pa

    text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)  # parquet holds valid UTF-8 only
    msg = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "user", "assistant", "system", None]),
            "content": st.one_of(text, text, text, st.none()),
        }
    )
    conv_t = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
    layout = draw(st.sampled_from(["standard", "standard", "conversation-as-text", "no-conversation", "turn-as-text"]))
    n = draw(st.integers(1, 5))
    cids = draw(
        st.lists(
            st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=4), st.none()), min_size=n, max_size=n
        )
    )
    if layout == "no-conversation":
        return pa.table({"conversation_id": pa.array(cids, pa.string())})
    if layout == "conversation-as-text":
        return pa.table({"conversation": pa.array(draw(st.lists(text, min_size=n, max_size=n)), pa.string())})
    turn_pair = st.tuples(text, text).map(
        lambda t: [{"role": "user", "content": t[0]}, {"role": "assistant", "content": t[1]}]
    )
    chat = st.lists(st.one_of(turn_pair, turn_pair, msg.map(lambda m: [m])), max_size=4).map(lambda ms: sum(ms, []))
    convs = draw(st.lists(st.one_of(chat, chat, st.lists(msg, max_size=4), st.none()), min_size=n, max_size=n))
    if layout == "turn-as-text":
        turns = pa.array(draw(st.lists(st.one_of(text, st.none()), min_size=n, max_size=n)), pa.string())
    else:
        turn = st.one_of(st.integers(0, 4), st.integers(0, 4), st.integers(-(2**63), 2**63 - 1), st.none())
        turns = pa.array(draw(st.lists(turn, min_size=n, max_size=n)), pa.int64())
    return pa.table(
        {"conversation_id": pa.array(cids, pa.string()), "conversation": pa.array(convs, conv_t), "turn": turns}
    )


@pytest.mark.parametrize("skip", [False, True], ids=["strict", "skip-bad-rows"])
@FUZZ
@given(table=lmsys_table())
def test_lmsys_random_rows(fuzz_dir, qwen, skip, table):
    import pyarrow.parquet as pq

    path = fuzz_dir / "lmsys.parquet"
    pq.write_table(table, path)
    _check(path, f"lmsys:{path}", _opts(skip_bad_rows=skip, max_non_ascii=1.0), row_label=r" row \d+")


@pytest.mark.parametrize("magic", [False, True], ids=["bytes", "PAR1-framed"])
@FUZZ
@given(blob=st.binary(max_size=400))
def test_lmsys_random_bytes(fuzz_dir, magic, blob):
    path = fuzz_dir / "lmsys-bytes.parquet"
    path.write_bytes(b"PAR1" + blob + b"PAR1" if magic else blob)
    _check(path, f"lmsys:{path}", _opts(), row_label=r" row \d+")


@pytest.fixture(scope="module")
def parquet_bytes(fuzz_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    conv = [{"role": "user", "content": "hello " * 40}, {"role": "assistant", "content": "hi " * 40}]
    path = fuzz_dir / "valid.parquet"
    pq.write_table(pa.table({"conversation": [conv] * 50, "turn": [1] * 50}), path)
    return path.read_bytes()


@FUZZ
@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=8))
def test_lmsys_corrupted_parquet(fuzz_dir, qwen, parquet_bytes, flips):
    """A valid file with a few bytes flipped: corrupt pages surface only while batches are read."""
    data = bytearray(parquet_bytes)
    for pos, xor in flips:
        data[4 + int(pos * (len(data) - 8))] ^= xor  # keep the PAR1 magic at both ends
    path = fuzz_dir / "corrupt.parquet"
    path.write_bytes(bytes(data))
    _check(path, f"lmsys:{path}", _opts(max_non_ascii=1.0), row_label=r" row \d+")


DEEP = "[" * 100_000 + "]" * 100_000  # beyond Python's recursion limit
HUGE = "9" * 5000  # beyond Python's 4,300-digit int conversion limit


@pytest.mark.parametrize(
    "kind, text, line",
    [
        ("sharegpt", "[\n" + DEEP + "\n]", 2),  # the record starts on line 2
        ("sharegpt", '{"conversations": ' + DEEP + "}\n", 1),
        ("sharegpt", '[{"id": ' + HUGE + ', "conversations": []}]', 1),
        ("sharegpt", '{"id": ' + HUGE + ', "conversations": []}\n', 1),
        ("mooncake", '{"timestamp": ' + DEEP + "}\n", 1),
        ("mooncake", '\n{"timestamp": ' + HUGE + "}\n", 2),
        ("bailian", '{"chat_id": ' + HUGE + "}\n", 1),
        ("marconi-jsonl", '{"input_tokens": ' + DEEP + "}\n", 1),
    ],
    ids=[
        "sharegpt-array-deep",
        "sharegpt-jsonl-deep",
        "sharegpt-array-huge-int",
        "sharegpt-jsonl-huge-int",
        "mooncake-deep",
        "mooncake-huge-int",
        "bailian-huge-int",
        "marconi-jsonl-deep",
    ],
)
def test_pathological_json(fuzz_dir, kind, text, line):
    """Nesting deeper than the recursion limit and integers longer than Python converts: bad JSON
    on their line, not a RecursionError or ValueError traceback."""
    path = fuzz_dir / f"pathological-{kind}.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}:{line}: bad JSON: "):
        load_trace(f"{kind}:{path}", _opts())
