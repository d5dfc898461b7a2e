"""Options that cannot act, and numbers outside the range where the model means something: refused
in one line before any work, for every command that simulates (run, sweep, advise, replay).

- Scheduler knobs (``--max-num-seqs``, ``--max-num-batched-tokens``) under the fcfs scheduler.
- Tuning knobs (``--duel-*``, ``--bootstrap-multiplier``, ...) where nothing is tuned (no policy
  with ``--alpha auto``), and one tuner's knobs under the other tuner.
- Trace options the trace's source does not read (``--sessions`` on a hash-block trace): each
  ``TraceSource`` declares what it reads (``traces.registry``).
- ``--ttft-model jamba`` with ``--timing`` (the Jamba table times prefills, not the file).
- ``--gpu-memory`` with ``--capacity`` (the engine's memory replaces the capacity: one of them
  would be silently ignored); a split of ``--gpu-memory`` that leaves no KV room.
- Timing files that describe no machine: every compute term zero, a term of more than
  ``MAX_MS_PER_TFLOP``, a negative or non-finite peak, more GPUs than a tensor-parallel group
  may have (``MAX_NODE_GPUS``), a term faster than the device's peak (its catalogue figure when the file
  names a device and gives no peak).
- ``--sessions-per-second`` outside ``RATE_RANGE`` (1e-320 made the arrival clock NaN), and on
  open-loop traces, whose requests arrive at their own times.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sim.config import SimConfig, flag_of, format_gpu_memory, format_memory, format_size, parse_size
from sim.errors import UsageError

#: sessions per second a closed-loop run may start (below: one session in 11.6 days or fewer)
RATE_RANGE = (1e-6, 1e6)
#: the most GPUs a timing file or --tensor-parallel may describe (a group beyond one server's
#: ``sim.gpus.GPU.node_gpus`` all-reduces over the network between servers)
MAX_NODE_GPUS = 64
#: the slowest compute term a timing file may hold (ms per TFLOP: 1e9 is one GFLOP/s)
MAX_MS_PER_TFLOP = 1e9
#: the longest fixed time per call / decode step a timing file may hold (ms)
MAX_CALL_MS = 1e6
#: knobs read only by --scheduler continuous
SCHEDULER_KNOBS = ("max_num_batched_tokens", "max_num_seqs")
#: tuning knobs of one tuner only (the rest of the tuning group is read by both)
DUEL_KNOBS = ("duel_candidates", "duel_every", "duel_window", "duel_margin")
REPLAY_TUNER_KNOBS = ("bootstrap_multiplier", "tuning_start", "tuning_workers", "retune_every")
#: knobs that size a pool of recurrent states or place them: nothing to size or place for a model
#: without recurrent layers (SGLang serves one from its plain radix cache, no mamba component)
STATE_POOL_KNOBS = (
    "mamba_full_memory_ratio",
    "max_mamba_cache_size",
    "state_pool",
    "mamba_radix_cache_strategy",
    "mamba_track_interval",
)

_FIELDS = {f.name: f for f in SimConfig.knobs()}


def _flag(name: str) -> str:
    return flag_of(_FIELDS[name])


def _tuner(cfg: SimConfig) -> str:
    return cfg.tuner or ("duel" if cfg.compat == "corrected" else "replay")


def refuse_inert_settings(given: list[str], configs: list[SimConfig]) -> None:
    """``given``: SimConfig field names the user set; ``configs``: every configuration to run.
    Refuses a setting none of them reads (scheduler and tuning knobs; policy knobs are
    ``sim.cli.run.refuse_unread_knobs``'), and settings whose combination cannot be simulated as
    said."""
    from policies.base import get_preset  # noqa: PLC0415
    from sim.simulate import hindsight_preset  # noqa: PLC0415

    if not configs:
        return
    given = [g for g in given if g in _FIELDS]
    if all(c.effective_scheduler == "fcfs" for c in configs):
        for name in given:
            if name in SCHEDULER_KNOBS:
                why = "the sequential mode" if all(c.mode == "sequential" for c in configs) else "--scheduler fcfs"
                raise UsageError(
                    f"{_flag(name)} does nothing under {why} (it is read by --scheduler continuous): leave it out"
                )
    tuning = {f.name for f in SimConfig.settings("tuning")}
    if not any(hindsight_preset(c.policy) for c in configs):
        tuned = [c for c in configs if get_preset(c.policy).uses_alpha and c.alpha == "auto"]
        for name in given:
            if name not in tuning:
                continue
            if not tuned:
                raise UsageError(
                    f"{_flag(name)} does nothing here: tuning knobs are read by --alpha auto (marconi) and "
                    "marconi-oracle: leave it out"
                )
            tuners = {_tuner(c) for c in tuned}
            if name in DUEL_KNOBS and tuners == {"replay"}:
                raise UsageError(f"{_flag(name)} does nothing with --tuner replay (the duel tuner reads it)")
            if name in REPLAY_TUNER_KNOBS and tuners == {"duel"}:
                raise UsageError(f"{_flag(name)} does nothing with the duel tuner (--tuner replay reads it)")
    if "chunk_size" in given and all(c.state_alignment == "exact" for c in configs):
        raise UsageError(
            "--chunk-size does nothing with --state-alignment exact (it is read by --state-alignment chunk): "
            "leave it out or add --state-alignment chunk"
        )
    for c in configs:
        if c.timing_file and c.ttft_model == "jamba":
            raise UsageError(
                "--timing does nothing with --ttft-model jamba (the Jamba table times prefills): leave one out"
            )
        if not RATE_RANGE[0] <= c.sessions_per_second <= RATE_RANGE[1]:
            raise UsageError(
                f"--sessions-per-second must be in {RATE_RANGE[0]:g}..{RATE_RANGE[1]:g} (sessions started per "
                f"second), not {c.sessions_per_second!r}"
            )
    if "gpu_memory" in given and "capacity_bytes" in given:
        for c in configs:
            if c.gpu_memory and engine_capacity(c) != c.capacity_bytes:
                raise UsageError(
                    f"--gpu-memory {c.gpu_memory} replaces --capacity {format_size(c.capacity_bytes)} for "
                    f"{c.policy} (its engine splits the memory): give one of them"
                )
    refuse_dense_model_settings(given, configs)
    for c in configs:
        check_memory_split(c)
        refuse_cache_beyond_gpus(c)


def _splits(spec, tp: int) -> bool:
    """``tp`` GPUs can hold ``spec`` under tensor parallelism (each a whole share of its heads)."""
    from sim.cost import group_spec  # noqa: PLC0415

    try:
        group_spec(spec, tp)
    except UsageError:
        return False
    return True


def group_nodes(gpu, tp: int) -> str:
    """A refusal's words on the group it names where that group spans servers ("; 16 GPUs = 2 nodes
    of 8: all-reduce over the inter-node link, 50 GB/s each way"), else ""."""
    from sim.gpus import node_words  # noqa: PLC0415

    words = node_words(gpu, tp)
    return f"; {tp} GPUs = {words}" if words else ""


def refuse_weights_beyond_gpus(model: str, gpu: str, tensor_parallel: int) -> None:
    """A model whose bf16 weights its --gpu group cannot hold (or fill it, leaving no byte of
    cache) is refused in one line naming the smallest --tensor-parallel group that holds them."""
    from sim.cost import get_model, gpu_memory_limit  # noqa: PLC0415
    from sim.experiments.advise.space import weight_bytes  # noqa: PLC0415
    from sim.gpus import get_gpu  # noqa: PLC0415

    n, most = gpu_memory_limit(model, gpu, tensor_parallel)
    spec = get_model(model)
    weights = weight_bytes(spec)
    if weights >= most:  # equal: no byte left for any cache (qwen3-next-80b-a3b's 160GB on 2x h100)
        each = get_gpu(gpu).memory_bytes
        fits = [k for k in range(1, MAX_NODE_GPUS + 1) if k * each > weights and _splits(spec, k)]
        group = (
            f"give --tensor-parallel {fits[0]} (the smallest group that holds them and splits its heads"
            f"{group_nodes(get_gpu(gpu), fits[0])})"
            if fits
            else f"no tensor-parallel group of {gpu} that splits its heads holds them"
        )
        raise UsageError(
            f"{spec.name}'s {spec.weight_dtype} weights ({format_size(weights)}) "
            f"{'fill' if weights == most else 'are more than'} the memory of "
            f"{n}x {gpu} ({format_gpu_memory(most)}): {group}"
        )


def refuse_cache_beyond_gpus(cfg: SimConfig) -> None:
    """With --gpu, a model whose bf16 weights the group cannot hold (qwen3.5-397b-a17b on one L40S
    ran), or a --capacity larger than the group's memory (100GB on one H100 ran), is refused in one
    line, and so is a --capacity that fits beside the weights no more (a 60GB cache and qwen3.5-27b's
    54GB of weights on one H100 ran); the group's memory bounds --gpu-memory the same way
    (``check_memory_split``)."""
    from sim.config import UNLIMITED  # noqa: PLC0415
    from sim.cost import get_model, gpu_memory_limit  # noqa: PLC0415
    from sim.experiments.advise.space import weight_bytes  # noqa: PLC0415

    if not cfg.gpu:
        return
    n, most = gpu_memory_limit(cfg.model, cfg.gpu, cfg.tensor_parallel)
    weights = weight_bytes(get_model(cfg.model))
    refuse_weights_beyond_gpus(cfg.model, cfg.gpu, cfg.tensor_parallel)
    if not cfg.gpu_memory and cfg.capacity_bytes < UNLIMITED and cfg.capacity_bytes > most:
        raise UsageError(
            f"--capacity {format_memory(cfg.capacity_bytes)} is more than the memory of {n}x {cfg.gpu} "
            f"({format_gpu_memory(most)}): lower it, or give --tensor-parallel for a larger group"
        )
    # --gpu-memory, like --capacity, is the memory after the weights: each fits alone, not both
    # (qwen3.5-27b's 54GB of weights and a 60GB cache, or --gpu-memory 70GB, on one 80GB H100 ran)
    flag, cache = ("--gpu-memory", parse_size(cfg.gpu_memory)) if cfg.gpu_memory else ("--capacity", cfg.capacity_bytes)
    if cache < UNLIMITED and cache + weights > most:
        raise UsageError(
            f"{flag} {format_memory(cache)} and {get_model(cfg.model).name}'s {get_model(cfg.model).weight_dtype} weights "
            f"({format_size(weights)}) are more than the memory of {n}x {cfg.gpu} ({format_gpu_memory(most)}): at "
            f"most {format_size(most - weights)} is left for the cache; lower it, or give --tensor-parallel "
            "for a larger group"
        )


def refuse_dense_model_settings(given: list[str], configs: list[SimConfig]) -> None:
    """The trtllm preset (TensorRT-LLM's hybrid manager: KV reused up to a snapshot) on a dense
    model is refused: a dense model runs TensorRT-LLM's plain KV cache, which it does not model.
    A knob that sizes the pool of recurrent states (``STATE_POOL_KNOBS``) set for models without
    recurrent layers (llama-7b, a dense config.json) is refused: there is no pool, the run was the
    same with any value. ``--gpu-memory`` alone on such a model is said in one line on stderr: the
    engine gives all of it to the KV pool (SGLang runs a dense model on its plain radix cache)."""
    import click  # noqa: PLC0415 - the note goes to stderr

    from policies.base import get_preset  # noqa: PLC0415
    from sim.cost import get_model  # noqa: PLC0415

    def hybrid(c: SimConfig) -> bool:
        return get_model(c.model).is_hybrid

    for name in given:
        if name not in STATE_POOL_KNOBS:
            continue
        readers = [c for c in configs if name in get_preset(c.policy).reads()]
        if readers and not any(hybrid(c) for c in readers):
            models = ", ".join(dict.fromkeys(get_model(c.model).name for c in readers))
            raise UsageError(
                f"{_flag(name)} does nothing for {models}: a model without recurrent layers has no recurrent "
                "states to pool or place: leave it out"
            )
    for c in configs:  # TensorRT-LLM's hybrid manager commits KV only up to a snapshot point
        preset = get_preset(c.policy)
        if preset.engine != "trtllm" or hybrid(c):
            continue
        rules = preset.engine_rules(get_model(c.model), c)
        if rules is not None and rules.kv_extent == "state":
            raise UsageError(
                f"{c.policy} models TensorRT-LLM's hybrid cache manager (KV reused only up to a recurrent-state "
                f"snapshot); {get_model(c.model).name} has no recurrent layers, and the plain KV block reuse "
                "TensorRT-LLM runs it with is not modelled (its KV counted only up to snapshots: 0 % hits with none "
                "set): pick another policy "
                "(trtllm-1.2-interval, vllm, sglang, lmdeploy)"
            )
    if "gpu_memory" in given:
        split = [c for c in configs if c.gpu_memory and "gpu_memory" in get_preset(c.policy).reads()]
        if split and not any(hybrid(c) for c in split):
            models = ", ".join(dict.fromkeys(get_model(c.model).name for c in split))
            click.echo(
                f"note: {models} has no recurrent layers: no mamba pool to split --gpu-memory with, all of it "
                "is the KV pool",
                err=True,
            )


def engine_capacity(cfg: SimConfig) -> int:
    """The cache bytes a configuration simulates: ``--gpu-memory`` where its preset's engine splits
    it (it replaces --capacity), else ``--capacity``. Headers and summaries say this one."""
    from policies.base import get_preset  # noqa: PLC0415
    from sim.cost import get_model  # noqa: PLC0415

    if not cfg.gpu_memory:
        return cfg.capacity_bytes
    rules = get_preset(cfg.policy).engine_rules(get_model(cfg.model), cfg)
    return parse_size(rules.memory) if rules is not None and rules.memory else cfg.capacity_bytes


def refuse_memory_beyond_gpus(gpu_memory: str, nbytes: int, gpu: str | None, tensor_parallel: int, model: str) -> None:
    """A --gpu-memory (``gpu_memory`` as spelled, ``nbytes`` as read) larger than the --gpu group
    holds is refused in one line (it priced memory no GPU has); nothing to check without --gpu."""
    if not gpu:
        return
    from sim.cost import gpu_memory_limit  # noqa: PLC0415

    n, most = gpu_memory_limit(model, gpu, tensor_parallel)
    if nbytes > most:
        raise UsageError(
            f"--gpu-memory {gpu_memory} is more than the memory of {n}x {gpu} ({format_gpu_memory(most)}): "
            "lower it, or give --tensor-parallel for a larger group"
        )


def check_memory_split(cfg: SimConfig, min_request_tokens: int | None = None) -> None:
    """Refuses a split of ``--gpu-memory`` that leaves the KV pool no room for one page (or, given
    the trace's shortest request, for that request: every request would miss)."""
    from policies.base import get_preset  # noqa: PLC0415
    from sim.cost import get_model  # noqa: PLC0415

    if not cfg.gpu_memory:
        return
    # the memory split is the group's: no more than its GPUs hold
    refuse_memory_beyond_gpus(cfg.gpu_memory, parse_size(cfg.gpu_memory), cfg.gpu, cfg.tensor_parallel, cfg.model)
    spec = get_model(cfg.model)
    rules = get_preset(cfg.policy).engine_rules(spec, cfg)
    if rules is None or not rules.memory or rules.split is None:
        return
    memory = parse_size(rules.memory)
    states = rules.split(memory, spec.state_bytes())
    kv = memory - states * spec.state_bytes()
    need_tokens = max(cfg.page_size, min_request_tokens or 1)
    need = need_tokens * spec.kv_bytes_per_token()
    if kv < need:
        what = (
            f"its shortest request ({need_tokens:,} tokens)"
            if min_request_tokens
            else f"one {cfg.page_size}-token page"
        )
        raise UsageError(
            f"the engine's split of --gpu-memory {format_size(memory)} leaves {format_size(max(kv, 0))} for KV, "
            f"less than {what} needs ({format_size(need)}): every request would miss; lower "
            f"--mamba-full-memory-ratio ({cfg.mamba_full_memory_ratio:g}) or give more memory"
        )


# ---------------------------------------------------------------------------------- timing files


def check_timing(path, model: str | None = None):
    """Reads a timing file (``sim.replay.measure.read_timing``) and refuses one that describes no
    real machine; returns it."""
    from sim.cost import HardwareTiming  # noqa: PLC0415
    from sim.gpus import GPUS  # noqa: PLC0415
    from sim.replay.measure import read_timing  # noqa: PLC0415

    raw = _raw(path)
    for key in ("peak_tflops", "gpus"):
        if key in raw:
            v = raw[key]
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            if not ok:
                raise UsageError(f"timing file {path}: {key} must be a finite number >= 0, not {v!r}")
    t = read_timing(path, model=model)
    if isinstance(t, HardwareTiming):
        terms = {k: float(v) for k, v in t.ms_per_tflop.items()}
        for name, group in (("ms_per_tflop", terms), ("layer_call_ms", t.layer_call_ms), ("seq_ms", t.seq_ms)):
            for k, v in group.items():
                if not math.isfinite(float(v)):
                    raise UsageError(f"timing file {path}: {name}.{k} must be finite, not {v!r}")
        if not any(v > 0 for v in terms.values()):
            raise UsageError(
                f"timing file {path}: every compute term is 0 (prefills would take no time): not a machine"
            )
        slow = {k: v for k, v in terms.items() if v > MAX_MS_PER_TFLOP}
        if slow:
            k, v = next(iter(slow.items()))
            raise UsageError(
                f"timing file {path}: term {k} of {v:g} ms per TFLOP is slower than any machine "
                f"(at most {MAX_MS_PER_TFLOP:g}, one GFLOP/s)"
            )
        for name, v in (("call_ms", t.call_ms), ("decode_ms_per_token", t.decode_ms_per_token)):
            if v > MAX_CALL_MS:
                raise UsageError(f"timing file {path}: {name} {v:g} ms is beyond any machine (at most {MAX_CALL_MS:g})")
        for name, group in (("layer_call_ms", t.layer_call_ms), ("seq_ms", t.seq_ms)):
            for k, v in group.items():
                if float(v) > MAX_CALL_MS:
                    raise UsageError(
                        f"timing file {path}: {name}.{k} {float(v):g} ms is beyond any machine (at most {MAX_CALL_MS:g})"
                    )
        if t.gpus > MAX_NODE_GPUS:
            raise UsageError(
                f"timing file {path}: gpus {t.gpus:,} is more than a tensor-parallel group may have "
                f"(at most {MAX_NODE_GPUS})"
            )
        peak = t.peak_tflops
        where = "its peak"
        if not peak > 0 and t.device in GPUS:
            peak, where = GPUS[t.device].bf16_tflops, f"the {t.device}'s peak"
        if not peak > 0:
            peak, where = max(g.bf16_tflops for g in GPUS.values()), "the fastest catalogue GPU's peak"
        for k, c in terms.items():
            if c > 0 and 1e3 / (c * peak) > 1.0 + 1e-9:
                raise UsageError(
                    f"timing file {path}: term {k} runs at {1e3 / c:,.0f} TFLOP/s per GPU, faster than {where} "
                    f"({peak:g} TFLOP/s): not physical"
                )
    else:
        tflops = float(getattr(t, "effective_tflops", 0.0))
        top = max(g.bf16_tflops for g in GPUS.values()) * MAX_NODE_GPUS
        if tflops > top:
            raise UsageError(
                f"timing file {path}: effective_tflops {tflops:g} is beyond a node of the fastest catalogue GPU "
                f"({top:g} TFLOP/s)"
            )
        if tflops < 1e-3:
            raise UsageError(
                f"timing file {path}: effective_tflops {tflops:g} is slower than any machine (at least 0.001)"
            )
        for name in ("overhead_ms", "decode_ms_per_token"):
            v = float(getattr(t, name, 0.0))
            if v > MAX_CALL_MS:
                raise UsageError(f"timing file {path}: {name} {v:g} ms is beyond any machine (at most {MAX_CALL_MS:g})")
    return t


def _raw(path) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}  # read_timing says what is wrong with it
    return d if isinstance(d, dict) else {}


