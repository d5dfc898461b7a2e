"""`marconi sweep`: every `marconi run` knob takes lists and ranges.

The sweep's options are derived from the `run` command: each valued option of `run` becomes a
list option here (comma lists, inclusive ``start:stop[:step]`` ranges, or the flag repeated);
on/off flags pass through unchanged. A knob added to `run` (and to SimConfig) is thus sweepable
without touching this file.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from itertools import product
from pathlib import Path

import click
from click.core import ParameterSource

from sim.cli.options import PROGRESS_HELP
from sim.cli.checks import (
    check_configs,
    given_trace_options,
    refuse_missing_trace_paths,
    refuse_ray_address_without_ray,
    timing_dtype_warning,
)
from sim.cli.outdir import (
    OutputPath,
    check_output_folder,
    input_paths,
    model_files,
    model_inputs,
    output_folder,
    refuse_other_kind,
)
from sim.cli.report import SORT_HELP, sort_key
from sim.cli.traces import say_short_session_range
from sim.cli.help import SectionedCommand
from sim.cli.run import (
    RUN_SECTIONS,
    counted,
    explicit_settings,
    fits_trace_blocks,
    refuse_unread_knobs,
    refuse_unusable_blocks,
    run_section,
)
from sim.config import SimConfig, flag_of, format_size
from sim.cost import default_timing, model_for, read_timing_file, timing_note
from sim.engine.simulation import off_grid_message
from policies.base import get_preset
from sim.errors import UsageError, stop_exit_code
from sim.experiments.grid import check_grid_size, expand_grid, grid_size, parse_values, unread_knobs
from sim.experiments.runners import describe, fit_workers, run_sweep, task_trace
from sim.experiments.grid import ROW_VERSION
from sim.experiments.store import BAD, DONE, STALE, check_layout, stored_status
from traces.packing import inputs_digest
from sim.trace_options import TRACE_OPTION_KEYS
from traces.hashblock import BLOCK_TOKENS
from traces.registry import split_spec

# `run` options that are about printing / writing one run, not knobs
_NOT_KNOBS = {"out", "events_path", "force", "fmt", "columns", "progress"}
#: the end-of-sweep table shows at most this many configurations (`marconi report OUT` shows all)
TABLE_ROWS = 20
# run option name -> SimConfig field
_RENAME = {"policies": "policy", "capacity": "capacity_bytes"}
# grids at least this large print a line before they are built (about a second per thousand)
SLOW_GRID = 2_000
#: stored results from which a rerun's check of them (about 8 ms each: every row file read, its
#: details too with --save-requests) shows a bar: 40,000 were minutes before `already done` was said
CHECK_BAR = 500


def _checking(tasks, progress: bool):
    """``tasks``, with a bar on stderr while their stored results are checked (a long rerun)."""
    if not progress or len(tasks) < CHECK_BAR:
        return tasks
    from tqdm import tqdm  # noqa: PLC0415

    return tqdm(tasks, desc="checking stored results", unit="cfg", leave=False)


# string knobs whose value is itself a list or range: taken verbatim (repeat the flag to sweep them)
# (TensorRT-LLM's snapshot offsets are one comma list each)
_VERBATIM = {"alpha_grid", "additional_snapshot_offsets_from_start", "additional_snapshot_offsets_from_end"}


def _kind(param: click.Option) -> str:
    if param.name in _VERBATIM:
        return "raw"
    if param.name == "capacity":
        return "size"
    if param.name == "alpha":
        return "alpha"
    if param.name == "trace":
        return "trace"
    if isinstance(param.type, click.types.IntParamType):
        return "int"
    if isinstance(param.type, click.types.FloatParamType):
        return "float"
    return "str"


def _flag(param: click.Option) -> str:
    return max(param.opts, key=len)


def _default(param: click.Option):
    d = param.default
    return d() if callable(d) else d


class SweepSpec:
    """The run command's knobs, split into list options and pass-through flags."""

    def __init__(self, run_cmd: click.Command) -> None:
        self.trace_keys = set(TRACE_OPTION_KEYS)
        self.sim_fields = set(SimConfig.field_names())
        self.listed: list[click.Option] = []
        self.passed: list[click.Option] = []
        for p in run_cmd.params:
            if not isinstance(p, click.Option) or p.name in _NOT_KNOBS:
                continue
            (self.passed if p.is_flag or p.count else self.listed).append(p)

    def click_params(self) -> list[click.Option]:
        params = []
        for p in self.listed:
            default = _default(p)
            help_ = (p.help or "").rstrip(".")
            # one default in the help: the one the knob's own help states, else the value
            shown = "" if "[default:" in help_ or default in (None, "") else f" [default: {default}]"
            form = {"str": "a,b,c", "trace": "a,b,c", "raw": "one value; repeat the flag to sweep"}.get(
                _kind(p), "a,b,c or start:stop[:step]"
            )
            params.append(
                click.Option(
                    [*p.opts, p.name],
                    multiple=True,
                    metavar="LIST",
                    show_default=False,
                    help=f"{help_}. Values: {form}{shown}",
                )
            )
        return params + self.passed

    def axes(self, kwargs: dict) -> tuple[dict, dict]:
        """(trace axes, sim axes): knob name -> list of typed values."""
        trace_axes, sim_axes = {}, {}
        for p in self.listed:
            raw = kwargs.get(p.name) or ()
            flag = _flag(p)
            if raw and _kind(p) == "raw":
                values = list(dict.fromkeys(raw))
            elif raw:
                texts, values = list(raw), []
                if _default(p) == "" and any(not str(t).strip() for t in texts):
                    # run's "empty = all" (--session-range, --state-pool, --gpu-memory) is a point of the
                    # grid too: `--session-range ''` said "no values given", beside another was dropped
                    values, texts = [""], [t for t in texts if str(t).strip()]
                values += parse_values(texts, _kind(p), flag) if texts else []
                # two spellings of one value (--gpu h100,H100) are one point of the grid
                values = list(dict.fromkeys(self._convert(p, v, flag) for v in values))
            else:
                values = [_default(p)]
                if _kind(p) == "size":
                    values = parse_values(str(values[0]), "size", flag)
                elif _kind(p) == "alpha":
                    values = parse_values(str(values[0]), "alpha", flag)
                elif p.name == "policies":
                    values = parse_values(str(values[0]), "str", flag)
            if p.name == "tuning_workers" and not raw:
                continue  # make_task runs the tuner serially inside each sweep worker
            self._place(p, flag, values, raw, trace_axes, sim_axes)
        for p in self.passed:
            self._place(p, _flag(p), [kwargs.get(p.name, _default(p))], (), trace_axes, sim_axes)
        return trace_axes, sim_axes

    def _convert(self, p: click.Option, v, flag: str):
        if _kind(p) in ("size", "alpha", "trace", "raw"):
            return v
        try:
            return p.type.convert(v, p, None)
        except click.BadParameter as exc:
            raise UsageError(f"{flag}: {exc.format_message()}") from None

    def _place(self, p, flag, values, raw, trace_axes, sim_axes) -> None:
        name = _RENAME.get(p.name, p.name)
        if p.name in self.trace_keys:
            trace_axes[p.name] = values
        elif name in self.sim_fields:
            sim_axes[name] = values
        elif raw or values != [_default(p)]:
            raise UsageError(f"{flag} is not supported by `marconi sweep` yet")


