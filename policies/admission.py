"""Admission policies: at which positions a request's states are checkpointed.

A policy sees the request's lookup (``MatchResult`` on its input) and answers two lists of
symbol positions: states captured during prefill (inserted with the input's KV when prefill
ends) and states captured after decode (inserted with input + output when the request ends).
Positions are counted in symbols of the policy's grid (tokens, or blocks of ``grid`` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import AdmissionPolicy, admission, knob


@admission("judicious")
class JudiciousAdmission(AdmissionPolicy):
    """Marconi's admission (also SGLang+'s): a state at the branch point found by speculative
    insertion, and the tail state after the last decoded token.

    Speculative insertion: if the input matched further than its deepest usable state
    (``match_sym > hit_sym``), inserting it would create (or reach) a node that has no state
    yet, i.e. a branch point; its state is captured during this request's prefill. It is clamped
    to the input (a real engine can only capture it in prefill) and, with chunk alignment, moved
    down to the kernel's last chunk boundary before it.
    """

    @dataclass(frozen=True)
    class Params:
        state_alignment: str = knob(
            "exact",
            "exact: states at any token (paper); chunk: branch states at kernel chunk boundaries.",
            choices=("exact", "chunk"),
        )
        chunk_size: int = knob(64, "Kernel chunk for --state-alignment chunk.")

    def __init__(self, params=None) -> None:
        super().__init__(params)
        # state alignment: branch states only at multiples of this many tokens (None: exact)
        self.chunk_tokens = self.params.chunk_size if self.params.state_alignment == "chunk" else None

    def prefill_checkpoints(self, match, ctx):
        if match.match_sym <= match.hit_sym:
            return []
        pos = self.align_down(min(match.match_sym, ctx.n_input), ctx.block_tokens)
        return [pos] if pos > match.hit_sym else []

    def align_down(self, pos: int, block_tokens: int) -> int:
        """Largest chunk boundary <= pos (in symbols); exact when no alignment is asked."""
        step_tokens = self.chunk_tokens
        if not step_tokens:
            return pos
        tokens = (pos * block_tokens) // step_tokens * step_tokens
        return tokens // block_tokens

    def decode_checkpoints(self, match, ctx):
        return [ctx.n_full]


@admission("every-block")
class EveryBlockAdmission(AdmissionPolicy):
    """A state at every block boundary (vLLM+ in the paper: 32-token blocks, each block a node
    with state + KV; a trailing partial block is stored and matches only in full)."""

    def prefill_checkpoints(self, match, ctx):
        return list(range(match.hit_sym + 1, ctx.n_input + 1))

    def decode_checkpoints(self, match, ctx):
        return list(range(1, ctx.n_full + 1))


@admission("tail-only")
class TailOnlyAdmission(AdmissionPolicy):
    """Only the request-end state (what an engine without branch capture keeps)."""

    def prefill_checkpoints(self, match, ctx):
        return []

    def decode_checkpoints(self, match, ctx):
        return [ctx.n_full]
