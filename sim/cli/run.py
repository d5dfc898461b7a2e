"""`marconi run`: replay one trace under one or more policies and print the comparison."""

from __future__ import annotations

import json
from pathlib import Path

import click

from policies.base import get_preset
from sim.cli.traces import trace_from_cli, trace_options
from sim.config import SimConfig, format_size, parse_size
from sim.engine.metrics import SUMMARY_KEYS
from sim.errors import UsageError
from sim.simulate import simulate

DEFAULT_POLICIES = "vllm+,sglang+,marconi"


def parse_alpha(text: str) -> float | str:
    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--alpha must be a number or 'auto', not {text!r}") from None
    if value < 0:
        raise UsageError("--alpha must be >= 0")
    return value


def _with_options(fn, opts):
    for opt in reversed(opts):  # reversed: click lists options in decoration order
        fn = opt(fn)
    return fn


def sim_options(fn):
    """The simulation knobs shared by `run` and `sweep` (single values here)."""
    opts = [
        click.option("--model", default="marconi-7b", show_default=True, help="Model preset (see `marconi models`)."),
        click.option("--state-alignment", type=click.Choice(["exact", "chunk"]), default="exact", show_default=True,
                     help="exact: states at any token (paper); chunk: branch states at kernel chunk boundaries."),
        click.option("--chunk-size", type=int, default=64, show_default=True, help="Kernel chunk for --state-alignment chunk."),
        click.option("--mode", type=click.Choice(["des", "sequential"]), default="des", show_default=True,
                     help="des: discrete-event with servers and pinning; sequential: the artifact's replay."),
        click.option("--compat", type=click.Choice(["corrected", "paper", "paper-fixed"]), default="corrected",
                     show_default=True,
                     help="paper: the Marconi artifact as published (its replay, logical clock and two bugs); "
                          "paper-fixed: the same with its two bugs fixed; corrected: exact capacity, pinning."),
        click.option("--arrival", type=click.Choice(["uniform", "poisson"]), default="uniform", show_default=True,
                     help="Session starts: i / rate (paper) or Poisson."),
        click.option("--servers", type=int, default=1, show_default=True, help="Prefill servers (simpy resources)."),
        click.option("--ttft-model", type=click.Choice(["flops", "jamba"]), default="flops", show_default=True,
                     help="flops: FLOPs / throughput + overhead; jamba: the paper's fitted Jamba-1.5-Mini table."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--prefill-chunk", "prefill_chunk_tokens", type=int, default=8192, show_default=True,
                     help="Chunked prefill: tokens per scheduled prefill step (engine presets place states at chunk ends)."),
        click.option("--block-size", type=int, default=0, show_default=True,
                     help="Block of block-based engine presets (vllm-align, vllm-all) in tokens; 0 = derived per model."),
    ]
    return _with_options(fn, opts)


def tuning_options(fn):
    """Knobs of `--alpha auto` and `marconi-oracle` (sim/tuning)."""
    opts = [
        click.option("--alpha-grid", default="0:2:0.1", show_default=True,
                     help="Alphas the tuner and marconi-oracle try (lo:hi:step or a comma list)."),
        click.option("--bootstrap-multiplier", type=int, default=5, show_default=True,
                     help="Tuning window = this x the requests seen before the first eviction (paper: 15 for LMSys)."),
        click.option("--tuning-objective", type=click.Choice(["flops", "hit-rate"]), default=None,
                     help="flops: FLOPs saved (artifact; replay: over the last 500 replayed requests); hit-rate: token "
                          "hit rate (paper) [default: hit-rate for --tuner duel, flops for replay]."),
        click.option("--tuning-start", type=click.Choice(["empty", "snapshot"]), default="empty", show_default=True,
                     help="empty: replay from the trace start on an empty cache (artifact); snapshot: from the cache at the first eviction."),
        click.option("--tuning-workers", type=int, default=0, show_default=True,
                     help="Replay processes (0 = all cores, 1 = serial)."),
        click.option("--retune-every", type=int, default=0, show_default=True,
                     help="Tune again every N requests (0: once, as the artifact)."),
        click.option("--tuning-lru/--no-tuning-lru", default=None,
                     help="Let the tuner adopt SGLang+'s LRU when it beats every alpha [default: on, off in paper compat]."),
        click.option("--tuner", type=click.Choice(["duel", "replay"]), default=None,
                     help="duel: shadow caches per candidate on the live stream, adopt the best over a trailing window; "
                          "replay: the artifact's bootstrap-window replay [default: duel, replay in paper compat]."),
        click.option("--duel-candidates", default="lru,0,0.1,0.2,0.4,0.7,1,1.5,2", show_default=True,
                     help="Duel tuner: one shadow cache per candidate (lru = SGLang+'s eviction, or an alpha)."),
        click.option("--duel-every", type=int, default=25, show_default=True,
                     help="Duel tuner: re-decide every N finished requests."),
        click.option("--duel-window", type=int, default=200, show_default=True,
                     help="Duel tuner: score candidates over the last N finished requests."),
        click.option("--duel-margin", type=float, default=0.02, show_default=True,
                     help="Duel tuner: a challenger must beat the incumbent's score by this fraction."),
    ]
    return _with_options(fn, opts)


