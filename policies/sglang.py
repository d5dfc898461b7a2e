"""SGLang's placement and eviction: V1 (``no_buffer``) and V2 (``extra_buffer``) states, two LRU lists.

The machinery every SGLang preset shares (``policies/sglang_current.py``: ``sglang``, today's
engine with its knobs; ``policies/sglang_0_5_9.py`` and ``policies/sglang_pathrefresh.py``: the
earlier behaviours).
Models sgl-project/sglang's ``python/sglang/srt/mem_cache/mamba_radix_cache.py`` (stored versions
00df707e8de4 / c1eb00f9a08b), ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``
(``managers/schedule_batch.py``) and the consumed-node refresh of PRs #31643 / #31648 (merged
2026-07; test ``test_mamba_lru_match_refreshes_only_used_node``).

- Grid: tokens (page 1). A lookup reuses at most ``input_len - 1`` tokens.
- V1 placement: ``cache_unfinished_req`` after every chunked-prefill chunk and after the prefill
  ("This updates radix so others can match": no_buffer copies the running state at the end of
  the filled ids), and ``cache_finished_req`` at the request end: states at every chunk end, at
  the prompt end and at input + output.
- V2 placement: one tracked state per extend step of >= 64 tokens (``mamba_cache_chunk_size`` =
  max(64, page)): the step end rounded down to 64 from the step start, replaced (not joined) by
  the lookup's branch point (``mamba_branching_seqlen``: the KV match rounded down to 64, when it
  is deeper than the deepest state) when that lies inside the step, 64-aligned from its start.
  Decode tracks the state at each multiple of ``--mamba-track-interval`` (256); the request end
  inserts up to the last decode track, or nothing. Each insert keeps KV only up to its tracked
  state (``key[:mamba_last_track_seqlen]``).
- Pools (``--state-pool``): a KV pool and a mamba pool. KV pressure (``evict_full``): least
  recent leaves (by KV recency) go with their KV and state, and tombstone leaves left behind go
  too. State pressure (``evict_mamba``): the least recent state (by state recency) goes; an inner
  node keeps its KV (tombstone), a leaf goes whole. One budget: the two lists merged by recency.
- ``two-list-unified`` (the ``sglang`` preset, SGLang 0.5.23's ``UnifiedRadixCache``, checked
  request by request by ``benchmarks/differential_sglang.py``): no node is merged or cascaded
  away, a request locks only its hit's state, an insert at a held state refreshes it, the lookup
  splits the node it ends inside, recency is ordered as operations happen.
- Refresh: a lookup moves the KV path (root .. the hit) to most recent and only the hit's state;
  an insert moves its path to most recent (KV) and a new or revived state; a split leaves its
  lower half most recent (``_insert_helper`` / ``_split_node``).

Reproduced by the presets (``tests/policies/test_sglang.py``): test_mamba_unittest.py
``test_mamba_radix_cache_1`` (pools: matches 0, 7, 7, 0) and
``test_mamba_lru_match_refreshes_only_used_node``; #21158 (an identical prompt reuses the
prompt-end state one token short of its end: hits 0, 10, 10). Not modelled: the mamba lock on a
single node (locks here cover the root path), per-request ping-pong slots, page > 1 for V1.
"""

from __future__ import annotations

import math

from policies.base import AdmissionPolicy, EngineRules, RefreshRule, Victim, admission, eviction
from policies.engine_common import ChunkedPrefill, LeafStateLists, chunk_ends, input_tokens

SGLANG_CAPTURE_CHUNK = 64  # V2: mamba_cache_chunk_size = max(FLA chunk 64, page)
SGLANG_TRACK_INTERVAL = 256  # V2: --mamba-track-interval (decode tracking)

#: SGLang after #31643 / #31648: a hit moves the KV path and only the used state; the insert walk
#: refreshes its path (KV); a split leaves its lower half most recent
SGLANG_REFRESH = RefreshRule(hit="to-hit", state="consumed", insert="every", split=True)
#: SGLang before #31643: ``reset_node_and_parents_mru`` on both lists
SGLANG_PATH_REFRESH = RefreshRule(hit="to-hit", state="with-kv", insert="every", split=True)
#: the engine rules of SGLang's no_buffer cache (sim.cache.engine_tree); extra_buffer adds
#: kv_extent="state"
SGLANG_RULES = EngineRules(refresh=SGLANG_REFRESH, cascade=True, state_pool=True)


