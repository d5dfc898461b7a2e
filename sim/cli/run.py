"""`marconi run`: replay one trace under one or more policies and print the comparison."""

from __future__ import annotations

import json
import math
from pathlib import Path
import click
from click.core import ParameterSource

from policies.base import get_preset, policy_knobs
from sim.analysis import table
from sim.cli.help import SectionedCommand
from sim.cli.checks import check_run, simulated_capacities, timing_dtype_warning
from sim.cli.outdir import (
    OutputPath,
    atomic_write_all,
    check_output_files,
    input_paths,
    model_inputs,
    RUN_FOLDER_FILES,
    output_folder,
    refuse_other_kind,
    refuse_parquet_among_sweep_rows,
    remove_earlier_outputs,
)
from sim.cli.traces import trace_from_cli, trace_options
from sim.cli.options import PROGRESS_HELP, format_option, with_fields
from sim.config import SECTIONS, SimConfig, flag_of, format_size, parse_size, section_of
from sim.cost import get_model, gpu_count, model_for, timing_for, timing_note
from sim.engine.metrics import SUMMARY_KEYS, RunSummary
from sim.errors import UsageError
from sim.gpus import get_gpu, node_words
from sim.engine.events import EventLog, event_row, write_events
from sim.engine.simulation import off_grid_message
from sim.replay.measure import read_timing
from sim.simulate import hindsight_preset, simulate

#: the policies `run` compares when --policy is not given
DEFAULT_POLICIES = SimConfig.knob("policy").metadata["lead"]["default"]
#: the files ``run --out DIR`` writes; any of ``RUN_FOLDER_FILES`` there (a replay's steps.parquet
#: too) is refused when it exists, unless --force, and the ones not written are then removed
RUN_OUTPUTS = ("summary.json", "requests.parquet", "occupancy.parquet")
_FIELDS = {f.name: f for f in SimConfig.knobs()}


def parse_alpha(text: str) -> float | str:
    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--alpha must be a number or 'auto', not {text!r}") from None
    if not 0 <= value < math.inf:  # NaN fails both comparisons
        raise UsageError(f"--alpha must be a finite number >= 0 or 'auto', not {text!r}")
    return value


def sim_options(fn):
    """The simulation knobs shared by `run` and `sweep` (single values here), from SimConfig."""
    return with_fields(fn, SimConfig.settings("sim"))


def tuning_options(fn):
    """Knobs of `--alpha auto` and `marconi-oracle` (sim/tuning), from SimConfig."""
    return with_fields(fn, SimConfig.settings("tuning"))


def lead_options(fn):
    """`run`'s first options (--policy, --capacity, --alpha, --sessions-per-second), from SimConfig."""
    return with_fields(fn, SimConfig.settings("lead"), lead=True)


#: settings that some presets' policies declare but the simulator reads for every policy (e.g. a
#: scheduler's prefill chunk): never refused as "does nothing for this policy"
ALWAYS_READ: frozenset[str] = frozenset()


