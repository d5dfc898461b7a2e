"""TensorRT-LLM today: ``MambaHybridCacheManagerV2`` with its snapshot placements (``trtllm``).

Follows NVIDIA/TensorRT-LLM's V2 hybrid cache manager (PR #16598, which added both the periodic
interval and the fixed offsets; ``MambaHybridCacheManagerV2``, first in
``tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py``, now
``tensorrt_llm/_torch/pyexecutor/kv_cache/mamba_cache_manager/{common,mamba_cache_manager_v2}.py``
at commit 28295084972c) and ``kv_cache_config.mamba_state_config`` (``MambaStateConfig`` in
``tensorrt_llm/llmapi/llm_args.py``, commit 000439672005):

- ``periodic_snapshot_interval`` (a non-negative int, 0 = off, the default).
- ``additional_snapshot_offsets_from_start`` (a list of strictly positive ints, default empty):
  snapshot points measured from each prompt's start; an offset beyond the prompt is ignored.
- ``additional_snapshot_offsets_from_end`` (a list of non-negative ints, default empty): points
  measured backward from each prompt's end, 0 = the prompt end; one that does not land inside the
  prompt (``prompt_len - offset <= 0``) is ignored.

The three are not alternatives: ``MambaHybridCacheManager.prepare_expect_snapshot_points``
(``common.py``) takes the union, per request, of ``range(N, prompt_len + 1, N)``, the start
offsets ``<= prompt_len`` and ``prompt_len - offset`` for the end offsets with a positive result,
sorted and deduplicated; the offsets only count on managers with
``_supports_additional_snapshot_offsets`` (the V2 manager; the factory refuses them without
``use_kv_cache_manager_v2=True``). The scheduler ends context chunks at those points (FORCE_CHUNK)
and ``try_commit_blocks`` commits KV + the recurrent state there and only there, up to the last
point, so a later request's hybrid reuse lands only on a snapshot point. No block alignment is
required: an unaligned point is committed as a partial block (``_mamba_snapshot_rule_counts``
counts the unaligned rules; every end offset is assumed unaligned). With no placement at all,
hybrid block reuse is off ("at least one snapshot policy", the factory), so every hit is 0.

Engine tests read (``tests/unittest/_torch/executor/test_mamba_cache_manager.py``, two stored
versions the search index gave no commit for, naming the manager ``V2MambaHybridCacheManager`` and
``MambaHybridCacheManagerV2``): ``test_v2_hybrid_prepare_expect_snapshot_points`` (interval 64,
start [128, 999], end [0, 22, 999]: prompts 150 / 128 / 32 -> [64, 128, 150] / [64, 106, 128] /
[10, 32]), ``..._without_periodic_snapshots`` (start [128], end [0, 13], prompt 150 -> [128, 137,
150]), ``test_v2_block_reuse_commit_saves_ssm_snapshot_at_snapshot_point`` (the unaligned point
137 of a 150-token prompt is committed, nothing past it), ``test_hybrid_cache_manager_factory_*``
(explicit offsets route to V2 and need it). Ported in ``tests/policies/test_current_presets.py``.

Knobs (TensorRT-LLM's names): ``--periodic-snapshot-interval``,
``--additional-snapshot-offsets-from-start`` and ``--additional-snapshot-offsets-from-end`` (token
offsets, comma-separated: ``1024,4096``; empty = none). Refused (one line, exit 2), as the
engine's fields (``StrictPositiveInt`` / ``StrictNonNegativeInt`` lists) refuse them: a start
offset < 1, an end offset < 0, an entry that is not a decimal integer; and an empty entry of the
comma list (``1024,,4096``). Duplicates are dropped, as the engine's set does.

- A state at every snapshot point above the hit, in the prompt only: ``try_commit_blocks``
  commits up to the last point and stops committing when the context ends, so decoding adds no
  state (the interval's multiples in the answer included). None at the prompt end unless a
  placement lands there (end offset 0, a start offset = the prompt length, a multiple of N).
- Eviction (``trtllm-pools``): the V2 storage manager keeps attention KV pages and recurrent pages
  in two pool groups, sized by ``kv_cache_config.avg_seq_len`` (``_typical_request_descs`` and
  ``StorageManager.ratio_from_batch``), each with an LRU queue of the committed pages no request
  holds. With ``--state-pool`` (the recurrent group's pages; ``--capacity`` minus them is the KV
  group) KV pressure evicts the least recent leaf with its state and state pressure the least
  recent state, alone on an inner node, with its leaf otherwise (``EngineRules.cascade``), a hit
  refreshing the KV path and only the state it resumed from, operations at equal trace times in
  the order they happen (``strict_clock``), the running request's pages beyond its last snapshot
  point charged in sequential mode (``running_blocks``), with the live recurrent page the running
  request holds (``running_states``: ``KvCache``'s private SSM page); a state on a running
  request's path stays a state victim (only its attention pages are held), and a snapshot that
  replaces one in its block takes its page before the old one is let go
  (``_snapshotSsmToTreeBlock`` then ``Block.replace_page``). Without ``--state-pool``: one budget,
  the LRU over leaves, tail first, as before (``benchmarks/differential_trtllm.py --capacity``
  measures it against the engine's own pools; docs/presets-engines.md).

Not modelled: ``enable_branch_snapshot`` (#18272, #18724: a snapshot where a request leaves the
reuse tree, and the prompt end when no placement applies), ``block_reuse_config.policy``
``per_conversation`` (which turns the periodic interval off), the V2 manager's pool sizing from
``avg_seq_len`` (a knob it has not: ``--state-pool`` gives the split), memory in whole 32-token
pages per block (the tree charges tokens; eviction one page at a time changes when memory is free,
not which entries go: docs/presets-engines.md), the pool rebalancing.
Decode-time periodic states (an earlier reading of the 1.3.0rc docs) are gone:
``benchmarks/differential_trtllm.py`` drives the engine's own radix tree and manager methods and
found none (docs/presets-engines.md, the TensorRT-LLM differential).
"""

