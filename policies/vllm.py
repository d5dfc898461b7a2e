"""vLLM's hybrid prefix caching machinery: ``--mamba-cache-mode align`` and ``all`` placement, the block.

Shared by ``policies/vllm_current.py`` (``vllm``, today's engine with its knobs) and
``policies/vllm_0_11.py`` (the earlier behaviour, ``vllm-0.11-align`` / ``vllm-0.11-all``).

Models vllm-project/vllm as of PR #30877 (align mode, merged 2025-12) and the scheduler's
``_mamba_block_aligned_split`` (``vllm/v1/core/sched/scheduler.py``, stored version 00024d314514),
without EAGLE (its one-block back-off of the last cacheable position is not modelled).

- Grid: the hybrid block B: the attention block raised until one attention page holds one linear
  layer's state page (528 tokens for Qwen3.5-like shapes; ``--block-size`` overrides it). Only
  full blocks are cached; a hit needs KV for every block and a state at its last one.
- align, prefill: steps are cut so the state at ``last = n - n % B`` is always kept: a step
  ending before ``last`` is a block multiple, a step crossing ``last`` is cut there, the rest is
  the tail. The kernel's final state is kept at each step end on a block boundary. So an
  unchunked prompt keeps exactly one state, at its last full block (test
  ``tests/v1/core/test_mamba_align_chunk_split.py::test_disabling_eagle_block_drop_keeps_the_trailing_cache_boundary``).
- Decode: a state at every block boundary it crosses ("decode caching", PR #30877; the PR #45845
  thread: "in prefill, we snapshot per chunk end, but in decode, we snapshot every block size").
- all: a state at every block boundary of the prompt (needs model support; otherwise vLLM falls
  back to align, #51250), and the same decode capture (likely).
- Eviction: one free-block LRU shared by KV and states, a finished request's blocks released
  tail first (``lru-tail-first``); whole-path refresh.

Reproduces: test_mamba_align_chunk_split.py (trailing cache boundary; intermediate chunk ends
on the block grid) and vLLM #40696 (block 528: a 979-token prompt reused up to 528 = 54 %).
Not modelled: per-block (rather than per-edge) eviction of a leaf; the step budget shared with
other requests (one request prefills at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.base import AdmissionPolicy, EngineRules, PolicyError, admission
from policies.engine_common import EnginePreset, VllmBlocks, input_tokens

VLLM_KERNEL_ALIGN = 16  # vLLM rounds the raised attention block to this many tokens
MAX_BLOCK = 4096  # the largest block sim.cache.blocks hashes into one symbol


def vllm_block_tokens(spec) -> int:
    """vLLM's hybrid block: the attention block raised until one layer's attention page
    (block x KV bytes per token per layer) holds one linear layer's state page, rounded up to
    the kernel alignment (16). Qwen3.5-9B-like shapes (4 KV heads x 256, fp32 GDN state):
    2,146,304 B / 4,096 B per token = 524 -> 528."""
    n_lin = spec.n_gdn + spec.n_mamba
    if not spec.is_hybrid or spec.n_attn == 0 or n_lin == 0:
        return VLLM_KERNEL_ALIGN
    state_page = math.ceil(spec.state_bytes() / n_lin)
    attn_page_1 = spec.kv_bytes_per_token() // spec.n_attn
    return VLLM_KERNEL_ALIGN * math.ceil(state_page / (VLLM_KERNEL_ALIGN * attn_page_1))


@dataclass(frozen=True)
class VllmPreset(EnginePreset):
    """A vLLM preset: the grid is the model's hybrid block (``--block-size`` overrides it), and
    only whole blocks are cached."""

    def grid_for(self, spec, config) -> int:
        return config.block_size or vllm_block_tokens(spec)

    def engine_rules(self, spec, config) -> EngineRules:
        return EngineRules(kv_extent="blocks", extent_block=self.grid_for(spec, config))

    def check(self, spec, config) -> None:
        block = self.grid_for(spec, config)
        if block > MAX_BLOCK:  # vLLM's own block (--block-size is capped at MAX_BLOCK before this)
            raise PolicyError(
                f"{self.name}: vLLM's block for {spec.name} is {block} tokens (one layer's state page over "
                f"its attention page per token), more than the {MAX_BLOCK} the simulator hashes: pick "
                "another policy"
            )


def align_step_ends(hit_tokens: int, n: int, B: int, budget: int) -> list[int]:
    """Token positions where vLLM's align-mode prefill steps end, from a hit at ``hit_tokens`` (a
    block multiple) through an ``n``-token prompt with ``budget`` tokens per step."""
    last = n - n % B
    pos, ends = hit_tokens, []
    while pos < n:
        step = min(budget, n - pos)
        if pos + step < last:
            step = max(step // B, 1) * B  # a budget under one block still runs one (vLLM would wait)
        elif pos < last < pos + step:
            step = last - pos  # "force to cache the last chunk"
        pos += step
        ends.append(pos)
    return ends


def decode_boundaries(ctx) -> list[int]:
    """Block boundaries (symbols) decode crosses: after the prompt, up to input + output."""
    first = input_tokens(ctx) // ctx.block_tokens + 1
    return list(range(first, ctx.n_full + 1)) if ctx.n_full >= first else []


@admission("vllm-align")
class VllmAlignAdmission(AdmissionPolicy):
    """``--mamba-cache-mode align``: the state at each prefill step end on a block boundary (steps
    cut by ``_mamba_block_aligned_split``) and at each block boundary crossed in decode."""

    Params = VllmBlocks
    splits_for_states = True  # the block-aligned split needs Mamba layers (a dense model: none)
    uses_prefill_steps = True
    running_state_slots = 2  # the running state + the last step's checkpoint

    def prefill_checkpoints(self, match, ctx):
        B = ctx.block_tokens
        if ctx.prefill_steps is not None:
            ends = [e for e in ctx.prefill_steps if e > match.hit_sym * B]
        else:
            ends = align_step_ends(match.hit_sym * B, input_tokens(ctx), B, self.params.prefill_chunk_tokens)
        return [e // B for e in ends if e % B == 0 and e // B <= ctx.n_input]

    def schedule_chunk(self, start, end, budget, step_budget, ctx):
        """``_mamba_block_aligned_split``: a step ending before the prompt's last full block is a
        whole number of blocks, a step crossing it is cut there (a budget left under one block:
        the request waits, unless the whole step budget is under a block)."""
        B = ctx.block_tokens
        n = input_tokens(ctx)
        last = n - n % B
        step = min(budget, end - start)
        if start + step < last:
            whole = step // B * B
            return whole if whole or budget < step_budget else step
        if start < last < start + step:
            return last - start
        return step

    def decode_checkpoints(self, match, ctx):
        return decode_boundaries(ctx)


@admission("vllm-all")
class VllmAllAdmission(AdmissionPolicy):
    """``--mamba-cache-mode all``: a state at every block boundary of the prompt and of decode."""

    Params = VllmBlocks
    running_state_slots = 2

    def prefill_checkpoints(self, match, ctx):
        return list(range(match.hit_sym + 1, ctx.n_input + 1))

    def decode_checkpoints(self, match, ctx):
        return decode_boundaries(ctx)
