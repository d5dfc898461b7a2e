"""`marconi advise`: recommend an engine's cache settings for a workload (sim.experiments.advise)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from sim.cli.checks import (
    check_advise,
    refuse_memory_beyond_gpus,
    refuse_ray_address_without_ray,
    refuse_weights_beyond_gpus,
    timing_dtype_warning,
)
from sim.cli.outdir import (
    OutputPath,
    atomic_write,
    check_output_files,
    check_output_folder,
    input_paths,
    model_files,
    model_inputs,
    output_folder,
    refuse_other_kind,
)
from sim.cli.options import PROGRESS_HELP, format_option, with_fields
from sim.cli.run import refuse_unread_knobs
from sim.cli.traces import say_fewer_sessions, say_short_session_range, trace_options
from sim.config import SimConfig, format_gpu_memory, format_memory, format_size
from sim.errors import UsageError, stop_exit_code
from sim.experiments.advise import ENGINES, OBJECTIVES, Problem, advice_json, advise, differences
from sim.experiments.advise.search import STUDY_FILE, cpu_count, objective_value
from sim.experiments.grid import ROW_VERSION
from traces.packing import inputs_digest
from sim.cost import default_timing, gpu_memory_limit, timing_note
from sim.gpus import datasheet_memory, get_gpu, node_words
from sim.trace_options import TRACE_OPTION_KEYS

#: the simulation settings advise takes (as `marconi run`), less --seed (here the study's seed) and
#: the sglang preset's --gpu-memory (here advise's own option: the serving instance's memory, from
#: which the search derives every engine's cache)
_SIM_FIELDS = {f.name: f for f in SimConfig.settings("sim") if f.name not in ("seed", "gpu_memory")}


def sim_options(fn):
    return with_fields(fn, list(_SIM_FIELDS.values()))


def _fixed(kwargs: dict) -> dict:
    """The simulation settings the user gave (they are kept fixed; a knob they set is not searched)."""
    ctx = click.get_current_context()
    out = {}
    for name in list(kwargs):
        if name in _SIM_FIELDS:
            value = kwargs.pop(name)
            if name != "model" and ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
                out[name] = value
    return out


def default_gpu_memory(
    gpu: str | None, tensor_parallel: int = 0, model: str | None = None, timing_file: str | None = None
) -> str:
    """``--gpu-memory``'s default: the memory of ``--gpu`` times the group's GPUs (the preset's
    count when ``tensor_parallel`` is 0, as the timing prices it); with ``--tensor-parallel`` alone,
    that many of the GPU the timing prices (the header's "GPU 4x h200": a group of 4 was given 80GB
    in all, 2.7GB of cache beside 70GB of weights), or of the --timing file's GPU; else 80GB."""
    if not gpu and tensor_parallel and model:
        from sim.cost import read_timing_file  # noqa: PLC0415

        timing = (
            read_timing_file(timing_file, model=model) if timing_file else default_timing(model, None, tensor_parallel)
        )
        gpu = getattr(timing, "device", "") or None
    if not gpu:
        return "80GB"
    n = gpu_memory_limit(model, gpu, tensor_parallel)[0] if model else int(tensor_parallel or 1)
    mem = datasheet_memory(get_gpu(gpu))
    return f"{n}x{mem}" if n > 1 else mem


def refuse_no_cache_on_the_group(engine_name: str, model: str, gpu: str, tensor_parallel: int) -> None:
    """The default --gpu-memory (the --gpu group's) whose engine fraction the weights fill is refused
    naming the smallest --tensor-parallel group that leaves a cache (qwen3-next-80b-a3b's 160GB on
    2x h100, 160GiB: vLLM's 0.9 of it is 154.6GB): it said "--gpu-memory 160GiB leaves no cache", a
    --gpu-memory the user never gave, and no way out."""
    from sim.cli.checks import MAX_NODE_GPUS, _splits, group_nodes  # noqa: PLC0415
    from sim.cost import get_model  # noqa: PLC0415
    from sim.experiments.advise.space import get_engine, weight_bytes  # noqa: PLC0415

    memory = get_engine(engine_name).memory
    n, most = gpu_memory_limit(model, gpu, tensor_parallel)
    spec = get_model(model)
    weights = weight_bytes(spec)
    if memory.cache_bytes(most, weights) > 0:
        return
    each = get_gpu(gpu).memory_bytes
    fits = [
        k for k in range(n + 1, MAX_NODE_GPUS + 1) if memory.cache_bytes(k * each, weights) > 0 and _splits(spec, k)
    ]
    group = (
        f"give --tensor-parallel {fits[0]} (the smallest group that leaves a cache and splits its heads"
        f"{group_nodes(get_gpu(gpu), fits[0])})"
        if fits
        else f"no tensor-parallel group of {gpu} that splits its heads leaves one"
    )
    raise UsageError(
        f"{spec.name}'s {spec.weight_dtype} weights ({format_size(weights)}) leave no cache in "
        f"{memory.flag} {memory.fraction:g} of {n}x {gpu} ({format_gpu_memory(most)}): {group}"
    )


