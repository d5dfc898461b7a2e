"""Mutation survivors of ``sim/cache/engine_tree.py`` (``benchmarks/mutation.py -m engine_tree
--per-module 10 --seed 14`` at 593c249): each test fails on its mutant (checked by planting it).
Survivor 5 (``_extent``'s ``k -= 1`` dropped) is equivalent, its loop never entered: see
``benchmarks/results/2026-12-05-mutation-s14/README.md``. Hand-worked tiny traces; TensorRT-LLM
rules from ``tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py`` (stored version
065ff9e9), LMDeploy's from ``lmdeploy/pytorch/paging/block_trie/checkpoint_lifecycle.py``."""

from __future__ import annotations


import numpy as np

from engine_cases import TINY, cat, lmdeploy_trie, one_per_session, run, snapshot_tree, state_depths, toks

from policies.base import EngineRules
from policies.vllm_current import VllmFreeQueueEviction
from sim.cache.engine_tree import EngineTree
from sim.cache.tree import Span

OUT = toks(90_000, 3)
END0 = {"additional_snapshot_offsets_from_end": "0"}


def _first_blocks(n):
    """``n`` prompts of 20 tokens, each with its own first token: ``n`` first blocks under the root,
    each with its page at 20 (end offset 0)."""
    return [(cat(toks(1000 * (k + 1), 1), toks(100 * k + 50_000, 19)), OUT) for k in range(n)]


def test_a_partial_match_under_the_root_counts_every_first_block():
    """Survivor 2 (``_block_continuations``: ``while node.depth_tokens < start`` negated). With no
    whole block matched the partial match looks at the root's children, all of them:
    ``find_best_partial_match_in_next_nodes`` (``_block_radix_tree.py`` L291-L310) gives up with 32
    or more. R shares 23 tokens (prompt and output) with the first prompt's block, whose page at 20
    the match covers: 20 under 31 first blocks, 0 under 32. The mutant walks into the child on R's
    first token only, one block, and hits 20 under 32 too."""
    for n, hit in ((31, 20), (32, 0)):
        firsts = _first_blocks(n)
        r = (cat(firsts[0][0], OUT, toks(7000, 6)), OUT)
        got, _ = run(one_per_session(*firsts, r), "trtllm", **END0)
        assert got == [0] * n + [hit], n


def test_a_pool_held_whole_by_the_running_request_takes_no_snapshot():
    """Survivor 4 (``state_capacity > 0`` -> ``>= 0`` in ``_insert``): the pool's count goes down by
    what running requests hold (``_hold``), so it is 0 during the insert of a request whose live
    recurrent page (``running_states=1``) took the only slot of a pool of one. TensorRT-LLM commits
    snapshots one at a time, each taking a page from the queue's front: with none free and none
    committed, none is kept, and the KV stays (the attention pool is apart). The mutant keeps every
    snapshot (``checkpoints[-0:]``), more than the pool holds, and the insert is refused, its KV
    too (``kv_tokens`` 0). A pool of two keeps A's state."""
    A = toks(0, 64)
    trace = one_per_session((A, toks(5000, 4)), (cat(A, toks(2000, 32)), toks(5200, 4)))
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="1", **END0)
    assert got == [0, 0] and state_depths(sim.tree) == [] and sim.tree.kv_tokens == 96
    got, sim = run(trace, "trtllm", spec=TINY, state_pool="2", **END0)
    assert got == [0, 64] and state_depths(sim.tree) == [96] and sim.tree.kv_tokens == 96


def test_the_longest_leading_match_wins_below_a_whole_block():
    """Survivor 1 (``_partial_block_hit``: ``min(agree, lookup_end)`` -> ``max``, which ties every
    block whose match ends before the lookup's end). ``find_best_partial_match_in_next_nodes``
    (``_block_radix_tree.py`` L291-L310) keeps the child with the longest leading match
    (``match_len > best_match_len``), and ``_prune_match`` (L712-L774) uses only that block's page.
    A start offset of 33 puts a snapshot at token 33 of each prompt, all sharing the block W.
    r0's second block [32, 64) holds its page at 33; r1 shares W and 3 tokens with it: its
    snapshot at 33 is r0's block's (first created through the point), its own block has no page,
    and it hits 33. r2 shares 3 tokens with r0's block and 5 with r1's: r1's block wins, no page,
    and no state on the whole block W: 0. The mutant ties the two at the lookup's end, takes the
    first created, r0's, whose page at 33 the 3 tokens cover: 33."""
    W = toks(5000, 32)
    trace = one_per_session(
        (cat(W, toks(0, 40)), OUT),
        (cat(W, toks(0, 3), toks(900, 37)), OUT),
        (cat(W, toks(0, 3), toks(900, 2), toks(950, 35)), OUT),
    )
    got, _ = run(trace, "trtllm", additional_snapshot_offsets_from_start="33", **END0)
    assert got == [0, 33, 0]


