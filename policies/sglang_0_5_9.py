"""SGLang 0.5.9's ``MambaRadixCache``: ``no_buffer`` and ``extra_buffer`` with the consumed-state refresh.

The behaviour the project modelled as ``sglang-v1`` / ``sglang-v2`` (both names still work):
sgl-project/sglang ``python/sglang/srt/mem_cache/mamba_radix_cache.py`` (stored versions
00df707e8de4 / c1eb00f9a08b) with the consumed-node refresh of PR #31643 (merged 2026-07-18),
``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` (``managers/schedule_batch.py``),
flag ``--mamba-scheduler-strategy`` (renamed ``--mamba-radix-cache-strategy`` in #27418), track
interval 256, page 1. The release number is the one the project's issue tracker gives for this
code; the PRs above fix the behaviour. Placement, eviction and refresh: ``policies/sglang.py``.

Kept as it was: a finished request stores input + output tokens (the project's rule before
issue 19; the engine stores one token less, as ``sglang`` does), no engine knobs beyond
``--prefill-chunk`` and ``--state-pool``.

Reproduces (``tests/policies/test_sglang.py``): test_mamba_unittest.py ``test_mamba_radix_cache_1``
(pools: matches 0, 7, 7, 0) and ``test_mamba_lru_match_refreshes_only_used_node``; #21158 (an
identical prompt reuses the prompt-end state one token short of its end: hits 0, 10, 10).
"""

from __future__ import annotations

from dataclasses import replace

from policies.base import register_preset
from policies.engine_common import EnginePreset, StatePool
from policies.sglang import SGLANG_RULES

VERSION = "0.5.9"

register_preset(
    EnginePreset(
        "sglang-0.5.9-no-buffer",
        "SGLang 0.5.9 MambaRadixCache no_buffer (consumed-node state refresh, #31643): "
        "states at chunk ends, prompt end and request end; KV and mamba lists (pools with --state-pool); "
        "lookup cap input_len - 1",
        admission="sglang-v1",
        eviction="two-list",
        lookup_cap_minus_one=True,
        rules=SGLANG_RULES,
        engine="sglang",
        version=VERSION,
        extra_knobs=(StatePool,),
    ),
    aliases=("sglang-v1",),
)
register_preset(
    EnginePreset(
        "sglang-0.5.9-extra-buffer",
        "SGLang 0.5.9 MambaRadixCache extra_buffer: one 64-aligned tracked state per "
        "prefill step (a branch point replaces it), 256-token decode tracking, KV kept up to the tracked state",
        admission="sglang-v2",
        eviction="two-list",
        lookup_cap_minus_one=True,
        rules=replace(SGLANG_RULES, kv_extent="state"),
        engine="sglang",
        version=VERSION,
        extra_knobs=(StatePool,),
    ),
    aliases=("sglang-v2",),
)
