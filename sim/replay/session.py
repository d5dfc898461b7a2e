"""One replay run: simulate a trace with the replay observer attached, then measure.

``run_replay`` is what ``marconi replay`` and the benchmark call. torch is imported here, inside
functions, so that importing this module (the CLI does, to show ``--help``) needs no torch.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Optional

import numpy as np

from policies.base import find_preset
from sim.config import SimConfig, refuse_bad_choices, setting
from sim.cost import ModelSpec, TimingModel, get_model, timing_to_dict
from sim.errors import UsageError
from sim.replay import measure
from sim.replay.backends import CPU_SMALL_D_MODEL, GDN_BACKENDS, device_problem, kernel_choices, resolve_kernel
from sim.replay.tokens import request_tokens
from traces.base import Trace

VOCAB_ROWS = 1 << 16  # embedding rows of the replayed model (token ids index it modulo this)


@dataclass
class ReplaySettings:
    """A replay's own settings; each field's default and help are written here once and `marconi
    replay` generates its options from them (sim/cli/replay.py lists which, in their order)."""

    layers: Optional[int] = setting(  # None: all gated-delta layers of the preset
        None,
        "Mixer layers to replay, subsampled evenly per type (attention / gated delta), each with "
        "its MLP; times are scaled to the model [default: the preset's full depth].",
        type=int,
    )
    validate_every: int = setting(1, "Numerically check every k-th hit (the prefix-hash check runs on every hit).")
    store: str = setting("gpu", "Checkpoint store on the GPU or in pinned host memory.", choices=("gpu", "host"))
    dtype: str = setting(  # the CLI's default is by device: fp32 on a CPU
        "bf16", "Activations and weights [default: bf16 on cuda, fp32 on cpu].", choices=("bf16", "fp16", "fp32")
    )
    device: str = setting(
        "cuda",
        "cpu runs the gated-delta layers in plain torch by default (small presets in practice).",
        choices=("cuda", "cpu"),
    )
    requests: Optional[int] = setting(None, "Replay the first N requests.", type=int)
    seed: int = setting(0, "Weights and hash-block tokens.")
    tolerance: Optional[float] = setting(  # None: by dtype (sim.replay.checks.TOLERANCE)
        None, "Relative error allowed in states and outputs [default: by dtype, see sim.replay.checks].", type=float
    )
    warmup: bool = True
    validation: str = setting(  # sim.replay.checks
        "exact",
        "exact: every restored state, conv window and KV page bit for bit against what the kernels "
        "produced, then the numerics check; shadow: also an fp32 replay of the same stream checked at "
        "fp32 tolerance (slower); tolerance: the numerics check alone (docs/replay.md).",
        choices=("exact", "shadow", "tolerance"),
        flag="--validate",
    )
    kernel: str = setting(  # gated-delta backend (sim.replay.backends); auto: by device
        "auto",
        "Gated-delta backend: triton or ours (the project's kernels; the interpreter on a CPU), torch "
        "(the same math in plain torch ops), fla / flashqla (FLA's / FlashQLA's kernels where installed, "
        "CUDA only; boundary states by split calls: docs/replay.md); auto: triton on cuda, torch on cpu.",
        choices=kernel_choices(),
    )
    measure: str = setting(  # sim.replay.clock.Stopwatch
        "device",
        "How a GPU times prefills: device queues each timed call behind a GPU sleep as long as the "
        "host's issue time, so its events time the kernels back to back (the model's time); wall times "
        "it as issued to an idle GPU (short calls then time this harness's Python). Both record the "
        "host's issue time.",
        choices=("device", "wall"),
    )
    # --scheduler continuous (sim.replay.stepper): steps timed per coasted decode run (the rest
    # computed untimed), and first steps cross-checked against per-sequence forwards
    coast_steps: int = setting(
        4,
        "--scheduler continuous: steps executed and timed of each coasted run of identical decode "
        "steps (the rest are computed untimed, in one batch).",
    )
    check_steps: int = 2
    # batched replay (sim.replay.runner): requests per batched call (1: each request alone,
    # timed one by one) and tokens per batched call
    batch: int = setting(
        1,
        "--mode sequential: run up to this many requests as one varlen batch (a hit on a state a "
        "queued request produces runs the queue first) and check the hits against batched "
        "from-scratch prefills; every hit is still checked, but requests are not timed one by one "
        "(the batches are: replay's throughput). 1: each request alone, timed (TTFT, --calibrate).",
    )
    batch_tokens: int = setting(16384, "--batch > 1: tokens per batched call (queued suffixes, or reference prefills).")

    def validate(self) -> None:
        if self.validate_every < 1:
            raise UsageError("--validate-every must be >= 1")
        # --store, --dtype, --device, --validate, --measure: their choices (--kernel's below)
        refuse_bad_choices(self, [f for f in fields(self) if f.name != "kernel"])
        if self.layers is not None and self.layers < 1:
            raise UsageError("--layers must be >= 1")
        if self.requests is not None and self.requests < 1:
            raise UsageError("--requests must be >= 1")
        if self.tolerance is not None and not 0 < self.tolerance < float("inf"):  # NaN fails both
            raise UsageError(f"--tolerance must be a finite number > 0, not {self.tolerance}")
        if self.coast_steps < 1:
            raise UsageError(f"--coast-steps must be >= 1, not {self.coast_steps}")
        if self.batch < 1:
            raise UsageError(f"--batch must be >= 1, not {self.batch}")
        if self.batch_tokens < 1:
            raise UsageError(f"--batch-tokens must be >= 1, not {self.batch_tokens}")
        if self.check_steps < 0:
            raise UsageError(f"--check-steps must be >= 0, not {self.check_steps}")
        if self.kernel not in kernel_choices():
            raise UsageError(f"--kernel must be one of {', '.join(kernel_choices())}, not {self.kernel!r}")
        problem = device_problem(self.kernel, self.device)
        if problem:
            raise UsageError(problem)
        if self.device == "cpu" and self.dtype == "bf16" and GDN_BACKENDS[self.backend].triton:
            raise UsageError(
                f"--device cpu --kernel {self.kernel} --dtype bf16: the Triton interpreter computes bf16 "
                "matrix products wrongly (triton-lang/triton#11584); use --dtype fp32 or fp16, or --kernel torch"
            )

    @property
    def backend(self) -> str:
        """The gated-delta backend these settings run (``kernel`` with auto resolved)."""
        return resolve_kernel(self.kernel, self.device)


@dataclass
class ReplayResult:
    summary: dict
    requests: object  # pandas DataFrame, one row per request
    failures: list
    settings: dict
    sim_result: object = None
    timing: Optional[TimingModel] = None
    calibrated: Optional[TimingModel] = None
    calibration: dict = field(default_factory=dict)
    steps: object = None  # pandas DataFrame, one row per executed step (--scheduler continuous)


def check_model(spec: ModelSpec, layers: Optional[int]) -> int:
    """The number of mixer layers (attention + gated delta or Mamba2) to replay; a preset with
    neither gated-delta nor Mamba2 layers is refused."""
    mamba2 = not spec.n_gdn and spec.n_mamba and spec.mamba_version == 2
    if spec.n_gdn == 0 and not mamba2:
        kind = "Mamba1" if spec.n_mamba else "attention-only"
        raise UsageError(
            f"model {spec.name} has no gated-delta or Mamba2 layers ({kind}): replay runs the "
            "gated-delta and Mamba2 kernels only; pick a qwen3.5-* / qwen3-next-* / marconi-7b "
            "preset or replay-tiny"
        )
    linear = spec.n_mamba if mamba2 else spec.n_gdn
    total = linear + spec.n_attn
    n = total if layers is None else layers
    if n > total:
        raise UsageError(
            f"--layers {n} is more than {spec.name}'s {total} layers "
            f"({spec.n_attn} attention + {linear} {'Mamba2' if mamba2 else 'gated-delta'})"
        )
    return n


def check_batch(settings: ReplaySettings, config: SimConfig, calibrating: bool = False) -> None:
    """``--batch`` > 1 batches a sequential stream only (a request's admits after its decode), and
    times batches, so it cannot feed ``--calibrate`` (``calibrating``)."""
    if settings.batch == 1:
        return
    if config.mode != "sequential" or config.effective_scheduler == "continuous":
        raise UsageError(
            "--batch > 1 batches a sequential replay (--mode sequential): a DES stream's requests "
            "are timed as they run (use --batch 1)"
        )
    if calibrating:
        raise UsageError("--calibrate fits per-request times: use --batch 1 (a batched replay times batches)")


def first_requests(trace: Trace, n: Optional[int]) -> Trace:
    """The trace cut to its first ``n`` requests (whole trace when ``n`` is None)."""
    if n is None or n >= len(trace.requests):
        return trace
    return Trace(
        trace.name,
        trace.requests[:n],
        block_tokens=trace.block_tokens,
        closed_loop=trace.closed_loop,
        meta=dict(trace.meta, requests_cut=n),
    )


def token_source(trace: Trace, seed: int):
    """``tokens_of(request id) -> (prompt + response token ids, prompt length)``."""
    B = trace.block_tokens
    reqs = trace.requests

    def tokens_of(rid: int):
        r = reqs[rid]
        n_in, n_out = r.n_input_tokens(B), r.n_output_tokens(B)
        toks = request_tokens(
            r.input_tokens,
            r.output_tokens,
            block_tokens=B,
            input_len=n_in,
            output_len=n_out,
            seed=seed,
            vocab=VOCAB_ROWS,
        )
        return toks, n_in

    return tokens_of


def _warm_steps(model, boundaries: bool = False) -> None:
    """The step executor's batches: one varlen call per chunk-count bucket a step can reach (up
    to 256 chunks of a sequence: ``--max-num-batched-tokens`` 16K), each with a ragged chunk from
    a state, a sequence from scratch and decode tokens (untimed, thrown away). ``boundaries``:
    batched replay's calls too, which hand over boundary states and keep every layer's output."""
    import torch

    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        T = n * 64 - 10
        lens = [T, 70, 1, 1]
        starts = [10, 0, 5, 700]
        cu = [0]
        for L in lens:
            cu.append(cu[-1] + L)
        toks = torch.arange(cu[-1], device=model.device)
        model.forward_batch(toks, cu, starts, *_zero_batch(model, starts))
        if boundaries:
            model.forward_batch(
                toks,
                cu,
                starts,
                *_zero_batch(model, starts),
                keep_outputs=True,
                boundaries=[[], [64], [], []],
                on_state=lambda *a: None,
            )
    for N in (1, 16):  # decode-only steps (one token a sequence: total and count specialised)
        starts = [100] * N
        model.forward_batch(
            torch.arange(N, device=model.device), list(range(N + 1)), starts, *_zero_batch(model, starts)
        )


def _zero_batch(model, starts: list) -> tuple:
    """Zero recurrent states, conv windows and (with attention) KV of ``starts[n]`` tokens for a
    warm-up batch of ``len(starts)`` sequences."""
    import torch

    s, N = model.shape, len(starts)
    rec0 = torch.zeros(s.layers, N, s.v_heads, s.head_k_dim, s.head_v_dim, device=model.device)
    conv0 = torch.zeros(s.layers, N, s.conv_dim, s.conv_width - 1, dtype=model.dtype, device=model.device)
    kv = None
    if s.attn_layers:
        kv = [
            torch.zeros(s.attn_layers, 2, p, s.attn_kv_heads, s.attn_head_dim, dtype=model.dtype, device=model.device)
            for p in starts
        ]
    return rec0, conv0, kv


def _warm(model, device, steps: bool = False, batches: bool = False) -> float:
    """Compile every kernel specialisation a replay meets before anything is timed: the
    kernels' own ``warmup`` (Triton backend) at the stack's shapes and flags, then the stack
    itself from scratch and from a state, with and without boundary states and with a split (the
    stack's strided q/k/v/gate views are specialisations too)."""
    import torch

    t0 = time.perf_counter()
    s = model.shape
    kernel_warmup = None
    if model.kernel == "triton":  # kernels.warmup imports triton
        try:
            from kernels import warmup as kernel_warmup
        except ImportError:
            pass
    if kernel_warmup is not None:
        try:
            kernel_warmup(
                (63, 64, 200),
                num_heads=s.k_heads,
                num_v_heads=s.v_heads,
                head_k_dim=s.head_k_dim,
                head_v_dim=s.head_v_dim,
                dtype=model.dtype,
                device=device,
                use_gate_in_kernel=True,
                use_beta_sigmoid=True,
                conv_dim=s.conv_dim,
                conv_width=s.conv_width,
            )
        except (TypeError, ValueError, RuntimeError):  # another signature or a refused shape:
            pass  # the stack's own runs below cover it
    toks = torch.arange(300, device=device)
    model.run(toks[:200], None, 0, [64, 128], lambda *a: None, keep_outputs=True)
    st, _, _ = model.run(toks[:130], None, 0, [64, 100, 130], lambda *a: None, keep_outputs=True)
    model.run(toks[130:300], st, 130, [192, 250], lambda *a: None, keep_outputs=True)
    model.run(toks[:63], None, 0)
    model.run(toks[:64], None, 0, [64], lambda *a: None)
    if steps or batches:
        _warm_steps(model, boundaries=batches)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


@contextmanager
def cpu_threads(device, spec: ModelSpec):
    """Torch's intra-op threads while a CPU replays ``spec``: one for a preset up to d_model
    ``CPU_SMALL_D_MODEL`` (its ops are too small to split: a second thread only adds wake-up
    stalls, measured at tens of ms per call on a 2-core machine, which swamp the per-request
    times), torch's default otherwise and wherever OMP_NUM_THREADS is set. Restored after.
    Yields the thread count in use."""
    import torch

    if device.type != "cpu" or spec.d_model > CPU_SMALL_D_MODEL or os.environ.get("OMP_NUM_THREADS"):
        yield torch.get_num_threads()
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(before)


def run_replay(
    trace: Trace,
    config: SimConfig,
    settings: ReplaySettings,
    *,
    build,
    timing: Optional[TimingModel] = None,
    progress=None,
    after_event=None,
    on_ready=None,
) -> ReplayResult:
    """Simulate ``trace`` under ``config`` with replay attached; measure and summarise.

    ``build``: the assembly point's ``sim.simulate.build`` (passed in by the caller: replay sits
    below the assembly layer and observes the Simulation it builds).
    ``after_event(name, simulation, replayer)`` (tests) is called after every event;
    ``on_ready(replayer)`` before the simulation starts (tests plant faults there)."""
    settings.validate()
    spec = get_model(config.model)
    layers = check_model(spec, settings.layers)
    preset = find_preset(config.policy)
    if preset is not None and preset.tuned_in_hindsight:
        raise UsageError(f"replay follows one simulation: {preset.name} (one per alpha) is not replayable")
    check_batch(settings, config)
    trace = first_requests(trace, settings.requests)
    kernel = settings.backend
    if settings.device == "cpu" and GDN_BACKENDS[kernel].triton:
        # Triton kernels on a CPU run in the interpreter, chosen before triton is first imported
        if "triton" not in sys.modules:
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError(
                f"--device cpu --kernel {kernel} needs TRITON_INTERPRET=1 (set it before "
                "starting), or use --kernel torch"
            )
    import torch  # noqa: PLC0415 - the simulator must not need torch: only replay imports it

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible (use --device cpu and a tiny preset)")
    device = torch.device(settings.device)
    with cpu_threads(device, spec) as threads:
        res = _replay(
            trace,
            config,
            settings,
            spec,
            layers,
            kernel,
            device,
            build=build,
            timing=timing,
            progress=progress,
            after_event=after_event,
            on_ready=on_ready,
        )
    res.settings["cpu_threads"] = threads if device.type == "cpu" else None
    return res


def _replay(
    trace, config, settings, spec, layers, kernel, device, *, build, timing, progress, after_event, on_ready
) -> ReplayResult:
    """``run_replay`` once the settings are checked: build the model and store, simulate, measure."""
    import torch

    from sim.engine.drivers import run as run_simulation
    from sim.replay.calibration import NOT_COMPARED, replay_timing
    from sim.replay.model import DTYPES, HybridModel, ReplayShape
    from sim.replay.observer import ReplayObserver
    from sim.replay.runner import Replayer
    from sim.replay.store import CheckpointStore

    dtype = DTYPES[settings.dtype]
    if spec.n_mamba and not spec.n_gdn:
        # Mamba2 layers in the linear layers' place (sim/replay/mamba2.py: their sizes ride in
        # the shape's gated-delta fields, so the store and the restores need nothing else)
        from sim.replay.mamba2 import Mamba2Model, replay_shape

        shape = replay_shape(spec, layers, vocab_rows=VOCAB_ROWS)
        model = Mamba2Model(shape, device=device, dtype=dtype, seed=settings.seed, kernel=kernel)
    else:
        shape = ReplayShape.from_spec(spec, layers, vocab_rows=VOCAB_ROWS)
        model = HybridModel(shape, device=device, dtype=dtype, seed=settings.seed, kernel=kernel)
    counts = shape.counts()
    # the timing the measurements are compared with (after the model: its kernel's checks first)
    timing, timing_note = replay_timing(
        timing,
        spec,
        settings.dtype,
        device.type,
        torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        max((r.n_input_tokens(trace.block_tokens) for r in trace.requests), default=0),
    )
    store = CheckpointStore(shape, dtype, where=settings.store, device=device)
    tokens_of = token_source(trace, settings.seed)
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
        # every running request's flight stays open until it ends (a batch runs up to
        # --max-num-seqs of them at once)
        max_open=max(16, config.max_num_seqs + 8) if continuous else 16,
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
            ),
        )
    warm_s = 0.0
    if settings.warmup and device.type == "cuda":
        warm_s = _warm(model, device, steps=continuous, batches=settings.batch > 1)
    built = []  # the Simulation, for the tests' hook (it exists once events flow)
    hook = (lambda name: after_event(name, built[0], replayer)) if after_event is not None else None
    obs = ReplayObserver(
        replayer, mode=config.mode, progress=progress, after_event=hook, shadows=shadows, stepper=stepper
    )
    sim = build(trace, config, timing=timing, observers=(obs,))
    built.append(sim)
    if on_ready is not None:
        on_ready(replayer)
    t0 = time.perf_counter()
    sim_result = run_simulation(sim)
    records = replayer.finish()
    failures = list(replayer.failures)
    shadow_records = None
    for sh in shadows:
        shadow_records = sh.finish()
        failures += [replace(f, kind="shadow-" + f.kind) for f in sh.failures]
    executed = stepper.close() if stepper is not None else None
    if stepper is not None:
        failures += stepper.failures
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    table = measure.request_table(records, spec, timing, counts, shadow=shadow_records)
    summary = measure.summary(
        table,
        failures=failures,
        store_peak_bytes=store.peak_bytes,
        wall_s=wall,
        late_admits=replayer.late_admits,
        counts=counts,
        spec=spec,
        kv_hits_validated=replayer.kv_hits_validated,
    )
    summary["validation"] = settings.validation
    summary["time_model_note"] = timing_note
    summary["time_model_compared"] = not timing_note.startswith(NOT_COMPARED)
    summary["kv_tokens_live"] = int(store.kv_tokens)
    summary["mlp_moe_at_active_width"] = bool(shape.mlp_moe)
    summary["warmup_s"] = warm_s
    summary["simulated_hit_tokens"] = int(sum(r.hit_tokens for r in records))
    # flights past --max-open holding device tensors (sim.replay.runner.Replayer._hold)
    summary["flights_parked"] = replayer.parked
    summary["flights_dropped"] = replayer.dropped
    summary["recomputed_tokens"] = replayer.recomputed_tokens
    summary["kernel"] = model.kernel
    summary["measure"] = settings.measure if device.type == "cuda" else "wall"
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if settings.batch > 1:
        summary.update(
            measure.batch_summary(
                replayer.batch_log,
                spec,
                counts,
                wall_s=wall,
                peak_tflops=measure.device_peak(dev_name, settings.dtype),
                flushes=replayer.batch_flushes,
            )
        )
    step_rows = None
    if stepper is not None:
        from sim.replay import steps as step_rows_of

        step_rows = step_rows_of.step_table(executed, spec, timing, counts)
        summary.update(
            step_rows_of.step_summary(
                step_rows,
                counts=counts,
                wall_s=wall,
                peak_tflops=measure.device_peak(dev_name, settings.dtype),
                **stepper.counts(),
            )
        )
    info = dict(
        asdict(settings),
        layers=layers,
        layers_replayed=counts,
        kernel=model.kernel,
        kernel_requested=settings.kernel,
        mlp_note=(
            f"MoE MLP replayed dense at its active width ({shape.mlp_inter})"
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
        device_name=(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
    )
    return ReplayResult(summary, table, failures, info, sim_result, timing, steps=step_rows)


def calibrate(
    result: ReplayResult, config: SimConfig, path=None, decode_ms_per_token: Optional[float] = None
) -> ReplayResult:
    """Fit the hardware cost model to ``result``'s per-layer-type measurements; write the timing
    file to ``path``. A fit that puts a term above the device's peak is refused (UsageError)."""
    spec = get_model(config.model)
    counts = result.settings["layers_replayed"]
    dev = result.settings.get("device_name", "")
    peak = measure.device_peak(dev, result.settings.get("dtype", "bf16"))
    t, info = measure.calibrate(
        result.requests,
        spec,
        result.timing,
        counts,
        device=dev,
        peak_tflops=peak,
        decode_ms_per_token=decode_ms_per_token,
    )
    if result.steps is not None and len(result.steps):
        # --scheduler continuous: the per-sequence step times, fitted on the first half of the
        # executed steps, checked on the rest (sim.replay.steps.calibrate_steps)
        from sim.replay import steps as step_rows  # noqa: PLC0415 - continuous runs only

        t, step_info = step_rows.calibrate_steps(result.steps, spec, t, counts)
        info = dict(info, steps=step_info)
        result.summary["step_time_error_calibrated"] = dict(
            median=step_info["median_error"], p95=step_info["p95_error"]
        )
    result.calibrated = t
    result.calibration = info
    result.summary["time_model_median_error_calibrated"] = info["median_error"]
    result.summary["time_model_p95_error_calibrated"] = info["p95_error"]
    if path is not None:
        measure.write_timing(
            path,
            t,
            spec,
            dict(
                info,
                trace=result.settings.get("trace"),
                device=dev,
                policy=config.policy,
                state_alignment=config.state_alignment,
            ),
        )
    return result


def tokens_total(trace: Trace) -> int:
    return int(np.sum([r.n_input_tokens(trace.block_tokens) for r in trace.requests]))
