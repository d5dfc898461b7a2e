"""Admission policies: at which positions a request's states are checkpointed.

A policy sees the request's lookup (``MatchResult`` on its input) and answers two lists of
symbol positions: states captured during prefill (inserted with the input's KV when prefill
ends) and states captured after decode (inserted with input + output when the request ends).
Positions are counted in symbols of the policy's grid (tokens, or blocks of ``grid`` tokens).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from sim.tree import MatchResult


@dataclass(slots=True)
class AdmissionContext:
    n_input: int  # symbols of the input (prefill part inserted at prefill end)
    n_full: int  # symbols of input + output
    block_tokens: int  # tokens per symbol
    chunk_tokens: int | None  # state alignment: states only at multiples of this (None: exact)
    paper_compat: bool = False
    divergence_full: int | None = None  # paper mode: where input + output leaves the tree
    prefill_chunk_tokens: int = 8192  # chunked prefill: token budget of one scheduled prefill step
    input_tokens: int = -1  # exact prompt tokens (-1: n_input * block_tokens)


class AdmissionPolicy(ABC):
    name = "base"
    #: paper mode needs the divergence of input + output (one extra walk) only for some policies
    needs_full_divergence = False

    @abstractmethod
    def prefill_checkpoints(self, match: MatchResult, ctx: AdmissionContext) -> list[int]: ...

    @abstractmethod
    def decode_checkpoints(self, match: MatchResult, ctx: AdmissionContext) -> list[int]: ...

    @staticmethod
    def align_down(pos: int, ctx: AdmissionContext) -> int:
        """Largest chunk boundary <= pos (in symbols); exact when no alignment is asked."""
        if not ctx.chunk_tokens:
            return pos
        step_tokens = ctx.chunk_tokens
        tokens = (pos * ctx.block_tokens) // step_tokens * step_tokens
        return tokens // ctx.block_tokens


class JudiciousAdmission(AdmissionPolicy):
    """Marconi's admission (also SGLang+'s): a state at the branch point found by speculative
    insertion, and the tail state after the last decoded token.

    Speculative insertion: if the input matched further than its deepest usable state
    (``match_sym > hit_sym``), inserting it would create (or reach) a node that has no state
    yet, i.e. a branch point; its state is captured during this request's prefill. In paper
    mode the branch lands where input + output leaves the tree, as the artifact does; the
    corrected mode clamps it to the input (a real engine can only capture it in prefill) and,
    with chunk alignment, moves it down to the kernel's last chunk boundary before it.
    """

    name = "judicious"
    needs_full_divergence = True

    def prefill_checkpoints(self, match, ctx):
        if match.match_sym <= match.hit_sym:
            return []
        if ctx.paper_compat:
            return []  # the artifact stores its branch state with input + output (decode list)
        pos = self.align_down(min(match.match_sym, ctx.n_input), ctx)
        return [pos] if pos > match.hit_sym else []

    def decode_checkpoints(self, match, ctx):
        cps = []
        if ctx.paper_compat and match.match_sym > match.hit_sym:
            div = ctx.divergence_full if ctx.divergence_full is not None else match.match_sym
            if 0 < div < ctx.n_full:
                cps.append(div)
        cps.append(ctx.n_full)
        return cps


class EveryBlockAdmission(AdmissionPolicy):
    """A state at every block boundary (vLLM+ in the paper: 32-token blocks, each block a node
    with state + KV; a trailing partial block is stored and matches only in full)."""

    name = "every-block"

    def prefill_checkpoints(self, match, ctx):
        return list(range(match.hit_sym + 1, ctx.n_input + 1))

    def decode_checkpoints(self, match, ctx):
        return list(range(1, ctx.n_full + 1))


class TailOnlyAdmission(AdmissionPolicy):
    """Only the request-end state (what an engine without branch capture keeps)."""

    name = "tail-only"

    def prefill_checkpoints(self, match, ctx):
        return []

    def decode_checkpoints(self, match, ctx):
        return [ctx.n_full]