def refuse_group_of_count(gpu_memory: str, count: int, model: str | None) -> None:
    """The group a --gpu-memory NxSIZE spells, refused in one line naming the --gpu-memory where no
    engine runs it (more GPUs than a node holds, heads or Mamba groups it does not split): it said
    "--tensor-parallel 3 does not divide ...", a flag the user never gave, under a note."""
    from sim.cost import get_model, group_spec  # noqa: PLC0415

    try:
        SimConfig.check_ranges({"tensor_parallel": count})
        if model:
            group_spec(get_model(model), count)
    except UsageError as exc:
        raise UsageError(f"--gpu-memory {gpu_memory} spells a group of {count} GPUs: {exc}") from None


def _preset_group(model: str | None, gpu: str | None) -> int:
    """The GPUs the timing prices ``model`` on with ``gpu`` (or none) and no --tensor-parallel (0:
    none known)."""
    from sim.cost import get_model, gpu_count  # noqa: PLC0415

    try:
        if not model:
            return 1
        return gpu_memory_limit(model, gpu, 0)[0] if gpu else gpu_count(get_model(model))
    except UsageError:  # a config.json without a parameter count has no default group
        return 0


def _timing_note(p) -> str:
    """The header's "uncalibrated for GPU x" where --gpu prices time from another device's datasheet."""
    if p.fixed.get("timing_file") or not (p.fixed.get("gpu") or p.fixed.get("tensor_parallel")):
        return ""
    note = timing_note(default_timing(p.model, p.fixed.get("gpu"), p.fixed.get("tensor_parallel", 0)))
    return f" | {note}" if note else ""


def _gpu_words(p, nodes: bool = True) -> str:
    """The header's "| GPU 8x h200" where --gpu or --tensor-parallel names the group priced, and
    (``nodes``) where the group spans servers, what that is: "| GPU 16x h100 = 2 nodes of 8:
    all-reduce over the inter-node link, 50 GB/s each way"."""
    gpu, tp = p.fixed.get("gpu"), p.fixed.get("tensor_parallel", 0)
    if p.fixed.get("timing_file") or not (gpu or tp):
        return ""
    device = default_timing(p.model, gpu, tp).device
    n = gpu_memory_limit(p.model, device, tp)[0]
    words = node_words(get_gpu(device), n) if nodes else ""
    return f" | GPU {n}x {device}" + (f" = {words}" if words else "")


