"""Replay as an observer of the engine's event stream (``sim.engine.events``).

Maps each event to the ``Replayer``: ``lookup`` restores and checks a hit, ``admit`` reserves a
store slot and schedules its state, ``evict`` frees it, ``decode`` forces the request's prompt
(DES mode), ``reject`` drops the request. Positions arrive in tokens. With a step executor
(``--scheduler continuous``: ``sim.replay.stepper``), ``step`` events are executed as batches and
timed; the executor starts a request from the state the replayer restored at its lookup and frees
it at its decode (the request's end). Needs torch (imported lazily by the CLI).
"""

from __future__ import annotations

from typing import Optional

from sim.replay.runner import Replayer


class ReplayObserver:
    """``sequential``: the engine emits a request's events together (its admits after its
    decode), so the request's work runs at the next lookup; ``des``: the prompt runs at its
    decode, once its prefill-time admits are known, and decode-time states as admitted."""

    def __init__(
        self,
        replayer: Replayer,
        *,
        mode: str,
        progress=None,
        after_event: Optional[callable] = None,
        shadows=(),
        stepper=None,
    ) -> None:
        self.replayer = replayer
        # shadows (``--validate shadow``: an fp32 replay) receive every event after the replayer
        self.replayers = [replayer, *shadows]
        for r in self.replayers:
            r.eager = mode == "des"
        # the bar counts requests done (their decode: the request's end); a request looked up again
        # (preempted under continuous batching) is said beside it, not counted twice (a run of 40
        # requests with 265 preemptions read "replaying: 305req" past its total)
        self.progress = progress
        self._done_requests: set = set()
        self.looked_up_again = 0
        self.last_lookup: Optional[tuple] = None  # (request id, prompt tokens): where an error is said to be
        self.during = ""  # the event being handled ("" between events): what an error was doing
        self.after_event = after_event  # tests: called after every event
        self.stepper = stepper  # sim.replay.stepper.StepExecutor (continuous scheduler) or None

    def _finished(self, rid: int) -> None:
        """Request ``rid`` ended (decoded or rejected): one step of the bar, once."""
        if self.progress is not None and rid not in self._done_requests:
            self._done_requests.add(rid)
            self.progress.update(1)

    def _done(self, name: str) -> None:
        if self.after_event is not None:
            self.after_event(name)
        self.during = ""

    def lookup(self, request, t, hit_checkpoint, hit_tokens, input_tokens) -> None:
        self.during = f"request {request.request_id}'s lookup"
        self.last_lookup = (request.request_id, int(input_tokens))
        for r in self.replayers:
            r.lookup(request.request_id, hit_checkpoint, hit_tokens)
        if self.stepper is not None:
            self.stepper.lookup(request.request_id, *self.replayer.restored(request.request_id))
        rec = self.replayer.records.get(request.request_id)  # its lookups counted there
        if rec is not None and rec.lookups > 1:
            self.looked_up_again += 1
            if self.progress is not None and hasattr(self.progress, "set_postfix_str"):
                self.progress.set_postfix_str(f"{self.looked_up_again:,} lookups again (preempted)", refresh=False)
        self._done("lookup")

    def prefill(self, request, t_start, t_end, start_pos, end_pos, seconds) -> None:
        self.during = f"request {request.request_id}'s prefill"
        for r in self.replayers:
            r.prefill(request.request_id, start_pos, end_pos)
        self._done("prefill")

    def decode(self, request, t_start, t_end, start_pos, end_pos, seconds) -> None:
        self.during = f"request {request.request_id}'s decode"
        for r in self.replayers:
            r.decode(request.request_id)
        if self.stepper is not None:
            self.stepper.done(request.request_id)
        self._finished(request.request_id)
        self._done("decode")

    def step(self, t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted) -> None:
        self.during = f"a step of {int(tokens):,} tokens"
        if self.stepper is not None:
            self.stepper.step(t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted)
        self._done("step")

    def admit(self, t, checkpoint, request, position, phase) -> None:
        self.during = f"request {request.request_id}'s admission of a state"
        for r in self.replayers:
            r.admit(checkpoint, request.request_id, position, phase)
        self._done("admit")

    def evict(self, t, checkpoint, position) -> None:
        self.during = "an eviction"
        for r in self.replayers:
            r.evict(checkpoint)
        self._done("evict")

    def reject(self, request, t, reason) -> None:
        self.during = f"request {request.request_id}'s rejection"
        for r in self.replayers:
            r.reject(request.request_id)
        self._finished(request.request_id)
        self._done("reject")
