"""Differential check: TensorRT-LLM's own hybrid prefix cache (``MambaHybridCacheManagerV2``) against
the ``trtllm`` preset (issue 43, item 1).

The same request stream (a real ShareGPT slice with Qwen3.5 tokens, or ``mooncake:sample`` with its
hash blocks drawn into tokens as ``sim.replay.tokens`` does) goes through TensorRT-LLM's cache code
on the CPU and through the simulator's preset in sequential mode; the hit tokens of every request
are compared. Nothing of TensorRT-LLM is copied here: the script loads it from a folder given on the
command line (``--trtllm DIR``) holding, as in NVIDIA/TensorRT-LLM,

- ``tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py``: the V2 manager's radix tree
  (``BlockRadixTree.match`` with partial matching and the SSM-snapshot pruning ``_prune_match``,
  ``Block`` insertion with the partial-sibling replacement and page adoption, and
  ``can_replace_page`` / ``replace_page``: one recurrent page per block, the deepest kept), imported
  as it is, its four small sibling modules (``rawref``, ``_common``, ``_life_cycle_registry``,
  ``_utils``) stubbed;
- ``tensorrt_llm/_torch/pyexecutor/kv_cache/mamba_cache_manager/common.py``
  (``MambaHybridCacheManager.prepare_expect_snapshot_points``) and ``.../mamba_cache_manager_v2.py``
  (``MambaHybridCacheManagerV2.update_context_resources``, ``try_commit_blocks``,
  ``_mark_context_position_as_history``): these methods are read out of the files (``ast``) and run
  with a stub ``self``, so the rest of those files (torch, Triton, the C++ bindings) is not needed.

The per-request ``_KVCache`` the manager commits into is C++ in today's TensorRT-LLM
(``cpp/tensorrt_llm/batch_manager/kv_cache_manager_v2/kvCache.cpp``, reached through nanobind; its
Python twin ``_core/_kv_cache.py`` needs CUDA), so its commit rule is reproduced here from that
source, and only that: ``EngineKvCache`` below (``commit``, ``_commitBlock``,
``_snapshotPartialBlockToTree``, ``_snapshotSsmToTreeBlock``, ``stopCommitting``,
``_setupForReuse``), with the tree calls going to the engine's own ``Block`` / ``BlockRadixTree``.

Engine side, per request (each its own session, in the simulator's sequential order): the snapshot
points are set (``prepare_expect_snapshot_points``), the prompt minus its last token is matched
(``BlockRadixTree.match(..., enable_partial_match=True)``; the hit is ``num_tokens``), the prefill
runs in chunks that end at every snapshot point, every ``--prefill-chunk`` tokens and at the prompt
end (the scheduler's FORCE_CHUNK), ``update_context_resources`` after each chunk, then
``free_resources``' last ``try_commit_blocks``. Decode commits nothing (``stop_committing`` at the
context's end) but grows the request's capacity to input + output - 1 tokens before it closes.

Memory: unlimited by default. ``--capacity BYTES`` gives the engine those bytes as its GPU quota,
split between its two pool groups as ``MambaHybridCacheManagerV2`` sizes them from
``kv_cache_config.avg_seq_len`` (``pool_slots``; an attention page is ``tokens_per_block`` tokens
of the simulator's KV bytes per token, a recurrent page one of its states), and the simulator the
same two pools: ``--capacity`` their bytes (each pool is whole slots, so up to a slot of each goes
to neither and is not counted), ``--state-pool`` the recurrent pages. ``PagePools`` then evicts as
the V2 storage manager does: per pool group, the committed pages no request holds, least recently
released first; a dropped attention page removes its block's subtree, a dropped recurrent page its
block and the ancestors left as leaves without one (``_block_radix_tree.py``
``clear_stale_blocks_after_page_unlink``).

    python benchmarks/differential_trtllm.py --trtllm /work/engines/trtllm --sessions 100 \\
        --periodic-snapshot-interval 256 --additional-snapshot-offsets-from-end 0 [--capacity 2GB]

``--scheduler fcfs`` runs the simulator in ``des`` mode with the fcfs queue (one server) and drives
the engine with the simulator's own event stream (``differential_report.sim_events``, as
``differential_sglang.py`` does; ``EngineHarness.run_events``): a request is matched at its
``Lookup``, its whole chunked prefill runs with its commits at its ``Prefill`` (just before the
preset's prefill insert), its decode's growth, last commit and ``close`` at its ``Decode`` (just
before the end insert); requests overlap as in the simulator, each running one holding its pages
and live state in the engine's pools. Rows are written in the order the prefills ran.

``--scheduler continuous`` runs it with continuous batching and drives the engine with its
``Step`` events (``EngineHarness.run_steps``): per step, each context request's chunk as the
simulator cut it (a first chunk is the request's match; the simulator ends chunks at the snapshot
points, the scheduler's FORCE_CHUNK), each decoding request's capacity grown by its token, then
``update_context_resources`` over the step's context requests, then ``finish`` for those whose last
token was sampled. A step that preempts is not replayed: the replay ends there and the requests
looked up before it are compared (the simulator's preemption is vLLM's recompute; TensorRT-LLM's
own capacity scheduler is not modelled). ``--sessions-per-second`` thins the load (fewer running
at once, no preemption). Rows are written in the order the first chunks ran.

Prints, for each preset compared, how many requests get the same hit as the engine; ``--out``
writes the per-request hits (CSV).
"""

from __future__ import annotations

import argparse
import ast
import csv
import enum
import importlib.util
import sys
import types
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from sim.config import UNLIMITED, SimConfig, format_size, parse_size
from sim.errors import UsageError
from sim.replay.tokens import request_tokens
from sim.simulate import build
from traces.registry import TraceOptions, load_trace
from differential_report import Agreement, add_hash_block_tokens, des_events, served_hits, sim_events  # this folder

