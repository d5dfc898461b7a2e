"""The Marconi artifact as published (``--compat paper``) and with its two bugs fixed (``paper-fixed``).

What it reproduces (docs/presets.md §2-§5; learned from the artifact's behaviour, none of its
code copied):

- replay: each request is one lookup, then one insert of input + output (sequential mode);
- a logical clock: +1 for the lookup, the insert call, the insert's own match and each eviction call;
- room is made for the artifact's own estimate of the insert's bytes (it may be off, even negative),
  and eviction stops on the bytes it *credits*, so the cache may end above capacity (counted as
  ``capacity_overshoots``); nothing is pinned;
- its tree: a split where an insert diverges inside an edge gets a (branch) state, and a merged
  node keeps the newer access time; its vLLM+ is a token tree with a state every block whose
  partial last block is filled by a longer insert;
- Marconi's candidates are listed depth-first (children in insertion order): ties go to the first;
- bug 1 (``paper`` only): the FLOP-efficiency numerator subtracts one attention layer's F(L_p)
  where it should subtract one MLP layer's;
- bug 2 (``paper`` only): a leaf eviction is credited with the edge of the last candidate scored,
  not the evicted one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.admission import JudiciousAdmission
from policies.base import AdmissionContext, AdmissionPolicy, EvictionPolicy, params_from
from policies.eviction import MarconiEviction
from sim.cache.tree import HybridRadixTree, MatchResult, Node
from sim.cost import ModelSpec
from sim.engine.simulation import Flight, Simulation
from traces.base import Request


class ArtifactCost:
    """The cost model as the artifact's eviction sees it: bug 1 adds
    ``n_mlp * (F_mlp(L_p) - F_attn(L_p))`` to a node's marginal FLOPs."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.bug_a = spec.n_mlp * (spec.mlp_layer_a - spec.attn_layer_a)
        self.bug_b = -spec.n_mlp * spec.attn_layer_b

    def node_flops(self, L_parent: int, L_node: int) -> float:
        v = self.spec.node_flops(L_parent, L_node)
        v += self.bug_a * L_parent + self.bug_b * L_parent * L_parent
        return v

    def node_bytes(self, L_node: int) -> int:
        return self.spec.node_bytes(L_node)


class ArtifactMarconiEviction(MarconiEviction):
    """Candidates in the artifact's depth-first order (ties go to the first); with ``bugs``, a leaf
    eviction is credited with the edge of the last candidate it scored (bug 2)."""

    def __init__(self, cost, params=None, *, bugs: bool) -> None:
        super().__init__(cost, params)
        self.bugs = bugs
        self._last_scored_tokens = 0

    def choose(self, idx: np.ndarray) -> int:
        if idx.size == 1:
            best = int(idx[0])
            if self.bugs:
                self._last_scored_tokens = self.node_at(best).n_tokens
            return best
        score = self.scores(idx)
        ties = idx[score <= score.min()]
        order = self._dfs_rank()
        best = int(ties[np.argmin(order[ties])]) if ties.size > 1 else int(ties[0])
        if self.bugs:
            last = int(idx[np.argmax(order[idx])])
            self._last_scored_tokens = self.node_at(last).n_tokens
        return best

    def _dfs_rank(self) -> np.ndarray:
        """Position of each slot in a depth-first pre-order walk (children in insertion order),
        the order the artifact lists its candidates in. O(nodes)."""
        rank = np.zeros(len(self._t), dtype=np.int64)
        i = 0
        stack = [self.tree.root]
        while stack:
            node = stack.pop()
            if node.slot >= 0:
                rank[node.slot] = i
                i += 1
            if node.children:
                stack.extend(reversed(node.children.values()))
        return rank

    def credited_kv_tokens(self, kv_tokens: int) -> int:
        """KV tokens the artifact's eviction loop believes it freed."""
        if self.bugs and kv_tokens:
            return self._last_scored_tokens
        return kv_tokens


@dataclass(slots=True)
class ArtifactContext(AdmissionContext):
    divergence_full: int | None = None  # where input + output leaves the tree


class ArtifactJudiciousAdmission(JudiciousAdmission):
    """The artifact stores its branch state with input + output (where that leaves the tree),
    never during prefill."""

    def prefill_checkpoints(self, match, ctx):
        return []

    def decode_checkpoints(self, match, ctx):
        cps = []
        if match.match_sym > match.hit_sym:
            div = ctx.divergence_full if ctx.divergence_full is not None else match.match_sym
            if 0 < div < ctx.n_full:
                cps.append(div)
        cps.append(ctx.n_full)
        return cps


