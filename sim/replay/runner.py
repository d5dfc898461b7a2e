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
in ``late_admits``. Needs torch.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from sim.replay.checks import VALIDATE_MODES, Failure, rel_error, state_error, tolerance_for
from sim.replay.clock import MEASURE_MODES, Stopwatch
from kernels._common import upload
from sim.replay.model import HybridModel, Marks, StackState
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


class Replayer:
    """Executes an event stream against ``model`` and ``store``.

    ``tokens_of(request_id) -> (token ids of prompt + response, prompt length)``.
    ``validate_every``: check every k-th hit's bits and numerics (the bookkeeping check runs on
    every hit). ``validate``: ``exact`` (default; the restored bits against the produced ones, then
    numerics within the dtype's tolerance), ``shadow`` (the same here; the session adds an fp32
    shadow replayer), ``tolerance`` (numerics only). ``check_hash=False`` skips the bookkeeping
    check (tests show numerics alone also catch a shifted position).
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
    ) -> None:
        if validate_every < 1:
            raise ValueError("validate_every must be >= 1")
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
        self.pending: dict[int, _Flight] = {}  # checkpoint id -> flight that will produce it
        self.records: dict[int, RequestRecord] = {}
        self.failures: list[Failure] = []
        self.hits = 0
        self.late_admits = 0
        self.kv_hits_validated = 0
        self.integrity_checked = 0

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
        rec.restored = True
        f.validate = validate

    def prefill(self, request: int, start: int, end: int) -> None:
        self._settle(request)
        f = self._flight(request)
        f.prefill_end = max(f.prefill_end, min(int(end), f.n_in))

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
        current = f.running if f.running is not None else f.start
        if p > f.pos:
            f.wanted.setdefault(p, []).append(checkpoint)
            self.pending[checkpoint] = f
            if p > f.n_in and self.eager:  # a decode-time state: the prompt's admits are all
                self._run(f, p)  # known by now; later ones continue from here
        elif p == f.pos and current is not None:
            self.store.put(checkpoint, current)
            self._put_kv(f, checkpoint, current)
        else:
            self._late(f, checkpoint, p)

    def evict(self, checkpoint: int) -> None:
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
        return [self.records[k] for k in sorted(self.records)]

    def restored(self, request: int) -> tuple[int, Optional[StackState]]:
        """``(position, state)`` the request's current lookup restored and checked (``(0, None)``:
        from scratch, or a hit that failed its checks): what the step executor starts from."""
        f = self.flights.get(request)
        if f is None or f.start is None:
            return 0, None
        return f.hit, f.start

    # ---- internals ---------------------------------------------------------------------------
    def _flight(self, request: int, fresh: bool = False) -> _Flight:
        f = self.flights.get(request)
        if f is not None and fresh:
            self._finalize(f)
            f = None
        if f is None:
            tokens, n_in = self.tokens_of(request)
            f = _Flight(request, tokens, n_in)
            f.record = self.records.get(request) or RequestRecord(request, n_in, len(tokens) - n_in)
            self.records[request] = f.record
            self.flights[request] = f
            if len(self.flights) > self.max_open:
                oldest = next(iter(self.flights.values()))
                self._finalize(oldest)
        return f

    def _settle(self, request: int) -> None:
        """Finish requests that have decoded once another request's event arrives."""
        if not self.eager:
            return
        for f in [f for r, f in self.flights.items() if r != request and f.decoded]:
            self._finalize(f)

    def _finalize(self, f: _Flight) -> None:
        self._run(f, max([f.prefill_end] + list(f.wanted)))
        self.flights.pop(f.rid, None)
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
        if upto <= f.pos:
            return
        tok = self._tokens(f)
        rec = f.record
        state = f.running if f.running is not None else f.start
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
        outputs, never from the state."""
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
        e_rec, e_conv = state_error(f.running.rec, f.running.conv, ref.rec, ref.conv) if L else (0.0, 0.0)
        e_out = max(rel_error(o, r[f.hit :]) for o, r in zip(outs, ref_outs))
        a, c = state_error(f.start.rec, f.start.conv, base.rec, base.conv) if L else (0.0, 0.0)
        e_rec, e_conv = max(e_rec, a), max(e_conv, c)
        # the restored keys and values against the from-scratch prefill's, every layer and head
        e_kv = rel_error(f.start.kv, ref.kv[:, :, : f.hit]) if ref.kv is not None else 0.0
        rec.max_rec_error, rec.max_conv_error, rec.max_out_error = e_rec, e_conv, e_out
        rec.max_kv_error = e_kv
        if ref.kv is not None:
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

    def _late(self, f: _Flight, checkpoint: int, p: int) -> None:
        """Produce a state for a position already run past: recompute up to it (untimed)."""
        tok = self._tokens(f)
        if f.start is not None and f.hit <= p:
            base, s0 = f.start, f.hit
        else:
            base, s0 = None, 0
        if p == s0 and base is not None:
            self.store.put(checkpoint, base)
        else:

            def sink(q, layer, r, c):
                self.store.write(checkpoint, layer, r, c)

            self.model.run(tok[s0:p], base, s0, [p], sink)
        self._put_kv(f, checkpoint, f.running if f.running is not None else f.start)
        f.record.late_admits += 1
        self.late_admits += 1

    def _fail(self, kind, f, checkpoint, stored, hit, detail) -> None:
        f.record.failed = True
        self.failures.append(Failure(kind, f.rid, int(checkpoint), int(stored), int(hit), detail))
