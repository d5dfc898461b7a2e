"""Engine presets: how the serving engines place, admit and evict hybrid-model states, by version.

Each engine has a machinery module (placement and eviction code read from the engine's own code
and tests, never copied; ``docs/presets.md`` and ``docs/presets-engines.md``), a module for
today's engine with the engine's own knobs (named as the engine names them), and one module per
earlier behaviour the project modelled, named by version.
Each preset module's docstring names the engine version, the files and the tests it reproduces
(``tests/policies/``). Rules the core tree does not have (state pools, refresh of the lookup path,
frozen partial blocks, one state per block anchor) are ``EngineRules`` that
``sim.cache.engine_tree.EngineTree`` follows.

=================================  ============================================================  ===================
preset                             engine (module)                                               old name (alias)
=================================  ============================================================  ===================
sglang                             SGLang today, UnifiedRadixCache (``sglang_current``)
vllm                               vLLM today, align + retention + junction (``vllm_current``)
trtllm                             TensorRT-LLM V2 manager, periodic snapshots (``trtllm_current``)
lmdeploy                           LMDeploy 0.16 PyTorch engine (``lmdeploy_current``)
sglang-0.5.9-no-buffer             SGLang MambaRadixCache no_buffer (``sglang_0_5_9``)             sglang-v1
sglang-0.5.9-extra-buffer          SGLang MambaRadixCache extra_buffer (``sglang_0_5_9``)          sglang-v2
sglang-0.5.8-no-buffer-pathrefresh SGLang before #31643 (``sglang_pathrefresh``)                 sglang-v1-pathrefresh
vllm-0.11-align, vllm-0.11-all     vLLM ``--mamba-cache-mode align|all`` (``vllm_0_11``)           vllm-align, vllm-all
lmdeploy-0.16-pytorch              LMDeploy 0.16, input + output stored (``lmdeploy_0_16``)       (was lmdeploy)
trtllm-1.2-interval                TensorRT-LLM interval 256, from the docs (``trtllm_1_2``)       (was trtllm)
infinite, belady                   bounds: no capacity limit; offline farthest-next-use (``belady``)
=================================  ============================================================  ===================

Common to every engine preset: a lookup reuses at most ``input_len - 1`` tokens (an engine must
compute at least one prompt token to produce logits). Today's presets store input + output - 1
tokens of a finished request (the last sampled token never ran through the model); the versioned
ones keep the project's earlier input + output. Chunked prefill is ``--prefill-chunk`` tokens per
scheduled step, counted from the hit; one request prefills at a time. Chunk positions come from
one place per engine: ``engine_common.chunk_ends`` (SGLang no_buffer, LMDeploy),
``sglang.v2_tracks`` (extra_buffer), ``vllm.align_step_ends`` (the versioned ``vllm-0.11-*``) and
``vllm_current``'s ``schedule_chunk`` / ``step_ends`` (today's ``vllm``).
"""

from __future__ import annotations

# each module registers its policies and presets; this order is the order `marconi policies` lists
from policies import sglang_current  # noqa: F401
from policies import vllm_current  # noqa: F401,I001
from policies import trtllm_current  # noqa: F401
from policies import lmdeploy_current  # noqa: F401
from policies import sglang_0_5_9  # noqa: F401
from policies import sglang_pathrefresh  # noqa: F401
from policies import vllm_0_11  # noqa: F401
from policies import lmdeploy_0_16  # noqa: F401
from policies import trtllm_1_2  # noqa: F401
from policies.base import PolicyPreset, register_preset
from policies.engine_common import MAX_BLOCK_TOKENS, ChunkedPrefill, TailFirstLRUEviction, VllmBlocks  # noqa: F401  (re-exported)
from policies.vllm import vllm_block_tokens  # noqa: F401  (re-exported)

register_preset(
    PolicyPreset(
        "infinite",
        "bound: judicious admission with unlimited capacity (never evicts)",
        admission="judicious",
        eviction="lru-leaf",
        unlimited=True,
        engine="bound",
    )
)

from policies import belady  # noqa: E402,F401  (the offline bound, after the online ones)