class ArtifactTree(HybridRadixTree):
    """The artifact's tree: logical clock, estimated room, credited bytes (may overshoot)."""

    def __init__(self, *, split_states: bool, fill_block: int, **kwargs) -> None:
        # a split made where an insert diverges inside an edge gets a state (the artifact always
        # passes a branch state), and a merged node keeps the newer of the two access times
        self.split_states = split_states
        # its vLLM+ (token tree, a state every ``fill_block`` tokens): a leaf whose state ends
        # inside a block is a partial block; a longer insert fills it (its state moves on)
        self.fill_block = fill_block
        super().__init__(**kwargs)

    def set_time(self, t: float) -> float:
        self.now += 1  # logical clock: one tick per operation
        return self.now

    def _room_needed(self, seq, span, checkpoints, need_bytes):
        if need_bytes is not None:
            return need_bytes, None  # the artifact's own estimate: no planning walk
        need_kv, need_states, _ = self._plan(seq, span, checkpoints)
        return need_kv * self.kv_bytes_per_token + need_states * self.state_bytes, None

    def _apply(self, seq, span, checkpoints, now):
        return super()._apply(seq, span, checkpoints, self.now)  # the eviction call may have ticked

    def _over_capacity(self, used: int) -> None:
        self.stats.overshoots += 1
        self.stats.peak_overshoot_bytes = max(self.stats.peak_overshoot_bytes, used - self.capacity_bytes)

    def _after_split(self, node: Node, at_checkpoint: bool) -> None:
        if at_checkpoint or self.split_states:
            self._add_state(node)

    def _before_extend(self, node: Node) -> None:
        if (
            self.fill_block
            and node.has_state
            and not node.children
            and node is not self.root
            and node.depth_tokens % self.fill_block
        ):
            node.has_state = False  # fill the partial block: its state moves on
            self.n_states -= 1
            self._state_gone(node)

    def _evict_for(self, need: float) -> tuple[bool, int, int]:
        ev_states = ev_kv = 0
        credited = 0
        self.stats.eviction_calls += 1
        self.now += 1
        to_free = self.used_bytes + need - self.capacity_bytes
        while credited < to_free:
            policy = self.policy
            victim = policy.pop_victim()
            if victim is None:
                break  # the artifact inserts anyway once nothing is left (it never refuses)
            s, kv = self._apply_victim(victim)
            ev_states += s
            ev_kv += kv
            credit = getattr(policy, "credited_kv_tokens", None)
            kv_credit = credit(kv) if credit is not None else kv
            credited += s * self.state_bytes + kv_credit * self.kv_bytes_per_token
        return True, ev_states, ev_kv

    def evict(self, node: Node) -> tuple[int, int]:
        if self.split_states and node.children and node.has_state:
            (child,) = node.children.values()
            child.last_access = max(child.last_access, node.last_access)
        return super().evict(node)

    def _check_capacity(self) -> None:
        pass  # the artifact may end above capacity (stats.overshoots)


