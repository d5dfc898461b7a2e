"""`marconi replay`: run the simulator with GPU replay attached (sim.replay): every claimed
restore is executed with the whole model (gated-delta layers on the project's Triton kernels, or
their plain-torch twin on a CPU) against a real checkpoint store, checked and timed."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import click

from sim.cli.checks import check_replay
from sim.cli.outdir import (
    RUN_FOLDER_FILES,
    OutputPath,
    check_output_files,
    input_paths,
    model_inputs,
    output_folder,
    refuse_other_kind,
    remove_earlier_outputs,
    written_together,
)
from sim.cli.options import PROGRESS_HELP, format_option, option, with_options
from sim.cli.run import parse_alpha
from sim.cli.run import _scheduler as _scheduler_word
from sim.cli.traces import trace_from_cli, trace_options
from sim.config import SimConfig, format_size, parse_size
from sim.errors import UsageError, interrupted, stop_exit_code, stop_message
from sim.replay.backends import CPU_SMALL_D_MODEL
from sim.replay.records import AT_REQUEST, HELD_AT

INSTALL_HINT = "marconi replay needs torch (and triton for --kernel triton): pip install 'marconi-sim[kernels]'"
#: widest model `--device cpu` replays without a warning: a wider one takes minutes per request there
CPU_MAX_D_MODEL = CPU_SMALL_D_MODEL
#: executed TFLOP/s of a CPU replay, for the warning's estimate (plain-torch backend, fp32, measured
#: at qwen3.5-9b shapes on a 2-core machine: 0.11 over the wall time, 0.13 over the timed prefills)
CPU_TFLOPS = 0.1


def cpu_time_warning(spec, trace, requests, layers: int, kernel: str, steps: bool = False):
    """One line for stderr when ``--device cpu`` replays a preset wider than ``CPU_MAX_D_MODEL``:
    the expected wall time (None for narrower presets). Estimate: every request prefilled once from
    scratch (a miss, or a hit's validation) by ``layers`` of the preset's mixer layers with their
    MLPs, at ``CPU_TFLOPS``; the suffixes after restores come on top (at most as much again), and
    with ``steps`` (``--scheduler continuous``, the default) the engine steps run the suffixes
    again as batches (at most as much again once more: qwen3.5-9b at 2 layers, 6 requests of
    ``synthetic:chat`` on 2 shared cores took 34 s under fcfs and 69 s under continuous
    batching, said as "14 s to 28 s" for both before)."""
    if spec.d_model <= CPU_MAX_D_MODEL:
        return None
    from sim.replay.flops import replayed_flops
    from sim.replay.measure import model_counts

    reqs = trace.requests[:requests] if requests else trace.requests
    counts = model_counts(spec)  # a Mamba2 model's linear layers in the gated-delta slot
    share = layers / max(counts["attention"] + counts["gated_delta"], 1)  # --layers subsamples every type alike
    B = trace.block_tokens
    flops = share * sum(replayed_flops(spec, counts, [(0, r.n_input_tokens(B))]) for r in reqs)
    secs = flops / (CPU_TFLOPS * 1e12)
    how = (
        f"at ~{CPU_TFLOPS:g} TFLOP/s"
        if kernel != "triton"
        else "plus the Triton interpreter's slowdown of the gated-delta layers (many times that)"
    )
    n, tf = len(reqs), flops / 1e12
    tflop = f"{tf:,.0f}" if tf >= 10 else f"{tf:.2g}"
    most = 3 if steps else 2
    lo, hi = _duration(secs), _duration(most * secs)
    span = lo if lo == hi else f"{lo} to {hi}"  # not "1 s to 1 s"
    return (
        f"warning: --device cpu: {spec.name} (d_model {spec.d_model}) will take about {span} "
        f"for {n:,} request{'s' if n != 1 else ''} of {layers} layer"
        f"{'s' if layers != 1 else ''} ({tflop} TFLOP of from-scratch prefills {how}"
        + ("; the engine steps of continuous batching run the suffixes again" if steps else "")
        + "); --layers, --requests or --device cuda cut it"
    )


def out_of_memory_line(exc: BaseException, device: str) -> str:
    """One line for a replay that ran out of device (or host) memory, empty for any other error:
    torch's ``OutOfMemoryError`` (a ``RuntimeError``) on a GPU, its CPU allocator's "can't allocate
    memory" on a CPU. The replay warns before it starts when its plan exceeds the free memory
    (``sim.replay.pipeline.memory_warning``); this is the end of a run that went on anyway. It
    names the request last looked up and what the replay held then, as the run's error notes
    them (``AT_REQUEST``, ``HELD_AT``)."""
    text = str(exc)
    if type(exc).__name__ != "OutOfMemoryError" and "can't allocate memory" not in text:
        return ""
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else type(exc).__name__
    first = first.split(". GPU ")[0].split(" (")[0].rstrip(".")
    where = "the GPU" if device != "cpu" else "this machine"
    # the request the run had last looked up (sim.replay.pipeline.execute's note)
    notes = getattr(exc, "__notes__", ())
    at = [n.removeprefix(AT_REQUEST) for n in notes if n.startswith(AT_REQUEST)]
    where += f", the last request looked up {at[-1]}" if at else ""
    # and what the replay held then (sim.replay.pipeline.memory_at_failure), beside torch's figure
    held = [n.removeprefix(HELD_AT) for n in notes if n.startswith(HELD_AT)]
    first += f"; {held[-1]}" if held else ""
    return f"replay ran out of memory on {where} ({first}): lower --capacity or --requests" + (
        ", or use --store host" if device != "cpu" else ""
    )


def _duration(secs: float) -> str:
    if secs < 90:
        return f"{max(1, round(secs))} s"
    if secs < 5400:
        return f"{secs / 60:.0f} min"
    return f"{secs / 3600:,.1f} h"


def check_before_work(spec, calibrate_path, out, force: bool, trace_spec, timing_path=None, model=None) -> None:
    """The outputs of a replay, checked before the trace is loaded and replayed: the output files (not
    an input, not existing unless --force). Their folders are created (or refused) right after, by
    the command's ``output_folder``s, which hold them for the whole replay and remove the ones they
    made that are still empty when it fails or is interrupted. The settings (the tolerance among
    them) are ``ReplaySettings.validate``'s, run before this. (A model too wide for the CPU is
    warned of, not refused: ``cpu_time_warning`` once the trace is loaded.)"""
    # every file of the folder kind replay shares with `run` (its occupancy.parquet too: removed at the
    # end, so it is replaced only under --force)
    files = [(Path(out) / name, "--out") for name in RUN_FOLDER_FILES] if out is not None else []
    if calibrate_path is not None:
        files.append((Path(calibrate_path), "--calibrate"))  # a list: one path for two outputs is refused
    refuse_other_kind(out, "run")
    if out is not None and calibrate_path is not None:
        # the --calibrate file at the --out folder or above it: the folder made now, the timing file
        # written onto it after the whole replay (an IsADirectoryError traceback, the replay lost)
        folder, timing_file = Path(out).expanduser().resolve(), Path(calibrate_path).expanduser().resolve()
        if timing_file == folder or timing_file in folder.parents:
            where = "is" if timing_file == folder else "is a folder above"
            raise UsageError(
                f"--calibrate {calibrate_path}: {where} the --out folder {out} of this command; "
                "give each output its own name"
            )
    check_output_files(files, force=force, inputs=input_paths(trace_spec, timing_path) + model_inputs(model))


def _validation_line(s: dict) -> str:
    mode = s.get("validation", "tolerance")
    text = mode
    if mode != "tolerance":
        text += (
            f": {s.get('integrity_checked', 0):,} restores bit-exact-checked, {s.get('integrity_failures', 0)} differ"
        )
    if mode == "shadow":
        e = s.get("shadow_restore_errors", {}).get("rec", {})
        text += f"; fp32 shadow {s.get('shadow_hits_validated', 0):,} hits, {s.get('shadow_failures', 0)} failures" + (
            f", recurrent error p95 {e['p95']:.2g}" if e else ""
        )
    e = s.get("restore_errors", {})
    if e:
        text += "; error p50 / p95: " + ", ".join(f"{k} {v['p50']:.2g} / {v['p95']:.2g}" for k, v in e.items())
    if s.get("outputs_grouped"):
        text += (
            f"; {s['outputs_grouped']:,} checks compared their outputs in groups of layers (too large for the "
            "GPU at once: suffix and reference ran again, untimed, per group)"
        )
    return text


def _unvalidated(s: dict) -> str:
    """Why hits went unvalidated, counted by reason (every hit is validated or has one), and why
    validated hits had no KV to check (a replay of no attention layer)."""
    why, kv = s.get("hits_unvalidated") or {}, s.get("kv_hits_unvalidated") or {}
    line = "; not validated: " + ", ".join(f"{k} {v:,}" for k, v in why.items()) if why else ""
    return line + ("; KV not checked: " + ", ".join(f"{k} {v:,}" for k, v in kv.items()) if kv else "")


def flops_line(s) -> str:
    """Executed against simulated FLOPs saved, and what the kernel's 64-token chunks make of the
    difference (a hit or split off a chunk boundary pads its chunk): the rest is 0 on a correct
    replay, and is printed when it is not."""
    exe, sim, pad = s["measured_flops_saved"], s["simulated_flops_saved"], s.get("padding_flops_saved", 0.0)
    line = f"executed {exe:.3e}, simulated {sim:.3e}"
    if pad:
        line += f" ({pad:+.3e} from the kernel's 64-token chunks"
        rest = exe - sim - pad
        line += f", {rest:+.3e} otherwise)" if abs(rest) > 1e-9 * max(abs(sim), 1.0) else ")"
    return line


#: below this share of the prefill time without the cache, the time saved is said to be a small
#: difference of two totals (its measured and modelled values then say little about each other)
SMALL_SAVING = 0.05


def _saved_ms(ms: float) -> str:
    """A time saved in ms, one decimal; one under 0.05 ms in two significant digits (a hit the
    model prices a few microseconds dearer than the full prefill printed 'modelled -0.0 ms')."""
    return f"{ms:,.1f}" if ms == 0 or abs(ms) >= 0.05 else f"{ms:.2g}"


#: why a timed call ran again (``Stopwatch.outran`` / ``Stopwatch.stalled``): the summary lines' words
RETIMED_WHY = "their first call's host issue outran its sleep, or the GPU stalled outside its layers"


def saved_line(s: dict) -> str:
    """Time saved on the validated hits, measured (each from-scratch reference less its suffix
    call; timed alternated, with its spread: ``measure.saved_spread``) against modelled, and how
    many references were timed again (``RETIMED_WHY``: ``HitChecker._retime_reference``)."""
    text = f"measured {_saved_ms(s['measured_ms_saved_validated'])} ms"
    spread = s.get("time_saved_spread_ms")
    if spread is not None:  # --saved-timing alternate: each hit measured twice
        text += f" +/- {_saved_ms(spread)} ms (the spread of each hit's two alternated pairs)"
    text += f", modelled {_saved_ms(s['modelled_ms_saved_validated'])} ms"
    total = s.get("measured_ms_without_cache") or 0.0
    share = s["measured_ms_saved_validated"] / total if total > 0 else None
    if s.get("hits_validated", 1) and share is not None and abs(share) < SMALL_SAVING:  # no hit: nothing to qualify
        # a Mooncake hit is a few blocks of a prompt of tens of thousands of tokens: the saving is a
        # difference of two totals, each modelled within a few per cent, so its sign can differ
        text += (
            f" ({share:.1%} of the prefill time without the cache: a difference of two totals, each within "
            "the time model's error, so the two may differ even in sign)"
        )
    iv = s.get("time_saved_interval")
    if iv and s.get("time_model_compared", True):
        # how far these hits pin the figure: a few long calls' spread can swamp a small saving
        text += f" (modelled {iv[0]:+.1%}, 95 % interval over the hits {iv[1]:+.0%} to {iv[2]:+.0%})"
    if s.get("retimed_references"):
        n = s["retimed_references"]
        text += f" ({n} from-scratch references timed again: {RETIMED_WHY})"
    return text


def _error_line(s: dict) -> str:
    """The time model's error over the timed prefills. With a host term in the timing every
    prefill counts (host-bound ones priced with the host's issue time), the device-bound ones'
    figures beside; without one, host-bound ones (their device time holds host gaps) are left
    out and counted, with the P95 over all of them. Where the timing does not describe this run
    (a CPU, another GPU) the line says so instead of an error."""
    if not s.get("time_model_compared", True):
        return s.get("time_model_note", "not compared")
    text = f"median {s['time_model_median_error']:.1%}, P95 {s['time_model_p95_error']:.1%}"
    if s.get("time_model_host_term"):
        text += (
            f" over all prefills ({s.get('host_bound_prefills', 0)} host-bound, priced with the host's issue "
            f"time; device-bound median {s['time_model_median_error_device_bound']:.1%}, "
            f"P95 {s['time_model_p95_error_device_bound']:.1%})"
        )
    if s.get("retimed_prefills"):  # measure.outran_sleep / measure.stalled_outside
        text += f" ({s['retimed_prefills']} prefills timed again: {RETIMED_WHY})"
    if s.get("time_model_note"):
        text += f" ({s['time_model_note']})"
    if s.get("host_bound_prefills") and not s.get("time_model_host_term"):
        text += (
            f" ({s['host_bound_prefills']} host-bound prefills left out; P95 with them "
            f"{s.get('time_model_p95_error_all', float('nan')):.1%})"
        )
    return text


def step_line(s: dict) -> str:
    """The step executor's line (``--scheduler continuous``): steps executed of the simulated
    ones, modelled vs measured step time and executed TFLOP/s over the timed steps."""
    e, m, d = s["step_time_error"], s["step_measured_ms"], s["step_modelled_ms"]
    peak = f" ({s['step_peak_share']:.1%} of peak)" if s.get("step_peak_share") else ""
    return (
        f"{s['steps_executed']:,} steps executed of {s['steps_simulated']:,} ({s['step_events']:,} step events); "
        f"measured p50 / p95 {m['p50']:.3g} / {m['p95']:.3g} ms, modelled {d['p50']:.3g} / {d['p95']:.3g} ms; "
        + (
            f"error median {e['median']:.1%}, P95 {e['p95']:.1%}"
            if s.get("time_model_compared", True)
            else "error not compared (see the time model line)"
        )
        + (f" ({s['steps_host_bound']} host-bound steps left out)" if s.get("steps_host_bound") else "")
        + f"; executed {s['step_tflops_timed']:.3g} TFLOP/s "
        f"over timed steps{peak}"
    )


def batch_line(s: dict) -> str:
    """Batched replay's calls by kind: how many, sequences and tokens per call, TFLOP/s."""
    parts = []
    for kind, d in s["batch_calls"].items():
        parts.append(
            f"{kind} {d['calls']:,} ({d['sequences_per_call']:.1f} requests, {d['tokens_per_call']:,.0f} tokens "
            f"per call, {d['ms']:,.0f} ms, {d['tflops']:.1f} TFLOP/s)"
        )
    runs = ", ".join(f"{k} {v}" for k, v in s.get("batch_flushes", {}).items())
    return "; ".join(parts) + (f"; queue ran: {runs}" if runs else "")


def _aborted(s: dict) -> str:
    """The requests line's note of what the engine preset aborted at arrival (never replayed)."""
    n = s.get("aborted_requests", 0)
    return f"; {n:,} more aborted at arrival (prompt longer than the engine takes), not replayed" if n else ""


@contextmanager
def said_if_interrupted(out, calibrate_path, written: list):
    """Ctrl-C (SIGTERM, SIGHUP) before this replay's outputs were committed (``written`` still
    empty): one line that says nothing was written and that a replay does not resume (a rerun
    starts over), exit 130 (143, 129). It said "Interrupted." alone, which left a user to find out
    whether the rerun would resume or find half a folder; after the commit, the plain line."""
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, SystemExit) or not interrupted(exc) or written:
            raise
        targets = [f"--out {out}"] if out is not None else []
        targets += [f"--calibrate {calibrate_path}"] if calibrate_path is not None else []
        where = f"nothing was written to {' or '.join(targets)}; " if targets else ""
        click.echo(
            f"{stop_message().rstrip('.')}: {where}a replay does not resume: rerun the same command to start over",
            err=True,
        )
        sys.exit(stop_exit_code())