from __future__ import annotations

from bisect import bisect_right

import re
from dataclasses import dataclass

from policies.base import (
    AdmissionPolicy,
    EngineRules,
    PolicyError,
    PolicyPreset,
    RefreshRule,
    Victim,
    admission,
    eviction,
    knob,
    register_preset,
)
from policies.engine_common import (
    LeafStateLists,
    Speculation,
    StatePool,
    TailFirstLRUEviction,
    full_tokens,
    input_tokens,
    verify_slots,
)

#: ``KvCacheConfig.tokens_per_block``'s default (32): the V2 radix tree's block (not a knob yet)
TOKENS_PER_BLOCK = 32
FROM_START_FLAG = "--additional-snapshot-offsets-from-start"
FROM_END_FLAG = "--additional-snapshot-offsets-from-end"
_INT = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class TrtllmParams(Speculation):
    """TensorRT-LLM's snapshot knobs (``kv_cache_config.mamba_state_config``)."""

    periodic_snapshot_interval: int = knob(
        0,
        "trtllm: mamba_state_config.periodic_snapshot_interval, tokens between recurrent-state snapshots (0 = no "
        "periodic snapshots; with no offsets either, hybrid block reuse is off).",
        min=0,
    )
    additional_snapshot_offsets_from_start: str = knob(
        "",
        "trtllm: mamba_state_config.additional_snapshot_offsets_from_start, comma-separated token offsets from "
        "each prompt's start where a snapshot is taken (each >= 1; one beyond the prompt is ignored; empty = none).",
    )
    additional_snapshot_offsets_from_end: str = knob(
        "",
        "trtllm: mamba_state_config.additional_snapshot_offsets_from_end, comma-separated token offsets back from "
        "each prompt's end where a snapshot is taken (each >= 0, 0 = the prompt end; one reaching the prompt's "
        "start or before is ignored; empty = none).",
    )


def snapshot_offsets(text: str, flag: str, least: int) -> tuple[int, ...]:
    """``'4096,1024'`` -> ``(1024, 4096)`` (sorted, duplicates dropped, as the engine's set);
    ``''`` -> ``()`` (the engine's default, an empty list). Each entry must be a decimal integer
    ``>= least`` (1 for the start offsets, 0 for the end ones: TensorRT-LLM's StrictPositiveInt /
    StrictNonNegativeInt); anything else is one ``PolicyError`` line naming ``flag``."""
    text = str(text).strip()
    if not text:
        return ()
    values = []
    for part in text.split(","):
        part = part.strip()
        if not _INT.fullmatch(part):
            raise PolicyError(f"{flag} takes comma-separated integer token offsets (e.g. 1024,4096), not {text!r}")
        value = int(part)
        if value < least:
            kind = "positive" if least == 1 else "non-negative"
            raise PolicyError(f"{flag} offsets must be {kind} (>= {least}), not {value}")
        values.append(value)
    return tuple(sorted(set(values)))


