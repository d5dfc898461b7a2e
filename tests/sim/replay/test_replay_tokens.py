"""Hash-block token drawing and prefix hashes (numpy only)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.replay.tokens import block_tokens_for, prefix_hash, request_tokens


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=12), st.integers(0, 2**31))
def test_equal_hashes_give_equal_tokens(symbols, seed):
    toks = block_tokens_for(np.array(symbols), 16, seed, 1000).reshape(len(symbols), 16)
    for i, a in enumerate(symbols):
        for j, b in enumerate(symbols):
            if a == b:
                assert np.array_equal(toks[i], toks[j])
    assert toks.min() >= 0 and toks.max() < 1000


def test_distinct_hashes_and_seeds_give_distinct_tokens():
    a = block_tokens_for(np.array([1, 2]), 512, 0, 1 << 17).reshape(2, 512)
    assert not np.array_equal(a[0], a[1])
    b = block_tokens_for(np.array([1]), 512, 1, 1 << 17)
    assert not np.array_equal(a[0], b)
    # deterministic
    assert np.array_equal(block_tokens_for(np.array([1, 2]), 512, 0, 1 << 17).reshape(2, 512), a)


def test_partial_last_block_is_a_prefix_of_the_full_block():
    full = request_tokens([5, 9], [-1], block_tokens=16, input_len=32, output_len=16, seed=3)
    part = request_tokens([5, 9], [-1], block_tokens=16, input_len=21, output_len=4, seed=3)
    assert len(full) == 48 and len(part) == 25
    assert np.array_equal(part[:21], full[:21])


def test_tokenized_traces_pass_through():
    t = request_tokens([3, 1, 4], [1, 5], block_tokens=1, input_len=3, output_len=2)
    assert t.tolist() == [3, 1, 4, 1, 5]


def test_prefix_hash_sees_every_token_of_the_prefix():
    t = np.arange(100)
    assert prefix_hash(t, 50) == prefix_hash(t.copy(), 50)
    assert prefix_hash(t, 50) != prefix_hash(t, 51)
    u = t.copy()
    u[49] = 7
    assert prefix_hash(u, 50) != prefix_hash(t, 50)
    assert prefix_hash(u, 49) == prefix_hash(t, 49)
