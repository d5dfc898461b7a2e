"""The paper's named policies (vanilla, vLLM+, SGLang+, Marconi and its oracle bound).

A preset is pure data: an admission and an eviction policy by registered name, and the grid
they work on. ``marconi run --policy NAME`` and the sweeps find it by name (``get_preset``).
"""

from __future__ import annotations

from policies.base import PolicyPreset, register_preset

register_preset(PolicyPreset("vanilla", "no prefix caching (TTFT reference)", caching=False))
register_preset(
    PolicyPreset(
        "vllm+",
        "the paper's vLLM+: a state + KV node per 32-token block, LRU over leaves, whole path refreshed",
        admission="every-block",
        eviction="lru-leaf",
        grid_tokens=32,
    )
)
register_preset(
    PolicyPreset(
        "sglang+",
        "the paper's SGLang+: judicious admission (branch + tail), LRU over leaves, whole path refreshed",
        admission="judicious",
        eviction="lru-leaf",
    )
)
register_preset(
    PolicyPreset(
        "marconi",
        "Marconi: judicious admission + FLOP-aware eviction (recency + alpha * FLOP efficiency)",
        admission="judicious",
        eviction="marconi",
        uses_alpha=True,
    )
)
register_preset(
    PolicyPreset(
        "marconi-oracle",
        engine="bound",
        description="bound: Marconi with the best static alpha in hindsight over --alpha-grid (one run per alpha, "
        "best token hit rate; reported as tuned_alpha)",
        admission="judicious",
        eviction="marconi",
        hindsight="oracle",
        hindsight_of="marconi",
    )
)