# ---------------------------------------------------------------------------------- trace options


def refuse_unread_trace_options(specs: list[str], given: list[str]) -> None:
    """``given``: trace option keys the user set (``--sessions``); refused when no trace of ``specs``
    reads it (its source's ``reads``): `--sessions 5` on a hash-block trace kept every session."""
    from sim.trace_options import TRACE_OPTIONS  # noqa: PLC0415
    from traces.registry import SOURCES, trace_source  # noqa: PLC0415

    flags = {o.key: o.flag for o in TRACE_OPTIONS}
    sources = [trace_source(s or "sharegpt") for s in specs]
    if any(s is None for s in sources):
        return  # an unknown kind: loading says so
    for key in given:
        if key == "trace":
            continue
        if any(key in s.reads for s in sources):
            # a synthetic spec's own parameters and kind (every spec of the grid passing them by)
            why = [_synthetic_unread(str(spec or ""), key) for spec in specs]
            if all(why):
                raise UsageError(f"{flags.get(key, key)} does nothing for {why[0]}")
            continue
        readers = [name for name, s in SOURCES.items() if key in s.reads]
        kinds = ", ".join(dict.fromkeys(s.name for s in sources))
        hint = "; --session-range keeps sessions of any trace" if key == "sessions" else ""
        raise UsageError(
            f"{flags.get(key, key)} does nothing for {kinds} traces (it is read by {', '.join(readers)}){hint}"
        )


