"""What a caching policy is, and what it may see.

A policy never imports the simulator: it gets read-only views (Protocols below) of the tree's
nodes, of the cache as a whole, of a lookup's match and of the cost model, and answers in its own
types (checkpoint positions, ``Victim``). Policies register themselves by name with the
decorators ``admission`` / ``eviction``; a ``PolicyPreset`` names one of each (``register_preset``).

A policy owns its knobs: a nested frozen ``Params`` dataclass whose fields carry ``help`` (and
``choices``) in ``field(metadata=...)`` via :func:`knob`. The simulator's settings, CLI options and
sweep axes are generated from those fields, so each default and choice is written once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Iterable, Protocol


class PolicyError(ValueError):
    """A bad policy name or setting; the CLI prints it on one line and exits with code 2."""


# ---------------------------------------------------------------------------------- knobs


def knob(
    default: Any,
    help: str,
    *,
    choices: Iterable[str] | None = None,
    flag: str | None = None,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
) -> Any:
    """A ``Params`` field: its default, its help text, (for strings) its allowed values, (for
    numbers) its inclusive range ``min`` .. ``max`` or, for a float that must exceed a bound,
    ``above`` (finite numbers above it: ``above=0`` refuses 0), and (when it is not ``--`` + the
    field name with dashes) its command-line flag. ``knob_space`` reads these back as a search space."""
    meta: dict = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if flag is not None:
        meta["flag"] = flag
    if min is not None:
        meta["min"] = min
    if max is not None:
        meta["max"] = max
    if above is not None:
        meta["above"] = above
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class KnobSpec:
    """One knob as a search space sees it: name, flag, type, default and its allowed values
    (``choices``) or range (``min`` .. ``max``, None: open)."""

    name: str
    flag: str
    type: str  # "int", "float", "bool" or "str"
    default: Any
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    help: str = ""
    above: float | None = None  # finite numbers above this one (``knob(above=...)``)


def knob_specs(params_cls: type) -> list[KnobSpec]:
    """The knobs of a ``Params`` dataclass, machine-readable (``marconi policies --format json``)."""
    out = []
    for f in fields(params_cls):
        meta = f.metadata
        kind = type(f.default).__name__ if f.default is not None else "str"
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        choices = meta.get("choices")
        if kind == "bool":
            choices = (False, True)
        out.append(
            KnobSpec(
                f.name,
                flag.split("/")[0],
                kind,
                f.default,
                choices,
                meta.get("min"),
                meta.get("max"),
                meta.get("help", ""),
                meta.get("above"),
            )
        )
    return out


def params_from(params_cls: type, settings: Any, **override: Any) -> Any:
    """A ``Params`` instance whose fields are read from the same-named attributes of ``settings``
    (the simulator's config; defaults where it has none), then from ``override`` where named."""
    names = [f.name for f in fields(params_cls)]
    values = {n: getattr(settings, n) for n in names if hasattr(settings, n)}
    values.update({k: v for k, v in override.items() if k in names})
    return params_cls(**values)


@dataclass(frozen=True)
class NoParams:
    """The knobs of a policy that has none."""


# ---------------------------------------------------------------------------------- views


class NodeView(Protocol):
    """What a policy may read of a tree node (it must not write any of it)."""

    children: dict
    parent: Any
    lock: int
    has_state: bool
    last_access: float
    n_tokens: int  # tokens on the node's edge
    depth_tokens: int  # tokens from the root to the end of the edge
    created: int  # creation order (a deterministic tie-break)
    version: int  # bumped on every change (invalidates stale heap entries)
    slot: int  # the one field a policy may write: its own index for the node (-1: none)


class CacheView(Protocol):
    """What an eviction policy may read of the cache it serves."""

    now: float
    root: Any
    state_bytes: int
    kv_bytes_per_token: int


class MatchView(Protocol):
    """A lookup as admission sees it (positions in symbols of the tree's grid)."""

    hit_sym: int  # end of the deepest usable checkpoint (0: none)
    match_sym: int  # end of the token-by-token match (may lie inside an edge)


class CostView(Protocol):
    """The cost model as a cost-aware policy sees it."""

    def node_flops(self, L_parent: int, L_node: int) -> float:
        """FLOPs a hit on a node ending at ``L_node`` saves beyond its parent at ``L_parent``."""

    def node_bytes(self, L_node: int) -> int:
        """Bytes of one checkpoint plus the KV of the root-to-node path."""


@dataclass(frozen=True)
class RefreshRule:
    """How a lookup and an insert move recency: the one place the rule is written.

    - ``hit``: the nodes whose (KV) recency a hit moves: ``"walked"`` every node the lookup walked
      down (LRU engines, SGLang+, vLLM+), ``"to-hit"`` the path from the root to the node whose
      state is used (SGLang's ``match_prefix``, LMDeploy's matched blocks), ``"consumed"`` only
      that node (Marconi).
    - ``state``: trees with a separate state recency (``sim.cache.engine_tree``): ``"with-kv"`` a
      state's recency moves with its node's, ``"consumed"`` only the used state moves (SGLang
      after #31643, LMDeploy's restored checkpoint).
    - ``insert``: when an insert refreshes its root path: ``"final"`` after the request's last
      insert (input + output), ``"every"`` after each insert (the engines' insert walk),
      ``"none"`` never (a new node is created recent anyway).
    - ``split``: an insert that splits an edge leaves the lower half most recent (SGLang's
      ``_insert_helper`` refreshes the node it walks into, then ``_split_node`` re-inserts it).
    """

    hit: str = "walked"
    state: str = "with-kv"
    insert: str = "final"
    split: bool = False

    def __post_init__(self) -> None:
        if (
            self.hit not in ("walked", "to-hit", "consumed")
            or self.state not in ("with-kv", "consumed")
            or self.insert not in ("final", "every", "none")
        ):
            raise PolicyError(f"bad refresh rule {self}")


#: LRU engines and the paper's baselines: a hit refreshes the walked path, the request's last
#: insert its whole path
PATH_REFRESH = RefreshRule()
#: Marconi (and GDSF): a hit refreshes only the node whose state it uses
CONSUMED_REFRESH = RefreshRule(hit="consumed", insert="none")


@dataclass(frozen=True, slots=True)
class Victim:
    """The eviction policy's answer: evict ``node`` (a leaf goes with its KV; a single-child node
    loses its state and merges into its child), or with ``drop_state_only`` free only its state and
    keep its KV (a tombstone)."""

    node: Any
    drop_state_only: bool = False


# ---------------------------------------------------------------------------------- admission


@dataclass(slots=True)
class AdmissionContext:
    n_input: int  # symbols of the input (prefill part inserted at prefill end)
    n_full: int  # symbols of input + output
    block_tokens: int  # tokens per symbol
    input_tokens: int = -1  # exact prompt tokens (-1: n_input * block_tokens)
    full_tokens: int = -1  # exact tokens a finished request stores (-1: n_full * block_tokens)
    #: token positions where this request's scheduled prefill steps ended, in order (the last one
    #: is the prompt's end): given by a batching scheduler (``--scheduler continuous``), which knows
    #: the chunks only when the prefill is done. None: the policy derives its own steps from its
    #: ``--prefill-chunk`` knob (one request prefilling at a time).
    prefill_steps: tuple[int, ...] | None = None
    #: tokens the lookup matched token by token, a block grid's whole symbols (KV held in the cache;
    #: beyond the hit when no state sits at its end: vLLM's shared-prefix junction); -1: not told
    match_tokens: int = -1
    #: a hash-block request whose prompt ends inside a block, with output symbols after it:
    #: ``(k, tokens)``, the first k stored symbols hold that many tokens (the output's symbols start
    #: at the prompt's end, off the block grid); None: symbol j ends at j x block_tokens
    full_cut: tuple[int, int] | None = None


class AdmissionPolicy(ABC):
    """At which positions a request's states are checkpointed: two lists of symbol positions,
    states captured during prefill (inserted with the input's KV when prefill ends) and states
    captured after decode (inserted with input + output when the request ends)."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type] = NoParams

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else self.Params()

    @abstractmethod
    def prefill_checkpoints(self, match: MatchView, ctx: AdmissionContext) -> list[int]: ...

    @abstractmethod
    def decode_checkpoints(self, match: MatchView, ctx: AdmissionContext) -> list[int]: ...

    #: whether ``prefill_checkpoints`` depends on where prefill steps end (``ctx.prefill_steps``):
    #: a batching scheduler then asks for the checkpoints again once the prefill is done
    uses_prefill_steps: ClassVar[bool] = False
    #: state slots a running request holds outside the cache on a hybrid model (``--scheduler
    #: continuous`` charges them): SGLang no_buffer 1, extra_buffer 3 (1 + 2 ping-pong), vLLM 1
    #: (today's align mode; a second in a step entering a new block; 2 for vllm-0.11-*), LMDeploy 2
    #: (runtime + reserved save slot)
    running_state_slots: ClassVar[int] = 1
    #: whether ``schedule_chunk`` cuts steps only for a model with recurrent layers (vLLM's
    #: ``_mamba_block_aligned_split`` runs where ``need_mamba_block_aligned_split``:
    #: ``has_mamba_layers`` and align mode, ``vllm/v1/core/sched/scheduler.py``): a dense model's
    #: prefill steps then take the whole budget, as the engine's do
    splits_for_states: ClassVar[bool] = False

    @staticmethod
    def scheduled_ends(match: MatchView, ctx: AdmissionContext) -> list[int]:
        """Symbol positions of the non-final prefill step ends a batching scheduler reported
        (``ctx.prefill_steps``) that lie on the grid, past the hit and before the prompt's end."""
        G = ctx.block_tokens
        return [e // G for e in ctx.prefill_steps if e % G == 0 and match.hit_sym < e // G < ctx.n_input]

    def schedule_chunk(self, start: int, end: int, budget: int, step_budget: int, ctx: AdmissionContext) -> int:
        """Tokens of a prefill at token ``start`` (of ``end``) the engine schedules in a step with
        ``budget`` tokens left of ``step_budget``: an engine that cuts its chunks on a grid
        overrides this (0: the request waits for the next step). Default: as many as fit."""
        return min(budget, end - start)


# ---------------------------------------------------------------------------------- eviction


class EvictionPolicy(ABC):
    """Which cached node goes next when an insert needs room.

    The tree tells the policy about every node whose candidacy or priority may have changed
    (``add``, ``update``, ``remove``); the policy keeps its own index and answers ``pop_victim``
    without scanning the tree."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type] = NoParams
    #: how hits and inserts move recency (an engine preset's ``EngineRules.refresh`` overrides it)
    refresh: ClassVar[RefreshRule] = PATH_REFRESH

    def __init__(self, cost: CostView | None = None, params: Any = None) -> None:
        self.cost = cost
        self.params = params if params is not None else self.Params()

    def attach(self, cache: CacheView) -> None:
        self.tree = cache

    @abstractmethod
    def add(self, node: NodeView) -> None: ...

    @abstractmethod
    def update(self, node: NodeView) -> None: ...

    @abstractmethod
    def remove(self, node: NodeView) -> None: ...

    @abstractmethod
    def pop_victim(self) -> Victim | None:
        """The next victim, or None when nothing is evictable."""


# ---------------------------------------------------------------------------------- registries

ADMISSION: dict[str, type[AdmissionPolicy]] = {}
EVICTION: dict[str, type[EvictionPolicy]] = {}


def admission(name: str) -> Callable[[type], type]:
    """Class decorator: register an admission policy under ``name``."""

    def deco(cls):
        cls.name = name
        ADMISSION[name] = cls
        return cls

    return deco


def eviction(name: str) -> Callable[[type], type]:
    """Class decorator: register an eviction policy under ``name``."""

    def deco(cls):
        cls.name = name
        EVICTION[name] = cls
        return cls

    return deco


@dataclass(frozen=True)
class EngineRules:
    """The rules an engine's cache follows beyond the core tree, one typed record
    (``sim.cache.engine_tree.EngineTree`` reads it; its module docstring says which engine code
    each rule follows).

    - ``refresh``: the engine's own refresh rule (None: the eviction policy's).
    - ``cascade``: a leaf's eviction also removes ancestors left as stateless leaves.
    - ``kv_extent``: how much of an inserted sequence's KV is kept: ``"all"``, ``"state"`` (up
      to its last state) or ``"blocks"`` (whole ``extent_block``-token blocks).
    - ``frozen_block`` / ``anchor_block``: LMDeploy's frozen partial blocks and one state per
      block anchor (0: off); ``frozen_whole``: a frozen block is a whole block beside the trie's
      own copy of it once the path goes on past the state (False: only the pad to the block's
      end is charged); ``admit_from_anchor``: in sequential mode the request's insert makes room
      for at least its prompt's blocks from the restored state's block on, cached or not
      (LMDeploy's admission); ``anchor_refusals``: a new state does not replace one at the same
      step on another path (LMDeploy 0.16's ``_reserve_checkpoint``).
    - ``state_pool``: states live in their own pool, so ``--state-pool`` (or the engine's own
      memory knobs, through ``state_capacity``) sizes it; False: one budget.
    - ``state_capacity``: states the pool holds when the preset's engine knobs fix it (SGLang's
      ``--max-mamba-cache-size``); None: ``split``, else ``--state-pool`` decides.
    - ``memory``: the engine's whole cache memory (a size, SGLang's ``--gpu-memory``), which
      replaces ``--capacity``; ``split(memory_bytes, state_bytes)``: the states the engine's own
      split of it gives the state pool.
    - ``future``: the offline bound's next-use index (``belady``).
    - ``snapshot_block``: TensorRT-LLM's radix-tree block (``tokens_per_block``; 0: off): one
      recurrent snapshot per block, the deepest, and a snapshot inside a block the lookup does not
      match whole found only while that block's parent has fewer than 32 children.
    - ``state_bytes``: bytes the engine charges one state (0: the model's own state bytes); vLLM
      pads each Mamba layer's state page up to the attention page.
    - ``running_blocks``: ``extent_block``-token blocks a request holds while it runs that the
      cache never keeps, charged in sequential mode from its lookup to its last insert (vLLM: one
      running-state block per Mamba group), plus its partial last KV block (0: none).
    - ``running_states``: state slots a request holds while it runs that the cache never keeps,
      charged in sequential mode with ``running_blocks`` (TensorRT-LLM with its pools: the live
      recurrent page ``KvCache`` allocates when the request resumes and frees at ``close``).
    - ``capacity_unit``: the engine's memory is a whole number of blocks of this many bytes
      (vLLM: ``num_blocks = memory // (page x layers per group)``): ``--capacity`` is floored to
      it (0: bytes as given).
    - ``duplicate_kv``: KV a request recomputes though it is cached (between its hit and its
      match) is cached a second time under the same key; the older copy keeps its recency and
      holds memory until the eviction order reaches it (vLLM's ``BlockHashToBlockMap``).
    - ``block_evict``: a leaf's KV is evicted one ``extent_block``-token block at a time, its
      last block first, and a state at that end goes with it (vLLM's pool evicts one block per
      block it needs, ``BlockPool.get_new_blocks``, and a request frees its blocks tail first);
      False: a leaf goes whole.
    - ``kv_page``: the KV pool is whole pages of this many tokens, one per block of the engine's
      radix tree (``EngineTree._page_pad``; TensorRT-LLM's attention pages, 0: tokens).
    - ``states_first``: with a state pool, an insert takes its states' room before its KV's
      (TensorRT-LLM commits a chunk's snapshots before the decode's pages are allocated).
    - ``block_copies``: KV is held in whole blocks of this many tokens keyed by the path to them,
      so two paths that part inside a block each hold a copy of it, the shared part above none
      (LMDeploy's block trie; a leaf's partial last block counts its tokens, its frozen block
      the rest: ``EngineTree._node_pad``; 0: tokens shared down to the token).
    """

    refresh: RefreshRule | None = None
    cascade: bool = False
    kv_extent: str = "all"
    extent_block: int = 0
    frozen_block: int = 0
    anchor_block: int = 0
    frozen_whole: bool = False
    admit_from_anchor: bool = False
    anchor_refusals: bool = False
    state_pool: bool = False
    state_capacity: int | None = None
    memory: str = ""
    split: Callable[[int, int], int] | None = None
    future: bool = False
    snapshot_block: int = 0
    state_bytes: int = 0
    running_blocks: int = 0
    running_states: int = 0
    capacity_unit: int = 0
    duplicate_kv: bool = False
    block_evict: bool = False
    kv_page: int = 0
    states_first: bool = False
    block_copies: int = 0

    def __post_init__(self) -> None:
        if self.kv_extent not in ("all", "state", "blocks"):
            raise PolicyError(f"bad kv_extent {self.kv_extent!r}")


@dataclass(frozen=True)
class PolicyPreset:
    """A named policy: an admission policy, an eviction policy and the grid they work on.

    ``engine`` and ``version`` say what it reproduces (``marconi policies`` lists them);
    ``stores_last_token``: a finished request's whole input + output goes into the cache (the
    Marconi paper's rule); False: input + output - 1 tokens, as every serving engine stores (the
    last sampled token is never run through the model, so neither its KV nor a state after it
    exists).

    ``hindsight``: the preset is a bound tuned in hindsight over several simulations, not one
    simulation: the name of the tuner that runs it (``"oracle"``: ``sim.tuning.oracle``, one run per
    alpha of ``--alpha-grid``, the best kept), each run simulating the preset ``hindsight_of``. The
    assembly point (``sim.simulate``) dispatches on it, the sweeps keep the tuning knobs of such a
    preset, and replay (which follows one simulation) refuses it. Empty: one simulation."""

    name: str
    description: str
    admission: str = "judicious"
    eviction: str = "lru-leaf"
    grid_tokens: int = 1  # tree granularity in tokens (block-based engines match whole blocks)
    caching: bool = True  # False: no prefix cache at all (the vanilla baseline)
    lookup_cap_minus_one: bool = False  # SGLang: a lookup matches at most input_len - 1 tokens
    uses_alpha: bool = False
    unlimited: bool = False  # a bound: the cache never evicts (capacity ignored)
    engine: str = "paper"
    version: str = ""
    stores_last_token: bool = True
    extra_knobs: tuple = ()  # Params classes the preset itself reads (beyond its policies')
    #: simulator settings the preset itself reads (in ``grid_for``, ``engine_rules``...), beyond
    #: the fields of its ``knob_classes``, which it reads anyway (see ``reads``)
    reads_also: tuple[str, ...] = ()
    hindsight: str = ""  # the tuner that runs this bound over several simulations ("": one simulation)
    hindsight_of: str = ""  # the preset each of those simulations runs

    @property
    def tuned_in_hindsight(self) -> bool:
        """A bound tuned in hindsight over several simulations (``hindsight``), not one simulation."""
        return bool(self.hindsight)

    def reads(self) -> frozenset[str]:
        """The simulator settings (``SimConfig`` field names) this preset reads: the fields of its
        ``knob_classes`` (alpha only when ``uses_alpha``; none without caching) and
        ``reads_also``. The CLI refuses a policy knob set explicitly that no chosen preset reads, so a
        new preset declares here (through its ``Params``, ``extra_knobs`` or ``reads_also``) every
        knob it honours."""
        names = set(self.reads_also)
        if self.caching:
            for cls in self.knob_classes():
                names |= {f.name for f in fields(cls)}
            if not self.uses_alpha:
                names.discard("alpha")
        return frozenset(names)

    def grid_for(self, spec: Any, config: Any) -> int:
        """Tree granularity for this model and config (engine presets derive it per model)."""
        return self.grid_tokens

    def engine_rules(self, spec: Any, config: Any) -> EngineRules | None:
        """The engine rules the cache must follow (``sim.cache.engine_tree``); None: the core
        tree."""
        return None

    def check(self, spec: Any, config: Any) -> None:
        """Refuse knob values this preset cannot honour (one ``PolicyError`` line)."""

    def check_blocks(self, spec: Any, config: Any, block_tokens: int) -> None:
        """Refuse knob values a trace of ``block_tokens``-token symbols (hash blocks) cannot carry
        (one ``PolicyError`` line); the grid itself is checked by the simulation."""

    def knob_classes(self) -> list[type]:
        """Every ``Params`` class whose knobs this preset reads (admission, eviction, its own)."""
        out = []
        for cls in (self.admission_cls.Params, self.eviction_cls.Params, *self.extra_knobs):
            if cls is not NoParams and cls not in out:
                out.append(cls)
        return out

    def knobs(self) -> list[KnobSpec]:
        """The knobs this preset reads, machine-readable (name, flag, type, default, range)."""
        seen, out = set(), []
        for cls in self.knob_classes():
            for spec in knob_specs(cls):
                if spec.name not in seen:
                    seen.add(spec.name)
                    out.append(spec)
        return out

    def unit_tokens(self, spec: Any, config: Any) -> int:
        """The smallest amount of KV the cache stores, in tokens (a block-based engine's block):
        one unit's KV plus a state must fit in the capacity."""
        return self.grid_for(spec, config)

    @property
    def admission_cls(self) -> type[AdmissionPolicy]:
        return ADMISSION[self.admission]

    @property
    def eviction_cls(self) -> type[EvictionPolicy]:
        return EVICTION[self.eviction]


PRESETS: dict[str, PolicyPreset] = {}


#: old preset names kept working: alias -> the versioned preset it now names
ALIASES: dict[str, str] = {}


def register_preset(preset: PolicyPreset, *, aliases: Iterable[str] = ()) -> PolicyPreset:
    """Register ``preset`` by name; each of ``aliases`` (an older name) finds it too."""
    if preset.admission not in ADMISSION:
        raise PolicyError(f"unknown admission {preset.admission!r}")
    if preset.eviction not in EVICTION:
        raise PolicyError(f"unknown eviction {preset.eviction!r}")
    if preset.hindsight and not preset.hindsight_of:
        raise PolicyError(f"preset {preset.name!r}: a bound tuned in hindsight names the preset it runs (hindsight_of)")
    PRESETS[preset.name] = preset
    for alias in aliases:
        ALIASES[alias] = preset.name
    return preset


def policy_knobs() -> dict[str, list[str]]:
    """Every setting some preset reads and others do not (a "policy knob") -> the presets that read
    it, in registration order."""
    readers: dict[str, list[str]] = {}
    for preset in PRESETS.values():
        for name in sorted(preset.reads()):
            readers.setdefault(name, []).append(preset.name)
    return readers


def find_preset(name: str) -> PolicyPreset | None:
    """The preset called ``name`` (or an alias of it); None when there is none."""
    return PRESETS.get(ALIASES.get(name, name))


def get_preset(name: str) -> PolicyPreset:
    """The preset called ``name`` (or an alias of it)."""
    try:
        return PRESETS[ALIASES.get(name, name)]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; choose from: {', '.join(PRESETS)}") from None
