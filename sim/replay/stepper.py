"""The step executor of ``marconi replay --scheduler continuous``: every ``step`` event of the
engine run as one batched forward of the model (``HybridModel.forward_batch``), timed.

A step's prefill chunks and decode tokens (a decode: one token at position ``context``) are one
varlen batch. Each running request's real state travels from step to step: its gated-delta
states in a slot of a per-layer pool (gathered into the batch, the end states scattered back:
both inside the timed region, as an engine's state indices are), its keys and values in a buffer
of the request's full length (written in place). A timed step starts on an idle device (one
synchronisation before it: the per-request replay's queued work stays out of it); with
``--measure device`` (the default) it is then queued behind a GPU sleep as long as the host's
recent issue times (``sim.replay.clock.Stopwatch``), so its events time the step's kernels back to
back; with ``wall``, as issued (its host launches included). A request's first chunk starts from the state
the store restored on its hit (handed over by the ``Replayer`` at the lookup: the same checked
state the per-request replay resumes from), or from zeros; a chunk that starts where the
request's state is not (a failed hit, a whole-prompt hit recomputing its last token) first
computes that state, untimed (``catchup_tokens``). A preempted request's state is dropped; its
next lookup starts it again.

Coasted runs (a ``step`` with ``steps`` = k > 1: k decode steps of the same requests): the first
``coast_steps`` of them are executed and timed one by one (contexts one longer each step); the
remaining k - coast_steps tokens of every request are computed untimed as one batch, so the
states stay real (``coasted_untimed_steps``, ``coasted_untimed_tokens``).

Correctness stays with the ``Replayer`` (every hit validated; states admitted to the store are
the ones the per-request replay produces): this executor times batches. Its own forward is
checked against per-sequence forwards in the tests, and with ``check_steps`` > 0 on the first
steps of a run (the batch's outputs against ``forward_segment`` on each sequence; a mismatch is a
``step-batch`` failure). Needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from sim.replay.checks import Failure, rel_error, state_error, tolerance_for
from sim.replay.clock import Stopwatch
from kernels._common import upload
from sim.replay.model import HybridModel, Marks, StackState
from sim.replay.steps import ExecutedStep

#: executed steps whose timing events are resolved together (one synchronisation per batch of them)
RESOLVE_EVERY = 512

#: a running request's KV buffer grows to its segment's end, or by this share of its length where
#: that is more (amortized copies over a decode run), never past its prompt and response: a
#: buffer of the whole length from the request's first step held 22.6 GB for 17 running
#: Mooncake requests of marconi-7b at 20 GB (the engine charges the tokens computed), and with
#: the store and the per-request replay's flights ran an H100 out of memory
KV_GROWTH = 0.5


def grown_length(have: int, end: int, whole: int) -> int:
    """The length a running request's KV buffer of ``have`` positions grows to for a segment
    ending at ``end`` (``KV_GROWTH``; ``whole``: its prompt, response and one)."""
    return max(end, min(have + int(have * KV_GROWTH), whole))


#: state slots the executor's pool starts with; it doubles when they are all taken
FIRST_SLOTS = 8


def slot_bytes(shape, dtype) -> int:
    """One slot of the executor's state pool: every gated-delta layer's fp32 recurrent state and
    its conv window in ``dtype``."""
    elt = torch.empty((), dtype=dtype).element_size()
    per_layer = shape.v_heads * shape.head_k_dim * shape.head_v_dim * 4 + shape.conv_dim * (shape.conv_width - 1) * elt
    return shape.layers * per_layer


@dataclass
class _Running:
    rid: int
    tokens: torch.Tensor  # prompt + response ids on the device
    slot: int
    pos: int  # tokens whose state / KV this executor holds
    kv: Optional[torch.Tensor]  # [A, 2, C, KVH, hd]: C >= pos, grown as it runs (``StepExecutor._room``)


class StepExecutor:
    """Executes ``step`` events against ``model`` (module docstring). ``tokens_of(request) ->
    (prompt + response ids, prompt length)``; ``coast_steps``: steps timed per coasted run;
    ``check_steps``: how many first steps to cross-check against per-sequence forwards, within
    ``tolerance`` (recurrent states, outputs and KV; default: the dtype's, as the replayer's)."""

    def __init__(
        self,
        model: HybridModel,
        tokens_of: Callable[[int], tuple[np.ndarray, int]],
        *,
        coast_steps: int = 4,
        check_steps: int = 0,
        tolerance: Optional[tuple[float, float]] = None,
        measure: str = "wall",
    ) -> None:
        if coast_steps < 1:
            raise ValueError("coast_steps must be >= 1")
        self.model = model
        self.tokens_of = tokens_of
        self.coast_steps = coast_steps
        self.check_steps = check_steps
        # (recurrent states, outputs and KV): the replayer's tolerances by default
        self.tolerance = tuple(tolerance) if tolerance is not None else tolerance_for(model.dtype)
        self.cuda = model.device.type == "cuda"
        self.clock = Stopwatch(model.device, queued=measure == "device")
        s = model.shape
        self._cap = 0
        self.rec: list = []  # per gated-delta layer [slots, Hv, K, V] fp32
        self.conv: list = []  # per gated-delta layer [slots, conv_dim, W-1]
        self.free: list[int] = []
        self.running: dict[int, _Running] = {}
        self.starts: dict[int, tuple[int, Optional[StackState]]] = {}  # request -> (hit, restored)
        self.executed: list[ExecutedStep] = []
        self._resolved = 0  # executed steps whose timings are resolved
        self._handles: list = []  # per executed step not yet resolved: Stopwatch handle, Marks
        self.failures: list[Failure] = []
        self.events = 0
        self.steps_simulated = 0
        self.catchup_tokens = 0
        self.coasted_untimed_steps = 0
        self.coasted_untimed_tokens = 0
        self.preempted_dropped = 0
        # the running requests' KV buffers (``_room``) and, at their most, with the state pool
        self.kv_bytes = 0
        self.peak_bytes = 0
        self.checked = 0
        self._layers = s.layers
        self._grow(FIRST_SLOTS)

    # ---- state pool --------------------------------------------------------------------------
    def _grow(self, cap: int) -> None:
        s, m = self.model.shape, self.model
        old = self._cap
        rec = [
            torch.zeros(cap, s.v_heads, s.head_k_dim, s.head_v_dim, dtype=torch.float32, device=m.device)
            for _ in range(s.layers)
        ]
        conv = [torch.zeros(cap, s.conv_dim, s.conv_width - 1, dtype=m.dtype, device=m.device) for _ in range(s.layers)]
        for new, cur in zip(rec + conv, self.rec + self.conv):
            new[:old] = cur
        before = self._pool_bytes if old else 0
        self.rec, self.conv = rec, conv
        self.free += list(range(cap - 1, old - 1, -1))
        self._cap = cap
        self._pool_bytes = sum(t.nbytes for t in self.rec + self.conv)
        self._peak(before)  # the old pool is held until its slots are copied over

    def _slot(self) -> int:
        if not self.free:
            self._grow(2 * self._cap)
        return self.free.pop()

    def _drop(self, rid: int) -> None:
        r = self.running.pop(rid, None)
        if r is not None:
            self.free.append(r.slot)
            if r.kv is not None:
                self.kv_bytes -= r.kv.nbytes

    # ---- events ------------------------------------------------------------------------------
    def lookup(self, request: int, hit_tokens: int, restored: Optional[StackState]) -> None:
        """A (re)lookup: the request starts again from ``restored`` (its state at
        ``hit_tokens``; None: from scratch)."""
        self._drop(request)
        self.starts[request] = (int(hit_tokens) if restored is not None else 0, restored)

    def done(self, request: int) -> None:
        """The request has finished (its decode event): its state is freed."""
        self._drop(request)
        self.starts.pop(request, None)

    def step(self, t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted) -> None:
        self.events += 1
        k = max(1, int(steps))
        self.steps_simulated += k
        busy = {p[0] for p in prefills} | {d[0] for d in decodes}
        for rid in preempted:
            if rid not in busy and rid in self.running:
                self._drop(rid)
                self.preempted_dropped += 1
        for rid, a, _ in prefills:
            self._at(int(rid), int(a))
        for rid, c in decodes:
            self._at(int(rid), int(c))
        timed = min(k, self.coast_steps)
        dt = (t_end - t_start) / k
        for i in range(timed):
            pre = tuple((int(r), int(a), int(b)) for r, a, b in prefills) if i == 0 else ()
            dec = tuple((int(r), int(c) + i) for r, c in decodes)
            segs = list(pre) + [(r, c, c + 1) for r, c in dec]
            self._execute(segs, ExecutedStep(self.events - 1, i, k, t_start + i * dt, pre, dec), timed=True)
        if k > timed and decodes:
            n = k - timed
            segs = [(int(r), int(c) + timed, int(c) + k) for r, c in decodes]
            self._execute(segs, None, timed=False)
            self.coasted_untimed_steps += n
            self.coasted_untimed_tokens += n * len(decodes)

    # ---- internals ---------------------------------------------------------------------------
    def _new(self, rid: int) -> _Running:
        tokens, _ = self.tokens_of(rid)
        tok = upload(np.asarray(tokens), self.model.device)
        s, m = self.model.shape, self.model
        kv = None
        if s.attn_layers:
            kv = torch.zeros(s.attn_layers, 2, 0, s.attn_kv_heads, s.attn_head_dim, dtype=m.dtype, device=m.device)
        r = _Running(rid, tok, self._slot(), 0, kv)
        for l in range(s.layers):
            self.rec[l][r.slot].zero_()
            self.conv[l][r.slot].zero_()
        hit, st = self.starts.pop(rid, (0, None))
        if st is not None and hit > 0:
            self._put(r, st, hit)
        self.running[rid] = r
        return r

    def _put(self, r: _Running, st: StackState, pos: int) -> None:
        for l in range(self._layers):
            self.rec[l][r.slot].copy_(st.rec[l])
            self.conv[l][r.slot].copy_(st.conv[l])
        if r.kv is not None and pos:
            self._room(r, pos)
            r.kv[:, :, :pos] = st.kv[:, :, :pos]
        r.pos = pos

    def _room(self, r: _Running, end: int) -> None:
        """``r``'s KV buffer holds positions up to ``end`` (grown, untimed: ``KV_GROWTH``)."""
        kv = r.kv
        if kv is None or kv.shape[2] >= end:
            return
        n = grown_length(kv.shape[2], end, r.tokens.shape[0] + 1)
        new = torch.zeros(kv.shape[:2] + (n,) + kv.shape[3:], dtype=kv.dtype, device=kv.device)
        new[:, :, : r.pos] = kv[:, :, : r.pos]
        r.kv = new
        self.kv_bytes += new.nbytes - kv.nbytes
        self._peak(kv.nbytes)  # the old buffer is held until it is copied over

    @property
    def pool_bytes(self) -> int:
        """Bytes of the state pool (every slot, taken or free)."""
        return self._pool_bytes

    def _peak(self, transient: int = 0) -> None:
        """The peak with what is held now, and ``transient`` bytes more (a buffer or pool being
        copied into its grown one: both are held at once)."""
        self.peak_bytes = max(self.peak_bytes, self.kv_bytes + self._pool_bytes + transient)

    def _at(self, rid: int, p: int) -> None:
        """Make the request's state the one at position ``p`` (untimed work when it is not)."""
        r = self.running.get(rid)
        if r is None:
            r = self._new(rid)
        if r.pos == p:
            return
        if r.pos > p:  # back to scratch (a whole-prompt hit recomputes its last token)
            for l in range(self._layers):
                self.rec[l][r.slot].zero_()
                self.conv[l][r.slot].zero_()
            r.pos = 0
        if p > r.pos:
            self.catchup_tokens += p - r.pos
            self._execute([(rid, r.pos, p)], None, timed=False)

    def _execute(self, segs, record: Optional[ExecutedStep], timed: bool) -> None:
        """One batched forward of ``segs`` ``[(request, start, end)]`` (each request's state at
        ``start``), timed into ``record`` when given; the states move to the segments' ends."""
        m = self.model
        runs = [self.running[r] for r, _, _ in segs]
        for (r, a, b), run in zip(segs, runs):
            if run.pos != a:
                raise RuntimeError(f"step executor: request {r} is at {run.pos}, its segment starts at {a}")
            self._room(run, b)
        cu = [0]
        for _, a, b in segs:
            cu.append(cu[-1] + b - a)
        starts = [a for _, a, _ in segs]
        ids = torch.cat([self._ids(run, a, b) for (_, a, b), run in zip(segs, runs)])
        slots_host = [run.slot for run in runs]
        check = timed and self.checked < self.check_steps
        before = [self._snapshot(run) for run in runs] if check else None
        if timed and self.cuda:
            # the step starts on an idle device: its time is its own launches and kernels, not
            # hidden behind (or queued after) the per-request replay's work enqueued before it
            torch.cuda.synchronize(m.device)
        h = self.clock.start(kind="step") if timed else None  # queued behind a sleep with --measure device
        marks = Marks(m.device) if timed else None
        slots = upload(slots_host, m.device)
        rec0 = _Gather(self.rec, slots)
        conv0 = _Gather(self.conv, slots)
        out = m.forward_batch(
            ids,
            cu,
            starts,
            rec0,
            conv0,
            [run.kv for run in runs] if m.shape.attn_layers else None,
            marks=marks,  # the check compares the last layer's output (out.x), no layer's kept
        )
        for l in range(self._layers):
            self.rec[l].index_copy_(0, slots, out.rec[l])
            self.conv[l].index_copy_(0, slots, out.conv[l].to(self.conv[l].dtype))
        h = self.clock.stop(h) if timed else None
        for (_, _, b), run in zip(segs, runs):
            run.pos = b
        if check:
            self._check(segs, before, ids, cu, out)
        if record is not None:
            self.executed.append(record)
            self._handles.append((h, marks))
            if len(self._handles) >= RESOLVE_EVERY:  # bounded number of pending CUDA events
                self.close()

    @staticmethod
    def _ids(run: _Running, a: int, b: int) -> torch.Tensor:
        """Token ids at positions ``[a, b)``; a position past the response (not expected: the
        engine decodes at most to the last output token) repeats the last id."""
        ids = run.tokens[a:b]
        if ids.shape[0] < b - a:
            ids = torch.cat([ids, run.tokens[-1:].expand(b - a - ids.shape[0])])
        return ids

    def _snapshot(self, run: _Running) -> StackState:
        kv = run.kv[:, :, : run.pos].clone() if run.kv is not None else None
        return StackState(
            run.pos,
            torch.stack([self.rec[l][run.slot] for l in range(self._layers)]).clone(),
            torch.stack([self.conv[l][run.slot] for l in range(self._layers)]).clone(),
            kv,
        )

    def _check(self, segs, before, ids, cu, out) -> None:
        """The batch against ``forward_segment`` on each sequence alone (untimed)."""
        m = self.model
        self.checked += 1
        for i, ((rid, a, b), st) in enumerate(zip(segs, before)):
            x, fin, _ = m.forward_segment(m.embed(ids[cu[i] : cu[i + 1]]), st if a else None, a, [])
            e_out = rel_error(out.x[cu[i] : cu[i + 1]], x)
            if fin.kv is not None:
                e_out = max(e_out, rel_error(out.kv[i], fin.kv))
            # per layer and head (each head's K x V state one row), as the restore check and its
            # tolerance measure it: row by row, a low-norm row of a state read bf16 rounding as
            # an error of 20 % (issue 41: qwen3-next-80b-a3b, "recurrent 0.217")
            e_rec, e_conv = (
                state_error(
                    torch.stack([r[i] for r in out.rec]), torch.stack([c[i] for c in out.conv]), fin.rec, fin.conv
                )
                if self._layers
                else (0.0, 0.0)
            )
            e_out = max(e_out, e_conv)
            if not (e_rec <= self.tolerance[0] and e_out <= self.tolerance[1]):
                self.failures.append(
                    Failure(
                        "step-batch",
                        rid,
                        -1,
                        a,
                        b,
                        f"batched forward differs from the per-sequence one: recurrent {e_rec:.3g}, "
                        f"outputs / conv / KV {e_out:.3g}",
                    )
                )

    def close(self) -> list[ExecutedStep]:
        """Resolve the timings of the executed steps; every executed step, in order."""
        for rec, (h, marks) in zip(self.executed[self._resolved :], self._handles):
            rec.measured_ms = self.clock.ms(h)
            rec.host_ms = self.clock.host_ms(h)
            rec.slack_ms = self.clock.slack_ms(h)
            rec.ms_by_type = marks.ms_by_type() if marks is not None else {}
        self._resolved = len(self.executed)
        self._handles = []
        return self.executed

    def counts(self) -> dict:
        """The executor's counts for the summary."""
        return dict(
            step_events=self.events,
            steps_simulated=self.steps_simulated,
            step_coast_timed=self.coast_steps,
            steps_coasted_untimed=self.coasted_untimed_steps,
            step_coasted_untimed_tokens=self.coasted_untimed_tokens,
            step_catchup_tokens=self.catchup_tokens,
            step_preempted_dropped=self.preempted_dropped,
            step_peak_bytes=self.peak_bytes,
            steps_cross_checked=self.checked,
            step_check_failures=len(self.failures),
        )