def _synthetic_unread(spec: str, key: str) -> str:
    """Why a synthetic spec does not read trace option ``key`` ("" where it does, or the spec is not
    synthetic): its own ``sessions=`` / ``seed=`` win over ``--sessions`` / ``--trace-seed``, and only
    the agent kind draws think times from ``--response-time`` (a chat's are its ``think=``).
    `sweep --trace synthetic:chat:seed=3 --trace-seed 0,1,2` gave three identical rows."""
    from traces.registry import split_spec  # noqa: PLC0415
    from traces.synthetic import DEFAULTS, parse_spec  # noqa: PLC0415

    source, arg = split_spec(spec)
    if source != "synthetic" or not arg:
        return ""
    try:
        kind, params = parse_spec(arg)
    except ValueError:  # TraceError: loading says what is wrong with the spec
        return ""
    own = {"sessions": ("sessions", "the session count"), "trace_seed": ("seed", "the trace seed")}.get(key)
    if own is not None and own[0] in params:
        return f"{spec} (its {own[0]}={params[own[0]]} sets {own[1]}): give one of them"
    if key == "response_time" and kind != "agent":
        why = (
            f"its think times are drawn from think=, {DEFAULTS[kind]['think']:g} s by default"
            if "think" in DEFAULTS[kind]
            else "one request a session: no think time"
        )
        return f"{spec} ({why}; --response-time is read by synthetic:agent and swebench)"
    return ""


