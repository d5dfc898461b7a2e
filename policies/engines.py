"""Engine presets: how today's serving engines place, admit and evict hybrid-model states.

Each preset reimplements, from the behaviour described in ``shared/reference/engines.md``
(§3-§6), one engine's checkpoint placement (admission here: every captured state is admitted),
its eviction order and its refresh rule, on the simulator's hybrid radix tree. No engine code is
used. Positions are symbols of the preset's grid (tokens, or blocks for the vLLM presets).

Common to every engine preset: a lookup reuses at most ``input_len - 1`` tokens (an engine must
compute at least one prompt token to produce logits), so a state at the very end of a repeated
prompt is never usable. Chunked prefill is ``ChunkedPrefill.prefill_chunk_tokens`` (``--prefill-chunk``)
tokens per scheduled step, counted from the hit position; the simulator runs one request's
prefill at a time, so a step is never shared with another request (``concurrency 1``).

=============  ===================================================================================
preset         placement / eviction / refresh
=============  ===================================================================================
vllm-align     grid = vLLM's block B (attention block raised to the state page; 528 for
               Qwen3.5-like shapes); prefill steps are block multiples from the hit; a state at
               the end of each step only when it ends on a block boundary (the last step ends at
               the prompt end); no decode capture. LRU over leaves, tail blocks first; path.
vllm-all       grid B; a state at every block boundary of the prompt; same eviction.
sglang-v1      token grid; states at each chunked-prefill chunk end and at request end; two LRU
               lists (state holders and KV leaves) merged by recency in one byte budget: an inner
               node loses only its state (tombstone), a leaf goes whole, a stateless leaf goes
               first (tombstone leaves cascade); ties go to the shallower node; whole path.
sglang-v1-consumed  the same with consumed-node refresh (SGLang #31643 / #31648).
sglang-v2      token grid; at each prefill forward end the state at the last 64-token boundary,
               the branch point (match divergence) rounded down to 64, and during decode the
               last multiple of the 256-token track interval; two-list eviction; whole path.
lmdeploy       token grid (block 64 decides "frozen"); a state at each prefill forward end
               (chunk ends and prompt end, any position); no decode states (interval 0);
               tiered LRU: frozen partial checkpoints (not on a 64 boundary) drop first, then KV
               leaves with their states, then checkpoint-only drops; whole path.
trtllm         token grid; a state every 256 tokens of the prompt and at prompt end; LRU over
               leaves, tail first; whole path.
infinite       a bound: judicious admission (Marconi's), no capacity limit, no lookup cap.
=============  ===================================================================================

Not modelled: vLLM's per-block (rather than per-edge) eviction of a leaf, LMDeploy's
one-checkpoint-per-block-anchor replacement, SGLang's separate memory pools (one byte budget
here), per-request state slots, and the token budget shared between concurrent requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.base import AdmissionContext, AdmissionPolicy, PolicyPreset, Victim, admission, eviction, knob
from policies.base import register_preset as register
from policies.eviction import HeapEviction

VLLM_KERNEL_ALIGN = 16  # vLLM rounds the raised attention block to this many tokens
SGLANG_CAPTURE_CHUNK = 64  # SGLang V2: states at kernel-chunk boundaries (max(64, page))
SGLANG_TRACK_INTERVAL = 256  # SGLang V2: --mamba-track-interval (decode tracking)
LMDEPLOY_BLOCK = 64  # LMDeploy block_size / cache_block_seq_len
TRTLLM_INTERVAL = 256  # TensorRT-LLM mamba_state_cache_interval in shipped configs


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
class ChunkedPrefill:
    """Knobs of every engine admission: the chunked-prefill step."""

    prefill_chunk_tokens: int = knob(8192, "Chunked prefill: tokens per scheduled prefill step (engine presets "
                                     "place states at chunk ends).", flag="--prefill-chunk")


@dataclass(frozen=True)
class VllmBlocks(ChunkedPrefill):
    """Knobs of the vLLM admissions: chunked prefill and the block."""

    block_size: int = knob(0, "Block of block-based engine presets (vllm-align, vllm-all) in tokens; 0 = "
                           "derived per model.")


@dataclass(frozen=True)
class VllmPreset(PolicyPreset):
    """A vLLM preset: the grid is the model's hybrid block (``--block-size`` overrides it)."""

    def grid_for(self, spec, config) -> int:
        return config.block_size or vllm_block_tokens(spec)


# ---------------------------------------------------------------------------------- helpers

def _input_tokens(ctx: AdmissionContext) -> int:
    return ctx.input_tokens if ctx.input_tokens >= 0 else ctx.n_input * ctx.block_tokens


