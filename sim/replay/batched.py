"""Batched replay (``Replayer(batch=...)`` > 1, sequential streams only), the ``Replayer``'s
collaborator that queues finished requests and runs them as varlen batches. Needs torch.

A finished request's work (its suffix from the restored state to its last wanted state, the
response teacher-forced) is queued rather than run, and the queue runs as one varlen batch
(``HybridModel.forward_batch``) when it holds ``batch`` requests or ``batch_tokens`` tokens, when
a lookup hits a checkpoint a queued request has still to produce (a multi-turn chain: the next
turn needs the last one's state), and at ``finish``. Each queued hit's check against a
from-scratch prefill joins a second queue, which runs in batches of up to ``batch_tokens`` tokens
(these have no dependencies) and is judged by the ``HitChecker`` as the per-request replay's
checks are. Each batch call is timed (``log``), which is what replay's throughput is measured on.
A request whose wanted states need a split (a position not on a 64-multiple before its end) runs
alone, through the ``Replayer``, and its calls are logged as single ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from sim.replay.flight import Flight, checked_out, put_kv
from sim.replay.hits import HitChecker, SuffixOutputs, check_boundary
from sim.replay.model import CHUNK, HybridModel, Marks, StackState, kept_rows
from sim.replay.store import CheckpointStore

#: tokens per batched call of ``Replayer(batch=...)`` (the queued suffixes, or the references)
BATCH_TOKENS = 16384
#: queued hit checks per ``batch`` (each holds the restored and the end state until it runs)
CHECKS_QUEUED = 4
#: device bytes the queued requests (their prefixes' KV, states, checked suffix outputs) and the
#: queued hit checks (restored KV, end states, suffix outputs) may hold together before they run
#: (one request alone may hold more): a Mooncake prompt of 100K tokens holds 2.4 GB of KV at
#: qwen3-next-80b-a3b's full depth, and 39 GB of outputs when its hit is short; 64 of them more
#: than a GPU
HELD_BYTES = 8 << 30


@dataclass
class Job:
    """A queued request: its tokens ``[flight.pos, end)`` from its restored state, the states
    wanted on the way (position -> checkpoints; 64-multiples before ``end``, or ``end``)."""

    flight: Flight
    end: int
    wanted: dict
    validate: bool
    # its suffix's per-layer outputs are kept in the batch for its check (False: they would not
    # fit HitChecker.output_bytes, the check compares them in groups of layers, run again)
    held: bool = False


@dataclass
class Check:
    """A queued hit check: the request's end state after the batched suffix and the suffix's
    per-layer outputs, against a from-scratch prefill of ``[0, end)``."""

    flight: Flight
    end: int
    state: StackState
    outs: list
    cuts: tuple = ()  # where its suffix call was split (a request run alone): a rerun splits there too

    def nbytes(self) -> int:
        """Device bytes the queued check holds: the restored state (and its KV), the end state
        and the suffix's per-layer outputs."""
        return sum(_nbytes(t) for t in (self.flight.start, self.state, *self.outs))


def _nbytes(st) -> int:
    if st is None:
        return 0
    if isinstance(st, torch.Tensor):  # what it keeps alive: its whole storage, not its view
        return st.untyped_storage().nbytes()
    return sum(_nbytes(t) for t in (st.rec, st.conv, st.kv))


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
    marks: Optional[Marks] = None  # a reference's marks: its check's work is taken out of ``ms``