def refuse_rate_on_open_loop(specs: list[str], given: bool, flag: str = "--sessions-per-second") -> None:
    """``given``: the user set the session rate. Refused when every trace of ``specs`` is open
    loop (timestamped: Mooncake, Bailian, the artifact's JSONL), whose requests arrive at the
    trace's own times: the rate starts closed-loop sessions and would be silently ignored."""
    from traces.registry import trace_source  # noqa: PLC0415

    if not given or not specs:
        return
    sources = [trace_source(s or "sharegpt") for s in specs]
    if any(s is None or "time_scale" not in s.reads for s in sources):
        return  # a closed-loop (or unknown) trace reads it; loading says what is unknown
    kinds = ", ".join(dict.fromkeys(s.name for s in sources))
    raise UsageError(
        f"{flag} does nothing for {kinds} traces (their requests arrive at the trace's own times; "
        "--time-scale stretches them): leave it out"
    )


def refuse_seed_without_draws(given: list[str], configs: list[SimConfig]) -> None:
    """``--seed`` seeds the Poisson session starts only: under uniform arrivals it drew nothing,
    and a sweep over seeds gave the same row N times (no variance where the user looked for it)."""
    if "seed" in given and configs and all(c.arrival == "uniform" for c in configs):
        raise UsageError(
            "--seed does nothing with --arrival uniform (it seeds --arrival poisson's session starts; "
            "--trace-seed seeds the trace): leave it out or add --arrival poisson"
        )