def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_advice(adv, out: Path) -> str:
    from sim.analysis.advise import explain_rows  # noqa: PLC0415

    p, sp = adv.problem, adv.space
    mem = sp.engine.memory
    lines = [
        f"advise --for {p.engine} | model {p.model}{_gpu_words(p)} | --gpu-memory {format_gpu_memory(adv.gpu_bytes)}: "
        f"{sp.ctx.spec.weight_dtype} weights "
        f"{format_size(adv.weight_bytes)}, {mem.flag} {mem.fraction:g} -> cache {format_size(sp.ctx.capacity_bytes)} | "
        f"objective {p.objective} | {adv.trials} trials"
        + (f" | tuned on sessions {adv.parts[0]}, held out {adv.parts[1]}" if adv.parts else "")
        + _timing_note(p),
        "",
        "recommended: " + adv.command(),
        "",
    ]
    head = ("", "engine defaults", "recommended", "difference")
    diff = differences(adv)
    rows = []
    for part, label in (("tuned", "tuned" if adv.parts else "whole trace"), ("held_out", "held out")):
        d, r = getattr(adv.defaults, part), getattr(adv.recommended, part)
        if d is None:
            continue
        dd = diff[part]
        rows.append(
            (
                f"token hit ({label})",
                _pct(d["token_hit_rate"]),
                _pct(r["token_hit_rate"]),
                f"{dd['token_hit_rate'] * 100:+.2f} pts ({_rel(dd['token_hit_rel'])})",
            )
        )
        rows.append(
            (
                f"TTFT p95 ms ({label})",
                _ms(d["ttft_p95_ms"]),
                _ms(r["ttft_p95_ms"]),
                f"{dd['ttft_p95_ms']:+.1f} ms ({_rel(dd['ttft_p95_rel'])})",
            )
        )
        if p.objective == "throughput":  # the objective itself (the rows above were all it showed)
            a, b = objective_value("throughput", d), objective_value("throughput", r)
            rel = (b - a) / a if a else None
            rows.append((f"output tok/s ({label})", f"{a:,.1f}", f"{b:,.1f}", f"{b - a:+,.1f} ({_rel(rel)})"))
    lines += _table(head, rows)
    lines += ["engine defaults: " + flag_text(adv.defaults.flags)]
    lines += ["", "why (tuned part):"]
    lines += _table(("", "engine defaults", "recommended"), explain_rows(adv, "tuned"))
    lines += ["", "reproduce the prediction:", "  " + adv.recommended.run_tuned]
    if adv.recommended.run_held_out:
        lines += ["  " + adv.recommended.run_held_out + "   # held out"]
    lines += ["engine defaults:", "  " + adv.defaults.run_tuned]
    lines += [
        "",
        f"Pareto front (token hit vs TTFT p95), {len(adv.front)} of {adv.trials} trials"
        + (f" -> {adv.figure}" if adv.figure else "")
        + ":",
    ]
    for r in adv.front:
        flags = flag_text(adv.space.flags(r.params))
        lines.append(
            f"  trial {r.number:>3}: {_pct(r.metrics['token_hit_rate']):>7}  {_ms(r.metrics['ttft_p95_ms']):>7} ms  "
            f"{flags}"
        )
    lines += [f"study: {out / 'study.journal'} (rerun the same command to add trials with a larger --trials)"]
    return "\n".join(lines)


def flag_text(flags) -> str:
    """(flag, value) pairs as one line; a boolean flag on is the flag alone, off is left out."""
    return " ".join(f if v == "True" else f"{f} {v}" for f, v in flags if v != "False")


def _rel(x) -> str:
    return "n/a" if x is None or x != x or x in (float("inf"), float("-inf")) else f"{x * 100:+.1f}%"


def _table(head, rows) -> list[str]:
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    return out + [fmt.format(*r) for r in rows]