def format_summary(s: dict, settings: dict) -> str:
    rows = [
        ("requests", f"{s['requests']:,} ({s['input_tokens']:,} input tokens)" + _aborted(s)),
        (
            "layers replayed",
            ", ".join(f"{k} {v}" for k, v in s.get("layers_replayed", {}).items())
            + (f" ({settings['mlp_note']})" if settings.get("mlp_note") else ""),
        ),
        (
            "hits (validated, KV validated)",
            f"{s['hits']:,} ({s['hits_validated']:,}, {s.get('kv_hits_validated', 0):,})" + _unvalidated(s),
        ),
        ("failures (KV)", f"{s['failures']} ({s.get('kv_failures', 0)})"),
        (
            "worst restore error",
            f"recurrent {s['max_rec_error']:.3g}, conv {s['max_conv_error']:.3g}, outputs "
            f"{s['max_out_error']:.3g}, KV {s.get('max_kv_error', 0):.3g} "
            f"(tolerances {settings['tolerance'][0]:.3g} / "
            f"{settings['tolerance'][1]:.3g})",
        ),
        ("validation", _validation_line(s)),
    ]
    batched = "batch_calls" in s  # requests ran in batches: no per-request times, the batches' instead
    if not batched:
        rows += [
            (
                "measured prefill with cache",
                f"{s['measured_ms_with_cache']:,.1f} ms ("
                + ", ".join(f"{k} {v:,.0f}" for k, v in s.get("measured_ms_by_layer_type", {}).items())
                + ")",
            ),
            (
                "measured prefill without cache",
                f"{s['measured_ms_without_cache']:,.1f} ms ({s['requests_full_measured']} requests timed in full)",
            ),
            (
                "saved on validated hits",
                saved_line(s),
            ),
        ]
    rows.append(("FLOPs saved", flops_line(s)))
    if not batched:
        rows.append(("time model error", _error_line(s)))
    rows.append(("store peak", format_size(s["store_peak_bytes"])))
    if batched:
        rows.append(("batched calls", batch_line(s)))
    share_timed, share_wall = s.get("replay_peak_share_timed"), s.get("replay_peak_share_wall")
    rows.append(
        (
            "wall",
            f"{s['wall_s']:.1f} s ({s['tokens_per_s']:,.0f} input tokens/s; executed "
            f"{s.get('replay_tflops_timed', float('nan')):.1f} TFLOP/s over "
            + ("the timed calls" if batched else "timed prefills")
            + (f" ({share_timed:.0%} of peak)" if share_timed else "")
            + f", {s.get('replay_tflops_wall', float('nan')):.1f} over the wall time"
            + (f" ({share_wall:.0%})" if share_wall else "")
            + ")",
        )
    )
    if "steps_executed" in s:
        rows.append(("step time", step_line(s)))
    if "time_model_median_error_calibrated" in s:
        rows.append(
            (
                "time model error, calibrated",
                f"median {s['time_model_median_error_calibrated']:.1%}, P95 {s['time_model_p95_error_calibrated']:.1%}",
            )
        )
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def replay_options(fn):
    """`marconi replay`'s settings options, in their order: SimConfig's knobs and ReplaySettings'
    fields, generated from their declarations (sim/cli/options.py); where the replay means a knob
    differently (its model preset, one policy) it says so here."""
    from sim.replay.session import ReplaySettings  # noqa: PLC0415 - no torch: --help stays light

    knob = SimConfig.knob
    own = {f.name: f for f in fields(ReplaySettings)}
    return with_options(
        fn,
        [
            option(knob("policy"), help="One policy (`marconi policies` lists them; vllm+, sglang+, marconi, ...)."),
            option(knob("capacity_bytes"), lead=True),
            option(
                knob("alpha"),
                lead=True,
                help="Marconi's FLOP-efficiency weight (a number >= 0), or auto: tuned while the trace runs, "
                "as `marconi run` tunes it.",
            ),
            option(
                knob("model"),
                default="qwen3.5-9b",
                help="Model preset, or a config.json (or a folder holding one), with gated-delta or Mamba2 layers "
                "(replay-tiny for CPU runs; `marconi models` lists the presets).",
            ),
            option(own["layers"]),
            *(option(knob(name)) for name in ("state_alignment", "chunk_size")),
            # replay has one engine and the FLOPs model: no --servers or --ttft-model to name
            option(
                knob("mode"),
                help="des: discrete-event (arrivals, queueing, --scheduler); sequential: the artifact's replay, "
                "one request after another.",
            ),
            option(
                knob("scheduler"),
                help="continuous: one engine stepping batches of decode tokens and prefill chunks (vLLM-style "
                "chunked prefill), running requests' KV and states charged to --capacity; fcfs: each request "
                "prefills alone, first come first served, then decodes; auto: continuous in --mode des, fcfs in "
                "--mode sequential.",
            ),
            *(option(knob(name)) for name in ("max_num_batched_tokens", "max_num_seqs")),
            *(option(own[name]) for name in ("coast_steps", "batch", "batch_tokens")),
            option(
                knob("sessions_per_second"),
                help="Closed-loop traces: sessions started per second (session i at i / rate); open-loop "
                "traces (mooncake, bailian, marconi-jsonl) keep their own timestamps.",
            ),
            *(option(own[name]) for name in ("validate_every", "store", "check_memory")),
            option(own["dtype"], default=None),  # by --device: bf16 on cuda, fp32 on cpu
            *(option(own[name]) for name in ("device", "kernel", "requests", "seed", "validation")),
            *(option(own[name]) for name in ("tolerance", "attention", "elementwise", "measure", "saved_timing")),
        ],
    )