def max_req_input_len(kv_pool_tokens: int) -> int:
    """The longest prompt SGLang takes, from its KV pool of ``kv_pool_tokens`` tokens: a prompt of
    this many tokens or more is aborted when it arrives. SGLang 0.5.23 ``TpModelWorker.get_worker_info``
    (``managers/tp_worker.py`` L568-L572): ``max_req_len = min(context_len - 1, kv_capacity - 1)``,
    ``max_req_input_len = max_req_len - 5``; ``Scheduler._handle_generate_request``
    (``managers/scheduler.py`` L3246-L3254) calls ``validate_input_length`` (``managers/utils.py``
    L259-L289), which truncates only with ``--allow-auto-truncate`` (default False,
    ``arg_groups/fields/serving.py`` L254-L257) and else returns an error, on which the request is
    finished with ``FINISH_ABORT`` (``Req.set_finish_with_abort``, ``managers/schedule_batch.py``
    L2221-L2238: its prompt replaced by one token "to skip the long prefill"). 0.5.9 the same
    (``tp_worker.py`` L287-L291, ``scheduler.py`` L1605-L1613). The model's context length is not
    modelled (the traces' prompts are far below it)."""
    return kv_pool_tokens - 1 - 5


class RefusesLongPrompts:
    """SGLang aborts a request whose prompt does not fit its input limit (``max_req_input_len``)."""

    def input_limit(self, kv_pool_tokens: int) -> int:
        """Prompts of at least this many tokens are aborted at arrival (:func:`max_req_input_len`)."""
        return max_req_input_len(kv_pool_tokens)


