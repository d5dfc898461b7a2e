"""What `marconi advise` searches: each engine's own knobs, and how GPU memory becomes cache.

``ENGINES`` is the one table that maps ``--for ENGINE`` to the simulator: which presets stand for
the engine (and the engine flag that picks between them), the knobs searched (engine flag, values
or range, the engine's default, the SimConfig fields a value sets) and the engine's memory rule.
Besides the knobs written here, every knob of a preset's ``Params`` (its policies' and its own
``extra_knobs``) whose metadata carries ``choices``, both bounds ``min`` and ``max`` (what
:func:`policies.base.knob` writes) or a ``range`` (``(low, high)`` or ``(low, high, "log")``) is
searched too (:func:`derived_knobs`), provided SimConfig has a field of that name for the value to
reach the policy through: a knob added to a preset and to SimConfig later needs no change here.

``--for sglang``, ``vllm`` and ``trtllm`` are the engines as they ship today (the presets
``sglang``, ``vllm``, ``trtllm``, with today's flags); ``--for sglang-0.5.9`` and ``vllm-0.11``
keep the earlier versioned presets and their flags. A knob may be conditional (``when``: SGLang's
page size and track interval exist only outside no_buffer, vLLM's retention interval only without
EAGLE / MTP), so a sampled point is a combination the preset accepts; a point the preset still
refuses (a combination with a setting fixed on the command line) is pruned by the search.

Memory (docs/advise.md): ``--gpu-memory`` is the memory of the serving instance (``2x80GB`` for two
GPUs). The engine's memory fraction is applied either to the whole memory (SGLang
``--mem-fraction-static``, vLLM ``--gpu-memory-utilization``) or to what the weights leave free
(LMDeploy ``--cache-max-entry-count``, TensorRT-LLM ``free_gpu_memory_fraction``), the bf16
weights (total parameters x 2 bytes) are subtracted, and the rest is the prefix cache
(``--capacity``). Knobs that split it (SGLang ``--mamba-full-memory-ratio``, LMDeploy's state
budget) become ``--state-pool`` counts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from policies.base import get_preset
from policies.sglang_current import DEFAULT_MEMORY_RATIO, DEFAULT_TRACK_INTERVAL
from policies.vllm import MAX_BLOCK, vllm_block_tokens
from policies.vllm_current import DENSE
from sim.config import SimConfig, format_gpu_memory, format_size, parse_size, refuse_unitless_memory
from sim.cost import ModelSpec
from sim.errors import UsageError

WEIGHT_BYTES_PER_PARAM = 2  # bf16 weights

#: total parameters of the model presets (MoE: every expert, not only the active ones); a preset
#: not listed here is dense and its active parameters are its total. A ``total_params`` attribute
#: of the ModelSpec, where the cost model has one, wins.
TOTAL_PARAMS = {
    "marconi-7b": 7e9,
    "llama-7b": 6.74e9,
    "qwen3.5-9b": 9e9,
    "qwen3.5-27b": 27e9,
    "qwen3.5-35b-a3b": 35e9,
    "qwen3-next-80b-a3b": 80e9,
    "qwen3.5-122b-a10b": 122e9,
    "qwen3.5-397b-a17b": 397e9,
}

#: Params fields that are modelling choices of the simulator, not engine settings: never searched
NOT_ENGINE_KNOBS = ("state_alignment", "chunk_size")

PREFILL_CHUNKS = (2048, 4096, 8192, 16384)
MARCONI_ALPHAS = ("auto", "0", "0.1", "0.2", "0.4", "0.7", "1", "1.5", "2", "3")
SGLANG_PAGES = (1, 16, 32, 64)  # all divide every track interval below
SGLANG_TRACK_INTERVALS = (128, 256, 512, 1024, 2048)
TRTLLM_SNAPSHOT_INTERVALS = (0, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Context:
    """What the knobs' values and bounds depend on: the model and the cache the memory leaves."""

    spec: ModelSpec
    capacity_bytes: int
    block_tokens: int = 1  # the trace's block (Mooncake: 512): a preset's grid is 1 or a multiple of it

    def fits_grid(self, tokens: int) -> bool:
        """A grid of ``tokens`` the simulator can lay over the trace's blocks."""
        return tokens <= 1 or tokens % self.block_tokens == 0

    @property
    def max_states(self) -> int:
        return max(self.capacity_bytes // max(self.spec.state_bytes(), 1), 1)


@dataclass(frozen=True)
class Knob:
    """One searched setting, named as the engine names it.

    ``choices`` (values as the engine takes them, or a function of the Context) or a numeric range
    ``low``..``high`` (``high`` may be a function of the Context; ``integer``, ``log``). ``apply``
    turns a value into SimConfig fields (default: the field ``name``). ``hybrid_only``: meaningless
    for a model without recurrent state. ``when(view)``: the knob exists only where it says True,
    ``view`` holding the settings fixed on the command line and the knobs chosen before this one
    (None: always)."""

    name: str
    flag: str
    default: Any
    choices: tuple | Callable | None = None
    low: float | None = None
    high: float | Callable | None = None
    integer: bool = False
    log: bool = False
    apply: Callable | None = None
    hybrid_only: bool = True
    help: str = ""
    sets: tuple = ()  # SimConfig fields ``apply`` sets (default: the field ``name``)
    when: Callable | None = None

    def active(self, view: dict) -> bool:
        return self.when is None or bool(self.when(view))

    @property
    def fields_set(self) -> tuple:
        return self.sets or (self.name,)

    def values(self, ctx: Context) -> tuple | None:
        return self.choices(ctx) if callable(self.choices) else self.choices

    def bounds(self, ctx: Context) -> tuple[float, float]:
        high = self.high(ctx) if callable(self.high) else self.high
        return self.low, high

    def distribution(self, ctx: Context):
        """The Optuna distribution of this knob under ``ctx``."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        vals = self.values(ctx)
        if vals is not None:
            return CategoricalDistribution(list(vals))
        low, high = self.bounds(ctx)
        if self.integer:
            return IntDistribution(int(low), int(max(high, low)), log=self.log)
        return FloatDistribution(float(low), float(max(high, low)), log=self.log)

    def searchable(self, ctx: Context) -> bool:
        """More than one value to choose from."""
        vals = self.values(ctx)
        if vals is not None:
            return len(vals) > 1
        low, high = self.bounds(ctx)
        return high > low

    def sim_fields(self, value, ctx: Context) -> dict:
        return self.apply(value, ctx) if self.apply else {self.name: value}


# ---------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class Memory:
    """How an engine sizes its cache: ``fraction`` of the whole memory (``of="total"``) or of what
    the weights leave (``of="free"``), named by the engine's ``flag``."""

    flag: str
    fraction: float
    of: str = "total"

    def cache_bytes(self, gpu_bytes: int, weight_bytes: int) -> int:
        if self.of == "total":
            return int(gpu_bytes * self.fraction) - weight_bytes
        return int((gpu_bytes - weight_bytes) * self.fraction)


_GPU_RE = re.compile(r"^\s*(?:(\d+)\s*[x*]\s*)?(.+)$", re.IGNORECASE)


def gpu_memory_count(text: str) -> int | None:
    """The GPU count a --gpu-memory spells (``2x80GB``: 2), None where it spells none (``160GB``)."""
    m = _GPU_RE.match(str(text))
    return int(m.group(1)) if m and m.group(1) else None


def parse_gpu_memory(text: str) -> int:
    """'80GB' -> 80e9 bytes; '2x80GB' -> 160e9 (the instance's GPUs together)."""
    m = _GPU_RE.match(str(text))
    refuse_unitless_memory(m.group(2) if m else text)  # "--gpu-memory 80" is 80 bytes
    n = int(m.group(1)) if m and m.group(1) else 1
    if n < 1:
        raise UsageError(f"--gpu-memory {text!r}: the GPU count must be >= 1")
    try:
        size = parse_size(m.group(2) if m else text)
    except UsageError as exc:
        if "too large" not in str(exc):
            raise
        size = math.inf  # parse_size's hint (inf: a cache that never evicts) is no memory here
    if size <= 0 or size >= 2**60:
        raise UsageError(f"--gpu-memory must be a finite size > 0, not {text!r}")
    return n * size


def weight_bytes(spec: ModelSpec) -> int:
    """The model's weights: total parameters x 2 bytes (bf16), or a quantized config.json's own
    (``spec.weight_bytes``, named by ``spec.weight_dtype``)."""
    if getattr(spec, "weight_bytes", 0):
        return int(spec.weight_bytes)
    total = getattr(spec, "total_params", 0) or TOTAL_PARAMS.get(spec.name) or spec.active_params()
    return int(total * WEIGHT_BYTES_PER_PARAM)


# ---------------------------------------------------------------------------------- engines


def _sglang_ratio(value, ctx: Context) -> dict:
    """SGLang 0.5.9's ``--mamba-full-memory-ratio r``: the mamba pool is r times the
    full-attention (KV) pool, so states get r / (1 + r) of the cache, counted in whole states."""
    states = int(ctx.capacity_bytes * value / (1 + value) // max(ctx.spec.state_bytes(), 1))
    return {"state_pool": str(max(states, 1))}


def _sglang_split(value, ctx: Context) -> dict:
    """Today's ``--mamba-full-memory-ratio r``: the preset's own split of the engine's memory (its
    ``--gpu-memory``, the cache the memory rule leaves) between the KV and the mamba pool."""
    return {"mamba_full_memory_ratio": float(value), "gpu_memory": str(ctx.capacity_bytes)}


def _state_budget(value, ctx: Context) -> dict:
    """LMDeploy ``prefix_cache_state_budget``: 0 shares one budget, N > 0 is a pool of N states."""
    return {"state_pool": str(int(value)) if int(value) > 0 else ""}


def _vllm_blocks(ctx: Context) -> tuple:
    """vLLM's block: 0 = the hybrid block derived per model (its default), or 2x / 4x it (up to
    the largest block the simulator hashes)."""
    B = vllm_block_tokens(ctx.spec)
    return (0, *(m * B for m in (2, 4) if m * B <= MAX_BLOCK and ctx.fits_grid(m * B)))


def _vllm_retention(ctx: Context) -> tuple:
    """``--prefix-cache-retention-interval``: 0 (the default: semantic states only), 1, 2 or 4
    times the largest block searched, or -1 (every state). vLLM refuses an interval that is not a
    multiple of the block (``kv_cache_coordinator.py`` ``_validate_prefix_cache_retention_interval``),
    and the block is a knob of its own, so the intervals are multiples of every block searched."""
    L = max(b or vllm_block_tokens(ctx.spec) for b in _vllm_blocks(ctx))
    return (0, L, 2 * L, 4 * L, DENSE)


def _lmdeploy_budget_high(ctx: Context) -> int:
    return max(ctx.max_states * 3 // 4, 1)  # leave the KV pool at least a quarter


def _prefill_knob(flag: str, default: int = 8192) -> Knob:
    return Knob(
        "prefill_chunk_tokens",
        flag,
        default,
        choices=PREFILL_CHUNKS,
        help="chunked prefill: where no_buffer / align / LMDeploy place prefill states",
    )


def _sglang_pages(ctx: Context) -> tuple:
    return tuple(p for p in SGLANG_PAGES if ctx.fits_grid(p))


def _not_no_buffer(view: dict) -> bool:
    return view.get("mamba_radix_cache_strategy", "auto") != "no_buffer"


def _no_speculation(view: dict) -> bool:
    return view.get("speculative_method", "none") == "none"


def _flags_cli(command: str, flags: list) -> str:
    """``command --flag value ...``; a boolean flag on is the flag alone, off is left out."""
    words = [command]
    for f, v in flags:
        if v == "True":
            words.append(f)
        elif v != "False":
            words.append(f"{f} {v}")
    return " ".join(w for w in words if w).strip()


def _flags_trtllm(command: str, flags: list) -> str:
    """TensorRT-LLM takes its cache settings in the YAML of ``--extra_llm_api_options``."""
    conf = ", ".join(f"{f}: {v}" for f, v in flags)
    return f"{command}  # extra.yaml: kv_cache_config.enable_block_reuse: true" + (f", {conf}" if conf else "")


@dataclass(frozen=True)
class Engine:
    """One ``--for`` target: the engine flag choosing between ``presets`` (engine value -> preset
    name; its first entry the engine's default), its knobs and its memory rule. ``exclude``:
    preset knobs that are not cache settings (never searched; give one on the command line to fix
    it); ``render``: the engine's command line from (flag, value) pairs."""

    name: str
    presets: dict
    memory: Memory
    mode_flag: str | None = None
    knobs: tuple = ()
    command: str = ""  # how the engine is started (the recommendation's first words)
    fixed: dict = field(default_factory=dict)  # SimConfig fields every trial of this engine sets
    exclude: tuple = ()
    render: Callable = _flags_cli
    version: str = "today"
    tp_flag: str = ""  # the engine's tensor-parallel flag: the recommendation on a group of GPUs names it


_SGLANG_MEMORY = Memory("--mem-fraction-static", 0.88)
_VLLM_MEMORY = Memory("--gpu-memory-utilization", 0.9)

ENGINES: dict[str, Engine] = {
    "sglang": Engine(
        "sglang",
        {"default": "sglang"},
        _SGLANG_MEMORY,
        knobs=(
            Knob(
                "mamba_radix_cache_strategy",
                "--mamba-radix-cache-strategy",
                "auto",
                choices=("auto", "no_buffer"),
                help="auto = extra_buffer (extra_buffer_lazy places states as extra_buffer: not searched apart)",
            ),
            Knob(
                "page_size",
                "--page-size",
                1,
                choices=_sglang_pages,
                when=_not_no_buffer,
                help="tokens per KV page (no_buffer needs 1)",
            ),
            Knob(
                "mamba_track_interval",
                "--mamba-track-interval",
                DEFAULT_TRACK_INTERVAL,
                choices=SGLANG_TRACK_INTERVALS,
                when=_not_no_buffer,
                help="decode tokens between tracked states (extra_buffer; a multiple of the page)",
            ),
            Knob(
                "mamba_full_memory_ratio",
                "--mamba-full-memory-ratio",
                DEFAULT_MEMORY_RATIO,
                low=0.05,
                high=9.0,
                log=True,
                apply=_sglang_split,
                sets=("mamba_full_memory_ratio", "gpu_memory", "state_pool", "max_mamba_cache_size"),
                help="mamba pool / full-attention KV pool",
            ),
            _prefill_knob("--chunked-prefill-size"),
        ),
        command="python -m sglang.launch_server --model-path {model}",
        tp_flag="--tp-size",
    ),
    "vllm": Engine(
        "vllm",
        {"default": "vllm"},
        _VLLM_MEMORY,
        knobs=(
            Knob(
                "prefix_cache_retention_interval",
                "--prefix-cache-retention-interval",
                0,
                choices=_vllm_retention,
                when=_no_speculation,
                help="0: semantic states only; N: also every block boundary on a multiple of N; -1: every state",
            ),
            Knob("block_size", "--block-size", 0, choices=_vllm_blocks, help="0: derived per model"),
            _prefill_knob("--max-num-batched-tokens"),
        ),
        command="vllm serve {model} --enable-prefix-caching",
        exclude=("speculative_method",),
        tp_flag="--tensor-parallel-size",
    ),
    "lmdeploy": Engine(
        "lmdeploy",
        {"block_trie": "lmdeploy"},
        Memory("--cache-max-entry-count", 0.8, of="free"),
        knobs=(
            Knob("block_size", "--cache-block-seq-len", 64, choices=(16, 32, 64, 128, 256), hybrid_only=False),
            Knob(
                "prefix_cache_state_budget",
                "--prefix-cache-state-budget",
                0,
                low=0,
                high=_lmdeploy_budget_high,
                integer=True,
                apply=_state_budget,
                sets=("state_pool",),
                help="0: states share the KV budget",
            ),
            _prefill_knob("--max-prefill-token-num"),
        ),
        command="lmdeploy serve api_server {model} --backend pytorch --enable-prefix-caching",
        tp_flag="--tp",
    ),
    "trtllm": Engine(
        "trtllm",
        {"default": "trtllm"},
        Memory("free_gpu_memory_fraction", 0.9, of="free"),
        knobs=(
            Knob(
                "periodic_snapshot_interval",
                "kv_cache_config.mamba_state_config.periodic_snapshot_interval",
                0,
                choices=TRTLLM_SNAPSHOT_INTERVALS,
                help="tokens between recurrent-state snapshots (0: none, so no hybrid block reuse)",
            ),
        ),
        command="trtllm-serve {model} --extra_llm_api_options extra.yaml",
        render=_flags_trtllm,
        tp_flag="--tp_size",
    ),
    "marconi": Engine(
        "marconi",
        {"marconi": "marconi"},
        Memory("--gpu-memory-utilization", 0.9),
        knobs=(
            Knob(
                "alpha",
                "--alpha",
                "auto",
                choices=MARCONI_ALPHAS,
                apply=lambda v, ctx: {"alpha": v if v == "auto" else float(v)},
                help="FLOP-efficiency weight of the eviction score",
            ),
        ),
        command="marconi run --model {preset} --policy marconi",
    ),
    # the earlier versions the project also models (their presets, their flags)
    "sglang-0.5.9": Engine(
        "sglang-0.5.9",
        {"no_buffer": "sglang-0.5.9-no-buffer", "extra_buffer": "sglang-0.5.9-extra-buffer"},
        _SGLANG_MEMORY,
        mode_flag="--mamba-scheduler-strategy",
        knobs=(
            Knob(
                "mamba_full_memory_ratio",
                "--mamba-full-memory-ratio",
                0.9,
                low=0.05,
                high=9.0,
                log=True,
                apply=_sglang_ratio,
                sets=("state_pool",),
                help="mamba pool / full-attention KV pool",
            ),
            _prefill_knob("--chunked-prefill-size"),
        ),
        command="python -m sglang.launch_server --model-path {model}",
        version="0.5.9",
        tp_flag="--tp-size",
    ),
    "vllm-0.11": Engine(
        "vllm-0.11",
        {"align": "vllm-0.11-align", "all": "vllm-0.11-all"},
        _VLLM_MEMORY,
        mode_flag="--mamba-cache-mode",
        knobs=(
            Knob("block_size", "--block-size", 0, choices=_vllm_blocks, help="0: derived per model"),
            _prefill_knob("--max-num-batched-tokens"),
        ),
        command="vllm serve {model} --enable-prefix-caching",
        version="0.11",
        tp_flag="--tensor-parallel-size",
    ),
}


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"--for must be one of {', '.join(ENGINES)}, not {name!r}") from None


def _metadata_knob(f) -> Knob | None:
    """A Knob from a Params field whose metadata says what values it takes: ``choices``, both
    bounds ``min`` and ``max`` (``policies.base.knob``), or ``range``: (low, high[, "log"]). A
    knob with one bound only (``min=0``) has no range to search."""
    meta = f.metadata
    flag = meta.get("flag") or "--" + f.name.replace("_", "-")
    flag = flag.split("/")[0]
    if meta.get("choices"):
        return Knob(f.name, flag, f.default, choices=tuple(meta["choices"]), help=meta.get("help", ""))
    rng = meta.get("range")
    if not rng and meta.get("min") is not None and meta.get("max") is not None:
        rng = (meta["min"], meta["max"])
    if rng:
        low, high, *rest = rng
        integer = isinstance(f.default, int) and not isinstance(f.default, bool)
        return Knob(
            f.name, flag, f.default, low=low, high=high, integer=integer, log="log" in rest, help=meta.get("help", "")
        )
    return None


def derived_knobs(engine: Engine) -> list[Knob]:
    """Knobs read from the engine presets' Params metadata (choices or a range) that the table
    does not name or exclude and SimConfig can carry."""
    named = {k.name for k in engine.knobs} | set(engine.exclude)
    sim_fields = set(SimConfig.field_names())
    out: dict[str, Knob] = {}
    for preset in engine.presets.values():
        for cls in get_preset(preset).knob_classes():
            for f in fields(cls):
                if f.name in named or f.name in out or f.name in NOT_ENGINE_KNOBS or f.name not in sim_fields:
                    continue
                knob = _metadata_knob(f)
                if knob is not None:
                    out[f.name] = knob
    return list(out.values())


# ---------------------------------------------------------------------------------- the space


@dataclass(frozen=True)
class Space:
    """The searched knobs of one engine for one model and memory, and how a point becomes a
    SimConfig. ``fixed``: the SimConfig fields set on the command line (a knob's ``when`` sees
    them)."""

    engine: Engine
    ctx: Context
    knobs: tuple  # Knob, in order; a conditional knob after the knobs its ``when`` reads
    mode: Knob | None
    fixed: dict = field(default_factory=dict)

    @property
    def all_knobs(self) -> tuple:
        return ((self.mode,) if self.mode else ()) + self.knobs

    def distributions(self) -> dict:
        return {k.name: k.distribution(self.ctx) for k in self.all_knobs}

    def active_knobs(self, point: dict) -> list[Knob]:
        """The knobs that exist at ``point`` (a conditional knob's condition read from the fixed
        settings and the knobs before it)."""
        view = dict(self.fixed)
        out = []
        for k in self.all_knobs:
            if k.active(view):
                out.append(k)
                view[k.name] = point.get(k.name, k.default)
        return out

    def sample(self, suggest: Callable) -> dict:
        """A point, knob by knob: ``suggest(name, distribution)`` gives each active knob's value."""
        view, point = dict(self.fixed), {}
        for k in self.all_knobs:
            if k.active(view):
                point[k.name] = view[k.name] = suggest(k.name, k.distribution(self.ctx))
        return point

    def defaults(self) -> dict:
        """The engine's defaults as a point of the space."""
        return {k.name: k.default for k in self.active_knobs({})}

    def preset_of(self, point: dict) -> str:
        if self.mode is None:
            return next(iter(self.engine.presets.values()))
        return self.engine.presets[point[self.mode.name]]

    def sim_fields(self, point: dict) -> dict:
        """SimConfig fields of a point (preset, capacity and every active knob's fields; a knob
        left out of ``point`` takes its default)."""
        out = {"policy": self.preset_of(point), "capacity_bytes": self.ctx.capacity_bytes, **self.engine.fixed}
        for k in self.active_knobs(point):
            if k is not self.mode:
                out.update(k.sim_fields(point.get(k.name, k.default), self.ctx))
        return out

    def flags(self, point: dict) -> list[tuple[str, str]]:
        """(engine flag, value) of every setting of ``point``, as the engine takes them."""
        out = []
        for k in self.active_knobs(point):
            v = point.get(k.name, k.default)
            if k.name == "block_size" and self.engine.name.startswith("vllm") and v == 0:
                v = vllm_block_tokens(self.ctx.spec)
            out.append((k.flag, _show(v)))
        return out

    def command(self, point: dict, gpus: int = 1, model: str = "") -> str:
        """The engine's command line with ``point``'s settings, on a group of ``gpus`` (its
        tensor-parallel flag where more than one: the cache was sized for the group), serving
        ``model`` (``served_model``: a config.json's folder, else ``MODEL``, the checkpoint to name)."""
        command = self.engine.command.replace("{model}", served_model(model)).replace("{preset}", quoted(model))
        if gpus > 1 and self.engine.tp_flag:
            command = f"{command} {self.engine.tp_flag} {gpus}"
        return self.engine.render(command, self.flags(point))


def quoted(word: str) -> str:
    """``word`` as one shell word (quoted where it holds a space or a shell character)."""
    import shlex  # noqa: PLC0415

    return shlex.quote(word) if word else "MODEL"


def served_model(model: str) -> str:
    """What an engine's command serves for ``--model`` ``model``: the folder of a config.json
    (the checkpoint's, where its weights lie beside it), else ``MODEL`` (a preset names no
    checkpoint: the user's own path or Hub id goes there)."""
    if not model or not re.search(r"[/\\]|\.json$", model):
        return "MODEL"
    import os.path  # noqa: PLC0415

    return quoted((os.path.dirname(model) or ".") if model.endswith(".json") else model)


def _show(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def build_space(
    engine_name: str, spec: ModelSpec, gpu_bytes: int, fixed: dict | None = None, block_tokens: int = 1
) -> Space:
    """The search space of ``engine_name`` for ``spec`` on ``gpu_bytes`` of memory (a trace of
    ``block_tokens``-token blocks), less the knobs whose SimConfig fields ``fixed`` sets;
    UsageError when the weights leave no cache or nothing is left to tune."""
    fixed = fixed or {}
    engine = get_engine(engine_name)
    weights = weight_bytes(spec)
    cache = engine.memory.cache_bytes(gpu_bytes, weights)
    if cache <= 0:
        raise UsageError(
            f"--gpu-memory {format_gpu_memory(gpu_bytes)} leaves no cache for {spec.name} under {engine.name}: "
            f"{spec.weight_dtype} weights {format_size(weights)}, {engine.memory.flag} {engine.memory.fraction:g}"
        )
    ctx = Context(spec, cache, max(int(block_tokens), 1))
    knobs = [k for k in (*engine.knobs, *derived_knobs(engine)) if spec.is_hybrid or not k.hybrid_only]
    knobs = [k for k in knobs if k.searchable(ctx) and not set(k.fields_set) & set(fixed)]
    mode = None
    if engine.mode_flag and len(engine.presets) > 1 and spec.is_hybrid:
        mode = Knob("mode", engine.mode_flag, next(iter(engine.presets)), choices=tuple(engine.presets))
    sp = Space(engine, ctx, tuple(knobs), mode, dict(fixed))
    if not sp.active_knobs({}) and mode is None:
        why = "" if spec.is_hybrid else f" ({spec.name} has no recurrent state)"
        raise UsageError(f"--for {engine.name}: nothing to tune for {spec.name}{why}")
    return sp


def pool_states(config: SimConfig, spec: ModelSpec) -> int | None:
    """States in the engine's own state pool under ``config`` (the preset's engine rules: SGLang's
    split of its memory, ``--max-mamba-cache-size``, ``--state-pool``); None: one shared budget."""
    from sim.cache.engine_tree import state_capacity  # noqa: PLC0415

    rules = get_preset(config.policy).engine_rules(spec, config)
    if rules is None:
        return None
    memory = parse_size(rules.memory) if rules.memory else config.capacity_bytes
    return state_capacity(rules, spec.state_bytes(), config.state_pool, memory)


def isfinite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
