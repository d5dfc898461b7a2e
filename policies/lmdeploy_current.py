"""LMDeploy today: the PyTorch engine's ``block_trie`` with the engine's last-token rule (``lmdeploy``).

Follows InternLM/lmdeploy at v0.16.0 (commit 1263d5cd8, 2026-08-21), the newest release read:
``lmdeploy/pytorch/paging/block_trie/`` is as of PR #4799 (non-aligned checkpoints) and #4788,
``BlockTrie.match`` caps a hit at ``seq.num_valid_ids - 1`` and ``allocate`` caches only the
``num_valid_ids`` tokens whose KV exists, so a finished request leaves input + output - 1 tokens
(the last sampled token was never run through the model). Placement, the one-checkpoint-per-anchor
rule, frozen partial blocks and the tiered eviction are those of ``policies/lmdeploy.py``, plus
one rule the differential check against the engine's own code found (``trie.py``
``_extend_trie_path``: a block in ``recompute_overlap.fresh_block_range`` with no trie child ends
the path extension before the forward): after a hit on a checkpoint off the block grid, the first
prefill forward's end checkpoint is lost when it is anchored beyond the blocks the trie already
holds on that path; ``_reserve_checkpoint``'s refusal of a checkpoint at the step an
anchor's checkpoint already has (that one stays, whichever path it is on: the root anchor is
shared by every prompt shorter than a block); and its refusal to replace a pinned checkpoint: the
one a request restores stays pinned through its first prefill forward, so that forward's end
checkpoint is not saved when it anchors on the restored one's block. KV accounting
(``Lmdeploy016Preset``): a frozen block beside the trie's own copy is a whole block, KV leaves go
one block at a time, and admission makes room for the prompt's blocks from the restored one on.

Knobs (LMDeploy's PyTorch engine config names): ``--block-size`` (``block_size``, 64),
``--prefix-cache-decode-state-interval`` (``prefix_cache_decode_state_interval``, 0 = off; a
multiple of the block), ``--state-pool`` (``prefix_cache_state_budget``), ``--prefill-chunk``.

Reproduces (``tests/policies/test_current_presets.py``, tests/pytorch/paging/test_block_trie/ at
1263d5cd8): ``test_checkpoint_step_geometry`` under the last-token rule (a follow-up turn reuses
the state at input + output - 1, anchored on its block); the decode checkpoint at the last
multiple of the interval (``test_ssm_decode_checkpoint_keeps_old_state_when_new_node_is_pending``'s
one replaceable decode checkpoint per sequence). Recency follows the engine's ``perf_counter``
stamps (``strict_clock``: operations at one simulated time in the order they happen). Not
modelled: TurboMind, the producer pin of a save in flight (the restore pin is: the checkpoint a
request restores is neither replaced by its first forward's save nor evicted, the states above it
on its path are). Checked against LMDeploy's own scheduler and block trie by
``benchmarks/differential_lmdeploy.py`` (docs/presets-engines.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from policies.base import EngineRules, admission, eviction, register_preset
from policies.engine_common import StatePool, input_tokens
from policies.lmdeploy import LMDEPLOY_BLOCK, LmdeployAdmission, LmdeployPreset, TieredLRUEviction


@admission("lmdeploy-0.16")
class Lmdeploy016Admission(LmdeployAdmission):
    """``lmdeploy``'s placement plus the fresh-block rule of ``BlockTrie.allocate``: a request
    restored from a checkpoint off the block grid recomputes the blocks from the restored one on
    into private blocks (``recompute_overlap.fresh_block_range``); before the forward the trie
    path extends over those the trie already holds and stops at the first it does not, so the
    first forward's end checkpoint, when anchored beyond that point, finds no attached anchor
    node and is not saved (``reserve_save`` returns -1). And the restore pin: the checkpoint a
    request restores stays pinned through its first forward (``Scheduler._pin_ssm_restore_if_needed``
    at admission, released by ``EngineLoop._publish_forward_checkpoints`` after the save is
    published), so that forward's end checkpoint, when anchored on the same block as the restored
    one, is refused (``_reserve_checkpoint``: ``pin_count > 0``) and the restored one stays."""

    def prefill_checkpoints(self, match, ctx):
        cps = super().prefill_checkpoints(match, ctx)
        G = ctx.block_tokens
        B = self.params.block_size or LMDEPLOY_BLOCK
        hit = match.hit_tokens  # exact: on a hash-block trace a state may end inside a symbol
        if cps and hit % B:
            # blocks from the restored one on are recomputed ("fresh"): the trie path extends
            # over those the trie already holds, and stops at the first it does not
            attached = max(hit // B * B, match.match_tokens // B * B)
            first = input_tokens(ctx) if cps[0] == ctx.n_input else cps[0] * G
            if first // B * B > attached:
                return cps[1:]
        if cps and hit > 0:  # the restored checkpoint is pinned through the first forward
            first = input_tokens(ctx) if cps[0] == ctx.n_input else cps[0] * G
            if first // B == hit // B:
                return cps[1:]
        return cps


@eviction("lmdeploy-0.16-tiered")
class Lmdeploy016Eviction(TieredLRUEviction):
    """``lmdeploy-tiered`` on the engine's clock: LMDeploy stamps recency with
    ``time.perf_counter()`` (a block's in ``update_access_time``, block_manager/base_block_manager.py
    L158-L161; a checkpoint's when it is pinned for a restore and when it is published,
    block_trie/checkpoint_lifecycle.py L199 and L454), so operations at one simulated time keep
    the order they happen in (``strict_clock``): the checkpoint a request restores is older than
    the one it saves, and goes first when a later save needs a slot.

    A request pins only the checkpoint it restores (``pin_restore``): checkpoint-only and frozen
    eviction take any published checkpoint without a pin (``_is_evictable_checkpoint``,
    checkpoint_lifecycle.py L537-L539), those on a running request's matched path too, where its
    KV blocks (held by the request) stay. So a state is a candidate of the state and frozen lists
    unless a lock ends at its node (``keys_on_direct_lock``: a lock passing through to a deeper
    node leaves it evictable). Not followed: an insert's guard lock on the node its walk ends in
    protects that node's state, which the engine does not pin."""

    strict_clock = True
    keys_on_direct_lock = True

    def keys(self, node):
        out = super().keys(node)
        if node.parent is not None and node.lock and node.has_state:
            if node.lock == sum(c.lock for c in node.children.values()):  # no lock ends here
                state_t = getattr(node, "state_access", node.last_access)
                out["state"] = (state_t, -node.depth_tokens)
                if node.depth_tokens % self.block:
                    out["frozen"] = (state_t, -node.depth_tokens)
        return out