@admission("sglang-v1")
class SGLangV1Admission(RefusesLongPrompts, AdmissionPolicy):
    """``no_buffer``: the state at every chunked-prefill chunk end and at the prompt end
    (``cache_unfinished_req``), and at the request end (``cache_finished_req``)."""

    Params = ChunkedPrefill
    uses_prefill_steps = True

    def prefill_checkpoints(self, match, ctx):
        if ctx.prefill_steps is not None:
            return self.scheduled_ends(match, ctx) + [ctx.n_input]
        step = max(self.params.prefill_chunk_tokens // ctx.block_tokens, 1)
        return chunk_ends(match.hit_sym, ctx.n_input, step) + [ctx.n_input]

    def decode_checkpoints(self, match, ctx):
        return [ctx.n_full]


def v2_tracks(
    hit: int, n: int, budget: int, branch: int | None, chunk: int, ends: tuple[int, ...] | None = None
) -> list[int]:
    """Token positions SGLang V2 tracks in a prefill from ``hit`` through an ``n``-token prompt in
    steps of ``budget`` tokens (or ending at ``ends``, a scheduler's step ends): one per step of
    >= ``chunk`` tokens, the branch point replacing the step end when it falls inside the step on
    the chunk grid."""
    if ends is None:
        ends = range(hit + budget, n + budget, budget)
    tracks = []
    start = hit
    for end in ends:
        end = min(end, n)
        if end <= start:
            continue
        extend = end - start
        if extend >= chunk:
            track = start + extend // chunk * chunk
            if branch is not None and start < branch < end and (branch - start) % chunk == 0:
                track = branch
            tracks.append(track)
        start = end
        if start >= n:
            break
    return tracks


@admission("sglang-v2")
class SGLangV2Admission(RefusesLongPrompts, AdmissionPolicy):
    """``extra_buffer``: one tracked state per extend step (the branch point replaces the step end)
    and the last state tracked in decode on the 256-token grid."""

    Params = ChunkedPrefill
    uses_prefill_steps = True
    running_state_slots = 3  # the working slot + 2 ping-pong track buffers (PR #19002)

    def chunk(self, ctx) -> int:
        return max(SGLANG_CAPTURE_CHUNK, ctx.block_tokens)

    def prefill_checkpoints(self, match, ctx):
        G = ctx.block_tokens
        chunk = self.chunk(ctx)
        n = input_tokens(ctx)
        branch = None
        if match.match_sym > match.hit_sym:  # KV matched deeper than the deepest state
            aligned = min(match.match_sym * G, n - 1) // chunk * chunk
            branch = aligned if aligned > 0 else None
        tracks = v2_tracks(match.hit_sym * G, n, self.params.prefill_chunk_tokens, branch, chunk, ctx.prefill_steps)
        return [t // G for t in tracks if t % G == 0 and t > match.hit_sym * G]

    def decode_checkpoints(self, match, ctx):
        G = ctx.block_tokens
        grid = math.lcm(self.chunk(ctx), SGLANG_TRACK_INTERVAL)
        last = ctx.n_full * G // grid * grid
        return [last // G] if last > input_tokens(ctx) else []


@eviction("two-list")
class TwoListLRUEviction(LeafStateLists):
    """SGLang's two LRU lists. ``kv``: unlocked leaves by KV recency (a stateless leaf, a tombstone
    left behind, first); evicting one frees its KV and state. ``state``: unlocked state holders by
    state recency; an inner one loses only its state (a tombstone), a leaf goes whole. Ties go to
    the shallower node (in SGLang's lists a child is newer than its parent). With one budget the
    two lists are merged by recency."""

    def pop_kv_victim(self):
        node = self.take("kv")
        return None if node is None else Victim(node)

    def pop_state_victim(self):
        node = self.take("state")
        return None if node is None else Victim(node, drop_state_only=bool(node.children))

    def pop_victim(self):
        kv, st = self.top("kv"), self.top("state")
        if kv is None and st is None:
            return None
        if st is None or (kv is not None and kv[:2] <= st[:2]):
            return self.pop_kv_victim()
        return self.pop_state_victim()


@eviction("two-list-unified")
class UnifiedTwoListEviction(TwoListLRUEviction):
    """SGLang's ``UnifiedRadixCache`` (0.5.23): the same two lists, but a leaf that lost its state
    keeps its place in the KV list by its own recency. The full component's eviction heap holds
    every evictable device leaf keyed by ``last_access_time`` alone
    (``unified_cache/components/full.py`` ``_evict_device_start``, L209-L217), and deleting a leaf
    keeps a parent whose KV is still on the device as a leaf (``unified_tree_core.py``
    ``_iteratively_delete_tombstone_ancestors``, L2289-L2312: "Only the Full (base) component
    decides whether a node survives"). ``MambaRadixCache`` (0.5.9) deleted such tombstone leaves
    at once, which ``two-list`` models by putting them first."""

    #: the lookup's walk splits the node it ends inside and both halves become most recent
    #: (``unified_tree_core.py`` ``_match_prefix_helper`` L960 calls ``_split_node``, which gives
    #: the new upper node a fresh ``last_access_time`` and refreshes the lower one, L1467-L1524)
    touch_walk_end = True
    #: no node is merged away: a node whose state is gone keeps its own KV and recency and becomes
    #: a leaf when its children go (``unified_tree_core.py`` L2289-L2312; the tree never merges)
    keeps_structure = True
    #: an insert ending at a node that already holds a state moves that state to most recent
    #: (``unified_cache/components/mamba.py`` ``commit_insert_component_data`` L227-L252:
    #: ``reset_node_mru``)
    reinsert_refreshes_state = True
    #: recency comes from a counter, so requests at equal trace times are ordered as they are served
    strict_clock = True
    #: a state's candidacy depends on the locks that end at its node (``keys``), so the tree tells
    #: the policy of every lock that ends there, not only of the node becoming (un)locked
    keys_on_direct_lock = True

    def keys(self, node):
        out = {}
        if node.parent is None:
            return out
        if not node.children and not node.lock:
            out["kv"] = (node.last_access, node.depth_tokens)
        # a request locks the KV of its whole matched path but the state of its hit node only
        # (mamba.py ``acquire_component_lock`` L465, one node; the tree's inc_lock_ref takes
        # the mamba component on the best match node alone): a state above a locked hit stays
        # evictable, losing only its state (a tombstone)
        if node.has_state and node.lock == sum(c.lock for c in node.children.values()):
            out["state"] = (getattr(node, "state_access", node.last_access), node.depth_tokens)
        return out
