"""LMDeploy today: the PyTorch engine's ``block_trie`` with the engine's last-token rule (``lmdeploy``).

Follows InternLM/lmdeploy at v0.16.0 (commit 1263d5cd8, 2026-08-21), the newest release read:
``lmdeploy/pytorch/paging/block_trie/`` is as of PR #4799 (non-aligned checkpoints) and #4788,
``BlockTrie.match`` caps a hit at ``seq.num_valid_ids - 1`` and ``allocate`` caches only the
``num_valid_ids`` tokens whose KV exists, so a finished request leaves input + output - 1 tokens
(the last sampled token was never run through the model). Placement, the one-checkpoint-per-anchor
rule, frozen partial blocks and the tiered eviction are those of ``policies/lmdeploy.py``.

Knobs (LMDeploy's PyTorch engine config names): ``--block-size`` (``block_size``, 64),
``--prefix-cache-decode-state-interval`` (``prefix_cache_decode_state_interval``, 0 = off; a
multiple of the block), ``--state-pool`` (``prefix_cache_state_budget``), ``--prefill-chunk``.

Reproduces (``tests/policies/test_current_presets.py``, tests/pytorch/paging/test_block_trie/ at
1263d5cd8): ``test_checkpoint_step_geometry`` under the last-token rule (a follow-up turn reuses
the state at input + output - 1, anchored on its block); the decode checkpoint at the last
multiple of the interval (``test_ssm_decode_checkpoint_keeps_old_state_when_new_node_is_pending``'s
one replaceable decode checkpoint per sequence). Not modelled: TurboMind, pins of in-flight copies.
"""

from __future__ import annotations

from policies.base import register_preset
from policies.engine_common import StatePool
from policies.lmdeploy import LmdeployPreset

register_preset(LmdeployPreset(
    "lmdeploy", "LMDeploy 0.16 PyTorch engine: a checkpoint at each prefill forward end, one per block anchor, "
    "frozen partial blocks, tiered eviction, --prefix-cache-decode-state-interval; stores input + output - 1 tokens",
    admission="lmdeploy", eviction="lmdeploy-tiered", lookup_cap_minus_one=True, engine="lmdeploy",
    version="0.16.0", stores_last_token=False, extra_knobs=(StatePool,)))
