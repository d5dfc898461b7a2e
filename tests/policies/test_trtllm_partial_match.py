"""``trtllm``: which state TensorRT-LLM's lookup reaches inside the block it does not match whole.

``BlockRadixTree.match`` (NVIDIA/TensorRT-LLM ``tensorrt_llm/runtime/kv_cache_manager_v2/
_block_radix_tree.py``, stored version 065ff9e9) walks whole 32-token blocks by key, then takes one
child of the last whole block, ``find_best_partial_match_in_next_nodes`` (L291-L310): the child
with the longest leading match (``match_len > best_match_len`` over ``block.next``, a dict in
insertion order, so the first created among equals; none with 32 or more children), and
``_prune_match`` (L712-L774) keeps that block's one recurrent page where the match covers it
(``matched[i][1] >= snapshot_len``), else the deepest whole block's page. A snapshot goes into the
block through its point that ``block.next`` lists first (``Block.__init__`` raises
``UselessBlockError`` with the first covering sibling; a block replacing a covered partial sibling
adopts its pages, ``_adopt_pages_from``), so its page is the deepest snapshot committed into it
(``Block.can_replace_page`` / ``replace_page``). Each trace below was also run through the engine's own
tree and manager methods (``benchmarks/differential_trtllm.py``'s ``EngineHarness``), which gives
the same hits. Sequential mode, end offset 0 (a state at each prompt's end)."""

from __future__ import annotations

import numpy as np
from engine_cases import cat, one_per_session, run, snapshot_tree, state_depths, toks


OUT = toks(90_000, 3)


def test_the_partial_match_takes_the_longest_leading_match_and_that_blocks_page_only():
    """A start offset of 1 puts a snapshot at token 1 of every prompt. r0 (40 tokens) creates
    the first block (0, 32] and its page at 1; r1 shares r0's first 3 tokens, so its snapshot at
    1 goes into r0's block (the first covering it, which already holds it) and its own first block
    holds no page. r2 shares 3 tokens with r0's block and 5 with r1's: the engine takes r1's block
    (5 > 3), which has no page, and ``_prune_match`` falls back to the whole blocks before it
    (none): 0. The token tree's deepest state on r2's path is the one at 1, which lies in r0's
    block, not in the block the engine picks (the preset gave 1 before; ShareGPT with end offsets
    0 / 13: 10 of the 15 requests that differed, request 57 the first)."""
    trace = one_per_session(
        (toks(0, 40), OUT),
        (cat(toks(0, 3), toks(900, 37)), OUT),
        (cat(toks(0, 3), toks(900, 2), toks(950, 35)), OUT),
    )
    got, _ = run(trace, "trtllm", additional_snapshot_offsets_from_start="1", additional_snapshot_offsets_from_end="0")
    assert got == [0, 1, 0]


def test_the_partial_match_takes_the_first_created_block_among_equals():
    """P (20 tokens) leaves a partial first block with its page at 20. X extends P to 40 tokens:
    its full first block replaces P's and adopts the page (X hits 20). Y shares X's first 25
    tokens and then differs: a new first block, created after X's, with no page in it (Y hits 20
    from X's block, the longest match). R shares 25 tokens with both X's and Y's blocks: the tie
    goes to X's, the first in ``block.next``, whose page at 20 the match covers: 20 (taking the
    later one gives 0). The token tree's blocks are told apart by when their ends were first
    cached: Y's branch splits X's edge at 25, and both halves keep X's stamp."""
    P = toks(0, 20)
    X = cat(P, toks(100, 20))
    Y = cat(P, toks(100, 5), toks(300, 15))
    R = cat(P, toks(100, 5), toks(700, 10))
    got, _ = run(
        one_per_session((P, OUT), (X, OUT), (Y, OUT), (R, OUT)), "trtllm", additional_snapshot_offsets_from_end="0"
    )
    assert got == [0, 20, 20, 20]


