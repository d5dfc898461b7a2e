"""vLLM today: align-mode hybrid prefix caching on by default, sparse retention, junction checkpoints (``vllm``).

Follows vLLM 0.34.0 (the newest release, wheel commit g62d4bc3c7; its cache path is unchanged from
0.33.0, g4ba787ec9), driven by ``benchmarks/differential_vllm.py``: vLLM's own ``KVCacheManager`` and
scheduler split with the simulator's requests give the same hit tokens on every request
(``docs/presets-engines.md``). Hybrid prefix caching is on by default in ``align`` mode (PR #50991;
``all`` deprecated in #55041, kept in ``vllm-0.11-all``); the retention interval of PR #52216
(``CacheConfig.prefix_cache_retention_interval``, default 0), dense when EAGLE is on (#55760); the
shared-prefix junction of PR #37898. The block: the attention block raised to the mamba page
(``vllm_block_tokens``; 528 tokens for Qwen3.5-4B / 9B shapes, #40696), ``--block-size`` overrides it.

Files and lines (vLLM 0.34.0):

- ``vllm/v1/core/sched/scheduler.py`` ``Scheduler._mamba_block_aligned_split`` (L563-L679): a step
  inside the prompt is cut to whole blocks and stops at the earliest of the next block boundary
  (a chunk started mid-block), the last cacheable position and the block-floored junction (the
  ``stops`` tuple, L661-L678). The last cacheable position is
  ``get_mamba_prefill_checkpoint_position`` (``vllm/v1/kv_cache_interface.py`` L1203-L1220):
  ``(n - 1) // B * B``, one token always left to recompute, so a prompt of whole blocks keeps its
  state one block short of its end (before: ``n - n % B``).
- ``vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks`` (L345-L347):
  ``shared_prefix_boundary = num_new_computed_tokens + num_uncached`` whenever the full-attention
  match (at most ``num_tokens - 1``) runs past the reconciled hit; no flag.
- ``vllm/v1/core/kv_cache_coordinator.py`` ``replay_boundaries`` (L65-L88): the positions retention
  keeps are ``num_prompt_tokens - 1`` and the junction (``single_type_kv_cache_manager.py`` L516);
  ``MambaManager.reachable_block_mask`` (``single_type_kv_cache_manager.py`` L1554-L1612) floors them
  to the block and adds the retention grid. Decode therefore keeps no state under retention 0 and
  only grid states under N > 0 (the rolling newest boundary the preset kept before, read from
  ``tests/v1/core/test_mamba_align_retention_grid.py`` at 9ab07979812c, is not in 0.34.0).
- ``_validate_prefix_cache_retention_interval`` (``kv_cache_coordinator.py`` L33-L62): an interval
  must be a multiple of the block.

``CacheConfig.enable_mamba_shared_prefix_checkpoint`` (``vllm/config/cache.py``, named
``enable_mamba_fine_grained_prefix_cache`` until #57382) is something else, off by default: a
checkpoint at the sub-block position an EAGLE / MTP sibling resumes from, in effect only with EAGLE
on the mamba group and a ``prefix_match_unit`` finer than the block (``KVCacheManager.__init__``,
``kv_cache_manager.py``). The simulator matches whole blocks, so the flag is refused (one line).

Knobs (named as the engine names them): ``--prefix-cache-retention-interval`` (tokens; 0 keeps
only the semantic states: the prompt's last cacheable block and the junction; N > 0 (a multiple of
the block) also the block boundaries on multiples of N, in prefill and decode; -1 stands for the
Python API's None: every state), ``--enable-mamba-shared-prefix-checkpoint`` (refused, above),
``--block-size``, ``--speculative-method`` (``none``, ``eagle``, ``eagle3``, ``mtp``: the ``method``
of ``--speculative-config``), ``--prefill-chunk`` (``--max-num-batched-tokens``).

- Prefill: steps cut by ``_mamba_block_aligned_split`` (``step_ends`` one request at a time,
  ``schedule_chunk`` under ``--scheduler continuous``); the states at step ends on the block grid,
  thinned by retention. A dense model's steps are not cut (the split runs where
  ``need_mamba_block_aligned_split``: Mamba layers and align mode).
- Decode: the block boundaries decode crosses; under retention only those on the grid.
- EAGLE / MTP on: every kept state sits one block earlier (the block dropped for the draft
  model's hidden states; ``reachable_block_mask`` shifts by one block), and retention is dense.
- A finished request stores input + output - 1 tokens (the last sampled token never ran through
  the model), full blocks only.
- Memory and eviction as vLLM's block pool (``vllm-free-queue`` and ``engine_rules``): one free
  queue where a state and its KV are separate entries, a hit refreshing the path to it and its own
  state, a state charged one padded page per layer, the running request's own blocks charged in
  sequential mode, the memory in whole blocks, recomputed KV cached twice.

Reproduces (``tests/policies/test_current_presets.py``): the retention grid and the decode states
per interval, the whole-block prompt's state one block short, the interval's multiple (each test
naming its line above); vLLM #40696's 528-token cliff; #45238's workload shape (the junction),
under every scheduler (``tests/policies/test_engine_rules_schedulers.py``); the EAGLE block drop of
test_mamba_align_chunk_split.py both ways; the block pool's rules under eviction
(``tests/policies/test_vllm_block_pool.py``), a leaf's KV evicted a block at a time, its last
block first (``block_evict``). Not modelled: a state's Mamba groups evicted one by one (with
eviction the differential agrees on every request but one of 300 on ``mooncake:sample`` at
retention -1, sequentially; under continuous batching at 4GB on ShareGPT on 1,235 / 1,235 of
1,235 at retention 0 / -1, the running requests' blocks charged by ``sim/engine/batching.py``),
the step budget shared with other requests, the
full-attention side of the EAGLE block drop, ``max_model_len`` (#48401's inert cache).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from policies.base import (
    AdmissionPolicy,
    EngineRules,
    PolicyError,
    RefreshRule,
    Victim,
    admission,
    eviction,
    knob,
    register_preset,
)
from policies.engine_common import Speculation, TwoHeapLRU, VllmBlocks, full_tokens, input_tokens
from policies.vllm import VllmPreset

VERSION = "0.34.0"  # the newest release, driven by benchmarks/differential_vllm.py (see the docstring)
SPECULATIVE = ("none", "eagle", "eagle3", "mtp")
DENSE = -1  # --prefix-cache-retention-interval -1: the Python API's None (every state kept)


@dataclass(frozen=True)
class VllmParams(VllmBlocks, Speculation):
    """vLLM's own hybrid-cache knobs, as its server flags name them."""

    prefix_cache_retention_interval: int = knob(
        0,
        "vllm: --prefix-cache-retention-interval in tokens (0: only the semantic states; N: also every block "
        "boundary on a multiple of N; -1: every state, the Python API's None).",
        min=DENSE,
    )
    enable_mamba_shared_prefix_checkpoint: bool = knob(
        False,
        "vllm: also a state at the sub-block junction where an EAGLE / MTP sibling resumes (named "
        "--enable-mamba-fine-grained-prefix-cache before #57382); in effect only with EAGLE / MTP and a prefix "
        "match unit finer than the block, which the simulator does not model (refused). The block-floored "
        "shared-prefix junction (#37898) needs no flag: vLLM always keeps it.",
        flag="--enable-mamba-shared-prefix-checkpoint/--no-enable-mamba-shared-prefix-checkpoint",
    )
    speculative_method: str = knob(
        "none",
        "vllm: --speculative-config's method (EAGLE / MTP drop one block: states one block earlier, retention dense).",
        choices=SPECULATIVE,
    )


