"""``--session-range START:STOP``: keep a slice of a trace's sessions (``marconi advise --holdout``
tunes on the first part of a trace and checks the rest; the `marconi run` lines it prints select
the same parts with this option).

Sessions are numbered 0, 1, ... in order of first appearance (the order the simulator starts
them in); STOP is exclusive and may be left out (``50:``: every session from the 51st on). The
slice keeps each request as it is (tokens, think times, arrivals); a closed-loop slice is
started from time 0 by the simulator's session schedule like any trace.
"""

from __future__ import annotations

from traces.base import Trace, TraceError


def parse_session_range(text: str) -> tuple[int, int | None]:
    """'10:20' -> (10, 20); '50:' -> (50, None)."""
    lo, sep, hi = str(text).strip().partition(":")
    try:
        if not sep:
            raise ValueError
        start = int(lo) if lo.strip() else 0
        stop = int(hi) if hi.strip() else None
    except ValueError:
        raise TraceError(f"--session-range must look like START:STOP (0:50, 50:), not {text!r}") from None
    if start < 0 or (stop is not None and stop <= start):
        raise TraceError(f"--session-range {text!r}: need 0 <= START < STOP")
    return start, stop


def select_sessions(trace: Trace, text: str) -> Trace:
    """The sessions ``text`` (START:STOP) of ``trace``, in their order; TraceError when none is left."""
    start, stop = parse_session_range(text)
    order: dict[int, int] = {}
    for r in trace.requests:
        order.setdefault(r.session_id, len(order))
    n = len(order)
    keep = {sid for sid, i in order.items() if start <= i and (stop is None or i < stop)}
    if not keep:
        raise TraceError(f"--session-range {text}: the trace has only {n} sessions")
    reqs = [r for r in trace.requests if r.session_id in keep]
    meta = {**trace.meta, "session_range": text, "sessions_total": n}
    return Trace(trace.name, reqs, block_tokens=trace.block_tokens, closed_loop=trace.closed_loop, meta=meta)
