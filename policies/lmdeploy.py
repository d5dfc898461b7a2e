"""LMDeploy's PyTorch engine prefix cache (``lmdeploy/pytorch/paging/block_trie``): the shared machinery.

Used by ``policies/lmdeploy_current.py`` (``lmdeploy``, v0.16.0 with the engine's last-token
rule) and ``policies/lmdeploy_0_16.py`` (``lmdeploy-0.16-pytorch``, the project's earlier preset).

Models InternLM/lmdeploy's ``checkpoint_lifecycle.py`` (stored version 24d02506abc6),
``kv_lifecycle.py`` and ``BlockTrie.evict``, with non-aligned checkpoints (#4799) and decode
checkpoints off by default (``prefix_cache_decode_state_interval`` 0; N > 0: the sequence's one
replaceable decode checkpoint, block-aligned, at the last multiple of N it decoded past).

- Block: the engine's ``block_size`` (``--block-size``; LMDeploy's default 64). The trie holds
  whole blocks only; the tokens of a prompt's partial last block stay only in the frozen copy a
  partial checkpoint owns.
- Placement: a checkpoint at every prefill forward end (each chunk end and the prompt end, any
  position). A checkpoint at step ``s`` is anchored on the trie node at ``s - s % B``
  (``checkpoint_anchor_step``) and each anchor holds one: a later one replaces it
  (``_reserve_checkpoint``). A checkpoint off the block grid owns a frozen copy of its partial
  block: one more KV block.
- Eviction. KV pressure (``BlockTrie.evict``): frozen partial checkpoints first (each frees its
  frozen block; the anchor stays), then KV leaves (LRU, a leaf's checkpoint goes with it). State
  pressure (the checkpoint-slot budget, ``--state-pool``): checkpoint-only eviction, LRU on the
  checkpoint's ``last_access_time``, node and KV kept. One budget: frozen, then leaves, then
  checkpoint-only.
- Refresh: a hit refreshes the matched blocks and the restored checkpoint (``pin_restore``).
- Hash-block traces (symbols of G tokens: Bailian's 16, Mooncake's 512). A checkpoint's step is
  its exact token (a prompt's last block is partial, so the prompt end is off both grids): its
  anchor and its frozen block follow the engine's B-token block on any trace. Where G is coarser
  than B (Mooncake: 512 vs 64) the tree cannot end a block inside a symbol, so the trie's whole
  blocks are rounded down to whole symbols: a stored sequence without a state at its end keeps
  whole symbols, a dropped partial checkpoint gives back its symbol's tokens past the last whole
  symbol (the engine keeps the 64-token blocks before it), and an anchor inside a symbol is shared
  only by the paths that hold that whole symbol (hashes say nothing of a part of a block). Only
  stateless KV is affected, not where states sit or what hits. A decode interval must be a
  multiple of G (one line, exit 2). Sequential mode's single insert of input + output puts the
  prompt-end state at its symbol's end (as for every preset on such traces); des mode inserts
  the prompt at its exact end.

Reproduces (tests/pytorch/paging/test_block_trie/): ``test_checkpoint_step_geometry``,
``test_ssm_checkpoint_save_owns_and_releases_partial_tail``,
``test_ssm_checkpoint_replaces_partial_variant_at_same_anchor``,
``test_kv_pressure_evicts_unpinned_frozen_tail``,
``test_ssm_checkpoint_save_evicts_unpinned_state_only``. Not modelled: pins of in-flight copies
(a request's own matched path is locked instead), the exact-token verification behind hashes
(tokens are compared exactly anyway), TurboMind.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import AdmissionPolicy, EngineRules, PolicyError, RefreshRule, Victim, admission, eviction, knob
from policies.engine_common import EnginePreset, TwoHeapLRU, VllmBlocks, chunk_ends, full_tokens, input_tokens

LMDEPLOY_BLOCK = 64  # LMDeploy's default block_size
#: a hit refreshes the matched blocks and the restored checkpoint only (pin_restore); each
#: insert refreshes its blocks
LMDEPLOY_REFRESH = RefreshRule(hit="to-hit", state="consumed", insert="every")


def anchor_step(step: int, block: int) -> int:
    """The trie anchor of a checkpoint at ``step`` (``checkpoint_anchor_step``)."""
    return step - step % block


def block_rules(block: int) -> EngineRules:
    """The block trie's rules on ``block``-token blocks: KV kept in whole blocks, a state off the
    block grid charging its frozen block, states anchored on blocks, a pool of state slots."""
    return EngineRules(
        refresh=LMDEPLOY_REFRESH,
        kv_extent="blocks",
        extent_block=block,
        frozen_block=block,
        anchor_block=block,
        state_pool=True,
    )


@dataclass(frozen=True)
class LmdeployPreset(EnginePreset):
    """LMDeploy: the block size comes from the engine config (``--block-size``, default 64)."""

    def block(self, config) -> int:
        return config.block_size or LMDEPLOY_BLOCK

    def unit_tokens(self, spec, config) -> int:
        return self.block(config)

    def engine_rules(self, spec, config) -> EngineRules:
        return block_rules(self.block(config))

    def check(self, spec, config) -> None:
        B = self.block(config)
        if config.prefix_cache_decode_state_interval % B:
            raise PolicyError(
                f"--prefix-cache-decode-state-interval {config.prefix_cache_decode_state_interval} "
                f"must be a multiple of the {B}-token block"
            )

    def check_blocks(self, spec, config, block_tokens) -> None:
        # a decode checkpoint sits on a multiple of the interval; a symbol cannot end inside a
        # hash block, so one off the trace's grid could not be placed (the block trie itself is
        # rounded to whole symbols: module docstring)
        every = config.prefix_cache_decode_state_interval
        if every and block_tokens > 1 and every % block_tokens:
            raise PolicyError(
                f"policy {self.name} checkpoints decode every {every} tokens "
                f"(--prefix-cache-decode-state-interval), finer than (or not a multiple of) "
                f"the trace's {block_tokens}-token blocks"
            )


@dataclass(frozen=True)
class LmdeployParams(VllmBlocks):
    """LMDeploy's own knobs (PyTorch engine config names)."""

    prefix_cache_decode_state_interval: int = knob(
        0,
        "lmdeploy*: prefix_cache_decode_state_interval, decode tokens between SSM checkpoints (a multiple of the "
        "block; 0 = off).",
        min=0,
    )