_tree = snapshot_tree


def test_a_leaf_extended_in_place_is_a_block_created_after_its_siblings():
    """Survivor 3 (``_extend_leaf``: ``self._born += 1`` -> ``+= 0``). A partial block extended is
    a new block appended to ``block.next`` after its siblings (``Block.__init__`` replacing a
    covered partial sibling, ``_adopt_pages_from``): C (10 tokens, a stateless leaf), then D, then
    C extended in place to 20: C's first 10 tokens keep their stamp, its new ones come after D's.
    The mutant stamps them with D's, a tie."""
    t = _tree()
    t.insert(toks(1000, 10), 10, [], t.set_time(1.0))
    t.insert(toks(2000, 10), 10, [10], t.set_time(2.0))
    c_node, d_node = t.root.children[1000], t.root.children[2000]
    c, d = t._born_at(c_node, 10), t._born_at(d_node, 10)
    t.insert(toks(1000, 20), 20, [20], t.set_time(3.0))
    assert t.root.children[1000] is c_node and c_node.depth_tokens == 20
    assert c < d < t._born_at(c_node, 11) == t._born_at(c_node, 20)
    assert t._born_at(c_node, 10) == c
    t.check_invariants()


def _trie() -> EngineTree:
    return lmdeploy_trie(states=4)


def test_a_checkpoint_replaces_one_on_a_branch_leaving_at_the_anchor():
    """Survivor 6 (``_states_in_block``: ``pos + m < a_sym`` -> ``<=``). LMDeploy keeps one
    checkpoint per full-block anchor (``_reserve_checkpoint``, ``checkpoint_anchor_step``; its test
    ``test_ssm_checkpoint_replaces_partial_variant_at_same_anchor`` on one sequence): A's at
    2B + 1 and R's at 2B + 3 hang on the same trie block (tokens 0 .. 2B), though R's tokens after
    2B differ from A's, so R's replaces A's. The token tree holds A as one edge of 2B + 1 tokens,
    which R leaves exactly at the anchor (2B): the mutant takes that for a path leaving before the
    anchor, finds nothing to replace, and keeps both."""
    B = 16
    t = _trie()
    a = np.array([1] * (2 * B) + [7], dtype=np.int64)
    r = np.array([1] * (2 * B) + [8, 8, 8], dtype=np.int64)
    assert t.insert(a, len(a), [2 * B + 1], t.set_time(1.0)).inserted
    assert t.insert(r, len(r), [2 * B + 3], t.set_time(2.0)).inserted
    assert state_depths(t) == [2 * B + 3] and t.states_replaced == 1
    assert t.lookup(cat(a, toks(50, 4))).hit_tokens == 0
    assert t.lookup(cat(r, toks(50, 4))).hit_tokens == 2 * B + 3
    t.check_invariants()


def test_a_block_extent_keeps_the_symbols_inside_its_whole_blocks():
    """Survivor 5 (``_extent``: ``k -= 1`` dropped in ``while k > 0 and span.tokens(k) > whole``) is
    equivalent: a span's first j symbols hold at most j * B tokens (a cut symbol is short, the
    last holds what is left), so the start ``min(whole // B, n)`` is at or under ``whole`` (at n
    only when ``whole == total``), and the loop before only steps to symbols still under it: the
    decrementing loop is never entered. Checked here on every span of up to 6 symbols of 1-4
    tokens, cut or not: the kept symbols hold at most the whole blocks' tokens, one more would not."""
    for B in range(1, 5):
        for EB in range(1, 3 * B + 2):
            t = EngineTree(
                EngineRules(kv_extent="blocks", extent_block=EB),
                capacity_bytes=10**6,
                kv_bytes_per_token=1,
                state_bytes=4,
                block_tokens=B,
                policy=VllmFreeQueueEviction(),
            )
            for n in range(1, 7):
                for cut in [None] + [(c, x) for c in range(1, n) for x in range((c - 1) * B + 1, c * B + 1)]:
                    short = 0 if cut is None else cut[0] * B - cut[1]
                    for total in range(max(1, (n - 1) * B + 1 - short), n * B - short + 1):
                        span = Span(n, B, total, cut)
                        assert all(span.tokens(j) <= j * B for j in range(n + 1))
                        whole = total // EB * EB
                        k = t._extent(span, [])
                        assert span.tokens(k) <= whole and (k == n or span.tokens(k + 1) > whole)
