"""TensorRT-LLM today: ``MambaHybridCacheManagerV2`` with periodic snapshots (``trtllm``).

Follows NVIDIA/TensorRT-LLM's V2 hybrid cache manager (PR #16598;
``tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py`` ``MambaHybridCacheManagerV2``) and its
snapshot policy ``kv_cache_config.mamba_state_config.periodic_snapshot_interval`` as the 1.3.0rc
releases document it: off by default, and with no snapshot policy a hybrid model's block reuse is
disabled ("attention KV blocks alone cannot restore" the recurrent state), so every hit is 0 by
configuration; with an interval N, the scheduler ends context chunks only at snapshot points
(``prepare_expect_snapshot_points``: "a snapshot can only be taken where an iteration ends") and
"reuse only lands on multiples of the interval". Test read: the manager factory's
``test_hybrid_cache_manager_factory_honors_v2_setting`` (``MambaStateConfig(periodic_snapshot_interval=256)``
with ``use_kv_cache_manager_v2`` selects the V2 manager).

Knobs (TensorRT-LLM's names): ``--periodic-snapshot-interval`` (``periodic_snapshot_interval``, 0
= off).

- A state at every multiple of N the prompt passes (above the hit) and at every multiple decode
  passes, up to input + output - 1 tokens (the last sampled token never ran through the model);
  none at the prompt end unless it is a multiple (likely: snapshots are periodic only).
- Eviction: the KV manager's LRU over leaves, tail first (unverified, as before).

Not modelled: fixed-offset snapshot policies (offsets from the start or end of a conversation),
branch snapshots, ``tokens_per_block`` (reuse is per token here), the V2 manager's pool sizing
from ``avg_seq_len``.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import AdmissionPolicy, PolicyPreset, admission, knob, register_preset
from policies.engine_common import full_tokens, input_tokens


@dataclass(frozen=True)
class TrtllmParams:
    """TensorRT-LLM's snapshot knob (``kv_cache_config.mamba_state_config``)."""

    periodic_snapshot_interval: int = knob(
        0, "trtllm: mamba_state_config.periodic_snapshot_interval, tokens between recurrent-state snapshots (0 = no "
        "snapshots: hybrid block reuse off).", min=0)


def multiples(lo: int, hi: int, step: int) -> list[int]:
    """Multiples of ``step`` in ``(lo, hi]`` (tokens)."""
    if step <= 0:
        return []
    return list(range((lo // step + 1) * step, hi + 1, step))


@admission("trtllm")
class TrtllmAdmission(AdmissionPolicy):
    """Periodic snapshots: every multiple of the interval in the prompt and in decode."""

    Params = TrtllmParams

    def prefill_checkpoints(self, match, ctx):
        G = ctx.block_tokens
        N = self.params.periodic_snapshot_interval
        return [t // G for t in multiples(match.hit_sym * G, input_tokens(ctx), N) if t % G == 0]

    def decode_checkpoints(self, match, ctx):
        G = ctx.block_tokens
        N = self.params.periodic_snapshot_interval
        return [t // G for t in multiples(input_tokens(ctx), full_tokens(ctx), N) if t % G == 0]


register_preset(PolicyPreset(
    "trtllm", "TensorRT-LLM today (MambaHybridCacheManagerV2, #16598): a snapshot every "
    "--periodic-snapshot-interval tokens (0, the default, turns hybrid reuse off); stores input + output - 1 tokens",
    admission="trtllm", eviction="lru-tail-first", lookup_cap_minus_one=True, engine="trtllm",
    version="1.3.0rc", stores_last_token=False))
