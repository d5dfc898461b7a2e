"""One replay run in three steps (``sim.replay.session.run_replay`` calls them once its settings
are checked). Needs torch.

1. ``build``: the replayed model (gated-delta or Mamba2 layers, attention, MLPs), its checkpoint
   store, the requests' tokens, the timing the measurements are compared with, and the replay's
   collaborators: the ``Replayer`` (with its hit checks and, ``--batch`` > 1, its batched replay),
   the fp32 shadow replayers (``--validate shadow``), the step executor (``--scheduler
   continuous``). Nothing runs yet (but the warm-up).
2. ``execute``: the simulation built by the assembly point with the replay observer attached;
   its event stream drives the replayers and the step executor; what they recorded is collected
   (``Executed``).
3. ``summarize``: the request table (and the step table), the typed ``ReplaySummary`` and the
   run's settings record.
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch

from sim.config import SimConfig
from sim.cost import ModelSpec, TimingModel, timing_to_dict
from sim.replay import measure
from sim.replay.batched import HELD_BYTES
from sim.replay.calibration import NOT_COMPARED, replay_timing
from sim.replay.flops import mamba2_linear
from sim.replay.model import DTYPES, HybridModel, ReplayShape
from sim.replay.observer import ReplayObserver
from sim.replay.records import AT_REQUEST, HELD_AT
from sim.replay.runner import Replayer
from sim.replay.store import PAGE_TOKENS, CheckpointStore, pool_pages_for
from sim.replay.summary import ReplaySummary, labelled
from sim.replay.warm import warm
from traces.base import Trace


@dataclass
class Parts:
    """What ``build`` makes: the model and its shape, the store, the timing and its note, the
    replayer with its shadows and the step executor (None: not continuous)."""

    spec: ModelSpec
    shape: ReplayShape
    model: HybridModel
    mamba2: bool  # its linear layers are Mamba2 layers
    store: CheckpointStore
    timing: TimingModel
    timing_note: str
    replayer: Replayer
    shadows: tuple
    stepper: object
    warm_s: float

    @property
    def counts(self) -> dict:
        """Replayed layers by type (``ReplayShape.counts``: the linear layers as gated delta)."""
        return self.shape.counts()


@dataclass
class Executed:
    """What ``execute`` collected: the simulation's result, the request records (and the fp32
    shadow's), every failure, the executed steps, the wall time of the run."""

    sim_result: object
    records: list
    shadow_records: Optional[list]
    failures: list
    executed_steps: Optional[list]
    wall_s: float


def call_bytes_per_token(shape: ReplayShape, dtype) -> int:
    """A rough upper figure of the device bytes one token of a prefill call needs at once: its KV,
    the fp32 residual stream (in, out, normed), the gated-delta projection and conv output, the
    core's fp32 output path and kernel scratch (4 fp32 copies of the values), the MLP's
    activations (the call's other tensors are per layer and freed)."""
    elt = torch.empty((), dtype=dtype).element_size()
    s = shape
    gdn = elt * (s.proj_dim + s.conv_dim) + 16 * s.value_dim if s.layers else 0
    return s.kv_bytes_per_token(dtype) + 12 * s.hidden + gdn + 3 * elt * s.mlp_inter


def memory_warning(
    shape: ReplayShape, dtype, store_bytes: int, queued_bytes: int, longest: int, free: int, running_bytes: int = 0
) -> str:
    """One line when what replay plans to hold on the GPU exceeds what is free there (after the
    weights): the store up to the simulator's capacity (``store_bytes``), the batched queues'
    budget (``queued_bytes``), under continuous batching the running requests' (``running_bytes``:
    the step executor's peak and the open flights' bound) and the longest request's from-scratch
    call (``longest`` tokens, ``call_bytes_per_token``) with one layer of its check's suffix outputs
    (fp32 rows of the whole request: a check holds as many layers as fit, ``output_room``); empty
    when it fits."""
    call = longest * (call_bytes_per_token(shape, dtype) + shape.hidden * 4)
    planned = store_bytes + queued_bytes + running_bytes + call
    if planned <= free:
        return ""
    gb = 1e9
    running = f", running requests {running_bytes / gb:.1f} GB" if running_bytes else ""
    return (
        f"warning: replay may run out of GPU memory: {planned / gb:.1f} GB planned (store up to "
        f"{store_bytes / gb:.1f} GB, batch queues {queued_bytes / gb:.1f} GB{running}, the longest request's "
        f"call and check ~{call / gb:.1f} GB at {longest} tokens), {free / gb:.1f} GB free: lower --capacity or "
        "--requests, or use --store host"
    )


