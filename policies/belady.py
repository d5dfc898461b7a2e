"""``belady`` and ``belady-size``: offline references that know the trace's future.

Admission is Marconi's (judicious: branch points and request ends), as for the ``infinite`` and
``marconi-oracle`` bounds, so they differ only in what they keep. Eviction looks ahead: every
cached state holder and leaf has a next use, the first request not yet arrived whose input
contains the node's whole root path (``sim.cache.future.NextUse``, computed from the trace up
front); stateless leaves (KV no hybrid hit can reach) are never used again. An inner state
holder loses only its state; a leaf goes with its KV.

- ``belady``: Belady's MIN, the farthest next use goes first (never-again first, the biggest of
  those first). Token hit rate weighs a hit by its tokens, like a byte hit ratio, for which
  farthest-first is the classic offline rule.
- ``belady-size``: size-aware, the largest (requests until the next use) x (bytes freed) goes
  first: far-off and big first, the rule for a hit *count*. On the default ShareGPT trace it
  keeps fewer tokens than ``belady`` (big KV leaves of live sessions go early).

Neither is a proven optimum for prefix caches (a node is useful only with its ancestors' KV,
and a deeper state can make a shallower one unnecessary), but they show how far an online
policy is from what knowing the future buys at a capacity. Requests are ordered by their
nominal arrival (the order ``--mode sequential`` replays them); ``des`` may serve them in a
slightly different order, which the index follows (it skips requests already served).
"""

from __future__ import annotations

import numpy as np

from policies.base import PATH_REFRESH, EngineRules, PolicyError, Victim, eviction, register_preset
from policies.engine_common import EnginePreset
from policies.eviction import DenseSlotEviction

NEVER = np.iinfo(np.int64).max


@eviction("belady")
class BeladyEviction(DenseSlotEviction):
    """Farthest next use first (Belady's MIN); among equals (never used again) the most bytes."""

    refresh = PATH_REFRESH

    @staticmethod
    def score(dist: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Eviction score of candidates ``dist`` requests from their next use, freeing ``size``
        bytes; the highest goes."""
        return dist + size / (size.max() + 1.0)

    _columns = {"_next": (NEVER, np.int64), "_size": (0.0, np.float64)}  # next use, bytes freed

    def _future(self):
        future = getattr(self.tree, "future", None)
        if future is None:
            raise PolicyError("belady needs the trace's future: run it with --compat corrected")
        return future

    def update(self, node):
        slot = node.slot
        if slot < 0:
            return
        cand = node.lock == 0 and node.parent is not None and (not node.children or node.has_state)
        self._cand[slot] = cand
        if not cand:
            return
        tree = self.tree
        if node.children:  # an inner state holder: only its state goes
            self._size[slot] = tree.state_bytes
        else:
            self._size[slot] = node.n_tokens * tree.kv_bytes_per_token + (tree.state_bytes if node.has_state else 0)
        self._next[slot] = self._next_use(node)
        parent = node.parent  # its next use depends on which children hold states
        if parent.parent is not None and parent.slot >= 0 and self._cand[parent.slot]:
            self._next[parent.slot] = self._next_use(parent)

    def _next_use(self, node) -> int:
        if not node.has_state and not node.children:
            return NEVER  # KV no hybrid hit can reach
        return self._future().next_use(node)

    def pop_victim(self):
        idx = np.flatnonzero(self._cand[: self._hi])
        if idx.size == 0:
            return None
        future = self._future()
        nxt = self._next[idx]
        known = nxt != NEVER
        stale = np.zeros(idx.size, dtype=bool)
        stale[known] = future.served[nxt[known]]
        for k in np.flatnonzero(stale):  # its next user came: look further ahead
            slot = int(idx[k])
            self._next[slot] = nxt[k] = self._next_use(self._nodes[slot])
        horizon = 2 * future.n + 2
        dist = np.where(nxt == NEVER, horizon, nxt - future.first_unserved + 1).astype(float)
        score = self.score(dist, self._size[idx])
        best = idx[score >= score.max()]
        slot = int(best[np.argmin(self._created[best])]) if best.size > 1 else int(best[0])
        node = self._nodes[slot]
        return Victim(node, drop_state_only=bool(node.children))


@eviction("belady-size")
class BeladySizeEviction(BeladyEviction):
    """Distance to the next use x bytes freed: far-off and big goes first (size-aware Belady)."""

    @staticmethod
    def score(dist, size):
        return dist * size


register_preset(
    EnginePreset(
        "belady",
        "bound: judicious admission + offline eviction of the state whose next use (from the trace's "
        "future) is farthest",
        admission="judicious",
        eviction="belady",
        rules=EngineRules(future=True),
        engine="bound",
    )
)
register_preset(
    EnginePreset(
        "belady-size",
        "bound, size-aware: like belady, evicting the largest (requests to next use x bytes freed)",
        admission="judicious",
        eviction="belady-size",
        rules=EngineRules(future=True),
        engine="bound",
    )
)
