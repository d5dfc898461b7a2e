"""GDSF: GreedyDual-Size-Frequency eviction (Cherkasova, HP Labs report HPL-98-69, 1998).

Each cached node n carries a priority ``H(n) = L + F(n) * C(n) / S(n)``, set when it is admitted
and again each time it is referenced:

- ``C(n)``: the cost of a miss = the FLOPs its checkpoint saves, marginal to its parent (the cost
  model's ``node_flops``; a node without a state saves nothing);
- ``S(n)``: its size = the bytes evicting it frees (its edge's KV plus its state);
- ``F(n)``: how often it was referenced (1 when admitted, +1 per hit on it);
- ``L``: the clock, the priority of the last victim (so long-unreferenced nodes age relative to
  newly referenced ones without any rescan).

The lowest ``H`` goes first (ties: the oldest node). Candidates are Marconi's: leaves, and
single-child nodes holding a state (evicting one drops its state; its KV merges into the child).
Like Marconi's eviction it is cost-aware (FLOPs per byte), but it weighs by frequency and ages by
the clock instead of min-max-normalised recency, so a heap keeps it O(log n) per change.
"""

from __future__ import annotations

from policies.base import CONSUMED_REFRESH, PolicyPreset, eviction, register_preset
from policies.eviction import HeapEviction


@eviction("gdsf")
class GDSFEviction(HeapEviction):
    refresh = CONSUMED_REFRESH  # a hit references the node whose state it uses

    def attach(self, tree):
        super().attach(tree)
        self.clock = 0.0  # L: the priority of the last victim
        self._ref: dict = {}  # node -> [L when last referenced, F, last_access seen]

    def is_candidate(self, node):
        n = len(node.children)
        return node.lock == 0 and node.parent is not None and (n == 0 or (n == 1 and node.has_state))

    def add(self, node):
        self._ref[node] = [self.clock, 1, node.last_access]
        super().add(node)

    def update(self, node):
        ref = self._ref.get(node)
        if ref is None:
            return  # the root
        if node.last_access != ref[2]:  # referenced since: count it and restart from the clock
            ref[0] = self.clock
            ref[1] += 1
            ref[2] = node.last_access
        super().update(node)

    def remove(self, node):
        self._ref.pop(node, None)
        super().remove(node)

    def priority(self, node):
        L_ref, freq, _ = self._ref[node]
        tree = self.tree
        size = node.n_tokens * tree.kv_bytes_per_token + (tree.state_bytes if node.has_state else 0)
        cost = self.cost.node_flops(node.depth_tokens - node.n_tokens, node.depth_tokens) if node.has_state else 0.0
        return L_ref + freq * cost / size if size else L_ref

    def pop_victim(self):
        victim = super().pop_victim()
        if victim is not None:
            self.clock = self.priority(victim.node)
        return victim


register_preset(
    PolicyPreset(
        "gdsf",
        "GreedyDual-Size-Frequency eviction (Cherkasova 1998): clock + frequency x FLOPs saved / bytes; "
        "judicious admission",
        admission="judicious",
        eviction="gdsf",
        engine="baseline",
    )
)
