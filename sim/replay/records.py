"""What replay did for each request (no torch: the measurement side reads these)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    late_admits: int = 0
    suffix_ms_by_type: dict = field(default_factory=dict)  # layer type -> ms of the timed prefill
    full_ms_by_type: dict = field(default_factory=dict)
    _suffix_h: object = None
    _full_h: object = None
    _tail_h: list = field(default_factory=list)
    _suffix_marks: object = None
    _full_marks: object = None
