"""The summary of one replay run, typed (no torch): ``ReplaySummary``, whose ``to_dict()`` is
``summary.json``'s ``summary`` and what ``marconi replay --format json`` prints.

Its fields are the run's figures in the order ``to_dict()`` gives them: what replay checked and
measured per request (``sim.replay.measure.summary`` computes them from the request table), then
what the run was (validation mode, kernel, store, flights), then the figures of batched replay
(``batch_figures``: ``measure.batch_summary``) or of the step executor (``step_figures``:
``sim.replay.steps.step_summary``), then ``--calibrate``'s errors (``calibrated``). Dict-style
reads (``s["hits"]``, ``s.get``, ``s.keys()``) see ``to_dict()``, as ``RunSummary``'s do (the
same reads: ``sim.engine.metrics.SummaryReads``).

Layer types are keyed ``attention`` / ``gated_delta`` / ``mlp`` (``sim.cost.LAYER_KINDS``); a
model whose linear layers are Mamba2 layers (they ride in the gated-delta slot of the replayed
shape) has them keyed ``mamba2`` here (``labelled``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Optional

from sim.engine.metrics import SummaryReads

GDN, MAMBA2 = "gated_delta", "mamba2"

#: the fields left out of ``to_dict()`` when None (figures a run has only with some settings)
_OPTIONAL = dict(optional=True)
#: the groups ``to_dict()`` adds after the fields (their keys as they are)
_GROUPS = ("batch_figures", "step_figures", "calibrated")


def labelled(by_type: dict, mamba2: bool) -> dict:
    """``by_type`` (layer type -> value) with the linear layers keyed ``mamba2`` when they are
    Mamba2 layers (``gated_delta`` otherwise), the order kept."""
    if not mamba2:
        return dict(by_type)
    return {(MAMBA2 if k == GDN else k): v for k, v in by_type.items()}


def cost_counts(by_type: dict) -> dict:
    """Layer counts keyed as the cost model keys them (``mamba2`` back to ``gated_delta``: the
    linear layers' slot)."""
    return {(GDN if k == MAMBA2 else k): v for k, v in by_type.items()}


@dataclass(frozen=True, kw_only=True)
class ReplaySummary(SummaryReads):
    """One replay run's figures (module docstring). Times in ms unless the name says otherwise;
    errors are relative (fractions)."""

    # ---- the requests: what replay checked (sim.replay.measure.summary)
    requests: int
    input_tokens: int
    hits: int  # requests whose lookup hit (the simulator's claim)
    hit_tokens: int
    hits_validated: int  # hits whose numerical check ran
    kv_hits_validated: int  # ... with their restored KV checked too
    failures: int  # failed checks of every kind
    kv_failures: int
    max_restore_error: float  # the worst of the four below
    max_rec_error: float
    max_conv_error: float
    max_out_error: float
    max_kv_error: float
    # ---- ... and what it measured
    measured_ms_with_cache: float  # the timed suffix prefills
    measured_ms_without_cache: float  # the from-scratch prefills measured
    requests_full_measured: int
    measured_ms_saved_validated: float
    modelled_ms_saved_validated: float
    measured_flops_saved: float
    simulated_flops_saved: float
    # of measured - simulated, what the kernel's 64-token chunks pad (sim.replay.flops.padding_flops):
    # the rest is 0 on a correct replay
    padding_flops_saved: float
    replay_flops_executed: float
    replay_flops_simulated: float
    time_model_median_error: float
    time_model_p95_error: float
    time_model_p95_error_all: float  # host-bound prefills included
    host_bound_prefills: int
    # prefills whose first call's host issue outran the sleep queued ahead of it, run again and
    # timed the second time (sim.replay.measure.outran_sleep)
    retimed_prefills: int = 0
    # from-scratch references (the time saved's other half) timed again for the same reason
    retimed_references: int = 0
    # the timing prices host-bound prefills (a host term): time_model_median_error and
    # time_model_p95_error then count every prefill, and these two the device-bound ones
    time_model_host_term: bool
    time_model_median_error_device_bound: float
    time_model_p95_error_device_bound: float
    store_peak_bytes: int
    late_admits: int
    wall_s: float
    tokens_per_s: float
    splits: int
    hits_unvalidated: dict  # reason -> hits not validated
    # reason -> validated hits whose restored KV was not checked (no attention layer replayed):
    # kv_hits_validated + these = hits_validated
    kv_hits_unvalidated: dict = field(default_factory=dict)
    host_issue_ms: dict  # p50 / p95 / max of the host's issue time of a timed prefill
    restore_errors: dict  # kind -> p50 / p95 / max over validated hits
    integrity_checked: Optional[int] = field(default=None, metadata=_OPTIONAL)
    integrity_failures: Optional[int] = field(default=None, metadata=_OPTIONAL)
    # validated hits whose suffix outputs were compared in groups of layers (run again, untimed)
    outputs_grouped: Optional[int] = field(default=None, metadata=_OPTIONAL)
    shadow_hits_validated: Optional[int] = field(default=None, metadata=_OPTIONAL)  # --validate shadow
    shadow_failures: Optional[int] = field(default=None, metadata=_OPTIONAL)
    shadow_restore_errors: Optional[dict] = field(default=None, metadata=_OPTIONAL)
    layers_replayed: Optional[dict] = field(default=None, metadata=_OPTIONAL)  # layer type -> count
    measured_ms_by_layer_type: Optional[dict] = field(default=None, metadata=_OPTIONAL)
    measured_model_ms_by_layer_type: Optional[dict] = field(default=None, metadata=_OPTIONAL)
    replay_tflops_timed: Optional[float] = field(default=None, metadata=_OPTIONAL)
    replay_tflops_wall: Optional[float] = field(default=None, metadata=_OPTIONAL)
    # the time saved's error on the validated hits (modelled / measured - 1) and its 95 % bootstrap
    # interval over them, [error, low, high] (sim.replay.measure.saved_interval); None: no saving
    time_saved_interval: Optional[list] = field(default=None, metadata=_OPTIONAL)
    # the measured time saved's standard error from the alternated hits' two pairs, ms
    # (sim.replay.measure.saved_spread); None: no hit timed alternated
    time_saved_spread_ms: Optional[float] = field(default=None, metadata=_OPTIONAL)
    # ---- the run
    validation: str  # exact | shadow | tolerance
    time_model_note: str
    time_model_compared: bool
    kv_tokens_live: int  # KV tokens in the store at the end
    # what the store allocated on the device (its slots and its page pool, grown by chunks and
    # never shrunk: ``CheckpointStore.device_bytes``; 0 for --store host), what the plan counts
    store_device_bytes: int
    mlp_moe_at_active_width: bool
    warmup_s: float
    simulated_hit_tokens: int
    flights_parked: int  # flights past --max-open (sim.replay.runner.Replayer._hold)
    flights_dropped: int
    recomputed_tokens: int
    #: requests the engine preset aborted at arrival (a prompt longer than it takes: SGLang's
    #: input limit): never computed, so not among ``requests``
    aborted_requests: int
    kernel: str  # the gated-delta (or Mamba2) backend run
    measure: str  # device | wall
    # ---- the groups (``to_dict()`` adds their keys as they are, a key already there in place)
    batch_figures: Optional[dict] = None  # --batch > 1 (sim.replay.measure.batch_summary)
    step_figures: Optional[dict] = None  # --scheduler continuous (sim.replay.steps.step_summary)
    calibrated: dict = field(default_factory=dict)  # --calibrate's errors of the fitted timing

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            if f.name in _GROUPS:
                continue
            v = getattr(self, f.name)
            if v is None and f.metadata.get("optional"):
                continue
            out[f.name] = v
        for name in _GROUPS:
            group = getattr(self, name)
            if group:
                out.update(group)
        return out

    def with_calibration(self, **errors) -> "ReplaySummary":
        """This summary with ``--calibrate``'s errors added (after any added before)."""
        return replace(self, calibrated={**self.calibrated, **errors})
