"""Replay of one event stream: produces, stores, restores and checks states; times prefills.

``Replayer`` receives the simulator's events (lookup / prefill / decode / admit / evict / reject)
with positions in tokens and executes them lazily per request: a request's prefill runs only
once everything it must produce is known (its prefill-phase admits), so exact-alignment splits
are part of the timed call, as they would be in an engine. What forces a request's work to run
(``eager``, for DES streams): its decode, an admit after its prompt (produced at once), a lookup
that hits one of its pending checkpoints, the next event of another request once it has
decoded, and ``finish``; for sequential streams (a request's admits follow its decode) the next
lookup.

An admit for a position the request has already run past (the stream announced it late) is
produced by recomputing from the request's restored state (or from scratch), untimed, and counted
in ``late_admits``.

Two collaborators: the hit checks (``sim.replay.hits.HitChecker``: bookkeeping and integrity at
the lookup, the restore, the numerical check after the suffix) and, with ``batch`` > 1 (sequential
streams only), batched replay (``sim.replay.batched.BatchedReplay``: finished requests queued and
run as varlen batches, their hits checked against batched from-scratch prefills; every hit is
checked as in the per-request replay, but requests are no longer timed one by one: each batch
call is timed, ``batch_log``). Where a request stands between its lookup and its last state is
its ``sim.replay.flight.Flight``. Needs torch.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from sim.replay.batched import BATCH_TOKENS, BatchCall, BatchedReplay, Check
from sim.replay.checks import Failure
from sim.replay.clock import MEASURE_MODES, Stopwatch
from sim.replay.flight import Flight, put_kv
from sim.replay.hits import HitChecker
from sim.replay.model import HybridModel, Marks, StackState
from sim.replay.records import RequestRecord
from sim.replay.store import CheckpointStore
from sim.replay.tokens import prefix_hash

__all__ = ["BATCH_TOKENS", "BatchCall", "PositionOutsideRequest", "Replayer"]


class PositionOutsideRequest(ValueError):
    """The event stream placed a state outside its request's tokens (``Replayer.admit``)."""