def build_configs(policies: str, capacity: str, alpha: str, sessions_per_second: float, **knobs) -> list[SimConfig]:
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise UsageError("--policy needs at least one name")
    for name in names:
        get_preset(name)
    cap = parse_size(capacity)
    configs = []
    for name in names:
        cfg = SimConfig(policy=name, capacity_bytes=cap, alpha=parse_alpha(alpha),
                        sessions_per_second=sessions_per_second, **knobs)
        cfg.validate()
        configs.append(cfg)
    return configs


def format_table(rows: list[dict]) -> str:
    head = ["policy", "token hit", "request hit", "FLOPs saved", "TTFT p50 ms", "TTFT p95 ms", "evictions", "rejected"]
    lines = []
    for r in rows:
        lines.append([
            r["policy"], f"{r['token_hit_rate'] * 100:.2f}%", f"{r['request_hit_rate'] * 100:.2f}%",
            f"{r['flops_saved']:.3e}", f"{r['ttft_p50_ms']:.1f}", f"{r['ttft_p95_ms']:.1f}",
            str(r["evictions"]), str(r.get("rejected_inserts", 0)),
        ])
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*l) for l in lines]
    return "\n".join(out)


def register(main: click.Group) -> None:
    @main.command("run")
    @trace_options
    @click.option("--policy", "policies", default=DEFAULT_POLICIES, show_default=True,
                  help="Comma-separated policies (vanilla, vllm+, sglang+, marconi, ...).")
    @click.option("--capacity", default="5GB", show_default=True, help="Cache capacity (5GB = 5e9 B, 5GiB = 5*2^30 B).")
    @click.option("--alpha", default="auto", show_default=True,
                  help="Marconi's FLOP-efficiency weight, or auto (tuned on a replay of the first requests).")
    @click.option("--sessions-per-second", type=float, default=1.0, show_default=True)
    @sim_options
    @tuning_options
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="Write summary.json and per-request requests.parquet here.")
    @click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
    @click.option("--progress/--no-progress", default=True, show_default=True)
    def run(policies, capacity, alpha, sessions_per_second, out, fmt, progress, **kwargs):
        """Replay a trace (default: 100 real ShareGPT sessions) under each policy."""
        from tqdm import tqdm  # noqa: PLC0415 - progress bar, loaded only when running

        trace = trace_from_cli(kwargs)
        configs = build_configs(policies, capacity, alpha, sessions_per_second, **kwargs)
        results = []
        bar = tqdm(total=len(trace.requests) * len(configs), unit="req", disable=not progress,
                   desc="simulating", leave=False)
        try:
            for cfg in configs:
                bar.set_postfix_str(cfg.policy)
                results.append((cfg, simulate(trace, cfg, progress=bar)))
        finally:
            bar.close()
        rows = [res.summary for _, res in results]
        if fmt == "json":
            click.echo(json.dumps([{k: r[k] for k in SUMMARY_KEYS} for r in rows], indent=2))
        else:
            cfg0 = configs[0]
            arrivals = (f"{sessions_per_second:g} sessions/s ({cfg0.arrival})" if trace.closed_loop
                        else "open-loop arrivals from the trace")
            click.echo(f"trace {trace.name}: {len(trace.requests)} requests, {trace.n_sessions} sessions | "
                       f"model {cfg0.model} | capacity {format_size(cfg0.capacity_bytes)} | "
                       f"{cfg0.mode} | {arrivals} | alpha {cfg0.alpha}")
            click.echo(format_table(rows))
            for r in rows:
                if r.get("tuned_choice") is None:
                    continue
                if r.get("tuning_rounds"):
                    click.echo(f"{r['policy']}: alpha auto -> {r['tuned_choice']} (adopted at request "
                               f"{r.get('tuned_at_request')}; {r.get('tuning_switches', 0)} switches in "
                               f"{r['tuning_rounds']} tuning rounds)")
                else:
                    click.echo(f"{r['policy']}: best static alpha in hindsight {r['tuned_choice']}")
        if out is not None:
            _write_outputs(out, trace, results)

    def _write_outputs(out: Path, trace, results) -> None:
        import pandas as pd  # noqa: PLC0415 - only --out writes tables

        out.mkdir(parents=True, exist_ok=True)
        summary = [{**cfg.as_row(), "trace": trace.name, **res.summary} for cfg, res in results]
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        for name in ("requests", "occupancy"):  # one table each, all policies, policy column first
            frames = [getattr(res, name).assign(policy=cfg.policy) for cfg, res in results]
            table = pd.concat(frames, ignore_index=True)
            table = table[["policy", *[c for c in table.columns if c != "policy"]]]
            table.to_parquet(out / f"{name}.parquet", index=False)
