"""One replay run: simulate a trace with the replay observer attached, then measure.

``run_replay`` is what ``marconi replay`` and the benchmark call. torch is imported here, inside
functions, so that importing this module (the CLI does, to show ``--help``) needs no torch.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Optional

import numpy as np

from policies.base import find_preset
from sim.config import SimConfig, refuse_bad_choices, setting
from sim.cost import ModelSpec, TimingModel, get_model
from sim.errors import UsageError
from sim.replay import measure
from sim.replay.calibration import calibrate_run
from sim.replay.flops import mamba2_linear
from sim.replay.backends import CPU_SMALL_D_MODEL, GDN_BACKENDS, device_problem, kernel_choices, resolve_kernel
from sim.replay.records import SAVED_TIMINGS
from sim.replay.summary import ReplaySummary, cost_counts
from sim.replay.tokens import request_tokens
from traces.base import Trace

VOCAB_ROWS = 1 << 16  # embedding rows of the replayed model (token ids index it modulo this)
#: torch's generators take a 64-bit seed (``torch.Generator.manual_seed``: an overflow beyond)
SEED_LIMIT = 1 << 64


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
    check_memory: Optional[float] = setting(  # None: sim.replay.pipeline.output_room on a GPU, no bound on a CPU
        None,
        "GB a hit's check may hold of its suffix's per-layer outputs at once; a check over it compares "
        "them in groups of layers, running its suffix and reference again, untimed, per group [default: "
        "what the GPU has free beside the check's call; no bound on a CPU].",
        type=float,
    )
    dtype: str = setting(  # the CLI's default is by device: fp32 on a CPU
        "bf16", "Activations and weights [default: bf16 on cuda, fp32 on cpu].", choices=("bf16", "fp16", "fp32")
    )
    device: str = setting(
        "cuda",
        "cpu runs the gated-delta layers in plain torch by default (small presets in practice).",
        choices=("cuda", "cpu"),
    )
    requests: Optional[int] = setting(None, "Replay the first N requests [default: all of the trace's].", type=int)
    seed: int = setting(0, "Seed of the replayed layers' weights and of a hash-block trace's token ids.")
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
    attention: str = setting(  # sim.replay.model.attend
        "sdpa",
        "How prefills run attention: sdpa (SDPA's flash / memory-efficient kernels, what the committed "
        "timing files were fitted with) or cudnn (SDPA's cuDNN kernel on lengths padded to a few "
        "buckets, exact under the causal mask; ~2x faster at head dim 256 on Hopper; bf16 / fp16 on a "
        "GPU, elsewhere as sdpa).",
        choices=("sdpa", "cudnn"),
    )
    elementwise: str = setting(  # sim.replay.model.ELEMENTWISE
        "torch",
        "How the norms, gates and activations around the layers' products run: torch (torch's ops, "
        "what the committed timing files were fitted with) or fused (one Triton kernel each: the "
        "sublayers' input norms, the gated-delta output gate, the SwiGLU activation, q / k norm and "
        "rotary; a GPU only, elsewhere as torch).",
        choices=("torch", "fused"),
    )
    measure: str = setting(  # sim.replay.clock.Stopwatch
        "device",
        "How a GPU times prefills: device queues each timed call behind a GPU sleep as long as the "
        "host's issue time, so its events time the kernels back to back (the model's time); wall times "
        "it as issued to an idle GPU (short calls then time this harness's Python). Both record the "
        "host's issue time.",
        choices=("device", "wall"),
    )
    saved_timing: str = setting(  # sim.replay.runner.Replayer(alternate=)
        "once",
        "How a validated hit's two prefills are timed: once (its suffix, then its from-scratch "
        "reference) or alternate (suffix, reference, reference again, suffix again: each the mean of "
        "its two calls, so a drift between back-to-back long calls cancels out of the time saved; the "
        "hit's timed work twice over). Per-request timing only (--batch 1).",
        choices=SAVED_TIMINGS,
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
        if self.check_memory is not None and not 0 < self.check_memory < float("inf"):  # NaN fails both
            raise UsageError(f"--check-memory must be a finite number of GB > 0, not {self.check_memory}")
        if self.seed >= SEED_LIMIT:  # (a negative one: SimConfig's check, the same --seed)
            raise UsageError(
                f"--seed must be below 2^64 = {SEED_LIMIT} (torch seeds the replayed weights with 64 bits), "
                f"not {self.seed}"
            )
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
    report: ReplaySummary  # the run's figures, typed (``summary``: as a dict)
    requests: object  # pandas DataFrame, one row per request
    failures: list
    settings: dict
    sim_result: object = None
    timing: Optional[TimingModel] = None
    calibrated: Optional[TimingModel] = None
    calibration: dict = field(default_factory=dict)
    steps: object = None  # pandas DataFrame, one row per executed step (--scheduler continuous)

    @property
    def summary(self) -> dict:
        """The figures as ``summary.json`` and ``--format json`` give them (``report.to_dict()``)."""
        return self.report.to_dict()


def check_model(spec: ModelSpec, layers: Optional[int]) -> int:
    """The number of mixer layers (attention + gated delta or Mamba2) to replay; a preset with
    neither gated-delta nor Mamba2 layers is refused."""
    mamba2 = mamba2_linear(spec)
    if spec.n_gdn == 0 and not mamba2:
        kind = "Mamba1" if spec.n_mamba else "attention-only"
        raise UsageError(
            f"model {spec.name} has no gated-delta or Mamba2 layers ({kind}): replay runs the "
            "gated-delta and Mamba2 kernels only; pick a gated-delta preset (qwen3.5-*, qwen3-next-*, "
            "replay-tiny), a Mamba2 one (marconi-7b, nemotron-h-*, falcon-h1-7b, granite-4.0-h-small), "
            "or a config.json of those families"
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


#: the widest causal conv the Triton conv kernel runs (``kernels.conv.causal_conv1d``: 2 <= W <= 5),
#: which the triton backend and the peers (FLA, FlashQLA: the project's conv) call
TRITON_CONV_MAX_WIDTH = 5
#: the largest head dims of the Triton kernels: gated delta's K and V (``kernels._common``), the
#: SSD's head dim and state dim (``kernels.ssd_args.MAX_SSD_DIM``)
TRITON_MAX_HEAD_DIM = 256


def check_kernel_shapes(spec: ModelSpec, backend: str) -> None:
    """``spec``'s linear layers against what replay's kernels run (``backend`` resolved): a causal
    conv width of at least 2 (a window of W - 1 >= 1 tokens) everywhere, at most
    ``TRITON_CONV_MAX_WIDTH`` on the Triton conv, and on the Triton backend head dims (and a
    Mamba2 state dim) of at most ``TRITON_MAX_HEAD_DIM``. A config.json outside them (a
    ``linear_conv_kernel_dim`` of 1, or 6 on a GPU; a ``linear_key_head_dim`` of 288) stopped inside
    the replay with the kernel's ValueError (a traceback) after the trace was loaded."""
    mamba2 = mamba2_linear(spec)
    width = spec.mamba_conv_width if mamba2 else spec.gdn_conv_width
    kind = "Mamba2" if mamba2 else "gated-delta"
    if width < 2:
        raise UsageError(
            f"model {spec.name}: its {kind} layers' conv width is {width}; replay's causal conv needs a "
            "width of at least 2 (a conv window of one token or more)"
        )
    triton = GDN_BACKENDS[backend].triton
    if width > TRITON_CONV_MAX_WIDTH and triton:
        raise UsageError(
            f"model {spec.name}: its {kind} layers' conv width is {width}, and the Triton conv kernel "
            f"(--kernel {backend}) runs widths 2 to {TRITON_CONV_MAX_WIDTH}; use --kernel torch"
        )
    if backend != "triton":  # torch: any size; the peers check their own (sim.replay.peers)
        return
    if mamba2:
        try:  # the replayed shape: a preset without heads (marconi-7b) gets 64-wide ones there
            from sim.replay.mamba2 import Mamba2Shape  # noqa: PLC0415 - torch: the replay needs it anyway
        except ImportError:  # the replay itself says what to install
            return
        try:
            m = Mamba2Shape.from_spec(spec)
        except ValueError as exc:
            raise UsageError(f"model {spec.name}: {exc}") from None
        dims = {"head dim": m.head_dim, "state dim": m.d_state}
    else:
        dims = {"key head dim": spec.gdn_head_k_dim, "value head dim": spec.gdn_head_v_dim}
    for name, d in dims.items():
        if d > TRITON_MAX_HEAD_DIM:
            raise UsageError(
                f"model {spec.name}: its {kind} layers' {name} is {d}, and the Triton kernels (--kernel "
                f"{backend}) run up to {TRITON_MAX_HEAD_DIM}; use --kernel torch"
            )