@admission("lmdeploy")
class LmdeployAdmission(AdmissionPolicy):
    """A checkpoint at every prefill forward end (chunk ends and the prompt end, any position);
    with a decode interval, one decode checkpoint at the last multiple of it decode passed."""

    Params = LmdeployParams
    uses_prefill_steps = True
    running_state_slots = 2  # the runtime slot + the reserved save slot

    def prefill_checkpoints(self, match, ctx):
        if ctx.prefill_steps is not None:
            return self.scheduled_ends(match, ctx) + [ctx.n_input]
        step = max(self.params.prefill_chunk_tokens // ctx.block_tokens, 1)
        return chunk_ends(match.hit_sym, ctx.n_input, step) + [ctx.n_input]

    def decode_checkpoints(self, match, ctx):
        every = self.params.prefix_cache_decode_state_interval
        if every <= 0:
            return []
        G = ctx.block_tokens
        last = full_tokens(ctx) // every * every
        return [last // G] if last > input_tokens(ctx) and last % G == 0 else []


@eviction("lmdeploy-tiered")
class TieredLRUEviction(TwoHeapLRU):
    """LMDeploy's lists: ``frozen`` (checkpoints off the block grid, by checkpoint recency),
    ``leaf`` (KV leaves, by block recency) and ``state`` (every checkpoint, by its recency).
    Ties: the deeper node first (a sequence's blocks are freed tail first)."""

    lists = ("frozen", "leaf", "state")

    def attach(self, tree):
        super().attach(tree)
        self.block = getattr(tree, "frozen_block", 0) or LMDEPLOY_BLOCK

    def keys(self, node):
        out = {}
        if node.lock or node.parent is None:
            return out
        state_t = getattr(node, "state_access", node.last_access)
        if node.has_state:
            out["state"] = (state_t, -node.depth_tokens)
            if node.depth_tokens % self.block:
                out["frozen"] = (state_t, -node.depth_tokens)
        if not node.children:
            out["leaf"] = (node.last_access, -node.depth_tokens)
        return out

    def pop_kv_victim(self):
        node = self.take("frozen")
        if node is not None:
            return Victim(node, drop_state_only=True)
        node = self.take("leaf")
        return None if node is None else Victim(node)

    def pop_state_victim(self):
        node = self.take("state")
        return None if node is None else Victim(node, drop_state_only=True)

    def pop_victim(self):
        return self.pop_kv_victim() or self.pop_state_victim()