@dataclass(frozen=True)
class Lmdeploy016Preset(LmdeployPreset):
    """``lmdeploy``: the block trie's rules plus ``_reserve_checkpoint``'s refusals, and the KV
    accounting the differential against the engine's own code found (LMDeploy 1263d5cd8):

    - a checkpoint's frozen block is a whole block beside the trie's own copy once the path goes
      on past it (``frozen_whole``: ``_create_checkpoint`` allocates it,
      block_trie/checkpoint_lifecycle.py L404-L406; ``_extend_trie_path`` gives the trie the full
      block, block_trie/trie.py L557-L590);
    - KV leaves are evicted one block at a time, the checkpoint anchored on an evicted block with
      it (``block_evict``: block_trie/kv_lifecycle.py L131-L139, ``release_checkpoint`` L89);
    - admission frees every block of the prompt from the restored one on, cached or not
      (``admit_from_anchor``: ``_evict_for_ssm``, eviction_helper/recompute_eviction_helper.py
      L69-L118; ``num_required_blocks``, block_manager/default_block_manager.py L26-L34), in
      sequential mode (the batching schedulers make room per step as before); the trie then gives
      back the prompt's blocks it holds already (none after a hit off the block grid: trie.py
      L394-L399, L590-L597), the save's frozen block comes from free blocks only or the checkpoint
      is not saved (checkpoint_lifecycle.py L397-L406, ``reserve_save`` L85-L88), and the decode
      evicts for the sequence's own blocks, frozen checkpoints first, its own new one among them
      (``BlockTrie.evict``, trie.py L634-L648);
    - KV is held in whole blocks keyed by their path: paths that part inside a block each hold a
      copy of it (``block_copies``: ``_extend_trie_path``, trie.py L545-L598)."""

    def engine_rules(self, spec, config) -> EngineRules:
        return replace(
            super().engine_rules(spec, config),
            anchor_refusals=True,
            frozen_whole=True,
            block_evict=True,
            admit_from_anchor=True,
            block_copies=self.block(config),
        )


register_preset(
    Lmdeploy016Preset(
        "lmdeploy",
        "LMDeploy 0.16 PyTorch engine: a checkpoint at each prefill forward end, one per block anchor, "
        "frozen partial blocks, tiered eviction, --prefix-cache-decode-state-interval; stores input + output - 1 tokens",
        admission="lmdeploy-0.16",
        eviction="lmdeploy-0.16-tiered",
        lookup_cap_minus_one=True,
        engine="lmdeploy",
        version="0.16.0",
        stores_last_token=False,
        extra_knobs=(StatePool,),
    )
)