def refuse_ray_address_without_ray(engine: str, ray_address: str | None) -> None:
    """--ray-address names a cluster for --engine ray: with the local pool it was ignored (the
    work ran on this machine, not on the cluster the user named)."""
    if ray_address and engine != "ray":
        raise UsageError(
            f"--ray-address does nothing with --engine {engine} (it is read by --engine ray): add --engine ray "
            "or leave it out"
        )


# ---------------------------------------------------------------------------------- per command


def given_trace_options(ctx) -> list[str]:
    """Trace option keys the user set on the command line (not left at their default)."""
    from click.core import ParameterSource  # noqa: PLC0415

    from sim.trace_options import TRACE_OPTION_KEYS  # noqa: PLC0415

    return [
        k
        for k in TRACE_OPTION_KEYS
        if k in ctx.params and ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)
    ]


def check_run(ctx, policies: str, capacity: str, alpha: str, sessions_per_second: float, kwargs: dict) -> None:
    """`marconi run`'s options, before the trace is loaded: settings no configuration reads, trace
    options the trace does not read, the timing file, numbers out of range."""
    from click.core import ParameterSource  # noqa: PLC0415

    from sim.cli.run import build_configs, explicit_settings  # noqa: PLC0415
    from sim.trace_options import TRACE_OPTION_KEYS  # noqa: PLC0415

    knobs = {k: v for k, v in kwargs.items() if k not in TRACE_OPTION_KEYS}
    # the default list's blocks are checked once the trace says which of its policies run (run._run)
    named = ctx.get_parameter_source("policies") != ParameterSource.DEFAULT
    configs = build_configs(policies, capacity, alpha, sessions_per_second, check_blocks=named, **knobs)
    refuse_inert_settings(explicit_settings(ctx, {"capacity": "capacity_bytes"}), configs)
    refuse_seed_without_draws(explicit_settings(ctx), configs)
    refuse_unread_trace_options([kwargs.get("trace") or "sharegpt"], given_trace_options(ctx))
    refuse_rate_on_open_loop([kwargs.get("trace") or "sharegpt"], _given(ctx, "sessions_per_second"))
    refuse_rate_on_open_loop([kwargs.get("trace") or "sharegpt"], _given(ctx, "arrival"), "--arrival")
    if kwargs.get("timing_file"):
        check_timing(kwargs["timing_file"], model=kwargs.get("model"))
    check_timing_files(configs)


