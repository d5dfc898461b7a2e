"""What replay did for each request (no torch: the measurement side reads these)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: the per-type time bucket (``model.Marks``) of a hit check's work inside a timed from-scratch
#: reference (``on_output``: each layer's outputs compared with the suffix's as they come); taken
#: out of the reference's time, which would otherwise hold it (session 26: ~13 ns a token and layer
#: at qwen3-next-80b-a3b's width on the H200, the measured time saved twice the skipped layers'
#: time on the Mooncake sample). Torch-free here: the tables read it without the model.
CHECK = "check"
#: how a validated hit's suffix prefill and from-scratch reference are timed (``--saved-timing``):
#: once each, or alternated (suffix, reference, reference, suffix; each the mean of its two)
SAVED_TIMINGS = ("once", "alternate")


#: the note an error of a replay's run carries (``sim.replay.pipeline.execute``), then the request
#: it had last looked up: "replay's last lookup: request 11 (87,571 prompt tokens)"
AT_REQUEST = "replay's last lookup: request "
#: and then what it held when it failed (``sim.replay.pipeline.memory_at_failure``): "replay's
#: memory at the failure: during a step of 8,192 tokens; store 10.2 GB, ..."
HELD_AT = "replay's memory at the failure: "


@dataclass
class RequestRecord:
    """What replay did for one request (one row of the per-request table)."""

    request: int
    input_tokens: int
    output_tokens: int
    hit_checkpoint: int = -1
    hit_tokens: int = 0  # the simulator's claim
    restored: bool = False  # a state was restored and the suffix ran from it
    validated: bool = False  # the numerical check ran
    failed: bool = False
    max_rec_error: float = 0.0
    max_conv_error: float = 0.0
    max_out_error: float = 0.0
    max_kv_error: float = 0.0
    kv_validated: bool = False  # the restored KV was checked too (attention layers replayed)
    integrity_checked: bool = False  # the restored bits were compared with the produced ones
    # the groups of layers the check compared the suffix's outputs in (1: all in the timed calls;
    # more: they would not fit HitChecker.output_bytes, the rest ran again untimed per group)
    output_groups: int = 1
    # a hit not validated: why ("validate-every": sampled out by --validate-every; "failed a
    # check": a failure is reported; "never checked": none of these, a replay bug)
    unvalidated: str = ""
    lookups: int = 1  # lookups of this request (a preempted request is looked up again)
    suffix_segments: list = field(default_factory=list)  # kernel calls [(start, end)] of the prefill
    full_segments: list = field(default_factory=list)  # of the from-scratch prefill, if run
    suffix_ms: float = float("nan")
    full_ms: float = float("nan")
    tail_ms: float = float("nan")
    suffix_host_ms: float = float("nan")  # the host's time to issue the timed prefill
    suffix_slack_ms: float = float("nan")  # its device end after the host's (Stopwatch.slack_ms)
    full_host_ms: float = float("nan")
    full_slack_ms: float = float("nan")
    # the GPU sleep asked ahead of each (Stopwatch.sleep_ms; 0 unqueued): the host issue it hid
    suffix_sleep_ms: float = float("nan")
    full_sleep_ms: float = float("nan")
    # the suffix prefill ran twice (its first call's host issue outran the sleep queued ahead of
    # it: sim.replay.measure.outran_sleep); suffix_* are the second call's, these the first's
    suffix_retimed: bool = False
    suffix_first_ms: float = float("nan")
    suffix_first_host_ms: float = float("nan")
    # the from-scratch reference ran twice for the same reason (HitChecker: its first call's host
    # issue outran its sleep); full_* are the second call's, these the first's
    full_retimed: bool = False
    full_first_ms: float = float("nan")
    full_first_host_ms: float = float("nan")
    # --saved-timing alternate: the hit's suffix prefill and reference each ran a second time after
    # the check (suffix, reference, reference, suffix); suffix_ms / full_ms and their per-type splits
    # are then the means of the two calls, these the second calls' own ms
    alternated: bool = False
    suffix_again_ms: float = float("nan")
    full_again_ms: float = float("nan")
    late_admits: int = 0
    suffix_ms_by_type: dict = field(default_factory=dict)  # layer type -> ms of the timed prefill
    full_ms_by_type: dict = field(default_factory=dict)

    def timed(
        self,
        *,
        suffix=None,
        full=None,
        suffix_by_type=None,
        full_by_type=None,
        tail_ms=None,
        first=None,
        full_first=None,
        suffix_sleep=None,
        full_sleep=None,
        again=None,
    ) -> None:
        """The resolved times of its timed calls (None: not timed): ``suffix`` and ``full`` as
        ``(ms, host ms, slack ms)``, the per-layer-type splits, the tail's ms; ``first`` /
        ``full_first``: a re-timed suffix prefill's / reference's first call as ``(ms, host ms)``;
        ``suffix_sleep`` / ``full_sleep``: the GPU sleep asked ahead of the kept call (ms);
        ``again``: the alternated second calls' ``(suffix ms, reference ms)`` (``suffix`` / ``full`` and
        the splits are then already the means)."""
        if suffix is not None:
            self.suffix_ms, self.suffix_host_ms, self.suffix_slack_ms = suffix
        if first is not None:
            self.suffix_retimed = True
            self.suffix_first_ms, self.suffix_first_host_ms = first
        if full is not None:
            self.full_ms, self.full_host_ms, self.full_slack_ms = full
        if full_first is not None:
            self.full_retimed = True
            self.full_first_ms, self.full_first_host_ms = full_first
        if suffix_by_type is not None:
            self.suffix_ms_by_type = suffix_by_type
        if full_by_type is not None:
            self.full_ms_by_type = full_by_type
        if tail_ms is not None:
            self.tail_ms = tail_ms
        if suffix_sleep is not None:
            self.suffix_sleep_ms = suffix_sleep
        if full_sleep is not None:
            self.full_sleep_ms = full_sleep
        if again is not None:
            self.alternated = True
            self.suffix_again_ms, self.full_again_ms = again

    def judged(self, rec: float, conv: float, out: float, kv: float, kv_checked: bool) -> None:
        """Its hit's numerical check ran: the worst relative errors of each kind."""
        self.max_rec_error, self.max_conv_error, self.max_out_error = rec, conv, out
        self.max_kv_error = kv
        if kv_checked:
            self.kv_validated = True

    def again(self, earlier: "RequestRecord") -> None:
        """A new lookup of the request (after a preemption): this record is this run's; the
        earlier runs' failures and late admits stay counted."""
        self.failed = earlier.failed
        self.late_admits = earlier.late_admits
        self.lookups = earlier.lookups + 1

    def close(self) -> None:
        """Why its hit was not checked, once replay has finished (a reason for every one)."""
        if self.hit_tokens > 0 and not self.validated:
            self.unvalidated = "failed a check" if self.failed else (self.unvalidated or "never checked")
        elif self.validated:
            self.unvalidated = ""
