"""SGLang before PRs #31643 / #31648 (merged 2026-07): the whole matched path refreshed in both lists.

A versioned preset: ``MambaRadixCache._match_post_processor`` then called
``reset_node_and_parents_mru`` on the full *and* the mamba LRU list (stored version
00df707e8de4), so a hit made every state on its path most recent, and ``_insert_helper`` moved
every state it walked past to most recent too. Under mamba-pool pressure that evicted whole cold
sessions instead of the intermediate states reuse never needs, the reason for the change (test
``test_mamba_lru_match_refreshes_only_used_node`` guards against reverting it). Everything else
is ``sglang-v1`` (``policies/sglang.py``).

Reproduces: ``test_mamba_radix_cache_1`` (whose expectations hold under both rules) and, inverted,
``test_mamba_lru_match_refreshes_only_used_node``: after re-matching session 1's leaf, its
ancestor's state is newer than session 2's.
"""

from __future__ import annotations

from policies.base import register_preset
from policies.engine_common import EnginePreset
from policies.sglang import SGLANG_CACHE

SGLANG_PATH_REFRESH_CACHE = tuple(("match_refresh", "path") if k == "match_refresh" else (k, v)
                                  for k, v in SGLANG_CACHE)

register_preset(EnginePreset(
    "sglang-v1-pathrefresh", "sglang-v1 as before SGLang #31643 / #31648: a hit or insert refreshes every "
    "state on its path (reset_node_and_parents_mru on both lists)",
    admission="sglang-v1", eviction="two-list", lookup_cap_minus_one=True,
    options=SGLANG_PATH_REFRESH_CACHE, pools=True))