def check_timing_files(configs) -> None:
    """Each configuration's ``--timing`` file against its ``--gpu`` and ``--tensor-parallel``
    (``sim.simulate.file_timing``), each combination once, before the trace is loaded: the
    refusal came from building the simulation (`sweep` had printed its grid and started it,
    `advise` its search, `run` the file's dtype warning above the error line)."""
    from sim.simulate import file_timing  # noqa: PLC0415

    combos = dict.fromkeys(
        (c.timing_file, c.model, c.gpu, int(c.tensor_parallel or 0)) for c in configs if c.timing_file
    )
    for path, model, gpu, tp in combos:
        file_timing(path, model, gpu, tp)


def simulated_capacities(configs: list[SimConfig], trace=None) -> None:
    """Each configuration's ``capacity_bytes`` set to what it simulates (``engine_capacity``), so
    the header and summary.json say it; with the trace, a memory split that leaves no KV room for
    its shortest request is refused."""
    shortest = None
    if trace is not None and trace.requests:
        shortest = min(r.n_input_tokens(trace.block_tokens) for r in trace.requests)
    for c in configs:
        check_memory_split(c, shortest)
        c.capacity_bytes = engine_capacity(c)


def check_configs(given: list[str], given_trace: list[str], trace_specs: list[str], configs: list[SimConfig]) -> None:
    """A grid's (sweep) or a search's (advise) options, before any configuration runs: settings no
    configuration reads, trace options no trace reads, every timing file (each once, per model)."""
    refuse_inert_settings(given, configs)
    refuse_seed_without_draws(given, configs)
    refuse_unread_trace_options([s or "sharegpt" for s in trace_specs] or ["sharegpt"], given_trace)
    specs = [s or "sharegpt" for s in trace_specs] or ["sharegpt"]
    refuse_rate_on_open_loop(specs, "sessions_per_second" in given)
    refuse_rate_on_open_loop(specs, "arrival" in given, "--arrival")
    for path, model in dict.fromkeys((c.timing_file, c.model) for c in configs if c.timing_file):
        check_timing(path, model=model)
    check_timing_files(configs)