def test_a_snapshot_goes_into_the_first_created_block_through_its_point():
    """End offsets 0 and 13. T (63 tokens) creates the first block through token 3, with no page
    in it (its points 50 and 63 lie in its second block). Q shares T's first 3 tokens: its own
    first block holds its page at 22 (its point 9 went there first, and 22 replaced it). R (16
    tokens) commits a snapshot at 3: its partial block [0, 3) is covered by T's and Q's, and the
    first in ``block.next``, T's, takes it (``UselessBlockError``), though Q's page at 22 lies
    deeper on a path through 3; R's 16 goes into its own new block. S shares 3 tokens with all
    three blocks: the tie goes to T's, whose page at 3 the match covers: 3. The preset kept R's
    snapshot at 3 only when no state deeper in the block extended R's path (Q's did), so S got 0
    (ShareGPT with end offsets 0 / 13: the last 5 of the 15 requests that differed, 311 the
    first)."""
    T = cat(toks(0, 3), toks(100, 60))
    Q = cat(toks(0, 3), toks(200, 19))
    R = cat(toks(0, 3), toks(300, 13))
    S = cat(toks(0, 3), toks(400, 30))
    got, sim = run(
        one_per_session((T, OUT), (Q, OUT), (R, OUT), (S, OUT)), "trtllm", additional_snapshot_offsets_from_end="0,13"
    )
    assert got == [0, 0, 0, 3]
    assert state_depths(sim.tree) == [3, 16, 20, 22, 33, 63]


_tree = snapshot_tree


def test_a_points_first_caching_survives_splits_merges_and_leaf_extensions():
    """``EngineNode.born``: when each point of an edge was first cached, which orders sibling
    blocks as ``block.next`` does. A (40 tokens, stamp a) is cut at 10 by B (stamp b > a): both
    halves of A's edge keep a. B's leaf evicted, the stateless upper half is merged into A's lower
    half, whose points keep a. A stateless leaf extended in place (C, 10 tokens, then 20) keeps
    its stamp for its first 10 tokens and takes a new one for the rest."""
    t = _tree()
    seq_a = toks(0, 40)
    t.insert(seq_a, 40, [40], t.set_time(1.0))
    (a_node,) = t.root.children.values()
    a = t._born_at(a_node, 40)
    t.insert(cat(toks(0, 10), toks(500, 10)), 20, [20], t.set_time(2.0))
    (upper,) = t.root.children.values()
    lower, leaf_b = upper.children[10], upper.children[500]
    assert (upper.depth_tokens, lower is a_node) == (10, True)
    assert t._born_at(upper, 5) == t._born_at(lower, 11) == t._born_at(lower, 40) == a
    assert t._born_at(leaf_b, 20) > a
    t.evict(leaf_b)  # the upper half, stateless with one child, is merged into A's lower half
    assert list(t.root.children.values()) == [a_node] and a_node.n_tokens == 40
    assert t._born_at(a_node, 5) == t._born_at(a_node, 40) == a
    t.insert(toks(1000, 10), 10, [], t.set_time(3.0))  # a stateless leaf
    c_node = t.root.children[1000]
    c = t._born_at(c_node, 10)
    t.insert(toks(1000, 20), 20, [20], t.set_time(4.0))  # extends it in place
    assert t.root.children[1000] is c_node and c_node.depth_tokens == 20
    assert t._born_at(c_node, 10) == c < t._born_at(c_node, 11) == t._born_at(c_node, 20)
    t.check_invariants()


def test_the_blocks_under_a_block_and_their_owners():
    """``EngineTree._block_continuations`` under the root for the two-step trace of the second
    test (P, then X extending it, then Y branching off X at 25): two blocks, X's then Y's, each
    with how far it shares a lookup of R's tokens; the state at 20 is X's (the first created
    through it), the states at 40 lie past the block."""
    t = _tree()
    P = toks(0, 20)
    for k, (seq, cps) in enumerate(
        [(P, [20]), (cat(P, toks(100, 20)), [40]), (cat(P, toks(100, 5), toks(300, 15)), [40])]
    ):
        t.insert(seq, len(seq), cps, t.set_time(k + 1.0))
    R = cat(P, toks(100, 5), toks(700, 10))
    blocks, owner = t._block_continuations(R, 0)
    assert [(end, agree) for _, end, agree, _ in blocks] == [(32, 25), (32, 25)]
    x, y = sorted(range(2), key=lambda i: blocks[i][3])
    assert blocks[x][0].key[0] == 105 and blocks[y][0].key[0] == 300  # X's block was created first
    state20 = next(n for n in t.iter_nodes() if n.has_state and n.depth_tokens == 20)
    assert owner[state20] == x
    assert t._partial_block_hit(R, 0, 32) is state20
    assert t._block_children(np.asarray(R), 0) == 2