class ArtifactSimulation(Simulation):
    """The artifact's replay on the core engine (``bugs``: keep its two bugs)."""

    def __init__(self, trace, config, *, bugs: bool, **kwargs) -> None:
        self.bugs = bugs
        super().__init__(trace, config, **kwargs)

    # ---- parts
    def make_admission(self, name: str) -> AdmissionPolicy:
        if name == "judicious":
            return ArtifactJudiciousAdmission(params_from(JudiciousAdmission.Params, self.config))
        return super().make_admission(name)

    def make_eviction(self, name: str, alpha: float) -> EvictionPolicy:
        if name == "marconi":
            cost = ArtifactCost(self.spec) if self.bugs else self.spec
            return ArtifactMarconiEviction(
                cost, params_from(MarconiEviction.Params, self.config, alpha=alpha), bugs=self.bugs
            )
        return super().make_eviction(name, alpha)

    def tree_grid(self, grid: int) -> int:
        # its vLLM+ on a token trace: a token tree with a state every block (and at the end),
        # partial blocks matched as prefixes and filled later, as the artifact's block tree does
        self.paper_block = 0
        if self.preset.admission == "every-block" and self.trace.block_tokens == 1 and grid > 1:
            self.paper_block, grid = grid, 1
        return grid

    def make_tree(self, eviction: EvictionPolicy) -> HybridRadixTree:
        return ArtifactTree(
            split_states=self.admission.name == "judicious",
            fill_block=self.paper_block,
            policy=eviction,
            **self.tree_settings(),
        )

    def admission_context(self, m: MatchResult, seq_in, seq_full, tok_in) -> AdmissionContext:
        ctx = ArtifactContext(len(seq_in), len(seq_full), self.grid, input_tokens=tok_in)
        if isinstance(self.admission, ArtifactJudiciousAdmission) and m.match_sym > m.hit_sym:
            ctx.divergence_full = self.tree.match(seq_full).match_sym
        return ctx

    # ---- the artifact's replay of one request (sequential mode)
    def sequential_lookup(self, r: Request, t: float) -> Flight:
        """The lookup: +1 on the logical clock, refresh, record (nothing is pinned)."""
        if not self.preset.caching:
            return super().sequential_lookup(r, t)
        seq_in, seq_full, tok_in, tok_full = self.symbols(r)
        tree = self.tree
        now = tree.set_time(t)
        m = tree.match(seq_in, tokens=tok_in)
        hit_tokens = min(m.hit_tokens, tok_in)
        self._refresh(m, now)
        hit_ckpt = m.hit_node.ckpt if m.hit_sym > 0 and self.spec.is_hybrid else None
        for fn in self._on_lookup:
            fn(r, t, hit_ckpt, hit_tokens, tok_in)
        f = Flight(r, seq_in, seq_full, tok_in, tok_full, hit_tokens, [], [], None, m.match_tokens)
        self.served_at_once(f, t)
        return f

    def sequential_insert(self, f: Flight, t: float) -> None:
        """The insert call (+1), its own match of input + output (+1, refresh), room for the
        artifact's byte estimate, then the insert (Marconi: tail state; the branch state comes with
        the split; vLLM+: a state every block)."""
        if not self.preset.caching:
            return super().sequential_insert(f, t)
        tree = self.tree
        tree.set_time(t)  # insert()
        now = tree.set_time(t)  # insert's match of input + output
        seq_full, tok_full = f.seq_full, f.tok_full
        mf = tree.match(seq_full)
        self._refresh(mf, now)
        n = len(seq_full)
        if self.paper_block:
            cps = list(range(self.paper_block, n + 1, self.paper_block))
            if n % self.paper_block:
                cps.append(n)
        else:
            cps = [n]
        cut = self.full_cut(f.req, n, tok_full)  # a hash-block prompt's partial block inside seq_full
        res = tree.insert(seq_full, tok_full, cps, now, need_bytes=self._need(mf, tok_full), tag=(f, t), cut=cut)
        tree.refresh_inserted(res, tree.now, final=True)
        self._after_insert(res, f, t)

    def shadow_lookup(self, r: Request, t: float) -> Flight | None:
        return None  # shadows replay the whole artifact step when the request finishes

    def shadow_finish(self, f: Flight | None, r: Request, t: float) -> None:
        self.sequential_insert(self.sequential_lookup(r, t), t)

    def _refresh(self, m: MatchResult, now: float) -> None:
        """Marconi touches the deepest matched node; the LRU baselines touch the whole matched
        path (and SGLang+ the edge the match ends inside)."""
        tree = self.tree
        if not self.refresh_path:
            if m.hit_sym > 0:
                tree.touch(m.hit_node, now)
            return
        for node in m.path:
            tree.touch(node, now)
        if m.split_node is not None and not self.paper_block:
            tree.touch(m.split_node, now)  # SGLang+'s match also walks into the split edge

    def _need(self, mf: MatchResult, tok_full: int) -> float:
        """The artifact's estimate of the bytes an insert needs (it decides how much to evict)."""
        S, K = self.tree.state_bytes, self.tree.kv_bytes_per_token
        if self.paper_block:
            # vLLM+: (tokens beyond the matched blocks, counting the root as one block) / block
            # states plus their KV; may be negative
            pb = self.paper_block
            extra = tok_full - pb * (1 + -(-mf.hit_tokens // pb))
            return extra * S / pb + extra * K
        branch = mf.match_tokens > mf.hit_tokens
        return (2 if branch else 1) * S + (tok_full - mf.match_tokens) * K
