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

Batched replay (``batch`` > 1, sequential streams only): a finished request's work (its suffix
from the restored state to its last wanted state, the response teacher-forced) is queued rather
than run, and the queue runs as one varlen batch (``HybridModel.forward_batch``) when it holds
``batch`` requests or ``batch_tokens`` tokens, when a lookup hits a checkpoint a queued request
has still to produce (a multi-turn chain: the next turn needs the last one's state), and at
``finish``. Each queued hit's check against a from-scratch prefill joins a second queue, which
runs in batches of up to ``batch_tokens`` tokens (these have no dependencies). Every hit is
checked as in the per-request replay (bits at the lookup; the restored state, the end state, the
outputs and the KV against the from-scratch prefill), but requests are no longer timed one by
one: each batch call is timed (``batch_log``), which is what replay's throughput is measured on.
A request whose wanted states need a split (a position not on a 64-multiple before its end) runs
alone, as in the per-request replay, and its calls are logged as single ones. Needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from sim.replay.checks import VALIDATE_MODES, Failure, rel_error, state_error, tolerance_for
from sim.replay.clock import MEASURE_MODES, Stopwatch
from kernels._common import upload
from sim.replay.model import CHUNK, HybridModel, Marks, StackState
from sim.replay.records import RequestRecord
from sim.replay.store import CheckpointStore
from sim.replay.tokens import page_keys, prefix_hash


class _Flight:
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
        # memory bound (``Replayer.max_open``): a flight that waits for its prefill gives its
        # restored state back (``parked``: restored again from the store, where its hit is locked
        # until the prefill); one past its prefill runs its prompt and drops its state
        # (``dropped``: the state at ``pos`` is recomputed, untimed, if it is needed again)
        self.parked = False
        self.dropped = False


#: tokens per batched call of ``Replayer(batch=...)`` (the queued suffixes, or the references)
BATCH_TOKENS = 16384
#: queued hit checks per ``batch`` (each holds the restored and the end state until it runs)
CHECKS_QUEUED = 4


@dataclass
class _Job:
    """A queued request: its tokens ``[flight.pos, end)`` from its restored state, the states
    wanted on the way (position -> checkpoints; 64-multiples before ``end``, or ``end``)."""

    flight: _Flight
    end: int
    wanted: dict
    validate: bool


@dataclass
class _Check:
    """A queued hit check: the request's end state after the batched suffix and the suffix's
    per-layer outputs, against a from-scratch prefill of ``[0, end)``."""

    flight: _Flight
    end: int
    state: StackState
    outs: list


@dataclass
class BatchCall:
    """One timed call of batched replay: ``kind`` (``suffix``: queued requests from their
    restored states; ``reference``: from-scratch prefills that check hits; ``single``: a request
    run alone), the sequences' ``(start, end)`` positions, the Stopwatch handle."""

    kind: str
    segments: list
    handle: object = None
    ms: float = float("nan")
    host_ms: float = float("nan")
    slack_ms: float = float("nan")
    extra: dict = field(default_factory=dict)


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
    ) -> None:
        if validate_every < 1:
            raise ValueError("validate_every must be >= 1")
        if batch < 1 or batch_tokens < 1:
            raise ValueError("batch and batch_tokens must be >= 1")
        if validate not in VALIDATE_MODES:
            raise ValueError(f"validate must be one of {', '.join(VALIDATE_MODES)}, not {validate!r}")
        self.validate_mode = validate
        self.exact = validate != "tolerance"
        if self.exact:
            if len(store):
                raise ValueError("exact validation needs a store that digests from its first write")
            store.digests = True
        self.model = model
        self.store = store
        self.tokens_of = tokens_of
        self.validate_every = validate_every
        # (recurrent states, outputs + conv windows); one number given applies to both
        self.tolerance = (tolerance, tolerance) if tolerance is not None else tolerance_for(model.dtype)
        self.check_hash = check_hash
        self.max_open = max_open
        # eager (DES streams): a prompt runs at its decode, a decode-time state when admitted;
        # lazy (sequential streams, where admits follow the decode): at the next lookup
        self.eager = eager
        if measure not in MEASURE_MODES:
            raise ValueError(f"measure must be one of {', '.join(MEASURE_MODES)}, not {measure!r}")
        self.clock = Stopwatch(model.device, queued=measure == "device")
        self.flights: dict[int, _Flight] = {}
        # flights holding device tensors (a restored or running state), oldest first: at most
        # ``max_open`` of them (``_hold``); the others wait parked or dropped
        self._holding: dict[int, _Flight] = {}
        self.parked = 0  # times a waiting flight gave its restored state back
        self.dropped = 0  # times a flight past its prompt dropped its state
        self.recomputed_tokens = 0  # tokens recomputed (untimed) for a dropped flight's state
        self._shedding = False
        self.pending: dict[int, _Flight] = {}  # checkpoint id -> flight that will produce it
        self.records: dict[int, RequestRecord] = {}
        self.failures: list[Failure] = []
        self.hits = 0
        self.late_admits = 0
        self.kv_hits_validated = 0
        self.integrity_checked = 0
        # batched replay (module docstring)
        self.batch = batch
        self.batch_tokens = batch_tokens
        self._jobs: list[_Job] = []
        self._job_tokens = 0
        self._queued: dict[int, _Job] = {}  # checkpoint -> queued job that produces it
        self._checks: list[_Check] = []
        self._check_tokens = 0
        self.batch_log: list[BatchCall] = []
        self.batch_flushes: dict[str, int] = {}  # why the suffix queue ran -> times

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
        if checkpoint in self._queued:  # a queued request produces it: run the queue first
            self._flush("dependency")
        if checkpoint in self.pending:  # produce it now (its request stays open)
            owner = self.pending[checkpoint]
            self._run(owner, self.store.info(checkpoint).position)
        self.hits += 1
        if checkpoint not in self.store:
            self._fail("missing", f, checkpoint, -1, rec.hit_tokens, "not in the store")
            return
        info = self.store.info(checkpoint)
        p = rec.hit_tokens
        if self.check_hash:
            want = prefix_hash(f.tokens, p) if p <= len(f.tokens) else b""
            if info.position != p or info.prefix_hash != want:
                self._fail(
                    "hash",
                    f,
                    checkpoint,
                    info.position,
                    p,
                    "position differs" if info.position != p else "prefix hash differs",
                )
                return
            if self.store.has_kv and self.store.page_keys_of(checkpoint) != page_keys(
                f.tokens, p, self.store.page_tokens
            ):
                self._fail("kv-hash", f, checkpoint, info.position, p, "KV page keys differ from the prompt's prefix")
                return
        if not info.filled:  # a partly written slot is never restored (any mode)
            missing = [f"layer {i}" for i in self.store.unwritten(checkpoint)]
            if not info.kv_written and self.store.has_kv:
                missing.append("KV")
            self._fail("integrity", f, checkpoint, info.position, p, "never written: " + ", ".join(missing))
            return
        validate = (self.hits - 1) % self.validate_every == 0
        start = self.store.restore(checkpoint)
        if validate and self.exact:
            bad = self.store.verify(checkpoint, start)
            self.integrity_checked += 1
            rec.integrity_checked = True
            if bad:
                kind = "kv-integrity" if all(b.startswith("KV") for b in bad) else "integrity"
                more = f" (+{len(bad) - 8} more)" if len(bad) > 8 else ""
                self._fail(
                    kind,
                    f,
                    checkpoint,
                    info.position,
                    p,
                    "restored bits differ from the produced ones: " + ", ".join(bad[:8]) + more,
                )
                return
        f.start = start
        f.hit = f.pos = p
        f.checkpoint = int(checkpoint)
        rec.restored = True
        f.validate = validate
        if not validate:
            rec.unvalidated = "validate-every"
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
            raise ValueError(
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
            self._put_kv(f, checkpoint, current)
        else:
            self._late(f, checkpoint, p)

    def evict(self, checkpoint: int) -> None:
        job = self._queued.pop(checkpoint, None)
        if job is not None:  # never produced: the queued request no longer writes it
            for cps in job.wanted.values():
                if checkpoint in cps:
                    cps.remove(checkpoint)
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
        self._flush("finish")
        self._run_checks()
        for r in self.records.values():  # why a hit was not checked (a reason for every one)
            if r.hit_tokens > 0 and not r.validated:
                r.unvalidated = "failed a check" if r.failed else (r.unvalidated or "never checked")
            elif r.validated:
                r.unvalidated = ""
        for call in self.batch_log:
            if call.handle is not None:
                h, call.handle = call.handle, None
                call.ms, call.host_ms, call.slack_ms = self.clock.ms(h), self.clock.host_ms(h), self.clock.slack_ms(h)
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
    def _flight(self, request: int, fresh: bool = False) -> _Flight:
        f = self.flights.get(request)
        if f is not None and fresh:
            self._finalize(f)
            f = None
        if f is None:
            tokens, n_in = self.tokens_of(request)
            f = _Flight(request, tokens, n_in)
            old = self.records.get(request)
            f.record = RequestRecord(request, n_in, len(tokens) - n_in)
            if old is not None:  # a new lookup (after a preemption): the record is this run's,
                # the earlier runs' failures and late admits stay counted
                f.record.failed = old.failed
                f.record.late_admits = old.late_admits
                f.record.lookups = old.lookups + 1
            self.records[request] = f.record
            self.flights[request] = f
        return f

    def _hold(self, f: _Flight) -> None:
        """``f`` holds device tensors now; past ``max_open`` such flights, the oldest give theirs
        back: a decoded one is finalized, one still waiting for its prefill is parked (its hit
        is restored again at its prefill, while the simulator still locks it), one past its
        prefill runs its prompt (its prefill-time states are all known by then) and drops its
        state. A flight is never dropped and made again: that ran a prompt twice, and a parked
        hit lost its restored state (it ran from scratch, never checked)."""
        self._holding.pop(f.rid, None)
        self._holding[f.rid] = f
        if self._shedding or len(self._holding) <= self.max_open:
            return
        self._shedding = True
        try:
            self._shed(f)
        finally:
            self._shedding = False

    def _shed(self, f: _Flight) -> None:
        for g in list(self._holding.values()):
            if len(self._holding) <= self.max_open:
                break
            if g is f:
                continue
            if g.decoded:
                self._finalize(g)
            elif g.running is None and g.pos == g.hit and g.prefill_end == 0:
                g.start = g.tok_t = None
                g.parked = g.checkpoint is not None
                self.parked += 1
                self._holding.pop(g.rid, None)
            elif self.eager:
                upto = max([g.prefill_end] + list(g.wanted))
                self._run(g, upto)
                g.start = g.running = g.tok_t = None
                g.dropped = True
                self.dropped += 1
                self._holding.pop(g.rid, None)

    def _start(self, f: _Flight) -> Optional[StackState]:
        """The state ``f``'s lookup restored (None: from scratch), restored again if parked."""
        if f.parked:
            f.parked = False
            cp = f.checkpoint
            if cp not in self.store or self.store.info(cp).position != f.hit:
                f.start = None
                f.hit = f.pos = 0
                f.record.restored = False
                self._fail("missing", f, cp, -1, f.record.hit_tokens, "left the store while its request waited")
                return None
            f.start = self.store.restore(cp)
            if self.exact and self.store.verify(cp, f.start):
                self._fail("integrity", f, cp, f.hit, f.hit, "restored bits changed while its request waited")
            self._hold(f)
        return f.start

    def _current(self, f: _Flight) -> Optional[StackState]:
        """The request's state at ``f.pos`` (None: zeros at 0): recomputed from scratch, untimed,
        for a dropped flight."""
        if f.running is not None:
            return f.running
        if f.dropped:
            f.dropped = False
            if f.pos > 0:
                f.running, _, _ = self.model.run(self._tokens(f)[: f.pos], None, 0)
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

    def _finalize(self, f: _Flight) -> None:
        upto = max([f.prefill_end] + list(f.wanted))
        if self.batch > 1:
            if self.eager:
                raise ValueError("batched replay takes sequential streams (a request's admits after its decode)")
            self.flights.pop(f.rid, None)
            self._holding.pop(f.rid, None)
            if self._batchable(f, upto):
                self._enqueue(f, upto)
            else:
                self._run_single(f, upto)
            return
        self._run(f, upto)
        self.flights.pop(f.rid, None)
        self._holding.pop(f.rid, None)
        r = f.record
        if r._suffix_h is not None:
            r.suffix_ms, r.suffix_host_ms = self.clock.ms(r._suffix_h), self.clock.host_ms(r._suffix_h)
            r.suffix_slack_ms = self.clock.slack_ms(r._suffix_h)
        if r._full_h is not None:
            r.full_ms, r.full_host_ms = self.clock.ms(r._full_h), self.clock.host_ms(r._full_h)
            r.full_slack_ms = self.clock.slack_ms(r._full_h)
        if r._suffix_marks is not None:
            r.suffix_ms_by_type = r._suffix_marks.ms_by_type()
        if r._full_marks is not None:
            r.full_ms_by_type = r._full_marks.ms_by_type()
        r._suffix_marks = r._full_marks = None
        if r._tail_h:
            r.tail_ms = sum(self.clock.ms(h) for h in r._tail_h)
        r._suffix_h = r._full_h = None
        r._tail_h = []
        f.start = f.running = f.tok_t = None

    def _tokens(self, f: _Flight) -> torch.Tensor:
        if f.tok_t is None:
            f.tok_t = upload(f.tokens, self.model.device)
        return f.tok_t

    def _sink(self, f: _Flight):
        def on_state(p, layer, rec, conv):
            for cp in f.wanted.get(p, ()):
                self.store.write(cp, layer, rec, conv)

        return on_state

    def _done_wanted(self, f: _Flight, upto: int) -> None:
        for p in [p for p in f.wanted if p <= upto]:
            for cp in f.wanted.pop(p):
                self.pending.pop(cp, None)
                self._put_kv(f, cp, f.running)

    def _put_kv(self, f: _Flight, cp: int, state: Optional[StackState]) -> None:
        """The KV pages of checkpoint ``cp``'s prefix, from the request's KV so far."""
        if not self.store.has_kv or cp not in self.store:
            return
        p = self.store.info(cp).position
        kv = state.kv if state is not None else None
        if kv is None or kv.shape[2] < p:
            raise RuntimeError(
                f"checkpoint {cp} at {p}: request {f.rid}'s KV covers only {0 if kv is None else kv.shape[2]} tokens"
            )
        self.store.put_kv(cp, page_keys(f.tokens, p, self.store.page_tokens), kv)

    def _run(self, f: _Flight, upto: int) -> None:
        """Advance the request from ``f.pos`` to ``upto``: the prompt part always as a whole
        (one timed suffix prefill, as an engine prefills it, validated if chosen); the part after
        the prompt (the response, teacher-forced) as the timed tail."""
        rec = f.record
        if f.pos == f.hit == f.n_in > 0 and f.validate and f.running is None and not rec.validated:
            # a whole-prompt hit: nothing to prefill; its restored state and KV are checked
            # against a from-scratch prefill all the same (no suffix outputs to compare)
            f.running = self._start(f)
            if f.running is not None:
                self._hold(f)
                x = self.model.embed(self._tokens(f)[:0])
                self._validate(f, [x] * len(self.model.shape.order))
        if upto <= f.pos:
            return
        tok = self._tokens(f)
        state = self._current(f)
        end1 = f.n_in
        if f.pos < end1:
            wanted = [p for p in f.wanted if f.pos < p <= end1]
            timed = f.pos == f.hit and end1 == f.n_in
            marks = self.model.marks = Marks(self.model.device) if timed else None
            t0 = self.clock.start()
            state, outs, _ = self.model.run(
                tok[f.pos : end1], state, f.pos, wanted, self._sink(f), keep_outputs=timed and f.validate
            )
            h = self.clock.stop(t0)
            self.model.marks = None
            rec.suffix_segments += self._segments(f.pos, end1, wanted)
            if timed:
                rec._suffix_h = h
                rec._suffix_marks = marks
                if f.hit == 0:
                    rec._full_h = h
                    rec._full_marks = marks
                    rec.full_segments = list(rec.suffix_segments)
            f.pos = end1
            f.running = state
            self._hold(f)
            self._done_wanted(f, end1)
            if timed and f.validate and f.hit > 0:
                self._validate(f, outs)
        if upto > f.pos:
            wanted = [p for p in f.wanted if f.pos < p <= upto]
            t0 = self.clock.start(queue=False)
            state, _, _ = self.model.run(tok[f.pos : upto], state, f.pos, wanted, self._sink(f))
            rec._tail_h.append(self.clock.stop(t0))
            f.pos = upto
            f.running = state
            self._hold(f)
            self._done_wanted(f, upto)

    @staticmethod
    def _segments(start: int, end: int, wanted) -> list:
        cuts = sorted({p for p in wanted if start < p < end and p % 64}) + [end]
        segs, s = [], start
        for c in cuts:
            segs.append((s, c))
            s = c
        return segs

    def _validate(self, f: _Flight, outs) -> None:
        """Restore + suffix prefill (already run, ``outs``: its per-layer outputs) against one
        unsplit from-scratch prefill of the whole prompt: every layer's final recurrent and conv
        state and every layer's suffix outputs. The restored state itself is compared with the
        reference's state at the hit (its boundary state at the 64-multiple below the hit,
        carried to the hit by a short untimed call when the hit is not 64-aligned): a per-head
        RMS norm after the core and decay along the suffix can hide a small state error from the
        outputs, never from the state. Batched replay queues the check instead (``_run_checks``)."""
        if self.batch > 1:
            self._queue_check(_Check(f, f.n_in, f.running, outs))
            return
        rec = f.record
        tok = self._tokens(f)
        L = self.model.shape.layers
        at_b: dict = {}
        b = f.hit // 64 * 64

        def capture(p, layer, r, c):
            at_b[layer] = (r.clone(), c.clone())

        marks = self.model.marks = Marks(self.model.device)
        t0 = self.clock.start()
        ref, ref_outs, _ = self.model.run(tok[: f.n_in], None, 0, [b] if b > 0 else [], capture, keep_outputs=True)
        rec._full_h = self.clock.stop(t0)
        self.model.marks = None
        rec._full_marks = marks
        rec.full_segments = [(0, f.n_in)]
        rec.validated = True
        kv_b = ref.kv[:, :, :b] if ref.kv is not None else None
        base = (
            StackState(
                b,
                torch.stack([at_b[i][0] for i in range(L)]) if L else ref.rec,
                torch.stack([at_b[i][1] for i in range(L)]) if L else ref.conv,
                kv_b,
            )
            if b > 0
            else None
        )
        if f.hit > b:
            base, _, _ = self.model.run(tok[b : f.hit], base, b)
        ref_kv = ref.kv[:, :, : f.hit] if ref.kv is not None else None
        self._judge(f, f.running, outs, ref, [r[f.hit :] for r in ref_outs], base, ref_kv)

    def _judge(self, f: _Flight, end, outs, ref_end, ref_outs, base, ref_kv) -> None:
        """The hit's check once both sides ran: the end state (``end`` against the from-scratch
        ``ref_end``), the suffix's per-layer outputs against ``ref_outs`` (the reference's rows
        of the same positions), the restored state against ``base`` (the reference's state at
        the hit) and the restored KV against ``ref_kv``; a miss is a failure."""
        rec = f.record
        L = self.model.shape.layers
        e_rec, e_conv = state_error(end.rec, end.conv, ref_end.rec, ref_end.conv) if L else (0.0, 0.0)
        e_out = max(rel_error(o, r) for o, r in zip(outs, ref_outs))
        a, c = state_error(f.start.rec, f.start.conv, base.rec, base.conv) if L else (0.0, 0.0)
        e_rec, e_conv = max(e_rec, a), max(e_conv, c)
        # the restored keys and values against the from-scratch prefill's, every layer and head
        e_kv = rel_error(f.start.kv, ref_kv) if ref_kv is not None else 0.0
        rec.max_rec_error, rec.max_conv_error, rec.max_out_error = e_rec, e_conv, e_out
        rec.max_kv_error = e_kv
        if ref_kv is not None:
            rec.kv_validated = True
            self.kv_hits_validated += 1
        tol_state, tol_out = self.tolerance
        if not (e_rec <= tol_state and max(e_conv, e_out, e_kv) <= tol_out):
            kind = "kv-numerics" if e_kv > tol_out and e_rec <= tol_state and e_conv <= tol_out else "numerics"
            self._fail(
                kind,
                f,
                rec.hit_checkpoint,
                f.start.pos,
                f.hit,
                f"relative error recurrent {e_rec:.3g} (tolerance {tol_state:.3g}), conv "
                f"{e_conv:.3g}, KV {e_kv:.3g}, outputs {e_out:.3g} (tolerance {tol_out:.3g})",
            )

    # ---- batched replay ------------------------------------------------------------------------
    def _batchable(self, f: _Flight, upto: int) -> bool:
        """A request runs in a batch when nothing has run yet since its restore and every state
        it must hand over on the way is a kernel boundary (a 64-multiple) or its end."""
        if upto <= f.pos or f.pos != f.hit or f.running is not None or upto < f.n_in:
            return False
        return all(p % CHUNK == 0 or p == upto for p in f.wanted if p > f.pos)

    def _enqueue(self, f: _Flight, upto: int) -> None:
        job = _Job(f, upto, {p: cps for p, cps in f.wanted.items() if p > f.pos}, f.validate and f.hit > 0)
        f.wanted = {}
        for cps in job.wanted.values():
            for cp in cps:
                self.pending.pop(cp, None)
                self._queued[cp] = job
        self._jobs.append(job)
        self._job_tokens += upto - f.pos
        if len(self._jobs) >= self.batch or self._job_tokens >= self.batch_tokens:
            self._flush("full")

    def _run_single(self, f: _Flight, upto: int) -> None:
        """A request that needs a split runs alone (``_run``): its timed call joins the log, its
        hit's check the queue of checks."""
        r = f.record
        self._run(f, upto)
        if r._suffix_h is not None:
            self.batch_log.append(BatchCall("single", [tuple(x) for x in r.suffix_segments], r._suffix_h))
        r._suffix_h = r._full_h = r._suffix_marks = r._full_marks = None
        r._tail_h = []  # the flight is out of ``flights``: a queued check is what still holds it
        self._run_checks_when_full()

    def _stacked(self, starts: list) -> tuple:
        """Per gated-delta layer, the sequences' states ``[L, N, ...]`` (zeros where None)."""
        z = None
        recs, convs = [], []
        for st in starts:
            if st is None:
                z = z or self.model.zero_state()
                st = z
            recs.append(st.rec)
            convs.append(st.conv)
        return torch.stack(recs, dim=1), torch.stack(convs, dim=1)

    def _flush(self, why: str) -> None:
        """Run the queued requests as one varlen batch (timed), hand their wanted states to the
        store, queue their hits' checks."""
        if not self._jobs:
            return
        jobs, self._jobs, self._job_tokens = self._jobs, [], 0
        self._queued.clear()
        self.batch_flushes[why] = self.batch_flushes.get(why, 0) + 1
        toks, cu, starts = [], [0], []
        for j in jobs:
            toks.append(self._tokens(j.flight)[j.flight.pos : j.end])
            cu.append(cu[-1] + j.end - j.flight.pos)
            starts.append(j.flight.pos)
        rec0, conv0 = self._stacked([j.flight.start for j in jobs])
        kv = [None if j.flight.start is None else j.flight.start.kv for j in jobs]
        bounds = [[p for p in j.wanted if p % CHUNK == 0 and p < j.end] for j in jobs]

        def on_state(n, p, layer, r, c):
            for cp in jobs[n].wanted.get(p, ()):
                self.store.write(cp, layer, r, c)

        keep = any(j.validate for j in jobs)
        t0 = self.clock.start()
        out = self.model.forward_batch(
            torch.cat(toks), cu, starts, rec0, conv0, kv, keep_outputs=keep, boundaries=bounds, on_state=on_state
        )
        h = self.clock.stop(t0)
        self.batch_log.append(BatchCall("suffix", [(j.flight.pos, j.end) for j in jobs], h))
        for n, j in enumerate(jobs):
            f = j.flight
            end = out.state(n, j.end)
            for p, cps in j.wanted.items():
                for cp in cps:
                    if p == j.end:
                        self.store.put(cp, end)
                    self._put_kv(f, cp, end)
            if f.pos < f.n_in:  # the prompt part, as the per-request replay counts it
                f.record.suffix_segments.append((f.pos, f.n_in))
            if j.validate:  # copies: a view would keep the whole batch's outputs alive until the check
                outs = [o[cu[n] : cu[n + 1]].clone() for o in out.outs]
                self._queue_check(_Check(f, j.end, end, outs))
        self._run_checks_when_full()

    def _queue_check(self, check: _Check) -> None:
        self._checks.append(check)
        self._check_tokens += check.end

    def _run_checks_when_full(self) -> None:
        if self._check_tokens >= self.batch_tokens or len(self._checks) >= CHECKS_QUEUED * self.batch:
            self._run_checks()

    def _run_checks(self) -> None:
        """Check the queued hits against from-scratch prefills, in batches of up to
        ``batch_tokens`` tokens (timed), as ``_validate`` checks one."""
        checks, self._checks, self._check_tokens = self._checks, [], 0
        group: list[_Check] = []
        size = 0
        for c in checks:
            if group and size + c.end > self.batch_tokens:
                self._check_group(group)
                group, size = [], 0
            group.append(c)
            size += c.end
        if group:
            self._check_group(group)

    def _check_group(self, group: list) -> None:
        L = self.model.shape.layers
        toks, cu = [], [0]
        for c in group:
            toks.append(self._tokens(c.flight)[: c.end])
            cu.append(cu[-1] + c.end)
        base_at = [c.flight.hit // CHUNK * CHUNK for c in group]
        at_b: dict = {}

        def capture(n, p, layer, r, c):
            at_b[(n, layer)] = (r.clone(), c.clone())

        t0 = self.clock.start()
        ref = self.model.forward_batch(
            torch.cat(toks),
            cu,
            [0] * len(group),
            keep_outputs=True,
            boundaries=[[b] if b > 0 else [] for b in base_at],
            on_state=capture,
        )
        h = self.clock.stop(t0)
        self.batch_log.append(BatchCall("reference", [(0, c.end) for c in group], h))
        # the reference's state at each hit: its boundary state below the hit, carried to the
        # hit by one untimed batch for the hits off a 64-multiple
        base: list = [None] * len(group)
        for n, b in enumerate(base_at):
            if b > 0:
                rec = torch.stack([at_b[(n, l)][0] for l in range(L)])
                conv = torch.stack([at_b[(n, l)][1] for l in range(L)])
                base[n] = StackState(b, rec, conv, None if ref.kv[n] is None else ref.kv[n][:, :, :b])
        carry = [n for n, c in enumerate(group) if c.flight.hit > base_at[n]]
        if carry:
            ccu = [0]
            ctoks = []
            for n in carry:
                ctoks.append(self._tokens(group[n].flight)[base_at[n] : group[n].flight.hit])
                ccu.append(ccu[-1] + group[n].flight.hit - base_at[n])
            rec0, conv0 = self._stacked([base[n] for n in carry])
            kv = [None if base[n] is None else base[n].kv for n in carry]
            moved = self.model.forward_batch(torch.cat(ctoks), ccu, [base_at[n] for n in carry], rec0, conv0, kv)
            for i, n in enumerate(carry):
                base[n] = moved.state(i, group[n].flight.hit)
        for n, c in enumerate(group):
            f = c.flight
            ref_state = ref.state(n, c.end)
            ref_outs = [o[cu[n] + f.hit : cu[n + 1]] for o in ref.outs]
            ref_kv = ref.kv[n][:, :, : f.hit] if ref.kv[n] is not None else None
            f.record.validated = True
            self._judge(f, c.state, c.outs, ref_state, ref_outs, base[n], ref_kv)

    def _late(self, f: _Flight, checkpoint: int, p: int) -> None:
        """Produce a state for a position already run past: recompute up to it (untimed)."""
        tok = self._tokens(f)
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
        self._put_kv(f, checkpoint, f.running if f.running is not None else at_p)
        f.record.late_admits += 1
        self.late_admits += 1

    def _fail(self, kind, f, checkpoint, stored, hit, detail) -> None:
        f.record.failed = True
        self.failures.append(Failure(kind, f.rid, int(checkpoint), int(stored), int(hit), detail))
