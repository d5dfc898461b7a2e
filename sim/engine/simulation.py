"""One simulation of a trace under one policy: the per-request steps (lookup, inserts, timing).

Request lifecycle in ``des`` mode (one simpy process per session, or per request for open-loop
traces):
1. arrival: look the input up, refresh per the policy, lock the matched path;
2. queue for a server (a simpy Resource), prefill the non-hit part (time from the cost model),
   insert the input's KV with the prefill-time checkpoints (branch state), release the server;
3. decode (continuous batching is approximated by letting decode run off the server),
   insert input + output with the tail state, unlock.
The next turn of a closed-loop session arrives ``think_time`` after the response finished.

``sequential`` mode is the Marconi artifact's semantics: requests in timestamp order (session
start + cumulative think times; generation time not added), lookup then immediately one insert
of input + output with every checkpoint, no concurrency.

This module holds the per-request steps; ``sim.engine.drivers`` runs them in either mode. Variants
(``sim.compat``) subclass ``Simulation`` and override its ``make_*`` factories and step hooks; a
tuner (``sim.tuning``) is attached from outside (``sim.simulate``) and switches the eviction policy
through ``set_eviction``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from policies.base import (
    ADMISSION,
    EVICTION,
    AdmissionContext,
    AdmissionPolicy,
    EvictionPolicy,
    PolicyPreset,
    get_preset,
    params_from,
)
from policies.engine_common import MAX_BLOCK_TOKENS
from sim.cache.blocks import block_symbols
from sim.cache.engine_tree import EngineTree, state_capacity
from sim.cache.tree import HybridRadixTree, MatchResult, Node, Span
from sim.config import UNLIMITED, SimConfig, format_size, parse_size
from sim.cost import GDN_CHUNK, ModelSpec, TimingModel, model_for, timing_for
from sim.engine.events import EVENTS, listeners
from sim.engine.metrics import DuelTuning, Recorder, ReplayTuning
from sim.engine.misses import MissLedger
from sim.errors import UsageError
from traces.base import Request, Trace, joined


class Tuner(Protocol):
    """What the drivers call on an attached tuner (``sim.tuning``), around each request's insert."""

    def seen(self, r: Request, t: float) -> None: ...
    def before_insert(self, k: int) -> None: ...
    def after_insert(self, k: int, r: Request, t: float) -> None: ...
    def summary(self) -> "DuelTuning | ReplayTuning": ...


@dataclass(slots=True)
class Flight:
    """A request between its lookup and its last insert."""

    req: Request
    seq_in: np.ndarray  # symbols inserted at prefill end
    seq_full: np.ndarray  # symbols inserted at decode end
    tok_in: int
    tok_full: int
    hit_tokens: int
    prefill_cps: list[int]
    decode_cps: list[int]
    locked: Node | None
    match_tokens: int = 0  # tokens the lookup matched (a state up to here sits on a branch point)
    tok_done: int = -1  # input + output tokens served (-1: tok_full; engines store one token less)
    match: MatchResult | None = None  # the lookup (admission is asked again when a scheduler's chunks are known)
    ctx: AdmissionContext | None = None  # what admission was told about the request
    cut: tuple[int, int] | None = None  # seq_full's partial prompt block, when symbols follow it (Span)
    held: int = 0  # KV tokens reserved for the running request's own blocks (EngineRules.running_blocks)
    held_states: int = 0  # state slots reserved for it (EngineRules.running_states)
    held_after: int = 0  # KV tokens of its own blocks charged only after its insert (``hold_running``)


class TreeEvents:
    """Turns the tree's reports into admit / evict / evict_kv events. Each report carries the tag
    of the insert or reserve making the change: ``(flight, t)``, the request it is made for (an
    admit's phase is its position in that request) and the simulated time that stamps the event."""

    __slots__ = ("on_admit", "on_evict", "on_evict_kv")

    def __init__(self, on_admit: tuple, on_evict: tuple, on_evict_kv: tuple) -> None:
        self.on_admit, self.on_evict, self.on_evict_kv = on_admit, on_evict, on_evict_kv

    def state_added(self, node: Node, tag: tuple[Flight, float]) -> None:
        f, t = tag
        pos = node.depth_tokens
        if pos >= f.tok_full:
            phase = "tail"
        elif pos > f.tok_in:
            phase = "decode"
        elif pos == f.tok_in:
            phase = "prompt-end"
        elif pos <= f.match_tokens:
            phase = "prefill-branch"
        else:
            phase = "chunk"
        for fn in self.on_admit:
            fn(t, node.ckpt, f.req, pos, phase)

    def state_removed(self, node: Node, tag: tuple[Flight | None, float]) -> None:
        t = tag[1]
        for fn in self.on_evict:
            fn(t, node.ckpt, node.depth_tokens)

    def kv_removed(self, tokens: int, tag: tuple[Flight | None, float]) -> None:
        t = tag[1]
        for fn in self.on_evict_kv:
            fn(t, tokens)


