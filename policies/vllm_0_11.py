"""vLLM 0.11's hybrid prefix caching as the project first modelled it: ``align`` and ``all``.

The behaviour the project called ``vllm-align`` / ``vllm-all`` (both names still work):
vllm-project/vllm PR #30877 (align mode, merged 2025-12, design #28176), the scheduler's
``_mamba_block_aligned_split`` (``vllm/v1/core/sched/scheduler.py``, stored version
00024d314514) and decode caching at every block boundary. The release number is the one the
project's issue tracker gives for this behaviour. No retention interval (every state kept), no
junction checkpoints, no EAGLE, prefix caching opt-in. A finished request stores input + output
tokens (the project's rule before issue 19; the engine stores one token less, as ``vllm`` does).
Placement code: ``policies/vllm.py``.

Reproduces (``tests/policies/test_vllm.py``): test_mamba_align_chunk_split.py
``test_disabling_eagle_block_drop_keeps_the_trailing_cache_boundary`` and
``test_intermediate_chunk_ends_stay_block_aligned`` (stored version 09f730d09235); vLLM #40696
(block 528: a 979-token prompt reused up to 528 = 54 %).
"""

from __future__ import annotations

from policies.base import register_preset
from policies.vllm import VllmPreset

VERSION = "0.11"

register_preset(
    VllmPreset(
        "vllm-0.11-align",
        "vLLM 0.11 --mamba-cache-mode align (PR #30877): states at the block boundary ending each "
        "block-aligned prefill step (always the prompt's last full block) and every block crossed in decode; "
        "full blocks only, LRU tail first",
        admission="vllm-align",
        eviction="lru-tail-first",
        lookup_cap_minus_one=True,
        engine="vllm",
        version=VERSION,
    ),
    aliases=("vllm-align",),
)
register_preset(
    VllmPreset(
        "vllm-0.11-all",
        "vLLM 0.11 --mamba-cache-mode all: a state at every block boundary (prefill and decode), LRU tail first",
        admission="vllm-all",
        eviction="lru-tail-first",
        lookup_cap_minus_one=True,
        engine="vllm",
        version=VERSION,
    ),
    aliases=("vllm-all",),
)