#: device bytes a hit's check leaves free beside one call of its tokens (``call_bytes_per_token``)
#: and the suffix outputs it holds: the allocator's fragmentation, what the figure leaves out
CHECK_MARGIN = 2 << 30


def output_room(shape: ReplayShape, dtype, device):
    """``HitChecker``'s ``output_bytes`` on a GPU, asked per check of ``tokens`` tokens: what is
    free there (``free_for_replay``) less one call of those tokens and ``CHECK_MARGIN``. A long
    prompt's suffix outputs (every layer's fp32 rows: 40 GB for marconi-7b's 87K-token Mooncake
    request) that do not fit are compared in groups of layers, each run again untimed, rather than
    run out of memory."""
    per = call_bytes_per_token(shape, dtype)

    def room(tokens: int) -> int:
        return max(1, free_for_replay(device) - tokens * per - CHECK_MARGIN)

    return room


def check_bound(settings, shape: ReplayShape, dtype, device):
    """``HitChecker``'s ``output_bytes``: ``--check-memory`` where given, else ``output_room`` on a
    GPU and no bound on a CPU."""
    if settings.check_memory is not None:
        return max(1, int(settings.check_memory * 1e9))
    return output_room(shape, dtype, device) if device.type == "cuda" else None


def free_for_replay(device) -> int:
    """Bytes the replay can still take on ``device``: the driver's free memory and what torch's
    caching allocator holds reserved but unused (an earlier run in the same process, e.g.
    replay_bench's fit runs before its held-out ones, leaves tens of GB there)."""
    return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


STATE_BOUNDARY = 64  # admission places states on 64-token boundaries, at a request's branch point and its last token