def refuse_missing_trace_paths(specs: list[str]) -> None:
    """A trace of a grid of no known kind (a file given without its kind), or whose file or folder
    does not exist, refused before any configuration runs: `sweep --trace
    synthetic:chat,mooncake:typo.jsonl` ran every configuration of the first trace, then stopped
    at the second's first with `mooncake file not found` (the workers load the traces, each when
    its turn comes). Hub datasets (``swebench:hf:``, ``lmsys``) are left to their
    loader, as are a bundled sample's names and stdin (``-``, refused there)."""
    from traces.registry import spec_paths, split_spec, trace_source, unknown_trace  # noqa: PLC0415

    for spec in dict.fromkeys(specs):
        source = trace_source(spec)
        kind, arg = split_spec(str(spec))
        if source is None and str(spec).strip():  # `--trace synthetic:chat,trace.jsonl`: refused before any run
            raise UsageError(str(unknown_trace(str(spec).strip())))
        if source is not None:  # `sharegpt:` (no path after the ':'), before the first trace's runs
            source.check_arg(arg)
        if source is None or not source.path_arg or not arg or arg == "-" or arg.startswith("hf:"):
            continue
        if spec_paths(spec):
            continue
        path = arg.split(":", 1)[1] if kind == "swebench" and arg.startswith("marconi:") else arg
        raise UsageError(f"--trace {spec}: no such file or folder: {path}")


