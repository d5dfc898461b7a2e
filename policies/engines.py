"""Engine presets: how today's serving engines place, admit and evict hybrid-model states.

One module per engine reimplements, from the engine's own code and tests (read, never copied;
``docs/presets.md`` sections 6-10), its checkpoint placement, eviction order and refresh rule on
the simulator's hybrid radix tree; each module's docstring names the engine version it models
and the engine tests it reproduces (``tests/policies/test_engine_presets.py`` ports them).
Rules the core tree does not have (state pools, refresh of the lookup path, frozen partial
blocks, one state per block anchor) are options of ``sim.cache.engine_tree.EngineTree``, which a
preset asks for through ``cache_options``.

======================  ==========================================================================
preset                  engine (module)
======================  ==========================================================================
vllm-align, vllm-all    vLLM ``--mamba-cache-mode align|all`` (``policies.vllm``)
sglang-v1, sglang-v2    SGLang ``no_buffer`` / ``extra_buffer``, today's refresh (``policies.sglang``)
sglang-v1-pathrefresh   SGLang before #31643 / #31648 (``policies.sglang_pathrefresh``)
lmdeploy                LMDeploy PyTorch engine ``block_trie`` (``policies.lmdeploy``)
trtllm                  TensorRT-LLM: a state every 256 prompt tokens and at prompt end (below)
infinite, belady        bounds: no capacity limit; offline farthest-next-use (``policies.belady``)
======================  ==========================================================================

Common to every engine preset: a lookup reuses at most ``input_len - 1`` tokens (an engine must
compute at least one prompt token to produce logits). Chunked prefill is ``--prefill-chunk``
tokens per scheduled step, counted from the hit; one request prefills at a time.
"""

from __future__ import annotations

from policies import vllm  # noqa: F401  (each engine's module registers its policies and presets)
from policies import sglang  # noqa: F401,I001  (in this order: the order of --policy choices)
from policies import sglang_pathrefresh  # noqa: F401
from policies import lmdeploy  # noqa: F401
from policies.base import AdmissionPolicy, PolicyPreset, admission, register_preset
from policies.engine_common import ChunkedPrefill, TailFirstLRUEviction, VllmBlocks  # noqa: F401  (re-exported)
from policies.vllm import vllm_block_tokens  # noqa: F401  (re-exported)

TRTLLM_INTERVAL = 256  # TensorRT-LLM mamba_state_cache_interval in shipped configs


@admission("trtllm")
class TrtllmAdmission(AdmissionPolicy):
    """A state every 256 prompt tokens (context chunks are cut there) and at the prompt end."""

    def prefill_checkpoints(self, match, ctx):
        step = max(TRTLLM_INTERVAL // ctx.block_tokens, 1)
        first = (match.hit_sym // step + 1) * step
        return list(range(first, ctx.n_input, step)) + [ctx.n_input]

    def decode_checkpoints(self, match, ctx):
        return []


register_preset(PolicyPreset(
    "trtllm", "TensorRT-LLM (mamba_state_cache_interval 256, unverified beyond docs): a state every 256 "
    "prompt tokens and at prompt end, LRU over leaves",
    admission="trtllm", eviction="lru-tail-first", lookup_cap_minus_one=True))
register_preset(PolicyPreset(
    "infinite", "bound: judicious admission with unlimited capacity (never evicts)",
    admission="judicious", eviction="lru-leaf", unlimited=True))

from policies import belady  # noqa: E402,F401  (the offline bound, after the online ones)