def produced_bytes(lengths, shape: ReplayShape, dtype) -> int:
    """What a store could ever hold of a trace whose requests are ``lengths`` tokens long (input
    and output): every token's KV and, per request, a state at every ``STATE_BOUNDARY`` plus its
    branch point and last token. The store's plan is the lower of this and the capacity: a run
    with ``--capacity inf`` plans what its trace can fill, not the sentinel's 4.6e9 GB."""
    kv, state = shape.kv_bytes_per_token(dtype), shape.state_bytes(dtype)
    return sum(n * kv + (n // STATE_BOUNDARY + 2) * state for n in lengths)


def request_lengths(trace: Trace) -> dict:
    """Each request's prompt and response tokens, by request id, in the trace's order."""
    bt = trace.block_tokens
    return {r.request_id: r.n_input_tokens(bt) + r.n_output_tokens(bt) for r in trace.requests}


#: device bytes the per-request replay's open flights may hold under continuous batching (their
#: restored and running states with their KV, ``Replayer(max_open_bytes=)``) before the oldest give
#: theirs back (parked: restored again at their prefill; dropped: recomputed, untimed)
FLIGHT_BYTES = 8 << 30


class StorePeak:
    """An engine observer: the most the replay's store holds over a simulation, at the replay's
    shape and dtype (``shape``). The tree's KV tokens and states (``occupancy``, sent after every
    insert) at their most, each priced as the store holds them: its pools never shrink (its peak
    is its most slots and its most pages, ``CheckpointStore.peak_bytes``), and each checkpoint's
    prefix ends in a page of its own, up to ``PAGE_TOKENS`` - 1 tokens more than the tree counts.
    A replay of fewer layers holds less than the preset's bytes the capacity counts."""

    def __init__(self, spec: ModelSpec, shape: ReplayShape, dtype) -> None:
        self.kv_unit, self.state_unit = spec.kv_bytes_per_token(), spec.state_bytes()
        self.kv, self.state = shape.kv_bytes_per_token(dtype), shape.state_bytes(dtype)
        self.peak_tokens = self.peak_states = 0

    def occupancy(self, t: float, kv_bytes: int, state_bytes: int) -> None:
        if self.kv_unit:
            self.peak_tokens = max(self.peak_tokens, kv_bytes // self.kv_unit)
        if self.state_unit:
            self.peak_states = max(self.peak_states, state_bytes // self.state_unit)

    @property
    def peak_bytes(self) -> int:
        per_state = self.state + (PAGE_TOKENS - 1) * self.kv
        return self.peak_tokens * self.kv + self.peak_states * per_state

    @property
    def device_bytes(self) -> int:
        """``peak_bytes`` with the KV pages as the pool allocates them (``pool_pages_for``: it
        grows by chunks of up to ``POOL_CHUNK_BYTES``, so it holds up to a chunk more): what the
        store has allocated on the device at the end (``CheckpointStore.device_bytes``)."""
        if not self.kv:
            return self.peak_bytes
        pages = -(-(self.peak_tokens + self.peak_states * (PAGE_TOKENS - 1)) // PAGE_TOKENS)
        page = PAGE_TOKENS * self.kv
        return self.peak_states * self.state + pool_pages_for(pages, page) * page


@dataclass
class SimulatedPlan:
    """``simulated_plan``: the store's peak (``StorePeak``) and, under continuous batching, what the
    running requests hold beside it (the step executor's peak and the open flights' bound; 0
    otherwise)."""

    store_bytes: int
    running_bytes: int


def simulated_plan(
    trace: Trace, config: SimConfig, settings, spec: ModelSpec, shape, dtype, *, simulate, timing
) -> SimulatedPlan:
    """The memory plan's figures from one simulation of the replay's events, without the model
    (``simulate``: the assembly's ``build``; ``timing``: the replay's, so the events are the
    replay's): ``StorePeak`` and, under continuous batching, ``sim.replay.stepper.StepSizer`` (the
    executor's bookkeeping on the events alone) plus ``FLIGHT_BYTES``."""
    from sim.engine.drivers import run as run_simulation
    from sim.replay.stepper import StepSizer, slot_bytes

    store = StorePeak(spec, shape, dtype)
    observers: list = [store]
    sizer = None
    if config.effective_scheduler == "continuous":
        sizer = StepSizer(
            request_lengths(trace).__getitem__,
            shape.kv_bytes_per_token(dtype),
            slot_bytes(shape, dtype),
            coast_steps=settings.coast_steps,
        )
        observers.append(sizer)
    run_simulation(simulate(trace, config, timing=timing, observers=tuple(observers)))
    return SimulatedPlan(store.device_bytes, sizer.peak_bytes + FLIGHT_BYTES if sizer is not None else 0)


def planned_memory_note(
    trace: Trace,
    config: SimConfig,
    settings,
    n_shadows: int,
    shape,
    dtype,
    free: int,
    simulated: Optional[SimulatedPlan] = None,
) -> str:
    """``memory_warning`` for a replay of ``trace``: the store's capacity on the GPU, or what the
    trace can fill (``produced_bytes``) where that is less, or where a simulation was run what it
    shows the store allocating (``simulated.store_bytes``) (once per store there: the replayer's with
    ``--store gpu``, each shadow's), the batch queues' budget when batched, the running requests'
    bytes (``simulated.running_bytes``), the longest request (input and output tokens)."""
    lengths = list(request_lengths(trace).values())
    per_store = min(config.capacity_bytes, produced_bytes(lengths, shape, dtype))
    running = 0
    if simulated is not None:
        # the simulation keeps the capacity; its figure is the store's allocation at the replay's
        # shape, past the capacity by the pages' and the pool's rounding (marconi-7b at 10 GB:
        # 11.3 GB), so it is not capped by it
        per_store = simulated.store_bytes
        running = simulated.running_bytes
    on_gpu = per_store * ((settings.store == "gpu") + n_shadows)
    longest = max(lengths, default=0)
    return memory_warning(shape, dtype, on_gpu, HELD_BYTES if settings.batch > 1 else 0, longest, free, running)


def flight_bound(continuous: bool, device) -> Optional[int]:
    """``Replayer(max_open_bytes=)``: ``FLIGHT_BYTES`` under continuous batching on a GPU (every
    running request's flight is open there), else no bound (``max_open`` bounds the count)."""
    return FLIGHT_BYTES if continuous and device.type == "cuda" else None


def plan_note(
    trace: Trace, config: SimConfig, settings, n_shadows: int, spec, shape, dtype, *, free: int, simulate, timing
) -> str:
    """The memory plan's line for a replay with ``free`` bytes to take (``planned_memory_note``),
    with a simulation's figures (``simulated_plan``) where ``simulate`` (the assembly's ``build``)
    is given."""
    simulated = None
    if simulate is not None:
        simulated = simulated_plan(trace, config, settings, spec, shape, dtype, simulate=simulate, timing=timing)
    return planned_memory_note(trace, config, settings, n_shadows, shape, dtype, free, simulated)


def build(
    trace: Trace,
    config: SimConfig,
    settings,
    spec: ModelSpec,
    layers: int,
    kernel: str,
    device,
    *,
    timing,
    vocab_rows: int,
    tokens_of,
    simulate=None,
) -> Parts:
    """Step 1 (module docstring). ``tokens_of(request) -> (prompt + response ids, prompt
    length)``; ``vocab_rows``: the embedding's rows; ``simulate``: the assembly's ``build``, for
    the memory plan of a replay on a GPU (``simulated_plan``)."""
    dtype = DTYPES[settings.dtype]
    mamba2 = mamba2_linear(spec)
    if mamba2:
        # Mamba2 layers in the linear layers' place (sim/replay/mamba2.py: their sizes ride in
        # the shape's gated-delta fields, so the store and the restores need nothing else)
        from sim.replay.mamba2 import Mamba2Model, replay_shape

        shape, model_cls = replay_shape(spec, layers, vocab_rows=vocab_rows), Mamba2Model
    else:
        shape, model_cls = ReplayShape.from_spec(spec, layers, vocab_rows=vocab_rows), HybridModel
    model = model_cls(
        shape,
        device=device,
        dtype=dtype,
        seed=settings.seed,
        kernel=kernel,
        attention=settings.attention,
        elementwise=settings.elementwise,
    )
    longest_prompt = max((r.n_input_tokens(trace.block_tokens) for r in trace.requests), default=0)
    # the timing the measurements are compared with (after the model: its kernel's checks first)
    timing, timing_note = replay_timing(
        timing,
        spec,
        settings.dtype,
        device.type,
        torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        longest_prompt,
        sum(shape.counts().values()),  # a replayed call's layer calls: the host term's depth
        model.attention,  # how the model runs its prefills' attention (sim.replay.model.attend)
        model.elementwise,  # and its norms, gates and activations
    )
    store = CheckpointStore(shape, dtype, where=settings.store, device=device)
    continuous = config.effective_scheduler == "continuous"
    replayer = Replayer(
        model,
        store,
        tokens_of,
        validate_every=settings.validate_every,
        tolerance=settings.tolerance,
        validate=settings.validation,
        measure=settings.measure,
        batch=settings.batch,
        batch_tokens=settings.batch_tokens,
        alternate=settings.saved_timing == "alternate",
        output_bytes=check_bound(settings, shape, dtype, device),
        # every running request's flight stays open until it ends (a batch runs up to
        # --max-num-seqs of them at once), up to FLIGHT_BYTES of them on a GPU
        max_open=max(16, config.max_num_seqs + 8) if continuous else 16,
        max_open_bytes=flight_bound(continuous, device),
    )
    stepper = None
    if continuous:
        from sim.replay.stepper import StepExecutor

        stepper = StepExecutor(
            model,
            tokens_of,
            coast_steps=settings.coast_steps,
            check_steps=settings.check_steps,
            tolerance=replayer.tolerance,
            measure=settings.measure,
        )
    shadows = ()
    if settings.validation == "shadow":
        # the same event stream replayed by the same weights in fp32 arithmetic, untimed, every
        # validated hit checked at fp32 tolerance: what bf16 rounding hides from the main check
        shadow_model = model.upcast(torch.float32)
        shadow_store = CheckpointStore(shape, torch.float32, where="gpu", device=device)
        shadows = (
            Replayer(
                shadow_model,
                shadow_store,
                tokens_of,
                validate_every=settings.validate_every,
                validate="tolerance",
                batch=settings.batch,
                batch_tokens=settings.batch_tokens,
                output_bytes=check_bound(settings, shape, torch.float32, device),
            ),
        )
    if device.type == "cuda":
        # what an earlier run in this process left in torch's cache goes back to the driver: the
        # plan counts it as free (free_for_replay), but a long call takes a cached block only where
        # one is large enough (replay_bench's fit runs leave ~30 GB there)
        gc.collect()
        torch.cuda.empty_cache()
        note = plan_note(
            trace,
            config,
            settings,
            len(shadows),
            spec,
            shape,
            dtype,
            free=free_for_replay(device),
            simulate=simulate,
            timing=timing,
        )
        if note:
            print(note, file=sys.stderr)
    warm_s = 0.0
    if settings.warmup and device.type == "cuda":
        # and the memory of a from-scratch call of the longest prompt reserved (warm.presize)
        warm_s = warm(model, device, steps=continuous, batches=settings.batch > 1, longest_prompt=longest_prompt)
    return Parts(spec, shape, model, mamba2, store, timing, timing_note, replayer, shadows, stepper, warm_s)


#: reserved but unallocated bytes of torch's cache at an out-of-memory error past which the line
#: names fragmentation and the allocator setting that avoids it
FRAGMENTED_BYTES = 1 << 30


def memory_at_failure(parts: Parts, during: str) -> str:
    """What the replay held on its device when a run failed, for the out-of-memory line: the
    event it was handling (``during``: "" after the stream, in the last requests' work), the
    stores on the device (``CheckpointStore.device_bytes``: the replayer's and the shadows'), the
    running requests' KV buffers and state pool (the step executor's), the open flights
    (``Replayer.open_bytes``) and, on a GPU, what torch's allocator had allocated and reserved
    (with ``FRAGMENTED_BYTES`` or more reserved unallocated, the setting that avoids that): the
    plan (``memory_warning``) set beside what was there."""
    gb = 1e9
    replayers = (parts.replayer, *parts.shadows)
    store = sum(r.store.device_bytes for r in replayers)
    parts_held = [f"store {store / gb:.1f} GB"]
    if parts.stepper is not None:
        running = parts.stepper.kv_bytes + parts.stepper.pool_bytes
        parts_held.append(f"running requests {running / gb:.1f} GB")
    parts_held.append(f"open flights {sum(r.open_bytes() for r in replayers) / gb:.1f} GB")
    device = parts.model.device
    if device.type == "cuda":
        allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        parts_held.append(f"torch allocated {allocated / gb:.1f} GB, reserved {reserved / gb:.1f} GB")
        if reserved - allocated >= FRAGMENTED_BYTES:
            # torch's cache held that much in blocks too small for the allocation (torch says so in
            # the part of its message the one line leaves out)
            parts_held.append(
                f"{(reserved - allocated) / gb:.1f} GB of it cached in pieces: "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may help"
            )
    what = during or "the last requests' work"
    return f"during {what}; " + ", ".join(parts_held)


def execute(
    parts: Parts, trace: Trace, config: SimConfig, *, build, progress=None, after_event=None, on_ready=None
) -> Executed:
    """Step 2 (module docstring). ``build``: the assembly point's ``sim.simulate.build``;
    ``after_event(name, simulation, replayer)`` and ``on_ready(replayer)``: the tests' hooks."""
    from sim.engine.drivers import run as run_simulation

    replayer, shadows, stepper = parts.replayer, parts.shadows, parts.stepper
    built = []  # the Simulation, for the tests' hook (it exists once events flow)
    hook = (lambda name: after_event(name, built[0], replayer)) if after_event is not None else None
    obs = ReplayObserver(
        replayer, mode=config.mode, progress=progress, after_event=hook, shadows=shadows, stepper=stepper
    )
    sim = build(trace, config, timing=parts.timing, observers=(obs,))
    built.append(sim)
    if on_ready is not None:
        on_ready(replayer)
    t0 = time.perf_counter()
    try:
        sim_result = run_simulation(sim)
        records = replayer.finish()
    except RuntimeError as exc:  # out of memory above all: where the run was, for the one line said of it
        if obs.last_lookup is not None:
            rid, n = obs.last_lookup
            exc.add_note(f"{AT_REQUEST}{rid} ({n:,} prompt tokens)")
        exc.add_note(HELD_AT + memory_at_failure(parts, obs.during))
        raise
    failures = list(replayer.failures)
    shadow_records = None
    for sh in shadows:
        shadow_records = sh.finish()
        failures += [replace(f, kind="shadow-" + f.kind) for f in sh.failures]
    executed = stepper.close() if stepper is not None else None
    if stepper is not None:
        failures += stepper.failures
    if parts.model.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return Executed(sim_result, records, shadow_records, failures, executed, wall)


def summarize(parts: Parts, run: Executed, trace: Trace, config: SimConfig, settings, layers: int) -> tuple:
    """Step 3 (module docstring): ``(ReplaySummary, request table, settings record, step table
    or None)``."""
    spec, shape, model, store, replayer = parts.spec, parts.shape, parts.model, parts.store, parts.replayer
    counts, timing, device = parts.counts, parts.timing, model.device
    table = measure.request_table(run.records, spec, timing, counts, shadow=run.shadow_records)
    figures = measure.summary(
        table,
        failures=run.failures,
        store_peak_bytes=store.peak_bytes,
        wall_s=run.wall_s,
        late_admits=replayer.late_admits,
        counts=counts,
        spec=spec,
        kv_hits_validated=replayer.kv_hits_validated,
    )
    for key in ("layers_replayed", "measured_ms_by_layer_type", "measured_model_ms_by_layer_type"):
        if key in figures:
            figures[key] = labelled(figures[key], parts.mamba2)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    batch_figures = None
    if settings.batch > 1:
        batch_figures = measure.batch_summary(
            replayer.batch_log,
            spec,
            counts,
            wall_s=run.wall_s,
            peak_tflops=measure.device_peak(dev_name, settings.dtype),
            flushes=replayer.batch_flushes,
        )
    step_rows = step_figures = None
    if parts.stepper is not None:
        from sim.replay import steps as step_rows_of

        step_rows = step_rows_of.step_table(run.executed_steps, spec, timing, counts)
        step_figures = step_rows_of.step_summary(
            step_rows,
            counts=counts,
            wall_s=run.wall_s,
            peak_tflops=measure.device_peak(dev_name, settings.dtype),
            **parts.stepper.counts(),
        )
        for key in ("step_measured_ms_by_layer_type", "step_layers_replayed"):
            step_figures[key] = labelled(step_figures[key], parts.mamba2)
    summary = ReplaySummary(
        **figures,
        validation=settings.validation,
        time_model_note=parts.timing_note,
        time_model_compared=not parts.timing_note.startswith(NOT_COMPARED),
        kv_tokens_live=int(store.kv_tokens),
        store_device_bytes=int(store.device_bytes),
        mlp_moe_at_active_width=bool(shape.mlp_moe),
        warmup_s=parts.warm_s,
        simulated_hit_tokens=int(sum(r.hit_tokens for r in run.records)),
        flights_parked=replayer.parked,
        flights_dropped=replayer.dropped,
        recomputed_tokens=replayer.recomputed_tokens,
        aborted_requests=int(run.sim_result.summary.aborted_requests),
        kernel=model.kernel,
        measure=settings.measure if device.type == "cuda" else "wall",
        batch_figures=batch_figures,
        step_figures=step_figures,
    )
    info = dict(
        asdict(settings),
        layers=layers,
        layers_replayed=labelled(counts, parts.mamba2),
        kernel=model.kernel,
        kernel_requested=settings.kernel,
        attention=model.attention,  # what ran: cudnn only in bf16 / fp16 on a GPU
        attention_requested=settings.attention,
        elementwise=model.elementwise,  # what ran: fused only on a GPU
        elementwise_requested=settings.elementwise,
        # where the store ran: "gpu" on a CPU is the CPU's memory, as the table's header says ("store
        # cpu"); summary.json said "gpu" (the option's default)
        store=settings.store if device.type == "cuda" else "cpu",
        store_requested=settings.store,
        mlp_note=(  # none for a model without MLPs (a pure Mamba2 config): "dense MLP (0)" before
            ""
            if not shape.mlp_inter
            else f"MoE MLP replayed dense at its active width ({shape.mlp_inter})"
            if shape.mlp_moe
            else f"dense MLP ({shape.mlp_inter})"
        ),
        model=spec.name,
        policy=config.policy,
        capacity_bytes=config.capacity_bytes,
        state_alignment=config.state_alignment,
        mode=config.mode,
        scheduler=config.effective_scheduler,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        trace=trace.name,
        tolerance=replayer.tolerance,
        timing=timing_to_dict(timing),
        device_name=dev_name,
    )
    return summary, table, info, step_rows