def _chunk_ends(start: int, end: int, step: int) -> list[int]:
    """Ends of the non-final chunks of a prefill from ``start`` to ``end`` in steps of ``step``
    (same unit); the final chunk ends at ``end`` and is not listed."""
    step = max(step, 1)
    return list(range(start + step, end, step))


def _down(pos_sym: int, step_tokens: int, ctx: AdmissionContext) -> int:
    """Largest multiple of ``step_tokens`` tokens at or below symbol position ``pos_sym``, in
    symbols (a step finer than a symbol is rounded up to one symbol)."""
    B = ctx.block_tokens
    step_sym = max(step_tokens // B, 1)
    return pos_sym // step_sym * step_sym


# ---------------------------------------------------------------------------------- admission

@admission("vllm-align")
class VllmAlignAdmission(AdmissionPolicy):
    """``--mamba-cache-mode align``: prefill runs in steps of whole blocks from the hit; the
    kernel's final state is kept at the end of each step that ends on a block boundary. The
    last step ends at the prompt end, a boundary only if the prompt is a block multiple; so an
    unchunked prompt (concurrency 1, prompt <= the step budget) gets no intermediate state
    (vLLM #42317). Decode captures nothing."""

    Params = VllmBlocks

    def prefill_checkpoints(self, match, ctx):
        B = ctx.block_tokens
        tok_in = _input_tokens(ctx)
        budget = self.params.prefill_chunk_tokens
        step = max(budget // B, 1)  # blocks per non-final step
        pos = match.hit_sym
        remaining = tok_in - pos * B
        cps = []
        while remaining > max(budget, step * B):
            pos += step
            cps.append(pos)
            remaining -= step * B
        if tok_in % B == 0 and ctx.n_input > match.hit_sym:
            cps.append(ctx.n_input)
        return cps

    def decode_checkpoints(self, match, ctx):
        return []


@admission("vllm-all")
class VllmAllAdmission(AdmissionPolicy):
    """``--mamba-cache-mode all``: a state at every block boundary of the prompt."""

    Params = VllmBlocks

    def prefill_checkpoints(self, match, ctx):
        return list(range(match.hit_sym + 1, ctx.n_input + 1))

    def decode_checkpoints(self, match, ctx):
        return []


@admission("sglang-v1")
class SGLangV1Admission(AdmissionPolicy):
    """``no_buffer``: the state at the end of every chunked-prefill chunk but the last, and the
    request's final state."""

    Params = ChunkedPrefill

    def prefill_checkpoints(self, match, ctx):
        step = max(self.params.prefill_chunk_tokens // ctx.block_tokens, 1)
        return _chunk_ends(match.hit_sym, ctx.n_input, step)

    def decode_checkpoints(self, match, ctx):
        return [ctx.n_full]


@admission("sglang-v2")
class SGLangV2Admission(AdmissionPolicy):
    """``extra_buffer``: at each prefill forward end the state at its last 64-token boundary;
    the branch point found by the lookup (``mamba_branching_seqlen``), rounded down to 64; in
    decode the state tracked at the last multiple of the 256-token track interval."""

    Params = ChunkedPrefill

    def prefill_checkpoints(self, match, ctx):
        step = max(self.params.prefill_chunk_tokens // ctx.block_tokens, 1)
        ends = _chunk_ends(match.hit_sym, ctx.n_input, step) + [ctx.n_input]
        cps = {_down(e, SGLANG_CAPTURE_CHUNK, ctx) for e in ends}
        if match.match_sym > match.hit_sym:
            cps.add(_down(min(match.match_sym, ctx.n_input), SGLANG_CAPTURE_CHUNK, ctx))
        return sorted(c for c in cps if c > match.hit_sym)

    def decode_checkpoints(self, match, ctx):
        last = _down(ctx.n_full, SGLANG_TRACK_INTERVAL, ctx)
        return [last] if last > ctx.n_input else []


@admission("lmdeploy")
class LmdeployAdmission(AdmissionPolicy):
    """PyTorch engine: a state at every prefill forward end (chunk ends and the prompt end, at
    any position); decode states off (``prefix_cache_decode_state_interval`` 0)."""

    Params = ChunkedPrefill

    def prefill_checkpoints(self, match, ctx):
        step = max(self.params.prefill_chunk_tokens // ctx.block_tokens, 1)
        return _chunk_ends(match.hit_sym, ctx.n_input, step) + [ctx.n_input]

    def decode_checkpoints(self, match, ctx):
        return []


@admission("trtllm")
class TrtllmAdmission(AdmissionPolicy):
    """A state every 256 prompt tokens (context chunks are cut there) and at the prompt end."""

    def prefill_checkpoints(self, match, ctx):
        step = max(TRTLLM_INTERVAL // ctx.block_tokens, 1)
        first = (match.hit_sym // step + 1) * step
        return list(range(first, ctx.n_input, step)) + [ctx.n_input]

    def decode_checkpoints(self, match, ctx):
        return []


# ---------------------------------------------------------------------------------- eviction

@eviction("lru-tail-first")
class TailFirstLRUEviction(HeapEviction):
    """One LRU over cached leaves (vLLM's shared free-block queue, TensorRT-LLM's KV pool): a
    finished request's blocks are released tail first, so among equally recent leaves the
    deepest goes first."""

    refresh = "path"

    def priority(self, node):
        return (node.last_access, -node.depth_tokens)


@eviction("two-list")
class TwoListLRUEviction(HeapEviction):
    """SGLang's ``MambaRadixCache``: an LRU list of state holders and an LRU list of KV leaves,
    merged here by recency because the simulator has one byte budget. Evicting an inner state
    holder drops only its state (a tombstone: KV kept); a leaf goes with its KV and state; a
    stateless leaf (a tombstone leaf) goes before anything else. Ties go to the shallower node
    (in SGLang's list a child is always newer than its parent)."""

    refresh = "path"

    def is_candidate(self, node):
        return node.lock == 0 and node.parent is not None and (not node.children or node.has_state)

    def priority(self, node):
        if not node.children and not node.has_state:
            return (-math.inf, node.depth_tokens)
        return (node.last_access, node.depth_tokens)

    def pop_victim(self):
        node = self.pop_node()
        if node is None:
            return None
        return Victim(node, drop_state_only=bool(node.children))


@eviction("lmdeploy-tiered")
class TieredLRUEviction(HeapEviction):
    """LMDeploy's order: frozen partial checkpoints (a state not on a ``block`` boundary: its
    partial block was copied aside) drop first, then KV leaves with their states, then
    checkpoint-only drops that keep the node and its KV; LRU within each tier."""

    refresh = "path"

    block = LMDEPLOY_BLOCK

    def is_candidate(self, node):
        return node.lock == 0 and node.parent is not None and (not node.children or node.has_state)

    def _tier(self, node) -> int:
        if node.has_state and node.depth_tokens % self.block:
            return 0
        return 1 if not node.children else 2

    def priority(self, node):
        return (self._tier(node), node.last_access, -node.depth_tokens)

    def pop_victim(self):
        node = self.pop_node()
        if node is None:
            return None
        return Victim(node, drop_state_only=bool(node.children) or self._tier(node) == 0)


@eviction("two-list-consumed")
class TwoListConsumedEviction(TwoListLRUEviction):
    """``two-list`` with consumed-node refresh (SGLang #31643 / #31648)."""

    refresh = "consumed"


register(VllmPreset(
    "vllm-align", "vLLM --mamba-cache-mode align: a state at the block boundary ending each scheduled prefill "
    "step (block = attention block raised to the state page), whole-block matches, LRU tail first",
    admission="vllm-align", eviction="lru-tail-first", lookup_cap_minus_one=True))
register(VllmPreset(
    "vllm-all", "vLLM --mamba-cache-mode all: a state at every block boundary, LRU tail first",
    admission="vllm-all", eviction="lru-tail-first", lookup_cap_minus_one=True))
register(PolicyPreset(
    "sglang-v1", "SGLang no_buffer: states at chunk ends and request end, two-list LRU with tombstones, "
    "whole-path refresh, lookup cap input_len - 1",
    admission="sglang-v1", eviction="two-list", lookup_cap_minus_one=True))
register(PolicyPreset(
    "sglang-v1-consumed", "sglang-v1 with consumed-node refresh (SGLang #31643 / #31648)",
    admission="sglang-v1", eviction="two-list-consumed", lookup_cap_minus_one=True))
register(PolicyPreset(
    "sglang-v2", "SGLang extra_buffer: 64-aligned forward-end states, branch points, 256-token decode "
    "tracking, two-list LRU with tombstones",
    admission="sglang-v2", eviction="two-list", lookup_cap_minus_one=True))
register(PolicyPreset(
    "lmdeploy", "LMDeploy PyTorch engine: a state at each prefill forward end, block 64; frozen partial "
    "checkpoints evicted first, then KV leaves, then checkpoint-only; LRU",
    admission="lmdeploy", eviction="lmdeploy-tiered", lookup_cap_minus_one=True))
register(PolicyPreset(
    "trtllm", "TensorRT-LLM: a state every 256 prompt tokens and at prompt end, LRU over leaves",
    admission="trtllm", eviction="lru-tail-first", lookup_cap_minus_one=True))
register(PolicyPreset(
    "infinite", "bound: judicious admission with unlimited capacity (never evicts)",
    admission="judicious", eviction="lru-leaf", unlimited=True))