class _Gather:
    """``pool[l]``'s rows of the batch's slots, gathered when layer ``l`` asks for them."""

    def __init__(self, pool: list, slots: torch.Tensor) -> None:
        self.pool, self.slots = pool, slots

    def __getitem__(self, l: int) -> torch.Tensor:
        return self.pool[l].index_select(0, self.slots)


class StepSizer:
    """The step executor's device bytes over a run, without its model: an engine observer that
    follows ``StepExecutor``'s bookkeeping (requests started at their hit, caught up, grown by
    ``grown_length``, freed at their end or preemption; the state pool doubled from
    ``FIRST_SLOTS``) on the simulation's events alone. ``peak_bytes``: the most its KV buffers
    and state pool hold at once (a buffer or the pool being grown counted twice while it is
    copied), what a continuous replay plans beside the store
    (``sim.replay.pipeline``). ``whole(request id)``: its prompt and response tokens;
    ``kv_per_token`` and ``slot_bytes``: one token's KV and one slot's states."""

    def __init__(self, whole: Callable[[int], int], kv_per_token: int, slot_bytes: int, coast_steps: int = 4) -> None:
        self.whole = whole
        self.kv_per_token = kv_per_token
        self.slot_bytes = slot_bytes
        self.coast_steps = coast_steps
        self.starts: dict[int, int] = {}
        self.pos: dict[int, int] = {}
        self.length: dict[int, int] = {}
        self.kv_tokens = 0
        self.slots = FIRST_SLOTS
        self.peak_bytes = self.slots * slot_bytes

    def _peak(self, transient: int) -> None:
        """As ``StepExecutor._peak``: what is held, and the buffer or pool being copied."""
        self.peak_bytes = max(
            self.peak_bytes, self.kv_tokens * self.kv_per_token + self.slots * self.slot_bytes + transient
        )

    def _drop(self, rid: int) -> None:
        if rid in self.pos:
            del self.pos[rid]
            self.kv_tokens -= self.length.pop(rid)

    def _room(self, rid: int, end: int) -> None:
        have = self.length[rid]
        if have < end:
            n = grown_length(have, end, self.whole(rid) + 1)
            self.length[rid] = n
            self.kv_tokens += n - have
            self._peak(have * self.kv_per_token)

    def _at(self, rid: int, p: int) -> None:
        if rid not in self.pos:
            if len(self.pos) >= self.slots:
                self.slots *= 2
                self._peak(self.slots // 2 * self.slot_bytes)
            self.pos[rid], self.length[rid] = 0, 0
            hit = self.starts.pop(rid, 0)
            if hit > 0:
                self._room(rid, hit)
                self.pos[rid] = hit
        if self.pos[rid] != p:  # caught up (from scratch where it is past p): a buffer up to p
            self._room(rid, p)
            self.pos[rid] = p

    def _run(self, rid: int, end: int) -> None:
        self._room(rid, end)
        self.pos[rid] = end

    def lookup(self, request, t, hit_checkpoint, hit_tokens, input_tokens) -> None:
        rid = request.request_id
        self._drop(rid)
        self.starts[rid] = int(hit_tokens) if hit_checkpoint is not None else 0

    def decode(self, request, t_start, t_end, start_pos, end_pos, seconds) -> None:
        self._drop(request.request_id)
        self.starts.pop(request.request_id, None)

    def step(self, t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted) -> None:
        k = max(1, int(steps))
        busy = {p[0] for p in prefills} | {d[0] for d in decodes}
        for rid in preempted:
            if rid not in busy:
                self._drop(int(rid))
        for rid, a, _ in prefills:
            self._at(int(rid), int(a))
        for rid, c in decodes:
            self._at(int(rid), int(c))
        timed = min(k, self.coast_steps)
        for i in range(timed):
            if i == 0:
                for rid, _, b in prefills:
                    self._run(int(rid), int(b))
            for rid, c in decodes:
                self._run(int(rid), int(c) + i + 1)
        if k > timed:
            for rid, c in decodes:
                self._run(int(rid), int(c) + k)
