"""vLLM today: align-mode hybrid prefix caching on by default, sparse retention, junction checkpoints (``vllm``).

Follows vllm-project/vllm as read for this preset: hybrid prefix caching on by default in
``align`` mode (PR #50991; ``all`` deprecated in #55041, so this preset is align only: the
``vllm-0.11-all`` preset keeps ``all``); ``vllm/v1/core/single_type_kv_cache_manager.py``
``MambaManager`` with ``retention_interval`` and ``reachable_block_mask`` and its test
``tests/v1/core/test_mamba_align_retention_grid.py`` (commit 9ab07979812c: with an interval of
three 1,600-token blocks the states kept sit at 4,800, 9,600, ...; without an interval none of
the interior blocks is kept; the newest frozen boundary is registered as the rolling checkpoint);
``vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks`` (a hit is at most ``num_tokens - 1``
tokens; ``shared_prefix_boundary`` is where a detected shared prefix ends, pinned against the
retention mask); the shared-prefix junction of PR #37898 and the retention interval of PR #52216
(``--prefix-cache-retention-interval``, default 0), dense when EAGLE is on (#55760). The block: the
attention block raised to the mamba page (``vllm_block_tokens``; 528 tokens for Qwen3.5-4B / 9B
shapes, #40696), ``--block-size`` overrides it.

The junction is the engine's default, with no flag (read in vLLM main, issue 43):
``vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks`` (L286-L292) sets
``shared_prefix_boundary = num_new_computed_tokens + num_uncached`` whenever the hybrid
coordinator's longest single-group hit (the KV match) runs past the reconciled hit, and
``vllm/v1/core/sched/scheduler.py`` ``_mamba_block_aligned_split`` (the ``stops`` tuple, L411-L437;
lines 350-425 at 487ecf187) always stops a step at ``start + (shared_prefix_boundary - start) //
block_size * block_size``, and a chunk that starts inside a block (a block wider than the step
budget) at the next block boundary (``benchmarks/differential_vllm_split.py`` compares the preset's
cut with that method: 1,420 / 1,420 cases);
``single_type_kv_cache_manager.py`` adds it to ``reachable_boundaries``, so retention 0 keeps it.
``CacheConfig.enable_mamba_shared_prefix_checkpoint`` (``vllm/config/cache.py``, named
``enable_mamba_fine_grained_prefix_cache`` until #57382; the ``--enable-mamba-fine-grained-prefix-cache``
of PR #53945's docs) is something else, off by default: a checkpoint at the sub-block position an
EAGLE / MTP sibling resumes from, in effect only with EAGLE on the mamba group and a
``prefix_match_unit`` finer than the mamba block. The simulator matches whole blocks, so the flag
is refused (one line) rather than silently inert. These lines were read through copies of vLLM main
found by code search; the project's store holds no vllm-project/vllm commit with them.

Knobs (named as the engine names them): ``--prefix-cache-retention-interval`` (tokens; 0 keeps
only the semantic states: the prompt's last full block, the junction and the request's newest
boundary; N > 0 also the block boundaries on multiples of N; -1 stands for the Python API's None:
every state), ``--enable-mamba-shared-prefix-checkpoint`` (refused, above), ``--block-size``,
``--speculative-method`` (``none``, ``eagle``, ``eagle3``, ``mtp``: the ``method`` of
``--speculative-config``), ``--prefill-chunk`` (``--max-num-batched-tokens``).

- Prefill: steps cut by ``_mamba_block_aligned_split`` (``align_step_ends`` one request at a
  time, ``schedule_chunk`` under ``--scheduler continuous``); when the KV match runs deeper than the
  deepest state, the step is also cut at the match's last block boundary (below ``input_len``), and
  that state is kept.
- Decode: the block boundaries decode crosses; under retention only the newest (the request's
  last block boundary) and those on the retention grid.
- EAGLE / MTP on: every kept state sits one block earlier (the block dropped for the draft
  model's hidden states; ``reachable_block_mask`` shifts by one block), and retention is dense.
- A finished request stores input + output - 1 tokens (the last sampled token never ran through
  the model). Eviction and grid as ``vllm-0.11-align``: one LRU free-block queue, tail first,
  full blocks only.

Reproduces (``tests/policies/test_current_presets.py``): test_mamba_align_retention_grid.py
(grid blocks kept, none without an interval, the rolling newest boundary); vLLM #40696's
528-token cliff (prompts under 528 tokens never hit; a 979-token prompt hits 528); #45238's
workload shape (prompts sharing a prefix that ends inside a block: the second request keeps the
junction state and the third reuses it; vLLM 0.11 reuses nothing), under every scheduler
(``tests/policies/test_engine_rules_schedulers.py``); the EAGLE block drop of
test_mamba_align_chunk_split.py both ways. Not modelled: per-block (rather than per-edge)
eviction of a leaf, the step budget shared with other requests, the
full-attention side of the EAGLE block drop, ``max_model_len`` (#48401's inert cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import AdmissionPolicy, PolicyError, admission, knob, register_preset
from policies.engine_common import Speculation, VllmBlocks, full_tokens, input_tokens
from policies.vllm import VllmAlignAdmission, VllmPreset

VERSION = "main 2026-09"  # newest code read (see the docstring); no release number yet
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

    @property
    def running_state_slots(self) -> int:
        """The running state + the last step's checkpoint; under EAGLE / MTP the running state
        spans 1 + num_speculative_blocks blocks (``MambaSpec.num_speculative_blocks`` =
        num_speculative_tokens; ``preprocess_mamba`` copies the previous step's state "to the last
        (1 + num_speculative_blocks) block"). A method without ``--speculative-tokens`` counts one."""
        return 2 + self.spec_blocks()

    def spec_blocks(self) -> int:
        p = self.params
        return 0 if p.speculative_method == "none" else max(p.speculative_tokens, 1)

    def schedule_chunk(self, start, end, budget, step_budget, ctx):
        """``_mamba_block_aligned_split``: block-aligned steps, a cut at the prompt's last full
        block (as in align mode since 0.11) and a cut at the block-floored shared-prefix junction
        (``stops``' last entry, scheduler.py L411-L437 as read), so a batching scheduler ends a
        step where the engine does and the junction state is taken there."""
        n = VllmAlignAdmission.schedule_chunk(self, start, end, budget, step_budget, ctx)
        B = ctx.block_tokens
        stops = [(start // B + 1) * B] if start % B else []  # a chunk started mid-block re-aligns
        stops.append(junction_tokens(ctx.match_tokens, input_tokens(ctx), B))
        return min([s - start for s in stops if start < s < start + n], default=n)

    def step_ends(self, hit: int, n: int, ctx) -> list[int]:
        """Where one request's prefill steps end with the whole ``--prefill-chunk`` budget each
        (the cut ``schedule_chunk`` makes, so fcfs / sequential and continuous agree)."""
        budget = self.params.prefill_chunk_tokens
        pos, ends = hit, []
        while pos < n:
            pos += self.schedule_chunk(pos, n, min(budget, n - pos), budget, ctx)
            ends.append(pos)
        return ends

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
        semantic = {n - n % B, junction}
        return retained(states, semantic, self.interval()), B, hit

    def decode_states(self, match, ctx) -> tuple[list[int], int, int]:
        """The decode states vLLM keeps before the EAGLE / MTP shift (tokens), the block and the
        floor of the shift (the prompt's last full block)."""
        B = ctx.block_tokens
        n = input_tokens(ctx)
        states = list(range((n // B + 1) * B, full_tokens(ctx) + 1, B))
        newest = {states[-1]} if states else set()
        return retained(states, newest, self.interval()), B, n // B * B

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


@dataclass(frozen=True)
class VllmCurrentPreset(VllmPreset):
    """Today's vLLM: the derived block, refusing combinations the engine cannot run."""

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


register_preset(
    VllmCurrentPreset(
        "vllm",
        "vLLM today: align mode on by default; --prefix-cache-retention-interval (0: semantic states only), "
        "shared-prefix junction kept (#37898), block derived from the model (--block-size), EAGLE/MTP one-block "
        "drop; stores input + output - 1 tokens",
        admission="vllm",
        eviction="lru-tail-first",
        lookup_cap_minus_one=True,
        engine="vllm",
        version=VERSION,
        stores_last_token=False,
    )
)
