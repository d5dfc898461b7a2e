"""Named policies: an admission policy, an eviction policy and the grid they work on.

Register a new one with ``register(PolicyPreset(...))``; ``marconi run --policy NAME`` and the
sweep engine find it by name. Admission and eviction are themselves registries keyed by name,
so a preset is pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from policies.admission import AdmissionPolicy, EveryBlockAdmission, JudiciousAdmission, TailOnlyAdmission
from policies.eviction import EvictionPolicy, LRULeafEviction, MarconiEviction
from sim.errors import UsageError

ADMISSION: dict[str, Callable[[], AdmissionPolicy]] = {
    "judicious": JudiciousAdmission,
    "every-block": EveryBlockAdmission,
    "tail-only": TailOnlyAdmission,
}

# factories take (model spec, alpha, paper_bugs)
EVICTION: dict[str, Callable[..., EvictionPolicy]] = {
    "lru-leaf": lambda spec, alpha, paper: LRULeafEviction(),
    "marconi": lambda spec, alpha, paper: MarconiEviction(spec, alpha=alpha, paper_bugs=paper),
}


@dataclass(frozen=True)
class PolicyPreset:
    name: str
    description: str
    admission: str = "judicious"
    eviction: str = "lru-leaf"
    grid_tokens: int = 1  # tree granularity in tokens (block-based engines match whole blocks)
    caching: bool = True  # False: no prefix cache at all (the vanilla baseline)
    lookup_cap_minus_one: bool = False  # SGLang: a lookup matches at most input_len - 1 tokens
    uses_alpha: bool = False
    unlimited: bool = False  # a bound: the cache never evicts (capacity ignored)

    def grid_for(self, spec, config) -> int:
        """Tree granularity for this model and config (engine presets derive it per model)."""
        return self.grid_tokens

    def build(self, spec, alpha: float, paper_bugs: bool) -> tuple[AdmissionPolicy, EvictionPolicy]:
        return ADMISSION[self.admission](), EVICTION[self.eviction](spec, alpha, paper_bugs)


PRESETS: dict[str, PolicyPreset] = {}


def register(preset: PolicyPreset) -> PolicyPreset:
    if preset.admission not in ADMISSION:
        raise ValueError(f"unknown admission {preset.admission!r}")
    if preset.eviction not in EVICTION:
        raise ValueError(f"unknown eviction {preset.eviction!r}")
    PRESETS[preset.name] = preset
    return preset


def get_preset(name: str) -> PolicyPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown policy {name!r}; choose from: {', '.join(PRESETS)}") from None


register(PolicyPreset("vanilla", "no prefix caching (TTFT reference)", caching=False))
register(PolicyPreset(
    "vllm+", "the paper's vLLM+: a state + KV node per 32-token block, LRU over leaves, whole path refreshed",
    admission="every-block", eviction="lru-leaf", grid_tokens=32))
register(PolicyPreset(
    "sglang+", "the paper's SGLang+: judicious admission (branch + tail), LRU over leaves, whole path refreshed",
    admission="judicious", eviction="lru-leaf"))
register(PolicyPreset(
    "marconi", "Marconi: judicious admission + FLOP-aware eviction (recency + alpha * FLOP efficiency)",
    admission="judicious", eviction="marconi", uses_alpha=True))
register(PolicyPreset(
    "marconi-oracle", "bound: Marconi with the best static alpha in hindsight over --alpha-grid (one run per "
    "alpha, best token hit rate; reported as tuned_alpha)",
    admission="judicious", eviction="marconi"))

import policies.engines  # noqa: E402,F401  (registers the engine presets)
