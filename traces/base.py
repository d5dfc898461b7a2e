"""The request table every loader produces and the simulator consumes.

A trace is a list of requests grouped into sessions. Token sequences are numpy int64 arrays of
*symbols*: token ids for tokenized traces (``block_tokens == 1``) or prefix-block hash ids for
hash-block traces (Mooncake: 512 tokens per symbol, Bailian: 16). Two requests share a prefix of
k symbols iff their first k symbols are equal; the cache tree never needs to know which kind it
holds.

Timing comes in one of two shapes:
- closed loop (``Trace.closed_loop``): sessions start on a schedule chosen at simulation time
  (``traces.arrivals``); each turn arrives ``think_time`` seconds after the previous turn's
  response finished (for the first turn: after the session start);
- open loop: every request carries an absolute ``arrival`` in seconds (Mooncake, Bailian,
  marconi-jsonl ``ts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SYMBOL_DTYPE = np.int64


class TraceError(ValueError):
    """Bad trace input: reported to the user as one line (CLI exit code 2)."""


@dataclass(slots=True)
class Request:
    session_id: int
    turn: int
    input_tokens: np.ndarray  # symbols of the prompt (full history for chat turns)
    output_tokens: np.ndarray  # symbols of the response
    think_time: float = 0.0  # closed loop: seconds after the previous response (or session start)
    arrival: float | None = None  # open loop: absolute arrival time in seconds
    input_len: int = -1  # tokens; -1 means len(input_tokens) * block_tokens
    output_len: int = -1  # tokens; -1 means len(output_tokens) * block_tokens
    request_id: int = -1  # position in Trace.requests, set by Trace

    def n_input_tokens(self, block_tokens: int) -> int:
        return self.input_len if self.input_len >= 0 else len(self.input_tokens) * block_tokens

    def n_output_tokens(self, block_tokens: int) -> int:
        return self.output_len if self.output_len >= 0 else len(self.output_tokens) * block_tokens


@dataclass
class Trace:
    name: str
    requests: list[Request]
    block_tokens: int = 1  # tokens per symbol
    closed_loop: bool = True
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.requests:
            raise TraceError(f"trace {self.name!r} has no requests (after filtering)")
        if self.block_tokens < 1:
            raise TraceError(f"trace {self.name!r}: block_tokens must be >= 1")
        for i, r in enumerate(self.requests):
            r.request_id = i
            if r.input_tokens.dtype != SYMBOL_DTYPE:
                r.input_tokens = np.asarray(r.input_tokens, dtype=SYMBOL_DTYPE)
            if r.output_tokens.dtype != SYMBOL_DTYPE:
                r.output_tokens = np.asarray(r.output_tokens, dtype=SYMBOL_DTYPE)
            if not self.closed_loop and r.arrival is None:
                raise TraceError(f"trace {self.name!r}: open-loop request {i} has no arrival time")

    @property
    def n_sessions(self) -> int:
        return len({r.session_id for r in self.requests})

    def sessions(self) -> dict[int, list[Request]]:
        """Requests of each session in turn order (sessions in order of first appearance)."""
        out: dict[int, list[Request]] = {}
        for r in self.requests:
            out.setdefault(r.session_id, []).append(r)
        for reqs in out.values():
            reqs.sort(key=lambda r: r.turn)
        return out

    def input_tokens_total(self) -> int:
        return sum(r.n_input_tokens(self.block_tokens) for r in self.requests)

    def output_tokens_total(self) -> int:
        return sum(r.n_output_tokens(self.block_tokens) for r in self.requests)


def as_symbols(tokens) -> np.ndarray:
    return np.asarray(tokens, dtype=SYMBOL_DTYPE)
