"""LMDeploy v0.16.0's PyTorch engine ``block_trie`` as the project first modelled it (``lmdeploy-0.16-pytorch``).

The behaviour the project called ``lmdeploy`` before issue 19. InternLM/lmdeploy
``lmdeploy/pytorch/paging/block_trie/{trie,checkpoint_lifecycle,kv_lifecycle}.py`` as of PR #4799
(non-aligned checkpoints, commit 19cb4d24f, merged 2026-08-13 during 0.15.0 development; unchanged
in v0.16.0, commit 1263d5cd8). A finished request stores input + output tokens: the project's
rule before issue 19 (the engine stores one token less, as ``lmdeploy`` does). Placement and
eviction: ``policies/lmdeploy.py``.

Rename: the name ``lmdeploy`` now means today's engine (``policies/lmdeploy_current.py``); a run
that needs the earlier results passes ``--policy lmdeploy-0.16-pytorch``.

Reproduces (``tests/policies/test_lmdeploy.py``; tests/pytorch/paging/test_block_trie/ at
19cb4d24f): ``test_checkpoint_step_geometry``, ``test_ssm_checkpoint_save_owns_and_releases_partial_tail``,
``test_ssm_checkpoint_replaces_partial_variant_at_same_anchor``,
``test_kv_pressure_evicts_unpinned_frozen_tail``, ``test_ssm_checkpoint_save_evicts_unpinned_state_only``.
"""

from __future__ import annotations

from policies.base import register_preset
from policies.engine_common import StatePool
from policies.lmdeploy import LmdeployPreset

register_preset(
    LmdeployPreset(
        "lmdeploy-0.16-pytorch",
        "LMDeploy 0.16 PyTorch engine as first modelled (stores input + output): a checkpoint "
        "at each prefill forward end, one per block anchor, a frozen block per partial checkpoint; evicts frozen "
        "checkpoints, then KV leaves, then checkpoint-only (a state pool with --state-pool)",
        admission="lmdeploy",
        eviction="lmdeploy-tiered",
        lookup_cap_minus_one=True,
        engine="lmdeploy",
        version="0.16.0",
        extra_knobs=(StatePool,),
    )
)
