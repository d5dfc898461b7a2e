"""TensorRT-LLM's first hybrid reuse, as the project first modelled it from the docs (``trtllm-1.2-interval``).

The behaviour the project called ``trtllm`` before issue 19: a state every
``mamba_state_cache_interval`` tokens (256 in NVIDIA/TensorRT-LLM's shipped configs) and at the
prompt end, context chunks cut at the capture points, eviction through the KV manager's LRU
(``tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py``, ``CppMambaHybridCacheManager``; PRs
#12185 / #12896). Read from the documentation only; the release number (the 1.2 line, before the
V2 manager of #16598) is unverified. A finished request stores input + output tokens.

Rename: the name ``trtllm`` now means today's engine (``policies/trtllm_current.py``).
"""

from __future__ import annotations

from policies.base import AdmissionPolicy, PolicyPreset, admission, register_preset

TRTLLM_INTERVAL = 256  # TensorRT-LLM mamba_state_cache_interval in shipped configs


@admission("trtllm-interval")
class TrtllmIntervalAdmission(AdmissionPolicy):
    """A state every 256 prompt tokens (context chunks are cut there) and at the prompt end."""

    def prefill_checkpoints(self, match, ctx):
        step = max(TRTLLM_INTERVAL // ctx.block_tokens, 1)
        first = (match.hit_sym // step + 1) * step
        return list(range(first, ctx.n_input, step)) + [ctx.n_input]

    def decode_checkpoints(self, match, ctx):
        return []


register_preset(
    PolicyPreset(
        "trtllm-1.2-interval",
        "TensorRT-LLM 1.2 (mamba_state_cache_interval 256, from the docs): a state every 256 "
        "prompt tokens and at prompt end, LRU over leaves",
        admission="trtllm-interval",
        eviction="lru-tail-first",
        lookup_cap_minus_one=True,
        engine="trtllm",
        version="1.2 (docs)",
    )
)