def off_block_message(task) -> str:
    """Why the task's policy cannot run on its hash-block trace (checkpoints finer than, or off,
    its blocks), as `marconi run` refuses it before anything runs; "" when it can. The sweep met it
    only when its turn came, the configurations before it simulated (--trace
    synthetic:chat,mooncake:sample --policy sglang+,vllm+, or the default policy list)."""
    spec = str(task.trace_kwargs.get("trace", ""))
    kind = split_spec(spec)[0]
    if kind not in BLOCK_TOKENS or task.trace_kwargs.get("hash_block_tokens"):
        return ""
    block = BLOCK_TOKENS[kind]
    if fits_trace_blocks(task.config, block):
        return ""
    step = get_preset(task.config.policy).grid_for(model_for(task.config), task.config)
    return f"--trace {spec}: {off_grid_message(task.config.policy, step, block)}"


def _fit_default_policies(trace_axes: dict, sim_axes: dict) -> str:
    """On hash-block traces only (Mooncake, Bailian), the default policy list leaves out policies
    whose checkpoints are finer than the blocks (vllm+), as `marconi run` does; returns the note."""
    blocks = set()
    for spec in trace_axes.get("trace", []):
        kind = split_spec(str(spec))[0]
        if kind not in BLOCK_TOKENS:
            return ""  # a token trace in the grid: every default policy applies to it
        blocks.add(BLOCK_TOKENS[kind])
    base = SimConfig()
    combos = list(product(sim_axes.get("model", [base.model]), sim_axes.get("block_size", [base.block_size]), blocks))
    names = sim_axes.get("policy", [])
    keep = [
        p for p in names if all(fits_trace_blocks(SimConfig(policy=p, model=m, block_size=b), B) for m, b, B in combos)
    ]
    if not keep or len(keep) == len(names):
        return ""
    sim_axes["policy"] = keep
    dropped = [p for p in names if p not in keep]
    return f"{', '.join(dropped)} left out: checkpoints finer than the trace's {'/'.join(map(str, sorted(blocks)))}-token blocks"