def replay_settings(kwargs: dict, settings_cls) -> tuple[dict, dict]:
    """(``settings_cls``' keywords, SimConfig's) taken out of the command's keyword arguments (what
    is left: the trace options). --capacity and --alpha stay text here (read by
    :func:`replay_config`); the one --seed seeds both the replay (weights, hash-block tokens) and
    the simulation."""
    own = {f.name: kwargs.pop(f.name) for f in fields(settings_cls) if f.name in kwargs}
    knobs = {name: kwargs.pop(name) for name in SimConfig.field_names() if name in kwargs}
    knobs["capacity"] = kwargs.pop("capacity")
    knobs["seed"] = own["seed"]
    return own, knobs


def replay_config(knobs: dict) -> SimConfig:
    """The replay's SimConfig from :func:`replay_settings`' knobs (--capacity, --alpha read here)."""
    knobs = dict(knobs)
    if "," in str(knobs.get("policy", "")):  # `run` takes a list; a replay is of one stream
        raise UsageError(
            f"--policy {knobs['policy']!r}: a replay runs one policy (`marconi run` compares several): "
            "replay each on its own"
        )
    capacity = parse_size(knobs.pop("capacity"))
    return SimConfig(**{**knobs, "capacity_bytes": capacity, "alpha": parse_alpha(knobs["alpha"])})


