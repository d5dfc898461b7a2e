"""The engine's event stream: what happens to requests and checkpoints, in simulated-time order.

An observer is any object with the methods it cares about (``Observer`` below lists them, with
no-op defaults); the engine calls only the methods an observer defines, so an event nobody listens
to costs nothing. The metrics ``Recorder`` is one observer; ``EventLog`` turns the calls into the
small frozen event objects below (replay and ``marconi run --events FILE`` consume those).

=========  =====================================================================================
event      fields (times in simulated seconds, positions in tokens from the start of the request)
=========  =====================================================================================
lookup     request, t, hit_checkpoint (id or None), hit_tokens, input_tokens
prefill    request, t_start, t_end, start_pos (= hit_tokens), end_pos (= input_tokens), seconds
decode     request, t_start, t_end, start_pos (= input_tokens), end_pos (input + output), seconds
admit      t, checkpoint, request, position, phase: prefill-branch (a state inside the matched
           prefix: a branch point) | chunk (inside the new part of the prompt) | prompt-end |
           decode (inside the output) | tail (after the last output token)
evict      t, checkpoint, position (the checkpoint's state is freed; its id is never reused)
evict_kv   t, tokens (KV of that many tokens freed with an evicted leaf)
reject     request, t, reason (an insert that found no room: nothing of it was cached)
arrive     request, t (``--scheduler continuous`` only: the request joined the engine's queue;
           its lookup comes when it is first scheduled, and again after a preemption)
step       t_start, t_end, seconds (modelled time), steps (> 1: that many decode-only steps of the
           same requests in a row, every context one longer than in the step before, ``seconds``
           their total), prefills ((request_id, start, end) per prefill chunk: tokens start..end
           computed, attention over 0..end), decodes ((request_id, context) per decode token),
           tokens (per step), preempted (request ids preempted while the step was built)
           (``--scheduler continuous`` only: what replay needs to execute the step)
=========  =====================================================================================

``request`` is the trace's ``Request`` (``request.request_id``; its tokens are
``request.input_tokens`` and ``request.output_tokens``). A checkpoint id is given when the state is
admitted and kept through splits and merges of the tree until the state is evicted, so the live
checkpoints are exactly the admits minus the evicts. Events are emitted when they complete (a
prefill when its last token is computed, just before its states are admitted). In ``sequential``
mode a request is served at its arrival ``t``: its events are all emitted at ``t`` (``t_end`` of
prefill and decode still give the modelled durations). ``occupancy(t, kv_bytes, state_bytes)``
is also sent after every insert (the recorder samples it); it is not written to event files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from traces.base import Request

PHASES = ("prefill-branch", "chunk", "prompt-end", "decode", "tail")


@dataclass(frozen=True, slots=True)
class Lookup:
    request: Request
    t: float
    hit_checkpoint: int | None
    hit_tokens: int
    input_tokens: int


@dataclass(frozen=True, slots=True)
class _Compute:
    """A span of tokens computed for one request (the fields of prefill and decode)."""

    request: Request
    t_start: float
    t_end: float
    start_pos: int
    end_pos: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Prefill(_Compute):
    pass


@dataclass(frozen=True, slots=True)
class Decode(_Compute):
    pass


@dataclass(frozen=True, slots=True)
class Admit:
    t: float
    checkpoint: int
    request: Request
    position: int
    phase: str


@dataclass(frozen=True, slots=True)
class Evict:
    t: float
    checkpoint: int
    position: int


@dataclass(frozen=True, slots=True)
class EvictKV:
    t: float
    tokens: int


@dataclass(frozen=True, slots=True)
class Reject:
    request: Request
    t: float
    reason: str


@dataclass(frozen=True, slots=True)
class Arrive:
    request: Request
    t: float


@dataclass(frozen=True, slots=True)
class Step:
    t_start: float
    t_end: float
    seconds: float
    steps: int
    prefills: tuple  # ((request_id, start, end), ...)
    decodes: tuple  # ((request_id, context), ...)
    tokens: int
    preempted: tuple  # request ids


EVENT_NAMES = {
    Arrive: "arrive",
    Step: "step",
    Lookup: "lookup",
    Prefill: "prefill",
    Decode: "decode",
    Admit: "admit",
    Evict: "evict",
    EvictKV: "evict_kv",
    Reject: "reject",
}


class Observer:
    """The events an observer may listen to (subclassing is optional: define what you need)."""

    def lookup(
        self, request: Request, t: float, hit_checkpoint: int | None, hit_tokens: int, input_tokens: int
    ) -> None: ...
    def prefill(
        self, request: Request, t_start: float, t_end: float, start_pos: int, end_pos: int, seconds: float
    ) -> None: ...
    def decode(
        self, request: Request, t_start: float, t_end: float, start_pos: int, end_pos: int, seconds: float
    ) -> None: ...
    def admit(self, t: float, checkpoint: int, request: Request, position: int, phase: str) -> None: ...
    def evict(self, t: float, checkpoint: int, position: int) -> None: ...
    def evict_kv(self, t: float, tokens: int) -> None: ...
    def reject(self, request: Request, t: float, reason: str) -> None: ...
    def occupancy(self, t: float, kv_bytes: int, state_bytes: int) -> None: ...
    def arrive(self, request: Request, t: float) -> None: ...
    def step(
        self,
        t_start: float,
        t_end: float,
        seconds: float,
        steps: int,
        prefills: tuple,
        decodes: tuple,
        tokens: int,
        preempted: tuple,
    ) -> None: ...


EVENTS = ("lookup", "prefill", "decode", "admit", "evict", "evict_kv", "reject", "occupancy", "arrive", "step")


def listeners(observers, event: str) -> tuple:
    """Bound methods of ``observers`` that handle ``event`` (an inherited no-op does not count)."""
    out = []
    for obs in observers:
        fn = getattr(obs, event, None)
        if fn is None or getattr(type(obs), event, None) is getattr(Observer, event):
            continue
        out.append(fn)
    return tuple(out)


class EventLog:
    """Collects the stream as event objects, in order (``events``)."""

    def __init__(self) -> None:
        self.events: list = []

    def lookup(self, request, t, hit_checkpoint, hit_tokens, input_tokens):
        self.events.append(Lookup(request, t, hit_checkpoint, hit_tokens, input_tokens))

    def prefill(self, request, t_start, t_end, start_pos, end_pos, seconds):
        self.events.append(Prefill(request, t_start, t_end, start_pos, end_pos, seconds))

    def decode(self, request, t_start, t_end, start_pos, end_pos, seconds):
        self.events.append(Decode(request, t_start, t_end, start_pos, end_pos, seconds))

    def admit(self, t, checkpoint, request, position, phase):
        self.events.append(Admit(t, checkpoint, request, position, phase))

    def evict(self, t, checkpoint, position):
        self.events.append(Evict(t, checkpoint, position))

    def evict_kv(self, t, tokens):
        self.events.append(EvictKV(t, tokens))

    def reject(self, request, t, reason):
        self.events.append(Reject(request, t, reason))

    def arrive(self, request, t):
        self.events.append(Arrive(request, t))

    def step(self, t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted):
        self.events.append(Step(t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted))


def event_row(ev, **extra) -> dict:
    """One event as a flat dict (the request as its id), for JSON Lines or a table."""
    row = {**extra, "event": EVENT_NAMES[type(ev)]}
    for f in fields(ev):
        v = getattr(ev, f.name)
        row[f.name if f.name != "request" else "request_id"] = v.request_id if f.name == "request" else v
    return row


_INT_COLUMNS = {
    "request_id",
    "checkpoint",
    "hit_checkpoint",
    "hit_tokens",
    "input_tokens",
    "start_pos",
    "end_pos",
    "position",
    "tokens",
    "steps",
}


def write_events(rows: list[dict], path: str | Path) -> None:
    """Write event rows as JSON Lines (``.jsonl``, ``.json``) or parquet (``.parquet``)."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd  # noqa: PLC0415 - only parquet output needs it

        table = pd.DataFrame(
            [{k: json.dumps(v) if isinstance(v, (tuple, list)) else v for k, v in row.items()} for row in rows]
        )  # a step's batch as JSON text (one column type)
        for col in _INT_COLUMNS.intersection(table.columns):  # ids and positions stay integers
            table[col] = table[col].astype("Int64")
        table.to_parquet(path, index=False)
        return
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


__all__ = [
    "Arrive",
    "Step",
    "Lookup",
    "Prefill",
    "Decode",
    "Admit",
    "Evict",
    "EvictKV",
    "Reject",
    "Observer",
    "EventLog",
    "listeners",
    "event_row",
    "write_events",
    "PHASES",
    "EVENTS",
]
