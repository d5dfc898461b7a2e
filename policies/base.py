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

def knob(default: Any, help: str, *, choices: Iterable[str] | None = None, flag: str | None = None) -> Any:
    """A ``Params`` field: its default, its help text, (for strings) its allowed values and (when
    it is not ``--`` + the field name with dashes) its command-line flag."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if flag is not None:
        meta["flag"] = flag
    return field(default=default, metadata=meta)


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


# ---------------------------------------------------------------------------------- eviction

class EvictionPolicy(ABC):
    """Which cached node goes next when an insert needs room.

    The tree tells the policy about every node whose candidacy or priority may have changed
    (``add``, ``update``, ``remove``); the policy keeps its own index and answers ``pop_victim``
    without scanning the tree."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type] = NoParams
    #: "path": a hit or insert refreshes every node on its path (LRU engines, SGLang+, vLLM+);
    #: "consumed": only the node whose state is consumed (Marconi, SGLang after #31643).
    refresh: ClassVar[str] = "path"

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
class PolicyPreset:
    """A named policy: an admission policy, an eviction policy and the grid they work on."""

    name: str
    description: str
    admission: str = "judicious"
    eviction: str = "lru-leaf"
    grid_tokens: int = 1  # tree granularity in tokens (block-based engines match whole blocks)
    caching: bool = True  # False: no prefix cache at all (the vanilla baseline)
    lookup_cap_minus_one: bool = False  # SGLang: a lookup matches at most input_len - 1 tokens
    uses_alpha: bool = False
    unlimited: bool = False  # a bound: the cache never evicts (capacity ignored)
    #: simulator settings the preset itself reads (in ``grid_for``, ``cache_options``...), beyond
    #: the fields of its policies' ``Params``, which it reads anyway (see ``reads``)
    knobs: tuple[str, ...] = ()

    def reads(self) -> frozenset[str]:
        """The simulator settings (``SimConfig`` field names) this preset reads: its admission's and
        eviction's ``Params`` fields (alpha only when ``uses_alpha``; none without caching) and
        ``knobs``. The CLI refuses a policy knob set explicitly that no chosen preset reads, so a new
        preset declares here (through its ``Params`` or ``knobs``) every knob it honours."""
        names = set(self.knobs)
        if self.caching:
            names |= {f.name for f in fields(self.admission_cls.Params)}
            names |= {f.name for f in fields(self.eviction_cls.Params)}
            if not self.uses_alpha:
                names.discard("alpha")
        return frozenset(names)

    def grid_for(self, spec: Any, config: Any) -> int:
        """Tree granularity for this model and config (engine presets derive it per model)."""
        return self.grid_tokens

    def unit_tokens(self, spec: Any, config: Any) -> int:
        """The smallest amount of KV the cache stores, in tokens (a block-based engine's block):
        one unit's KV plus a state must fit in the capacity."""
        return self.grid_for(spec, config)

    def cache_options(self, spec: Any, config: Any) -> dict:
        """Engine rules the cache must follow (keyword arguments of ``sim.cache.engine_tree``'s
        ``EngineTree``); empty: the core tree. ``"pools": True`` lets ``--state-pool`` give
        states their own pool."""
        return {}

    @property
    def admission_cls(self) -> type[AdmissionPolicy]:
        return ADMISSION[self.admission]

    @property
    def eviction_cls(self) -> type[EvictionPolicy]:
        return EVICTION[self.eviction]


PRESETS: dict[str, PolicyPreset] = {}


def register_preset(preset: PolicyPreset) -> PolicyPreset:
    if preset.admission not in ADMISSION:
        raise PolicyError(f"unknown admission {preset.admission!r}")
    if preset.eviction not in EVICTION:
        raise PolicyError(f"unknown eviction {preset.eviction!r}")
    PRESETS[preset.name] = preset
    return preset


def policy_knobs() -> dict[str, list[str]]:
    """Every setting some preset reads and others do not (a "policy knob") -> the presets that read
    it, in registration order."""
    readers: dict[str, list[str]] = {}
    for preset in PRESETS.values():
        for name in sorted(preset.reads()):
            readers.setdefault(name, []).append(preset.name)
    return readers


def get_preset(name: str) -> PolicyPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; choose from: {', '.join(PRESETS)}") from None