def register(main: click.Group) -> None:
    @main.command("replay")
    @trace_options
    @replay_options
    @click.option(
        "--timing",
        "timing_path",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="Compare the measurements with this timing file (written by --calibrate) instead of the "
        "preset's default; needed where the default's dtype is not the replay's.",
    )
    @click.option(
        "--calibrate",
        "calibrate_path",
        type=OutputPath(dir_okay=False, path_type=Path),
        default=None,
        help="Fit the time model to the measurements; write a timing file for `marconi run --timing`.",
    )
    @click.option(
        "--out",
        type=OutputPath(file_okay=False, path_type=Path),
        default=None,
        help="Write summary.json, requests.parquet and (continuous batching) steps.parquet here.",
    )
    @click.option(
        "--force",
        is_flag=True,
        help="Replace the files of --out and --calibrate when they exist (never an input of the run).",
    )
    @format_option("table: the summary, a figure a line; json: the summary's figures (summary.json's summary).")
    @click.option("--progress/--no-progress", default=True, show_default=True, help=PROGRESS_HELP)
    def replay(timing_path, calibrate_path, out, force, fmt, progress, **kwargs):
        """Simulate a trace with GPU replay attached: every hit restored from a real checkpoint store,
        checked (prefix hash, numerics vs a from-scratch prefill) and timed."""
        from tqdm import tqdm  # noqa: PLC0415 - progress bar, loaded only when running

        from sim.cost import get_model
        from sim.replay.session import (
            ReplaySettings,
            calibrate,
            check_batch,
            check_calibrate,
            check_kernel_shapes,
            check_model,
            run_replay,
        )
        from sim.simulate import build

        own, knobs = replay_settings(kwargs, ReplaySettings)  # kwargs keeps the trace options
        model, layers, device, requests = knobs["model"], own["layers"], own["device"], own["requests"]
        check_model(get_model(model), layers)  # refuse non-GDN presets before loading a trace
        if own["dtype"] is None:
            own["dtype"] = "fp32" if device == "cpu" else "bf16"
        settings = ReplaySettings(**own)
        settings.validate()  # before any output folder is made (the config too, below)
        check_kernel_shapes(get_model(model), settings.backend)  # a conv width or head dim its kernels cannot run
        config = replay_config(knobs)
        config.validate()
        check_batch(settings, config, calibrating=calibrate_path is not None)
        if calibrate_path is not None:
            check_calibrate(get_model(model), layers)
        check_replay(click.get_current_context(), config, kwargs.get("trace"))
        check_before_work(get_model(model), calibrate_path, out, force, kwargs.get("trace"), timing_path, model)
        # the output folders, created (or refused) now, before the trace is loaded, and locked until
        # this command ends: a second replay (or run) into one of them is refused in one line, never
        # interleaved with this one's files. A `with`, not ctx.with_resource: click closes its
        # resources without the exception, so a folder made here and still empty after an error or
        # Ctrl-C (exit 130) stayed behind; output_folder removes those (never one holding a file)
        calibrate_folder = Path(calibrate_path).parent if calibrate_path is not None else None
        written = []  # set when the outputs are committed (renamed into place, signals held back)
        with (
            output_folder(out, "--out"),
            output_folder(calibrate_folder, "--calibrate"),
            said_if_interrupted(out, calibrate_path, written),
        ):
            timing = None
            if timing_path is not None:
                from sim.cost import read_timing_file  # noqa: PLC0415

                timing = read_timing_file(timing_path, model=model)
            trace = trace_from_cli(kwargs, progress)
            if device == "cpu":
                warning = cpu_time_warning(
                    get_model(model),
                    trace,
                    requests,
                    check_model(get_model(model), layers),
                    settings.backend,
                    steps=config.effective_scheduler == "continuous",
                )
                if warning:
                    click.echo(warning, err=True)
            total = min(len(trace.requests), requests or len(trace.requests))
            if requests and requests > total:  # the replay is of every request there is: said, not refused
                click.echo(
                    f"note: --requests {requests:,}: the trace has {total:,} requests; replaying all {total:,}",
                    err=True,
                )
            bar = tqdm(total=total, unit="req", disable=not progress, desc="replaying", leave=False)
            try:
                res = run_replay(trace, config, settings, build=build, progress=bar, timing=timing)
            except ImportError as exc:
                if (exc.name or "").split(".")[0] in ("torch", "triton"):
                    raise UsageError(INSTALL_HINT) from None
                raise
            except RuntimeError as exc:
                line = out_of_memory_line(exc, device)
                if line:
                    raise UsageError(line) from None
                raise
            finally:
                bar.close()
            from sim.replay import output  # noqa: PLC0415

            # the timing file and --out's files as one set, renamed together with Ctrl-C held back:
            # an interrupt while they were written left requests.parquet (and the timing file)
            # without summary.json, which the rerun of the same command refused as existing outputs
            # (with --force: this replay's requests beside the earlier summary)
            ours = (output.SUMMARY, output.REQUESTS) + ((output.STEPS,) if res.steps is not None else ())

            def commit():
                written.append(True)
                if out is not None:
                    remove_earlier_outputs(out, ours)

            with written_together(before_commit=commit) as put:
                if calibrate_path is not None:
                    calibrate(res, config, calibrate_path, put=put)
                if out is not None:
                    # an earlier run's occupancy.parquet (--force) is not this replay's, nor an
                    # earlier replay's steps.parquet when this one has none: removed at the commit
                    for path, write in output.files(out, res.summary, res.settings, res.requests, steps=res.steps):
                        put(path, write)
            if fmt == "json":  # standard JSON: NaN (a figure the run has none of) as null, as summary.json
                click.echo(json.dumps(output.finite(res.summary), indent=2, allow_nan=False))
            else:
                click.echo(
                    f"replay {trace.name} | {config.policy} | {config.model}, {res.settings['layers']} "
                    f"layers | {format_size(config.capacity_bytes)} | {config.state_alignment} "
                    f"alignment | {config.mode}{_scheduler_word(config)} | {settings.dtype} on {res.settings['device_name']} | "
                    f"{res.settings['kernel']} kernels | store {res.settings['store']}"
                    + (
                        f" | attention {res.settings['attention']}"
                        if res.settings.get("attention", "sdpa") != "sdpa"
                        else ""
                    )
                    + (
                        f" | elementwise {res.settings['elementwise']}"
                        if res.settings.get("elementwise", "torch") != "torch"
                        else ""
                    )
                )
                click.echo(format_summary(res.summary, res.settings))
                if calibrate_path is not None:
                    t = res.calibrated
                    frac = t.fraction_of_peak()
                    terms = ", ".join(
                        f"{k} {v:.1f} ms/TFLOP" + (f" ({frac[k]:.0%} of peak)" if frac[k] else "")
                        for k, v in t.ms_per_tflop.items()
                    )
                    calls = ", ".join(f"{k} {v:.3f}" for k, v in t.layer_call_ms.items())
                    click.echo(
                        f"timing file {calibrate_path}: {terms}; per layer call (ms): {calls}; "
                        f"fit median / P95 error {res.calibration['median_error']:.1%} / "
                        f"{res.calibration['p95_error']:.1%}"
                    )
            for f in res.failures[:20]:
                click.echo(f.message(), err=True)
            if res.failures:
                raise SystemExit(1)