def multiples(lo: int, hi: int, step: int) -> list[int]:
    """Multiples of ``step`` in ``(lo, hi]`` (tokens)."""
    if step <= 0:
        return []
    return list(range((lo // step + 1) * step, hi + 1, step))


def snapshot_points(prompt: int, interval: int, from_start: tuple[int, ...], from_end: tuple[int, ...]) -> list[int]:
    """Where the V2 manager snapshots a ``prompt``-token prompt (tokens, ascending): the union of
    the interval's multiples up to the prompt end, the start offsets inside the prompt and the end
    offsets that land after its first token (``prepare_expect_snapshot_points``)."""
    points = set(multiples(0, prompt, interval))
    points.update(o for o in from_start if o <= prompt)
    points.update(prompt - o for o in from_end if prompt - o > 0)
    return sorted(points)


@admission("trtllm")
class TrtllmAdmission(AdmissionPolicy):
    """Snapshot points in the prompt (periodic and fixed offsets), periodic ones in decode."""

    Params = TrtllmParams
    #: the request is matched when the scheduler takes its first context chunk, not at its
    #: arrival: ``KVCacheManagerV2.prepare_context`` -> ``_prepare_context_impl``
    #: (``tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py``: ``if
    #: req.is_first_context_chunk:`` ... ``_create_kv_cache`` with the prompt less its last token),
    #: which the V2 scheduler calls for the context requests it schedules; a waiting request holds
    #: no page (``--scheduler fcfs``: looked up when a server takes it)
    matches_when_scheduled = True
    #: snapshots are committed while the context runs only (``try_commit_blocks``,
    #: ``mamba_cache_manager_v2.py`` at 28295084972c: it commits up to the last snapshot point and
    #: ends ``if request.context_remaining_length == 0: kv_cache.stop_committing()``), so the
    #: request's end puts back no prompt state evicted since its prefill (``--scheduler fcfs``)
    snapshots_in_context_only = True

    @property
    def running_state_slots(self) -> int:
        """The request's state slot, plus K + 1 intermediate states under speculative decoding
        (the verify step's per-draft-token states, from which the accepted one is promoted:
        ``_promote_mamba_state_triton``'s ``intermediate`` buffer). Snapshot placement does not
        change: snapshot points are prompt positions, committed by prefill chunks."""
        return 1 + verify_slots(self.params.speculative_tokens)

    def __init__(self, params=None) -> None:
        super().__init__(params)
        self.from_start = snapshot_offsets(self.params.additional_snapshot_offsets_from_start, FROM_START_FLAG, 1)
        self.from_end = snapshot_offsets(self.params.additional_snapshot_offsets_from_end, FROM_END_FLAG, 0)

    def prefill_checkpoints(self, match, ctx):
        G = ctx.block_tokens
        hit = match.hit_sym * G
        points = snapshot_points(
            input_tokens(ctx), self.params.periodic_snapshot_interval, self.from_start, self.from_end
        )
        n = input_tokens(ctx)
        out = [t // G for t in points if t > hit and t % G == 0]
        if n % G and points and points[-1] == n and n > hit and ctx.n_input == -(-n // G):
            # a hash-block prompt whose last block is partial: the snapshot at its end sits at
            # the end of that partial symbol (the engine commits the partial last block with its
            # SSM snapshot when the context ends, and the page counts in its recurrent pool)
            out.append(ctx.n_input)
        return out

    def schedule_chunk(self, start, end, budget, step_budget, ctx):
        """The scheduler ends a prefill chunk at the next snapshot point inside it, so the state
        there exists (``common.py`` ``prepare_expect_snapshot_points``: "the scheduler ends prefill
        chunks there"); placement does not depend on it, the step count does."""
        n = min(budget, end - start)
        points = snapshot_points(
            input_tokens(ctx), self.params.periodic_snapshot_interval, self.from_start, self.from_end
        )
        i = bisect_right(points, start)
        return points[i] - start if i < len(points) and points[i] < start + n else n

    def running_blocks(self, hit: int, ctx, kept: set[int], groups: int) -> int:
        """Grid units of KV a request alone holds at its peak that the cache does not keep
        (sequential mode, with the engine's pools): its capacity grows to input + output - 1 tokens
        (``_core/_kv_cache.py`` ``resize``: one page per ``tokens_per_block`` block), and only
        the whole blocks up to its last snapshot point (or its hit) are the tree's; the partial
        block there is its own page (the tree gets a copy, ``_snapshotPartialBlockToTree``)."""
        return self.own_blocks(hit, ctx, full_tokens(ctx))

    def own_blocks(self, hit: int, ctx, capacity: int) -> int:
        """Grid units of KV the request holds on pages of its own (not the tree's) while its
        capacity is ``capacity`` tokens: one page per ``tokens_per_block`` block of the capacity
        (``resize``), less the whole blocks up to its hit or the last snapshot point inside the
        capacity, which are the tree's (committed, or matched and held). At the lookup
        (``capacity`` = the hit) that is the private copy of a partially matched block
        (``_setupForReuse`` / ``resume``); once the context has run (the prompt), the partial block
        at the last snapshot point and the pages past it; at the end (input + output - 1) the decode's
        pages too (``running_blocks``)."""
        n = input_tokens(ctx)
        points = snapshot_points(n, self.params.periodic_snapshot_interval, self.from_start, self.from_end)
        cached = max([hit, *(p for p in points if p <= capacity)])
        pages = -(-capacity // TOKENS_PER_BLOCK) - cached // TOKENS_PER_BLOCK
        return max(0, -(-pages * TOKENS_PER_BLOCK // ctx.block_tokens))

    def decode_checkpoints(self, match, ctx):
        """None: the V2 manager commits only during the context phase. ``try_commit_blocks``
        (``mamba_cache_manager_v2.py``) commits up to ``min(max(expect_snapshot_points),
        prompt_len)`` and calls ``kv_cache.stop_committing()`` once ``context_remaining_length``
        is 0, so no state taken while decoding is ever reusable (found by
        ``benchmarks/differential_trtllm.py``: with the interval, every follow-up turn whose
        previous turn crossed a multiple in its answer hit one interval too deep)."""
        return []


class _PoolQueues(LeafStateLists):
    """The V2 storage manager's two eviction queues (``_eviction_controller.py``
    ``PerLevelEvictionController``: one ``PrioritizedLRUEvictionPolicy`` per pool group), over the
    token tree. ``kv``: unlocked leaves by KV recency, a leaf without a state first (nothing can hit
    it); ``state``: unlocked state holders by state recency. Ties follow the order pages enter the
    queues: a request releases its attention pages last block first (``_core/_kv_cache.py``
    ``_clear_blocks``: "drop the last block first"), so among equally recent leaves the deeper goes
    first; its snapshots enter the state queue as they are committed, shallower first, after the
    snapshot it resumed from (released by ``resume``), so among equally recent states the shallower
    goes first."""

    LEAF_TIE = -1

    def keys(self, node):
        out = super().keys(node)
        if "kv" in out and not node.has_state and getattr(self.tree, "pages_one_by_one", False):
            # the attention queue holds a stateless block where its release put it, as any other
            # (``_eviction_controller.py`` ``PrioritizedLRUEvictionPolicy``: release order only)
            out["kv"] = (node.last_access, self.LEAF_TIE * node.depth_tokens)
        # a running request holds the attention pages of its matched blocks, not their snapshots:
        # the one it resumes from goes back to the queue once ``resume`` copies it into the live
        # page, the others never leave it (``_core/_kv_cache.py`` ``_setup_for_reuse`` /
        # ``resume``), so a state on a locked path stays a state victim (it loses only its state)
        if node.lock and node.parent is not None and node.has_state:
            out["state"] = (getattr(node, "state_access", node.last_access), node.depth_tokens)
        # nor a tree's partial block: a locked leaf's last block, a copy, stays an attention victim
        if node.lock and getattr(self.tree, "partial_copy_free", None) and self.tree.partial_copy_free(node):
            out["kv"] = (node.last_access, self.LEAF_TIE * node.depth_tokens)
        return out

    def pop_victim(self):  # not used: TrtllmPoolEviction answers one budget as lru-tail-first
        node = self.take("kv")
        return None if node is None else Victim(node)


@eviction("trtllm-pools")
class TrtllmPoolEviction(TailFirstLRUEviction):
    """TensorRT-LLM's V2 eviction. With a state pool (``--state-pool``: the recurrent pool group,
    ``EngineRules.state_pool``) KV pressure and state pressure each take their own queue's victim
    (``pop_kv_victim`` / ``pop_state_victim``), as ``StorageManager._prepare_free_slots`` evicts
    only from the pool group short of slots:

    - a KV victim is a leaf, and goes with its state: the engine's dropped attention page removes
      its block's whole subtree (``_block_radix_tree.py`` ``clear_stale_blocks_after_page_unlink``
      -> ``remove_subtree``), snapshot pages included;
    - a state victim on an inner node loses only its state (its block stays: it has children); on
      a leaf it goes with the KV back to the last state or branch (``EngineRules.cascade``): the
      same function detaches the block, then each ancestor left a leaf without a recurrent page;
    - a snapshot whose page, taken first, evicts the leaf below the tree block it goes into loses
      that block with the leaf (the walk up), so it is freed with it: its KV stays, not its state
      (``EngineTree._apply``; ``Block.replace_page`` after the new page).

    With one budget (no ``--state-pool``) it is ``lru-tail-first`` unchanged."""

    def attach(self, tree):
        super().attach(tree)
        self.queues = _PoolQueues(self.cost, self.params)
        self.queues.attach(tree)
        # with the engine's pools, operations at equal trace times are ordered as they happen (the
        # queues are ordered by release, not by a clock)
        self.strict_clock = getattr(tree, "state_capacity", None) is not None

    def add(self, node):
        super().add(node)
        self.queues.add(node)

    def update(self, node):
        super().update(node)
        self.queues.update(node)

    def remove(self, node):
        super().remove(node)
        self.queues._alive -= 1

    def pop_kv_victim(self):
        node = self.queues.take("kv")
        return None if node is None else Victim(node)

    def pop_state_victim(self):
        node = self.queues.take("state")
        return None if node is None else Victim(node, drop_state_only=bool(node.children or node.lock))


#: with a state pool: a lookup refreshes the KV path to its hit and only the state it uses (the
#: request holds the matched blocks' attention pages until it closes, and the matched snapshot
#: only until ``resume`` copies it: ``_setup_for_reuse`` / ``_kv_cache.py``); a stateless leaf's
#: ancestors left stateless leaves go with it (``clear_stale_blocks_after_page_unlink``)
POOL_REFRESH = RefreshRule(hit="to-hit", state="consumed")


def pool_rules(block: int = TOKENS_PER_BLOCK) -> EngineRules:
    """The tree's rules with ``--state-pool`` (the engine's two pool groups), blocks and pages of
    ``block`` tokens (the engine's ``tokens_per_block``; tests use smaller ones)."""
    return EngineRules(
        kv_extent="state",
        snapshot_block=block,
        state_pool=True,
        cascade=True,
        refresh=POOL_REFRESH,
        running_blocks=1,
        # the live recurrent page: ``KvCache`` takes a private SSM page for the request's
        # running state when it resumes and frees it at ``close`` (never committed), so
        # while a request runs the pool holds one snapshot fewer (found by
        # benchmarks/differential_trtllm.py --capacity: the engine held 28 of 29)
        running_states=1,
        # the attention pool is whole 32-token pages, one per radix-tree block, and a
        # request's snapshots take their recurrent pages (a victim's blocks going with it)
        # before its decode pages are allocated (found by benchmarks/differential_trtllm.py
        # --capacity 2GB --additional-snapshot-offsets-from-end 0: 1,217 -> 1,221 of 1,235)
        kv_page=block,
        states_first=True,
    )


@dataclass(frozen=True)
class TrtllmPreset(PolicyPreset):
    """The V2 manager's radix tree: KV committed up to the last snapshot point only
    (``try_commit_blocks``' ``commit_limit``), one snapshot per ``tokens_per_block`` block (the first
    created block through its point takes it), a partial match of one child block (the longest
    leading match, the first created among equals), skipped under a block with 32 children or more
    (``sim.cache.engine_tree``)."""

    def engine_rules(self, spec, config) -> EngineRules:
        if getattr(config, "state_pool", ""):  # the engine's two pool groups (--state-pool)
            return pool_rules()
        return EngineRules(kv_extent="state", snapshot_block=TOKENS_PER_BLOCK)


register_preset(
    TrtllmPreset(
        "trtllm",
        "TensorRT-LLM today (MambaHybridCacheManagerV2, #16598): a snapshot every "
        "--periodic-snapshot-interval tokens and at --additional-snapshot-offsets-from-start / -from-end of each "
        "prompt (none of them, the default: hybrid reuse off); stores input + output - 1 tokens",
        admission="trtllm",
        eviction="trtllm-pools",
        lookup_cap_minus_one=True,
        engine="trtllm",
        version="1.3.0rc",
        stores_last_token=False,
        extra_knobs=(StatePool,),
    )
)
