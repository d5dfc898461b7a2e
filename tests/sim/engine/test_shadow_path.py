"""``ShadowTrie.path_to``: the path a repeated lookup of a request reads its marks from, found by
first symbols instead of walking (comparing) the whole prompt again, as ``MissLedger.looked_up``
did for every lookup of a waiting request."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.misses import ShadowTrie


def _walked_path(trie: ShadowTrie, seq: np.ndarray, depth: int) -> list:
    """The path ``looked_up`` cut from ``walk`` before ``path_to``."""
    _, walked = trie.walk(seq)
    k = 0
    while k < len(walked) and (k == 0 or walked[k - 1].depth < depth):
        k += 1
    return walked[:k] if depth else []


_SEQS = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=40), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(_SEQS, st.booleans())
def test_path_to_is_the_walked_path(seqs, by_add):
    trie = ShadowTrie()
    arrays = [np.asarray(s, dtype=np.int64) for s in seqs]
    for a in arrays:
        if by_add:  # as the ledger adds a request's sequence at its first lookup
            pos, walked = trie.walk(a)
            trie.add(a, pos, walked)
        else:
            trie.insert(a)
    for a in arrays:  # splits made by later sequences included
        for d in range(len(a) + 1):
            for prefix in (a, a[: max(d, 1)]):  # the prompt is a prefix of what was added
                assert [id(n) for n in trie.path_to(prefix, d)] == [id(n) for n in _walked_path(trie, prefix, d)]


def test_path_to_hand_checked():
    trie = ShadowTrie()
    trie.insert(np.array([1, 2, 3, 4]))
    trie.insert(np.array([1, 2, 5]))  # splits 1-2-3-4 after two symbols
    path = trie.path_to(np.array([1, 2, 3, 4]), 3)
    assert [n.depth for n in path] == [2, 4]
    assert trie.path_to(np.array([1, 2, 5]), 2)[-1].depth == 2
    assert trie.path_to(np.array([1, 2, 5]), 0) == []
