"""Hash-block traces without tokens: Mooncake (512-token blocks) and Alibaba Bailian (16-token).

Each ``hash_ids`` entry is one symbol standing for ``block_tokens`` tokens (the last block may be
partial): two requests share their first k blocks iff their first k hash ids are equal. Rows must
satisfy ``len(hash_ids) == ceil(input_length / block_tokens)``.

- ``mooncake:PATH``: ``{timestamp (ms), input_length, output_length, hash_ids}``; no session
  information, so every request is its own session (turn 0). ``mooncake:sample`` and
  ``mooncake:sample-synthetic`` are the first 300 rows of Mooncake's two public traces, shipped in
  ``traces/data/`` (Apache-2.0; source in its README).
- ``bailian:PATH``: ``{chat_id, parent_chat_id (-1 = root), turn, timestamp (s), input_length,
  output_length, type, hash_ids}``; a request joins the session of its parent chat (a parent
  missing from the file starts a new session).

Open loop: arrival = (timestamp - first timestamp) * time_scale seconds; timestamps must not go
backwards. Outputs carry no hashes: each request gets ceil(output_length / block) fresh negative
symbols, unique in the trace, so an answer is only ever reused through a later request's hash_ids.
``input_len`` / ``output_len`` are set in tokens.

``--hash-block-tokens`` (``TraceOptions.hash_block_tokens``) spells the symbols out as tokens: symbol
``s`` becomes the ``block_tokens`` ids ``(s + 2**40) * block_tokens + j`` (``j < block_tokens``; the
spelling ``benchmarks/differential_vllm.py`` feeds the engines), each prompt trimmed to its
``input_length`` and each output to its ``output_length``, and the trace's ``block_tokens`` is 1. Input
symbols (>= 0) give ids from ``2**40 * block_tokens`` up, output symbols (-1, -2, ...) the ids just
below, so the two never meet; ids must fit an int64 (hash ids up to ``max_spelled_hash``). Two
requests then share a prefix token by token, as an engine sees them, and an engine preset can put a
state or a block end inside a hash block; the trace holds ``block_tokens`` times as many symbols
(``mooncake:sample``: 4.4 million tokens, 35 MB).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import numpy as np

from traces.base import Request, SizeBudget, Trace, TraceError, compact_dtype
from traces.jsonl import (
    INT64_MAX,
    JsonlReader,
    RowProblem,
    require,
    require_int,
    require_int_list,
    require_length,
    require_time,
)

BLOCK_TOKENS = {"mooncake": 512, "bailian": 16}
# samples shipped in the package (traces/data/, with their source and license in its README):
# `mooncake:sample` and `mooncake:sample-synthetic` (a file of that name in the working folder wins)
DATA_DIR = Path(__file__).resolve().parent / "data"
SAMPLES = {
    ("mooncake", "sample"): "mooncake_conversation_300.jsonl",
    ("mooncake", "sample-synthetic"): "mooncake_synthetic_300.jsonl",
}


def resolve_path(kind: str, path: str) -> str:
    """A bundled sample's file for its short name; any other path unchanged."""
    name = SAMPLES.get((kind, path))
    if name is not None and not os.path.exists(path):
        return str(DATA_DIR / name)
    return path


TIME_UNIT = {"mooncake": 1e-3, "bailian": 1.0}
#: --hash-block-tokens: symbol s is spelled (s + SPELL_OFFSET) * block + j, j < block
SPELL_OFFSET = 1 << 40


def max_spelled_hash(block: int) -> int:
    """The largest hash id whose spelled tokens fit an int64 at ``block`` tokens a symbol."""
    return (INT64_MAX - (block - 1)) // block - SPELL_OFFSET


def spell(symbols, block: int, n: int) -> np.ndarray:
    """The first ``n`` tokens of ``symbols`` spelled out (int64): symbol ``s`` becomes
    ``(s + 2**40) * block + j`` for ``j < block``."""
    s = np.asarray(symbols, dtype=np.int64)
    j = np.arange(block, dtype=np.int64)
    return ((s[:, None] + SPELL_OFFSET) * block + j[None, :]).reshape(-1)[:n]