class BatchedReplay:
    """The queues of batched replay over ``model`` and ``store``; ``checker`` judges the hits,
    ``clock`` times the calls (module docstring)."""

    def __init__(
        self,
        model: HybridModel,
        store: CheckpointStore,
        clock,
        checker: HitChecker,
        *,
        batch: int,
        batch_tokens: int = BATCH_TOKENS,
        held_bytes: int = HELD_BYTES,
    ) -> None:
        if batch < 1 or batch_tokens < 1 or held_bytes < 1:
            raise ValueError("batch, batch_tokens and held_bytes must be >= 1")
        self.model = model
        self.store = store
        self.clock = clock
        self.checker = checker
        self.batch = batch
        self.batch_tokens = batch_tokens
        self.held_bytes = held_bytes
        self._jobs: list[Job] = []
        self._job_tokens = 0
        self._job_bytes = 0  # what the queued requests will hold in the batch: KV to their ends, states
        self._queued: dict[int, Job] = {}  # checkpoint -> queued job that produces it
        self._checks: list[Check] = []
        self._check_tokens = 0
        self._check_bytes = 0
        # the most device bytes the check queue held, and the most output rows one reference
        # call kept (tests: bounded by the hits' suffixes, not by layers x whole prompts)
        self.peak_check_bytes = 0
        self.peak_kept_rows = 0
        self.log: list[BatchCall] = []
        self.flushes: dict[str, int] = {}  # why the suffix queue ran -> times

    # ---- the queue of requests -----------------------------------------------------------------
    def produces(self, checkpoint: int) -> bool:
        """A queued request has still to produce ``checkpoint``."""
        return checkpoint in self._queued

    def evicted(self, checkpoint: int) -> None:
        """``checkpoint`` left the simulator's cache: a queued request no longer writes it."""
        job = self._queued.pop(checkpoint, None)
        if job is not None:
            for cps in job.wanted.values():
                if checkpoint in cps:
                    cps.remove(checkpoint)

    @staticmethod
    def batchable(f: Flight, upto: int) -> bool:
        """A request runs in a batch when nothing has run yet since its restore and every state
        it must hand over on the way is a kernel boundary (a 64-multiple) or its end."""
        if upto <= f.pos or f.pos != f.hit or f.running is not None or upto < f.n_in:
            return False
        return all(p % CHUNK == 0 or p == upto for p in f.wanted if p > f.pos)

    def enqueue(self, f: Flight, upto: int, pending: dict) -> None:
        """Queue ``f``'s work up to ``upto``; its wanted checkpoints move from ``pending`` (the
        replayer's producers) to this queue. A full queue runs."""
        job = Job(f, upto, {p: cps for p, cps in f.wanted.items() if p > f.pos}, f.validate and f.hit > 0)
        job.held = job.validate and self.checker.keeps(f, upto) is True
        nbytes = self._job_nbytes(job)
        if self._jobs and self._job_bytes + nbytes > self.held_bytes:
            self.flush("memory")  # what is queued runs first: the batch would hold more than the budget
        f.wanted = {}
        for cps in job.wanted.values():
            for cp in cps:
                pending.pop(cp, None)
                self._queued[cp] = job
        self._jobs.append(job)
        self._job_tokens += upto - f.pos
        self._job_bytes += nbytes
        if len(self._jobs) >= self.batch or self._job_tokens >= self.batch_tokens:
            self.flush("full")
        elif self._job_bytes >= self.held_bytes:
            self.flush("memory")

    def _job_nbytes(self, job: Job) -> int:
        """What ``job`` holds in its batch: the KV to its end, its start and end states and, when
        its hit is checked, its suffix's per-layer outputs (fp32 rows of the residual stream)."""
        m = self.model
        s = m.shape
        outs = (job.end - job.flight.pos) * len(s.order) * s.hidden * 4 if job.held else 0
        return job.end * s.kv_bytes_per_token(m.dtype) + 2 * s.state_bytes(m.dtype) + outs

    def single(self, f: Flight, upto: int, run: Callable[[Flight, int], None]) -> None:
        """A request that needs a split runs alone (``run``: the replayer's per-request run):
        its timed call joins the log, its hit's check the queue of checks."""
        r = f.record
        run(f, upto)
        if f.times.suffix is not None:
            self.log.append(BatchCall("single", [tuple(x) for x in r.suffix_segments], f.times.suffix))
        f.times.clear()  # the flight is out of the replayer's: a queued check is what still holds it
        f.running = None  # (its state and KV at the end: its check holds the end state it needs)
        self.run_checks_when_full()

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

    def flush(self, why: str) -> None:
        """Run the queued requests as one varlen batch (timed), hand their wanted states to the
        store, queue their hits' checks."""
        if not self._jobs:
            return
        if self._checks and self._check_bytes + self._job_bytes > self.held_bytes:
            self.run_checks()  # the queued checks run first: with this batch they would hold more
        jobs, self._jobs, self._job_tokens, self._job_bytes = self._jobs, [], 0, 0
        self._queued.clear()
        self.flushes[why] = self.flushes.get(why, 0) + 1
        device = self.model.device
        toks, cu, starts = [], [0], []
        for j in jobs:
            toks.append(j.flight.ids(device)[j.flight.pos : j.end])
            cu.append(cu[-1] + j.end - j.flight.pos)
            starts.append(j.flight.pos)
        rec0, conv0 = self._stacked([j.flight.start for j in jobs])
        kv = [self._kv_with_room(j) for j in jobs]
        bounds = [[p for p in j.wanted if p % CHUNK == 0 and p < j.end] for j in jobs]

        def on_state(n, p, layer, r, c):
            for cp in jobs[n].wanted.get(p, ()):
                self.store.write(cp, layer, r, c)

        keep = any(j.held for j in jobs)
        # only the validated requests' rows are kept (their suffixes: what their checks compare),
        # but those too large to hold (their checks run the suffix again, layers in groups)
        keep_from = [j.flight.pos if j.held else j.end for j in jobs]
        # the rows kept for the checks are copied inside the call: their copies leave its time
        marks = Marks(self.model.device) if keep else None
        t0 = self.clock.start(kind="batch")
        out = self.model.forward_batch(
            torch.cat(toks),
            cu,
            starts,
            rec0,
            conv0,
            kv,
            keep_outputs=keep,
            boundaries=bounds,
            on_state=on_state,
            keep_from=keep_from if keep else None,
            marks=marks,
        )
        h = self.clock.stop(t0)
        del rec0, conv0, kv, toks
        self.log.append(BatchCall("suffix", [(j.flight.pos, j.end) for j in jobs], h, marks=marks))
        k = kept_rows(cu, starts, keep_from)
        # each validated request's suffix rows, layer by layer, each batch layer let go once split
        # (copies: a view would keep the whole batch's outputs alive until the last check; a lone
        # request's rows are the layer's tensor itself)
        n_layers = len(self.model.shape.order)
        job_outs: list = [[] if j.held else [None] * n_layers for j in jobs]
        if keep:
            for layer in range(len(out.outs)):
                o, out.outs[layer] = out.outs[layer], None
                for n, j in enumerate(jobs):
                    if j.held:
                        whole = k[n] == 0 and k[n + 1] == o.shape[0]
                        job_outs[n].append(o if whole else o[k[n] : k[n + 1]].clone())
                del o
        for n, j in enumerate(jobs):
            f = j.flight
            end = out.state(n, j.end)
            for p, cps in j.wanted.items():
                for cp in cps:
                    if p == j.end:
                        self.store.put(cp, end)
                    put_kv(self.store, f, cp, end)
            if f.pos < f.n_in:  # the prompt part, as the per-request replay counts it
                f.record.suffix_segments.append((f.pos, f.n_in))
            if j.validate:
                self.queue_check(Check(f, j.end, end, job_outs[n]))
                job_outs[n] = None
        del out, end  # the batch's KV buffers and outputs: the checks hold what they need
        self.run_checks_when_full()

    def _kv_with_room(self, j: Job):
        """The KV buffer ``j``'s sequence runs in: its restored prefix in a buffer with room to
        its end, which ``forward_batch`` fills in place, and its restored state's KV a view of
        that prefix (the same bits): one copy of the request's KV, not the restored one and a
        grown copy side by side."""
        st = j.flight.start
        if st is None or st.kv is None:
            return None
        if st.kv.shape[2] >= j.end:
            return st.kv
        buf = st.kv.new_empty(st.kv.shape[:2] + (j.end,) + st.kv.shape[3:])
        buf[:, :, : st.kv.shape[2]].copy_(st.kv)
        j.flight.start = StackState(st.pos, st.rec, st.conv, buf[:, :, : st.kv.shape[2]])
        return buf

    # ---- the queue of hit checks ---------------------------------------------------------------
    def queue_check(self, check: Check) -> None:
        # the end state's KV is not compared (the restored KV is, against the reference's):
        # dropping it keeps one KV per queued check, not two
        check.state = StackState(check.state.pos, check.state.rec, check.state.conv, None)
        self._checks.append(check)
        self._check_tokens += check.end
        self._check_bytes += check.nbytes()
        self.peak_check_bytes = max(self.peak_check_bytes, self._check_bytes)

    def run_checks_when_full(self) -> None:
        if (
            self._check_tokens >= self.batch_tokens
            or len(self._checks) >= CHECKS_QUEUED * self.batch
            or self._check_bytes >= self.held_bytes
        ):
            self.run_checks()

    def run_checks(self) -> None:
        """Check the queued hits against from-scratch prefills, in batches of up to
        ``batch_tokens`` tokens (timed), as ``HitChecker.validate`` checks one."""
        checks, self._checks, self._check_tokens, self._check_bytes = self._checks, [], 0, 0
        group: list[Check] = []
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
        model = self.model
        L = model.shape.layers
        toks, cu = [], [0]
        for c in group:
            toks.append(c.flight.ids(model.device)[: c.end])
            cu.append(cu[-1] + c.end)
        base_at = [check_boundary(c.flight.hit) for c in group]
        at_b: dict = {}

        def capture(n, p, layer, r, c):
            at_b[(n, layer)] = (r.clone(), c.clone())

        # each layer's rows from each hit on are compared with the check's suffix outputs as the
        # reference makes them, and both let go: no layer's outputs are kept
        suffixes = [SuffixOutputs(c.outs, c.flight.hit) for c in group]

        def compare(layer, x):
            for n, s in enumerate(suffixes):
                s.compare(layer, x[cu[n] + s.hit : cu[n + 1]])

        marks = Marks(model.device)  # the check's work in its own bucket, out of the call's time
        t0 = self.clock.start(kind="batch-reference")
        ref = model.forward_batch(
            torch.cat(toks),
            cu,
            [0] * len(group),
            boundaries=[[b] if b > 0 else [] for b in base_at],
            on_state=capture,
            marks=marks,
            on_output=compare,
        )
        h = self.clock.stop(t0)
        self.log.append(BatchCall("reference", [(0, c.end) for c in group], h, marks=marks))
        self.peak_kept_rows = max(self.peak_kept_rows, ref.outs[0].shape[0] if ref.outs else 0)
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
                ctoks.append(group[n].flight.ids(model.device)[base_at[n] : group[n].flight.hit])
                ccu.append(ccu[-1] + group[n].flight.hit - base_at[n])
            rec0, conv0 = self._stacked([base[n] for n in carry])
            kv = [None if base[n] is None else base[n].kv for n in carry]
            moved = model.forward_batch(torch.cat(ctoks), ccu, [base_at[n] for n in carry], rec0, conv0, kv)
            for i, n in enumerate(carry):
                base[n] = moved.state(i, group[n].flight.hit)
        for n, c in enumerate(group):
            f = c.flight
            ref_state = ref.state(n, c.end)
            ref_kv = ref.kv[n][:, :, : f.hit] if ref.kv[n] is not None else None
            f.record.validated = True
            # the layers not held in the batch (outputs over the checker's bound), group by group
            self.checker.compare_rest(f, suffixes[n], c.end, c.cuts)
            self.checker.judge(f, c.state, suffixes[n].error(), ref_state, base[n], ref_kv)

    def finish(self) -> None:
        """Run what is queued and resolve every logged call's times."""
        self.flush("finish")
        self.run_checks()

    def resolve(self) -> None:
        for call in self.log:
            if call.handle is not None:
                h, call.handle = call.handle, None
                by = call.marks.ms_by_type() if call.marks is not None else None
                call.ms = checked_out(self.clock.ms(h), by)
                call.host_ms, call.slack_ms = self.clock.host_ms(h), self.clock.slack_ms(h)