def check_calibrate(spec: ModelSpec, layers: Optional[int]) -> None:
    """``--calibrate`` prices every layer type of ``spec`` from this replay's measurements: a
    ``--layers`` that replays none of a type the model has (``--layers 1`` leaves attention out)
    is refused, since the timing file would price that type at nothing (its terms unfitted, 0 on
    a CPU, the device's peak on a GPU, no per-call time)."""
    if layers is None:
        return
    try:
        from sim.replay.model import subsample  # noqa: PLC0415 - torch: the replay needs it anyway
    except ImportError:  # the replay itself says what to install
        return
    mamba2 = mamba2_linear(spec)
    linear = spec.n_mamba if mamba2 else spec.n_gdn
    a, g = subsample(spec.n_attn, linear, layers)
    kind = "Mamba2" if mamba2 else "gated-delta"
    for present, replayed, name in ((spec.n_attn, a, "attention"), (linear, g, kind)):
        if present and not replayed:
            raise UsageError(
                f"--calibrate with --layers {layers}: {spec.name}'s {name} layers would not be replayed "
                f"({a} attention + {g} {kind} of its {spec.n_attn} + {linear}), so the timing file could "
                f"not price them; give --layers {2 if spec.n_attn and linear else 1} or more, or leave it out"
            )


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
    hash_block = int(trace.meta.get("hash_block_tokens") or 0)  # --hash-block-tokens: drawn as the blocks

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
            hash_block=hash_block,
        )
        return toks, n_in

    return tokens_of


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
    check_kernel_shapes(spec, kernel)
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
    """``run_replay`` once the settings are checked, in three steps (``sim.replay.pipeline``):
    build the model, store and replayers; execute the event stream; summarize."""
    from sim.replay import pipeline

    parts = pipeline.build(
        trace,
        config,
        settings,
        spec,
        layers,
        kernel,
        device,
        timing=timing,
        vocab_rows=VOCAB_ROWS,
        tokens_of=token_source(trace, settings.seed),
        simulate=build,
    )
    run = pipeline.execute(
        parts, trace, config, build=build, progress=progress, after_event=after_event, on_ready=on_ready
    )
    summary, table, info, step_rows = pipeline.summarize(parts, run, trace, config, settings, layers)
    return ReplayResult(summary, table, run.failures, info, run.sim_result, parts.timing, steps=step_rows)