def register(main: click.Group) -> None:
    @main.command("advise")
    @trace_options
    @click.option(
        "--for",
        "engine_name",
        type=click.Choice(list(ENGINES)),
        required=True,
        help="The engine to tune (its own knobs, named as it names them).",
    )
    @click.option(
        "--gpu-memory",
        default=None,
        help="Memory of the serving instance (80GB = 80e9 B, 80GiB = 80*2^30 B, an H100's; 2x80GiB for two "
        "GPUs); the engine's memory fraction and the bf16 weights are taken off (docs/advise.md) [default: "
        "--gpu's memory (sim/gpus.py, in GiB as its datasheet counts it) times "
        "--tensor-parallel (with --tensor-parallel alone, of the GPU the timing prices), else 80GB].",
    )
    @click.option(
        "--objective",
        type=click.Choice(list(OBJECTIVES)),
        default="token-hit",
        show_default=True,
        help="What to optimise (throughput needs a scheduler that measures it).",
    )
    @click.option("--trials", type=int, default=50, show_default=True, help="Finished trials the study ends with.")
    @click.option("--seed", "study_seed", type=int, default=0, show_default=True, help="Seed of the TPE sampler.")
    @click.option(
        "--holdout",
        type=float,
        default=0.0,
        show_default=True,
        help="Tune on the first 1 - H of the sessions and report both settings on the rest (0 = off).",
    )
    @click.option(
        "--sessions-per-second",
        type=float,
        default=1.0,
        show_default=True,
        help="Closed-loop traces: sessions started per second (session i at i / rate, or Poisson with "
        "--arrival poisson); open-loop traces (mooncake, bailian, marconi-jsonl) keep their own timestamps.",
    )
    @sim_options
    @click.option(
        "--out",
        type=OutputPath(file_okay=False, path_type=Path),
        default=Path("advise"),
        show_default=True,
        help="Study folder (study.journal, advice.json, pareto.png); rerunning resumes.",
    )
    @click.option(
        "--engine",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="local: a process pool; ray: Ray tasks (as `marconi sweep`).",
    )
    @click.option("--workers", type=int, default=None, help="Trials run at once [default: all cores].")
    @click.option(
        "--ray-address", default=None, help="Address of an existing Ray cluster (e.g. auto, ray://host:10001)."
    )
    @format_option("table: the recommendation and its evidence; json: what DIR/advice.json holds.")
    @click.option("--progress/--no-progress", default=True, show_default=True, help=PROGRESS_HELP)
    @click.option(
        "--force",
        is_flag=True,
        help="Replace an advice.json / pareto.png in --out that no study of this folder wrote.",
    )
    def advise_cmd(
        engine_name,
        gpu_memory,
        objective,
        trials,
        study_seed,
        holdout,
        sessions_per_second,
        out,
        engine,
        workers,
        ray_address,
        fmt,
        progress,
        force,
        **kwargs,
    ):
        """Recommend an engine's cache settings for a workload: an Optuna search of the engine's own
        knobs, each trial simulated; prints the flags, the predicted metrics beside the engine's
        defaults, a `marconi run` line that reproduces them, and the Pareto front (DIR/pareto.png).
        """
        if workers is not None and workers < 1:
            raise UsageError("--workers must be >= 1")
        refuse_ray_address_without_ray(engine, ray_address)
        if trials < 1:
            raise UsageError("--trials must be >= 1")
        if not 0 <= holdout < 1:
            raise UsageError(f"--holdout must be in [0, 1), not {holdout}")
        model = kwargs.get("model")
        fixed = _fixed(kwargs)
        group_note = ""
        SimConfig.check_ranges(fixed)  # before the memory's default reads --tensor-parallel
        if gpu_memory is None:  # the catalogue GPU's memory, once per GPU of the group
            if fixed.get("gpu") and model:  # weights the group cannot hold: the group that does, as run says
                refuse_weights_beyond_gpus(model, fixed["gpu"], fixed.get("tensor_parallel", 0))
            gpu_memory = default_gpu_memory(
                fixed.get("gpu"), fixed.get("tensor_parallel", 0), model, fixed.get("timing_file")
            )
            if fixed.get("gpu") and model:  # the engine's memory fraction of the group: the group that leaves a cache
                refuse_no_cache_on_the_group(engine_name, model, fixed["gpu"], fixed.get("tensor_parallel", 0))
        else:
            from sim.experiments.advise.space import gpu_memory_count, parse_gpu_memory  # noqa: PLC0415

            gpu, tp = fixed.get("gpu"), fixed.get("tensor_parallel", 0)
            count = gpu_memory_count(gpu_memory)
            parse_gpu_memory(gpu_memory)  # a memory that is none (2x0GB) is refused before any note
            timed = gpu or not fixed.get("timing_file")  # a --timing file alone prices its own group
            if count and timed and not tp and count != _preset_group(model, gpu):
                # 2x80GB is a two-GPU group (docs/advise.md): it is that group that is priced, not
                # the preset's count of GPUs (with --gpu it was refused as more than 1x h100;
                # without, the recommendation named --tensor-parallel-size 2 and its TTFT was one GPU's)
                refuse_group_of_count(gpu_memory, count, model)
                tp = fixed["tensor_parallel"] = count
                device = gpu or default_timing(model, None, count).device
                # said once the search ran: a refusal after it (no cache left) stays one line
                group_note = (
                    f"note: --gpu-memory {gpu_memory}: priced as a group of {count}x {device} "
                    f"(--tensor-parallel {count})"
                )
            if count and tp and count != tp:  # 2x80GB on a group of 4: which group is priced?
                raise UsageError(
                    f"--gpu-memory {gpu_memory} is the memory of {count} GPUs, --tensor-parallel {tp} a group of "
                    f"{tp}: give the same count (or the total memory, e.g. {format_memory(parse_gpu_memory(gpu_memory))})"
                )
            refuse_memory_beyond_gpus(gpu_memory, parse_gpu_memory(gpu_memory), gpu, tp, model)
        if engine_name in ENGINES:  # a knob none of the engine's presets reads would be dropped silently
            refuse_unread_knobs(list(ENGINES[engine_name].presets.values()), list(fixed))
        if sessions_per_second != 1.0:
            fixed["sessions_per_second"] = sessions_per_second
        trace_kwargs = {k: kwargs.pop(k) for k in TRACE_OPTION_KEYS if k in kwargs}
        check_advise(click.get_current_context(), trace_kwargs.get("trace"), fixed)
        if fixed.get("timing_file"):  # fitted in another dtype than the model runs in: said, used (as run)
            from sim.cost import read_timing_file  # noqa: PLC0415

            path = fixed["timing_file"]
            warning = timing_dtype_warning(path, read_timing_file(path, model=model), model)
            if warning:
                click.echo(warning, err=True)
        problem = Problem(trace_kwargs, engine_name, model, gpu_memory, objective, holdout, study_seed, fixed)
        inputs = input_paths(trace_kwargs.get("trace"), fixed.get("timing_file"), *model_files(model))
        problem.digest = inputs_digest(inputs, ROW_VERSION)
        inputs = inputs + model_inputs(model)  # the model folder too: no output inside it
        check_output_folder(out, "--out", inputs)  # never a journal inside a trace folder
        refuse_other_kind(out, "advise")
        with output_folder(out):
            # advice.json and pareto.png are this folder's study's to replace on a rerun; a folder
            # without a study keeps the user's files of those names unless --force
            ours = (out / STUDY_FILE).is_file()
            check_output_files(
                {out / "advice.json": "--out", out / "pareto.png": "--out"}, force=force or ours, inputs=inputs
            )
            adv = advise(
                problem,
                out,
                trials,
                workers=workers or min(cpu_count(), trials),
                engine=engine,
                ray_address=ray_address,
                progress=progress,
                on_trace=lambda trace: (say_short_session_range(trace), say_fewer_sessions(trace)),
            )
            if group_note:
                click.echo(group_note, err=True)
            if adv.report is not None and adv.report.interrupted:
                click.echo(
                    f"interrupted after {adv.trials} finished trials (kept in {out / 'study.journal'}): "
                    f"rerun the same command to resume",
                    err=True,
                )
                sys.exit(stop_exit_code())
            from sim.analysis.advise import save_pareto  # noqa: PLC0415

            adv.figure = str(out / "pareto.png")
            try:
                atomic_write(out / "pareto.png", lambda tmp: save_pareto(adv, str(tmp)))
            except UsageError as exc:  # matplotlib missing: the advice stands without its figure
                click.echo(f"note: no figure: {exc}", err=True)
                adv.figure = None
            data = advice_json(adv)
            # the header's words on the GPUs priced ("2x b200", "uncalibrated for GPU b200"): JSON had none
            data["gpus"] = _gpu_words(adv.problem, nodes=False).removeprefix(" | GPU ") or None
            # a group beyond one server: what its all-reduce runs over (the header's words)
            data["gpu_nodes"] = _gpu_words(adv.problem).partition(" = ")[2] or None
            data["timing_note"] = _timing_note(adv.problem).removeprefix(" | ")
            text = json.dumps(data, indent=2)
            atomic_write(out / "advice.json", lambda tmp: tmp.write_text(text))
        for number, err in adv.report.failed if adv.report else ():
            click.echo(f"trial {number} failed: {err}", err=True)
        if adv.report and adv.report.pruned:
            click.echo(
                f"note: {len(adv.report.pruned)} sampled combinations the preset refuses were pruned "
                f"(first: {adv.report.pruned[0][1]})",
                err=True,
            )
        if fmt == "json":
            click.echo(json.dumps(data, indent=2))
        else:
            click.echo(format_advice(adv, out))
