"""Hash-block traces without tokens: Mooncake (512-token blocks) and Alibaba Bailian (16-token).

Each ``hash_ids`` entry is one symbol standing for ``block_tokens`` tokens (the last block may be
partial): two requests share their first k blocks iff their first k hash ids are equal. Rows must
satisfy ``len(hash_ids) == ceil(input_length / block_tokens)``.

- ``mooncake:PATH``: ``{timestamp (ms), input_length, output_length, hash_ids}``; no session
  information, so every request is its own session (turn 0).
- ``bailian:PATH``: ``{chat_id, parent_chat_id (-1 = root), turn, timestamp (s), input_length,
  output_length, type, hash_ids}``; a request joins the session of its parent chat (a parent
  missing from the file starts a new session).

Open loop: arrival = (timestamp - first timestamp) * time_scale seconds; timestamps must not go
backwards. Outputs carry no hashes: each request gets ceil(output_length / block) fresh negative
symbols, unique in the trace, so an answer is only ever reused through a later request's hash_ids.
``input_len`` / ``output_len`` are set in tokens.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from traces.base import SYMBOL_DTYPE, Request, Trace, TraceError
from traces.jsonl import JsonlReader, RowProblem, require, require_int_list, require_length

BLOCK_TOKENS = {"mooncake": 512, "bailian": 16}
TIME_UNIT = {"mooncake": 1e-3, "bailian": 1.0}


def load(kind: str, path: str, options) -> Trace:
    if kind not in BLOCK_TOKENS:
        raise TraceError(f"unknown hash-block trace kind {kind!r}")
    block = BLOCK_TOKENS[kind]
    unit = TIME_UNIT[kind]
    reader = JsonlReader(path, options.skip_bad_rows, what=kind)
    rows: list[tuple] = []  # (session, turn, hash array, ts, input_length, output_length)
    session_of: dict[int, int] = {}
    types: Counter = Counter()
    last_ts = None
    n_sessions = 0
    for line_no, row in reader:
        try:
            ts = require(row, "timestamp")
            il = require_length(row, "input_length")
            ol = require_length(row, "output_length")
            hashes = require_int_list(row, "hash_ids")
            if len(hashes) != math.ceil(il / block):
                raise RowProblem(f"{len(hashes)} hash_ids for input_length {il} "
                                 f"(expected ceil({il}/{block}) = {math.ceil(il / block)})")
            if last_ts is not None and ts < last_ts:
                raise RowProblem(f"timestamp {ts} goes backwards (previous {last_ts})")
            if kind == "bailian":
                chat = require(row, "chat_id", int)
                parent = require(row, "parent_chat_id", int)
                turn = require(row, "turn", int)
                rtype = str(require(row, "type", None))
                if chat in session_of:
                    raise RowProblem(f"duplicate chat_id {chat}")
            else:
                chat = parent = None
                turn = 0
                rtype = None
        except RowProblem as exc:
            reader.bad(line_no, str(exc))
            continue
        last_ts = ts
        if kind == "bailian":
            sid = session_of.get(parent) if parent != -1 else None
            if sid is None:  # a root, or a parent outside the file: a new session
                sid = n_sessions
                n_sessions += 1
            session_of[chat] = sid
            types[rtype] += 1
        else:
            sid = len(rows)
        rows.append((sid, turn, hashes, ts, il, ol))
    if not rows:
        raise TraceError(f"trace {kind}:{path} has no requests (after filtering)")
    t0 = rows[0][3]
    n_out = [math.ceil(ol / block) for *_, ol in rows]
    n_in = [len(h) for _, _, h, *_ in rows]
    buf = np.empty(sum(n_in) + sum(n_out), dtype=SYMBOL_DTYPE)
    reqs: list[Request] = []
    pos = 0
    next_out = -1
    for (sid, turn, hashes, ts, il, ol), ni, no in zip(rows, n_in, n_out):
        buf[pos:pos + ni] = hashes
        inp = buf[pos:pos + ni]
        pos += ni
        buf[pos:pos + no] = np.arange(next_out, next_out - no, -1, dtype=SYMBOL_DTYPE)
        next_out -= no
        out = buf[pos:pos + no]
        pos += no
        reqs.append(Request(session_id=sid, turn=turn, input_tokens=inp, output_tokens=out,
                            arrival=(ts - t0) * unit * options.time_scale, input_len=il, output_len=ol))
    meta = {"source": f"{kind}:{path}", "skipped_rows": reader.skipped, "t0": t0 * unit,
            "time_scale": options.time_scale}
    if types:
        meta["types"] = dict(types)
    return Trace(f"{kind}:{path}", reqs, block_tokens=block, closed_loop=False, meta=meta)