def off_grid_message(policy: str, step: int, block: int) -> str:
    """The refusal of a policy whose checkpoints (every ``step`` tokens) cannot sit on a hash-block
    trace's ``block``-token symbols, naming the way to run it anyway."""
    return (
        f"policy {policy} checkpoints every {step} tokens, finer than (or not a multiple of) the trace's "
        f"{block}-token blocks; --hash-block-tokens runs it on the trace spelled out as tokens"
    )


class Simulation:
    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        *,
        spec: ModelSpec | None = None,
        timing: TimingModel | None = None,
        progress=None,
        observers=(),
    ) -> None:
        config.validate()
        self.trace = trace
        self.config = config
        self.spec = spec or model_for(config)
        self.timing = timing or timing_for(config)
        self.preset: PolicyPreset = get_preset(config.policy)
        self.preset.check(self.spec, config)
        self.progress = progress
        self.auto_alpha = isinstance(config.alpha, str)  # "auto": start at 0, a tuner sets it
        self.alpha0 = 0.0 if self.auto_alpha else float(config.alpha)
        self._check_grid()
        hybrid = self.spec.is_hybrid
        if (
            hybrid
            and self.preset.caching
            and not self.preset.unlimited
            and config.capacity_bytes < self.spec.state_bytes()
        ):
            rules = self.preset.engine_rules(self.spec, config) if config.gpu_memory else None
            # the engine's own memory knob replaces --capacity (sglang's --gpu-memory): name it
            given = (
                f"--gpu-memory {config.gpu_memory}"
                if rules is not None and rules.memory
                else f"capacity {format_size(config.capacity_bytes)}"
            )
            raise UsageError(
                f"{given} is smaller than one state checkpoint of {config.model} "
                f"({format_size(self.spec.state_bytes())})"
            )
        self.admission = self.make_admission(self.preset.admission)
        self.tree = self.make_tree(self.make_eviction(self.preset.eviction, self.alpha0))
        self.tuner: Tuner | None = None
        self.rec = Recorder(len(trace.requests), self.spec)
        # why requests missed (sim.engine.misses); a shadow cache drops it (shadow_lookup)
        self.misses: MissLedger | None = MissLedger(
            len(trace.requests),
            trace.block_tokens,
            self.grid,
            self.preset.stores_last_token,
            bool(self.preset.lookup_cap_minus_one),
        )
        self.rec.misses = self.misses
        self._out_symbols: dict[int, np.ndarray] = {}  # request id -> the output symbols made for it
        #: request id -> its lookup's symbols (``symbols`` then ``stored``), for the requests looked
        #: up lately: a batching scheduler looks a waiting request up again at every step it cannot
        #: start, and re-hashing a long prompt into blocks each time was a sixth of an overloaded run
        self._looked_up: dict[int, tuple] = {}
        self._next_out_symbol: int | None = None
        #: prompts of at least this many tokens are aborted at arrival (the admission's
        #: ``input_limit`` of the engine's KV pool: SGLang's ``max_req_input_len``); None: none are
        self.input_limit = self._input_limit()
        self.observe(observers)

    def _input_limit(self) -> int | None:
        """The admission's ``input_limit`` of the KV pool as the tree holds it before anything
        runs, in tokens: the KV pool of the engine's own pools, or with one budget the capacity
        less one running request's state slots."""
        limit = getattr(self.admission, "input_limit", None)
        tree = self.tree
        per_token = tree.kv_bytes_per_token
        if limit is None or per_token <= 0 or self.preset.unlimited:
            return None
        if getattr(tree, "state_capacity", None) is not None:
            kv = tree.kv_capacity_bytes
        else:
            slots = self.admission.running_state_slots if self.spec.is_hybrid else 0
            kv = tree.capacity_bytes - slots * tree.state_bytes
        return limit(int(kv // per_token))

    def aborts(self, r: Request) -> bool:
        """Whether the engine aborts ``r`` when it arrives: its prompt is at least ``input_limit``."""
        return self.input_limit is not None and r.n_input_tokens(self.trace.block_tokens) >= self.input_limit

    def abort(self, r: Request, t: float) -> None:
        """``r`` is aborted at its arrival ``t`` (``aborts``): nothing of it is looked up, computed or
        cached, and no event is emitted; the recorder marks it ``aborted`` and leaves it out of the
        hit rates (``Recorder.abort``)."""
        self.rec.abort(r, t, int(r.n_input_tokens(self.trace.block_tokens)))
        if self.progress is not None:
            self.progress.update(1)

    def observe(self, observers=()) -> None:
        """Send the event stream (``sim.engine.events``) to the recorder and ``observers``; each
        event goes only to the observers that define its method."""
        self._extra_observers = tuple(observers)
        self.observers = (self.rec, *observers) if self.misses is None else (self.rec, self.misses, *observers)
        on = {e: listeners(self.observers, e) for e in EVENTS}
        self._on_lookup, self._on_prefill, self._on_decode = on["lookup"], on["prefill"], on["decode"]
        self._on_reject, self._on_occupancy = on["reject"], on["occupancy"]
        tree_events = on["admit"] or on["evict"] or on["evict_kv"]
        self.tree.listener = TreeEvents(on["admit"], on["evict"], on["evict_kv"]) if tree_events else None

    # ------------------------------------------------------------------ factories (variants override)
    def make_admission(self, name: str) -> AdmissionPolicy:
        """The admission policy registered as ``name``, its knobs read from the config."""
        cls = ADMISSION[name]
        return cls(params_from(cls.Params, self.config))

    def make_eviction(self, name: str, alpha: float) -> EvictionPolicy:
        """A fresh eviction policy registered as ``name``, its knobs read from the config
        (``alpha``: Marconi's weight, which a tuner may choose)."""
        cls = EVICTION[name]
        return cls(self.spec, params_from(cls.Params, self.config, alpha=alpha))

    def tree_settings(self) -> dict:
        """Sizes and grid of the tree, as keyword arguments of ``HybridRadixTree``."""
        return dict(
            capacity_bytes=UNLIMITED if self.preset.unlimited else self.config.capacity_bytes,
            kv_bytes_per_token=self.spec.kv_bytes_per_token(),
            state_bytes=self.spec.state_bytes(),
            block_tokens=self.grid,
            hybrid=self.spec.is_hybrid,
        )

    def make_tree(self, eviction: EvictionPolicy) -> HybridRadixTree:
        rules = self.preset.engine_rules(self.spec, self.config)
        if rules is None:
            return HybridRadixTree(policy=eviction, **self.tree_settings())
        settings = self.tree_settings()  # an engine preset: the engines' cache variant
        if rules.state_bytes and self.spec.is_hybrid:  # the engine's own charge for a state
            settings["state_bytes"] = rules.state_bytes
        if rules.capacity_unit and settings["capacity_bytes"] < UNLIMITED:  # whole engine blocks
            settings["capacity_bytes"] = settings["capacity_bytes"] // rules.capacity_unit * rules.capacity_unit
        if rules.memory:  # the engine's own memory knob (--gpu-memory) replaces --capacity
            settings["capacity_bytes"] = parse_size(rules.memory)
        pool = state_capacity(rules, self.spec.state_bytes(), self.config.state_pool, settings["capacity_bytes"])
        return EngineTree(rules, state_capacity=pool, policy=eviction, **settings)

    def restore_tree(self, tree: HybridRadixTree) -> None:
        """Continue from ``tree`` (a snapshot of a cache, e.g. the tuner's) instead of the empty one."""
        tree.listener = self.tree.listener
        self.tree = tree

    def set_eviction(self, policy: EvictionPolicy) -> None:
        """Evict with ``policy`` from now on, keeping the cache (tuners switch candidates so)."""
        tree = self.tree
        tree.policy = policy
        policy.attach(tree)
        for node in tree.iter_nodes():
            if node is not tree.root:
                node.slot = -1
                policy.add(node)
        tree.recount_evictable()  # a locked state's share follows the policy's keys

    @property
    def refresh_path(self) -> bool:
        """Whether the refresh rule in force moves the walked path (the artifact's replay)."""
        return self.tree.refresh.hit != "consumed"

    def _check_grid(self) -> None:
        B = self.trace.block_tokens
        pg = self.preset.grid_for(self.spec, self.config)
        grid = max(pg, B)
        if pg > 1 and (pg < B or pg % B):
            raise UsageError(off_grid_message(self.preset.name, pg, B))
        self.preset.check_blocks(self.spec, self.config, B)
        if (
            self.config.state_alignment == "chunk"
            and B > 1
            and max(B, self.config.chunk_size) % min(B, self.config.chunk_size)
        ):
            raise UsageError(
                f"--chunk-size {self.config.chunk_size} does not line up with the trace's {B}-token blocks"
            )
        self.grid = self.tree_grid(grid)
        self.regrid = self.grid // B  # > 1: symbols are re-hashed into coarser blocks
        if self.regrid > MAX_BLOCK_TOKENS:
            raise UsageError(
                f"policy {self.preset.name} needs {self.grid}-token blocks on this trace, more than the "
                f"{MAX_BLOCK_TOKENS} the simulator hashes"
            )

    def tree_grid(self, grid: int) -> int:
        """Hook: the tree's granularity in tokens, given the policy's."""
        return grid

    # ------------------------------------------------------------------ per-request steps
    def symbols(self, r: Request) -> tuple[np.ndarray, np.ndarray, int, int]:
        B = self.trace.block_tokens
        tok_in = r.n_input_tokens(B)
        tok_full = tok_in + r.n_output_tokens(B)
        out = r.output_tokens
        if B > 1 and not len(out) and tok_full > tok_in:
            out = self.output_symbols(r, tok_full - tok_in)
        full = joined(r.input_tokens, out)  # a view of the trace's buffer where they meet in it
        if self.regrid == 1:
            return r.input_tokens, full, tok_in, tok_full
        g = self.regrid
        sym_full = block_symbols(full, g)
        # only whole input blocks are cached at prefill end; the partial one ends inside a block
        sym_in = sym_full[: len(r.input_tokens) // g]
        # tok_in stays the real prompt length (hit-rate denominator, prefill time); the prefill
        # insert covers the whole blocks only (insert_prefill)
        return sym_in, sym_full, tok_in, tok_full

    def output_symbols(self, r: Request, tokens: int) -> np.ndarray:
        """Symbols for the ``tokens`` output tokens of a hash-block request whose trace gave none
        (one per started block, fresh: below every symbol of the trace, as the hash-block loaders
        number outputs), so that the output is stored after the prompt in every mode."""
        syms = self._out_symbols.get(r.request_id)
        if syms is None:
            if self._next_out_symbol is None:
                low = min(
                    min(int(q.input_tokens.min(initial=0)), int(q.output_tokens.min(initial=0)))
                    for q in self.trace.requests
                )
                self._next_out_symbol = low - 1
            k = -(-tokens // self.trace.block_tokens)
            first = self._next_out_symbol
            syms = np.arange(first, first - k, -1, dtype=np.int64)
            self._next_out_symbol = first - k
            self._out_symbols[r.request_id] = syms
        return syms

    def full_cut(self, r: Request, n_full: int, tok_full: int) -> tuple[int, int] | None:
        """Where the stored sequence (``n_full`` tree symbols, ``tok_full`` tokens) has a partial
        symbol before its last: a hash-block prompt's partial last block with output symbols after
        it (``Span``'s ``cut``: the first k symbols hold that many tokens); None when there is none."""
        B = self.trace.block_tokens
        n_in = len(r.input_tokens)
        tok_in = r.n_input_tokens(B)
        if B == 1 or tok_in >= n_in * B:
            return None
        g = self.regrid
        k = -(-n_in // g)  # tree symbols up to the one holding the partial block
        if k >= n_full:
            return None
        return k, min(tok_in + (k * g - n_in) * B, tok_full)

    def stored(self, r: Request, seq_full: np.ndarray, tok_full: int) -> tuple[np.ndarray, int]:
        """What a finished request leaves in the cache: input + output (the paper's rule), or,
        for engine presets, input + output - 1 tokens: the last sampled token is never run
        through the model, so neither its KV nor a state after it exists."""
        if self.preset.stores_last_token or tok_full <= r.n_input_tokens(self.trace.block_tokens):
            return seq_full, tok_full
        if self.trace.block_tokens == 1 and len(r.output_tokens):
            full = joined(r.input_tokens, r.output_tokens[:-1])
            return (full if self.regrid == 1 else block_symbols(full, self.regrid)), tok_full - 1
        # hash blocks: the last output block holds a token less; a block left empty goes
        n, tok = len(seq_full), tok_full - 1
        if Span(n, self.grid, tok, self.full_cut(r, n, tok)).tokens(n - 1) >= tok:
            seq_full = seq_full[:-1]
        return seq_full, tok

    #: how many requests' lookup symbols ``_lookup_symbols`` keeps (oldest first out)
    LOOKUP_MEMO = 4096

    def _lookup_symbols(self, r: Request) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """``symbols(r)`` with ``stored`` applied to its full sequence: (prompt symbols, stored
        symbols, prompt tokens, prompt + output tokens, stored tokens); each a function of the
        request alone, kept for the ``LOOKUP_MEMO`` requests looked up last."""
        got = self._looked_up.get(r.request_id)
        if got is None:
            seq_in, seq_full, tok_in, tok_done = self.symbols(r)  # tok_in: the real prompt length
            seq_full, tok_full = self.stored(r, seq_full, tok_done)
            got = (seq_in, seq_full, tok_in, tok_done, tok_full)
            if self.LOOKUP_MEMO > 0:
                if len(self._looked_up) >= self.LOOKUP_MEMO:
                    del self._looked_up[next(iter(self._looked_up))]
                self._looked_up[r.request_id] = got
        return got

    def lookup(self, r: Request, t: float, lock: bool, tokens: int | None = None) -> Flight:
        """``r``'s prefix lookup. ``tokens``: the prompt and the tokens it generated before a
        preemption, where the preset's engine matches them all (``Seq.target``; None: the prompt)."""
        seq_in, seq_full, tok_in, tok_done, tok_full = self._lookup_symbols(r)
        if not self.preset.caching:
            if self.misses is not None:
                self.misses.looked_up(r, 0, tok_in)
            for fn in self._on_lookup:
                fn(r, t, None, 0, tok_in)
            return Flight(r, seq_in, seq_full, tok_in, tok_full, 0, [], [], None, 0, tok_done)
        cut = self.full_cut(r, len(seq_full), tok_full)
        tree = self.tree
        now = tree.set_time(t)
        cap = None
        if self.preset.lookup_cap_minus_one and (tokens is None or tokens <= tok_in):
            # at least one prompt token is recomputed: hit <= input_len - 1 tokens, in grid symbols
            cap = max((tok_in - 1) // self.grid, 0)
        # else a preempted request's generated tokens are the ones recomputed (SGLang matches a
        # retracted request's prompt + output capped at their count - 1, rule 20): the whole prompt
        # may hit (the walk stays in the prompt: past it lie this request's output tokens, which
        # the engine freed at the preemption)
        m = tree.lookup(seq_in, max_hit_sym=cap, now=now, tokens=tok_in)
        hit_tokens = min(m.hit_tokens, tok_in)
        ctx = self.admission_context(m, seq_in, seq_full, tok_in)
        ctx.full_tokens = tok_full
        ctx.match_tokens = m.match_sym * self.grid
        ctx.full_cut = cut
        prefill_cps = self.admission.prefill_checkpoints(m, ctx)
        decode_cps = self.admission.decode_checkpoints(m, ctx)
        locked = None
        if lock and m.hit_sym > 0:
            locked = m.hit_node
            tree.lock(locked)
        hit_ckpt = m.hit_node.ckpt if m.hit_sym > 0 and self.spec.is_hybrid else None
        if self.misses is not None:
            self.misses.looked_up(r, hit_tokens, tok_in)
            lost = getattr(self.admission, "speculation_lost", None)  # vLLM's EAGLE / MTP block drop
            if lost is not None:
                self.misses.speculative(r, lost(m, ctx), t)
        for fn in self._on_lookup:
            fn(r, t, hit_ckpt, hit_tokens, tok_in)
        return Flight(
            r,
            seq_in,
            seq_full,
            tok_in,
            tok_full,
            hit_tokens,
            prefill_cps,
            decode_cps,
            locked,
            min(m.match_tokens, tok_in),
            tok_done,
            m,
            ctx,
            cut,
        )

    def touch_prefix(self, r: Request, t: float, tokens: int) -> None:
        """Refresh the cached prefix of waiting request ``r`` as a lookup would, holding, counting
        and reporting nothing: SGLang's ``touch_waiting_prefix`` (``mem_cache/common.py``
        L215-L218) walks the tree with the request's prompt and the tokens it generated before a
        preemption (``tokens`` in all), uncapped, and applies the match's refresh
        (``UnifiedRadixCache.touch_prefix``, ``unified_radix_cache.py`` L647-L652)."""
        if not self.preset.caching:
            return
        seq_in, _, tok_in, _, _ = self._lookup_symbols(r)  # a waiting request is touched every pass
        seq = seq_in if tokens <= tok_in else self.symbols(r)[1][: tokens // self.grid]
        tree = self.tree
        tree.forget(tree.lookup(seq, now=tree.set_time(t)))

    def replan_prefill(self, f: Flight, step_ends: list[int]) -> None:
        """A batching scheduler reports where ``f``'s prefill steps ended (token positions, the
        last at the prompt's end): an admission that places states at step ends chooses them again."""
        if f.ctx is None or not self.admission.uses_prefill_steps:
            return
        f.ctx.prefill_steps = tuple(step_ends)
        f.prefill_cps = self.admission.prefill_checkpoints(f.match, f.ctx)

    def admission_context(
        self, m: MatchResult, seq_in: np.ndarray, seq_full: np.ndarray, tok_in: int
    ) -> AdmissionContext:
        """Hook: what admission is told about the request besides its match."""
        return AdmissionContext(len(seq_in), len(seq_full), self.grid, input_tokens=tok_in)

    def insert_prefill(self, f: Flight, t: float) -> bool:
        """Insert the input's KV with the prefill-time states; returns whether anything was inserted."""
        if not self.preset.caching or len(f.seq_in) == 0:
            return False
        if not f.prefill_cps and self.spec.is_hybrid:
            return False  # KV without a state at its end cannot serve a hybrid hit; decode-end insert stores it
        now = self.tree.set_time(t)
        res = self.tree.insert(
            f.seq_in,
            f.tok_in if self.regrid == 1 else min(len(f.seq_in) * self.grid, f.tok_in),
            f.prefill_cps,
            now,
            lock=True,
            protect=f.locked,
            tag=(f, t),
        )
        if f.locked is not None:
            self.tree.unlock(f.locked)
        f.locked = res.end_node if res.inserted else None
        self._after_insert(res, f, t)
        return res.inserted

    def prefill_checkpoints_at(self, f: Flight, step_ends) -> list[int]:
        """The admission's prefill checkpoints of ``f`` (symbols) had its prefill steps ended at
        ``step_ends`` (tokens): what the preset keeps of a prompt computed so far. ``f.ctx``'s own
        steps are put back after."""
        ctx = f.ctx
        whole = ctx.prefill_steps
        ctx.prefill_steps = tuple(step_ends)
        try:
            return self.admission.prefill_checkpoints(f.match, ctx)
        finally:
            ctx.prefill_steps = whole

    def chunk_checkpoints(self, f: Flight, step_ends: list[int], published: int) -> tuple[int, list[int]] | None:
        """A batching scheduler's prefill step ended inside the prompt, at ``step_ends[-1]`` tokens,
        and the admission publishes every chunk (``publishes_chunks``: SGLang's
        ``checkpoint_kv_cache`` after each chunk): the prompt's symbols computed so far and the
        prefill states of the steps since ``published`` tokens (an earlier chunk's state went in
        with it; one evicted since is not taken again), or None when nothing would be inserted (no
        new symbol; on a hybrid model, no state: as ``insert_prefill``, KV without a state is not
        inserted)."""
        k = min(step_ends[-1] // self.grid, len(f.seq_in))
        if not self.preset.caching or f.ctx is None or f.match is None or k <= f.match.hit_sym:
            return None
        done = published // self.grid
        cps = [c for c in self.prefill_checkpoints_at(f, step_ends) if done < c <= k]
        if not cps and self.spec.is_hybrid:
            return None
        return k, cps

    def insert_chunk(self, f: Flight, k: int, cps: list[int], t: float) -> bool:
        """Insert the prompt's first ``k`` symbols with the states ``cps`` (``chunk_checkpoints``);
        the lock moves to its end. Returns whether anything was inserted."""
        now = self.tree.set_time(t)
        res = self.tree.insert(
            f.seq_in[:k], min(k * self.grid, f.tok_in), cps, now, lock=True, protect=f.locked, tag=(f, t)
        )
        if f.locked is not None:
            self.tree.unlock(f.locked)
        f.locked = res.end_node if res.inserted else None
        self._after_insert(res, f, t)
        return res.inserted

    def insert_decode(self, f: Flight, t: float) -> None:
        if not self.preset.caching:
            return
        now = self.tree.set_time(t)
        cps = f.decode_cps if not f.prefill_cps else sorted(set(f.prefill_cps) | set(f.decode_cps))
        res = self.tree.insert(f.seq_full, f.tok_full, cps, now, protect=f.locked, tag=(f, t), cut=f.cut)
        if f.locked is not None:
            self.tree.unlock(f.locked)
            f.locked = None
        if f.match is not None and getattr(self.tree, "duplicate_kv", False):
            self.tree.cache_again(f.match, tag=(f, t))  # before the refresh: older copies keep their recency
        self.tree.refresh_inserted(res, now, final=True)
        self._after_insert(res, f, t)

    def end_state(self, f: Flight, prompt_in: bool) -> int | None:
        """A request's end insert for an admission whose engine checkpoints every chunk
        (``publishes_chunks``: SGLang): one state per insert, the deepest taken since the last
        checkpoint (the decode states, and the prompt's when ``prompt_in`` is False: its insert
        did not happen), so the end does not refresh the prompt's states (``components/mamba.py``
        ``commit_insert_component_data`` L227-L252). Sets ``f``'s checkpoints to it and returns it
        (-1: none, on a model without states); None when a hybrid model's request has none: the
        engine inserts nothing then (``end_without_insert``)."""
        pending = set(f.decode_cps) if prompt_in else set(f.prefill_cps) | set(f.decode_cps)
        f.prefill_cps, f.decode_cps = [], sorted(pending)[-1:]
        if f.decode_cps:
            return f.decode_cps[-1]
        return None if self.spec.is_hybrid and self.preset.caching else -1

    def end_without_insert(self, f: Flight, t: float) -> None:
        """The request ends with nothing new for the cache: its lock goes, nothing is inserted or
        refreshed (SGLang extra_buffer with no track since its last checkpoint: a checkpoint clears
        ``mamba_last_track_seqlen``, ``components/mamba.py`` ``cleanup_after_caching_req``
        L726-L727, so the final ``prepare_for_caching_req`` gives a cache length of 0, L628-L633 /
        L582-L593, and ``checkpoint_into_tree`` inserts nothing, ``unified_radix_cache.py``
        L1220-L1225)."""
        if f.locked is not None:
            self.tree.set_time(t)
            self.tree.unlock(f.locked)
            f.locked = None

    def _after_insert(self, res, f: Flight, t: float) -> None:
        tree = self.tree
        if not res.inserted:
            if self.misses is not None:
                g = self.grid
                self.misses.rejected(f.req, [c * g for c in set(f.prefill_cps) | set(f.decode_cps)], t)
            for fn in self._on_reject:
                fn(f.req, t, "no room")
        if self._on_occupancy:
            kv, st = tree.kv_tokens * tree.kv_bytes_per_token, tree.n_states * tree.state_bytes
            for fn in self._on_occupancy:
                fn(t, kv, st)

    def served(
        self, f: Flight, t_start: float, prefill_s: float, t_prefilled: float, decode_s: float, t_done: float | None
    ) -> None:
        """Emit the request's prefill event and, when ``t_done`` is known, its decode event."""
        r = f.req
        for fn in self._on_prefill:
            fn(r, t_start, t_prefilled, f.hit_tokens, f.tok_in, prefill_s)
        if t_done is not None:
            self.decoded(f, t_prefilled, decode_s, t_done)

    def decoded(self, f: Flight, t_start: float, decode_s: float, t_done: float) -> None:
        end = f.tok_done if f.tok_done >= 0 else f.tok_full
        for fn in self._on_decode:
            fn(f.req, t_start, t_done, f.tok_in, end, decode_s)

    # ------------------------------------------------------------------ one sequential request
    def sequential_lookup(self, r: Request, t: float) -> Flight:
        """Sequential mode, first half: the lookup, timed as if served at once."""
        f = self.lookup(r, t, lock=True)
        f.decode_cps = sorted(set(f.prefill_cps) | set(f.decode_cps))
        f.prefill_cps = []
        if getattr(self.tree, "admit_from_anchor", False):  # its insert makes room as LMDeploy admits it
            self.tree.admitting = (f.hit_tokens, f.tok_in, f.tok_full)
        self.hold_running(f, t)
        self.served_at_once(f, t)
        return f

    def hold_running(self, f: Flight, t: float) -> None:
        """Sequential mode: charge the blocks the running request holds that the cache never keeps
        (``EngineRules.running_blocks``: vLLM's running-state block per Mamba group, and the partial
        last KV block), from its lookup to its last insert; evicting for them as the engine
        allocates them from the same pool. Nothing is charged when they cannot be found."""
        groups = getattr(self.tree, "running_blocks", 0)
        if not groups or not self.preset.caching:
            return
        B = self.tree.extent_block or self.grid
        shape = getattr(self.admission, "running_blocks", None)  # the engine's own peak, if it says
        if shape is not None and f.ctx is not None:
            blocks = shape(f.hit_tokens, f.ctx, {c * self.grid for c in f.decode_cps}, groups)
        else:
            blocks = groups + (1 if f.tok_full % B else 0)
        tokens = blocks * B
        states = getattr(self.tree, "running_states", 0)
        self.tree.set_time(t)
        if getattr(self.tree, "pages_one_by_one", False):
            # TensorRT-LLM: the live state's page is taken when the request resumes, its own
            # blocks past the tree's (the partial block at its last snapshot point, the decode)
            # after its snapshots are committed (``_snapshotSsmToTreeBlock`` before the decode's
            # ``resize``): they are charged after the insert (``sequential_insert``)
            f.held_after, tokens = tokens, 0
        if self.tree.reserve(tokens, states, tag=(f, t)):
            f.held, f.held_states = tokens, states

    def hold_own_pages(self, f: Flight, t: float, capacity: int) -> None:
        """``--scheduler fcfs`` with the engine's page pools (``pages_one_by_one``): charge the KV
        pages the running request holds of its own while its capacity is ``capacity`` tokens
        (``own_blocks``: the private copy of a partially matched block from its lookup, the partial
        block at its last snapshot point from its prefill's end), evicting for them as the engine
        allocates them; ``capacity`` 0 gives them all back. The decode's pages come at the end
        (``sequential_insert``: ``held_after`` less what is held already)."""
        shape = getattr(self.admission, "own_blocks", None)
        if shape is None or f.ctx is None or not getattr(self.tree, "running_blocks", 0):
            return
        B = self.tree.extent_block or self.grid
        tokens = shape(f.hit_tokens, f.ctx, capacity) * B if capacity else 0
        self.tree.set_time(t)
        if tokens > f.held:
            if self.tree.reserve(tokens - f.held, 0, tag=(f, t)):
                f.held_after = max(0, f.held_after - (tokens - f.held))
                f.held = tokens
        elif tokens < f.held:
            self.tree.release(f.held - tokens, 0)
            f.held_after += f.held - tokens
            f.held = tokens

    def sequential_insert(self, f: Flight, t: float) -> None:
        """Sequential mode, second half: one insert of input + output with every checkpoint, then
        the running request's own blocks are given back."""
        self.insert_decode(f, t)
        self.finish_running(f, t)

    def forget_lost_states(self, f: Flight) -> None:
        """After ``f``'s prefill insert: its prompt states evicted since are left out of its end
        insert (an engine that snapshots the prompt only while it computes it cannot put one back:
        ``snapshots_in_context_only``)."""
        node, kept = f.locked, set()
        while node is not None and node is not self.tree.root:
            if node.has_state:
                kept.add(node.depth_sym)
            node = node.parent
        f.prefill_cps = [c for c in f.prefill_cps if c in kept]

    def finish_running(self, f: Flight, t: float) -> None:
        """The running request's own blocks charged only after its insert (``held_after``: the
        decode's pages), then all it held given back."""
        if f.held_after:  # evicts for them, then they go with the request
            if self.tree.reserve(f.held_after, 0, tag=(f, t)):
                f.held += f.held_after
            f.held_after = 0
        if f.held or f.held_states:
            self.tree.release(f.held, f.held_states)
            f.held = f.held_states = 0

    def served_at_once(self, f: Flight, t: float) -> None:
        """Sequential mode: the request is served at its arrival (prefill, then decode events)."""
        p, d = self.prefill_s(f), self.decode_s(f)
        r = f.req
        for fn in self._on_prefill:  # inlined (one call per request less): the sequential hot path
            fn(r, t, t + p, f.hit_tokens, f.tok_in, p)
        end = f.tok_done if f.tok_done >= 0 else f.tok_full
        for fn in self._on_decode:
            fn(r, t + p, t + p + d, f.tok_in, end, d)

    def shadow_lookup(self, r: Request, t: float) -> Flight | None:
        """A shadow cache (duel tuner) sees a request arrive: look it up and pin the match. A
        shadow keeps no miss ledger (its results are never reported)."""
        if self.misses is not None:
            self.misses = self.rec.misses = None
            self.observe(self._extra_observers)
        return self.lookup(r, t, lock=True)

    def shadow_finish(self, f: Flight | None, r: Request, t: float) -> None:
        """A shadow cache sees the request finish: one insert of input + output."""
        f.decode_cps = sorted(set(f.prefill_cps) | set(f.decode_cps))
        f.prefill_cps = []
        self.insert_decode(f, t)

    def prefill_s(self, f: Flight) -> float:
        if self.config.ttft_model == "jamba":
            return self.timing.jamba_ttft_s(f.tok_in - f.hit_tokens)
        if self.timing.charges_splits:  # skip counting splits for a model that ignores them
            return self.timing.prefill_time_s(self.spec, f.hit_tokens, f.tok_in, splits=self.prefill_splits(f))
        return self.timing.prefill_time_s(self.spec, f.hit_tokens, f.tok_in)

    def prefill_splits(self, f: Flight) -> int:
        """Extra kernel calls of the prefill: a state admitted inside the computed part of the
        prompt off a kernel chunk boundary splits the call there (exact alignment)."""
        if not self.spec.n_gdn:
            return 0
        g = self.grid
        cps = f.prefill_cps or [c for c in f.decode_cps if c * g < f.tok_in]
        return sum(1 for c in cps if f.hit_tokens < c * g < f.tok_in and (c * g) % GDN_CHUNK)

    def decode_s(self, f: Flight) -> float:
        """The decode after the prefill: the prefill samples the first output token (TTFT is its
        end), each later token takes a decode step, as the continuous engine's steps do."""
        end = f.tok_done if f.tok_done >= 0 else f.tok_full
        return self.timing.decode_time_s(max(end - f.tok_in - 1, 0))
