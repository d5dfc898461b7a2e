"""The Marconi artifact's pre-tokenized JSONL (``marconi-jsonl:PATH``, plain or ``.gz``).

One request per line: ``{session_id, turn_id, ts, num_input_tokens, num_output_tokens,
input_tokens, output_tokens}`` with the full history in ``input_tokens``. Requests keep file order
(the artifact replays in that order); open loop with arrival = (ts - first ts) * time_scale (the
artifact's files start at ts 0, so arrival = ts). Consecutive turns of a session whose input
extends the previous input + output share one buffer, so the repeated history is stored once.
"""

from __future__ import annotations

import math

from traces.base import SizeBudget, Trace, TraceError
from traces.jsonl import JsonlReader, RowProblem, require, require_int, require_int_list, require_length, require_time
from traces.packing import TraceBuilder

TOKEN_ID_MAX = 2**31 - 1  # no tokenizer's vocabulary comes near; token buffers are int32


def load(path: str, options) -> Trace:
    reader = JsonlReader(path, options.skip_bad_rows, what="marconi-jsonl", progress=options.progress)
    name = f"marconi-jsonl:{path}"
    builder = TraceBuilder(name, block_tokens=1, closed_loop=False)
    budget = SizeBudget(options.max_request_tokens)
    sessions: dict = {}
    seen: dict = {}  # (session_id, turn_id) -> line: a turn appears once
    last_ts = None
    t0 = None
    for line_no, row in reader:
        try:
            sid_raw = require(row, "session_id", (int, str))
            turn = require_int(row, "turn_id")
            ts = require_time(row, "ts")
            n_in = require_length(row, "num_input_tokens")
            if n_in == 0:
                raise RowProblem("num_input_tokens 0: a request needs at least one input token")
            n_out = require_length(row, "num_output_tokens")
            budget.check_request(n_in + n_out)
            inp = require_int_list(row, "input_tokens", lo=0, hi=TOKEN_ID_MAX)
            out = require_int_list(row, "output_tokens", lo=0, hi=TOKEN_ID_MAX)
            if len(inp) != n_in:
                raise RowProblem(f"num_input_tokens {n_in} but {len(inp)} input_tokens")
            if len(out) != n_out:
                raise RowProblem(f"num_output_tokens {n_out} but {len(out)} output_tokens")
            if last_ts is not None and ts < last_ts:
                raise RowProblem(
                    f"ts {ts} goes backwards (previous {last_ts}): rows must be in time order, sort the file by ts"
                )
            if (sid_raw, turn) in seen:
                raise RowProblem(f"session_id {sid_raw!r} turn_id {turn} again (first on line {seen[sid_raw, turn]})")
            try:
                arrival = (ts - (ts if t0 is None else t0)) * options.time_scale
            except OverflowError:  # integer timestamps whose difference is beyond a float
                arrival = math.inf
            if not math.isfinite(arrival):
                raise RowProblem(
                    f"ts {ts} gives an arrival beyond a float (first ts {t0}, time scale {options.time_scale})"
                )
        except RowProblem as exc:
            reader.bad(line_no, str(exc))
            continue
        last_ts = ts
        seen[sid_raw, turn] = line_no
        if t0 is None:
            t0 = ts
        sid = sessions.setdefault(sid_raw, len(sessions))
        before = builder.n_symbols
        builder.add_request(sid, turn, inp, out, arrival=arrival)
        budget.add(builder.n_symbols - before, reader.where(line_no))
    if not builder.n_requests:  # why: an empty file, or every row bad (--skip-bad-rows left none)
        n = reader.skipped
        why = (
            ("its only row is" if n == 1 else f"all {n:,} of its rows are") + " bad (skipped: --skip-bad-rows)"
            if n
            else "the file holds no rows"
        )
        raise TraceError(f"trace {name} has no requests: {why}")
    builder.meta.update(
        source=name, skipped_rows=reader.skipped, t0=t0, time_scale=options.time_scale, session_ids=list(sessions)
    )
    return builder.build().to_trace()
