"""Simulation settings: ``SimConfig``, five groups of knobs (trace, cache, engine, timing, tuning),
each knob one dataclass field whose default, help, choices and flag are written once and become a
``marconi run`` / ``marconi sweep`` / ``marconi replay`` flag (sim/cli/options.py) and a column of
every result row (flat, in ``ROW_ORDER``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace

from policies.admission import JudiciousAdmission
from policies.base import PolicyError
from policies.engine_common import StatePool
from policies.engines import MAX_BLOCK_TOKENS, ChunkedPrefill, VllmBlocks
from policies.lmdeploy import LmdeployParams
from policies.sglang_current import SglangParams
from policies.trtllm_current import FROM_END_FLAG, FROM_START_FLAG, TrtllmParams, snapshot_offsets
from policies.vllm_current import VllmParams
from policies.eviction import MarconiEviction
from sim.errors import UsageError
from sim.gpus import GPUS, canonical_gpu, unknown_gpu
from sim.tuning_options import LRU, MAX_ALPHAS, parse_candidates, parse_grid  # noqa: F401  (re-exported)
from sim.tuning_options import TunerParams, tuner_params

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {
    None: 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}


UNLIMITED = 2**62  # `--capacity inf`: a cache that never evicts (the `infinite` bound)


class SizeTooLarge(UsageError):
    """A size past ``UNLIMITED`` (``1e30GB``): its message suggests ``inf``, which an option that
    takes no unlimited size (``--gpu-memory`` with ``--gpu``) words otherwise."""


def refuse_unitless_memory(text: str, flag: str = "--gpu-memory") -> None:
    """A GPU's memory given as a bare number under 1000 (``--gpu-memory 80``) is bytes, which no GPU
    has: one line asking for the unit, not a run with 80 bytes of memory ("leaves 80B for KV")."""
    s = str(text).strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]*)?", s) and 0 < float(s) < 1000:  # 0: "must be > 0" says it
        raise UsageError(f"{flag} {s} is {s} bytes (a number without a unit is bytes): give its unit, e.g. {s}GB")


def engine_memory_bytes(text: str) -> int:
    """An engine's ``--gpu-memory`` (a size, as ``parse_size`` reads it); advise's ``2x80GB`` (N GPUs)
    is refused with the total to give instead."""
    m = re.fullmatch(r"\s*(\d+)\s*[x*]\s*(.+)", str(text), re.IGNORECASE)
    if m is not None:
        try:
            total = format_memory(int(m[1]) * parse_size(m[2]))
        except UsageError:
            total = None
        if total is not None:
            raise UsageError(
                f"--gpu-memory {text}: N x SIZE is `marconi advise`'s form; here give the memory itself ({total}), "
                "and the GPUs with --tensor-parallel"
            )
    return parse_size(text)


def parse_size(text: str | int | float) -> int:
    """'5GB' -> 5e9 bytes (decimal, as the Marconi artifact uses); '5GiB' -> 5 * 2**30;
    'inf' -> UNLIMITED."""
    if isinstance(text, float) and text == float("inf"):
        return UNLIMITED
    if isinstance(text, (int, float)):
        return int(text)
    if str(text).strip().lower() in ("inf", "infinite", "unlimited"):
        return UNLIMITED
    m = _SIZE_RE.match(str(text))
    if not m:
        hint = "; one capacity per run, lists are for `marconi sweep`" if "," in str(text) else ""
        raise UsageError(f"cannot read size {text!r} (examples: 5GB, 512MiB, 1e9){hint}")
    unit = m.group(2).lower() if m.group(2) else None
    value = float(m.group(1)) * _UNITS[unit]
    if not value < UNLIMITED:  # 1e999 reads as inf: say so instead of an OverflowError
        raise SizeTooLarge(f"size {text!r} is too large (use inf for a cache that never evicts)")
    return int(value)


def format_memory(n: int) -> str:
    """A memory size in whole GiB where it is one (a GPU's, as its datasheet counts it: 80GiB; a
    group of 2: 160GiB), else as ``format_size`` writes it."""
    if 0 < n < UNLIMITED and n % 2**30 == 0:
        return f"{n // 2**30}GiB"
    return format_size(n)


def format_gpu_memory(n: int) -> str:
    """A GPU group's memory printed beside other sizes: its datasheet's whole GiB and the same in GB
    (1e9 B, the unit every other size prints in, as --capacity reads GB): "160GiB = 171.8GB", so
    the sums beside it add up (0.9 of it is 154.6GB, not 144); else as ``format_size`` writes it."""
    if 0 < n < UNLIMITED and n % 2**30 == 0:
        return f"{n // 2**30}GiB = {n / 1e9:.4g}GB"
    return format_size(n)


def format_size(n: int) -> str:
    if n >= UNLIMITED:
        return "inf"
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n}B"


#: the sections a knob's option is listed under in `marconi run --help` (``setting(section=...)``;
#: a knob without one takes its group's, ``GROUP_SECTION``)
SECTIONS = ("cache", "engine", "preset", "tuning")


def setting(
    default,
    help: str,
    *,
    choices=None,
    flag: str | None = None,
    section: str | None = None,
    min: float | None = None,
    max: float | None = None,
    type: type | None = None,
    lead: dict | None = None,
    spelling=None,
    above: float | None = None,
    unknown=None,
):
    """A settings field with its help, allowed values and flag (``--`` + the name with dashes
    unless given): the one place its default and help are written; the CLI generates its option
    from them (sim/cli/options.py). ``section``: its `run --help` section (one of SECTIONS);
    ``type``: the option's value type where the default (None) does not say it; ``lead``: the
    knob is one of `run`'s first options, in a form of its own (``name``: the parameter's name,
    ``default``: the flag's default where it differs from the library's, as text); ``spelling``:
    maps another spelling of a choice to it (``sim.gpus.canonical_gpu``); ``unknown``: the line
    refusing a value of no choice (``sim.gpus.unknown_gpu``: the close entries, the catalogue)."""
    meta = {"help": help, "choices": tuple(choices) if choices else None, "flag": flag}
    extra = (("section", section), ("min", min), ("max", max), ("type", type), ("lead", lead), ("spelling", spelling))
    extra += (("above", above), ("unknown", unknown))
    meta.update({k: v for k, v in extra if v is not None})
    return field(default=default, metadata=meta)


def policy_knob(params_cls: type, name: str, **kw):
    """A settings field that is a policy's knob: default, help, choices and range come from the
    ``Params`` (written there once); ``kw``: ``section`` / ``lead`` as :func:`setting`'s."""
    f = {f.name: f for f in fields(params_cls)}[name]
    return setting(
        f.default,
        f.metadata["help"],
        choices=f.metadata.get("choices"),
        flag=f.metadata.get("flag"),
        min=f.metadata.get("min"),
        max=f.metadata.get("max"),
        above=f.metadata.get("above"),
        **kw,
    )


