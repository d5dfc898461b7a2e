"""The serving engines' cache: the hybrid radix tree plus what SGLang and LMDeploy do differently.

The paper's policies run on the core ``HybridRadixTree``. An engine preset asks for this variant
through ``PolicyPreset.engine_rules`` (a ``policies.base.EngineRules``); each rule reproduces one
engine behaviour, named after the engine code it follows:

- ``state_capacity`` (``EngineRules.state_pool``): the engine keeps states in their own pool.
  SGLang: a KV pool and a mamba pool (``--max-mamba-cache-size``, or the split of
  ``--mamba-full-memory-ratio``); LMDeploy: trie KV blocks and a checkpoint-slot budget
  (``prefix_cache_state_budget``). KV pressure asks the policy for ``pop_kv_victim``, state
  pressure for ``pop_state_victim``. ``capacity_bytes`` stays the total; the KV pool is the total
  minus ``state_capacity`` states. None: one shared budget (the policy's ``pop_victim``).
- ``refresh`` (a ``RefreshRule``): ``hit="to-hit", state="consumed"`` moves the KV path (root ..
  the hit) to most recent and only the hit's state (SGLang after #31643 / #31648, test
  ``test_mamba_lru_match_refreshes_only_used_node``; LMDeploy's checkpoint ``last_access_time``);
  ``state="with-kv"`` moves both along the path (SGLang's ``reset_node_and_parents_mru`` on both
  lists). ``insert="every"``: each insert refreshes the inserted path (``_insert_helper`` walks it
  root to leaf). Each node carries two recencies: ``last_access`` (KV list) and ``state_access``
  (state list). ``split``: an insert that splits an edge leaves the lower half most recent
  (``_insert_helper`` refreshes the node it walks into, then ``_split_node`` re-inserts it).
- ``cascade``: a leaf's eviction also removes ancestors left as stateless leaves (SGLang's
  ``_iteratively_delete_tombstone_leaf``).
- ``kv_extent``: how much of an inserted sequence's KV the engine keeps. ``"all"``; ``"state"``:
  only up to its last state (SGLang extra_buffer: ``cache_unfinished_req`` / ``cache_finished_req``
  insert ``key[:mamba_last_track_seqlen]``); ``"blocks"``: whole ``extent_block``-token blocks, and
  up to its last state (vLLM caches full blocks; LMDeploy's trie holds full blocks, a partial
  checkpoint keeps its own copy of the partial block).
- ``frozen_block`` (LMDeploy): a state not on a block boundary owns a frozen copy of its partial
  block, charged as KV up to the block's end (test
  ``test_ssm_checkpoint_save_owns_and_releases_partial_tail``: one block and one state slot).
  The charge follows the state's exact token (``_state_depths``: a hash-block prompt's last
  symbol is partial), in the insert's room planning as in its accounting; dropping it trims the
  stateless tail back to the last block boundary, rounded down to a whole symbol.
  ``frozen_whole`` (LMDeploy's ``_create_checkpoint`` allocates the frozen block,
  ``checkpoint_lifecycle.py`` L404-L406, and ``_extend_trie_path`` still gives the trie its own
  block once the sequence fills it, ``trie.py`` L557-L590): a state whose node has children
  charges a whole block, the path past it holding the trie's copy (``EngineNode.frozen``, kept by
  ``_recount``); a leaf's state, the pad only.
  ``admit_from_anchor`` (LMDeploy's SSM admission, ``_evict_for_ssm``,
  ``eviction_helper/recompute_eviction_helper.py`` L60-L118, frees ``num_required_blocks``,
  ``block_manager/default_block_manager.py`` L26-L34: every block of the prompt past the ones the
  sequence restored, those the trie already holds included, which ``_extend_trie_path`` then
  deduplicates): the driver says ``(hit, prompt tokens, tokens the request runs to)``
  (``admitting``) before a request's sequential insert, and that insert evicts what the
  engine's admission, its save and its decode evict in turn (``_admission``: the trie gives back
  the prompt's blocks it holds already, the save's frozen block is taken only from free blocks,
  ``_saveable``, the decode evicts for the sequence's own blocks, its partial last one included);
  what it charges is what it adds. The admission's own evictions come first, one prefill chunk at
  a time (``_admit``), with only the restored blocks and the earlier chunks' guarded: the cached
  path past the hit is a victim like any leaf block the trie alone holds (``kv_lifecycle.py``
  L118-L123), and a block of it that goes is added again by the insert.
- ``anchor_block`` (LMDeploy ``_reserve_checkpoint``): one state per full-block anchor
  (``checkpoint_anchor_step``); a new state replaces the one anchored on the same block (test
  ``test_ssm_checkpoint_replaces_partial_variant_at_same_anchor``).
- ``future``: an offline next-use index (``sim.cache.future``) the ``belady`` bound reads; lookups
  tell it which request arrived.
- ``snapshot_block`` (TensorRT-LLM's V2 radix tree, ``tokens_per_block`` B): a recurrent snapshot
  at token p lives in the tree block ending at or after p (``(p - 1) // B``), and a block keeps one
  page per life cycle, the deepest (``Block.can_replace_page``: "keeps only the latest
  checkpoint"). A state goes into the first created block through its point (the engine's
  ``UselessBlockError`` names the first covering sibling; a block replacing a covered partial one
  adopts its page): it gives up that block's shallower page and is not kept when the block's page
  is deeper (``_take_block_snapshots``, ``_oldest_through``).
  A lookup walks whole blocks by key and matches at most one partial block more, one child of
  the last whole block: the one with the longest leading match, the first created among equals,
  none while there are 32 or more (``find_best_partial_match_in_next_nodes``, TRTLLM-7784); a
  state inside a block the request does not match whole is reached only as that child's page
  (``_reachable_hit``). The token tree tells the blocks apart by when their ends were first
  cached (``EngineNode.born``, kept through splits, merges and leaf extensions).
- ``running_blocks`` (vLLM): a running request's own blocks come from the cache's memory; the
  simulation charges them in sequential mode (``Simulation.hold_running``).
- ``duplicate_kv`` (vLLM's ``BlockHashToBlockMap``, ``block_pool.py`` L78-L82: a key may map to
  several blocks): the KV a request recomputes though it is cached (from its hit to its match) is
  cached again; the older copy stays where the eviction order had it and holds one block until
  the order reaches it (``cache_again``; the policy's ``next_key`` interleaves these copies with
  its own victims, a copy first at equal recency).
- ``block_evict`` (vLLM's ``BlockPool.get_new_blocks``: one cached block evicted per block
  handed out, a request's blocks freed tail first): a leaf's KV victim loses its last
  ``extent_block``-token block, and the state at that end, not the whole leaf
  (``_evict_last_block``); the shortened leaf keeps its recency. Off: a leaf goes whole.
  LMDeploy too (``KVBlockLifecycle.evict``, ``block_trie/kv_lifecycle.py`` L131-L139: one trie
  leaf block a turn, its parent a candidate once childless; the checkpoint anchored on the
  evicted block released with it, L89): a state at the leaf's end is anchored on its last block.
- ``kv_page`` with a state pool (TensorRT-LLM's two pool groups, ``pages_one_by_one``): KV is
  whole pages (``_page_pad``), a KV victim is one page, a leaf's last block (and the state in it);
  the cached path past a request's hit is not protected while its insert makes room; the room is
  made snapshot point by snapshot point, the pages up to a point before the state there
  (``_stage_needs``); a hit inside a block moves that block's page to the queue's back
  (``_touch_hit_block``); a state inside a block is that block's page, reached by a lookup that
  matches the block whole only where the request's block holds it (``_whole_block_hit``) and gone
  when the block's page goes (``_pages_in_leaf_block``).
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import replace

import numpy as np

from policies.base import EngineRules, PolicyError, RefreshRule
from sim.cache.tree import HybridRadixTree, InsertResult, MatchResult, Node, Span, _edge_match
from sim.config import format_size, parse_size
from sim.errors import UsageError

NO_RULES = EngineRules()  # the core tree's behaviour


#: what ``_pop_copy_or_victim`` answers for an older KV copy it dropped
COPY_DROPPED = object()


class EngineNode(Node):
    # ``born`` (``snapshot_block`` only): when each stretch of the edge was first cached, as
    # ``((from_tokens, stamp), ...)``: the points deeper than ``from_tokens`` up to the next mark
    # were first reached at ``stamp`` (``EngineTree._born_at``)
    # ``pad`` (``kv_page`` only): this node's share of ``EngineTree._pad`` (``_node_pad``)
    # ``head`` (``pages_one_by_one`` only): ``(block end, time)`` of a hit that moved this node's first
    # block to the queue's back while the node goes on past it (``_touch_hit_block``)
    # ``frozen`` (``frozen_whole`` only): the frozen-block tokens this node's state is charged
    __slots__ = ("state_access", "born", "pad", "head", "frozen")


class EngineTree(HybridRadixTree):
    def __init__(
        self, rules: EngineRules = NO_RULES, *, state_capacity: int | None = None, future=None, **settings
    ) -> None:
        self.rules = rules
        self.state_capacity = state_capacity
        self.cascade = rules.cascade
        self.kv_extent = rules.kv_extent
        self.extent_block = rules.extent_block
        self.frozen_block = rules.frozen_block
        self.frozen_whole = rules.frozen_whole and rules.frozen_block > 0
        self.admit_from_anchor = rules.admit_from_anchor and rules.frozen_block > 0
        # ``admit_from_anchor``: (hit, prompt tokens[, tokens the request runs to])
        self.admitting: tuple[int, ...] | None = None
        self.anchor_block = rules.anchor_block
        self.snapshot_block = rules.snapshot_block
        self._born = 0  # the clock of ``EngineNode.born`` (``snapshot_block`` only)
        self.wants_future = rules.future and future is None  # the driver (sim.engine.drivers.run) attaches it
        self.future = future
        self.frozen_tokens = 0  # KV charged for frozen partial blocks (LMDeploy)
        self.running_blocks = rules.running_blocks
        self.running_states = rules.running_states
        self.duplicate_kv = rules.duplicate_kv
        self.block_evict = rules.block_evict and rules.extent_block > 0
        self.kv_page = rules.kv_page  # KV held in whole pages of this many tokens (TensorRT-LLM)
        self.block_copies = rules.block_copies  # KV in whole blocks, one copy per path (LMDeploy)
        self.states_first = rules.states_first
        # TensorRT-LLM's attention pool (``kv_page`` and snapshot blocks with a state pool): KV
        # victims go one page at a time, a leaf's last block first, and the rules of the module
        # docstring's ``kv_page`` item
        self.pages_one_by_one = bool(rules.kv_page and rules.snapshot_block and state_capacity is not None)
        self._pad = 0  # ``kv_page``: the nodes' ``pad`` summed, kept by ``_recount`` (``_page_pad`` walks it)
        self.copies: list = []  # older copies of recomputed KV blocks: (recency, 1, -end, order, tokens, first)
        self.copy_tokens = 0  # KV tokens those copies hold
        self._recomputed: dict[int, list] = {}  # id(match) -> [(node, block ends, recency)] (duplicate_kv)
        self._node_copies: dict[Node, list] = {}  # node -> its older copies' entries
        self._gone: set[int] = set()  # orders of copy entries popped or replaced
        self.states_replaced = 0  # states given up to a later one on the same anchor
        self._pending = (0, 0)  # (KV bytes, states) the insert being planned needs
        self._planning = None  # (seq, span, checkpoints) of that insert, while it makes room
        self._admitted: int | None = None  # ``admit_from_anchor``: the blocks that insert's sequence holds
        self._held_to = 0  # ``pages_one_by_one``: the tokens that insert's request holds (its hit)
        self._detached: set[Node] = set()  # ``pages_one_by_one``: running leaves a state victim detached
        self._state_drain = False  # a state pool's victims are being taken (``_detach_stale_blocks``)
        self._lost: set[int] = set()  # ``pages_one_by_one``: snapshot points the insert being made loses
        self.snapshots_lost = 0  # snapshots whose block went making room for their own page
        super().__init__(**settings)
        if state_capacity is not None:
            self.kv_capacity_bytes = self.capacity_bytes - state_capacity * self.state_bytes
            if state_capacity < 1 or self.kv_capacity_bytes <= 0:
                raise UsageError(
                    f"a state pool of {state_capacity} states leaves no room for KV in "
                    f"{format_size(self.capacity_bytes)}"
                )

    @property
    def refresh(self) -> RefreshRule:
        return self.rules.refresh or self.policy.refresh

    # ------------------------------------------------------------------ nodes and bytes
    def _new_node(self, key, parent, n_tokens, depth_sym, depth_tokens, now) -> Node:
        self._created += 1
        node = EngineNode(key, parent, n_tokens, depth_sym, depth_tokens, now, self._created)
        node.state_access = now
        node.pad = 0
        node.frozen = 0
        node.head = None
        if self.snapshot_block:
            self._born += 1
            node.born = ((depth_tokens - n_tokens, self._born),)
        return node

    def _frozen_charge(self, depth_tokens: int, goes_on: bool = False) -> int:
        """KV tokens a state at ``depth_tokens`` charges for its frozen partial block; ``goes_on``
        (``frozen_whole``): the path goes on past it, so the block is a whole one beside the trie's."""
        B = self.frozen_block
        if not B or depth_tokens % B == 0:
            return 0
        return B if goes_on and self.frozen_whole else B - depth_tokens % B

    def _node_frozen(self, node: Node) -> int:
        """``frozen_whole``: what ``node``'s state is charged now (0: no state, or not in the tree)."""
        if node.parent is None or not node.has_state:
            return 0
        return self._frozen_charge(node.depth_tokens, bool(node.children))

    @property
    def kv_bytes(self) -> int:
        return (self.kv_tokens + self.frozen_tokens + self.copy_tokens + self._pad) * self.kv_bytes_per_token

    def _recount(self, node: Node) -> None:
        """Also ``node``'s share of ``_pad`` (``kv_page``): it follows its parent's depth, its own
        and whether it has children, and every change of those reaches ``_recount`` (a node
        added, split, extended, shortened, merged into its only child, detached, or a child of it
        added or removed: ``_changed``), as the evictable totals do."""
        super()._recount(node)
        if self.frozen_whole:
            charge = self._node_frozen(node)
            if charge != node.frozen:
                self.frozen_tokens += charge - node.frozen
                node.frozen = charge
        if self.kv_page or self.block_copies:
            pad = self._node_pad(node) if node.parent is not None else 0
            if pad != node.pad:
                self._pad += pad - node.pad
                node.pad = pad

    def _node_pad(self, n: Node) -> int:
        """The tokens ``n``'s whole pages hold beyond its edge's tokens (``_page_pad``). With
        ``block_copies`` (LMDeploy's block trie) a node holds the whole blocks whose last token it
        holds, and a leaf its partial last block's tokens (the trie keys full blocks only,
        ``_extend_trie_path``; the frozen block of a checkpoint there is charged apart): a node
        ending inside a block with children holds none of that block, each child a whole copy
        (negative: tokens its children's copies hold)."""
        s, e = n.parent.depth_tokens, n.depth_tokens
        if not self.kv_page:
            P = self.block_copies
            return (e // P - s // P) * P + (0 if n.children else e % P) - (e - s)
        P = self.kv_page
        pages = e // P - s // P + (1 if e % P and not n.children else 0)
        return pages * P - (e - s)

    def _page_pad(self) -> int:
        """``kv_page``: the tokens the engine's whole pages hold beyond the tree's tokens, by a walk
        (``check_invariants`` compares it with ``_pad``). A block is one page, owned by the node
        that holds its last token (a branch inside a block gives each child its own copy of that
        block, the parent none), and a leaf ending inside a block holds that partial block on a
        page of its own (TensorRT-LLM: one attention page per radix block, a committed prompt end a
        partial block's copy, ``_snapshotPartialBlockToTree``), so a path ending at ``e`` holds
        ``ceil(e / page)`` pages."""
        return sum(self._node_pad(n) for n in self.iter_nodes() if n is not self.root)

    @property
    def used_bytes(self) -> int:
        return self.kv_bytes + self.n_states * self.state_bytes

    def _fits(self, need: float) -> bool:
        if self.state_capacity is None:
            return self.used_bytes + need <= self.capacity_bytes
        need_kv, need_states = self._pending
        return self.kv_bytes + need_kv <= self.kv_capacity_bytes and self.n_states + need_states <= self.state_capacity

    def _fits_freed(self, kv_free: int, states_free: int, kv_bytes: int, states: int) -> bool:
        # older KV copies are free too (a copy leaves nothing in the tree); a frozen block's charge
        # is counted as staying (an underestimate of what eviction frees)
        kv_freed = (kv_free + self.copy_tokens) * self.kv_bytes_per_token
        if self.state_capacity is None:
            freed = kv_freed + states_free * self.state_bytes
            return self.used_bytes - freed + kv_bytes + states * self.state_bytes <= self.capacity_bytes
        return (
            self.kv_bytes - kv_freed + kv_bytes <= self.kv_capacity_bytes
            and self.n_states - states_free + states <= self.state_capacity
        )

    def _room_needed(self, seq, span, checkpoints, need_bytes):
        kv_bytes, new_cps, walk_end = self._kv_need(seq, span, checkpoints)
        self._planning = (seq, span, checkpoints)
        self._lost = set()
        if self.pages_one_by_one:
            # TensorRT-LLM: a request holds the pages of its match pruned to its hit, nothing of the
            # cached path past it (``_prune_match``), so the insert's path past the hit (``protect``)
            # may be evicted while the room is made; the KV it needs is counted again after each
            # victim (``_evict_for``), and it needs room for its peak, at a snapshot point
            walk_end = None
            kv_bytes = max([kv_bytes, *(need for _, need in self._stage_needs(seq, span, checkpoints, new_cps))])
        if self.admitting is not None:  # ``admit_from_anchor``: LMDeploy's admission, save, decode
            B = self.frozen_block
            prompt = self.admitting[1]
            free, blocks, cached, decode = self._admission(seq, span)
            saved = sum(1 for c in checkpoints if span.tokens(c) == prompt and prompt % B)
            # admission evicts what the prompt's blocks from the restored one on lack (cached ones
            # counted), the trie then gives back those it holds already, the save takes a free
            # block without evicting, the decode evicts for its own blocks: the blocks evicted
            evict = max(0, blocks - free) + max(0, decode + saved - (max(free, blocks) - blocks + cached))
            if evict:
                kv_bytes = max(kv_bytes, (free + evict) * B * self.kv_bytes_per_token)
        self._pending = (kv_bytes, len(new_cps))
        return kv_bytes + len(new_cps) * self.state_bytes, walk_end

    def _planned_bytes(self, seq, span, checkpoints) -> float:
        kv_bytes, new_cps, _ = self._kv_need(seq, span, checkpoints)
        return kv_bytes + len(new_cps) * self.state_bytes

    def _stage_needs(self, seq, span, checkpoints, new_cps) -> list[tuple[int, int]]:
        """``pages_one_by_one``: the KV bytes the insert holds at each new snapshot point ``c``,
        as ``(c, bytes)``. TensorRT-LLM runs the prefill in chunks ending at the snapshot points:
        a chunk's pages are taken before its forward (``prepare_resources``' ``resize``), its
        blocks and its snapshot committed after it (``update_context_resources`` ->
        ``try_commit_blocks``, ``mamba_cache_manager_v2.py``), so at ``c`` the request holds the
        path to ``c`` (the tree's blocks, the partial one's copy), its own partial block there,
        and the copy at the previous point when both sit in one block (the longer partial block
        adopts it and lets it go only once its own copy is taken: ``Block.__init__``,
        ``replace_page``, ``_block_radix_tree.py`` L428-L441, L476-L488). A partial block the tree
        holds at the end of the cached path, a leaf's (a prompt end's copy), is a page the request's
        whole block replaces when it is committed (``Block.__init__`` adopts the shorter sibling's
        pages, then ``_commitBlock`` installs the request's page over its attention page, which
        goes: ``can_replace_page`` / ``replace_page`` L462-L487): at a point past that block, off
        the page grid, the copy there is taken after it went, so the point holds one page fewer
        than the path counts (the path counts that block as new, the tree the partial page). The
        request's own pages run from its hit's block (``_held_to``), not from the end of the path the
        tree caches past it: ``resize`` takes a page for each block of the chunk before the commit
        finds a block the tree holds and lets the request's page go (``_commitBlock``'s rebase), so
        the cached path past the hit is counted again (the victims may be that path itself)."""
        P, out, last = self.kv_page, [], None
        need_tok, _, end = self._plan_new(seq, span, checkpoints)
        d = span.total - need_tok  # the cached path's end (tokens)
        partial = d % P and end is not self.root and not end.children and end.depth_tokens == d
        h = min(self._held_to, d) // P
        for c in new_cps:
            t = span.tokens(c)
            own = -(-t // P) - h  # the request's pages, the partial block at ``t`` among them
            copy = 1 if t % P and d < t else 0  # the tree's copy of that partial block
            held = 1 if last is not None and last % P and last // P == t // P else 0
            gone = 1 if partial and t % P and t // P > d // P else 0
            # the commit lets go the request's pages of the blocks the tree holds whole (rebased)
            # and the partial leaf it replaces, then takes the copy: the peak is the larger
            freed = max(0, min(d, t) // P - h) + gone
            peak = max(own, own - freed + copy + held)
            out.append((c, peak * P * self.kv_bytes_per_token))
            last = t
        return out

    def _kv_need(self, seq, span, checkpoints) -> tuple[int, list[int], Node]:
        """(KV bytes the insert adds, its new states, the node its walk ends in)."""
        need_kv, new_cps, walk_end = self._plan_new(seq, span, checkpoints)
        new = need_kv  # tokens past the cached path
        if self.frozen_block and new_cps:  # each new state off the block grid adds its frozen block
            depths = self._state_depths(seq, span, new_cps)
            if self.frozen_whole:  # a whole block for a state the path goes on past
                need_kv += sum(self._frozen_charge(t, self._goes_on(t, span, walk_end, new)) for t in depths)
            else:
                need_kv += sum(self._frozen_charge(t) for t in depths)
        if (
            self.frozen_whole and new and walk_end.has_state and not walk_end.children
        ):  # the insert may go on past a leaf's state (its pad becomes a whole block): counted
            # even where it branches off inside that leaf's edge (a hash-block symbol's two lengths
            # make the two hard to tell apart here), an overestimate of one block at most
            need_kv += self._frozen_charge(walk_end.depth_tokens, True) - self._frozen_charge(walk_end.depth_tokens)
        if self.kv_page and need_kv:  # the blocks from the one the insert starts in to its end
            P, e = self.kv_page, span.total
            need_kv = P * (-(-e // P) - (e - need_kv) // P)
        elif self.block_copies and new:  # a path leaving the tree inside a block copies its top
            d = span.total - new
            if d % self.block_copies and (walk_end.children or walk_end.depth_tokens > d):
                need_kv += d % self.block_copies
        return need_kv * self.kv_bytes_per_token, new_cps, walk_end

    @staticmethod
    def _goes_on(t: int, span: Span, walk_end: Node, new: int) -> bool:
        """Whether the path goes on past a new state at token ``t`` once the insert is done: the
        insert itself goes on, or (``new`` 0: nothing past the cached path) it ends inside the
        cached path, at a node with children or inside an edge, which it splits."""
        if t < span.total:
            return True
        return not new and (bool(walk_end.children) or walk_end.depth_tokens > t)

    def _state_depths(self, seq: np.ndarray, span: Span, checkpoints: list[int]) -> list[int]:
        """The token position (``depth_tokens``) each of ``checkpoints`` (symbols, sorted) would
        have once inserted, as ``_apply`` places it: inside the cached path, the tree's own depths
        (an edge cut at a symbol keeps the symbols above the cut, as ``span`` counts them); beyond
        it, the symbols as ``span`` counts them. Not ``c * block_tokens``: on a hash-block trace the
        prompt's last block is partial, and a frozen block's charge, a state's anchor depend on
        the exact token."""
        n = len(seq)
        out: list[int] = []
        ci = 0
        node, pos = self.root, 0
        end_tokens = 0
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                break
            m = _edge_match(child.key, seq, pos)
            base = node.depth_tokens
            full = m == len(child.key)
            while ci < len(checkpoints) and checkpoints[ci] <= pos + m:
                c = checkpoints[ci]
                out.append(child.depth_tokens if full and c == pos + m else base + span.tokens(c) - span.tokens(pos))
                ci += 1
            if not full:
                end_tokens = base + span.tokens(pos + m) - span.tokens(pos)  # the cut the insert makes there
                pos += m
                break
            node, pos = child, pos + m
            end_tokens = node.depth_tokens
        for c in checkpoints[ci:]:
            out.append(end_tokens + span.tokens(c) - span.tokens(pos))
        return out

    def _hold(self, kv_bytes: int, states: int) -> None:
        super()._hold(kv_bytes, states)
        if self.state_capacity is not None:  # pools: KV from the KV pool, slots from the state pool
            self.kv_capacity_bytes -= kv_bytes
            self.state_capacity -= states

    def _check_capacity(self) -> None:
        if self.state_capacity is None:
            super()._check_capacity()
            return
        assert self.kv_bytes <= self.kv_capacity_bytes, "KV pool exceeded"
        assert self.n_states <= self.state_capacity, "state pool exceeded"

    def lock(self, node: Node) -> None:
        super().lock(node)
        if node is not None and node.parent is not None and node.lock > 1 and self._keys_on_direct_lock():
            self._changed(node)  # its own lock changed above 1 (the core signals 0 <-> 1 only)

    def unlock(self, node: Node) -> None:
        super().unlock(node)
        if node is not None and node.parent is not None and node.lock > 0 and self._keys_on_direct_lock():
            self._changed(node)  # a lock ending here went, others pass through: it may be a candidate again

    def _keys_on_direct_lock(self) -> bool:
        """Whether the policy's candidacy depends on the locks that end at a node (SGLang's state
        list: a request locks only its own node's state), not only on whether it is locked."""
        return getattr(self.policy, "keys_on_direct_lock", False)

    def age_state(self, node: Node, t: float) -> None:
        """``node``'s state entered the engine's queue at ``t``, earlier than the insert that
        placed it (vLLM frees a chunk-end state's block while the prefill goes on)."""
        if t < node.state_access:
            node.state_access = t
            self._touched(node)

    def state_freed_at(self, node: Node, t: float) -> None:
        """``node``'s state entered the engine's queue at ``t``, whenever that is: later than the
        lookup that refreshed it (vLLM holds a hit's state block through the request's first step)."""
        if node.has_state and node.parent is not None and node.state_access != t:
            node.state_access = t
            self._touched(node)

    # ------------------------------------------------------------------ lookup and refresh
    def lookup(
        self, seq: np.ndarray, max_hit_sym: int | None = None, now: float | None = None, *, tokens: int | None = None
    ) -> MatchResult:
        m = super().lookup(seq, max_hit_sym, now, tokens=tokens)
        if self.duplicate_kv:
            self._note_recomputed(m, max_hit_sym)
        return m

    def _note_recomputed(self, m: MatchResult, max_hit_sym: int | None) -> None:
        """The cached KV a request will compute again: its matched blocks past the hit, up to
        the lookup's cap (the engine's KV match stops at ``n - 1`` tokens), each by its end, with
        their node's recency now (the hit's refresh stops at the hit)."""
        end = m.match_sym if max_hit_sym is None else min(m.match_sym, max_hit_sym)
        found = []
        for node in m.path:
            lo, hi = max(node.depth_sym - len(node.key), m.hit_sym), min(node.depth_sym, end)
            if hi > lo:  # the blocks' ends now (an insert may extend the node in place later)
                ends = [
                    node.depth_tokens - j * self.block_tokens for j in range(node.depth_sym - hi, node.depth_sym - lo)
                ]
                found.append((node, ends, node.last_access))
        node = m.split_node
        if node is not None:  # the match ends inside this node's edge: its matched blocks too
            first = node.depth_sym - len(node.key)
            lo, hi = max(first, m.hit_sym), min(first + m.split_offset, end)
            if hi > lo:
                base = node.depth_tokens - node.n_tokens - first * self.block_tokens
                ends = [base + (i + 1) * self.block_tokens for i in range(hi - 1, lo - 1, -1)]
                found.append((node, ends, node.last_access))
        if found:
            self._recomputed[id(m)] = found

    def forget(self, m: MatchResult) -> None:
        """A lookup given back caches nothing a second time: its note goes (keyed by the match's
        ``id``, which a later match may reuse)."""
        self._recomputed.pop(id(m), None)

    def cache_again(self, m: MatchResult, *, tag: object = None) -> None:
        """The request that looked up ``m`` has cached its recomputed blocks a second time: the
        older copies (still in the tree) hold their blocks at their old recency, deepest first
        as the engine freed them, and the room for the new ones is made as the engine makes it
        (evicting the oldest entries, which may be those older copies). ``tag``: handed to the
        listener with every eviction this makes."""
        for node, ends, recency in self._recomputed.pop(id(m), ()):
            if node.parent is None:  # evicted meanwhile: the older copy is gone
                continue
            for end in ends:  # deepest first
                holder = node  # an insert may have split the node since: the part holding the block
                while holder.parent is not self.root and holder.parent.depth_tokens >= end:
                    holder = holder.parent
                self._push_copy(holder, (recency, 1, -end))
                self.copy_tokens += self.block_tokens
        if self.used_bytes > self.capacity_bytes:
            outer, self._tag = self._tag, tag
            try:
                self._evict_for(0)
            finally:
                self._tag = outer

    def _push_copy(self, node: Node, key: tuple, *, first: bool = True) -> None:
        """An older copy of one of ``node``'s blocks: ``first``, the block's first copy cached
        (a hit touches it), else a later one (its place in the queue stays)."""
        self._created += 1
        entry = (*key, self._created, self.block_tokens, first)
        heapq.heappush(self.copies, entry)
        self._node_copies.setdefault(node, []).append(entry)

    def refresh_hit(self, m: MatchResult, now: float) -> None:
        """A hit on blocks cached twice touches the first copy cached, the older one
        (``get_cached_block`` returns ``BlockHashToBlockMap.get_one_block``'s first block id,
        ``block_pool.py`` L66-L69): that copy becomes the recent one and the newer copy keeps the
        place the node had, so an older copy of the node takes the node's recency."""
        olds = []
        if self._node_copies and m.hit_sym > 0:
            olds = [(n, n.last_access) for n in m.path if n.depth_sym <= m.hit_sym and n in self._node_copies]
        super().refresh_hit(m, now)
        if self.pages_one_by_one and m.hit_sym > 0 and m.hit_tokens % self.snapshot_block:
            self._touch_hit_block(m.hit_node, now)
        for node, before in olds:
            live = [e for e in self._node_copies[node] if e[3] not in self._gone]
            self._node_copies[node] = [e for e in live if not e[5]]
            for e in live:
                if e[5]:  # touched: the newer copy, left where ``node`` was, takes its place
                    self._gone.add(e[3])
                    self._push_copy(node, (before, 1, e[2]), first=False)
            if not self._node_copies[node]:
                del self._node_copies[node]

    def _touch_hit_block(self, hit: Node, now: float) -> None:
        """TensorRT-LLM: a hit inside a block is that block's page (the first created block through
        the point, ``_oldest_through``), whose attention page the request holds until ``resume``
        copies the partial block and lets it go (``_core/_kv_cache.py`` ``_setup_for_reuse``), so
        it goes to the queue's back: the node holding the block's last token is touched too, or,
        where it goes on past the block, once it is cut back to that block (``_evict_last_block``,
        a leaf losing its last block first)."""
        B = self.snapshot_block
        hi = (hit.depth_tokens - 1) // B * B + B
        _, owner, _ = self._oldest_through(hit, hi)
        if owner is hit:
            return
        if owner.depth_tokens <= hi:
            owner.last_access = now
            self._touched(owner)
        else:  # its blocks past this one keep their place; this one's counts once it is all it holds
            owner.head = (hi, now)

    def _partial_leaf(self, node: Node | None) -> bool:
        """``pages_one_by_one``: ``node`` is a leaf ending inside a page."""
        return (
            self.pages_one_by_one
            and node is not None
            and node.parent is not None
            and not node.children
            and node.depth_tokens % self.kv_page != 0
        )

    def stamp_partial_tail(self, node: Node | None) -> int | None:
        """After a running request's prefill insert (``--scheduler fcfs``): where ``node``, its
        prompt's end at its last snapshot point, is a leaf ending inside a page, that partial block
        is a copy the tree took when the point was committed (``kvCache.cpp``
        ``_snapshotPartialBlockToTree``: a new page no request holds, in the queue from then on):
        it is stamped now (a leaf the insert extended keeps an older stamp otherwise). Returns the
        point (symbols), or None."""
        if not self._partial_leaf(node):
            return None
        node.last_access = max(node.last_access, self.now)
        self._touched(node)
        return node.depth_sym

    def partial_tail(self, node: Node | None) -> tuple[Node, float] | None:
        """Before a running request's end insert: ``node`` (its prompt's end) with its recency,
        where it is a leaf ending inside a page (``stamp_partial_tail``): its end leaves that copy
        where it is in the queue (``keep_partial_tail``). None otherwise."""
        return (node, node.last_access) if self._partial_leaf(node) else None

    def partial_copy_free(self, node: Node) -> bool:
        """``pages_one_by_one``: a locked leaf's last block is a KV victim too where it is a partial
        block of its own: no request holds a tree's partial block (the copy at a request's last
        snapshot point, ``_snapshotPartialBlockToTree``; a partially matched block, let go by
        ``resume``, ``_core/_kv_cache.py``), so it stays in the attention queue while its requests
        run, and its eviction cuts the leaf back to its whole blocks (``_evict_last_block``)."""
        if not self._partial_leaf(node) or node.lock == 0:
            return False
        P = self.kv_page
        floor = node.depth_tokens // P * P
        top = node.parent.depth_tokens
        return floor > top and (floor - top) % self.block_tokens == 0

    def release_path(self, node: Node | None, tail: tuple[Node, float] | None, *, tag: object = None) -> None:
        """After a running request's end insert (``--scheduler fcfs`` with the pools): the blocks it
        held, its path to ``node``, go to the queue now (``close`` releases them, last block first:
        ``_core/_kv_cache.py`` ``_clear_blocks``), also where the end insert added nothing (its
        prompt's states all gone since its prefill); its partial last block keeps its place
        (``keep_partial_tail``)."""
        if node is not None and node in self._detached:
            self._detached.discard(node)
            if node.parent is not None and not node.children and not node.has_state and node.lock == 0:
                outer, self._tag = self._tag, tag
                try:
                    self._free_detached(node)
                finally:
                    self._tag = outer
                return
        if self.pages_one_by_one and node is not None and node.parent is not None:
            self.touch_path(node, self.now)
        self.keep_partial_tail(tail)

    def _free_detached(self, node: Node) -> None:
        """A running leaf a state victim detached (``drop_state``) goes at its request's end, with
        each ancestor left a leaf without a state: its blocks left the engine's tree then, and
        ``close`` frees their pages instead of queueing them (not ``in_tree``)."""
        while node.parent is not None and not node.children and not node.has_state and not node.lock:
            parent = node.parent
            self._forget_frozen(node)
            HybridRadixTree.evict(self, node)
            node = parent

    def keep_partial_tail(self, tail: tuple[Node, float] | None) -> None:
        """After the request's end insert: its prompt's partial last block keeps the recency it had
        (``partial_tail``), the whole blocks of the leaf take the end's (the request releases them
        at ``close``, last block first: ``_core/_kv_cache.py`` ``_clear_blocks``), counted once the
        leaf is cut back to them (``head``, as ``_touch_hit_block``)."""
        if tail is None:
            return
        node, before = tail
        if node.parent is None or node.children or node.last_access == before:
            return
        hi = node.depth_tokens // self.kv_page * self.kv_page
        if hi > node.parent.depth_tokens:
            node.head = (hi, node.last_access)
        node.last_access = before
        self._touched(node)

    def match(self, seq: np.ndarray, max_hit_sym: int | None = None, *, tokens: int | None = None) -> MatchResult:
        if self.future is not None:
            self.future.arrived(seq)
        m = super().match(seq, max_hit_sym, tokens=tokens)
        if self.snapshot_block and self.hybrid and m.hit_sym:
            self._reachable_hit(m, seq, max_hit_sym)
        return m

    # ------------------------------------------------------------------ TensorRT-LLM's blocks
    def _reachable_hit(self, m: MatchResult, seq: np.ndarray, max_hit_sym: int | None) -> None:
        """Move ``m``'s hit to the state TensorRT-LLM's lookup reaches (``BlockRadixTree.match``,
        ``_block_radix_tree.py`` at 065ff9e9): the lookup walks whole blocks by key, then, in the
        block it does not match whole, takes one child of the last whole block
        (``find_best_partial_match_in_next_nodes``, L291-L310: the longest leading match, the
        first created among equals, none under a block with 32 or more children, TODO
        TRTLLM-7784), and ``_prune_match`` (L712-L774) keeps that block's one recurrent page
        where the match covers it, else the deepest whole block's page. So a state inside the
        partly matched block counts only as the page of the block chosen; the token tree's
        deepest state on the path may sit in a sibling block (``_partial_block_hit``)."""
        B = self.snapshot_block
        cap = (len(seq) if max_hit_sym is None else max_hit_sym) * self.block_tokens
        start = min(cap, m.match_tokens) // B * B  # the whole blocks the lookup matches
        if m.hit_tokens <= start:
            if self.pages_one_by_one and m.hit_tokens % B:
                self._whole_block_hit(m, seq)
            return
        hit = self._partial_block_hit(seq, start, min(start + B, cap))
        if hit is None:
            hit = next((n for n in reversed(m.path) if n.has_state and n.depth_tokens <= start), self.root)
        m.hit_node, m.hit_sym, m.hit_tokens = hit, hit.depth_sym, hit.depth_tokens

    def _whole_block_hit(self, m: MatchResult, seq: np.ndarray) -> None:
        """A hit inside a block the lookup matches whole: the lookup walks the blocks by key, so the
        state counts only where its page is in the request's own block there, the first created
        block through the point being the request's (``_oldest_through``); else the deepest state
        above it that is (``_prune_match``, ``_block_radix_tree.py`` L733-L744: the deepest matched
        block with a page). States at a block's end are the request's block's own."""
        B, G = self.snapshot_block, self.block_tokens
        for n in reversed(m.path):
            if not n.has_state or n.depth_tokens > m.hit_tokens:
                continue
            if n.depth_tokens % B and G == 1:
                hi = (n.depth_tokens - 1) // B * B + B
                _, owner, e = self._oldest_through(n, hi)
                if not self._through_on_path(owner, e, seq):
                    continue
            m.hit_node, m.hit_sym, m.hit_tokens = n, n.depth_sym, n.depth_tokens
            return
        m.hit_node, m.hit_sym, m.hit_tokens = self.root, 0, 0

    def _through_on_path(self, node: Node, e: int, seq: np.ndarray) -> bool:
        """Whether ``node``'s path up to token ``e`` (one token a symbol) is ``seq``'s."""
        if e > len(seq):
            return False
        path = self._path_symbols(node, seq.dtype)[:e]
        return path.tobytes() == seq[:e].astype(path.dtype).tobytes()

    def _path_symbols(self, node: Node, dtype) -> np.ndarray:
        """The symbols from the root to ``node``'s end (empty, of ``dtype``, at the root)."""
        keys = []
        while node is not self.root:
            keys.append(node.key)
            node = node.parent
        return np.concatenate(keys[::-1]) if keys else np.empty(0, dtype=dtype)

    def _partial_block_hit(self, seq: np.ndarray, start: int, lookup_end: int) -> Node | None:
        """The state ``find_best_partial_match_in_next_nodes`` and ``_prune_match`` reach in the
        block after ``seq``'s whole block ending at token ``start``, the lookup ending at
        ``lookup_end``: the block (``_block_continuations``) with the longest leading match with
        ``seq`` (``match_len > best_match_len``: the first in ``block.next``, insertion order,
        among equals), its page (the deepest state it owns) if the match covers it (``matched[i][1]
        >= snapshot_len``); None otherwise (no child shares a token, 32 or more children, no page
        or one past the match)."""
        blocks, owner = self._block_continuations(seq, start, limit=32)
        if not blocks or len(blocks) >= 32:
            return None
        best = max(range(len(blocks)), key=lambda i: (min(blocks[i][2], lookup_end) - start, -blocks[i][3]))
        node, end, agree, _ = blocks[best]
        matched = min(agree, lookup_end) - start
        if matched <= 0:
            return None
        while node is not self.root and node.depth_tokens > start:
            if node.has_state and node.depth_tokens <= end and owner.get(node) == best:
                # one page per block, the deepest it owns: used only if the match covers it
                return node if node.depth_tokens - start <= matched else None
            node = node.parent
        return None

    def _block_continuations(
        self, seq: np.ndarray, start: int, limit: int | None = None
    ) -> tuple[list[tuple[Node, int, int, int]], dict[Node, int]]:
        """The radix-tree blocks that hang under ``seq``'s whole block ending at token ``start``:
        one per distinct path of the next ``snapshot_block`` tokens (a path ending inside them
        that another extends is the same block: the engine's ``Block`` replaces a covered partial
        sibling, adopting its pages, and a partial block covered by a sibling is that sibling,
        ``UselessBlockError``). Each as (node where it ends, its end, how far it shares ``seq``'s
        tokens, when it was created: ``_born_at`` its end, so a partial block extended is a new
        block, appended to ``block.next`` after its siblings). Stops at ``limit`` blocks.

        Also each state's owner: the index of the block holding its recurrent page, the first
        created of the blocks through it (a snapshot committed at a point goes into the block
        through it that ``block.next`` lists first, or into its own partial block, which the
        first block extending it replaces and adopts the page of; ``_block_radix_tree.py``
        ``Block.__init__`` / ``_adopt_pages_from``)."""
        end = start + self.snapshot_block
        node, pos = self.root, 0
        while node.depth_tokens < start:
            child = node.children.get(int(seq[pos])) if pos < len(seq) else None
            if child is None:
                return [], {}
            m = _edge_match(child.key, seq, pos)
            if child.depth_tokens > start:  # the block starts inside this edge: every path goes through it
                tops = [child]
                break
            if m < len(child.key):
                return [], {}
            node, pos = child, pos + m
        else:
            tops = list(node.children.values())
        blocks: list[tuple[Node, int, int, int]] = []
        owner: dict[Node, int] = {}
        big = len(seq) * self.block_tokens + end + 1  # shares every token it has

        def visit(n: Node, on_seq: int, agree: int) -> int | None:
            """Walk ``n``'s subtree to the block's end; ``on_seq``: the symbol of ``seq`` at the
            start of ``n``'s edge while the path still follows ``seq`` (-1 once it left, at
            ``agree`` tokens). Returns the index of the first created block below ``n``."""
            if limit is not None and len(blocks) >= limit:
                return None
            if on_seq >= 0:
                follows = on_seq < len(seq) and int(n.key[0]) == int(seq[on_seq])
                k = _edge_match(n.key, seq, on_seq) if follows else 0  # (a 1-symbol edge is not compared)
                if k < len(n.key):
                    agree = n.depth_tokens - n.n_tokens + min(k * self.block_tokens, n.n_tokens)
                    on_seq = -1
                else:
                    on_seq += k
            if n.depth_tokens >= end or not n.children:
                e = min(n.depth_tokens, end)
                blocks.append((n, e, big if on_seq >= 0 else agree, self._born_at(n, e)))
                first = len(blocks) - 1
            else:
                first = None
                for c in n.children.values():
                    i = visit(c, on_seq, agree)
                    if i is not None and (first is None or blocks[i][3] < blocks[first][3]):
                        first = i
            if first is not None:
                owner[n] = first
            return first

        for top in tops:
            visit(top, pos, top.depth_tokens - top.n_tokens)
        return blocks, owner

    def _block_children(self, seq: np.ndarray, start: int) -> int:
        """How many radix-tree blocks hang under ``seq``'s whole block ending at token ``start``
        (``_block_continuations``)."""
        return len(self._block_continuations(seq, start)[0])

    @staticmethod
    def _born_at(node: Node, tokens: int) -> int:
        """When the point ``tokens`` deep on ``node``'s edge was first cached (``EngineNode.born``)."""
        for frm, stamp in reversed(node.born):
            if frm < tokens:
                return stamp
        return node.born[0][1]

    def _take_block_snapshots(
        self,
        seq: np.ndarray,
        span: Span,
        checkpoints: list[int],
        replaced: list[Node] | None = None,
        transient: list[int] | None = None,
    ) -> list[int]:
        """One snapshot per radix-tree block, the deepest, in the order the request commits them.
        A snapshot at point d goes into the block through d that ``block.next`` lists first (the
        oldest: ``Block.__init__`` raises ``UselessBlockError`` with the first sibling covering the
        request's partial block), or, when no cached block goes through d, into the request's own
        new block (which adopts the page of the partial block on its path it replaces,
        ``_adopt_pages_from``). If that block's page is deeper (a state deeper on the block's own
        path), the new one is not kept (``_snapshotSsmToTreeBlock`` returns when the page covers
        as much); else the block's shallower page is given up (``Block.replace_page``). Returns
        the checkpoints to insert. With a state pool the given-up states go to ``replaced``,
        released by the caller after the insert: TensorRT-LLM takes the new page
        (``_snapshotSsmToTreeBlock``: a fresh recurrent page, evicting from the queue's front if the
        pool is short) before ``Block.replace_page`` lets the old one go; so does a snapshot of
        this request's own that a later one in the same block replaces (it held a page meanwhile):
        those checkpoints are inserted too and listed in ``transient``, for the caller to release."""
        B = self.snapshot_block
        path = self._seq_path(seq)
        tops = [top for _, top, _ in path]
        kept: dict[object, tuple[int, Node | None]] = {}  # the block -> its checkpoint (in order), the node
        # already holding it (None: a new state)
        steps: list[tuple[bool, list[Node], list[int]]] = []  # per kept snapshot: takes a page, replaces
        gone: set[Node] = set()
        for c, d in zip(checkpoints, self._state_depths(seq, span, checkpoints)):
            lo = (d - 1) // B * B
            hi = lo + B
            at = self._path_node(path, tops, d)
            block = None if at is None else self._oldest_through(at, hi)
            if block is not None:
                # the block's own path below d: a deeper state there is its page
                end_node, end = block[1], block[2]
                n = end_node
                deeper = False
                while n is not self.root and n.depth_tokens > d:
                    if n.has_state and n.depth_tokens <= end and n not in gone:
                        deeper = True
                        break
                    n = n.parent
                if deeper:
                    self.states_replaced += 1
                    continue
                held = None
                if at.depth_tokens == d and at.has_state and at not in gone:
                    owned = []  # the page covers d already: the snapshot adds nothing
                    held = at
                else:
                    owned = [
                        n
                        for n, _, _ in path
                        if lo < n.depth_tokens < d
                        and n.has_state
                        and n not in gone
                        and self._oldest_through(n, hi)[1:] == block[1:]
                    ]
                key = block[1:]
            else:
                # a new block; it replaces the partial block the cached path ends with, if any
                leaf = path[-1][0] if path else None
                owned = []
                if (
                    leaf is not None
                    and not leaf.children
                    and path[-1][2] == leaf.depth_tokens
                    and lo < leaf.depth_tokens < d
                ):
                    owned = [
                        n
                        for n, _, _ in path
                        if lo < n.depth_tokens <= leaf.depth_tokens
                        and n.has_state
                        and n not in gone
                        and self._oldest_through(n, hi)[1:] == (leaf, leaf.depth_tokens)
                    ]
                key = ("new", lo)
                held = None
            earlier = kept.pop(key, None)  # this request's earlier snapshot in the same block
            own: list[int] = []
            if earlier is not None:
                if earlier[1] is not None:  # a page the block held: replaced
                    owned.append(earlier[1])
                else:  # its own page, taken when it was committed
                    own.append(earlier[0])
            for old in owned:
                self.states_replaced += 1
                gone.add(old)
            steps.append((held is None, owned, own))
            kept[key] = (c, held)
        # the pages go as the engine lets them go: a replaced page right after the new one is taken
        # (``_snapshotSsmToTreeBlock``). With a state pool that is after the insert for the last
        # snapshot taking a page and before it for the others (the pool's peak is at the last
        # one); a snapshot of the request's own replaced before that peak is not inserted, one
        # replaced by it is, and released after (``transient``)
        pooled = replaced is not None and self.state_capacity is not None
        last = max((j for j, (takes, _, _) in enumerate(steps) if takes), default=-1)
        for j, (_, owned, own) in enumerate(steps):
            late = pooled and j >= last
            for old in owned:
                if late:
                    replaced.append(old)
                else:
                    self._release_state(old)
            if late and transient is not None:
                transient.extend(own)
        return sorted([c for c, _ in kept.values()] + (transient or []))

    def _walk(self, seq):
        """The nodes ``seq`` walks through, root down, each with how many of its key's symbols
        ``seq`` matches (the last one may be matched in part; the walk ends there)."""
        node, pos = self.root, 0
        while pos < len(seq):
            child = node.children.get(int(seq[pos]))
            if child is None:
                return
            m = _edge_match(child.key, seq, pos)
            yield child, m
            if m < len(child.key):
                return
            node, pos = child, pos + m

    def _seq_path(self, seq: np.ndarray) -> list[tuple[Node, int, int]]:
        """The nodes ``seq`` walks through, each as (node, its edge's first token, the last token of
        it ``seq`` matches): the last one may be matched in part."""
        out = []
        for child, m in self._walk(seq):
            top = child.depth_tokens - child.n_tokens
            out.append((child, top, top + min(m * self.block_tokens, child.n_tokens)))
        return out

    @staticmethod
    def _path_node(path: list[tuple[Node, int, int]], tops: list[int], d: int) -> Node | None:
        """The node of ``path`` (edges starting at ``tops``) whose edge holds token ``d`` (None: the
        cached path ends before)."""
        i = bisect.bisect_left(tops, d) - 1
        if i >= 0 and d <= path[i][2]:
            return path[i][0]
        return None

    def _oldest_through(self, node: Node, hi: int) -> tuple[int, Node, int]:
        """The first created of the blocks through ``node``'s edge up to token ``hi`` (the block's
        end): (when its end was first cached, the node it ends in, its end). A best-first walk by
        when each edge was first cached: a block's end is cached no sooner than any point above."""
        best = None
        heap = [(node.born[0][1], node.created, node)]
        while heap and (best is None or heap[0][0] < best[0]):
            _, _, n = heapq.heappop(heap)
            if n.depth_tokens >= hi or not n.children:
                e = min(n.depth_tokens, hi)
                cand = (self._born_at(n, e), n, e)
                if best is None or cand[0] < best[0]:
                    best = cand
            else:
                for ch in n.children.values():
                    heapq.heappush(heap, (ch.born[0][1], ch.created, ch))
        return best

    def _touch_state(self, node: Node, now: float) -> None:
        node.state_access = now

    def _add_state(self, node: Node) -> None:
        node.state_access = self.now  # a new or revived state is the most recent
        if not self.frozen_whole:  # else ``_recount`` charges it
            self.frozen_tokens += self._frozen_charge(node.depth_tokens)
        super()._add_state(node)

    def _split(self, child: Node, m: int, now: float, up_tokens: int | None = None) -> Node:
        upper = super()._split(child, m, now, up_tokens)
        if getattr(child, "head", None) is not None and upper.depth_tokens >= child.head[0]:
            upper.head, child.head = child.head, None  # the touched block is the upper half's
        if self.snapshot_block:  # the path existed before the cut: both halves keep their stamps
            cut = upper.depth_tokens
            born = child.born
            upper.born = tuple(mark for mark in born if mark[0] < cut)
            lower = tuple(mark for mark in born if mark[0] >= cut)
            child.born = lower if lower and lower[0][0] == cut else ((cut, upper.born[-1][1]), *lower)
        rule = self.refresh
        if rule.split:
            child.last_access = now
            if rule.state == "with-kv" and child.has_state:
                child.state_access = now
            self._touched(child)
        return upper

    def _merge_into_child(self, node: Node) -> None:
        if self.snapshot_block:
            (child,) = node.children.values()
            child.born = node.born + child.born
            if child.head is None:
                child.head = node.head
        super()._merge_into_child(node)

    def _extend_leaf(self, leaf: Node, key: np.ndarray, tokens: int) -> None:
        if self.snapshot_block:
            self._born += 1
            leaf.born = (*leaf.born, (leaf.depth_tokens, self._born))
        super()._extend_leaf(leaf, key, tokens)

    # ------------------------------------------------------------------ insert
    def _insert(self, seq, seq_tokens, checkpoints, now, lock, protect, need_bytes, cut=None):
        # ``pages_one_by_one``: the request holds its match (``protect``, the node at its hit) and
        # nothing past it; its own pages run from there (``_stage_needs``)
        self._held_to = protect.depth_tokens if protect is not None and protect.parent is not None else 0
        span = Span(len(seq), self.block_tokens, seq_tokens, cut)
        admitted = self._admit(seq, span, checkpoints, protect) if self.admitting is not None else (0, 0)
        if self.admitting is not None and self.frozen_whole and checkpoints:
            checkpoints = self._saveable(seq, span, checkpoints)  # before the extent: an unsaved one keeps no KV
        keep = self._extent(span, checkpoints)
        if keep < len(seq):
            seq = seq[:keep]
            seq_tokens = span.tokens(keep)
            checkpoints = [c for c in checkpoints if c <= keep]
            span = Span(keep, self.block_tokens, seq_tokens, cut)
        if self.anchor_block and checkpoints:
            checkpoints = self._take_anchors(seq, span, checkpoints)
        replaced: list[Node] = []
        transient: list[int] = []
        if self.snapshot_block and checkpoints:
            checkpoints = self._take_block_snapshots(seq, span, checkpoints, replaced, transient)
            if self.state_capacity is not None and len(checkpoints) > self.state_capacity:
                # more snapshots than the pool holds: TensorRT-LLM commits them one at a time, each
                # taking a page from the queue's front, where the request's own earlier snapshots
                # sit once the older pages are gone, so its last ones stay (and all of its KV)
                checkpoints = checkpoints[-self.state_capacity :] if self.state_capacity > 0 else []
        if len(seq) == 0:
            return InsertResult(True, end_node=self.root)
        try:
            res = super()._insert(seq, seq_tokens, checkpoints, now, lock, protect, need_bytes, cut)
            if not res.inserted and self.admitting is not None:
                # the prompt's blocks could not all be freed (the cached ones on its path are
                # guarded here, evictable in the engine): what was evicted stays evicted, and the
                # insert makes room for what it adds
                self.admitting = None
                self.stats.rejected_inserts -= 1
                self.stats.inserts -= 1
                first = res
                res = super()._insert(seq, seq_tokens, checkpoints, now, lock, protect, need_bytes, cut)
                res = replace(
                    res,
                    evicted_states=res.evicted_states + first.evicted_states,
                    evicted_kv_tokens=res.evicted_kv_tokens + first.evicted_kv_tokens,
                )
            if any(admitted):
                res = replace(
                    res,
                    evicted_states=res.evicted_states + admitted[0],
                    evicted_kv_tokens=res.evicted_kv_tokens + admitted[1],
                )
        finally:
            self._planning = None
            self._held_to = 0
            self._admitted = None
            self.admitting = None  # one insert's
        if transient and res.inserted:  # this request's own snapshots a later one replaced
            gone = set(transient)
            node = res.end_node
            while node is not None and node is not self.root:
                if node.depth_sym in gone and node.has_state:
                    replaced.append(node)
                node = node.parent
        for old in replaced:  # with pools: the new page was taken while the replaced one was held
            if old.has_state and old.parent is not None:
                self._release_state(old)
        self.refresh_inserted(res, now, final=False)
        return res

    def _admit(self, seq, span: Span, checkpoints: list[int], protect: Node | None) -> tuple[int, int]:
        """``admit_from_anchor`` (LMDeploy, sequential mode): the admission's own evictions, chunk by
        chunk, before the save and the decode are sized. Each prefill chunk's blocks (the first's
        at admission, ``kv_token_limit``, ``scheduler.py`` L140-L152, L580-L585; the next ones'
        through ``reserve_long_context_chunk``, L608-L628; the chunk ends are the checkpoints past
        the hit, the prompt's end last) are freed where the free blocks lack them
        (``num_required_blocks``, ``block_manager/default_block_manager.py`` L26-L31: the blocks to
        the chunk's end the sequence does not hold; ``_evict_for_ssm``,
        ``eviction_helper/recompute_eviction_helper.py`` L69-L118), least recent leaf blocks first,
        any the trie alone holds (ref count 1, ``KVBlockLifecycle.evict``,
        ``block_trie/kv_lifecycle.py`` L80-L83, L118-L123): the sequence holds only the restored
        blocks (``protect``; ``_apply_state_checkpoint_hit``, ``block_trie/trie.py`` L384-L386) and
        those of its earlier chunks (the tree's node holding the last chunk's end is guarded), so
        the cached path past them is a victim too; a block of it that goes is one the trie no
        longer gives back (``BlockTrie.allocate`` after each chunk's, ``scheduler.py`` L451-L453,
        L626-L627; none after a hit off the block grid, ``trie.py`` L394-L399) and one the insert
        adds again. Leaves ``_admitted`` at the sequence's own blocks once the prompt is in (its
        blocks past the hit less those the trie gave back), what ``_admission`` then counts.
        Returns (states, KV tokens) evicted."""
        B = self.frozen_block
        hit, prompt = self.admitting[0], self.admitting[1]
        ends = sorted({prompt, *(t for t in (span.tokens(c) for c in checkpoints) if hit < t < prompt)})
        if self.state_capacity is None:
            over = lambda room: self.used_bytes + room > self.capacity_bytes  # noqa: E731
            pop = self.policy.pop_victim
        else:
            over = lambda room: self.kv_bytes + room > self.kv_capacity_bytes  # noqa: E731
            pop = self.policy.pop_kv_victim
        evicted = [0, 0]
        held = hit // B  # the sequence's logical blocks
        given = 0  # blocks the trie gave back
        prev = hit
        for end in ends:
            need = -(-end // B) - held
            own = held - hit // B - given  # blocks the sequence holds besides the trie's
            room = (own + need) * B * self.kv_bytes_per_token
            if need > 0 and over(room):
                guard = protect if prev == hit else self._node_holding(seq, prev)
                self.stats.eviction_calls += 1
                if guard is not None:
                    self.lock(guard)
                try:
                    self._drain(lambda room=room: over(room), pop, evicted)  # short: the insert's eviction goes on
                finally:
                    if guard is not None:
                        self.unlock(guard)
            held = max(held, -(-end // B))
            if not hit % B:
                covered = span.total - self._plan_new(seq, span, [])[0]
                given = max(given, max(0, min(covered, end) // B - hit // B))
            prev = end
        self._admitted = held - hit // B - given
        return evicted[0], evicted[1]

    def _node_holding(self, seq, tokens: int) -> Node | None:
        """The tree's node on ``seq``'s path holding its token ``tokens`` (the deepest the path
        reaches where it is shorter); None where the path is empty."""
        node = None
        for node, _ in self._walk(seq):
            if node.depth_tokens >= tokens:
                break
        return node

    def _admission(self, seq, span: Span) -> tuple[int, int, int, int]:
        """``admit_from_anchor`` (LMDeploy, sequential mode; ``admitting`` is ``(hit, prompt
        tokens, tokens the request runs to)``): the free blocks now; the blocks admission makes
        room for, the prompt's from the restored one on, cached ones counted
        (``_evict_for_ssm``, ``eviction_helper/recompute_eviction_helper.py`` L60-L118;
        ``num_required_blocks``, ``block_manager/default_block_manager.py`` L26-L34); those the
        trie holds already and gives back at once (``_finish_admission`` runs ``BlockTrie.allocate``
        after ``block_manager.allocate``, ``scheduler.py`` L451-L453, which substitutes the trie's
        block for an identical one of the sequence, ``block_trie/trie.py`` L590-L597, except the
        fresh range: after a hit off the block grid, every complete block of the prompt,
        L394-L399; so none then); and the decode's blocks past the prompt's
        (``evict_for_seq`` before the decode's ``allocate``)."""
        B = self.frozen_block
        hit, prompt, *running = self.admitting
        if self.state_capacity is None:
            free = self.capacity_bytes - self.used_bytes
        else:
            free = self.kv_capacity_bytes - self.kv_bytes
        free //= B * self.kv_bytes_per_token
        blocks = -(-prompt // B) - hit // B
        need_tok = self._plan_new(seq, span, [])[0]
        cached = 0 if hit % B else max(0, min(span.total - need_tok, prompt) // B - hit // B)
        decode = -(-max([prompt, *running]) // B) - -(-prompt // B)
        if self._admitted is not None:  # ``_admit`` took the prompt's blocks: its own are what it holds
            return free, self._admitted, 0, decode
        return free, blocks, cached, decode

    def _saveable(self, seq, span: Span, checkpoints: list[int]) -> list[int]:
        """``admit_from_anchor`` (LMDeploy, sequential mode): the checkpoint at the prompt's end,
        off the block grid, needs a frozen block taken from the free blocks left once the prompt's
        blocks from the restored one on are allocated, without evicting anything
        (``CheckpointLifecycle._create_checkpoint``, ``paging/block_trie/checkpoint_lifecycle.py``
        L404-L406, raises ``MemoryError`` and ``reserve_save`` L85-L88 saves nothing): admission
        evicts exactly what the prompt's blocks lack (``_evict_for_ssm``,
        ``eviction_helper/recompute_eviction_helper.py`` L69-L118), so the checkpoint is saved
        only where a block is free beyond them, or given back by the trie (``_admission``), once
        they are allocated. Called before the extent: a checkpoint not saved keeps no KV past the
        prompt's last whole block (its partial block is the sequence's own, freed at its end)."""
        prompt = self.admitting[1]
        if prompt % self.frozen_block == 0:
            return checkpoints
        free, blocks, cached, decode = self._admission(seq, span)
        left = max(free, blocks) - blocks + cached  # free once the prompt's blocks are in
        if left >= 1:
            # the decode then evicts for its blocks, frozen checkpoints first, least recent first
            # (``BlockTrie.evict``, ``block_trie/trie.py`` L634-L648): where fewer others are left
            # than it evicts, this request's own, just saved, goes too
            short = decode + 1 - left
            if short <= 0 or self._frozen_evictable() - max(0, blocks - free) >= short:
                return checkpoints
        return [c for c in checkpoints if span.tokens(c) != prompt]

    def _frozen_evictable(self) -> int:
        """Checkpoints off the block grid the policy may evict now (its ``frozen`` list)."""
        keys = getattr(self.policy, "keys", None)
        if keys is None:
            return 0
        return sum(1 for n in self.iter_nodes() if n is not self.root and n.has_state and "frozen" in keys(n))

    def _extent(self, span: Span, checkpoints: list[int]) -> int:
        """Symbols of an inserted sequence whose KV the engine keeps."""
        last = checkpoints[-1] if checkpoints else 0
        if self.kv_extent == "state":
            return last
        if self.kv_extent == "blocks":
            B = self.extent_block
            whole = span.total // B * B  # tokens in whole engine blocks: the symbols inside them
            k = min(whole // self.block_tokens, span.n)
            while k < span.n and span.tokens(k + 1) <= whole:
                k += 1  # past a partial symbol inside the sequence, the symbols sit further
            while k > 0 and span.tokens(k) > whole:
                k -= 1
            return max(k, last) if self.frozen_block else k  # a frozen block keeps its tail
        return span.n

    def _take_anchors(self, seq: np.ndarray, span: Span, checkpoints: list[int]) -> list[int]:
        """LMDeploy's one checkpoint per anchor: keep the last new state per block and give up any
        older state anchored on the same block (a request's own hit is replaceable too: its
        restore pin does not block the save). With ``EngineRules.anchor_refusals`` (LMDeploy
        0.16's ``_reserve_checkpoint``: ``checkpoint.step == step`` refuses) an older state at the
        same step stays, whichever path it is on, and the new one is not saved. Returns the
        checkpoints to insert. Anchors and steps are the states' exact token positions
        (``_state_depths``: on a hash-block trace a prompt's last block is partial)."""
        B = self.anchor_block
        last_per_anchor: dict[int, tuple[int, int]] = {}
        for c, step in zip(checkpoints, self._state_depths(seq, span, checkpoints)):
            last_per_anchor[step // B] = (c, step)
        keep = []
        for anchor, (c, step) in last_per_anchor.items():
            olds = self._states_in_block(seq, anchor * B, c)
            if self.rules.anchor_refusals and any(o.depth_tokens == step for o in olds):
                continue
            for old in olds:
                self.states_replaced += 1
                self._release_state(old)
            keep.append(c)
        return sorted(keep)

    def _states_in_block(self, seq: np.ndarray, start_tokens: int, keep_sym: int) -> list[Node]:
        """States whose root path shares ``seq``'s first ``start_tokens`` tokens and that end inside
        the block starting there, except one exactly at ``keep_sym`` on ``seq``'s own path (the
        same step: nothing to replace). Shared means matched symbol by symbol, as a lookup matches:
        an anchor inside a symbol (LMDeploy's 64-token blocks on Mooncake's 512-token symbols) is
        shared by the paths that hold that whole symbol."""
        a_sym = -(-start_tokens // self.block_tokens)
        end_tokens = start_tokens + self.anchor_block
        node, pos = self.root, 0
        while node.depth_sym < a_sym:  # down to the node whose edge reaches the anchor
            child = node.children.get(int(seq[pos])) if pos < len(seq) else None
            if child is None:
                return []
            m = _edge_match(child.key, seq, pos)
            if m < len(child.key) and pos + m < a_sym:
                return []  # the tree leaves seq before the anchor: nothing shares it
            node, pos = child, pos + m
            if m < len(child.key):
                break
        stack = list(node.children.values()) if node is self.root else [node]
        found = []
        while stack:
            n = stack.pop()
            if n.depth_tokens >= end_tokens:
                continue
            if (
                n.has_state
                and n.depth_tokens >= start_tokens
                and not (n.depth_sym == keep_sym and self._on_path(n, seq))
            ):
                found.append(n)
            stack.extend(n.children.values())
        return found

    def _on_path(self, node: Node, seq: np.ndarray) -> bool:
        d = node.depth_sym
        if d > len(seq):
            return False
        return self._path_symbols(node, seq.dtype).tobytes() == seq[:d].tobytes()

    def _release_state(self, node: Node) -> None:
        """Give up ``node``'s state to a later one on the same anchor (not an eviction)."""
        self._forget_frozen(node)
        node.has_state = False
        self.n_states -= 1
        self._state_gone(node)
        if len(node.children) == 1 and node.lock == 0:
            self._merge_into_child(node)
        else:  # a locked single-child node is merged when its lock goes (unlock)
            self._changed(node)
            self._trim_tail(node)

    def _forget_frozen(self, node: Node) -> None:
        if self.frozen_whole:
            self.frozen_tokens -= node.frozen
            node.frozen = 0
        elif node.has_state:
            self.frozen_tokens -= self._frozen_charge(node.depth_tokens)

    def _trim_tail(self, node: Node) -> None:
        """A leaf that lost its partial-block state loses the tokens only its frozen block held
        (the trie keeps whole blocks): back to the last block boundary or to its parent."""
        B = self.frozen_block
        if not B or node.children or node.has_state or node.lock or node.depth_tokens % B == 0:
            return
        parent = node.parent
        keep = max(parent.depth_tokens, node.depth_tokens // B * B)
        # the tree's edges are whole symbols: on a hash-block trace whose blocks are coarser than
        # the engine's (Mooncake's 512 tokens vs 64), a symbol is kept whole or not at all
        k_sym = (keep - parent.depth_tokens) // self.block_tokens
        keep = parent.depth_tokens + k_sym * self.block_tokens
        if keep == node.depth_tokens:
            return
        if keep == parent.depth_tokens:
            if self.listener is not None:
                self.listener.kv_removed(node.depth_tokens - keep, self._tag)
            del parent.children[int(node.key[0])]
            self.kv_tokens -= node.n_tokens
            self.policy.remove(node)
            node.parent = None
            self._recount(node)
            self._after_child_removed(parent)
            return
        self._shorten_leaf(node, k_sym)

    def _shorten_leaf(self, node: Node, k_sym: int) -> int:
        """Cut leaf ``node``'s edge to its first ``k_sym`` (>= 1) symbols, the KV past them freed
        and reported: the tokens freed."""
        parent = node.parent
        keep = parent.depth_tokens + k_sym * self.block_tokens
        freed = node.depth_tokens - keep
        self.kv_tokens -= freed
        if self.listener is not None:
            self.listener.kv_removed(freed, self._tag)
        node.key = node.key[:k_sym]
        node.n_tokens = keep - parent.depth_tokens
        node.depth_sym = parent.depth_sym + k_sym
        node.depth_tokens = keep
        self._changed(node)
        return freed

    # ------------------------------------------------------------------ eviction
    def evict(self, node: Node) -> tuple[int, int]:
        if self.block_evict and not node.children:
            freed = self._evict_last_block(node)
            if freed is not None:
                return freed
        if self._state_drain and self.snapshot_block and not node.children and node.has_state:
            freed = self._detach_stale_blocks(node)
            if freed is not None:
                return freed
        paged = []  # states whose page is in the one block of a leaf going whole
        if self.pages_one_by_one and not self._state_drain and not node.children:
            freed = self._evict_last_block(node, self.kv_page)
            if freed is not None:
                return freed
            paged = self._pages_in_leaf_block(node)
        self._forget_frozen(node)
        parent = node.parent
        leaf = not node.children
        s, kv = super().evict(node)
        if self.cascade and leaf:
            while (
                parent is not None
                and parent is not self.root
                and parent.parent is not None
                and not parent.children
                and not parent.has_state
                and parent.lock == 0
            ):
                up = parent.parent
                s2, kv2 = super().evict(parent)
                s, kv = s + s2, kv + kv2
                parent = up
        for n in paged:  # the block's recurrent page goes with it (``remove_subtree``)
            if n.has_state and n.parent is not None:
                s2, kv2 = self.drop_state(n)
                s, kv = s + s2, kv + kv2
                if n.parent is not None and not n.children and n.lock == 0:  # no block covers it now
                    s2, kv2 = self.evict(n)
                    s, kv = s + s2, kv + kv2
        return s, kv

    def _pages_in_leaf_block(self, leaf: Node) -> list[Node]:
        """``pages_one_by_one``: the states above ``leaf`` inside its one block whose page that
        block holds (the first created block through them, ``_oldest_through``): TensorRT-LLM keeps
        a snapshot in a block's page, so dropping the block's attention page removes it too
        (``remove_subtree``, ``_block_radix_tree.py`` L246-L269; the harness's ``_free_block_pages``)."""
        B = self.snapshot_block
        lo = (leaf.depth_tokens - 1) // B * B
        out = []
        n = leaf.parent
        while n is not self.root and n.depth_tokens > lo:
            if n.has_state and self._oldest_through(n, lo + B)[1] is leaf:
                out.append(n)
            n = n.parent
        return out

    def _evict_last_block(self, node: Node, B: int = 0) -> tuple[int, int] | None:
        """``block_evict`` (vLLM): evict only the last block of leaf ``node``, with the state at
        its end; None where the leaf is one block (or less) and goes whole. vLLM's pool evicts a
        block per block it needs from its free queue's head (``BlockPool.get_new_blocks``,
        ``block_pool.py`` L681-L696, ``_maybe_evict_cached_block`` L751), and a request frees its
        blocks tail first (``SingleTypeKVCacheManager.free``, ``single_type_kv_cache_manager.py``
        L596-L604), so a cached leaf loses its last block first; the leaf keeps its recency.
        ``B``: the block (default ``extent_block``; TensorRT-LLM's pools: ``kv_page``)."""
        B = B or self.extent_block
        parent = node.parent
        keep = max(parent.depth_tokens, (node.depth_tokens - 1) // B * B)
        k_sym = (keep - parent.depth_tokens) // self.block_tokens  # edges are whole symbols
        keep = parent.depth_tokens + k_sym * self.block_tokens
        if k_sym <= 0 or keep >= node.depth_tokens:
            return None
        assert node.lock == 0 or self.partial_copy_free(node)
        if getattr(node, "head", None) is not None and keep <= node.head[0]:  # ``_touch_hit_block``
            node.last_access = max(node.last_access, node.head[1])
            node.head = None
        self.stats.evictions += 1
        freed_states = 1 if node.has_state else 0
        if freed_states:
            self._forget_frozen(node)
            node.has_state = False
            self.n_states -= 1
            self._state_gone(node)
        freed_kv = self._shorten_leaf(node, k_sym)
        self.stats.states_evicted += freed_states
        self.stats.kv_tokens_evicted += freed_kv
        return freed_states, freed_kv

    def _detach_stale_blocks(self, node: Node) -> tuple[int, int] | None:
        """A state victim that is a leaf (``snapshot_block`` with a state pool): TensorRT-LLM drops
        the recurrent page and detaches its block, then each ancestor block left without children
        and without a recurrent page (``Block.clear_stale_blocks_after_page_unlink``,
        ``_block_radix_tree.py`` L572-L597 at 065ff9e9). The leaf's blocks below the one its edge
        starts in go; that block stays, with its KV to its end, where it holds a page of its own
        (a state above the leaf's edge in the block, the first created block through it:
        ``_oldest_through``), and the leaf is cut there, stateless. None: the leaf goes whole."""
        B = self.snapshot_block
        parent = node.parent
        top = parent.depth_tokens
        lo = top // B * B
        hi = lo + B
        if node.depth_tokens <= hi or parent is self.root:
            return None
        k_sym = (hi - top) // self.block_tokens  # edges are whole symbols
        if k_sym <= 0:
            return None
        n = parent
        while n is not self.root and n.depth_tokens > lo:
            if n.has_state and self._oldest_through(n, hi)[1:] == (node, hi):
                break
            n = n.parent
        else:
            return None
        self.stats.evictions += 1
        node.has_state = False
        self.n_states -= 1
        self._state_gone(node)
        freed_kv = self._shorten_leaf(node, k_sym)
        self.stats.states_evicted += 1
        self.stats.kv_tokens_evicted += freed_kv
        return 1, freed_kv

    def drop_state(self, node: Node) -> tuple[int, int]:
        if self.pages_one_by_one and self._state_drain and node.lock and not node.children:
            # TensorRT-LLM: the recurrent page's block and each ancestor left a leaf without one
            # are detached whether or not a request holds them (``clear_stale_blocks_after_page_unlink``,
            # ``_block_radix_tree.py`` L572-L597); the running request keeps their pages to its end
            self._detached.add(node)
        self._forget_frozen(node)
        s, kv = super().drop_state(node)
        if node.parent is not None:
            before = self.kv_tokens
            self._trim_tail(node)
            kv += before - self.kv_tokens
            self.stats.kv_tokens_evicted += before - self.kv_tokens
        return s, kv

    def _evict_for(self, need: float) -> tuple[bool, int, int]:
        if self.copies and self.state_capacity is None:
            return self._evict_with_copies(need)
        if self.state_capacity is None:
            return super()._evict_for(need)
        self.stats.eviction_calls += 1
        need_kv, need_states = self._pending
        planning = self._planning

        def states_short(upto: int | None = None) -> bool:
            # a state the insert finds on its path may itself be a state victim (TensorRT-LLM's
            # pools lock only KV on a running path): then the insert adds it again, so the states
            # it needs are counted again after each victim
            if planning is None:
                need = need_states
            else:
                need = sum(1 for c in self._plan_new(*planning)[1] if upto is None or c <= upto)
            return self.n_states + need > self.state_capacity

        evicted = [0, 0]  # states, KV tokens

        def kv_need() -> int:
            if planning is None or not self.pages_one_by_one:
                return need_kv
            return self._kv_need(*planning)[0]  # a victim on the insert's path adds to it

        def kv_drain(stage: int | None = None) -> bool:
            def short() -> bool:
                if stage is None:
                    return self.kv_bytes + kv_need() > self.kv_capacity_bytes
                # the room up to a snapshot point, counted again after each victim
                return self.kv_bytes + dict(self._stage_needs(*planning, new))[stage] > self.kv_capacity_bytes

            return self._drain(short, self.policy.pop_kv_victim, evicted)

        def state_drain(upto: int | None = None) -> bool:
            self._state_drain = True
            try:
                return self._drain(lambda: states_short(upto), self.policy.pop_state_victim, evicted)
            finally:
                self._state_drain = False

        if self.pages_one_by_one and planning is not None:
            # TensorRT-LLM commits snapshot by snapshot: the pages up to a snapshot point, then the
            # state there (``_stage_needs``), then the next chunk
            ok, new = True, self._plan_new(*planning)[1]
            for c in list(new):
                ok = ok and kv_drain(c)
                cached = ok and self._cached_to(planning, c)
                ok = ok and state_drain(c)
                if cached and not self._cached_to(planning, c):
                    # the snapshot's page was taken for a block of the tree's, and that victim's
                    # block going took the tree's block with it: the snapshot is lost
                    self._lost.add(c)
                    self.snapshots_lost += 1
                    planning = (planning[0], planning[1], [x for x in planning[2] if x != c])
                    self._planning = planning
                    new = [x for x in new if x != c]
            ok = ok and state_drain() and kv_drain()
        elif self.states_first:
            ok = state_drain() and kv_drain()
        else:
            ok = kv_drain() and state_drain()
        return ok, evicted[0], evicted[1]

    def _cached_to(self, planning, c: int) -> bool:
        """``pages_one_by_one``: whether the tree's own path covers the planned insert's first ``c``
        symbols, so its snapshot at ``c`` goes into a block the tree holds, not the request's."""
        seq, span, _ = planning
        cut = (span.k, span.k * span.B - span.short) if span.short else None
        return self._plan_new(seq[:c], Span(c, self.block_tokens, span.tokens(c), cut), [])[0] == 0

    def _apply(self, seq: np.ndarray, span: Span, checkpoints: list[int], now: float) -> Node:
        if self._lost:
            # TensorRT-LLM takes a snapshot's recurrent page before installing it in its block
            # (a new page, then ``Block.replace_page``, ``_block_radix_tree.py`` L475-L487 at
            # 065ff9e9); where the state victim that made room was the leaf below that block, the
            # victim's block is detached with each ancestor left a leaf without a recurrent page
            # (``clear_stale_blocks_after_page_unlink`` L572-L597), the snapshot's block among them,
            # so the snapshot is freed with it: its KV is put back, not its state
            checkpoints = [c for c in checkpoints if c not in self._lost]
            self._lost = set()
        return super()._apply(seq, span, checkpoints, now)

    def _evict_with_copies(self, need: float) -> tuple[bool, int, int]:
        """One budget with older KV copies held (``duplicate_kv``): whichever of the policy's next
        victim and the oldest copy comes first in the queue goes (a copy frees its block, nothing
        leaves the tree)."""
        self.stats.eviction_calls += 1
        evicted = [0, 0]  # states, KV tokens
        ok = self._drain(
            lambda: self.used_bytes + need + self._grown() > self.capacity_bytes, self._pop_copy_or_victim, evicted
        )
        return ok, evicted[0], evicted[1]

    def _pop_copy_or_victim(self):
        """The oldest copy when it comes no later than the policy's next victim (dropped here:
        ``COPY_DROPPED``), else the policy's victim (None: nothing left)."""
        while self.copies and self.copies[0][3] in self._gone:  # replaced by a newer entry
            heapq.heappop(self.copies)
        nxt = self.policy.next_key()
        if self.copies and (nxt is None or self.copies[0][0] <= nxt[0]):  # copies first at equal recency
            entry = heapq.heappop(self.copies)
            self._gone.add(entry[3])
            self.copy_tokens -= entry[4]
            return COPY_DROPPED
        return self.policy.pop_victim()

    def _apply_victim(self, victim) -> tuple[int, int]:
        if victim is COPY_DROPPED:  # its block is already free; nothing leaves the tree
            return 0, 0
        return super()._apply_victim(victim)

    def evict_kv(self, tokens: int) -> int:
        """Free at least ``tokens`` KV tokens from the KV list (SGLang ``evict_full``); returns
        the tokens freed (fewer when nothing is left to evict)."""
        freed = 0
        while freed < tokens:
            victim = self.policy.pop_kv_victim()
            if victim is None:
                break
            before = self.kv_tokens + self.frozen_tokens
            self._apply_victim(victim)
            freed += before - self.kv_tokens - self.frozen_tokens
        return freed

    def evict_states(self, n: int) -> int:
        """Free ``n`` states from the state list (SGLang ``evict_mamba``, LMDeploy's
        checkpoint-only eviction); returns the states freed."""
        freed = 0
        while freed < n:
            victim = self.policy.pop_state_victim()
            if victim is None:
                break
            s, _ = self._apply_victim(victim)
            freed += s
        return freed

    def check_invariants(self) -> None:
        frozen = sum(
            self._frozen_charge(n.depth_tokens, bool(n.children))
            for n in self.iter_nodes()
            if n is not self.root and n.has_state
        )
        assert frozen == self.frozen_tokens, (frozen, self.frozen_tokens)
        if self.kv_page or self.block_copies:
            assert self._pad == self._page_pad(), (self._pad, self._page_pad())
        super().check_invariants()


def parse_state_pool(text: str, state_bytes: int) -> int:
    """``--state-pool``: how many states the engines' state pool holds. A bare integer is a count
    (as SGLang's ``--max-mamba-cache-size``); a size with a unit (4GB, 512MiB, 1000B) is bytes,
    floored to whole states."""
    text = str(text).strip()
    try:
        n = int(text) if text.isdigit() else parse_size(text) // max(state_bytes, 1)
    except UsageError:
        raise UsageError(f"--state-pool must be a number of states or a size (200, 4GB), not {text!r}") from None
    if n < 1:
        raise UsageError(f"--state-pool {text!r} holds no state (one state is {format_size(state_bytes)})")
    return n


def state_capacity(rules: EngineRules, state_bytes: int, state_pool: str, memory_bytes: int) -> int | None:
    """States the engine's state pool holds: fixed by the preset's engine knobs, or their split of
    ``memory_bytes``, else ``--state-pool`` where the engine has a pool; None: one budget."""
    if not rules.state_pool:
        return None
    if rules.state_capacity is not None:
        return rules.state_capacity
    if rules.split is not None and rules.memory:
        n = rules.split(memory_bytes, state_bytes)
        if n < 1:  # the preset's engine refuses this combination (advise prunes it)
            raise PolicyError(
                f"the engine's split of {format_size(memory_bytes)} leaves no room for one state "
                f"({format_size(state_bytes)})"
            )
        return n
    return parse_state_pool(state_pool, state_bytes) if state_pool else None
