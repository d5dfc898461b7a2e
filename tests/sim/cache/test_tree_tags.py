"""The tag an insert or reserve hands the tree's listener lasts only for that call (the
simulation stamps each eviction event with the time in its tag). Mutation survivor,
``benchmarks/mutation.py -m tree --seed 0`` (2026-12-05): tree.py L645, the reserve's
``self._tag = outer``."""

from __future__ import annotations

import numpy as np

from policies.eviction import LRULeafEviction
from sim.cache.tree import HybridRadixTree


class _Tags:
    def __init__(self) -> None:
        self.kv: list[object] = []

    def state_added(self, node, tag) -> None:
        pass

    def state_removed(self, node, tag) -> None:
        pass

    def kv_removed(self, tokens, tag) -> None:
        self.kv.append(tag)


def test_a_reserve_tags_only_its_own_evictions():
    """Room for 30 KV tokens (no states): two 10-token leaves; a reserve of 25 tokens (tag "R")
    evicts both, tagged "R"; after it the tag is None again, so a later insert's eviction carries
    its own tag ("I") and a direct ``evict`` none."""
    tree = HybridRadixTree(
        capacity_bytes=30,
        kv_bytes_per_token=1,
        state_bytes=0,
        block_tokens=1,
        policy=LRULeafEviction(),
        hybrid=False,
    )
    tags = _Tags()
    tree.listener = tags
    for k in range(2):
        assert tree.insert(np.arange(100 * k, 100 * k + 10, dtype=np.int64), 10, [], tree.set_time(float(k))).inserted
    assert tree.reserve(25, 0, tag="R")
    assert tags.kv == ["R", "R"] and tree._tag is None
    tree.release(25, 0)
    assert tree.insert(np.arange(500, 510, dtype=np.int64), 10, [], tree.set_time(5.0)).inserted
    assert tree.insert(np.arange(600, 625, dtype=np.int64), 25, [], tree.set_time(6.0), tag="I").inserted
    assert tags.kv[2:] == ["I"]
    (leaf,) = [n for n in tree.iter_nodes() if n.parent is tree.root and n.depth_tokens == 25]
    tree.evict(leaf)
    assert tags.kv[3:] == [None]
