"""SGLang today: ``UnifiedRadixCache`` with a mamba component, and the engine's own knobs (``sglang``).

Follows sgl-project/sglang at the newest stored versions read for this preset:
``python/sglang/srt/mem_cache/unified_cache_components/mamba_component.py`` (commit 008c2fbbb588:
``refresh_lru`` refreshes only the consumed state at ``MATCH_END``; extra_buffer caches up to
``req.mamba_last_track_seqlen``; the branching length is the KV match rounded down to
``mamba_cache_chunk_size``; no_buffer asserts ``page_size == 1``; a split's upper half holds no
state), ``python/sglang/srt/server_args.py`` (``MAMBA_RADIX_CACHE_STRATEGY_CHOICES`` auto /
no_buffer / extra_buffer / extra_buffer_lazy, defaults ``mamba_full_memory_ratio`` 0.9,
``mamba_track_interval`` 256, ``max_mamba_cache_size`` None; ``auto`` resolves to extra_buffer,
PRs #30127 / #39430; the flag renamed from ``--mamba-scheduler-strategy`` in #27418) and
``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py`` (the memory split: with
``--max-mamba-cache-size`` unset, the mamba pool gets ``rest x ratio / (1 + ratio)`` of the memory
left after weights and holds ``floor(that / per-request state bytes)`` states; the KV pool gets
the rest). PRs #21206 / #30468 / #40313 moved hybrid models from ``MambaRadixCache`` to
``UnifiedRadixCache``; #31648 (merged 2026-07-18) is the consumed-state refresh there.

Knobs (named as the engine names them): ``--mamba-radix-cache-strategy``, ``--mamba-track-interval``,
``--page-size``, ``--mamba-full-memory-ratio`` with ``--gpu-memory`` (the memory the engine splits
between its KV and mamba pools, which then replaces ``--capacity``), ``--max-mamba-cache-size``
(states in the mamba pool), ``--prefill-chunk`` (``--chunked-prefill-size``).

- Grid: ``--page-size`` tokens. A lookup reuses at most ``input_len - 1`` tokens. A finished
  request stores input + output - 1 tokens (the last sampled token never ran through the model).
- no_buffer: a state at every chunked-prefill chunk end, at the prompt end and at the request end.
- extra_buffer / extra_buffer_lazy / auto: one tracked state per extend step of at least one
  ``mamba_cache_chunk_size`` (= max(64, page)), replaced by the lookup's branch point when that
  falls inside the step; decode tracks at multiples of ``--mamba-track-interval``; an insert keeps
  KV only up to its last tracked state. ``extra_buffer_lazy`` (#27118) allocates the ping-pong
  buffers lazily: the same placement, fewer slots per running request (not modelled: running
  requests' slots are not charged).
- Eviction (``two-list-unified``, checked against SGLang 0.5.23's own ``UnifiedRadixCache``,
  the wheel's ``mem_cache/unified_cache/``, by ``benchmarks/differential_sglang.py``): a KV list
  of leaves by their own recency and a mamba list; pools when ``--max-mamba-cache-size``,
  ``--gpu-memory`` or ``--state-pool`` say how many states. As 0.5.23 has it: no node is merged
  or cascaded away (a node that lost its state keeps its KV and becomes a leaf when its children
  go, ``unified_tree_core.py`` L2289-L2312); a request locks the KV of its path but only its hit's
  state (``components/mamba.py`` L465); an insert ending at a held state refreshes it (L227-L252);
  the lookup splits the node its walk ends inside and stamps both halves (``unified_tree_core.py``
  L960, L1467-L1524); recency is a counter, so requests at equal trace times are ordered as
  served (``components/base.py`` L161-L165); decode tracks land on ``mamba_track_grid`` =
  lcm(chunk, page, interval) (``runtime_context.py`` L1974-L1979), in the output, past a
  hash-block prompt's partial last block (``batch_result_processor.py`` L1620-L1634).
- Under ``--scheduler continuous`` (checked by ``differential_sglang.py --scheduler continuous``):
  a step's prefill and mixed decode tokens stay within ``--prefill-chunk`` and a cut chunk ends on
  the page (``schedule_chunk``, SGLang's ``PrefillAdder``), and every chunk that ends inside the
  prompt is published before the next step matches (``publishes_chunks``). A waiting request is
  admitted only with room for its whole uncached prompt, its output (``max_new_tokens`` = the
  output length, ``ignore_eos``, as SGLang's benchmark client sends them) and a page beside the
  running requests' remaining outputs, and no pass tries the queue after a refusal until a running
  request leaves (``reserves_output``); every 32nd pass that finds requests waiting refreshes the
  first 128 waiting prefixes, head last (``waiting_refresh``). With a mamba pool of its own the
  engine runs at most its states // 3 requests (extra_buffer // 5, lazy // 4:
  ``states_per_running_request``). A decode step that does not fit retracts the decoding request
  with the fewest output tokens, then the longest prompt, to the end of the waiting queue
  (``retracts_by_length``); matched again, it walks its prompt and the tokens it generated,
  capped at their count - 1, so its whole prompt may hit (``matches_generated``).
- Under every scheduler: a prompt of ``max_req_input_len`` tokens (the KV pool less 6) or more is
  aborted when it arrives (``input_limit``, ``policies.sglang.max_req_input_len``:
  ``validate_input_length``, ``--allow-auto-truncate`` off by default).

Refused (one line, exit 2): no_buffer with ``--page-size`` > 1 (the engine asserts it); a track
interval that is not a multiple of the page; ``--mamba-full-memory-ratio`` without
``--gpu-memory``; ``--state-pool`` together with the engine's own pool knobs.

The earlier behaviours are versioned presets: ``policies/sglang_0_5_9.py`` (``MambaRadixCache``
no_buffer / extra_buffer with the consumed refresh) and ``policies/sglang_pathrefresh.py``
(before #31643). Placement and eviction code: ``policies/sglang.py``. Reproduces
(``tests/policies/test_current_presets.py``): the consumed-state refresh of
``MambaComponent.refresh_lru`` (the same ``EngineRules`` on which ``tests/policies/test_sglang.py``
runs test_mamba_unittest.py's ``test_mamba_radix_cache_1`` and
``test_mamba_lru_match_refreshes_only_used_node``); the memory split of
``model_runner_kv_cache_mixin.py``; #21158 under the last-token rule; the extra_buffer track
positions with page size and track interval. Not reproduced: #38000's fork table (its 0 hits
come from the mamba pool's running-request slots, which are not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from policies.base import AdmissionPolicy, EngineRules, PolicyError, admission, knob, register_preset
from policies.engine_common import (
    ChunkedPrefill,
    EnginePreset,
    Speculation,
    StatePool,
    chunk_ends,
    full_tokens,
    input_tokens,
    stored_symbol,
    verify_slots,
)
from policies.sglang import SGLANG_CAPTURE_CHUNK, SGLANG_RULES, RefusesLongPrompts, v2_tracks

VERSION = "0.5.23"  # the newest release, read and driven by benchmarks/differential_sglang.py
STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
AUTO_STRATEGY = "extra_buffer"  # what auto resolves to for hybrid GDN / Mamba models (#30127, #39430)
DEFAULT_MEMORY_RATIO = 0.9
DEFAULT_TRACK_INTERVAL = 256
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION's default (schedule_policy.py L89-L91)
WAITING_PREFIX_REFRESH_INTERVAL = 32  # schedule_policy.py L139
WAITING_QUEUE_PREFIX_MATCH_MAX = 128  # schedule_policy.py L137


@dataclass(frozen=True)
class SglangParams(ChunkedPrefill, Speculation):
    """SGLang's own cache knobs, as its server flags name them."""

    mamba_radix_cache_strategy: str = knob(
        "auto", "sglang: --mamba-radix-cache-strategy (auto = extra_buffer for hybrid models).", choices=STRATEGIES
    )
    mamba_track_interval: int = knob(
        DEFAULT_TRACK_INTERVAL,
        "sglang: --mamba-track-interval, tokens between "
        "decode-time state tracks (extra_buffer; a multiple of --page-size).",
        min=1,
    )
    page_size: int = knob(
        1, "sglang: --page-size, tokens per KV page (the radix tree's grid; no_buffer needs 1).", min=1
    )
    mamba_full_memory_ratio: float = knob(
        DEFAULT_MEMORY_RATIO,
        "sglang: --mamba-full-memory-ratio, mamba pool : KV pool of --gpu-memory (the pool gets ratio / (1 + ratio)).",
        above=0.0,
    )
    gpu_memory: str = knob(
        "",
        "sglang: the memory the engine splits between its KV and mamba pools (after weights; "
        "a size: 40GB = 40e9 B, 40GiB = 40*2^30 B); replaces --capacity. Empty: --capacity, no split.",
    )
    max_mamba_cache_size: int = knob(
        0,
        "sglang: --max-mamba-cache-size, states in the mamba pool (0 = unset: the "
        "split of --gpu-memory, or one budget).",
        min=0,
    )


