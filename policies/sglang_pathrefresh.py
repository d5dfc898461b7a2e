"""SGLang before PRs #31643 / #31648 (merged 2026-07-18): the whole matched path refreshed in both lists.

A versioned preset, ``sglang-0.5.8-no-buffer-pathrefresh`` (the old name
``sglang-v1-pathrefresh`` still works): ``MambaRadixCache._match_post_processor`` then called
``reset_node_and_parents_mru`` on the full *and* the mamba LRU list (stored version
00df707e8de4), so a hit made every state on its path most recent, and ``_insert_helper`` moved
every state it walked past to most recent too. Under mamba-pool pressure that evicted whole cold
sessions instead of the intermediate states reuse never needs, the reason for the change (test
``test_mamba_lru_match_refreshes_only_used_node`` guards against reverting it). Everything else
is ``sglang-0.5.9-no-buffer`` (``policies/sglang_0_5_9.py``). The release number (the last before
the change) is inferred from the merge date, not read from a release tag.

Reproduces: ``test_mamba_radix_cache_1`` (whose expectations hold under both rules) and, inverted,
``test_mamba_lru_match_refreshes_only_used_node``: after re-matching session 1's leaf, its
ancestor's state is newer than session 2's.
"""

from __future__ import annotations

from dataclasses import replace

from policies.base import register_preset
from policies.engine_common import EnginePreset, StatePool
from policies.sglang import SGLANG_PATH_REFRESH, SGLANG_RULES

register_preset(
    EnginePreset(
        "sglang-0.5.8-no-buffer-pathrefresh",
        "SGLang no_buffer as before #31643 / #31648: a hit or insert refreshes "
        "every state on its path (reset_node_and_parents_mru on both lists)",
        admission="sglang-v1",
        eviction="two-list",
        lookup_cap_minus_one=True,
        rules=replace(SGLANG_RULES, refresh=SGLANG_PATH_REFRESH),
        engine="sglang",
        version="0.5.8",
        extra_knobs=(StatePool,),
    ),
    aliases=("sglang-v1-pathrefresh",),
)