def calibrate(
    result: ReplayResult, config: SimConfig, path=None, decode_ms_per_token: Optional[float] = None, put=None
) -> ReplayResult:
    """Fit the hardware cost model to ``result``'s per-layer-type measurements (with the
    resumed-call term where the run shows one: ``calibration.calibrate_run``); write the timing
    file to ``path`` (through ``put(path, write(tmp))`` where given: the CLI's
    ``sim.cli.outdir.written_together``, which renames it with the --out files as one set). A fit
    that puts a term above the device's peak is refused (UsageError)."""
    spec = get_model(config.model)
    counts = cost_counts(result.settings["layers_replayed"])
    dev = result.settings.get("device_name", "")
    peak = measure.device_peak(dev, result.settings.get("dtype", "bf16"))
    t, info = calibrate_run(
        result.requests,
        spec,
        result.timing,
        counts,
        device=dev,
        peak_tflops=peak,
        decode_ms_per_token=decode_ms_per_token,
        host=result.summary.get("measure") == "device",  # queued on a GPU: the host's own issue times
    )
    if result.steps is not None and len(result.steps):
        # --scheduler continuous: the per-sequence step times, fitted on the first half of the
        # executed steps, checked on the rest (sim.replay.steps.calibrate_steps)
        from sim.replay import steps as step_rows  # noqa: PLC0415 - continuous runs only

        t, step_info = step_rows.calibrate_steps(result.steps, spec, t, counts)
        info = dict(info, steps=step_info)
        result.report = result.report.with_calibration(
            step_time_error_calibrated=dict(median=step_info["median_error"], p95=step_info["p95_error"])
        )
    # the file says which dtype it was fitted in: a replay in another dtype compared with it says so
    # (calibration.replay_timing), as one compared with the committed fits does
    t = replace(
        t,
        dtype=str(result.settings.get("dtype") or t.dtype),
        attention=str(result.settings.get("attention") or "sdpa"),
        elementwise=str(result.settings.get("elementwise") or "torch"),
    )
    result.calibrated = t
    result.calibration = info
    result.report = result.report.with_calibration(
        time_model_median_error_calibrated=info["median_error"], time_model_p95_error_calibrated=info["p95_error"]
    )
    if path is not None:
        record = dict(
            info,
            trace=result.settings.get("trace"),
            device=dev,
            policy=config.policy,
            state_alignment=config.state_alignment,
        )
        if put is None:
            measure.write_timing(path, t, spec, record)
        else:
            put(path, lambda tmp: measure.write_timing(tmp, t, spec, record))
    return result


def tokens_total(trace: Trace) -> int:
    return int(np.sum([r.n_input_tokens(trace.block_tokens) for r in trace.requests]))