MODEL = "qwen3.5-9b"
RADIX = "tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py"
MANAGER = "tensorrt_llm/_torch/pyexecutor/kv_cache/mamba_cache_manager"
ATTN, SSM = 0, 1  # life cycles: one full-attention group, one recurrent (SSM) group


# ------------------------------------------------------------------ stubs of the radix tree's siblings


class _Ref:
    """``rawref.ref``: a callable reference (strong here: nothing is evicted, nothing must die)."""

    __slots__ = ("obj",)

    def __init__(self, obj=None) -> None:
        self.obj = obj

    def __call__(self):
        return self.obj

    def invalidate(self) -> None:
        self.obj = None

    def __class_getitem__(cls, item):
        return cls


class _Range(SimpleNamespace):
    pass


class _AttnLifeCycle:
    """Full attention: no window, no sinks, nothing stale."""

    window_size = None
    num_sink_blocks = 0

    def get_stale_range(self, num_tokens: int, tokens_per_block: int) -> _Range:
        return _Range(beg=0, end=0)


class _Registry:
    """``LifeCycleRegistry`` of a hybrid model: attention (0) and SSM (1)."""

    size = 2
    ssm_life_cycle_id = SSM

    def attention_life_cycles(self):
        yield ATTN, _AttnLifeCycle()


class _PageStatus(enum.Enum):
    LOCKED = 0
    HELD = 1
    DROPPABLE = 2


class _SsmLifeCycle:
    """The recurrent life cycle (not an ``AttnLifeCycle``: its page's eviction walks up the tree)."""


class Page:
    """A page of the engine's pools: its life cycle, the tokens of its block it covers
    (``CommittedPage.num_tokens_in_block``), the tree block it is committed to (``block``, a
    reference the engine's ``Block.replace_page`` sets), whether a request holds it."""

    __slots__ = ("life_cycle", "num_tokens_in_block", "block", "status", "held", "freed", "manager")

    def __init__(self, life_cycle: int, num_tokens_in_block: int, manager=None, held: bool = False) -> None:
        self.life_cycle = life_cycle
        self.num_tokens_in_block = num_tokens_in_block
        self.block = _Ref()
        self.status = _PageStatus.HELD
        self.held = held
        self.freed = False
        self.manager = manager

    @property
    def scheduled_for_eviction(self) -> bool:
        return self.manager is not None and self in self.manager.queue[self.life_cycle]


class OutOfPages(Exception):
    """The pool group has too few free and evictable pages (``OutOfPagesError``)."""


