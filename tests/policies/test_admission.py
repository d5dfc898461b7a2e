"""Admission policies: the checkpoint positions each one asks for, on hand-made lookups."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from policies.admission import EveryBlockAdmission, JudiciousAdmission, TailOnlyAdmission
from policies.base import AdmissionContext


def lookup(hit_sym: int, match_sym: int):
    return SimpleNamespace(hit_sym=hit_sym, match_sym=match_sym)


def ctx(n_input: int, n_full: int, block: int = 1) -> AdmissionContext:
    return AdmissionContext(n_input, n_full, block)


def chunked(chunk: int = 64) -> JudiciousAdmission:
    return JudiciousAdmission(JudiciousAdmission.Params(state_alignment="chunk", chunk_size=chunk))


def test_judicious_branch_state_where_the_input_leaves_the_tree_and_the_tail_state():
    j = JudiciousAdmission()
    # matched 100 symbols, deepest state at 40: the branch at 100 is captured in prefill
    assert j.prefill_checkpoints(lookup(40, 100), ctx(120, 150)) == [100]
    assert j.decode_checkpoints(lookup(40, 100), ctx(120, 150)) == [150]
    # matched only up to its state: no branch
    assert j.prefill_checkpoints(lookup(100, 100), ctx(120, 150)) == []
    # the match runs past the input (into a cached output): clamped to the input's end
    assert j.prefill_checkpoints(lookup(40, 130), ctx(120, 150)) == [120]


def test_judicious_chunk_alignment_moves_the_branch_down_to_a_chunk_boundary():
    j = chunked(64)
    # branch at token 100, 64-token chunks: the kernel's last boundary before it is 64
    assert j.prefill_checkpoints(lookup(0, 100), ctx(120, 150)) == [64]
    # 16-token symbols (blocks): branch at symbol 10 = token 160 -> boundary 128 = symbol 8
    assert j.prefill_checkpoints(lookup(0, 10), ctx(12, 15, block=16)) == [8]
    # the boundary falls at or below the hit: nothing new to capture
    assert j.prefill_checkpoints(lookup(64, 100), ctx(120, 150)) == []
    assert j.prefill_checkpoints(lookup(70, 100), ctx(120, 150)) == []
    # a chunk of 32 tokens moves the same branch to 96; exact alignment leaves it at 100
    assert chunked(32).prefill_checkpoints(lookup(0, 100), ctx(120, 150)) == [96]
    assert JudiciousAdmission().prefill_checkpoints(lookup(0, 100), ctx(120, 150)) == [100]


def test_every_block_states_every_symbol_past_the_hit_and_along_input_plus_output():
    e = EveryBlockAdmission()
    assert e.prefill_checkpoints(lookup(2, 3), ctx(5, 8)) == [3, 4, 5]
    assert e.decode_checkpoints(lookup(2, 3), ctx(5, 8)) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert e.prefill_checkpoints(lookup(5, 5), ctx(5, 8)) == []


@pytest.mark.parametrize("hit, match", [(0, 0), (3, 9)])
def test_tail_only_keeps_only_the_request_end(hit, match):
    t = TailOnlyAdmission()
    assert t.prefill_checkpoints(lookup(hit, match), ctx(10, 14)) == []
    assert t.decode_checkpoints(lookup(hit, match), ctx(10, 14)) == [14]