def check_replay(ctx, config: SimConfig, trace_spec: str | None) -> None:
    """`marconi replay`'s options that cannot act (its scheduler knobs under fcfs, ``--coast-steps``
    without the continuous scheduler, trace options the trace does not read)."""
    from click.core import ParameterSource  # noqa: PLC0415

    from sim.cli.run import explicit_settings, refuse_unread_knobs  # noqa: PLC0415

    given = explicit_settings(ctx, {"capacity": "capacity_bytes"})
    refuse_unread_knobs([config.policy], given)  # --alpha with sglang+, as `run` refuses it
    refuse_inert_settings(given, [config])
    coast = ctx.get_parameter_source("coast_steps") if "coast_steps" in ctx.params else None
    if coast not in (ParameterSource.DEFAULT, None) and config.effective_scheduler == "fcfs":
        raise UsageError("--coast-steps does nothing under --scheduler fcfs (it is read by --scheduler continuous)")
    if _given(ctx, "batch_tokens") and ctx.params.get("batch", 1) == 1:
        raise UsageError("--batch-tokens does nothing with --batch 1 (it sizes the calls of --batch > 1): leave it out")
    refuse_unread_trace_options([trace_spec or "sharegpt"], given_trace_options(ctx))
    refuse_rate_on_open_loop([trace_spec or "sharegpt"], _given(ctx, "sessions_per_second"))


def _given(ctx, name: str) -> bool:
    """The user set option ``name`` on the command line (not left at its default)."""
    from click.core import ParameterSource  # noqa: PLC0415

    return name in ctx.params and ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)


def check_advise(ctx, trace_spec: str | None, fixed: dict) -> None:
    """`marconi advise`'s options that cannot act: trace options the trace does not read, a timing
    file that describes no machine, a rate out of range."""
    refuse_unread_trace_options([trace_spec or "sharegpt"], given_trace_options(ctx))
    # a rate (or arrival law) on a timestamped trace changed nothing, and the `marconi run` lines
    # printed to reproduce the advice carried it, which `marconi run` refuses
    refuse_rate_on_open_loop([trace_spec or "sharegpt"], _given(ctx, "sessions_per_second"))
    refuse_rate_on_open_loop([trace_spec or "sharegpt"], _given(ctx, "arrival"), "--arrival")
    if fixed.get("timing_file"):
        from sim.simulate import file_timing  # noqa: PLC0415

        check_timing(fixed["timing_file"], model=ctx.params.get("model"))
        file_timing(fixed["timing_file"], ctx.params.get("model"), fixed.get("gpu"), fixed.get("tensor_parallel", 0))
    rate = fixed.get("sessions_per_second", 1.0)
    if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
        raise UsageError(
            f"--sessions-per-second must be in {RATE_RANGE[0]:g}..{RATE_RANGE[1]:g} (sessions started per "
            f"second), not {rate!r}"
        )


def timing_dtype_warning(path, timing, model: str | None) -> str:
    """One line where a ``--timing`` file was fitted in another dtype than the one the model runs in
    (an fp32 CPU calibration priced a bf16 model's times without a word, while replay says it);
    "" where they agree or the file names no dtype. The file is still used as it is."""
    from dataclasses import fields  # noqa: PLC0415

    from sim.cost import get_model  # noqa: PLC0415

    name = model or next(f.default for f in fields(SimConfig) if f.name == "model")
    fitted, runs = getattr(timing, "dtype", ""), get_model(name).dtype
    if not fitted or fitted == runs:
        return ""
    return (
        f"warning: timing file {path} was fitted in {fitted}, and {name} runs in {runs}: its times are the "
        f"{fitted} fit's as they are (fit one in {runs}: marconi replay --dtype {runs} --calibrate FILE)"
    )