def retained(positions: list[int], semantic: set[int], interval: int) -> list[int]:
    """The state positions (tokens) vLLM's retention mask keeps: every one when dense, else the
    semantic ones plus those on the interval's grid."""
    if interval == DENSE:
        return positions
    return [p for p in positions if p in semantic or (interval > 0 and p % interval == 0)]


def last_cache_position(n: int, B: int) -> int:
    """The prompt's last cacheable state (``get_mamba_prefill_checkpoint_position`` without EAGLE,
    vLLM 0.34.0 ``vllm/v1/kv_cache_interface.py`` L1203-L1220): the last block boundary that leaves
    at least one token to recompute, ``(n - 1) // B * B``; also the replay boundary retention keeps
    (``replay_boundaries``: ``num_prompt_tokens - 1``, floored to the block by the mask)."""
    return max(n - 1, 0) // B * B


def junction_tokens(match_tokens: int, n: int, B: int) -> int:
    """Where vLLM's detected shared prefix ends, floored to the block (0: none): the longest
    single-group hit (``shared_prefix_boundary`` = the mamba-limited hit + the uncached shared
    prefix, kv_cache_manager.py L286-L292; the lookup stops at ``n - 1`` tokens), floored as the
    scheduler's stop floors it (a sub-block junction's state is not separately cacheable)."""
    if match_tokens <= 0:
        return 0
    return min(match_tokens, n - 1) // B * B


