"""What the engine presets share: prefill step arithmetic, a two-heap LRU base, tail-first LRU.

Positions handed to the tree are symbols of the preset's grid (``ctx.block_tokens`` tokens each);
the engines' rules are stated in tokens, so each helper converts.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from policies.base import PATH_REFRESH, AdmissionContext, EngineRules, EvictionPolicy, PolicyPreset, eviction, knob
from policies.eviction import HeapEviction


#: the largest block a preset or ``--block-size`` may use, in tokens (``sim.cache.blocks`` hashes
#: blocks of up to this many tokens)
MAX_BLOCK_TOKENS = 4096


@dataclass(frozen=True)
class ChunkedPrefill:
    """Knobs of every engine admission: the chunked-prefill step."""

    prefill_chunk_tokens: int = knob(
        8192,
        "Chunked prefill: tokens per scheduled prefill step (engine presets place states at chunk ends).",
        flag="--prefill-chunk",
    )


@dataclass(frozen=True)
class Speculation:
    """Knob of the engine presets that model speculative decoding (``vllm``, ``sglang``, ``trtllm``)."""

    speculative_tokens: int = knob(
        0,
        "Speculative decoding (MTP / EAGLE): draft tokens per step K (vLLM num_speculative_tokens, SGLang "
        "--speculative-num-steps with top-k 1, TensorRT-LLM max_draft_len); 0 = off.",
        min=0,
    )


def verify_slots(k: int) -> int:
    """State slots a running request holds for the verify step of K draft tokens in SGLang and
    TensorRT-LLM: one intermediate state per verified token, K + 1 (SGLang ``MambaPool``'s
    ``intermediate_ssm_state_cache`` ``[layers, size + 1, speculative_num_draft_tokens, ...]``;
    TensorRT-LLM's intermediate buffer ``[layers, max_batch_size, max_draft_len + 1, ...]``)."""
    return k + 1 if k > 0 else 0


@dataclass(frozen=True)
class VllmBlocks(ChunkedPrefill):
    """Knobs of the block-based admissions: chunked prefill and the engine's block."""

    block_size: int = knob(
        0,
        "Block of block-based engine presets in tokens (vllm, vllm-0.11-*: 0 = derived per model, "
        "528 for qwen3.5-9b; lmdeploy, lmdeploy-0.16-pytorch: 0 = 64).",
    )


def input_tokens(ctx: AdmissionContext) -> int:
    """The prompt's length in tokens."""
    return ctx.input_tokens if ctx.input_tokens >= 0 else ctx.n_input * ctx.block_tokens


def full_tokens(ctx: AdmissionContext) -> int:
    """The tokens a finished request leaves in the cache (a partial last symbol counts its own)."""
    return ctx.full_tokens if ctx.full_tokens >= 0 else ctx.n_full * ctx.block_tokens


def stored_symbol(ctx: AdmissionContext, pos: int) -> int:
    """The first symbol boundary of the stored sequence at or past token position ``pos``, where
    an engine takes a state at ``pos``. Symbol j ends at j x ``block_tokens`` tokens, except past
    a hash-block prompt's partial last block (``ctx.full_cut``): the output's symbols start at the
    prompt's end, so a decode state's position counts from there and stays in the output (its
    ``pos // block_tokens`` would put it back inside the prompt)."""
    B = ctx.block_tokens
    cut = ctx.full_cut
    if cut is None or pos <= cut[1]:
        j = -(-pos // B)
        if cut is not None:
            j = min(j, cut[0])
    else:
        j = cut[0] + -(-(pos - cut[1]) // B)
    return min(j, ctx.n_full)


def chunk_ends(start: int, end: int, step: int) -> list[int]:
    """Ends of the non-final chunks of a prefill from ``start`` to ``end`` in steps of ``step``
    (same unit); the final chunk ends at ``end`` and is not listed."""
    step = max(step, 1)
    return list(range(start + step, end, step))


def down(pos_sym: int, step_tokens: int, ctx: AdmissionContext) -> int:
    """Largest multiple of ``step_tokens`` tokens at or below symbol position ``pos_sym``, in
    symbols (a step finer than a symbol is rounded up to one symbol)."""
    step_sym = max(step_tokens // ctx.block_tokens, 1)
    return pos_sym // step_sym * step_sym


@dataclass(frozen=True)
class StatePool:
    """Knob of the engine presets that keep states in their own pool."""

    state_pool: str = knob(
        "",
        "States' own pool for engine presets that have one (sglang*, lmdeploy*, trtllm): a count of "
        "states, or bytes with a unit, carved out of --capacity; empty = one budget.",
    )


@dataclass(frozen=True)
class EnginePreset(PolicyPreset):
    """An engine preset: the rules its cache follows (``rules``, read by
    ``sim.cache.engine_tree``)."""

    rules: EngineRules = field(default_factory=EngineRules)
    engine: str = "engine"

    def engine_rules(self, spec: Any, config: Any) -> EngineRules:
        return self.rules


class TwoHeapLRU(EvictionPolicy):
    """Lazily invalidated min-heaps of (key, created, version, node), one per list an engine keeps;
    a subclass says which lists a node belongs to and with what key (``keys``)."""

    refresh = PATH_REFRESH
    lists: tuple[str, ...] = ()

    def attach(self, tree):
        super().attach(tree)
        self._heaps: dict[str, list] = {name: [] for name in self.lists}
        self._alive = 0

    def keys(self, node) -> dict[str, tuple]:
        """The lists ``node`` is a candidate of now, with its sort key in each (lowest goes first)."""
        raise NotImplementedError

    def add(self, node):
        self._alive += 1
        self.update(node)

    def update(self, node):
        if node.parent is None:
            return
        for name, key in self.keys(node).items():
            heap = self._heaps[name]
            heapq.heappush(heap, (key, node.created, node.version, node))
            if len(heap) > 4 * self._alive + 1024:
                self._heaps[name] = heap = [e for e in heap if e[3].version == e[2] and e[3].parent is not None]
                heapq.heapify(heap)

    def remove(self, node):
        self._alive -= 1
        node.version += 1

    def top(self, name: str):
        """The valid head entry of list ``name`` (stale entries dropped), or None."""
        heap = self._heaps[name]
        while heap:
            key, _, version, node = heap[0]
            if version == node.version and node.parent is not None and name in self.keys(node):
                return heap[0]
            heapq.heappop(heap)
        return None

    def take(self, name: str):
        entry = self.top(name)
        if entry is None:
            return None
        heapq.heappop(self._heaps[name])
        return entry[3]


class LeafStateLists(TwoHeapLRU):
    """Two lists over the unlocked non-root nodes (SGLang's two LRU lists, TensorRT-LLM V2's two
    pool queues). ``kv``: leaves by KV recency, a leaf without a state first (nothing can hit it);
    ``state``: state holders by state recency, the shallower first at equal recency. Equally
    recent leaves go shallower first, or deeper first where ``LEAF_TIE`` is -1."""

    lists = ("kv", "state")
    LEAF_TIE = 1  # -1: among equally recent leaves the deeper goes first

    def keys(self, node):
        out = {}
        if node.lock or node.parent is None:
            return out
        if not node.children:
            out["kv"] = (node.last_access if node.has_state else STATELESS_FIRST, self.LEAF_TIE * node.depth_tokens)
        if node.has_state:
            out["state"] = (getattr(node, "state_access", node.last_access), node.depth_tokens)
        return out


@eviction("lru-tail-first")
class TailFirstLRUEviction(HeapEviction):
    """One LRU over cached leaves (vLLM's shared free-block queue, TensorRT-LLM's KV pool): a
    finished request's blocks are released tail first, so among equally recent leaves the
    deepest goes first."""

    refresh = PATH_REFRESH

    def priority(self, node):
        return (node.last_access, -node.depth_tokens)


STATELESS_FIRST = -math.inf  # sort key of a stateless leaf: nothing can hit it, it goes first