def grid_summary(trace_axes: dict, sim_axes: dict, n_configs: int) -> str:
    axes = {**trace_axes, **sim_axes}
    varying = [f"{k}({len(v)})" for k, v in axes.items() if len(v) > 1]
    points = 1
    for v in axes.values():
        points *= len(v)
    head = " x ".join(varying) if varying else "one point"
    unread = _unread_words(sim_axes)
    why = "; ".join(unread) if unread else "policies that ignore alpha run once"
    note = "" if points == n_configs else f" ({points:,} grid points; {why})"
    return (
        f"grid: {head} = {counted(n_configs, 'configuration', thousands=True)}{note}{_fixed_words(trace_axes, sim_axes)}"
        + (_timing_notes(sim_axes))
    )


def _unread_words(sim_axes: dict) -> list[str]:
    """Each policy of the grid that runs once over a knob's values because it does not read that
    knob ("vllm runs once over --gpu-memory, which it does not read"), policies without alpha
    over an alpha axis ("policies that ignore alpha run once")."""
    policies = sim_axes.get("policy", [SimConfig().policy])
    words = []
    if len(sim_axes.get("alpha", [])) > 1 and not all(get_preset(p).uses_alpha for p in policies):
        words.append("policies that ignore alpha run once")
    fields_ = {f.name: f for f in SimConfig.knobs()}
    for name, values in sim_axes.items():
        if name in ("alpha", "policy") or len(values) < 2 or name not in fields_:
            continue
        idle = [p for p in policies if name in unread_knobs(p)]
        if idle:
            verb = "runs once over {}, which it does not" if len(idle) == 1 else "run once over {}, which they do not"
            words.append(f"{', '.join(idle)} {verb.format(flag_of(fields_[name]))} read")
    return words


def _fixed_words(trace_axes: dict, sim_axes: dict) -> str:
    """What every configuration of the grid shares, as the run header says it: the trace, the model,
    the capacity (unless --gpu-memory replaces it) and the GPU, each where the grid does not vary it."""
    base = SimConfig()
    words = []
    for name, axis, default, show in (
        ("trace", trace_axes.get("trace"), "sharegpt", str),
        ("model", sim_axes.get("model"), base.model, str),
        ("capacity", sim_axes.get("capacity_bytes"), base.capacity_bytes, format_size),
        ("GPU", sim_axes.get("gpu"), None, str),
    ):
        values = axis or [default]
        if len(values) == 1 and values[0] not in (None, ""):
            if name == "capacity" and any(sim_axes.get("gpu_memory") or []):
                continue
            words.append(f"{name} {show(values[0])}")
    return "".join(f" | {w}" for w in words)