@admission("vllm")
class VllmAdmission(AdmissionPolicy):
    """Today's vLLM align mode: block-aligned step ends (and the junction), thinned by the
    retention interval, shifted one block earlier under EAGLE / MTP."""

    Params = VllmParams
    uses_prefill_steps = True
    splits_for_states = True  # the block-aligned split needs Mamba layers (a dense model: none)
    #: a running request's attention KV is allocated a block at a time (``allocate_slots``,
    #: ``kv_cache_manager.py``; ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``): the
    #: continuous scheduler charges it in whole blocks (``sim.engine.batching``)
    running_kv_block = True
    #: a waiting request holds nothing: ``Scheduler.schedule`` looks it up (``get_computed_blocks``,
    #: ``scheduler.py`` L1149-L1166, no references taken) each pass while ``num_computed_tokens`` is
    #: 0, and ``allocate_slots`` returns None before touching its hit when the pool is short
    #: (``kv_cache_manager.py`` L605-L609; the hit is touched at L611-L622), so the scheduler
    #: stops (``new_blocks is None``, L1516-L1523) and the request stays waiting, to be matched again at the next pass
    rematches_waiting = True

    @property
    def running_state_slots(self) -> int:
        """The running state: one block per Mamba group (a state), under EAGLE / MTP spanning
        1 + num_speculative_blocks blocks (``MambaSpec.num_speculative_blocks`` =
        num_speculative_tokens; ``preprocess_mamba`` copies the previous step's state "to the last
        (1 + num_speculative_blocks) block"; a method without ``--speculative-tokens`` counts one).
        The previous step's block is held one step more only in a step that enters a new block
        (``MambaManager.allocate_new_blocks`` / ``remove_skipped_blocks``,
        ``single_type_kv_cache_manager.py`` L1802-L1928 / L1634-L1662): the continuous scheduler
        charges that second slot for that step alone (``running_kv_block``, ``sim.engine.batching``).
        Two for the whole run (before) held 3 blocks per running request that vLLM does not."""
        return 1 + self.spec_blocks()

    def spec_blocks(self) -> int:
        p = self.params
        return 0 if p.speculative_method == "none" else max(p.speculative_tokens, 1)

    def schedule_chunk(self, start, end, budget, step_budget, ctx):
        """``Scheduler._mamba_block_aligned_split`` (vLLM 0.34.0 ``vllm/v1/core/sched/scheduler.py``
        L563-L679; no EAGLE, hash block = block, no internal prefill checkpoint): a step ending
        inside the prompt is cut to whole blocks (a budget under one block waits, unless the whole
        step budget is under a block: then it runs and re-aligns at the next boundary), and stops
        at the earliest of the next block boundary (a chunk started mid-block), the last cacheable
        position ``(n - 1) // B * B`` (``get_mamba_prefill_checkpoint_position``,
        ``vllm/v1/kv_cache_interface.py`` L1203-L1220: one token is always left to recompute, so a
        prompt of whole blocks stops one block short of its end) and the block-floored shared-prefix
        junction, so a batching scheduler ends a step where the engine does."""
        B = ctx.block_tokens
        n = input_tokens(ctx)
        if start >= n:
            return min(budget, end - start)
        stop = start + min(budget, end - start)
        if stop < n:
            whole = stop // B * B
            if whole > start or B <= step_budget:
                stop = whole
        junction = junction_tokens(ctx.match_tokens, n, B)
        stops = [(start // B + 1) * B if start % B else 0, last_cache_position(n, B), junction]
        stop = min([s for s in stops if start < s < stop], default=stop)
        return max(stop - start, 0)

    def step_ends(self, hit: int, n: int, ctx) -> list[int]:
        """Where one request's prefill steps end with the whole ``--prefill-chunk`` budget each
        (the cut ``schedule_chunk`` makes, so fcfs / sequential and continuous agree)."""
        budget = self.params.prefill_chunk_tokens
        pos, ends = hit, []
        while pos < n:
            pos += self.schedule_chunk(pos, n, min(budget, n - pos), budget, ctx) or min(budget, n - pos)
            ends.append(pos)
        return ends

    def running_blocks(self, hit: int, ctx, kept: set[int], groups: int) -> int:
        """Blocks a request alone holds at its peak that the cache does not keep (sequential
        mode; ``kept``: the token positions of its kept states, ``groups``: Mamba groups). Align
        mode gives each step one new running-state block per Mamba group
        (``MambaManager.allocate_new_blocks``, ``single_type_kv_cache_manager.py`` L1802-L1928,
        one block past the skipped ones) and frees the previous one a step later
        (``remove_skipped_blocks``, L1634-L1662), so a step that enters a new block after the
        first step holds two per group; the previous one is cached only when its state is kept.
        The partial last attention block is never cached. EAGLE's extra blocks are not counted."""
        B = ctx.block_tokens
        n, full = input_tokens(ctx), full_tokens(ctx)
        ends = self.step_ends(hit, n, ctx) or [n]
        extra = groups + (1 if full % B else 0)
        if full > -(-ends[0] // B) * B:  # the request enters a new block after its first step
            b = (full - 1) // B * B  # the last block it enters
            prev = b if b >= n else max((e for e in ends if e <= b), default=hit)
            if prev not in kept:
                extra += groups
        return extra

    def interval(self) -> int:
        p = self.params
        return DENSE if p.speculative_method != "none" else p.prefix_cache_retention_interval

    def shift(self, positions: list[int], B: int, floor: int) -> list[int]:
        """EAGLE / MTP: each state one block earlier (kept only above ``floor``)."""
        if self.params.speculative_method == "none":
            return positions
        return [p - B for p in positions if p - B > floor]

    def prefill_states(self, match, ctx) -> tuple[list[int], int, int]:
        """The prefill states vLLM keeps before the EAGLE / MTP shift (tokens), the block and the hit."""
        B = ctx.block_tokens
        n = input_tokens(ctx)
        hit = match.hit_sym * B
        junction = junction_tokens(match.match_sym * B, n, B) if match.match_sym > match.hit_sym else 0
        if not junction > hit:
            junction = 0
        if ctx.prefill_steps is not None:  # a batching scheduler's step ends
            ends = [e for e in ctx.prefill_steps if e > hit]
        else:
            ends = self.step_ends(hit, n, ctx)
        states = [e for e in ends if e % B == 0 and e // B <= ctx.n_input]
        semantic = {last_cache_position(n, B), junction}
        return retained(states, semantic, self.interval()), B, hit

    def decode_states(self, match, ctx) -> tuple[list[int], int, int]:
        """The decode states vLLM keeps before the EAGLE / MTP shift (tokens), the block and the
        floor of the shift (the prompt's last full block). Under retention only those on the
        retention grid: the mask's reachable boundaries are the prompt's replay boundary and the
        junction (``replay_boundaries``, ``kv_cache_coordinator.py`` L65-L88, from
        ``num_prompt_tokens`` only), so with retention 0 decode keeps no state (vLLM 0.34.0; the
        rolling newest boundary of test_mamba_align_retention_grid.py at 9ab07979812c is gone)."""
        B = ctx.block_tokens
        n = input_tokens(ctx)
        states = list(range((n // B + 1) * B, full_tokens(ctx) + 1, B))
        return retained(states, set(), self.interval()), B, n // B * B

    def prefill_checkpoints(self, match, ctx):
        kept, B, hit = self.prefill_states(match, ctx)
        return [s // B for s in self.shift(kept, B, hit)]

    def decode_checkpoints(self, match, ctx):
        kept, B, floor = self.decode_states(match, ctx)
        return [s // B for s in self.shift(kept, B, floor)]

    def speculation_lost(self, match, ctx) -> list[int]:
        """Token positions where vLLM would keep a state but for EAGLE / MTP (the one alignment
        unit a hit loses, vLLM #54360 / #53670): kept positions that no shifted state lands on."""
        if self.params.speculative_method == "none":
            return []
        lost = []
        for kept, B, floor in (self.prefill_states(match, ctx), self.decode_states(match, ctx)):
            shifted = set(self.shift(kept, B, floor))
            lost += [p for p in kept if p not in shifted]
        return lost


@eviction("vllm-free-queue")
class VllmFreeQueueEviction(TwoHeapLRU):
    """vLLM's one free-block queue, with a state and the KV it ends as separate entries
    (vLLM 0.34.0 ``vllm/v1/core/block_pool.py`` ``free_blocks`` L798-L837: cached blocks are
    appended in the order a request frees them, the queue's head is evicted first).

    - A state is evicted on its own; its KV stays, with its own recency (a Mamba group's block
      and the attention blocks are different blocks of the queue), so a later request can still
      match that KV token by token (and recompute it: ``duplicate_kv``).
    - A lookup refreshes the attention path up to the hit and only the hit's state
      (``MambaManager.find_longest_cache_hit``, ``single_type_kv_cache_manager.py`` L1475-L1552,
      returns null blocks before the hit's block, and ``BlockPool.touch``, L774-L792, skips null
      blocks); a finished request's path is appended again when it is freed.
    - At equal recency (one request's blocks) a state goes before KV, shallower states first:
      align mode frees a state block once the request has computed past it
      (``MambaManager.remove_skipped_blocks``, L1634-L1662), before the request's attention blocks
      are freed at its end, tail first (``SingleTypeKVCacheManager.free``: reversed order).
    """

    refresh = RefreshRule(hit="to-hit", state="consumed")
    lists = ("kv", "state")
    #: the queue's order is the order of the frees, so requests at equal trace times are ordered
    #: as they are served (ShareGPT has such ties)
    strict_clock = True

    def keys(self, node):
        out = {}
        if node.parent is None:
            return out
        if node.lock:
            # a running request holds its path's attention blocks, not its states: align mode
            # frees a state block a step after the request computed past it (the hit's included,
            # ``remove_skipped_blocks``, ``single_type_kv_cache_manager.py`` L1634-L1662), so a
            # state on a running path stays in the free queue at its own recency
            if node.has_state:
                out["state"] = (getattr(node, "state_access", node.last_access), 0, node.depth_tokens)
            return out
        if not node.children:
            out["kv"] = (node.last_access, 1, -node.depth_tokens)
        if node.has_state:
            out["state"] = (getattr(node, "state_access", node.last_access), 0, node.depth_tokens)
        return out

    def _head(self):
        kv, st = self.top("kv"), self.top("state")
        if kv is None or st is None:
            return kv or st
        return kv if kv[:2] < st[:2] else st

    def next_key(self):
        """The queue position of the entry ``pop_victim`` would evict next: (recency, 0 for a
        state / 1 for KV, depth order); None: nothing evictable."""
        head = self._head()
        return None if head is None else head[0]

    def pop_victim(self):
        head = self._head()
        if head is None:
            return None
        node = head[3]
        if head[0][1] == 0:  # a state entry: the state alone
            self.take("state")
            return Victim(node, drop_state_only=True)
        self.take("kv")
        return Victim(node)


def mamba_groups(spec) -> tuple[int, int]:
    """vLLM's KV cache groups for a hybrid model: layers per group and the number of Mamba
    groups (vLLM 0.34.0 ``vllm/v1/core/kv_cache_planning.py``
    ``_get_kv_cache_groups_uniform_page_size``, L567-L580: the fewest layers of one kind, or the
    most when they are under 1.5 times the fewest; Qwen3.5-9B: 8 attention and 24 Gated-DeltaNet
    layers, groups of 8, three Mamba groups)."""
    n_linear = spec.n_gdn + spec.n_mamba
    fewest, most = min(spec.n_attn, n_linear), max(spec.n_attn, n_linear)
    per_group = most if most < fewest * 1.5 else fewest
    return per_group, -(-n_linear // per_group)


@dataclass(frozen=True)
class VllmCurrentPreset(VllmPreset):
    """Today's vLLM: the derived block, refusing combinations the engine cannot run."""

    def engine_rules(self, spec, config) -> EngineRules:
        """vLLM's block pool on a hybrid model: a state costs one block per Mamba group (each
        layer's state page padded to the attention page: ``MambaSpec.page_size_padded``), a
        running request holds one running-state block per Mamba group and its partial last
        block outside the cache, recomputed KV is cached twice, and the memory is whole blocks
        of one group's pages (``EngineRules``). The padded
        page: ``MambaSpec.page_size_bytes`` returns ``page_size_padded``
        (``vllm/v1/kv_cache_interface.py`` L1156-L1162), the attention page of the block."""
        rules = super().engine_rules(spec, config)
        if not spec.is_hybrid or not spec.n_attn:
            return rules
        B = self.grid_for(spec, config)
        per_group, groups = mamba_groups(spec)
        page = B * spec.kv_bytes_per_token() // spec.n_attn  # one attention layer's page
        return replace(
            rules,
            state_bytes=max(groups * per_group * page, spec.state_bytes()),
            running_blocks=groups,
            capacity_unit=per_group * page,
            duplicate_kv=True,
            block_evict=True,
        )

    def check(self, spec, config) -> None:
        super().check(spec, config)
        if config.prefix_cache_retention_interval < DENSE:
            raise PolicyError(
                f"--prefix-cache-retention-interval must be >= 0 (or -1 for every state), not "
                f"{config.prefix_cache_retention_interval}"
            )
        if config.speculative_tokens and config.speculative_method == "none":
            raise PolicyError(
                f"--speculative-tokens {config.speculative_tokens} needs --speculative-method (eagle, eagle3 or mtp): "
                "vLLM's --speculative-config names the method with num_speculative_tokens"
            )
        if config.speculative_method != "none" and config.prefix_cache_retention_interval not in (0, DENSE):
            raise PolicyError(
                "--prefix-cache-retention-interval has no effect with --speculative-method "
                f"{config.speculative_method}: vLLM keeps every state under EAGLE / MTP (#55760)"
            )
        if not spec.is_hybrid and config.enable_mamba_shared_prefix_checkpoint:
            raise PolicyError(
                f"--enable-mamba-shared-prefix-checkpoint needs a hybrid model; {spec.name} has no "
                "linear-attention layers"
            )
        if config.enable_mamba_shared_prefix_checkpoint:
            raise PolicyError(
                "--enable-mamba-shared-prefix-checkpoint is not modelled: vLLM applies it only with EAGLE / MTP "
                "and a prefix match unit finer than the block (vllm/config/cache.py), and the simulator matches "
                "whole blocks; the shared-prefix junction (#37898) is always kept without it"
            )
        interval, block = config.prefix_cache_retention_interval, self.grid_for(spec, config)
        if interval > 0 and interval % block:
            raise PolicyError(
                f"--prefix-cache-retention-interval {interval} must be a multiple of the {block}-token block "
                "(vLLM refuses it: kv_cache_coordinator.py _validate_prefix_cache_retention_interval)"
            )


register_preset(
    VllmCurrentPreset(
        "vllm",
        "vLLM today: align mode on by default; --prefix-cache-retention-interval (0: semantic states only), "
        "shared-prefix junction kept (#37898), block derived from the model (--block-size), EAGLE/MTP one-block "
        "drop; stores input + output - 1 tokens",
        admission="vllm",
        eviction="vllm-free-queue",
        lookup_cap_minus_one=True,
        engine="vllm",
        version=VERSION,
        stores_last_token=False,
    )
)
