"""Builders the tree tests of this folder share: an engine tree of given rules, policy and sizes
(``engine_tree``), and a tree driven one time step a call (``Clocked``), as the engines free one
request's blocks after the previous one's."""

from __future__ import annotations

import numpy as np

from policies.base import EngineRules
from sim.cache.engine_tree import EngineTree

#: bytes of KV a token and bytes of a state, unless a test says otherwise
KV, STATE = 2, 16


def engine_tree(rules, policy, *, capacity=10**6, kv=KV, state=STATE, block_tokens=1, states=None) -> EngineTree:
    """An ``EngineTree`` under ``rules`` (None: no engine rule) and ``policy``: ``capacity`` bytes,
    ``kv`` bytes of KV a token, ``state`` bytes a state, ``states`` slots in a state pool of its own
    (None: states share the capacity)."""
    return EngineTree(
        rules or EngineRules(),
        capacity_bytes=capacity,
        kv_bytes_per_token=kv,
        state_bytes=state,
        block_tokens=block_tokens,
        policy=policy,
        state_capacity=states,
    )


class Clocked:
    """``tree`` one time step a call (1, 2, ...): ``now`` ticks; ``insert`` puts in a sequence of
    ids (one token each), which must go in, refreshed as a request's final insert; ``lookup``
    matches one."""

    def __init__(self, tree: EngineTree) -> None:
        self.tree, self.t = tree, 0

    def now(self) -> float:
        self.t += 1
        return self.tree.set_time(float(self.t))

    def insert(self, ids, states) -> None:
        t = self.now()
        res = self.tree.insert(np.array(ids, dtype=np.int64), len(ids), states, t)
        assert res.inserted
        self.tree.refresh_inserted(res, t, final=True)

    def lookup(self, ids):
        return self.tree.lookup(np.array(ids, dtype=np.int64), now=self.now())