class Replayer:
    """Executes an event stream against ``model`` and ``store``.

    ``tokens_of(request_id) -> (token ids of prompt + response, prompt length)``.
    ``validate_every``: check every k-th hit's bits and numerics (the bookkeeping check runs on
    every hit). ``validate``: ``exact`` (default; the restored bits against the produced ones, then
    numerics within the dtype's tolerance), ``shadow`` (the same here; the session adds an fp32
    shadow replayer), ``tolerance`` (numerics only). ``check_hash=False`` skips the bookkeeping
    check (tests show numerics alone also catch a shifted position). ``batch`` > 1: batched
    replay of a sequential stream (module docstring), up to ``batch`` requests or
    ``batch_tokens`` tokens a call; its timed calls are in ``batch_log``.
    """

    def __init__(
        self,
        model: HybridModel,
        store: CheckpointStore,
        tokens_of: Callable[[int], tuple[np.ndarray, int]],
        *,
        validate_every: int = 1,
        tolerance: Optional[float] = None,
        check_hash: bool = True,
        max_open: int = 16,
        eager: bool = True,
        validate: str = "exact",
        measure: str = "wall",
        batch: int = 1,
        batch_tokens: int = BATCH_TOKENS,
        alternate: bool = False,
        output_bytes=None,
        max_open_bytes: Optional[int] = None,
    ) -> None:
        if validate_every < 1:
            raise ValueError("validate_every must be >= 1")
        if batch < 1 or batch_tokens < 1:
            raise ValueError("batch and batch_tokens must be >= 1")
        if measure not in MEASURE_MODES:
            raise ValueError(f"measure must be one of {', '.join(MEASURE_MODES)}, not {measure!r}")
        self.clock = Stopwatch(model.device, queued=measure == "device")
        # --saved-timing alternate: a validated hit's suffix prefill and reference each timed a
        # second time after its check (suffix, reference, reference, suffix); per-request timing only
        self.alternate = alternate and batch == 1
        self.checker = HitChecker(
            model,
            store,
            self.clock,
            validate=validate,
            validate_every=validate_every,
            tolerance=tolerance,
            check_hash=check_hash,
            output_bytes=output_bytes,
        )
        self.model = model
        self.store = store
        self.tokens_of = tokens_of
        self.max_open = max_open
        # and at most ``max_open_bytes`` of device tensors among them (None: no bound): under
        # continuous batching every running request's flight is open, and 17 running Mooncake
        # requests' restored states and KV beside the store and the step executor's buffers ran
        # marconi-7b out of an H100's memory at 20 GB
        self.max_open_bytes = max_open_bytes
        # eager (DES streams): a prompt runs at its decode, a decode-time state when admitted;
        # lazy (sequential streams, where admits follow the decode): at the next lookup
        self.eager = eager
        self.flights: dict[int, Flight] = {}
        # flights holding device tensors (a restored or running state), oldest first: at most
        # ``max_open`` of them (``_hold``); the others wait parked or dropped
        self._holding: dict[int, Flight] = {}
        self.parked = 0  # times a waiting flight gave its restored state back
        self.dropped = 0  # times a flight past its prompt dropped its state
        self.recomputed_tokens = 0  # tokens recomputed (untimed) for a dropped flight's state
        self._shedding = False
        self.pending: dict[int, Flight] = {}  # checkpoint id -> flight that will produce it
        self.records: dict[int, RequestRecord] = {}
        self.late_admits = 0
        # batched replay (module docstring); None: every request alone, timed
        self.batch = batch
        self.batched = (
            BatchedReplay(model, store, self.clock, self.checker, batch=batch, batch_tokens=batch_tokens)
            if batch > 1
            else None
        )

    # ---- what the collaborators hold ---------------------------------------------------------
    @property
    def failures(self) -> list[Failure]:
        return self.checker.failures

    @property
    def hits(self) -> int:
        return self.checker.hits

    @property
    def kv_hits_validated(self) -> int:
        return self.checker.kv_hits_validated

    @property
    def integrity_checked(self) -> int:
        return self.checker.integrity_checked

    @property
    def tolerance(self) -> tuple[float, float]:
        return self.checker.tolerance

    @property
    def batch_log(self) -> list[BatchCall]:
        return self.batched.log if self.batched is not None else []

    @property
    def batch_flushes(self) -> dict:
        return self.batched.flushes if self.batched is not None else {}

    # ---- events ------------------------------------------------------------------------------
    def lookup(self, request: int, checkpoint: Optional[int], hit_tokens: int) -> None:
        if not self.eager:
            for other in list(self.flights.values()):
                self._finalize(other)
        self._settle(request)
        f = self._flight(request, fresh=True)
        rec = f.record
        rec.hit_tokens = int(hit_tokens) if checkpoint is not None else 0
        if checkpoint is None:
            return
        rec.hit_checkpoint = int(checkpoint)
        if self.batched is not None and self.batched.produces(checkpoint):  # run the queue first
            self.batched.flush("dependency")
        if checkpoint in self.pending:  # produce it now (its request stays open)
            owner = self.pending[checkpoint]
            self._run(owner, self.store.info(checkpoint).position)
        if self.checker.restore(f, checkpoint):
            self._hold(f)

    def prefill(self, request: int, start: int, end: int) -> None:
        self._settle(request)
        f = self._flight(request)
        f.prefill_end = max(f.prefill_end, min(int(end), f.n_in))
        self._start(f)  # its hit is unlocked (evictable) after the prefill: restore a parked state now

    def decode(self, request: int) -> None:
        self._settle(request)
        f = self._flight(request)
        if self.eager:
            self._run(f, f.n_in)
        f.decoded = True

    def admit(self, checkpoint: int, request: int, position: int, phase: str = "") -> None:
        self._settle(request)
        f = self._flight(request)
        p = int(position)
        if not 0 < p <= len(f.tokens):
            raise PositionOutsideRequest(
                f"admit of checkpoint {checkpoint} at position {p} outside request {request} (0, {len(f.tokens)}]"
            )
        self.store.reserve(checkpoint, p, prefix_hash(f.tokens, p), request)
        if p > f.pos:
            f.wanted.setdefault(p, []).append(checkpoint)
            self.pending[checkpoint] = f
            if p > f.n_in and self.eager:  # a decode-time state: the prompt's admits are all
                self._run(f, p)  # known by now; later ones continue from here
            return
        current = self._current(f) if p == f.pos else None
        if current is not None:
            self.store.put(checkpoint, current)
            put_kv(self.store, f, checkpoint, current)
        else:
            self._late(f, checkpoint, p)

    def evict(self, checkpoint: int) -> None:
        if self.batched is not None:  # never produced: the queued request no longer writes it
            self.batched.evicted(checkpoint)
        f = self.pending.pop(checkpoint, None)
        if f is not None:
            for p, cps in list(f.wanted.items()):
                if checkpoint in cps:
                    cps.remove(checkpoint)
                    if not cps:
                        del f.wanted[p]
        self.store.free(checkpoint)

    def reject(self, request: int) -> None:
        """An insert of ``request`` did not fit: it admitted nothing, but the request still ran
        in the simulator, so it runs here too (timed and, if it restored a state, validated),
        and the states its other inserts admitted are still produced."""
        self._settle(request)

    def finish(self) -> list[RequestRecord]:
        for f in list(self.flights.values()):
            self._finalize(f)
        if self.batched is not None:
            self.batched.finish()
        for r in self.records.values():  # why a hit was not checked (a reason for every one)
            r.close()
        if self.batched is not None:
            self.batched.resolve()
        return [self.records[k] for k in sorted(self.records)]

    def restored(self, request: int) -> tuple[int, Optional[StackState]]:
        """``(position, state)`` the request's current lookup restored and checked (``(0, None)``:
        from scratch, or a hit that failed its checks): what the step executor starts from."""
        f = self.flights.get(request)
        if f is None or f.checkpoint is None or f.dropped:
            return 0, None
        start = self._start(f)
        return (f.hit, start) if start is not None else (0, None)

    # ---- internals ---------------------------------------------------------------------------
    def _flight(self, request: int, fresh: bool = False) -> Flight:
        f = self.flights.get(request)
        if f is not None and fresh:
            self._finalize(f)
            f = None
        if f is None:
            tokens, n_in = self.tokens_of(request)
            f = Flight(request, tokens, n_in)
            old = self.records.get(request)
            f.record = RequestRecord(request, n_in, len(tokens) - n_in)
            if old is not None:  # a new lookup (after a preemption)
                f.record.again(old)
            self.records[request] = f.record
            self.flights[request] = f
        return f

    def _hold(self, f: Flight) -> None:
        """``f`` holds device tensors now; past ``max_open`` such flights, the oldest give theirs
        back: a decoded one is finalized, one still waiting for its prefill is parked (its hit
        is restored again at its prefill, while the simulator still locks it), one past its
        prefill runs its prompt (its prefill-time states are all known by then) and drops its
        state. A flight is never dropped and made again: that ran a prompt twice, and a parked
        hit lost its restored state (it ran from scratch, never checked)."""
        self._holding.pop(f.rid, None)
        self._holding[f.rid] = f
        if self._shedding or not self._over():
            return
        self._shedding = True
        try:
            self._shed(f)
        finally:
            self._shedding = False

    def open_bytes(self) -> int:
        """Device bytes of the flights holding tensors now."""
        return sum(g.device_bytes() for g in self._holding.values())

    def _held_bytes(self) -> int:
        """``open_bytes`` where ``max_open_bytes`` bounds them (0 without it: not asked)."""
        if self.max_open_bytes is None:
            return 0
        return self.open_bytes()

    def _over(self, held_bytes: Optional[int] = None) -> bool:
        """Whether the flights holding device tensors are more than ``max_open`` or hold more
        than ``max_open_bytes`` (``held_bytes``: their bytes, where the caller keeps the count)."""
        if len(self._holding) > self.max_open:
            return True
        if self.max_open_bytes is None:
            return False
        return (self._held_bytes() if held_bytes is None else held_bytes) > self.max_open_bytes

    def _shed(self, f: Flight) -> None:
        # the bytes summed once, then less each flight let go (shedding one changes no other's)
        held = self._held_bytes()
        for g in list(self._holding.values()):
            if not self._over(held):
                break
            if g is f:
                continue
            before = g.device_bytes() if self.max_open_bytes is not None else 0
            self._let_go(g)
            if g.rid not in self._holding:
                held -= before

    def _let_go(self, g: Flight) -> None:
        """``g`` gives its device tensors back (``_hold``): finalized, parked or run and dropped,
        as far as it can."""
        if g.decoded:
            self._finalize(g)
        elif g.running is None and g.pos == g.hit and g.prefill_end == 0:
            g.start = g.tok_t = None
            g.parked = g.checkpoint is not None
            self.parked += 1
            self._holding.pop(g.rid, None)
        elif self.eager:
            self._run(g, g.upto())
            g.start = g.running = g.tok_t = None
            g.dropped = True
            self.dropped += 1
            self._holding.pop(g.rid, None)

    def _start(self, f: Flight) -> Optional[StackState]:
        """The state ``f``'s lookup restored (None: from scratch), restored again if parked."""
        if f.parked:
            f.parked = False
            if self.checker.restore_again(f) is None:
                return None
            self._hold(f)
        return f.start

    def _current(self, f: Flight) -> Optional[StackState]:
        """The request's state at ``f.pos`` (None: zeros at 0): recomputed from scratch, untimed,
        for a dropped flight."""
        if f.running is not None:
            return f.running
        if f.dropped:
            f.dropped = False
            if f.pos > 0:
                f.running, _, _ = self.model.run(f.ids(self.model.device)[: f.pos], None, 0)
                self.recomputed_tokens += f.pos
                self._hold(f)
            return f.running
        return self._start(f)

    def _settle(self, request: int) -> None:
        """Finish requests that have decoded once another request's event arrives."""
        if not self.eager:
            return
        for f in [f for r, f in self.flights.items() if r != request and f.decoded]:
            self._finalize(f)

    def _finalize(self, f: Flight) -> None:
        upto = f.upto()
        if self.batched is not None:
            if self.eager:
                raise ValueError("batched replay takes sequential streams (a request's admits after its decode)")
            self.flights.pop(f.rid, None)
            self._holding.pop(f.rid, None)
            if self.batched.batchable(f, upto):
                self.batched.enqueue(f, upto, self.pending)
            else:
                self.batched.single(f, upto, self._run)
            return
        self._run(f, upto)
        self.flights.pop(f.rid, None)
        self._holding.pop(f.rid, None)
        f.times.resolve(f.record, self.clock)
        f.start = f.running = f.tok_t = None

    def _sink(self, f: Flight):
        def on_state(p, layer, rec, conv):
            for cp in f.wanted.get(p, ()):
                self.store.write(cp, layer, rec, conv)

        return on_state

    def _done_wanted(self, f: Flight, upto: int) -> None:
        for p in [p for p in f.wanted if p <= upto]:
            for cp in f.wanted.pop(p):
                self.pending.pop(cp, None)
                put_kv(self.store, f, cp, f.running)

    def _run(self, f: Flight, upto: int) -> None:
        """Advance the request from ``f.pos`` to ``upto``: the prompt part always as a whole
        (one timed suffix prefill, as an engine prefills it, validated if chosen); the part after
        the prompt (the response, teacher-forced) as the timed tail."""
        rec = f.record
        model = self.model
        if f.pos == f.hit == f.n_in > 0 and f.validate and f.running is None and not rec.validated:
            # a whole-prompt hit: nothing to prefill; its restored state and KV are checked
            # against a from-scratch prefill all the same (no suffix outputs to compare)
            f.running = self._start(f)
            if f.running is not None:
                self._hold(f)
                x = model.embed(f.ids(model.device)[:0])
                self._validate(f, [x] * len(model.shape.order))
        if upto <= f.pos:
            return
        tok = f.ids(model.device)
        state = self._current(f)
        end1 = f.n_in
        if f.pos < end1:
            wanted = [p for p in f.wanted if f.pos < p <= end1]
            timed = f.pos == f.hit and end1 == f.n_in
            marks = Marks(model.device) if timed else None
            segments = self._segments(f.pos, end1, wanted)
            # every layer's outputs for the check, or the first group's where they would not fit
            keep = self.checker.keeps(f, end1) if timed and f.validate else False
            # its sleep sized from suffix calls of as many segments (each runs every layer)
            t0 = self.clock.start(kind="suffix", segments=len(segments))
            begin = state
            state, outs, _ = model.run(
                tok[f.pos : end1],
                state,
                f.pos,
                wanted,
                self._sink(f),
                keep_outputs=keep,
                marks=marks,
            )
            h = self.clock.stop(t0)
            rec.suffix_segments += segments
            if timed and self.clock.outran(h):
                h, marks = self._retime(f, tok[f.pos : end1], begin, f.pos, wanted, h)
            if timed:
                f.times.suffix = h
                f.times.suffix_marks = marks
                if f.hit == 0:
                    f.times.full = h
                    f.times.full_marks = marks
                    rec.full_segments = list(rec.suffix_segments)
            f.pos = end1
            f.running = state
            self._hold(f)
            self._done_wanted(f, end1)
            if timed and f.validate and f.hit > 0:
                # the call's split points (a group's rerun splits there too)
                self._validate(f, outs, [e for _, e in segments[:-1]])
                if f.record.validated and f.times.suffix_first is None and self.clock.stalled(h, marks):
                    # the check ran, so the call is done: asking adds no wait (batched replay queues
                    # the check: not asked there)
                    f.times.suffix, f.times.suffix_marks = self._retime(f, tok[f.hit : end1], begin, f.hit, wanted, h)
                if self.alternate and f.record.validated:  # per-request timing only: no batched replay
                    self._time_again(f, tok, begin, wanted, segments)
        if upto > f.pos:
            wanted = [p for p in f.wanted if f.pos < p <= upto]
            t0 = self.clock.start(queue=False, kind="tail")
            state, _, _ = model.run(tok[f.pos : upto], state, f.pos, wanted, self._sink(f))
            f.times.tail.append(self.clock.stop(t0))
            f.pos = upto
            f.running = state
            self._hold(f)
            self._done_wanted(f, upto)

    def _retime(self, f: Flight, tokens, begin, start: int, wanted, first):
        """A timed suffix prefill whose host issue outran the sleep queued ahead of it
        (``Stopwatch.outran``: its device time may hold host gaps, from something the call paid
        that its peers did not, such as a synchronisation inside it), or that stalled outside its
        layers (``Stopwatch.stalled``, asked after the hit's check), run again from the same
        state ``begin`` at ``start`` with the same boundaries, its states handed to no one and its outputs not
        kept (the first call's serve the store and the checks), behind a sleep sized from the
        kind's other calls (the first call's host time taken out of the window): its second time
        is the request's. Returns ``(handle, marks)`` of the second call; the first's handle is
        kept in ``f.times.suffix_first``."""
        marks = Marks(self.model.device)
        h = self.clock.again(first, lambda: self.model.run(tokens, begin, start, wanted, lambda *a: None, marks=marks))
        f.times.suffix_first = first
        return h, marks

    def _time_again(self, f: Flight, tok, begin, wanted, segments) -> None:
        """``--saved-timing alternate``: after the hit's suffix prefill and its checked reference,
        the reference again and then the suffix again (the same tokens, boundaries and start
        state; nothing captured, compared, stored or kept), each behind a sleep of its kind:
        suffix, reference, reference, suffix, so that a drift across the four calls (a long call
        right after another runs a few percent slower on a hot chip) cancels out of the mean of
        each pair, and so of the time saved."""
        f.times.full_again = self.checker.time_reference(f, tok)
        marks = Marks(self.model.device)
        t0 = self.clock.start(kind="suffix", segments=len(segments))
        self.model.run(tok[f.hit : f.n_in], begin, f.hit, wanted, lambda *a: None, marks=marks)
        f.times.suffix_again = (self.clock.stop(t0), marks)

    @staticmethod
    def _segments(start: int, end: int, wanted) -> list:
        cuts = sorted({p for p in wanted if start < p < end and p % 64}) + [end]
        segs, s = [], start
        for c in cuts:
            segs.append((s, c))
            s = c
        return segs

    def _validate(self, f: Flight, outs, cuts=()) -> None:
        """The hit's numerical check (``HitChecker.validate``; ``cuts``: where its suffix call was
        split); batched replay queues it instead (``BatchedReplay.queue_check``)."""
        if self.batched is not None:
            self.batched.queue_check(Check(f, f.n_in, f.running, outs, tuple(cuts)))
        else:
            self.checker.validate(f, outs, cuts)

    def _late(self, f: Flight, checkpoint: int, p: int) -> None:
        """Produce a state for a position already run past: recompute up to it (untimed)."""
        tok = f.ids(self.model.device)
        start = None if f.dropped else self._start(f)
        if start is not None and f.hit <= p:
            base, s0 = start, f.hit
        else:
            base, s0 = None, 0
        if p == s0 and base is not None:
            self.store.put(checkpoint, base)
            at_p = base
        else:

            def sink(q, layer, r, c):
                self.store.write(checkpoint, layer, r, c)

            at_p, _, _ = self.model.run(tok[s0:p], base, s0, [p], sink)
        put_kv(self.store, f, checkpoint, f.running if f.running is not None else at_p)
        f.record.late_admits += 1
        self.late_admits += 1