def resolved_strategy(params) -> str:
    """The strategy the engine runs (``auto`` resolves to extra_buffer)."""
    s = params.mamba_radix_cache_strategy
    return AUTO_STRATEGY if s == "auto" else s


def capture_chunk(page_size: int) -> int:
    """``mamba_cache_chunk_size``: the FLA chunk (64) or the page, whichever is larger."""
    return max(SGLANG_CAPTURE_CHUNK, page_size)


def mamba_pool_states(memory_bytes: int, ratio: float, state_bytes: int) -> int:
    """States in SGLang's mamba pool when ``--max-mamba-cache-size`` is unset: the pool gets
    ``memory x ratio / (1 + ratio)`` bytes, floored to whole states (no speculative decoding)."""
    return int(memory_bytes * ratio / (1 + ratio) // max(state_bytes, 1))


@admission("sglang")
class SglangAdmission(RefusesLongPrompts, AdmissionPolicy):
    """Today's SGLang: no_buffer places a state at every chunk end, the prompt end and the request
    end; extra_buffer (and auto, extra_buffer_lazy) one tracked state per extend step and decode
    tracks every ``--mamba-track-interval`` tokens."""

    Params = SglangParams
    uses_prefill_steps = True
    #: a chunk that ends inside the prompt is inserted at once (``Scheduler.stash_chunked_request``
    #: calls ``checkpoint_kv_cache`` before the next step's requests are matched, scheduler.py
    #: L3772-L3776 and L3919): a request scheduled while another is half-way through its prefill
    #: can hit the states and KV of its chunks so far
    publishes_chunks = True
    #: a waiting request holds nothing: each pass matches it again (``_get_new_batch_prefill_raw``,
    #: ``scheduler.py`` L4260, ``init_next_round_input``), ``PrefillAdder.add_one_req`` pins its
    #: hit only while it checks the budget (``_lock_node``, ``schedule_policy.py`` L1431 ->
    #: L1225-L1239, released on ``NO_TOKEN``) and locks it for the run only when it admits it
    #: (``_commit_prefill_admission``, L1690)
    rematches_waiting = True
    #: the client's ``max_new_tokens`` is the request's output length and ``ignore_eos`` is on, as
    #: SGLang's own benchmark client sends them (``benchmark/serving.py`` L700-L703): the
    #: ``PrefillAdder`` budget below then counts each running request's remaining output at ratio 1
    #: (``_get_running_request_total_token_offset``, ``schedule_policy.py`` L785-L794)
    reserves_output = True
    #: ``SchedulePolicy._touch_waiting_prefixes`` (``schedule_policy.py`` L280-L302): every
    #: ``WAITING_PREFIX_REFRESH_INTERVAL`` (32, L139) passes that find requests waiting, the prefixes
    #: of the first ``WAITING_QUEUE_PREFIX_MATCH_MAX`` (128, L137) are touched, head last; on by
    #: default (``SGLANG_ENABLE_WAITING_PREFIX_REFRESH``, ``environ.py`` L645) under the default
    #: fcfs policy and LRU eviction (the cache-aware policies match every waiting request instead)
    waiting_refresh = (WAITING_PREFIX_REFRESH_INTERVAL, WAITING_QUEUE_PREFIX_MATCH_MAX)

    @property
    def states_per_running_request(self) -> int:
        """SGLang caps its running requests at its mamba pool's states divided by this ratio
        (``KVCacheConfigurator.resolve_max_num_reqs``, ``mem_cache/kv_cache_configurator.py``
        L3134-L3151, ``max_mamba_cache_size // ratio``), so the pool does not run dry under the
        requests it runs (each holds its working slot, the state its prefill checkpoint forks and
        its locked hit: "the prefill->decode peak needs ~3 slots/req", L222-L229). The ratio
        (``_calculate_mamba_ratio``, L3062-L3088): ``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``
        3 plus the ping-pong tracking slots (``get_mamba_tracking_slots``,
        ``mem_cache/allocation_sizing.py`` L11-L19: extra_buffer 2 under the default overlap
        schedule, extra_buffer_lazy 1, no_buffer 0)."""
        strategy = resolved_strategy(self.params)
        return 3 + {"no_buffer": 0, "extra_buffer_lazy": 1}.get(strategy, 2)

    #: a retracted request is matched again with ``full_untruncated_fill_ids`` = its prompt and the
    #: tokens it generated (``Req.init_next_round_input``, ``managers/schedule_batch.py``
    #: L1692-L1723), capped at their count - 1 (``_compute_max_prefix_len``, L1766-L1768): its
    #: whole prompt may hit, where a fresh request recomputes the prompt's last token
    matches_generated = True
    #: when a decode step does not fit, SGLang retracts the decoding request with the fewest output
    #: tokens, then the longest prompt (``ScheduleBatch._get_decode_retraction_order``,
    #: ``managers/schedule_batch.py`` L3542-L3579), and appends it to the waiting queue
    #: (``Scheduler._add_request_to_queue``, ``managers/scheduler.py`` L3480-L3495; the default
    #: fcfs policy does not sort it, ``schedule_policy.py`` L231-L235)
    retracts_by_length = True

    def output_reserve(self, new_tokens: int) -> int:
        """KV tokens SGLang's ``PrefillAdder`` holds back for ``new_tokens`` output tokens still to
        decode: clipped at ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (4096, ``schedule_policy.py``
        L89-L91)."""
        return min(max(new_tokens, 0), CLIP_MAX_NEW_TOKENS)

    @property
    def page_reserve(self) -> int:
        """The page each request's admission also holds back (``per_req_token_overhead``,
        ``schedule_policy.py`` L733-L737, charged at L1412 and in ``PrefillBudget.reserve``)."""
        return self.params.page_size

    @property
    def running_state_slots(self) -> int:
        """no_buffer: the request's working slot; extra_buffer: plus two ping-pong track buffers;
        under speculative decoding K + 1 intermediate states more (``MambaPool``'s
        ``intermediate_ssm_state_cache``, one per draft token verified). Placement does not change:
        the verify step keeps every draft token's state, so a track position crossed inside it is
        taken exactly (``prepare_mamba_track_for_verify``)."""
        base = 1 if resolved_strategy(self.params) == "no_buffer" else 3
        return base + verify_slots(self.params.speculative_tokens)

    def schedule_chunk(self, start, end, budget, step_budget, ctx):
        """SGLang's ``PrefillAdder`` (0.5.23 ``managers/schedule_policy.py``): a step's prefill
        tokens and the decode tokens mixed into it stay within ``--chunked-prefill-size``
        (``rem_chunk_tokens`` starts at it less ``num_mixed_decode_tokens``, L654-L655, and each
        chunk is charged to it, L942-L943), and a truncated chunk ends on a page boundary
        (``end = (prefix_len + extend_len) // page_size * page_size``, L1665-L1670: the tree keeps
        states on pages only). The page is this preset's grid, ``ctx.block_tokens``; on a hash-block
        trace that is the trace's block, on which alone the tree can hold a state. A chunk that
        rounds to nothing waits for the next step (``extend_len <= 0``: ``AddReqResult.OTHER``,
        L1672-L1673), unless nothing else is in this step (a chunk budget under one page runs
        unaligned rather than stall)."""
        used = step_budget - budget  # decode tokens and chunks already in this step
        n = min(budget, end - start, self.params.prefill_chunk_tokens - used)
        if n <= 0:
            return 0
        G = ctx.block_tokens
        if G > 1 and start + n < end:
            whole = (start + n) // G * G - start
            if whole > 0:
                n = whole
            elif used > 0:
                return 0
        return n

    def prefill_checkpoints(self, match, ctx):
        p = self.params
        if resolved_strategy(p) == "no_buffer":
            if ctx.prefill_steps is not None:
                return self.scheduled_ends(match, ctx) + [ctx.n_input]
            step = max(p.prefill_chunk_tokens // ctx.block_tokens, 1)
            return chunk_ends(match.hit_sym, ctx.n_input, step) + [ctx.n_input]
        G = ctx.block_tokens
        chunk = capture_chunk(p.page_size)
        n = input_tokens(ctx)
        branch = None
        if match.match_sym > match.hit_sym:  # KV matched deeper than the deepest state
            aligned = min(match.match_sym * G, n - 1) // chunk * chunk
            branch = aligned if aligned > 0 else None
        tracks = v2_tracks(match.hit_sym * G, n, p.prefill_chunk_tokens, branch, chunk, ctx.prefill_steps)
        return [t // G for t in tracks if t % G == 0 and t > match.hit_sym * G]

    def decode_checkpoints(self, match, ctx):
        p = self.params
        if resolved_strategy(p) == "no_buffer":
            return [ctx.n_full]
        # mamba_track_grid (runtime_context.py L1974-L1979, SGLang 0.5.23): decode tracks land on
        # lcm(mamba_cache_chunk_size, page, --mamba-track-interval), so an interval finer than the
        # 64-token chunk tracks on the chunk grid
        grid = math.lcm(capture_chunk(p.page_size), p.page_size, p.mamba_track_interval)
        last = full_tokens(ctx) // grid * grid
        if last <= input_tokens(ctx):
            return []
        # the track is in the output (kv_committed_len past the prompt): on a hash-block trace whose
        # prompt ends inside a block, last // block would put it back inside the prompt (a 2,651-token
        # prompt tracked at 2,816 would hold a state at 2,560, where the engine has none)
        return [stored_symbol(ctx, last)]


@dataclass(frozen=True)
class SglangPreset(EnginePreset):
    """Today's SGLang: grid = page, pools from the engine's memory knobs."""

    def grid_for(self, spec, config) -> int:
        return config.page_size

    def check(self, spec, config) -> None:
        strategy = resolved_strategy(config)
        if strategy == "no_buffer" and config.page_size > 1:
            raise PolicyError(
                f"--mamba-radix-cache-strategy no_buffer needs --page-size 1, not {config.page_size} "
                "(SGLang's mamba component asserts it)"
            )
        if strategy == "no_buffer" and config.mamba_track_interval != DEFAULT_TRACK_INTERVAL:
            raise PolicyError("--mamba-track-interval is read by extra_buffer only; no_buffer tracks no decode states")
        drafts = verify_slots(config.speculative_tokens)
        if strategy != "no_buffer" and drafts and config.mamba_track_interval < drafts:
            raise PolicyError(
                f"--mamba-track-interval {config.mamba_track_interval} must be >= the {drafts} draft tokens a "
                f"verify step checks (--speculative-tokens {config.speculative_tokens} + 1): SGLang asserts it "
                "(arg_groups/mamba_hook.py validate_mamba_extra_buffer)"
            )
        if config.mamba_track_interval % config.page_size:
            raise PolicyError(
                f"--mamba-track-interval {config.mamba_track_interval} must be a multiple of "
                f"--page-size {config.page_size}"
            )
        own_pool = config.max_mamba_cache_size > 0 or bool(config.gpu_memory)
        if own_pool and config.state_pool:
            raise PolicyError(
                "--state-pool and SGLang's own pool knobs (--max-mamba-cache-size, --gpu-memory) "
                "both size the mamba pool: give one"
            )
        if config.mamba_full_memory_ratio != DEFAULT_MEMORY_RATIO and not config.gpu_memory:
            raise PolicyError("--mamba-full-memory-ratio splits --gpu-memory: give --gpu-memory too")
        if not 0 < config.mamba_full_memory_ratio < math.inf:
            raise PolicyError(
                f"--mamba-full-memory-ratio must be a finite number > 0, not {config.mamba_full_memory_ratio!r}"
            )

    def engine_rules(self, spec, config) -> EngineRules:
        # UnifiedRadixCache keeps a leaf whose state is gone while its KV is on the device: "Only
        # the Full (base) component decides whether a node survives" (unified_tree_core.py
        # _iteratively_delete_tombstone_ancestors, L2289-L2312, SGLang 0.5.23), so no cascade
        rules = replace(SGLANG_RULES, cascade=False)
        if resolved_strategy(config) != "no_buffer" and spec.is_hybrid:
            # a dense model has no mamba component: SGLang serves it from its plain radix cache,
            # whose KV is kept to the request's end whatever the strategy
            rules = replace(rules, kv_extent="state")
        if config.max_mamba_cache_size > 0:
            rules = replace(rules, state_capacity=config.max_mamba_cache_size)
        if config.gpu_memory:
            ratio = config.mamba_full_memory_ratio
            rules = replace(
                rules, memory=config.gpu_memory, split=lambda memory, state: mamba_pool_states(memory, ratio, state)
            )
        return rules


register_preset(
    SglangPreset(
        "sglang",
        "SGLang today (UnifiedRadixCache, mamba component): --mamba-radix-cache-strategy (auto = "
        "extra_buffer), track interval, page size, mamba pool from --max-mamba-cache-size or the "
        "--mamba-full-memory-ratio split of --gpu-memory; stores input + output - 1 tokens",
        admission="sglang",
        eviction="two-list-unified",
        lookup_cap_minus_one=True,
        rules=SGLANG_RULES,
        engine="sglang",
        version=VERSION,
        stores_last_token=False,
        extra_knobs=(StatePool,),
    )
)