def _timing_notes(sim_axes: dict) -> str:
    """The "uncalibrated for GPU x" of each --gpu of the grid whose time is scaled from another
    device's datasheet (runs timed by a --timing file are left out)."""
    if any(sim_axes.get("timing_file", [None])) or not any(sim_axes.get("gpu", [None])):
        return ""
    notes = set()
    for m in sim_axes.get("model", [SimConfig().model]):
        for g in sim_axes.get("gpu", [None]):
            for tp in sim_axes.get("tensor_parallel", [0]):
                try:
                    notes.add(timing_note(default_timing(m, g, int(tp or 0))))
                except UsageError:  # the run refuses it with its own line
                    pass
    return "".join(f" | {n}" for n in sorted(notes - {""}))


def _digests():
    """task -> the digest of what its row is computed from: the content of its trace's files, of
    its timing file and of its model's config.json (--model PATH), and the code's row version (each
    distinct input hashed once)."""
    memo: dict = {}

    def digest(task) -> str:
        key = (str(task.trace_kwargs.get("trace")), task.config.timing_file or "", task.config.model)
        if key not in memo:
            memo[key] = inputs_digest(input_paths(key[0], key[1] or None, *model_files(key[2])), ROW_VERSION)
        return memo[key]

    return digest


def summary_table(out: Path, tasks, metric: str) -> str:
    """The sweep's configurations as a table, best first by ``metric`` (at most TABLE_ROWS lines;
    `marconi report OUT` prints them all, and as CSV or JSON)."""
    from sim.analysis.report import format_report, load  # noqa: PLC0415 - pandas, after the runs
    from sim.experiments.store import row_files  # noqa: PLC0415

    if not row_files(out):  # `--limit 0` on a new folder: nothing ran (load's "no results" was exit 2)
        return "no finished configuration to show"
    ids = {t.config_id for t in tasks}
    df = load(out)
    df = df[df["config_id"].isin(ids)]
    if df.empty:
        return "no finished configuration to show"
    text = format_report(df, metric, limit=TABLE_ROWS)
    # the command as it pastes: a folder name with a space quoted
    head = f"best first by {metric} (all rows, CSV or JSON: marconi report {shlex.quote(str(out))} --sort {metric}):"
    return head + "\n" + text


