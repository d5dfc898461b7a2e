"""A request in flight through replay: between its lookup and its last produced state (the
``Replayer`` holds one per open request; the batched replay and the hit checks read it). Needs
torch.

``Flight`` owns where the request stands (its restored state, its running state and position,
the states it must still hand to the store) and ``PendingTimes`` the handles of its timed calls
until the request ends and they are resolved into its ``RequestRecord``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from kernels._common import upload
from sim.replay.model import Marks, StackState
from sim.replay.records import CHECK
from sim.replay.records import RequestRecord
from sim.replay.store import CheckpointStore
from sim.replay.tokens import page_keys


def checked_out(ms: float, by_type: Optional[dict]) -> float:
    """A timed call's ``ms`` less the hit check's work inside it (``by_type``: its marks'
    ``ms_by_type()``, the ``CHECK`` bucket; None: no marks): the time of the prefill alone."""
    return ms - by_type.get(CHECK, 0.0) if by_type else ms


@dataclass
class PendingTimes:
    """A request's timed calls not resolved yet: the suffix prefill (``suffix``: its Stopwatch
    handle, ``suffix_marks``: its per-layer-type marks; ``suffix_first``: the handle of its first
    call when it was re-timed), the from-scratch reference (``full``, ``full_marks``;
    ``full_first``: its first call's handle when re-timed) and the tail's calls (``tail``)."""

    suffix: object = None
    suffix_first: object = None
    suffix_marks: Optional[Marks] = None
    full: object = None
    full_marks: Optional[Marks] = None
    full_first: object = None
    # --saved-timing alternate: the second suffix and reference calls' (handle, marks)
    suffix_again: Optional[tuple] = None
    full_again: Optional[tuple] = None
    tail: list = field(default_factory=list)

    def clear(self) -> None:
        self.suffix = self.full = self.suffix_marks = self.full_marks = self.suffix_first = self.full_first = None
        self.suffix_again = self.full_again = None
        self.tail = []

    def resolve(self, record: RequestRecord, clock) -> None:
        """Write the resolved times into ``record`` (``clock``: the Stopwatch that took them)
        and forget the handles."""
        suffix = full = None
        by_suffix = self.suffix_marks.ms_by_type() if self.suffix_marks is not None else None
        by_full = self.full_marks.ms_by_type() if self.full_marks is not None else None
        if self.suffix is not None:
            suffix = (
                checked_out(clock.ms(self.suffix), by_suffix),
                clock.host_ms(self.suffix),
                clock.slack_ms(self.suffix),
            )
        if self.full is not None:
            full = (checked_out(clock.ms(self.full), by_full), clock.host_ms(self.full), clock.slack_ms(self.full))
        again = None
        if suffix is not None and full is not None and self.suffix_again is not None and self.full_again is not None:
            # alternated (suffix, reference, reference, suffix): each call's time and splits the mean
            # of its two; the host issue and slack stay the first calls' (what host-bound marks)
            (s_ms, by_suffix), s2 = _mean_call(suffix[0], by_suffix, self.suffix_again, clock)
            (f_ms, by_full), f2 = _mean_call(full[0], by_full, self.full_again, clock)
            suffix, full, again = (s_ms, *suffix[1:]), (f_ms, *full[1:]), (s2, f2)
        record.timed(
            suffix=suffix,
            full=full,
            suffix_by_type=by_suffix,
            full_by_type=by_full,
            tail_ms=sum(clock.ms(h) for h in self.tail) if self.tail else None,
            first=(clock.ms(self.suffix_first), clock.host_ms(self.suffix_first))
            if self.suffix_first is not None
            else None,
            full_first=(clock.ms(self.full_first), clock.host_ms(self.full_first))
            if self.full_first is not None
            else None,
            suffix_sleep=clock.sleep_ms(self.suffix) if self.suffix is not None else None,
            full_sleep=clock.sleep_ms(self.full) if self.full is not None else None,
            again=again,
        )
        self.clear()


def _mean_call(ms: float, by: Optional[dict], again: tuple, clock) -> tuple[tuple, float]:
    """``((mean ms, mean per-type splits), second ms)`` of a call timed ``ms`` (splits ``by``) and
    its second run ``again`` (``(handle, marks)``); a type either call lacks counts 0 in it. The
    hit check's bucket (``CHECK``, out of both times) stays the first call's: the check ran once."""
    handle, marks = again
    by2 = marks.ms_by_type() if marks is not None else None
    ms2 = checked_out(clock.ms(handle), by2)
    mean_by = None
    if by is not None or by2 is not None:
        a, b = by or {}, by2 or {}
        mean_by = {
            k: a.get(k, 0.0) if k == CHECK else (a.get(k, 0.0) + b.get(k, 0.0)) / 2 for k in sorted(set(a) | set(b))
        }
    return ((ms + ms2) / 2, mean_by), ms2


class Flight:
    """A request between its lookup and its last produced state."""

    def __init__(self, rid: int, tokens: np.ndarray, n_in: int) -> None:
        self.rid = rid
        self.tokens = tokens
        self.n_in = n_in
        self.tok_t: Optional[torch.Tensor] = None
        self.start: Optional[StackState] = None  # restored state (None: from scratch)
        self.hit = 0
        self.running: Optional[StackState] = None  # state at self.pos (None: self.start)
        self.pos = 0
        self.prefill_end = 0
        self.wanted: dict[int, list[int]] = {}
        self.validate = False
        self.decoded = False
        self.record: Optional[RequestRecord] = None
        self.checkpoint: Optional[int] = None  # the checkpoint its lookup restored
        self.times = PendingTimes()
        # memory bound (``Replayer.max_open``): a flight that waits for its prefill gives its
        # restored state back (``parked``: restored again from the store, where its hit is locked
        # until the prefill); one past its prefill runs its prompt and drops its state
        # (``dropped``: the state at ``pos`` is recomputed, untimed, if it is needed again)
        self.parked = False
        self.dropped = False

    def ids(self, device) -> torch.Tensor:
        """Its token ids on ``device`` (uploaded once)."""
        if self.tok_t is None:
            self.tok_t = upload(self.tokens, device)
        return self.tok_t

    def device_bytes(self) -> int:
        """Bytes of the device tensors it holds: its restored and running states (with their KV)
        and its token ids."""
        held = {id(st): st for st in (self.start, self.running) if st is not None}
        n = sum(t.nbytes for st in held.values() for t in (st.rec, st.conv, st.kv) if t is not None)
        return n + (self.tok_t.nbytes if self.tok_t is not None else 0)

    def upto(self) -> int:
        """The position its work must reach: its prefill's end or its last wanted state."""
        return max([self.prefill_end] + list(self.wanted))


def put_kv(store: CheckpointStore, f: Flight, cp: int, state: Optional[StackState]) -> None:
    """The KV pages of checkpoint ``cp``'s prefix, from request ``f``'s KV so far."""
    if not store.has_kv or cp not in store:
        return
    p = store.info(cp).position
    kv = state.kv if state is not None else None
    if kv is None or kv.shape[2] < p:
        raise RuntimeError(
            f"checkpoint {cp} at {p}: request {f.rid}'s KV covers only {0 if kv is None else kv.shape[2]} tokens"
        )
    store.put_kv(cp, page_keys(f.tokens, p, store.page_tokens), kv)