class PagePools:
    """The V2 storage manager's GPU level as far as eviction goes (``_storage_manager.py``,
    ``_eviction_controller.py``): one slot count per pool group (attention KV pages of
    ``tokens_per_block`` tokens, recurrent-state pages), and per group an LRU queue of the
    committed pages no request holds (``PerLevelEvictionController``: one
    ``PrioritizedLRUEvictionPolicy`` per pool group; a page released is appended, a victim is
    taken from the front). ``slots`` None: unlimited (no eviction)."""

    def __init__(self, rt, slots: dict[int, int] | None) -> None:
        self.rt = rt
        self.free = {lc: (float("inf") if slots is None else slots[lc]) for lc in (ATTN, SSM)}
        self.queue: dict[int, dict[Page, None]] = {ATTN: {}, SSM: {}}
        self.evicted = Counter()  # pages taken from the queues
        self.dropped = Counter()  # pages freed with a block removed by an eviction

    # -- the engine's Block calls these
    def exclude_from_eviction(self, page: Page) -> None:
        self.queue[page.life_cycle].pop(page, None)

    # -- slots
    def new(self, lc: int, n_tokens: int, held: bool) -> Page:
        self.alloc(lc, 1)
        return Page(lc, n_tokens, self, held)

    def alloc(self, lc: int, n: int) -> None:
        """``StorageManager.new_slots`` -> ``_prepare_free_slots``: the shortfall is counted first,
        that many pages are taken from the queue's front at once (``evict(min_num_pages)``), then
        dropped; a dropped attention page removes its block's subtree, whose pages free more."""
        short = n - self.free[lc]
        if short > 0:
            queue = self.queue[lc]
            if short > len(queue):
                raise OutOfPages(f"life cycle {lc}: {n} pages asked, {self.free[lc]} free, {len(queue)} evictable")
            victims = []
            for page in list(queue)[:short]:
                del queue[page]
                victims.append(page)
            self.evicted[lc] += len(victims)
            for page in victims:
                self._drop(page)
        self.free[lc] -= n

    def release_slot(self, page: Page) -> None:
        if not page.freed:
            self.exclude_from_eviction(page)
            page.freed = True
            self.free[page.life_cycle] += 1

    def in_tree(self, page: Page) -> bool:
        block = page.block()
        return block is not None and self.rt.try_get_tree(block) is not None and block.get_page(page.life_cycle) is page

    def release(self, page: Page) -> None:
        """A request lets go of ``page``: a committed page still in the tree becomes droppable
        and is appended to its queue (``schedule_for_eviction``); any other is freed."""
        page.held = False
        if self.in_tree(page):
            self.exclude_from_eviction(page)
            self.queue[page.life_cycle][page] = None
        else:
            self.release_slot(page)

    def hold(self, page: Page) -> None:
        page.held = True
        self.exclude_from_eviction(page)

    def settle(self, page: Page | None) -> None:
        """A page no longer in the tree that no request holds is freed (its owner went away)."""
        if page is not None and not page.held and not self.in_tree(page):
            self.release_slot(page)

    def _free_block_pages(self, block) -> None:
        for lc in (ATTN, SSM):
            page = block.get_page(lc)
            if page is not None and not page.held:
                self.dropped[lc] += 1
                self.release_slot(page)

    def _drop(self, page: Page) -> None:
        """The engine's ``CommittedPage`` dying: ``Block.unlink_page`` then
        ``clear_stale_blocks_after_page_unlink`` (``_block_radix_tree.py``): full attention removes
        the block's whole subtree (``remove_subtree``); a recurrent page's block, and the
        ancestors that are left as leaves without a recurrent page, are detached."""
        rt = self.rt
        self.release_slot(page)
        block = page.block()
        if block is None or block.get_page(page.life_cycle) is not page:
            return
        if page.life_cycle == ATTN:
            doomed = list(rt.traverse_post_order(block))
            block.unlink_page(ATTN)
            rt.Block.clear_stale_blocks_after_page_unlink(block, ATTN, _AttnLifeCycle())
            for b in doomed:
                self._free_block_pages(b)
        else:
            chain = []
            b = block
            while isinstance(b, rt.Block):
                chain.append(b)
                b = b._prev()
            block.unlink_page(SSM)
            rt.Block.clear_stale_blocks_after_page_unlink(block, SSM, _SsmLifeCycle())
            for b in chain:
                if rt.try_get_tree(b) is None:
                    self._free_block_pages(b)


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def load_radix_tree(root: Path) -> types.ModuleType:
    """The engine's ``_block_radix_tree`` module, imported from ``root`` with stubbed siblings."""
    path = root / RADIX
    if not path.is_file():
        raise SystemExit(f"--trtllm {root}: no {RADIX} in it")
    pkg = "tensorrt_llm.runtime.kv_cache_manager_v2"
    for name in ("tensorrt_llm", "tensorrt_llm.runtime"):
        _module(name, __path__=[])
    package = _module(pkg, __path__=[str(path.parent)])
    package.rawref = _module(f"{pkg}.rawref", ref=_Ref, NULL=_Ref())
    _module(
        f"{pkg}._common",
        NDEBUG=False,  # run the engine's debug checks too
        BlockOrdinal=int,
        PageStatus=_PageStatus,
        TokenId=int,
        TokenIdExt=int,
    )
    _module(
        f"{pkg}._life_cycle_registry",
        AttnLifeCycle=_AttnLifeCycle,
        LifeCycle=object,
        LifeCycleId=int,
        LifeCycleRegistry=_Registry,
    )
    _module(
        f"{pkg}._utils",
        TypedIndexList=list,
        filled_list=lambda value, n: [value] * n,
        map_optional=lambda x, f: None if x is None else f(x),
        typed_range=range,
        unwrap_rawref=lambda r: r() if r() is not None else (_ for _ in ()).throw(ValueError("dangling rawref")),
    )
    spec = importlib.util.spec_from_file_location(f"{pkg}._block_radix_tree", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_methods(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """The functions ``names`` defined in ``path`` (inside any class), compiled in ``namespace``."""
    if not path.is_file():
        raise SystemExit(f"--trtllm: no {path}")
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names and node.name not in found:
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
            found[node.name] = namespace[node.name]
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"{path}: no {', '.join(sorted(missing))} in it")
    return found


# ------------------------------------------------------------------ the per-request KV cache (C++ rule)


class EngineKvCache:
    """The commit rule of TensorRT-LLM's ``KvCache`` (``kvCache.cpp``) with
    ``commit_min_snapshot`` (the V2 Mamba manager sets it): what a request puts into the engine's
    radix tree, and the pages it holds meanwhile (``_core/_kv_cache.py``, the Python twin of the
    C++ class). Tree blocks are the engine's own (``Block``); pages are ``Page`` records drawn
    from ``PagePools``.

    Pages: the request holds one attention page per block of its capacity (the matched blocks'
    committed pages, ``_setup_for_reuse``, and private pages ``resize`` allocates as the capacity
    grows; a block it commits keeps its page, now the tree's) and one private recurrent page (the
    live state). ``resume`` copies the matched partial block and the matched snapshot into private
    pages and lets the two tree pages go. A snapshot put into the tree (a recurrent page, or a
    partial block's KV copy) is a new page no request holds. ``close`` releases the blocks'
    pages last block first (``_clear_blocks``: "drop the last block first"), then the state."""

    ALLOWED, VIRTUAL_STOP, USER_STOP = "allowed", "virtual_stop", "user_stop"

    def __init__(self, rt, tree, tokens_per_block: int, match, pools: PagePools) -> None:
        self.rt, self.tree, self.tpb, self.pools = rt, tree, tokens_per_block, pools
        self.root = tree.add_or_get_existing(rt.ReuseScope())
        # _setupForReuse: committed = the matched tokens, whole blocks counted as committed
        self.committed: list[int] = []
        remaining = match.num_tokens
        for block in match.blocks:
            take = min(remaining, len(block.tokens))
            self.committed.extend(block.tokens[:take])
            remaining -= take
        self.num_committed_blocks = match.num_tokens // tokens_per_block
        # resume() clears the partial last matched block: it is recomputed into a private page
        self.tree_blocks = dict(enumerate(match.blocks[: self.num_committed_blocks]))
        self.pages: list[Page] = []  # the attention page of each block of the capacity
        matched = [block.get_page(ATTN) for block in match.blocks]
        snapshot = match.blocks[-1].get_page(SSM) if match.blocks else None
        for page in matched + [snapshot]:
            if page is not None:
                pools.hold(page)
        self.pages = matched[: self.num_committed_blocks]
        # resume(): the live state and the partial block's private copy, then the tree's pages go
        self.state = pools.new(SSM, 0, held=True)
        if len(matched) > self.num_committed_blocks:
            self.pages.append(pools.new(ATTN, 0, held=True))
        for page in matched[self.num_committed_blocks :] + [snapshot]:
            if page is not None:
                pools.release(page)
        self.commit_state = self.ALLOWED
        self.history_length = self.capacity = match.num_tokens
        self.is_active = True
        self.enable_swa_scratch_reuse = False

    @property
    def num_committed_tokens(self) -> int:
        return len(self.committed)

    def resize(self, capacity, history_length=None) -> bool:
        if capacity is not None and capacity > self.capacity:
            blocks = -(-capacity // self.tpb)
            if blocks > len(self.pages):
                n = blocks - len(self.pages)
                self.pools.alloc(ATTN, n)
                self.pages.extend(Page(ATTN, 0, self.pools, True) for _ in range(n))
            self.capacity = capacity
        if history_length is not None:
            self.history_length = max(self.history_length, history_length)
        return True

    def close(self) -> None:
        """``close``: stop committing, then release the blocks' pages last block first, then
        the live state (freed: it was never committed)."""
        self.stop_committing()
        while self.pages:
            self.pools.release(self.pages.pop())
        self.pools.release(self.state)
        self.is_active = False

    def _prev(self, ordinal: int):
        return self.root if ordinal == 0 else self.tree_blocks[ordinal - 1]

    def _add_or_get(self, prev, tokens):
        """``addOrGetExistingBlock``: a new block, or the existing one with these tokens or a
        longer sibling covering them (the engine's ``Block`` raises ``UselessBlockError``). A new
        block replacing a shorter partial sibling adopts its pages; those it cannot adopt go."""
        before = dict(prev.next)
        try:
            block = self.rt.Block(tokens, prev)
        except self.rt.UselessBlockError as e:
            return e.block, False
        for key, gone in before.items():
            if key not in prev.next:
                for lc in (ATTN, SSM):
                    page = gone.get_page(lc)
                    if page is not None:
                        gone.unlink_page(lc)
                        self.pools.settle(page)
        return block, True

    def _install(self, block, page: Page) -> bool:
        """``convertToCommitted`` / ``_copyPageToTreeBlock``: ``page`` goes into the block over a
        page covering fewer tokens (``can_replace_page``), which goes unless a request holds it."""
        if not block.can_replace_page(page.life_cycle, page.num_tokens_in_block):
            return False
        old = block.get_page(page.life_cycle)
        block.replace_page(page.life_cycle, page)
        self.pools.settle(old)
        return True

    def _snapshot_ssm(self, block, num_tokens: int) -> None:
        """``_snapshotSsmToTreeBlock``: a copy of the recurrent state after ``num_tokens`` tokens
        in a new page, unless the block already holds one at least as deep."""
        in_block = num_tokens - block.ordinal * self.tpb
        assert 0 < in_block <= self.tpb
        if block.page_coverage(SSM) >= in_block:
            return
        page = self.pools.new(SSM, in_block, held=False)
        if self._install(block, page):
            self.pools.release(page)
        else:
            self.pools.release_slot(page)

    def _commit_block(self, ordinal: int, is_last: bool, commit_ssm: bool = False) -> None:
        assert self.commit_state == self.ALLOWED and ordinal == self.num_committed_blocks
        start = ordinal * self.tpb
        tokens = self.committed[start : start + self.tpb]
        is_full = len(tokens) == self.tpb
        if not is_last and not is_full:
            raise RuntimeError("Cannot commit block that is not full except last block")
        block, is_new = self._add_or_get(self._prev(ordinal), tokens)
        own = self.pages[ordinal]
        own.num_tokens_in_block = len(tokens)
        did_commit = False
        if is_new:
            self._install(block, own)
            did_commit = True
        elif block.is_full and is_full:  # rebase onto the existing block (allowSeqRebasing)
            if block.page_coverage(ATTN) < len(tokens):
                self._install(block, own)
            else:  # the request takes the tree's page; its own goes
                tree_page = block.get_page(ATTN)
                self.pools.hold(tree_page)
                self.pages[ordinal] = tree_page
                own.held = False
                self.pools.release_slot(own)
            did_commit = True
        else:  # cannot commit and cannot reuse the existing block: stop committing
            self.commit_state = self.VIRTUAL_STOP
        if did_commit:
            self.tree_blocks[ordinal] = block
            self.num_committed_blocks += 1
            if commit_ssm:
                self._snapshot_ssm(block, start + len(tokens))
        if is_last or self.commit_state == self.VIRTUAL_STOP:
            self.commit_state = self.USER_STOP

    def _snapshot_partial(self, ordinal: int, commit_ssm: bool) -> None:
        """``_snapshotPartialBlockToTree``: the committed tokens of a partial last block go into the
        tree (as a new partial block, or onto the existing block or longer sibling covering them)
        as a copy of their KV in a new page and, if asked, the recurrent state at their end; the
        block stays uncommitted for this request."""
        start = ordinal * self.tpb
        tokens = self.committed[start : start + self.tpb]
        assert 0 < len(tokens) < self.tpb
        block, _ = self._add_or_get(self._prev(ordinal), tokens)
        if block.page_coverage(ATTN) < len(tokens):
            page = self.pools.new(ATTN, len(tokens), held=False)
            self._install(block, page)
            self.pools.release(page)
        if commit_ssm:
            self._snapshot_ssm(block, start + len(tokens))

    def commit(self, tokens, is_end: bool = False) -> None:
        if not tokens:
            if is_end:
                self.stop_committing()
            return
        if self.commit_state == self.USER_STOP:
            raise RuntimeError("Cannot commit tokens after stop_committing()")
        n = len(self.committed) + len(tokens)
        self.history_length = max(self.history_length, n)
        self.committed.extend(tokens)
        if self.commit_state == self.VIRTUAL_STOP:
            if is_end:
                self.commit_state = self.USER_STOP
            return
        full = n // self.tpb
        partial = n % self.tpb != 0
        if full > self.num_committed_blocks or partial:
            ssm_ordinal = (n - 1) // self.tpb  # the block whose end is the last committed token
            for ordinal in range(self.num_committed_blocks, full):
                self._commit_block(ordinal, False, ordinal == ssm_ordinal)
                if self.commit_state != self.ALLOWED:
                    break
            if partial and self.commit_state == self.ALLOWED:
                if is_end:
                    self._commit_block(full, True, True)
                else:
                    self._snapshot_partial(full, True)
        if is_end and self.commit_state != self.USER_STOP:
            self.stop_committing()

    def stop_committing(self) -> None:
        if self.commit_state == self.USER_STOP:
            return
        if self.commit_state == self.VIRTUAL_STOP:
            self.commit_state = self.USER_STOP
            return
        if len(self.committed) - self.num_committed_blocks * self.tpb > 0:
            self._commit_block(self.num_committed_blocks, True)
        else:
            self.commit_state = self.USER_STOP


# ------------------------------------------------------------------ the manager around it


class _Request:
    """The fields of ``LlmRequest`` the manager's methods read."""

    def __init__(self, rid: int, prompt: list[int]) -> None:
        self.py_request_id = rid
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.expect_snapshot_points: list[int] = []
        self.context_current_position = 0
        self.is_dummy_request = False

    @property
    def context_remaining_length(self) -> int:
        return self.prompt_len - self.context_current_position

    def get_tokens(self, beam: int) -> list[int]:
        return self.prompt


class EngineHarness:
    """``MambaHybridCacheManagerV2`` as far as block reuse goes: the engine's methods, bound to a
    stub ``self`` holding the engine's radix tree."""

    def __init__(
        self, root: Path, tokens_per_block: int, interval: int, from_start, from_end, slots: dict[int, int] | None
    ) -> None:
        self.rt = load_radix_tree(root)
        policy = SimpleNamespace(ALL_REUSABLE="all_reusable", PER_REQUEST="per_request")
        namespace = {
            "List": list,
            "LlmRequest": _Request,
            "ScheduledRequests": SimpleNamespace,
            "DEFAULT_BEAM_INDEX": 0,
            "BlockReusePolicy": policy,
        }
        manager_dir = root / MANAGER
        self.m = load_methods(manager_dir / "common.py", ("prepare_expect_snapshot_points",), dict(namespace))
        self.m |= load_methods(
            manager_dir / "mamba_cache_manager_v2.py",
            ("update_context_resources", "try_commit_blocks", "_mark_context_position_as_history"),
            dict(namespace),
        )
        self.tpb = tokens_per_block
        self.tree = self.rt.BlockRadixTree(_Registry(), tokens_per_block)
        self.pools = PagePools(self.rt, slots)
        state = SimpleNamespace(
            periodic_snapshot_interval=interval,
            additional_snapshot_offsets_from_start=list(from_start),
            additional_snapshot_offsets_from_end=list(from_end),
        )
        self.self_ = SimpleNamespace(
            enable_block_reuse=True,
            is_draft=False,
            local_num_mamba_layers=1,
            kv_cache_config=SimpleNamespace(mamba_state_config=state),
            _supports_additional_snapshot_offsets=True,  # the V2 manager
            block_reuse_policy=policy.PER_REQUEST,  # the V2 manager turns ALL_REUSABLE into PER_REQUEST
            conversation_manager=None,
            _branch_snapshot_points={},  # enable_branch_snapshot off (the default)
            _branch_snapshots_taken_total=0,
            kv_cache_map={},
            _augment_tokens_for_block_reuse=lambda tokens, request, start, end: list(tokens[start:end]),
        )
        for name in ("try_commit_blocks", "_mark_context_position_as_history"):
            setattr(self.self_, name, types.MethodType(self.m[name], self.self_))
        self.live: dict[int, _Request] = {}  # requests matched and not yet freed

    def begin(self, rid: int, prompt: list[int]) -> int:
        """``prepare_context``'s first chunk: the snapshot points set, the prompt minus its last
        token matched, the request's cache created (it holds the matched pages and its live state
        from now on); the hit tokens."""
        req = _Request(rid, prompt)
        self.m["prepare_expect_snapshot_points"](self.self_, [req])
        match = self.tree.match(self.rt.ReuseScope(), prompt[:-1], enable_partial_match=True)
        kv = EngineKvCache(self.rt, self.tree, self.tpb, match, self.pools)
        self.self_.kv_cache_map[rid] = kv
        self.live[rid] = req
        req.context_current_position = match.num_tokens
        return match.num_tokens

    def prefill(self, rid: int, chunk: int) -> None:
        """The request's context: chunks ending at every snapshot point past its hit, every
        ``chunk`` tokens and at the prompt end, each resized before its forward and committed after
        it (``update_context_resources``)."""
        req, kv = self.live[rid], self.self_.kv_cache_map[rid]
        hit = req.context_current_position
        ends = {p for p in req.expect_snapshot_points if p > hit}
        ends.update(range(hit + chunk, req.prompt_len, chunk))
        ends.add(req.prompt_len)
        batch = SimpleNamespace(context_requests=[req])
        for end in sorted(ends):
            kv.resize(end)  # prepare_resources: the chunk's capacity before its forward
            req.context_current_position = end
            self.m["update_context_resources"](self.self_, batch)

    def finish(self, rid: int, output_len: int) -> None:
        """The decode and ``free_resources``: the capacity grows to input + output - 1 (the last
        sampled token is never run; no page is released meanwhile, so growing at once evicts what
        growing token by token does), one more ``try_commit_blocks``, then ``close``."""
        req = self.live.pop(rid)
        kv = self.self_.kv_cache_map.pop(rid)
        kv.resize(req.prompt_len + max(output_len - 1, 0))
        self.m["try_commit_blocks"](self.self_, req, kv)
        kv.close()

    def serve(self, rid: int, prompt: list[int], output_len: int, chunk: int) -> int:
        """One request through the manager (prefill, then its decode's capacity); its hit tokens."""
        hit = self.begin(rid, prompt)
        self.prefill(rid, chunk)
        self.finish(rid, output_len)
        return hit

    def run_events(self, events, prompts: list[list[int]], outs: list[int], chunk: int) -> dict[int, int]:
        """The simulator's ``--scheduler fcfs`` run through the manager, its ``Lookup``,
        ``Prefill`` and ``Decode`` events in the order it emitted them: the match (``begin``) at the
        request's lookup, its whole chunked prefill with its commits when the simulator's prefill
        ended (just before the preset's prefill insert), its decode's growth and its release when
        its decode ended (just before the end insert). Requests overlap as in the simulator: those
        looked up and waiting hold their matched pages and live state, one prefills, others
        decode. Returns the engine's hit per request id."""
        from sim.engine.events import Decode, Lookup, Prefill  # noqa: PLC0415

        hits: dict[int, int] = {}
        for ev in events:
            rid = int(ev.request.request_id)
            if isinstance(ev, Lookup):
                if rid in hits:
                    raise RuntimeError(f"request {rid} looked up twice")
                hits[rid] = self.begin(rid, prompts[rid])
            elif isinstance(ev, Prefill):
                self.prefill(rid, chunk)
            elif isinstance(ev, Decode):
                self.finish(rid, outs[rid])
        if self.live:
            raise RuntimeError(f"{len(self.live)} requests never finished")
        return hits

    def run_steps(self, steps, prompts: list[list[int]], outs: list[int], probe=None) -> tuple[dict[int, int], Counter]:
        """The simulator's ``--scheduler continuous`` steps (``Step`` events, in order) through the
        manager. Per step, as ``KVCacheV2Scheduler._schedule_loop`` goes over the active requests
        (the running ones in the order they came, then the new ones): a decoding request's capacity
        grown by its token, a context request's chunk (a first chunk is its ``prepare_context``
        match, ``begin``, so it sees what earlier steps committed and nothing of this one) with its
        capacity grown to the chunk's end; after the forward ``update_context_resources`` over the step's
        context requests (commits at the snapshot points a chunk ended on, ``stop_committing`` at
        the prompt's end); a request whose last token was sampled in the step is freed
        (``finish``). A step that preempts ends the replay (odd ``preempted at``). The chunks are
        the simulator's (its ``schedule_chunk`` ends them at the snapshot points, the engine's
        FORCE_CHUNK); ``probe(event, self)``, if given, after each
        event. Returns the engine's hit per request id and the odd cases (``start``: the engine's
        hit is not where the simulator's first chunk starts)."""
        from sim.engine.events import Step  # noqa: PLC0415

        hits: dict[int, int] = {}
        odd: Counter = Counter()
        decoded: dict[int, int] = {}  # decode steps run so far, per running request
        admitted: dict[int, int] = {}  # the order requests were first scheduled (the active list's)
        for ev in steps:
            if not isinstance(ev, Step):
                continue
            if ev.preempted:  # not replayed: the engine stops there (its live requests never finish)
                odd["preempted at"] = ev.t_start
                # a request the simulator preempts, here or later, has its hit from its lookup after
                again = {int(rid) for e in steps if isinstance(e, Step) for rid in e.preempted}
                for rid in again:
                    odd["preempted"] += hits.pop(rid, None) is not None
                break
            for _ in range(ev.steps):
                context, done = [], []
                # ``KVCacheV2Scheduler._schedule_loop``: one pass over the active requests in the
                # order they came (the running ones, then the new): a generation request's token
                # allocated, a context request's ``prepare_context`` (its match, on its first
                # chunk) and ``resize_context``, each in turn
                work = sorted(
                    [(admitted[rid], 0, rid, b) for rid, _a, b in ev.prefills if rid in self.live]
                    + [(admitted[rid], 1, rid, 0) for rid, _ctx in ev.decodes]
                )
                work += [(None, 0, rid, b) for rid, _a, b in ev.prefills if rid not in self.live]
                for _order, kind, rid, b in work:
                    if kind == 1:
                        req = self.live[rid]
                        decoded[rid] += 1
                        # decode step d runs the d-th sampled token (capacity input + d) and
                        # samples the (d + 1)-th: the request ends when that is its last
                        self.self_.kv_cache_map[rid].resize(req.prompt_len + decoded[rid])
                        if decoded[rid] + 1 >= outs[rid]:
                            done.append(rid)
                        continue
                    if rid not in self.live:
                        if rid in hits:
                            raise RuntimeError(f"request {rid} looked up twice")
                        hits[rid] = self.begin(rid, prompts[rid])
                        first = next(a for r, a, _b in ev.prefills if r == rid)
                        odd["start"] += hits[rid] != first
                        decoded[rid] = 0
                        admitted[rid] = len(admitted)
                    req = self.live[rid]
                    if b <= req.context_current_position:  # the engine's hit lies past this chunk
                        odd["skipped"] += 1
                        continue
                    self.self_.kv_cache_map[rid].resize(b)
                    req.context_current_position = b
                    context.append(req)
                self.m["update_context_resources"](self.self_, SimpleNamespace(context_requests=context))
                for req in context:
                    if req.context_remaining_length == 0:  # the prompt's last chunk samples a token
                        if outs[req.py_request_id] <= 1:
                            done.append(req.py_request_id)
                for rid in done:
                    decoded.pop(rid)
                    self.finish(rid, outs[rid])
            if probe is not None:  # a caller's look at the engine after each step event
                probe(ev, self)
        odd["unfinished"] = len(self.live)
        if "preempted at" in odd:  # the live requests' hits stand, the rest were never looked up
            self.live.clear()
        return hits, odd


# ------------------------------------------------------------------ the two sides


def prompts(trace) -> list[list[int]]:
    """Each request's prompt as token ids (hash-block traces: drawn from the hashes). Ids the
    engine's block hash refuses (``Hasher.update`` packs each token in 4 bytes, ``0 <= id <
    2**31``: a trace spelled out by ``--hash-block-tokens`` numbers its tokens from 2**40 up) are
    renumbered, the same id for the same token, so equal tokens stay equal and different ones
    different: the radix tree compares nothing else."""
    B = trace.block_tokens
    out = []
    for r in trace.requests:
        n_in = r.n_input_tokens(B)
        toks = request_tokens(r.input_tokens, [], block_tokens=B, input_len=n_in, output_len=0)
        out.append([int(t) for t in toks[:n_in]])
    if any(t >= 1 << 31 for p in out for t in p):
        ids: dict[int, int] = {}
        out = [[ids.setdefault(t, len(ids)) for t in p] for p in out]
    return out


def sim_config(policy: str, knobs: dict, chunk: int, capacity: int, scheduler: str) -> SimConfig:
    """The simulator's run: sequential mode, or ``des`` mode with the fcfs queue (one server)."""
    extra = {} if scheduler == "sequential" else {"scheduler": scheduler}
    return SimConfig(
        policy=policy,
        model=MODEL,
        capacity_bytes=capacity,
        mode="sequential" if scheduler == "sequential" else "des",
        prefill_chunk_tokens=chunk,
        **extra,
        **knobs,
    )


def sim_hits(trace, config: SimConfig) -> tuple[list[int], np.ndarray, list | None]:
    """Hit tokens per request of ``config``'s preset in the order it serves them, that order, and
    (fcfs) its lookup, prefill and decode events in the order emitted (``sim_events``): sequential
    mode serves in arrival order; fcfs in the order its prefills ran."""
    if config.mode == "sequential":
        hits, order, _ = served_hits(trace, config)
        return hits, order, None
    from sim.engine.events import Prefill, Step  # noqa: PLC0415

    if config.scheduler == "continuous":  # its steps; rows in the order the first chunks ran
        by_id, events, _ = des_events(trace, config, (Step,))
        first = dict.fromkeys(int(rid) for e in events for rid, _a, _b in e.prefills)
        order = np.array([i for i in first if i in by_id])
        return [by_id[i] for i in order], order, events
    by_id, events, _ = sim_events(trace, config)
    order = np.array([int(e.request.request_id) for e in events if isinstance(e, Prefill)])
    return [by_id[i] for i in order], order, events


def model_bytes(trace) -> tuple[int, int]:
    """The simulator's KV bytes per token and bytes per recurrent state of ``MODEL``."""
    sim = build(trace, SimConfig(policy="trtllm", model=MODEL, capacity_bytes=UNLIMITED, mode="sequential"))
    return int(sim.tree.kv_bytes_per_token), int(sim.tree.state_bytes)


def pool_slots(
    capacity: int, kv_bytes_per_token: int, state_bytes: int, tokens_per_block: int, avg_seq_len: int, n_fixed: int
) -> dict[int, int]:
    """The engine's split of a GPU quota of ``capacity`` bytes between its two pool groups.

    ``MambaHybridCacheManagerV2._build_cache_config`` describes a typical step as, per resident
    request, ``1 + fixed_rules`` descriptors sharing ``avg_seq_len`` tokens
    (``_typical_request_descs``: one per live recurrent state; periodic snapshots add none), and
    ``StorageManager.ratio_from_batch`` splits the quota by the bytes that step needs
    (``_compute_slots_for_batch``: ``ceil(capacity / tokens_per_block)`` attention pages per
    descriptor, one recurrent page per descriptor). The bytes are the simulator's: an attention page
    is ``tokens_per_block`` tokens of KV, a recurrent page one state. Left out: the pools' rounding to
    the GPU granularity (2 MiB and up) and the CUDA-graph dummy slots (a few states), the
    ``constraints`` floors, and the rebalancing (after 2,000 closed requests and 120 s)."""
    n_states = 1 + n_fixed
    per, extra = divmod(avg_seq_len, n_states)
    pages = sum(-(-(per + (i < extra)) // tokens_per_block) for i in range(n_states))
    attn_page = tokens_per_block * kv_bytes_per_token
    attn_bytes, ssm_bytes = pages * attn_page, n_states * state_bytes
    attn_share = attn_bytes / (attn_bytes + ssm_bytes)
    return {ATTN: int(capacity * attn_share // attn_page), SSM: int(capacity * (1 - attn_share) // state_bytes)}


def offsets(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trtllm", required=True, help="folder holding TensorRT-LLM's tensorrt_llm/ files (see above)")
    ap.add_argument("--trace", default="sharegpt", help="sharegpt (Qwen3.5 tokens) or mooncake:sample")
    ap.add_argument("--sessions", type=int, default=100)
    add_hash_block_tokens(ap)
    ap.add_argument("--tokens-per-block", type=int, default=32, help="the engine's tokens_per_block")
    ap.add_argument("--prefill-chunk", type=int, default=8192)
    ap.add_argument("--periodic-snapshot-interval", type=int, default=0)
    ap.add_argument("--additional-snapshot-offsets-from-start", default="")
    ap.add_argument("--additional-snapshot-offsets-from-end", default="")
    ap.add_argument("--policies", default="trtllm")
    ap.add_argument(
        "--scheduler",
        default="sequential",
        choices=("sequential", "fcfs", "continuous"),
        help="the simulator's mode: sequential, or des with the fcfs queue (one server) or continuous batching "
        "(its steps: chunks, decodes)",
    )
    ap.add_argument(
        "--sessions-per-second",
        type=float,
        default=0,
        help="fcfs / continuous: sessions started per second (0: the simulator's default); fewer run at once",
    )
    ap.add_argument(
        "--capacity",
        default="",
        help="cache bytes (the simulator's --capacity, e.g. 2GB); the engine's pools split it (default: unlimited)",
    )
    ap.add_argument(
        "--avg-seq-len",
        type=int,
        default=0,
        help="kv_cache_config.avg_seq_len, which sizes the engine's pools (default: the trace's mean input + output)",
    )
    ap.add_argument("--out", default="", help="CSV of per-request hits (request, input tokens, engine, presets)")
    args = ap.parse_args()
    root = Path(args.trtllm)
    trace = load_trace(args.trace, TraceOptions(sessions=args.sessions, hash_block_tokens=args.hash_block_tokens))
    print(
        f"trace: {args.trace}, {len(trace.requests)} requests, {trace.n_sessions} sessions; "
        f"tokens_per_block {args.tokens_per_block}, periodic {args.periodic_snapshot_interval}, "
        f"from start [{args.additional_snapshot_offsets_from_start}], "
        f"from end [{args.additional_snapshot_offsets_from_end}]"
    )
    knobs = {
        "periodic_snapshot_interval": args.periodic_snapshot_interval,
        "additional_snapshot_offsets_from_start": args.additional_snapshot_offsets_from_start,
        "additional_snapshot_offsets_from_end": args.additional_snapshot_offsets_from_end,
    }
    if args.sessions_per_second:
        knobs["sessions_per_second"] = args.sessions_per_second
    capacity, slots = UNLIMITED, None
    B = trace.block_tokens
    outs = [r.n_output_tokens(B) for r in trace.requests]
    if args.capacity:
        try:
            capacity = parse_size(args.capacity)
        except UsageError as e:
            print(e, file=sys.stderr)
            raise SystemExit(2) from None
        kv_per_token, state_bytes = model_bytes(trace)
        avg = args.avg_seq_len or round(np.mean([r.n_input_tokens(B) + o for r, o in zip(trace.requests, outs)]))
        n_fixed = len(offsets(args.additional_snapshot_offsets_from_start)) + len(
            offsets(args.additional_snapshot_offsets_from_end)
        )
        slots = pool_slots(capacity, kv_per_token, state_bytes, args.tokens_per_block, avg, n_fixed)
        # the simulator gets the two pools the engine ends up with, not the quota they are carved
        # from: the engine floors each pool to whole slots, and what is left goes to neither
        pools = slots[ATTN] * args.tokens_per_block * kv_per_token + slots[SSM] * state_bytes
        print(
            f"capacity {format_size(capacity)}: KV {kv_per_token:,} B/token, a state {format_size(state_bytes)}; "
            f"avg_seq_len {avg}: the engine's pools hold {slots[ATTN]:,} attention pages "
            f"({slots[ATTN] * args.tokens_per_block:,} tokens) and {slots[SSM]:,} recurrent pages; "
            f"the simulator gets the same pools: --capacity {pools}B --state-pool {slots[SSM]}"
        )
        capacity = pools
        knobs["state_pool"] = str(slots[SSM])  # the recurrent pool; KV gets the rest, as the engine's pages
    results, order, events = {}, None, {}
    if args.scheduler != "sequential" and "," in args.policies:
        raise SystemExit(
            f"--scheduler {args.scheduler}: one preset at a time (the engine follows that preset's events)"
        )
    for policy in args.policies.split(","):
        config = sim_config(policy, knobs, args.prefill_chunk, capacity, args.scheduler)
        results[policy], order, events[policy] = sim_hits(trace, config)
    toks = prompts(trace)

    def engine_run(events) -> list[int]:
        """The engine's hit per request in ``order``: served whole one by one (sequential), or
        through a preset's fcfs events (the requests overlap as in the simulator)."""
        engine = EngineHarness(
            root,
            args.tokens_per_block,
            args.periodic_snapshot_interval,
            offsets(args.additional_snapshot_offsets_from_start),
            offsets(args.additional_snapshot_offsets_from_end),
            slots,
        )
        try:
            if events is None:
                eng = [engine.serve(int(i), toks[i], outs[i], args.prefill_chunk) for i in order]
            elif args.scheduler == "continuous":
                by_id, odd = engine.run_steps(events, toks, outs)
                n_steps = sum(e.steps for e in events)
                print(
                    f"{n_steps:,} steps; first chunks not at the engine's hit {odd['start']} (chunks skipped "
                    f"{odd['skipped']}), unfinished {odd['unfinished']}"
                )
                if "preempted at" in odd:
                    print(
                        f"the simulator preempted requests at t = {odd['preempted at']:.3f} s (not replayed): "
                        f"compared, the {len(by_id):,} requests looked up before, less the {odd['preempted']} of them "
                        "it preempts (looked up again after)"
                    )
                eng = [by_id.get(int(i), -1) for i in order]
            else:
                by_id = engine.run_events(events, toks, outs, args.prefill_chunk)
                eng = [by_id[int(i)] for i in order]
        except OutOfPages as e:
            print(f"--capacity {args.capacity}: the engine's pools ran dry ({e})", file=sys.stderr)
            raise SystemExit(2) from None
        if slots is not None:
            pools = engine.pools
            print(
                f"engine evictions: {pools.evicted[ATTN]:,} attention pages and {pools.evicted[SSM]:,} recurrent "
                f"pages taken from the queues; {pools.dropped[ATTN]:,} / {pools.dropped[SSM]:,} more freed with "
                "their blocks"
            )
        return eng

    eng = None
    for policy, hits in results.items():
        if eng is None or events[policy] is not None:  # sequential: one engine run serves every preset
            eng = engine_run(events[policy])
        kept = [k for k in range(len(eng)) if eng[k] >= 0]  # continuous: up to a preemption
        agreement = Agreement.of([hits[k] for k in kept], [eng[k] for k in kept])
        print(agreement.line(policy, 24))
        for k in (kept[j] for j in agreement.differing[:8]):
            print(f"  request {order[k]} (input {len(toks[order[k]])}): simulator {hits[k]}, engine {eng[k]}")
    if args.out:
        with open(args.out, "x", newline="") as f:
            w = csv.writer(f)
            w.writerow(["request", "input_tokens", "engine", *results])
            for k, i in enumerate(order):
                w.writerow([int(i), len(toks[i]), eng[k], *(results[p][k] for p in results)])


if __name__ == "__main__":
    main()