def say_short_session_ranges(tasks) -> None:
    """Each ``--session-range`` value that ends past its trace's sessions, said once on stderr as
    ``run`` says it: the workers load the traces, so the parent reads each such trace (from the
    runners' cache, which a one-worker sweep then reuses). A range that keeps no session is left
    to its configurations' runs (their error, as before)."""
    from traces.sessions import parse_session_range  # noqa: PLC0415

    seen: set[str] = set()
    for task in tasks:
        kwargs = task.trace_kwargs
        text = kwargs.get("session_range")
        if not text or parse_session_range(text)[1] is None:  # no end: never past the trace
            continue
        key = json.dumps(kwargs, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            trace = task_trace(kwargs)
        except ValueError:  # TraceError / UsageError: the configuration's run reports it
            continue
        say_short_session_range(trace)


#: the sections of `marconi sweep --help`: run's knob sections, then the sweep's own options
SWEEP_SECTIONS = (*RUN_SECTIONS[:5], "Results and execution")


def sweep_section(run_cmd: click.Command):
    """The `--help` section of a sweep option: the section of the `run` option it lists values of,
    and for the sweep's own options (and run's output ones, --out, --progress) the last one."""
    by_name = {p.name: p for p in run_cmd.params}

    def section(param: click.Parameter) -> str:
        knob = by_name.get(param.name)
        if knob is None or run_section(knob) == RUN_SECTIONS[5]:
            return SWEEP_SECTIONS[5]
        return run_section(knob)

    return section


def register(main: click.Group) -> None:
    spec = SweepSpec(main.commands["run"])  # registered after `run`: its knobs are derived from it

    def sweep(out, engine, workers, ray_address, dry_run, save_requests, progress, limit, **kwargs):
        """Run every combination of the given knob values; one parquet row per configuration under OUT.

        \b
        Examples:
          marconi sweep --out results/ --capacity 1GB,2GB,5GB --sessions-per-second 0.25,1,5
          marconi sweep --out results/ --policy marconi --alpha 0:2:0.1 --capacity 1GB:5GB:1GB
          marconi sweep --out results/ --engine ray --ray-address auto ...

        Rerunning the same command skips finished configurations.
        """
        metric = sort_key(kwargs.pop("sort"))
        trace_axes, sim_axes = spec.axes(kwargs)
        refuse_unread_knobs(sim_axes["policy"], explicit_settings(click.get_current_context(), _RENAME))
        left_out = ""
        default_policies = click.get_current_context().get_parameter_source("policies") == ParameterSource.DEFAULT
        if default_policies:
            left_out = _fit_default_policies(trace_axes, sim_axes)
        if check_grid_size(trace_axes, sim_axes) > SLOW_GRID:  # counted before building: say what takes a while
            click.echo(f"building {grid_size(trace_axes, sim_axes):,} configurations...", err=True)
        tasks = expand_grid(trace_axes, sim_axes)
        for task in tasks:
            refuse_unusable_blocks(task.config)
        # a policy off a hash-block trace's blocks: the default list leaves it out on that trace (it
        # stayed for a grid that holds a token trace too, and stopped the sweep when its turn came);
        # a named one is refused before anything runs
        off = [t for t in tasks if off_block_message(t)]
        if off and not default_policies:
            raise UsageError(off_block_message(off[0]))
        if off:
            tasks = [t for t in tasks if not off_block_message(t)]
            pairs = sorted({(t.config.policy, str(t.trace_kwargs.get("trace"))) for t in off})
            words = f"{', '.join(f'{p} on {s}' for p, s in pairs)} left out: checkpoints finer than the trace's blocks"
            left_out = f"{left_out}; {words}" if left_out else words
        ctx = click.get_current_context()  # options that cannot act, timing files: before any configuration runs
        check_configs(
            explicit_settings(ctx, _RENAME),
            given_trace_options(ctx),
            [str(t) for t in trace_axes.get("trace", [])],
            [t.config for t in tasks],
        )
        pairs = dict.fromkeys((t.config.timing_file, t.config.model) for t in tasks if t.config.timing_file)
        for path, model in pairs:  # a timing file fitted in another dtype than a model runs in: said, used
            warning = timing_dtype_warning(path, read_timing_file(path, model=model), model)
            if warning:
                click.echo(warning, err=True)
        if workers is not None and workers < 1:
            raise UsageError("--workers must be >= 1")
        refuse_ray_address_without_ray(engine, ray_address)
        if limit is not None and limit < 0:
            raise UsageError("--limit must be >= 0")
        # the folder is created (or refused) before any configuration runs, and removed again
        # when the sweep stops with nothing in it (or after a dry run); never inside an input
        inputs = [p for spec in trace_axes.get("trace", []) for p in input_paths(spec)]
        inputs += input_paths(None, *[t for t in sim_axes.get("timing_file", []) if t])
        inputs += model_inputs(*sim_axes.get("model", []))
        check_output_folder(out, "--out", inputs)
        refuse_other_kind(out, "sweep")
        with output_folder(out, keep=not (dry_run or limit == 0)):  # nothing runs: no folder left
            # a trace file that is not there: now, not when its turn comes in a worker
            refuse_missing_trace_paths([str(t) for t in trace_axes.get("trace", [])])
            for tok in dict.fromkeys(str(t) for t in trace_axes.get("tokenizer", [])):
                file = Path(tok[3:]).expanduser() if tok.startswith("hf:") else None
                file = file / "tokenizer.json" if file is not None and file.is_dir() else file  # as the loader
                if file is not None and not file.is_file():
                    raise UsageError(f"--tokenizer {tok}: no such file: {file}")
            if left_out:
                click.echo(left_out)
            _execute(
                tasks, trace_axes, sim_axes, out, engine, workers, ray_address, dry_run, save_requests, progress, limit
            )
            if not dry_run:
                click.echo(summary_table(out, tasks, metric))

    def _execute(
        tasks, trace_axes, sim_axes, out, engine, workers, ray_address, dry_run, save_requests, progress, limit
    ):
        digest = _digests()
        check_layout(out, tasks)
        status = (
            [stored_status(out, t, save_requests, digest(t)) for t in _checking(tasks, progress)]
            if out.exists()
            else []
        )
        done = status.count(DONE)
        note = ""
        if not dry_run and (engine == "local" or not ray_address):  # the workers share this machine
            # their traces and runs together, once, before they start (each checked alone)
            todo = [t for t, s in zip(tasks, status) if s != DONE] if status else list(tasks)
            todo = todo if limit is None else todo[:limit]
            count = max(1, min(workers or os.cpu_count() or 1, max(1, len(todo))))
            fitted, note = fit_workers(todo, count, explicit=workers is not None)
            workers = fitted if fitted < count else workers
        click.echo(grid_summary(trace_axes, sim_axes, len(tasks)))
        click.echo(f"already done: {done:,}, to run: {len(tasks) - done:,} -> {out}")
        if status.count(STALE):
            click.echo(
                f"note: {counted(status.count(STALE), 'stored result', thousands=True)} computed from other inputs (the trace or "
                "timing file changed, or the model's config.json, or an older simulator): recomputed and replaced",
                err=True,
            )
        if status.count(BAD):
            click.echo(
                f"note: {counted(status.count(BAD), 'stored result', thousands=True)} unreadable or incomplete (truncated, "
                "emptied, another configuration's): recomputed and replaced",
                err=True,
            )
        if dry_run:
            return
        if engine == "ray":
            try:
                import ray  # noqa: F401,PLC0415 - optional extra: checked before the sweep starts
            except ImportError:
                raise UsageError("--engine ray needs Ray: pip install 'marconi-sim[ray]'") from None
        say_short_session_ranges([t for t, s in zip(tasks, status) if s != DONE] if status else tasks)
        if note:
            click.echo(note, err=True)
        report = run_sweep(
            tasks,
            out,
            engine=engine,
            workers=workers,
            ray_address=ray_address,
            save_requests=save_requests,
            progress=progress,
            limit=limit,
            digest=digest,
            check_memory=False,
        )
        click.echo(
            f"ran {counted(report.ran, 'configuration', thousands=True)} in {report.wall_s:.1f} s "
            f"({report.skipped:,} skipped as done, {len(report.failed):,} failed) -> {out}"
        )
        for task, err in report.failed:
            click.echo(f"failed: {describe(task)}: {err}", err=True)
        if report.interrupted:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a further Ctrl-C cannot cut the exit short
            click.echo("interrupted: rerun the same command to finish", err=True)
            sys.exit(stop_exit_code())
        if report.failed:
            sys.exit(1)

    params = spec.click_params() + [
        click.Option(
            ["--out"],
            type=OutputPath(file_okay=False, path_type=Path),
            required=True,
            help="Results folder (parquet rows; rerunning resumes).",
        ),
        click.Option(
            ["--engine"],
            type=click.Choice(["local", "ray"]),
            default="local",
            show_default=True,
            help="local: a process pool; ray: Ray tasks (a cluster with --ray-address, else a local Ray).",
        ),
        click.Option(
            ["--workers"], type=int, default=None, help="Processes (local) or CPUs of a local Ray [default: all cores]."
        ),
        click.Option(
            ["--ray-address"], default=None, help="Address of an existing Ray cluster (e.g. auto, ray://host:10001)."
        ),
        click.Option(["--dry-run"], is_flag=True, help="Print the grid size and what is left to run, then stop."),
        click.Option(
            ["--save-requests/--no-save-requests"],
            default=False,
            show_default=True,
            help="Also write per-request records and occupancy (needed by plot --kind ttft|occupancy).",
        ),
        click.Option(["--progress/--no-progress"], default=True, show_default=True, help=PROGRESS_HELP),
        click.Option(["--limit"], type=int, default=None, help="Run at most this many configurations, then stop."),
        click.Option(
            ["--sort"],
            default="token_hit_rate",
            show_default=True,
            help=SORT_HELP + ", in the table printed at the end.",
        ),
    ]
    main.add_command(
        SectionedCommand(
            "sweep",
            callback=sweep,
            params=params,
            help=sweep.__doc__,
            short_help="Run a grid of configurations (lists and ranges for every knob).",
            section_of=sweep_section(main.commands["run"]),
            section_order=SWEEP_SECTIONS,
        )
    )