def flag_of(f) -> str:
    """The command-line flag of a settings field."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _either(choices: tuple) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


def refuse_bad_choices(settings, fields_=None) -> None:
    """Refuses a field of ``settings`` (``fields_``, in order; default: the dataclass's fields)
    whose value is not one of its ``choices`` (one line naming the flag; None passes where None is
    the default)."""
    for f in fields(settings) if fields_ is None else fields_:
        choices = f.metadata.get("choices")
        value = getattr(settings, f.name)
        if choices and value not in choices and not (value is None and f.default is None):
            raise UsageError(f"{flag_of(f)} must be {_either(choices)}, not {value!r}")


# ---------------------------------------------------------------------------------- the five groups


@dataclass
class TraceSettings:
    """How the trace's sessions arrive."""

    sessions_per_second: float = setting(
        1.0,
        "Closed-loop traces: sessions started per second (session i at i / rate, or Poisson with --arrival "
        "poisson); open-loop traces (mooncake, bailian, marconi-jsonl) keep their own timestamps.",
        section="engine",
        lead={},
    )
    arrival: str = setting(
        "uniform", "Session starts: i / rate (paper) or Poisson.", choices=("uniform", "poisson"), section="engine"
    )
    seed: int = setting(
        0, "Seed of the Poisson session starts (--arrival poisson); uniform arrivals draw nothing.", section="engine"
    )


@dataclass
class CacheSettings:
    """The policy, the model whose states and KV it caches, and the cache."""

    policy: str = setting(
        "marconi",
        "Comma-separated policies (vanilla, vllm+, sglang+, marconi, ...).",
        section="cache",
        lead={"name": "policies", "default": "vllm+,sglang+,marconi"},
    )
    model: str = setting(
        "marconi-7b",
        "Model preset (see `marconi models`), or a Hugging Face config.json (or a folder holding one) of a "
        "Qwen3-Next / Qwen3.5, Nemotron-H, Jamba, Falcon-H1, Granite 4.0, Mamba2 or llama model (docs/models.md).",
        section="cache",
    )
    capacity_bytes: int = setting(
        5 * 10**9,
        "Cache capacity (5GB = 5e9 B, 5GiB = 5*2^30 B).",
        flag="--capacity",
        section="cache",
        lead={"name": "capacity", "default": "5GB"},
    )
    # a float, or "auto" (the flag's default: tuned while the trace runs)
    alpha: float | str = policy_knob(MarconiEviction.Params, "alpha", section="cache", lead={"default": "auto"})
    state_alignment: str = policy_knob(JudiciousAdmission.Params, "state_alignment", section="cache")
    chunk_size: int = policy_knob(JudiciousAdmission.Params, "chunk_size", section="cache")


@dataclass
class EngineSettings:
    """The serving engine: how requests are scheduled, and the engines' own knobs
    (policies/*_current.py, named as the engines name them)."""

    mode: str = setting(
        "des",
        "des: discrete-event (arrivals, queueing, --scheduler, paths pinned while in use); sequential: the "
        "artifact's replay, one request after another.",
        choices=("des", "sequential"),
    )
    # corrected | paper (the artifact as published: its replay semantics, logical clock and two
    # bugs) | paper-fixed (the artifact's semantics with exactly its two bugs fixed): sim.compat
    compat: str = setting(
        "corrected",
        "paper: the Marconi artifact as published (its replay, logical clock and two "
        "bugs); paper-fixed: the same with its two bugs fixed; corrected: exact capacity, pinning.",
        choices=("corrected", "paper", "paper-fixed"),
    )
    servers: int = setting(1, "Prefill servers (simpy resources; --scheduler fcfs).")
    scheduler: str = setting(
        "auto",
        "continuous: one engine stepping batches of decode tokens and prefill chunks (vLLM-style "
        "chunked prefill), running requests' KV and states charged to --capacity; fcfs: each "
        "request prefills alone on one of --servers, FIFO, then decodes off the server; auto: "
        "continuous in --mode des with one engine and --ttft-model flops, fcfs otherwise.",
        choices=("auto", "continuous", "fcfs"),
    )
    max_num_batched_tokens: int = setting(
        8192, "--scheduler continuous: tokens per engine step (decode tokens plus prefill chunks)."
    )
    max_num_seqs: int = setting(256, "--scheduler continuous: requests running at once.")
    prefill_chunk_tokens: int = policy_knob(ChunkedPrefill, "prefill_chunk_tokens", section="preset")
    block_size: int = policy_knob(VllmBlocks, "block_size", section="preset")
    state_pool: str = policy_knob(StatePool, "state_pool", section="preset")
    mamba_radix_cache_strategy: str = policy_knob(SglangParams, "mamba_radix_cache_strategy", section="preset")
    mamba_track_interval: int = policy_knob(SglangParams, "mamba_track_interval", section="preset")
    page_size: int = policy_knob(SglangParams, "page_size", section="preset")
    mamba_full_memory_ratio: float = policy_knob(SglangParams, "mamba_full_memory_ratio", section="preset")
    gpu_memory: str = policy_knob(SglangParams, "gpu_memory", section="preset")
    max_mamba_cache_size: int = policy_knob(SglangParams, "max_mamba_cache_size", section="preset")
    prefix_cache_retention_interval: int = policy_knob(VllmParams, "prefix_cache_retention_interval", section="preset")
    enable_mamba_shared_prefix_checkpoint: bool = policy_knob(
        VllmParams, "enable_mamba_shared_prefix_checkpoint", section="preset"
    )
    speculative_method: str = policy_knob(VllmParams, "speculative_method", section="preset")
    speculative_tokens: int = policy_knob(VllmParams, "speculative_tokens", section="preset")
    periodic_snapshot_interval: int = policy_knob(TrtllmParams, "periodic_snapshot_interval", section="preset")
    additional_snapshot_offsets_from_start: str = policy_knob(
        TrtllmParams, "additional_snapshot_offsets_from_start", section="preset"
    )
    additional_snapshot_offsets_from_end: str = policy_knob(
        TrtllmParams, "additional_snapshot_offsets_from_end", section="preset"
    )
    prefix_cache_decode_state_interval: int = policy_knob(
        LmdeployParams, "prefix_cache_decode_state_interval", section="preset"
    )


@dataclass
class TimingSettings:
    """What prices time: the TTFT model, a timing file, the GPU and its tensor-parallel group."""

    ttft_model: str = setting(
        "flops",
        "flops: FLOPs / throughput + overhead; jamba: the paper's fitted Jamba-1.5-Mini table.",
        choices=("flops", "jamba"),
    )
    timing_file: str | None = setting(
        None,
        "Timing file written by `marconi replay --calibrate FILE` (the hardware model fitted to a replay "
        "with the project's kernels) [default: the committed calibration of the GPU priced, "
        "sim/data/h200-timing.json without --gpu (see --gpu); the paper's A100 fit for marconi-7b and "
        "llama-7b on the paper's GPU (--gpu a100-40gb) or without --gpu].",
        flag="--timing",
    )
    gpu: str | None = setting(
        None,
        "GPU whose datasheet prices time (sim/gpus.py): its calibrated timing where one is committed, "
        "else the calibrated model scaled by the datasheet (said 'uncalibrated for GPU') "
        "[default: the preset's calibrated device, H200; A100 40GB (a100-40gb) for marconi-7b and llama-7b].",
        choices=tuple(GPUS),
        spelling=canonical_gpu,
        unknown=unknown_gpu,
    )
    tensor_parallel: int = setting(
        0,
        "GPUs of one tensor-parallel group: KV heads and Mamba groups fewer than N replicated, compute "
        "split N ways, an all-reduce after every block over the GPU's links; --capacity is the group's "
        "cache. 0: the preset's GPU count with ideal scaling.",
        min=0,
        max=64,
    )


#: SimConfig's parts: group name -> its dataclass (the tuning knobs are sim/tuning_options.py's
#: TunerParams, frozen: a flat assignment replaces the part)
GROUPS: dict[str, type] = {
    "trace": TraceSettings,
    "cache": CacheSettings,
    "engine": EngineSettings,
    "timing": TimingSettings,
    "tuning": TunerParams,
}
#: the `run --help` section of a group's knobs that name none
GROUP_SECTION = {"trace": "engine", "cache": "cache", "engine": "engine", "timing": "engine", "tuning": "tuning"}
#: the flat order of the knobs: SimConfig's keywords and the result row's columns as ROW_VERSION 2
#: wrote them (stored rows keep it); a knob added to a group later comes after these, in its
#: group's order. The tuning knobs stay together, in TunerParams' order.
ROW_ORDER = (
    "policy", "model", "capacity_bytes", "alpha", "state_alignment", "chunk_size", "mode", "compat",
    "sessions_per_second", "arrival", "servers", "scheduler", "max_num_batched_tokens", "max_num_seqs",
    "ttft_model", "timing_file", "gpu", "tensor_parallel", "seed",
    *(f.name for f in fields(TunerParams)),
    "prefill_chunk_tokens", "block_size", "state_pool", "mamba_radix_cache_strategy", "mamba_track_interval",
    "page_size", "mamba_full_memory_ratio", "gpu_memory", "max_mamba_cache_size",
    "prefix_cache_retention_interval", "enable_mamba_shared_prefix_checkpoint", "speculative_method",
    "speculative_tokens", "periodic_snapshot_interval", "additional_snapshot_offsets_from_start",
    "additional_snapshot_offsets_from_end", "prefix_cache_decode_state_interval",
)  # fmt: skip


def _knob_table() -> dict:
    """knob name -> (group, field), in the flat order."""
    table = {f.name: (group, f) for group, cls in GROUPS.items() for f in fields(cls)}
    order = [n for n in ROW_ORDER if n in table] + [n for n in table if n not in ROW_ORDER]
    return {n: table[n] for n in order}


_KNOBS = _knob_table()


def section_of(name: str) -> str:
    """The `run --help` section (one of SECTIONS) of knob ``name``."""
    group, f = _KNOBS[name]
    return f.metadata.get("section") or GROUP_SECTION[group]


def _flat_property(group: str, name: str, doc: str) -> property:
    """``config.name``: the knob read from, and written to, its group (a frozen group is replaced)."""

    def get(self):
        return getattr(getattr(self, group), name)

    def set_(self, value) -> None:
        part = getattr(self, group)
        if part.__dataclass_params__.frozen:
            setattr(self, group, replace(part, **{name: value}))
        else:
            setattr(part, name, value)

    return property(get, set_, doc=doc)


@dataclass(init=False)
class SimConfig:
    """A simulation's settings, in five groups (``trace``, ``cache``, ``engine``, ``timing``,
    ``tuning``: GROUPS). Every knob is also read and written by its own name (``config.alpha``),
    and ``SimConfig(alpha=1, capacity_bytes=...)`` takes them flat, as the result rows name them;
    ``SimConfig(cache=CacheSettings(...))`` takes whole groups (copied: two configs never share one)."""

    trace: TraceSettings
    cache: CacheSettings
    engine: EngineSettings
    timing: TimingSettings
    tuning: TunerParams

    def __init__(self, *, trace=None, cache=None, engine=None, timing=None, tuning=None, **flat) -> None:
        given = {"trace": trace, "cache": cache, "engine": engine, "timing": timing, "tuning": tuning}
        for group, cls in GROUPS.items():
            part = given[group]
            setattr(self, group, cls() if part is None else replace(part))
        for name, value in flat.items():
            if name not in _KNOBS:
                raise TypeError(f"SimConfig got an unexpected keyword argument {name!r}")
            setattr(self, name, value)

    @classmethod
    def from_flat(cls, **knobs) -> "SimConfig":
        """A config from knobs named as the result rows name them (``SimConfig(**knobs)``)."""
        return cls(**knobs)

    def to_flat(self) -> dict:
        """Every knob by name, in the flat order (as configured: ``scheduler`` may be ``auto``)."""
        return {name: getattr(self, name) for name in _KNOBS}

    def validate(self) -> None:
        refuse_bad_choices(self, self.knobs())
        if self.compat != "corrected" and self.mode != "sequential":
            # the artifact replays requests one at a time in timestamp order (docs/presets.md §5): it has
            # no servers, queues or pinning to reproduce in a discrete-event run
            raise UsageError(
                f"--compat {self.compat} reproduces the Marconi artifact's sequential replay: "
                "use it with --mode sequential"
            )
        if self.capacity_bytes <= 0:
            raise UsageError("capacity must be positive")
        if not 0 < self.sessions_per_second < math.inf:  # NaN fails both comparisons
            raise UsageError(f"--sessions-per-second must be a finite number > 0, not {self.sessions_per_second!r}")
        if self.servers < 1:
            raise UsageError("--servers must be >= 1")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise UsageError("--max-num-batched-tokens and --max-num-seqs must be >= 1")
        if self.scheduler == "continuous" and self.mode != "des":
            raise UsageError("--scheduler continuous steps a discrete-event engine: use it with --mode des")
        if self.scheduler == "continuous" and self.servers != 1:
            raise UsageError("--servers applies to --scheduler fcfs; continuous batching models one engine")
        if self.scheduler == "continuous" and self.ttft_model != "flops":
            raise UsageError("--scheduler continuous times whole steps with the FLOPs model: use --ttft-model flops")
        if self.seed < 0:  # numpy's generators take non-negative seeds only
            raise UsageError(f"--seed must be >= 0, not {self.seed}")
        if self.prefill_chunk_tokens < 1:
            raise UsageError("--prefill-chunk must be >= 1")
        if not 0 <= self.block_size <= MAX_BLOCK_TOKENS:
            raise UsageError(
                f"--block-size must be 0 (the engine's default) or 1 to {MAX_BLOCK_TOKENS} tokens, "
                f"not {self.block_size}"
            )
        self.check_ranges({f.name: getattr(self, f.name) for f in self.knobs()})
        if self.speculative_tokens >= self.max_num_batched_tokens:
            # a verify step runs a request's K draft tokens and its sampled one in one engine step;
            # vLLM refuses a step budget that leaves no room past them (max_num_batched_tokens <=
            # num_lookahead_tokens: vllm/config/vllm.py VllmConfig._set_max_num_scheduled_tokens, 0.34.0)
            raise UsageError(
                f"--speculative-tokens {self.speculative_tokens} is more draft tokens than an engine step holds: a "
                f"verify step runs them and the sampled token in one step of --max-num-batched-tokens "
                f"{self.max_num_batched_tokens} (vLLM refuses num_speculative_tokens >= max_num_batched_tokens); "
                f"give at most {self.max_num_batched_tokens - 1}"
            )
        if self.gpu_memory:
            refuse_unitless_memory(self.gpu_memory)
            try:
                nbytes = engine_memory_bytes(self.gpu_memory)
            except SizeTooLarge:  # it said "use inf", which --gpu refuses as more than its memory
                g = GPUS.get(canonical_gpu(self.gpu)) if self.gpu else None
                each = f" ({format_memory(g.memory_bytes)} a GPU)" if g else ""
                most = (
                    f"at most the memory of the --gpu {self.gpu} group{each}"
                    if self.gpu
                    else "a size, or inf for no limit"
                )
                raise UsageError(f"--gpu-memory {self.gpu_memory} is too large: give {most}") from None
            if nbytes <= 0:  # the split's "leaves 0B for KV" blamed the ratio
                raise UsageError(f"--gpu-memory must be a size > 0 (bytes with a unit), not {self.gpu_memory!r}")
        try:  # TensorRT-LLM's offset lists: refused before anything is loaded
            snapshot_offsets(self.additional_snapshot_offsets_from_start, FROM_START_FLAG, 1)
            snapshot_offsets(self.additional_snapshot_offsets_from_end, FROM_END_FLAG, 0)
        except PolicyError as exc:
            raise UsageError(str(exc)) from None
        if self.chunk_size < 1:
            raise UsageError("--chunk-size must be >= 1")
        tuner_params(self).validate()
        if isinstance(self.alpha, str):
            if self.alpha != "auto":
                raise UsageError(f"--alpha must be a number or 'auto', not {self.alpha!r}")
        elif not 0 <= self.alpha < math.inf:  # NaN fails both comparisons
            raise UsageError(f"--alpha must be a finite number >= 0 or 'auto', not {self.alpha!r}")

    @classmethod
    def knobs(cls) -> list:
        """Every knob's field (each group's dataclass field), in the flat order."""
        return [f for _, f in _KNOBS.values()]

    @classmethod
    def check_ranges(cls, values: dict) -> None:
        """Each knob of ``values`` (name -> value) within its own range (policies' Params: min /
        max, above), else one UsageError line naming its flag: ``validate`` does it, and so can a
        command that uses a knob before it builds its configurations (advise's --tensor-parallel)."""
        for name, value in values.items():
            if name not in _KNOBS:
                continue
            f = cls.knob(name)
            lo, hi = f.metadata.get("min"), f.metadata.get("max")
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and ((lo is not None and not value >= lo) or (hi is not None and not value <= hi))
            ):
                bound = f">= {lo:g}" if hi is None else f"in {lo:g}..{hi:g}" if lo is not None else f"<= {hi:g}"
                raise UsageError(f"{flag_of(f)} must be {bound}, not {value!r}")
            above = f.metadata.get("above")  # an open bound: 0 itself is refused too
            if above is not None and isinstance(value, (int, float)) and not above < value < math.inf:
                raise UsageError(f"{flag_of(f)} must be a finite number > {above:g}, not {value!r}")

    @classmethod
    def knob(cls, name: str):
        """The field of knob ``name`` (its default, help, choices, flag)."""
        return _KNOBS[name][1]

    @classmethod
    def group_of(cls, name: str) -> str:
        """The group (a key of GROUPS) holding knob ``name``."""
        return _KNOBS[name][0]

    @classmethod
    def settings(cls, group: str) -> list:
        """The knobs' fields of `run`'s option ``group``, in the flat order: "lead" (the options
        `run` lists first, in a form of their own: ``setting(lead=...)``), "tuning" (read only by
        ``--alpha auto`` and ``marconi-oracle``) or "sim" (every other knob of `run` and `sweep`)."""

        def group_of(name: str, f) -> str:
            if "lead" in f.metadata:
                return "lead"
            return "tuning" if _KNOBS[name][0] == "tuning" else "sim"

        return [f for name, (_, f) in _KNOBS.items() if group_of(name, f) == group]

    @property
    def effective_scheduler(self) -> str:
        """The scheduler that runs: ``auto`` is ``continuous`` in a discrete-event run of one engine
        timed by the FLOPs model (what the serving engines do), ``fcfs`` otherwise (the sequential
        replay, several prefill servers, the Jamba TTFT table)."""
        if self.scheduler != "auto":
            return self.scheduler
        if self.mode == "des" and self.servers == 1 and self.ttft_model == "flops":
            return "continuous"
        return "fcfs"

    def as_row(self) -> dict:
        """The configuration as a flat result row (the scheduler that ran, ``auto`` resolved)."""
        row = self.to_flat()
        row["scheduler"] = self.effective_scheduler
        return row

    @classmethod
    def field_names(cls) -> list[str]:
        """Every knob's name, in the flat order (the row's columns)."""
        return list(_KNOBS)


for _name, (_group, _field) in _KNOBS.items():  # config.alpha: the knob in its group
    setattr(SimConfig, _name, _flat_property(_group, _name, _field.metadata.get("help", "")))
del _name, _group, _field