def unspell(tokens, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(symbol, index in its block) of each spelled token: ``spell``'s inverse."""
    t = np.asarray(tokens, dtype=np.int64)
    return t // block - SPELL_OFFSET, t % block


def _other_kind(kind: str, input_length: int, n_hashes: int, path: str) -> str:
    """The hint for a row whose hash_ids count fits the other kind's block (a Bailian file read as
    Mooncake, or the reverse): which spec reads it; '' when it fits neither."""
    for other, block in BLOCK_TOKENS.items():
        if other != kind and n_hashes == -(-input_length // block):
            return f": {block}-token blocks, a {other.capitalize()} trace? --trace {other}:{path}"
    return ""


def load(kind: str, path: str, options) -> Trace:
    if kind not in BLOCK_TOKENS:
        raise TraceError(f"unknown hash-block trace kind {kind!r}")
    block = BLOCK_TOKENS[kind]
    unit = TIME_UNIT[kind]
    spelled = bool(options.hash_block_tokens)
    hash_hi = max_spelled_hash(block) if spelled else INT64_MAX
    reader = JsonlReader(resolve_path(kind, path), options.skip_bad_rows, what=kind, progress=options.progress)
    budget = SizeBudget(options.max_request_tokens)
    rows: list[tuple] = []  # (session, turn, hash array, ts, input_length, output_length, line)
    session_of: dict[int, int] = {}
    orphans: list[tuple] = []  # (line, chat, parent) of rows whose parent had not been seen yet
    types: Counter = Counter()
    last_ts = None
    n_sessions = 0
    max_hash = 0
    for line_no, row in reader:
        try:
            ts = require_time(row, "timestamp")
            il = require_length(row, "input_length")
            if il == 0:
                raise RowProblem("input_length 0: a request needs at least one input token")
            ol = require_length(row, "output_length")
            budget.check_request(il + ol)
            # ids >= 0: negative symbols stand for the outputs (below)
            try:
                hashes = require_int_list(row, "hash_ids", lo=0, hi=INT64_MAX)
            except RowProblem as exc:  # a signed or unsigned 64-bit hash: the way out said with it
                if "out of range" not in str(exc):
                    raise
                raise RowProblem(
                    f"{exc}: ids are only compared for equality, so number them 0, 1, 2, ... (in order of first "
                    "appearance, say)"
                ) from None
            if spelled and hashes and max(hashes) > hash_hi:
                raise RowProblem(
                    f"hash id {max(hashes)} is too large for --hash-block-tokens (its {block} tokens would "
                    f"not fit an int64; ids up to {hash_hi:,} do)"
                )
            n_blocks = -(-il // block)
            if len(hashes) != n_blocks:
                raise RowProblem(
                    f"{len(hashes)} hash_ids for input_length {il} (expected ceil({il}/{block}) = {n_blocks})"
                    + _other_kind(kind, il, len(hashes), path)
                )
            if last_ts is not None and ts < last_ts:
                raise RowProblem(
                    f"timestamp {ts} goes backwards (previous {last_ts}): rows must be in time order, sort the file by timestamp"
                )
            if kind == "bailian":
                chat = require_int(row, "chat_id")
                parent = require_int(row, "parent_chat_id")
                turn = require_int(row, "turn")
                rtype = str(require(row, "type", None))
                if chat in session_of:
                    raise RowProblem(f"duplicate chat_id {chat}")
                if parent == chat:
                    raise RowProblem(f"chat_id {chat} is its own parent (a cycle)")
            else:
                chat = parent = None
                turn = 0
                rtype = None
        except RowProblem as exc:
            reader.bad(line_no, str(exc))
            continue
        # spelled out, the trace holds a token per token, not a symbol per block
        budget.add(il + ol if spelled else len(hashes) + -(-ol // block), reader.where(line_no))
        last_ts = ts
        if hashes:
            max_hash = max(max_hash, max(hashes))
        if kind == "bailian":
            sid = session_of.get(parent) if parent != -1 else None
            if sid is None and parent != -1:
                orphans.append((line_no, chat, parent))  # checked below: a parent later in the file
            if sid is None:  # a root, or a parent outside the file: a new session
                sid = n_sessions
                n_sessions += 1
            session_of[chat] = sid
            types[rtype] += 1
        else:
            sid = len(rows)
        rows.append((sid, turn, hashes, ts, il, ol, line_no))
    late = [(ln, chat, parent) for ln, chat, parent in orphans if parent in session_of]
    for ln, chat, parent in late:  # its parent comes later: a parent cycle, or rows out of order
        reader.bad(
            ln,
            f"parent_chat_id {parent} of chat_id {chat} appears later in the file (a parent cycle, "
            "or rows out of order): a parent must come before its child",
        )
    if late:  # --skip-bad-rows: those rows left out (their children keep the session they started)
        drop = {ln for ln, _, _ in late}
        rows = [r for r in rows if r[-1] not in drop]
    if not rows:  # why: an empty file, or every row bad (--skip-bad-rows left none)
        why = (
            ("its only row is" if reader.skipped == 1 else f"all {reader.skipped:,} of its rows are")
            + " bad (skipped: --skip-bad-rows)"
            if reader.skipped
            else "the file holds no rows"
        )
        raise TraceError(f"trace {kind}:{path} has no requests: {why}")
    t0 = rows[0][3]
    n_out = [-(-ol // block) for *_, ol, _ in rows]
    n_in = [len(h) for _, _, h, *_ in rows]
    if spelled:  # one int64 token a token: prompts and outputs at their lengths
        buf = np.empty(sum(il + ol for *_, il, ol, _ in rows), dtype=np.int64)
    else:  # int32 when the hash ids and the output symbols (-1 .. -total outputs) all fit
        buf = np.empty(sum(n_in) + sum(n_out), dtype=compact_dtype(-sum(n_out), max_hash))
    reqs: list[Request] = []
    pos = 0
    next_out = -1
    for (sid, turn, hashes, ts, il, ol, line_no), ni, no in zip(rows, n_in, n_out):
        try:
            arrival = (ts - t0) * unit * options.time_scale
        except OverflowError:  # integer timestamps whose difference is beyond a float
            arrival = math.inf
        if not math.isfinite(arrival):
            raise TraceError(
                f"{reader.where(line_no)}: timestamp {ts} gives an arrival beyond a float "
                f"(first timestamp {t0}, time scale {options.time_scale})"
            )
        out_symbols = np.arange(next_out, next_out - no, -1, dtype=buf.dtype)
        next_out -= no
        if spelled:
            ni, no = il, ol
            buf[pos : pos + ni] = spell(hashes, block, il)
            buf[pos + ni : pos + ni + no] = spell(out_symbols, block, ol)
        else:
            buf[pos : pos + ni] = hashes
            buf[pos + ni : pos + ni + no] = out_symbols
        inp = buf[pos : pos + ni]
        pos += ni
        out = buf[pos : pos + no]
        pos += no
        reqs.append(
            Request(
                session_id=sid,
                turn=turn,
                input_tokens=inp,
                output_tokens=out,
                arrival=arrival,
                input_len=il,
                output_len=ol,
            )
        )
    meta = {
        "source": f"{kind}:{path}",
        "skipped_rows": reader.skipped,
        "t0": t0 * unit,
        "time_scale": options.time_scale,
    }
    if types:
        meta["types"] = dict(types)
    if spelled:  # the hash block each token came from: (token // it) - 2**40 is its symbol
        meta["hash_block_tokens"] = block
    return Trace(f"{kind}:{path}", reqs, block_tokens=1 if spelled else block, closed_loop=False, meta=meta)