def policy_names(policies: str) -> list[str]:
    """The names of ``--policy a,b,c``: each a known preset, none twice."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise UsageError("--policy needs at least one name")
    for name in names:
        get_preset(name)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--policy lists {', '.join(twice)} more than once (each policy is one row)")
    return names


def refuse_unread_knobs(names: list[str], given: list[str]) -> None:
    """Refuses a policy knob that the user set (``given``: SimConfig field names set explicitly)
    when none of the presets ``names`` reads it (``PolicyPreset.reads``): --alpha with sglang+,
    --block-size with marconi. Knobs every policy reads are never refused."""
    readers = policy_knobs()
    chosen = {get_preset(n).name for n in names}  # an alias reads what its preset reads
    for name in given:
        if name in ALWAYS_READ or name not in readers or chosen & set(readers[name]):
            continue
        flag = flag_of(_FIELDS[name])
        who = ", ".join(readers[name])
        raise UsageError(
            f"{flag} does nothing for {', '.join(names)} (it is read by {who}): leave it out "
            f"or add a policy that reads it"
        )


def explicit_settings(ctx: click.Context, rename: dict | None = None) -> list[str]:
    """SimConfig field names whose option the user gave (not left at its default), in option order."""
    rename = rename or {}
    out = []
    for p in ctx.command.params:
        name = rename.get(p.name, p.name)
        if name in _FIELDS and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None):
            out.append(name)
    return out


def refuse_unusable_blocks(cfg: SimConfig) -> None:
    """Refuses a configuration whose cache cannot hold one block of its preset (KV of the block plus
    a state): every insert would be rejected, a run that means nothing (``--policy lmdeploy
    --block-size 4096`` on a small capacity). The library still runs it (tests probe that corner)."""
    preset = get_preset(cfg.policy)
    if not preset.caching or preset.unlimited:
        return
    spec = model_for(cfg)
    unit = preset.unit_tokens(spec, cfg)
    need = unit * spec.kv_bytes_per_token() + spec.state_bytes()
    if unit > 1 and spec.state_bytes() <= cfg.capacity_bytes < need:  # below one state: the simulator says so
        # a smaller block only where the preset's block is a knob (vllm+'s 32 tokens are not)
        smaller = "a smaller --block-size or " if any(k.name == "block_size" for k in preset.knobs()) else ""
        raise UsageError(
            f"capacity {format_size(cfg.capacity_bytes)} cannot hold one {unit}-token block of "
            f"{cfg.model} with its state ({format_size(need)}) for {cfg.policy}: every insert would be "
            f"rejected; use {smaller}a larger --capacity"
        )


def build_configs(
    policies: str, capacity: str, alpha: str, sessions_per_second: float, check_blocks: bool = True, **knobs
) -> list[SimConfig]:
    """One configuration per policy; ``check_blocks``: each refused when its cache cannot hold one
    of its blocks (off for the default list, which leaves out what the trace's blocks cannot carry
    first: ``_fitting_default_policies``)."""
    names = policy_names(policies)
    cap = parse_size(capacity)
    configs = []
    for name in names:
        cfg = SimConfig(
            policy=name, capacity_bytes=cap, alpha=parse_alpha(alpha), sessions_per_second=sessions_per_second, **knobs
        )
        cfg.validate()
        if check_blocks:
            refuse_unusable_blocks(cfg)
        configs.append(cfg)
    return configs


def fits_trace_blocks(cfg: SimConfig, block_tokens: int) -> bool:
    """Whether ``cfg.policy`` can place its checkpoints on a trace whose symbols stand for
    ``block_tokens`` tokens (its checkpoint step is one token, or a multiple of the block)."""
    step = get_preset(cfg.policy).grid_for(model_for(cfg), cfg)
    return step <= 1 or (step >= block_tokens and step % block_tokens == 0)


def _fitting_default_policies(configs: list[SimConfig], trace) -> tuple[list[SimConfig], str]:
    """The default policy list on a hash-block trace: policies whose checkpoints are finer than
    the trace's blocks (vllm+ every 32 tokens vs Mooncake's 512) are left out, and said so."""
    keep = [c for c in configs if fits_trace_blocks(c, trace.block_tokens)]
    dropped = [c.policy for c in configs if c not in keep]
    if not dropped or not keep:
        return configs, ""
    return keep, (
        f"{', '.join(dropped)} left out: checkpoints finer than the trace's {trace.block_tokens}-token blocks"
    )


def refuse_unfitting_policies(configs: list[SimConfig], trace) -> None:
    """One line for the first named policy whose checkpoints are finer than (or off) the trace's
    blocks, before anything is simulated (the simulation refuses it too, but only when its turn
    came: `--policy sglang,vllm` on Mooncake simulated sglang first)."""
    for c in configs:
        if not fits_trace_blocks(c, trace.block_tokens):
            step = get_preset(c.policy).grid_for(model_for(c), c)
            raise UsageError(off_grid_message(c.policy, step, trace.block_tokens))


def json_row(cfg: SimConfig, summary: RunSummary, sat: table.Saturation | None = None) -> dict:
    """One policy's `--format json` record: the table's metrics by name (hit rates, FLOPs saved,
    TTFT / TPOT / end-to-end / queueing p50 and p95, throughput, mean batch size, preemptions),
    rejected inserts, whether the engine was saturated and the rate it sustains (``saturated``,
    ``sustainable_rps``: null for fewer than 6 finished requests; the rate only when saturated),
    and the alpha used (the static one, or the one the tuner chose; null where alpha does not apply
    or the tuner chose SGLang+'s LRU, see ``tuned_choice``), and the timing's device as summary.json
    has it (``timing_device``, ``timing_note``: "uncalibrated for GPU x" where the table's header says
    so)."""
    row = {k: getattr(summary, k) for k in SUMMARY_KEYS}
    if not summary.steps:  # fcfs steps no batches: a mean batch size of 0.0 read as a number (the table's '-')
        row["batch_size_mean"] = None
    row["rejected"] = int(summary.rejected_inserts)
    row["saturated"] = None if sat is None else bool(sat.saturated)
    row["sustainable_rps"] = float(sat.served_rps) if sat is not None and sat.saturated else None
    choice = summary.tuning.tuned_choice if summary.tuning is not None else None
    if not get_preset(cfg.policy).uses_alpha:
        alpha = None
    elif choice is not None:
        tuned = summary.tuning.tuned_alpha
        alpha = None if tuned is None or math.isnan(tuned) else float(tuned)
    else:
        alpha = None if isinstance(cfg.alpha, str) else float(cfg.alpha)
    row["alpha"] = alpha
    row["tuned_choice"] = choice
    row.update(timing_row(cfg))  # summary.json's words on the GPU priced: "uncalibrated for GPU x"
    return row


def _finite(value):
    """NaN (a tuned alpha when the tuner chose LRU) as null: summary.json stays standard JSON."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def run_timing_note(cfg: SimConfig) -> str:
    """The header's word on a timing scaled from another GPU's figures ("uncalibrated for GPU x")
    and on a model outside the widths the calibration was fitted on; "" when the run is timed by a
    calibration of its device that covers the model, or by a --timing file."""
    if cfg.timing_file:
        return ""
    t = timing_for(cfg)
    notes = [timing_note(t)]  # --ttft-model jamba still decodes (and schedules) at the --gpu's figures
    if cfg.ttft_model == "jamba":
        notes.insert(0, "TTFT from the paper's Jamba-1.5-Mini table (A100)")
    elif hasattr(t, "coverage_note"):  # a calibrated timing names the widths it was fitted on
        notes.append(t.coverage_note(model_for(cfg)).removeprefix("timing: "))
    return "; ".join(n for n in notes if n)


def run_gpu_words(cfg: SimConfig) -> str:
    """The header's word on the GPUs priced when --gpu or --tensor-parallel is given ("GPU 2x h100"),
    or on the --timing file that prices them ("timing FILE"); "" for the preset's default timing
    (its header said nothing of them before either)."""
    if cfg.timing_file:  # the user's own timing: its file is named (and the group it is split over)
        tp = int(cfg.tensor_parallel or 0)
        return f"timing {cfg.timing_file}" + (f" on {tp} GPUs (tensor parallel)" if tp > 1 else "")
    if not (cfg.gpu or cfg.tensor_parallel):
        return ""
    n = int(cfg.tensor_parallel) or gpu_count(get_model(cfg.model), cfg.gpu)
    device = timing_for(cfg).device
    # a group beyond one server says so: its all-reduce runs over the network, not NVLink
    nodes = node_words(get_gpu(device), n) if device else ""
    return f"GPU {n}x {device}" + (f" = {nodes}" if nodes else "")


def timing_row(cfg: SimConfig) -> dict:
    """summary.json's record of the timing's device: the GPU priced and whether it is calibrated."""
    if cfg.timing_file or cfg.ttft_model != "flops":
        return {"timing_device": None, "timing_note": ""}
    t = timing_for(cfg)
    return {"timing_device": t.device or None, "timing_note": timing_note(t)}


def counted(n: int, noun: str, thousands: bool = False) -> str:
    """``1 session``, ``2 sessions`` (the header said "1 sessions"); ``thousands``: ``1,235``."""
    number = f"{n:,}" if thousands else str(n)
    return f"{number} {noun}" + ("" if n == 1 else "s")


def _scheduler(cfg: SimConfig) -> str:
    """The header's word on the scheduler of a des run: continuous batching (the default) or fcfs
    with its servers (an fcfs run said `des` alone, as when fcfs was the default); nothing for
    ``--mode sequential``, the artifact's replay, which has none."""
    if cfg.mode != "des":
        return ""
    if cfg.effective_scheduler == "fcfs":
        return f", fcfs ({cfg.servers} server{'' if cfg.servers == 1 else 's'})"
    return f", continuous batching ({cfg.max_num_batched_tokens} tokens, {cfg.max_num_seqs} seqs per step)"


def format_table(rows: list[RunSummary], columns=table.DEFAULT_COLUMNS) -> str:
    """The run's table: a line per policy, the ``columns`` (summary keys) under a two-line header."""
    return table.format_table([r.to_dict() for r in rows], columns)


def parse_columns(text: str) -> list[str]:
    """``--columns``: default, all, or a comma list of column names; one line on a bad name."""
    try:
        return table.parse_columns(text)
    except ValueError as exc:
        raise UsageError(
            f"--columns: unknown column {str(exc)!r}; use default, all or a comma list of: {table.column_names()}"
        ) from None


def run_saturation(res) -> table.Saturation | None:
    """Whether one run's engine kept up with its offered load (its per-request records)."""
    req = res.requests
    return table.saturation(req["arrival_s"], req["queue_s"], req["e2e_s"])


def saturation_line(trace, configs, results, sats, time_scale: float | None = None) -> str:
    """One warning line when the queue grows through the run, with the rate the engine sustains."""
    if not any(s is not None and s.saturated for s in sats):
        return ""
    cfg0 = configs[0]
    n = len(trace.requests)
    if trace.closed_loop:
        per_session = n / max(trace.n_sessions, 1)
        return table.saturation_warning(
            list(zip([c.policy for c in configs], sats)),
            cfg0.sessions_per_second * per_session,
            cfg0.sessions_per_second,
            per_session,
        )
    arrivals = results[0][1].requests["arrival_s"]
    span = float(arrivals.max() - arrivals.min())
    offered = n / span if span > 0 else math.inf
    return table.saturation_warning(list(zip([c.policy for c in configs], sats)), offered, None, 1.0, time_scale or 1.0)


#: the share of a policy's hit tokens reused after preemptions from which the run says so
PREEMPTION_NOTE_SHARE = 0.05


def preemption_note(rows) -> str:
    """One line when preempted requests' lookups hit past what they shared at their first lookup
    (their own chunks, published before the preemption: SGLang's, or requests served since) for at
    least ``PREEMPTION_NOTE_SHARE`` of a policy's hit tokens: that reuse is in the token hit rate,
    as an engine's cache counts it, but it is not reuse across requests (``--format json`` and
    summary.json carry ``hit_after_preemption`` always)."""
    parts = [
        f"{r.policy} {r.hit_after_preemption / r.hit_tokens:.1%}"
        for r in rows
        if r.hit_tokens and r.hit_after_preemption >= PREEMPTION_NOTE_SHARE * r.hit_tokens
    ]
    if not parts:
        return ""
    return (
        "note: share of hit tokens reused by preempted requests past what they shared at their first lookup "
        f"(their own published chunks, or requests served since): {', '.join(parts)}"
    )


def running_cap_note(rows, configs) -> str:
    """One line when an engine ran fewer requests at once than ``--max-num-seqs`` (the header's
    figure): SGLang caps them at its mamba pool's states // states per running request."""
    parts = [
        f"{r.policy} {r.running_cap}"
        for r, c in zip(rows, configs)
        if 0 < r.running_cap < c.max_num_seqs and c.effective_scheduler == "continuous"
    ]
    if not parts:
        return ""
    return (
        "note: at most this many requests ran at once, below --max-num-seqs (the engine's own cap: "
        f"SGLang's mamba pool states // states per running request): {', '.join(parts)}"
    )


def aborted_note(rows) -> str:
    """One line when an engine aborted requests at arrival, their prompt longer than it takes
    (SGLang's ``max_req_input_len``: its KV pool less 6 tokens): they are left out of the hit
    rates (``aborted_requests`` in ``--format json`` and summary.json, ``aborted`` in
    requests.parquet)."""
    parts = [f"{r.policy} {r.aborted_requests}" for r in rows if r.aborted_requests]
    if not parts:
        return ""
    return (
        "note: requests aborted at arrival, their prompt longer than the engine takes (its KV pool "
        f"less 6 tokens), left out of the hit rates: {', '.join(parts)}"
    )


def overshoot_note(rows, configs) -> str:
    """One line when the continuous scheduler ran requests beyond --capacity (a request too large
    to fit even alone runs anyway, docs/batching.md): the table said nothing of the memory no such
    engine has (qwen3.5-9b at 100MB: 132MB charged, 4,799 steps over)."""
    parts = [
        f"{r.policy} {r.memory_overshoots:,} steps, peak {format_size(r.peak_charged_bytes)}"
        for r, c in zip(rows, configs)
        if r.memory_overshoots and c.effective_scheduler == "continuous"
    ]
    if not parts:
        return ""
    return (
        f"note: running requests too large to fit even alone ran beyond --capacity "
        f"{format_size(configs[0].capacity_bytes)} (charged, not refused): {', '.join(parts)}"
    )


#: the sections of `marconi run --help`, in order
RUN_SECTIONS = (
    "Trace",
    "Policies and cache",
    "Engine, arrivals and timing",
    "Engine preset knobs (each read by the policies named in its help)",
    "Tuning (--alpha auto, marconi-oracle)",
    "Output",
)
_OUTPUT = {"out", "events_path", "force", "fmt", "columns", "progress"}
#: SimConfig's sections (sim.config.SECTIONS) -> their headings
_SECTION = dict(zip(SECTIONS, RUN_SECTIONS[1:5]))
#: run's parameter names of SimConfig knobs named otherwise (``setting(lead=...)``)
_KNOB_OF = {f.metadata["lead"].get("name", f.name): f.name for f in SimConfig.settings("lead")}


def run_section(param: click.Parameter) -> str:
    """The `--help` section of one of `run`'s options (a knob's: its ``section``, sim.config)."""
    from sim.trace_options import TRACE_OPTION_KEYS  # noqa: PLC0415

    name = _KNOB_OF.get(param.name, param.name)
    if name in TRACE_OPTION_KEYS:
        return RUN_SECTIONS[0]
    if name in _OUTPUT:
        return RUN_SECTIONS[5]
    if name not in _FIELDS:  # click's own (--help): where it is met
        return RUN_SECTIONS[2]
    return _SECTION[section_of(name)]


def register(main: click.Group) -> None:
    @main.command("run", cls=SectionedCommand, section_of=run_section, section_order=RUN_SECTIONS)
    @trace_options
    @lead_options
    @sim_options
    @tuning_options
    @click.option(
        "--out",
        type=OutputPath(file_okay=False, path_type=Path),
        default=None,
        help="Write summary.json, per-request requests.parquet and the cache's occupancy.parquet here.",
    )
    @click.option(
        "--events",
        "events_path",
        type=OutputPath(dir_okay=False, path_type=Path),
        default=None,
        help="Write the engine's event stream (lookup, prefill, decode, admit, evict, evict_kv, "
        "reject, and with continuous batching arrive and step; one row per event, a policy column) as JSON Lines "
        "(.jsonl) or parquet (.parquet).",
    )
    @click.option(
        "--force",
        is_flag=True,
        help="Replace the files of --out and --events when they exist (never an input of the run).",
    )
    @format_option("table: a row per policy, the --columns; json: every summary key, an object per policy.")
    @click.option(
        "--columns",
        default="default",
        show_default=True,
        help="Table columns: default, all, misses (missed tokens by cause), or a comma list of summary "
        "keys (default inside the list adds the default set), e.g. default,e2e_p95_ms,output_tokens_per_s. Keys: "
        + ", ".join(c.key for c in table.METRICS)
        + ".",
    )
    @click.option("--progress/--no-progress", default=True, show_default=True, help=PROGRESS_HELP)
    def run(policies, capacity, alpha, sessions_per_second, out, events_path, force, fmt, columns, progress, **kwargs):
        """Replay a trace (default: 100 real ShareGPT sessions) under each policy.

        \b
        Examples:
          marconi run
          marconi run --policy vanilla,vllm+,sglang+,marconi --capacity 2GB --alpha 1
          marconi run --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB
          marconi run --policy sglang,vllm --model qwen3.5-9b --columns all --format json
          marconi run --scheduler fcfs --sessions-per-second 5 --out results/run

        Table columns: cache hit token = prompt tokens served from the cache / all prompt tokens,
        request = share of requests that reuse at least one cached token; TTFT = time to first
        token; TPOT = time per output token after the first; queue = arrival to prefill start;
        served = finished requests per second; batch = requests per engine step; preempted =
        running requests preempted for memory; evictions = cache entries evicted; rejected =
        inserts that did not fit. --columns all adds FLOPs saved, end-to-end latency and more.
        A warning line says when the offered load exceeds what the engine serves.
        """
        # outputs are checked (existing files, inputs) and their folders created (or refused) before
        # the trace is loaded and simulated
        files = [(out / name, "--out") for name in RUN_FOLDER_FILES] if out is not None else []
        if events_path is not None:
            files.append((events_path, "--events"))  # a list: --events D/summary.json is refused, not merged
        refuse_other_kind(out, "run")
        refuse_parquet_among_sweep_rows(events_path, "--events")
        with output_folder(out), output_folder(events_path.parent if events_path else None, "--events"):
            inputs = input_paths(kwargs.get("trace"), kwargs.get("timing_file")) + model_inputs(kwargs.get("model"))
            check_output_files(files, force=force, inputs=inputs)
            if kwargs.get("timing_file"):  # a bad timing file is refused before the trace is loaded
                read_timing(kwargs["timing_file"], model=kwargs.get("model"))
            _run(policies, capacity, alpha, sessions_per_second, out, events_path, fmt, columns, progress, **kwargs)

    def _run(policies, capacity, alpha, sessions_per_second, out, events_path, fmt, columns, progress, **kwargs):
        from tqdm import tqdm  # noqa: PLC0415 - progress bar, loaded only when running

        if events_path is not None and events_path.suffix not in (".jsonl", ".json", ".parquet"):
            raise UsageError(f"--events {events_path}: the name must end in .jsonl or .parquet")
        refuse_unread_knobs(policy_names(policies), explicit_settings(click.get_current_context()))
        check_run(click.get_current_context(), policies, capacity, alpha, sessions_per_second, kwargs)
        if kwargs.get("timing_file"):  # fitted in another dtype: used as it is (exit unchanged), as replay says
            # it; after the checks, so that a refusal (--tensor-parallel with a CPU fit) is one line
            path = kwargs["timing_file"]
            warning = timing_dtype_warning(path, read_timing(path, model=kwargs.get("model")), kwargs.get("model"))
            if warning:
                click.echo(warning, err=True)
        columns = parse_columns(columns)
        time_scale = kwargs.get("time_scale")  # a trace option: trace_from_cli pops it
        trace = trace_from_cli(kwargs, progress)
        default = click.get_current_context().get_parameter_source("policies") == ParameterSource.DEFAULT
        configs = build_configs(policies, capacity, alpha, sessions_per_second, check_blocks=not default, **kwargs)
        simulated_capacities(configs, trace)  # --gpu-memory's bytes where the engine splits it
        left_out = ""
        if default:  # the policies the trace's blocks carry, then each one's block against the capacity
            configs, left_out = _fitting_default_policies(configs, trace)
            for cfg in configs:
                refuse_unusable_blocks(cfg)
        else:  # a named policy the trace's blocks cannot carry is refused before any policy runs
            refuse_unfitting_policies(configs, trace)
        bound = next((b for b in map(hindsight_preset, (c.policy for c in configs)) if b is not None), None)
        if events_path is not None and bound is not None:
            raise UsageError(f"--events does not apply to {bound.name} (it runs one simulation per alpha)")
        results = []
        event_rows: list[dict] = []
        bar = tqdm(
            total=len(trace.requests) * len(configs), unit="req", disable=not progress, desc="simulating", leave=False
        )
        try:
            for cfg in configs:
                bar.set_postfix_str(cfg.policy)
                log = EventLog() if events_path is not None else None
                results.append((cfg, simulate(trace, cfg, progress=bar, observers=(log,) if log else ())))
                if log is not None:
                    event_rows.extend(event_row(ev, policy=cfg.policy) for ev in log.events)
        finally:
            bar.close()
        rows = [res.summary for _, res in results]
        sats = [run_saturation(res) for _, res in results]
        warning = "\n".join(
            w
            for w in (
                saturation_line(trace, configs, results, sats, time_scale),
                preemption_note(rows),
                running_cap_note(rows, [cfg for cfg, _ in results]),
                aborted_note(rows),
                overshoot_note(rows, [cfg for cfg, _ in results]),
            )
            if w
        )
        if fmt == "json":
            click.echo(json.dumps([json_row(cfg, res.summary, s) for (cfg, res), s in zip(results, sats)], indent=2))
            if left_out:
                click.echo(f"note: {left_out}", err=True)
            if warning:
                click.echo(warning, err=True)
        else:
            cfg0 = configs[0]
            rate = f"{sessions_per_second:g} session{'' if sessions_per_second == 1 else 's'}/s"
            arrivals = f"{rate} ({cfg0.arrival})" if trace.closed_loop else "open-loop arrivals from the trace"
            alpha_used = any(get_preset(c.policy).uses_alpha for c in configs)
            note = run_timing_note(cfg0)
            gpus = run_gpu_words(cfg0)
            click.echo(
                f"trace {trace.name}: {counted(len(trace.requests), 'request')}, {counted(trace.n_sessions, 'session')} | "
                f"model {cfg0.model} | capacity {format_size(cfg0.capacity_bytes)} | "
                + (f"{gpus} | " if gpus else "")
                + f"{cfg0.mode}{_scheduler(cfg0)} | {arrivals}"
                + (f" | alpha {cfg0.alpha}" if alpha_used else "")
                + (f" | {left_out}" if left_out else "")
                + (f" | {note}" if note else "")
            )
            click.echo(format_table(rows, columns))
            for r in rows:
                t = r.tuning
                if t is None or t.tuned_choice is None:
                    continue
                if getattr(t, "tuning_rounds", 0):
                    click.echo(
                        f"{r.policy}: alpha auto -> {t.tuned_choice} (adopted at request "
                        f"{t.tuned_at_request}; {getattr(t, 'tuning_switches', 0)} switches in "
                        f"{t.tuning_rounds} tuning rounds)"
                    )
                elif hindsight_preset(r.policy) is not None:
                    click.echo(f"{r.policy}: best static alpha in hindsight {t.tuned_choice}")
                else:  # the live tuner never decided: it said "best static alpha in hindsight" (no oracle ran)
                    first = getattr(t, "first_eviction_request", None)
                    why = (
                        "the cache never evicted" if first is None else "too few requests after the cache first filled"
                    )
                    click.echo(f"{r.policy}: alpha auto stayed at {t.tuned_choice} (not tuned: {why})")
            if warning:
                click.echo(warning)
        # every output as one set: an interrupted run leaves all of them or none (sim.cli.outdir)
        writes = _output_writes(out, trace, results) if out is not None else []
        if events_path is not None:
            writes.append((events_path, lambda tmp: write_events(event_rows, tmp)))
        if writes:
            # a replay's steps.parquet (--force) is not this run's
            earlier = (lambda: remove_earlier_outputs(out, RUN_OUTPUTS)) if out is not None else None
            atomic_write_all(writes, before_commit=earlier)

    def _output_writes(out: Path, trace, results) -> list:
        import pandas as pd  # noqa: PLC0415 - only --out writes tables

        out.mkdir(parents=True, exist_ok=True)
        summary = [
            _finite({**cfg.as_row(), "trace": trace.name, **timing_row(cfg), **res.summary.to_dict()})
            for cfg, res in results
        ]
        text = json.dumps(summary, indent=2, allow_nan=False)
        writes = [(out / "summary.json", lambda tmp: tmp.write_text(text))]
        for name in ("requests", "occupancy"):  # one table each, all policies, policy column first
            frames = [getattr(res, name).assign(policy=cfg.policy) for cfg, res in results]
            table = pd.concat(frames, ignore_index=True)
            table = table[["policy", *[c for c in table.columns if c != "policy"]]]
            writes.append((out / f"{name}.parquet", lambda tmp, t=table: t.to_parquet(tmp, index=False)))
        return writes
