"""``--scheduler continuous``: one engine stepping batches, vLLM v1-style chunked prefill.

Each step the engine packs, up to ``--max-num-batched-tokens`` tokens and ``--max-num-seqs``
running requests:
1. the running requests in the order they were admitted: one decode token each, or the next
   chunk of a prefill still under way (as many tokens as the budget has left; an engine that cuts
   its chunks on a grid says so through its admission's ``schedule_chunk``);
2. then waiting requests, oldest first: a request's prefix lookup happens here, when it is first
   scheduled (not at its arrival), and its first chunk starts after the hit.
The step lasts ``timing.step_time_s(spec, prefills, decode_contexts)`` (the whole batch). The step
that computes a prompt's last token also samples its first output token (TTFT); each later step
decodes one more token. A request whose prefill ended learns where its chunks ended
(``Simulation.replan_prefill``), so the states an engine preset places at chunk ends sit where this
scheduler cut the chunks. A preset whose engine publishes every chunk (``publishes_chunks``: SGLang
checkpoints a chunked request before the next step matches new ones) inserts the prompt's KV and
states so far after each chunk that ends inside the prompt. A waiting request looked up in a step
whose chunk rounds to nothing (``schedule_chunk`` returns 0) gives its lookup back and is looked up
again when it is scheduled, as the engines match a waiting request on every pass.

Memory: every running request holds ``admission.running_state_slots`` state slots (hybrid models)
and the KV of the tokens it computed beyond its hit, charged against the cache's capacity
(``HybridRadixTree.reserve``: cached entries are evicted to make room; with ``--state-pool`` the
slots come from the state pool and the KV from the KV pool). When a running request's next tokens
do not fit, the newest running request is preempted (vLLM's recompute preemption): it gives back
its memory and its locks and goes to the front of the waiting queue, to be looked up and
prefilled again (prompt plus the tokens already generated) when there is room. An admission that
``retracts_by_length`` (SGLang) retracts decoding requests by its engine's order instead (fewest
output tokens, then longest prompt) to the end of the queue, one that ``matches_generated`` looks
a preempted request up with its generated tokens too (its whole prompt may hit), and one with
``states_per_running_request`` runs at most its state pool // that many requests. A waiting request
that does not fit waits (an admission that ``rematches_waiting``: holding nothing, and evicting
nothing for it when it would not fit even with every evictable entry gone, ``could_reserve``). A
request too large to fit even alone is run anyway and counted in
``memory_overshoots`` (no request is ever dropped).

Speed: per-step work is O(batch). A run of decode-only steps in which nothing changes (no prefill,
no request finishing, no arrival) is advanced in one event: when the timing model gives its first
and last step the same time (the memory-bound decode time) every step is that long, otherwise up
to ``VARIABLE_RUN`` steps are timed one by one; an arrival in the middle ends the run at the next
step boundary. Such a run is one ``step`` event with ``steps`` > 1. Where KV is charged in whole
blocks (``running_kv_block``) a run stops before a step that enters a new block: that step is
scheduled on its own, as the engine allocates then.

Simplifications: KV is charged per token, or in whole blocks where the admission says its engine
allocates them so (``running_kv_block``: vLLM; the prompt's partial last block stays the
request's, since its cache keeps whole blocks), or in the engine's own pages (``own_page``:
TensorRT-LLM with its two pools, whose chunks ending on a snapshot point are committed there); a request's prompt KV, once
inserted into the cache at prefill end, is the cache's (locked until the request ends), not the
request's; the KV of a decode run is charged at the run's start.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import simpy

from sim.engine.events import listeners
from sim.engine.simulation import Flight, Simulation
from policies.base import PolicyError
from traces.base import Request


#: decode steps timed one by one in a run when the timing model's step time varies along it
VARIABLE_RUN = 64


@dataclass(slots=True, eq=False)
class Seq:
    """A request inside the engine."""

    req: Request
    done: simpy.Event
    n_in: int = 0  # prompt tokens
    n_out: int = 0  # output tokens to produce
    f: Flight | None = None  # its lookup (None: waiting for one)
    target: int = 0  # tokens the (re)prefill computes: prompt + tokens already generated
    pos: int = 0  # tokens whose KV is computed
    decoded: int = 0  # output tokens produced
    held_kv: int = 0  # KV tokens charged to the cache's capacity
    held_states: int = 0  # state slots charged
    kept_prefill: int = 0  # of them, prefill states the engine keeps, held until the prompt's insert
    decode_in: int = 0  # tokens of its decode whose KV and kept states went into the cache (``_publish_decode``)
    publish: int = 0  # a kept decode state's position to put into the cache at this step's end (0: none)
    step_ends: list[int] = field(default_factory=list)  # where this prefill's chunks ended
    #: block boundary -> end of the step that computed the token there (``kv_unit`` engines: the
    #: state block before it is freed at the next step)
    free_at: dict[int, float] = field(default_factory=dict)
    #: ``free_at`` indexed by time: time -> boundaries set to it (an entry set again since stays
    #: in its old list; ``due``, which finds the boundaries due at a step's end without a scan
    #: over all of ``free_at``, skips it)
    free_by_time: dict[float, list[int]] = field(default_factory=dict)
    inserted: bool = False  # the prompt's insert of this prefill is done
    prompt_in: bool = False  # ... and put the prompt's states into the cache
    published: int = 0  # prompt tokens whose KV a chunk's insert handed to the cache (publishes_chunks)
    t_first: float = math.nan  # first scheduled (queueing delay ends)
    tuned: bool = False  # tune_before has seen its first lookup
    t_token: float = math.nan  # first output token

    # ---- its progress (the engine reads these; only these methods write them)
    @property
    def prefilling(self) -> bool:
        """Tokens of its (re)prefill are still to compute."""
        return self.pos < self.target

    @property
    def finished(self) -> bool:
        return self.decoded >= self.n_out

    def looked_up(self, f: Flight) -> None:
        """Its lookup ``f``: the prefill starts after the hit (a whole-prompt hit still
        recomputes the last token)."""
        self.f = f
        self.pos = int(min(f.hit_tokens, self.target - 1))

    def prefilled(self, end: int) -> None:
        """A chunk of its prefill ran up to ``end``."""
        self.pos = end
        self.step_ends.append(end)

    def sampled(self) -> None:
        """The step that computed its last prefill token sampled an output token."""
        if self.decoded < self.n_out:
            self.decoded += 1

    def set_free_at(self, p: int, t: float) -> None:
        """The state block before boundary ``p`` is freed at ``t`` (``free_at``, with its index)."""
        self.free_at[p] = t
        self.free_by_time.setdefault(t, []).append(p)

    def due(self, now: float) -> list[int]:
        """The boundaries whose ``free_at`` is ``now`` (the list of ``free_by_time`` for ``now``
        is taken off the index: the caller sets them to another time or leaves them past)."""
        ps = self.free_by_time.pop(now, None)
        if not ps:
            return []
        free_at = self.free_at
        return [p for p in dict.fromkeys(ps) if free_at.get(p) == now]

    def decoded_run(self, k: int) -> None:
        """``k`` decode steps ran (one token each)."""
        self.pos += k
        self.decoded += k

    def preempt(self) -> None:
        """vLLM's recompute preemption of its progress: no lookup, nothing computed, the prompt
        and the tokens generated so far to prefill again (its memory and locks are the engine's
        to give back)."""
        self.f = None
        self.pos = 0
        self.target = max(self.n_in + self.decoded, 1)
        self.step_ends = []
        self.free_at = {}
        self.free_by_time = {}
        self.inserted = False
        self.prompt_in = False
        self.published = 0
        self.kept_prefill = 0
        self.decode_in = 0
        self.publish = 0

    # ---- the memory charged to it
    def charge(self, kv: int, states: int) -> None:
        self.held_kv += kv
        self.held_states += states


class Chunk(NamedTuple):
    """One prefill chunk of a step: tokens ``[start, end)`` of ``seq``."""

    seq: Seq
    start: int
    end: int


@dataclass(slots=True, eq=False)
class StepBatch:
    """What one step schedules: prefill chunks, decoding requests (one token each) and the ids of
    the requests preempted to make room (they run nothing in it)."""

    prefills: list[Chunk] = field(default_factory=list)
    decodes: list[Seq] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    #: requests holding a second state slot for this step only (``kv_unit``: vLLM align mode)
    transient: list[Seq] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing runs in it."""
        return not self.prefills and not self.decodes

    @property
    def tokens(self) -> int:
        """Tokens the step computes: its chunks' and one per decode."""
        return sum(c.end - c.start for c in self.prefills) + len(self.decodes)


class ContinuousEngine:
    """The step loop (a simpy process) and its queues."""

    def __init__(self, sim: Simulation, env: simpy.Environment, tune_before, tune_after, tick) -> None:
        self.sim, self.env = sim, env
        cfg = sim.config
        self.budget = cfg.max_num_batched_tokens
        self.max_seqs = cfg.max_num_seqs
        #: SGLang runs at most its mamba pool's states // ``states_per_running_request`` requests
        #: (``resolve_max_num_reqs``): with a state pool of its own the engine's cap replaces a
        #: larger ``--max-num-seqs``
        per = getattr(sim.admission, "states_per_running_request", 0) if sim.spec.is_hybrid else 0
        pool = getattr(sim.tree, "state_capacity", None)
        if per and pool is not None:
            if pool < per:  # the preset's engine refuses this combination (advise prunes it)
                raise PolicyError(
                    f"a mamba pool of {pool} states serves no request: SGLang refuses to start with fewer "
                    f"than {per} states (max_running_requests = states // {per})"
                )
            self.max_seqs = min(self.max_seqs, pool // per)
        sim.rec.running_cap = self.max_seqs
        self.slots = sim.admission.running_state_slots if sim.spec.is_hybrid else 0
        #: KV charged in whole blocks of this many tokens (an admission's ``running_kv_block``:
        #: vLLM allocates a running request's attention KV a block at a time); 1: per token
        self.kv_unit = sim.grid if getattr(sim.admission, "running_kv_block", False) else 1
        #: TensorRT-LLM's page pools (``pages_one_by_one``): a running request holds whole pages of
        #: its own (``own_pages``), not the tokens it computed
        self.own_page = (
            sim.tree.kv_page
            if getattr(sim.tree, "pages_one_by_one", False) and hasattr(sim.admission, "own_blocks")
            else 0
        )
        #: the admission's engine inserts every prefill chunk that ends inside the prompt
        self.publish_chunks = getattr(sim.admission, "publishes_chunks", False)
        #: the admission's engine holds no lookup or lock for a request that waits for memory: it
        #: matches the request again on every pass until one admits it (``rematches_waiting``)
        self.rematch = getattr(sim.admission, "rematches_waiting", False)
        #: a preempted request is matched with its prompt and the tokens it generated, capped at
        #: their count - 1 (``matches_generated``: SGLang's ``init_next_round_input``), not its
        #: prompt less one token
        self.match_generated = getattr(sim.admission, "matches_generated", False)
        #: SGLang's retraction (``retracts_by_length``): when a step's tokens do not fit, decoding
        #: requests are retracted fewest output tokens first, then longest prompt, then latest
        #: admitted, and queue behind the waiting requests (not the newest, back at the front)
        self.retract_by_length = getattr(sim.admission, "retracts_by_length", False)
        #: SGLang's ``PrefillAdder`` (``reserves_output``): a waiting request is admitted only if its
        #: whole uncached prompt, its output and a page fit beside what the running requests may still
        #: decode; after a refusal no pass tries the queue until a running request leaves
        self.reserve_out = self.rematch and getattr(sim.admission, "reserves_output", False)
        self.batch_full = False  # a waiting request was refused for memory since one last left
        #: (every, most): the prefixes of the first ``most`` waiting requests are touched every
        #: ``every`` passes that find requests waiting (``waiting_refresh``: SGLang)
        self.refresh_waiting = getattr(sim.admission, "waiting_refresh", None)
        self.passes = 0  # passes that found requests waiting
        self.B = sim.trace.block_tokens
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.wake: simpy.Event | None = None  # the idle loop waits on it
        self.coasting = False  # a decode run in progress that an arrival may cut short
        self._ends: list[float] | None = None  # cumulative step ends of a run whose steps vary
        self.tune_before, self.tune_after, self.tick = tune_before, tune_after, tick
        self.held_bytes = 0
        self._aging: list = []  # (request, sequence) whose states ``_apply`` ages at its end
        self.charged_per_kv = sim.tree.kv_bytes_per_token
        self.charged_per_state = sim.tree.state_bytes
        self._on_arrive = listeners(sim.observers, "arrive")
        # the recorder is fed the step's lists as they are (``Recorder.step`` counts them): the
        # event's tuples are built only for the other step listeners
        self._on_step = tuple(
            fn for fn in listeners(sim.observers, "step") if getattr(fn, "__self__", None) is not sim.rec
        )
        self.proc = env.process(self.loop())

    # ------------------------------------------------------------------ arrivals
    def arrive(self, r: Request) -> simpy.Event:
        """``r`` joins the waiting queue; the returned event fires when it has finished."""
        now = self.env.now
        if self.sim.aborts(r):  # the engine refuses its prompt at arrival (SGLang's max_req_input_len)
            self.sim.abort(r, now)
            done = self.env.event()
            return done.succeed()
        B = self.B
        s = Seq(r, self.env.event(), int(r.n_input_tokens(B)), int(r.n_output_tokens(B)))  # numpy ints are slow
        s.target = max(s.n_in, 1)  # an engine computes at least one token to produce logits
        self.waiting.append(s)
        for fn in self._on_arrive:
            fn(r, now)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()
        elif self.coasting:
            self.coasting = False
            self.proc.interrupt()
        return s.done

    # ------------------------------------------------------------------ memory
    def _kv(self, a: int, b: int) -> int:
        """KV tokens charged for computing tokens ``[a, b)``: the tokens, or with ``kv_unit`` the
        whole blocks entered (block ``j`` is allocated when token ``j * unit`` is computed)."""
        u = self.kv_unit
        return b - a if u == 1 else -(-b // u) * u - -(-a // u) * u

    def _own(self, s: Seq, capacity: int) -> int:
        """``own_page``: the KV (grid units' tokens) running request ``s`` holds on pages of its own
        while its capacity is ``capacity`` tokens (``_core/_kv_cache.py`` ``resize``: one page per
        ``tokens_per_block`` block of the capacity). Before its prompt's insert every page from its
        hit's block on (the private copy of a partially matched block, ``resume``, and the pages
        its chunks computed: the simulator inserts them at the prompt's end); after it, the pages
        past the tree's (``own_blocks``: the partial block at its last snapshot point, the
        decode's)."""
        f, g, P = s.f, self.sim.grid, self.own_page
        hit = f.hit_tokens
        if s.inserted:
            return self.sim.admission.own_blocks(hit, f.ctx, capacity) * g
        pages = max(0, -(-capacity // P) - max(hit, s.published) // P)
        return -(-pages * P // g) * g

    def _need(self, s: Seq, a: int, b: int) -> int:
        """KV charged to running request ``s`` for computing tokens ``[a, b)`` (``_kv``; with
        ``own_page``, the pages of its own it takes: ``_own`` at ``b`` less what it holds)."""
        if not self.own_page or s.f is None or s.f.ctx is None:
            return self._kv(a, b)
        return max(0, self._own(s, b) - s.held_kv)

    def _enters(self, s: Seq, n: int) -> int:
        """1 if computing ``n`` more tokens of running request ``s`` gives it a second state slot
        for the step (vLLM align mode, ``kv_unit``): a step after its first (asked of requests
        already running only: a new one's first step is charged its ``slots``) that enters a new
        block takes a new state block per Mamba group (``MambaManager.allocate_new_blocks``) and
        frees the previous one at the next step (``remove_skipped_blocks``); else 0."""
        u = self.kv_unit
        if u == 1 or not self.slots:
            return 0
        return int(-(-(s.pos + n) // u) > -(-s.pos // u))

    def _reserve(self, s: Seq, kv: int, states: int) -> bool:
        if not self._room(kv, states, (s.f, self.env.now)):  # evictions it causes are stamped now
            return False
        self._charged(s, kv, states)
        return True

    def _room(self, kv: int, states: int, tag) -> bool:
        """``tree.reserve`` for running requests; the states it evicts are counted as held by
        running requests in the miss ledger (sim.engine.misses)."""
        misses = self.sim.misses
        if misses is None:
            return self.sim.tree.reserve(kv, states, tag=tag)
        misses.running = True
        try:
            return self.sim.tree.reserve(kv, states, tag=tag)
        finally:
            misses.running = False

    def _charged(self, s: Seq, kv: int, states: int) -> None:
        s.charge(kv, states)
        self.held_bytes += kv * self.charged_per_kv + states * self.charged_per_state

    def _peak(self) -> None:
        self.sim.rec.charged(self.held_bytes + self.sim.tree.used_bytes)

    def _force(self, s: Seq, kv: int, states: int) -> None:
        """Charge without room (a request too large to fit alone): counted, never dropped. The
        tree's ``release`` of a negative amount is that charge (what ``reserve`` charges, without
        its evictions)."""
        self.sim.tree.release(-kv, -states)
        self.sim.rec.overshoot()
        self._charged(s, kv, states)

    def _keep(self, s: Seq, kv: int, states: int, tag) -> None:
        """``s`` keeps ``kv`` tokens and ``states`` slots it held before an insert that did not
        take them (or takes them again after one): made room for (evictions stamped with ``tag``),
        else forced."""
        if self._room(kv, states, tag):
            self._charged(s, kv, states)
        else:
            self._force(s, kv, states)

    def _release(self, s: Seq, kv: int, states: int) -> None:
        self.sim.tree.release(kv, states)
        s.charge(-kv, -states)
        self.held_bytes -= kv * self.charged_per_kv + states * self.charged_per_state

    def _preempt(self, s: Seq, preempted: list) -> None:
        """vLLM's recompute preemption: free everything, back to the front of the queue."""
        self._release(s, s.held_kv, s.held_states)
        f = s.f
        if f is not None and self.kv_unit != 1:
            self._cache_computed(s)
        if f is not None:
            if f.locked is not None:
                self.sim.tree.unlock(f.locked)
            if f.match is not None:
                self.sim.tree.forget(f.match)
        s.preempt()
        if self.retract_by_length:
            self.waiting.append(s)  # SGLang: ``_add_request_to_queue`` appends; fcfs does not sort
        else:
            self.waiting.appendleft(s)
        self.batch_full = False  # the running batch shrank
        preempted.append(s.req.request_id)

    def _retract(self, need: int, states: int, preempted: list) -> None:
        """SGLang's ``ScheduleBatch.retract_decode`` (``managers/schedule_batch.py`` L3451-L3539):
        while the step's ``need`` KV tokens (and ``states`` slots) do not fit once what can be
        evicted is gone (``check_decode_mem``), the decoding request that
        ``_get_decode_retraction_order`` (L3542-L3579) puts last is retracted: the fewest output
        tokens, then the longest prompt, then the latest in the batch (a stable sort, reversed); one
        request is always kept. A request in its prefill is not in SGLang's decode batch and is not
        retracted here (the request-by-request pass after this one preempts the newest if what is
        left still does not fit)."""
        running, tree = self.running, self.sim.tree
        while len(running) > 1 and tree.could_reserve(need, states) is False:
            order = [(s.decoded, -s.n_in, -k) for k, s in enumerate(running) if not s.prefilling]
            if not order:
                return
            k = -min(order)[2]
            victim = running.pop(k)
            self._preempt(victim, preempted)
            need -= self._kv(victim.pos, victim.pos + 1)

    def _cache_computed(self, s: Seq) -> None:
        """vLLM caches a request's blocks as it computes them (``KVCacheManager.allocate_slots``
        -> ``cache_blocks``, ``kv_cache_manager.py``; ``MambaManager.cache_blocks`` for the states
        it keeps), so a preempted request's whole blocks and kept states stay in the cache, freed
        into the queue (``_preempt_request`` -> ``KVCacheManager.free``): ``s``'s computed whole
        blocks go into the tree with the states it reached that the preset keeps (the prefill
        steps so far, the decode boundaries passed), each at the place its block took in the queue
        (``_age_states``), and its path's KV, the hit's included, takes the queue's end, as at a
        request's end (freed, tail first). Not done for a hash-block request whose prompt ends inside a block that
        output symbols follow (``Flight.cut``)."""
        sim, f, g = self.sim, s.f, self.sim.grid
        m = f.match
        if not sim.preset.caching or m is None or f.ctx is None or f.cut is not None:
            return
        k = min(s.pos // g, len(f.seq_full))
        if k <= 0:
            return
        if s.pos < s.n_in or not s.inserted:
            cps = sim.prefill_checkpoints_at(f, (*s.step_ends, s.n_in))
        else:  # the prompt's states went in with it, and the published decode ones (one evicted since is gone)
            cps = [c for c in f.decode_cps if c * g > s.decode_in]
        cps = [c for c in cps if m.hit_sym < c <= k]
        if sim.spec.is_hybrid and not cps:  # as insert_prefill: new KV without a state is not inserted,
            k = min(k, m.hit_sym)  # and the blocks of the hit are freed all the same
            if k <= 0:
                return
        tree = sim.tree
        now = tree.set_time(self.env.now)
        res = tree.insert(f.seq_full[:k], k * g, cps, now, protect=f.locked, tag=(f, now))
        if res.inserted:
            tree.refresh_inserted(res, now, final=True)
            self._age_states(s, f.seq_full[:k], None)

    # ------------------------------------------------------------------ scheduling
    def _chunk(self, s: Seq, budget: int) -> int:
        ctx = s.f.ctx if s.f is not None else None
        admission = self.sim.admission
        if ctx is None or (admission.splits_for_states and not self.sim.spec.is_hybrid):
            return min(budget, s.target - s.pos)
        return admission.schedule_chunk(s.pos, s.target, budget, self.budget, ctx)

    def _lookup(self, s: Seq) -> None:
        sim, now = self.sim, self.env.now
        first = s.f is None and s.decoded == 0 and math.isnan(s.t_first) and not s.tuned
        tokens = s.target if self.match_generated and s.target > s.n_in else None
        s.looked_up(sim.lookup(s.req, now, lock=True, tokens=tokens))
        if first:
            s.tuned = True
            self.tune_before(sim, s.req, now)

    def _unlook(self, s: Seq) -> None:
        """A request looked up in this step that is not scheduled in it gives its lookup back: the
        engines match a waiting request again each time they try to admit it (vLLM's scheduler calls
        ``get_computed_blocks`` for a waiting request on every pass, SGLang's
        ``init_next_round_input``), so what is cached meanwhile counts. Done when its chunk rounds
        to nothing (an engine's grid) and, for an admission that ``rematches_waiting`` (the engine
        presets ``sglang`` and ``vllm``), when it waits for memory; the paper's policies keep the
        lookup and the lock on its hit while they wait for memory (the Marconi artifact looks a
        request up once)."""
        f = s.f
        if f is not None:
            if f.locked is not None:
                self.sim.tree.unlock(f.locked)
            if f.match is not None:
                self.sim.tree.forget(f.match)
        s.f = None
        s.pos = 0

    def schedule(self) -> StepBatch:
        """This step's batch (``StepBatch``): its memory is charged, the preempted requests are
        back in the waiting queue."""
        budget = self.budget
        batch = StepBatch()
        prefills, decodes, preempted = batch.prefills, batch.decodes, batch.preempted
        running = self.running
        open_ = self._pass_open()  # before the running requests' tokens, as the engine's pass
        # fast path: the running requests' tokens, charged in one reservation
        for s in running:
            if budget <= 0:
                break
            if s.prefilling:
                n = self._chunk(s, budget)
                if n > 0:
                    prefills.append(Chunk(s, s.pos, s.pos + n))
                    budget -= n
            else:
                decodes.append(s)
                budget -= 1
        total = self.budget - budget
        extra = 0
        if self.kv_unit != 1:
            total = sum(self._kv(a, b) for _, a, b in prefills) + sum(self._kv(s.pos, s.pos + 1) for s in decodes)
            batch.transient = [c.seq for c in prefills if self._enters(c.seq, c.end - c.start)]
            batch.transient += [s for s in decodes if self._enters(s, 1)]
            extra = len(batch.transient)
        elif self.own_page:  # the pages each takes of its own (``_need``)
            total = sum(self._need(s, a, b) for s, a, b in prefills)
            total += sum(self._need(s, s.pos, s.pos + 1) for s in decodes)
        tag = ((prefills[0][0] if prefills else decodes[0]).f, self.env.now) if total or extra else None
        if not (total or extra) or self._room(total, extra, tag):
            for s, a, b in prefills:
                s.charge(self._need(s, a, b), 0)
            for s in decodes:
                s.charge(self._need(s, s.pos, s.pos + 1), 0)
            for s in batch.transient:
                s.charge(0, 1)
            self.held_bytes += total * self.charged_per_kv + extra * self.charged_per_state
            i = len(running)
        else:  # no room for all: request by request, preempting the newest when one does not fit
            prefills.clear()
            decodes.clear()
            batch.transient = []
            budget = self.budget
            i = 0
            if self.retract_by_length:
                self._retract(total, extra, preempted)
        while i < len(running) and budget > 0:
            s = running[i]
            prefill = s.prefilling
            n = self._chunk(s, budget) if prefill else 1
            if n <= 0:
                i += 1
                continue
            kv, two = self._need(s, s.pos, s.pos + n), self._enters(s, n)
            while not self._reserve(s, kv, two):
                if len(running) == 1:  # alone and still no room: run it anyway
                    self._force(s, kv, two)
                    break
                victim = running.pop()
                self._preempt(victim, preempted)
                if victim is s:
                    break
            if i >= len(running) or running[i] is not s:
                break  # s preempted itself (it was the newest)
            if prefill:
                prefills.append(Chunk(s, s.pos, s.pos + n))
            else:
                decodes.append(s)
            if two:
                batch.transient.append(s)
            budget -= n
            i += 1
        if preempted:  # vLLM admits no new request in a step that preempted
            self._peak()
            return batch
        waiting = self.waiting
        if not open_:
            self._peak()
            return batch
        while waiting and budget > 0 and len(running) < self.max_seqs:
            s = waiting[0]
            fresh = s.f is None
            if fresh:
                self._lookup(s)
            n = self._chunk(s, budget)
            if n <= 0:
                if fresh:
                    self._unlook(s)
                break
            kv = self._need(s, s.pos, s.pos + n)
            need = self._admission_need(s, batch) if self.reserve_out and running else kv
            if self.rematch and running and self.sim.tree.could_reserve(need, self.slots) is False:
                # the engine admits it only if it fits once what can be evicted is gone, and evicts
                # nothing for it otherwise: it waits, holding nothing, to be matched again
                if fresh:
                    self._unlook(s)
                self.batch_full = True
                break
            if not self._reserve(s, kv, self.slots):
                if running:
                    if fresh and self.rematch:
                        self._unlook(s)  # matched again at the next pass, as the engine does
                    self.batch_full = True
                    break  # waits for room
                self._force(s, kv, self.slots)
            waiting.popleft()
            running.append(s)
            if math.isnan(s.t_first):
                s.t_first = self.env.now
            prefills.append(Chunk(s, s.pos, s.pos + n))
            budget -= n
        self._peak()
        return batch

    def _pass_open(self) -> bool:
        """Whether this step's pass tries the waiting queue, touching the waiting requests'
        prefixes when it is due. SGLang (``reserves_output``): a pass returns before it matches
        anyone while its batch is full, i.e. since a request was refused for memory, until a
        running request leaves, unless a chunked prefill goes on (``_get_new_batch_prefill_raw``,
        ``managers/scheduler.py`` L4098-L4101; ``batch_is_full`` set on ``NO_TOKEN``, L4279-L4284,
        cleared when the running batch shrinks, L3948-L3968, or empties, L4093-L4096); a pass that
        goes on calls ``calc_priority`` (L4128-L4132), whose ``_touch_waiting_prefixes``
        (``schedule_policy.py`` L280-L302) counts the passes that find requests waiting and, every
        ``WAITING_PREFIX_REFRESH_INTERVAL`` of them (the first included), touches the prefixes of
        the first ``WAITING_QUEUE_PREFIX_MATCH_MAX`` waiting requests, head last
        (``refresh_waiting``). At the running cap (``--max-num-seqs``, or rule 19's) no pass tries
        the queue, but SGLang's goes on to ``calc_priority`` while a chunked prefill continues: its
        request-slot check is skipped then (``get_num_allocatable_reqs``, L4116-L4124) and the
        waiting requests are not matched (the same check in the admission loop, L4226-L4238)."""
        waiting = self.waiting
        if not waiting:
            return True  # no pass: nothing to try
        if len(self.running) >= self.max_seqs and not (self.reserve_out and any(s.prefilling for s in self.running)):
            return True  # no pass: no room for one more request
        if self.reserve_out:
            if not self.running:
                self.batch_full = False
            elif self.batch_full and not any(s.prefilling for s in self.running):
                return False
        if self.refresh_waiting is not None:
            every, most = self.refresh_waiting
            if self.passes % every == 0:
                now = self.env.now
                for s in reversed([waiting[i] for i in range(min(most, len(waiting)))]):
                    self.sim.touch_prefix(s.req, now, s.target)
            self.passes += 1
        return True

    def _admission_need(self, s: Seq, batch: StepBatch) -> int:
        """KV tokens SGLang's ``PrefillAdder.add_one_req`` asks to be free or evictable to admit
        waiting request ``s``, beyond what this step has charged already: ``s``'s whole uncached
        prompt, the output it may still decode and a page (``total_tokens``,
        ``schedule_policy.py`` L1404-L1412), against the free and evictable sizes less
        ``total_offset`` (``PrefillBudget.remaining_total``, ``mem_cache/prefill_budget.py``
        L91-L106): each decoding request's remaining output (``_get_running_request_total_token_offset``,
        L785-L794, ratio 1 under ``ignore_eos``; its token of this step is charged), and each
        request with a chunk in this pass its page and, when the chunk ends its prompt, its output
        (``_update_prefill_budget`` -> ``PrefillBudget.reserve``, L895-L930 and prefill_budget.py
        L156-L168; the chunk itself is charged). Admitted only below it (``check_prefill``'s
        ``total_tokens < remaining_total``, prefill_budget.py L125-L130): one token more."""
        adm = self.sim.admission
        out, page = adm.output_reserve, adm.page_reserve
        need = s.target - s.pos + out(s.n_out - s.decoded) + page + 1
        stepped = {id(r) for r in batch.decodes}
        for r in self.running:
            if not r.prefilling:
                need += out(r.n_out - r.decoded) - (id(r) in stepped)
        for r, _, b in batch.prefills:
            need += page + (out(r.n_out) if b >= r.target else 0)
        return need

    # ------------------------------------------------------------------ the loop
    def loop(self):
        env = self.env
        sim = self.sim
        timing, spec = sim.timing, sim.spec
        carried: list = []
        while True:
            if not self.running and not self.waiting:
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            batch = self.schedule()
            if carried:
                batch.preempted[:0] = carried
            if batch.empty:
                if not batch.preempted:  # nothing ran, nothing changed: the loop would spin forever
                    raise RuntimeError(
                        f"continuous scheduler stalled at t={env.now} with "
                        f"{len(self.running)} running, {len(self.waiting)} waiting"
                    )
                carried = batch.preempted  # reported with the next step that runs
                continue
            carried = []
            decodes = batch.decodes
            contexts = [s.pos for s in decodes]
            dt = timing.step_time_s(spec, [(a, b) for _, a, b in batch.prefills], contexts)
            k = 1
            if not batch.prefills:
                k = self._run_length(batch, contexts, dt)
            t0 = env.now
            if k == 1:
                yield env.timeout(dt)
            else:
                k = yield from self._coast(decodes, dt, k)
            self._emit(t0, env.now, env.now - t0, k, batch)
            self._apply(batch, k, t0, dt)

    def _run_length(self, batch: StepBatch, contexts: list, dt: float) -> int:
        """How many decode-only steps of this batch can go as one event (1: just this one). When
        the timing model gives the run's first and last step the same time every step takes
        ``dt``; otherwise each step is timed (at most ``VARIABLE_RUN`` of them) into ``_ends``.
        With ``kv_unit`` a run stops before the first step that enters a new block (``_run_cut``)."""
        decodes = batch.decodes
        k = min(s.n_out - s.decoded for s in decodes)
        if self.kv_unit != 1 or self.own_page:
            k = min(k, self._run_cut(decodes))
        if k <= 1 or self.waiting and len(self.running) < self.max_seqs:
            return 1
        timing, spec = self.sim.timing, self.sim.spec
        self._ends = None
        if timing.step_time_s(spec, (), [c + k - 1 for c in contexts]) != dt:
            k = min(k, VARIABLE_RUN)
            ends, t = [], 0.0
            for i in range(k):
                t += dt if i == 0 else timing.step_time_s(spec, (), [c + i for c in contexts])
                ends.append(t)
            self._ends = ends
        # this step's token is charged already; charge the rest of the run now
        extra = [self._need(s, s.pos + 1, s.pos + k) for s in decodes]
        # evictions it causes are stamped now
        if not self._room(sum(extra), 0, (decodes[0].f, self.env.now)):
            return 1
        for s, x in zip(decodes, extra):
            s.charge(x, 0)
        self.held_bytes += sum(extra) * self.charged_per_kv
        self._peak()
        return k

    def _run_cut(self, decodes: list) -> int:
        """Steps a decode run may take before one of ``decodes`` enters a new block (``kv_unit``).
        vLLM allocates step by step: at the step whose token opens a block, ``allocate_slots``
        (``kv_cache_manager.py`` L401) takes the attention block and a new state block per Mamba
        group (``MambaManager.allocate_new_blocks``, ``single_type_kv_cache_manager.py``
        L1802-L1928) while the previous one is still held (``remove_skipped_blocks``, L1634-L1662,
        frees it at the next step), and evicts for them then, or preempts; a run charged at its
        start evicted for blocks a later step takes (and for steps an arrival then cut off), and
        not for their second state slots. So that step starts an event of its own, scheduled and
        charged as every step is."""
        u = self.own_page or self.kv_unit  # TensorRT-LLM: ``resize`` takes a page when a token enters it
        return min(u - s.pos % u if s.pos % u else u for s in decodes)

    def _kept_prefill_state(self, s: Seq, p: int) -> bool:
        """Whether the state at token ``p``, where a prefill step of ``s`` before its last ended,
        is one the engine keeps (the admission's prefill checkpoints for the steps so far: the
        junction, retention's grid, every step end at -1): vLLM caches its block and frees it into
        the free queue the step after (``remove_skipped_blocks``), so it stays in the pool from
        then on, where the simulator inserts it with the prompt: the request holds it as a state
        slot until then (``kv_unit`` engines; ``kept_prefill``)."""
        f, g = s.f, self.sim.grid
        if f is None or f.ctx is None or f.match is None or p % g or not self.sim.admission.uses_prefill_steps:
            return False
        return p // g in self.sim.prefill_checkpoints_at(f, (*s.step_ends, s.n_in))

    def _kept_decode_state(self, s: Seq, p: int) -> bool:
        """Whether the state at token ``p`` of decoding request ``s`` is one vLLM keeps (the
        preset's decode checkpoints: retention's grid, or every block with retention -1): its block,
        freed by ``remove_skipped_blocks`` the step after the request computed past it, is cached
        (``MambaManager.cache_blocks``), so it stays in vLLM's pool from then on, in the free queue,
        where the simulator inserts it at the request's end: the request holds it as a state slot
        until then (``kv_unit`` engines)."""
        f, g = s.f, self.sim.grid
        return f is not None and p >= s.n_in and p % g == 0 and p // g in f.decode_cps

    def _coast(self, decodes: list, dt: float, k: int):
        """Sleep through ``k`` decode steps of ``dt``; an arrival ends the run at the next step
        boundary. Returns the steps done (the KV of the steps not done is given back)."""
        env = self.env
        t0 = env.now
        ends = self._ends
        self.coasting = True
        try:
            yield env.timeout(k * dt if ends is None else ends[-1])
            done = k
        except simpy.Interrupt:
            elapsed = env.now - t0
            if ends is None:
                done = min(int(elapsed / dt) + 1, k)
                end = t0 + done * dt
            else:
                done = min(bisect_right(ends, elapsed) + 1, k)
                end = t0 + ends[done - 1]
            if end > env.now:
                yield env.timeout(end - env.now)
        self.coasting = False
        if done < k:
            back = [
                self._kv(s.pos + done, s.pos + k)
                if not self.own_page
                else self._own(s, s.pos + k) - self._own(s, s.pos + done)
                for s in decodes
            ]
            self.sim.tree.release(sum(back), 0)
            for s, x in zip(decodes, back):
                s.charge(-x, 0)
            self.held_bytes -= sum(back) * self.charged_per_kv
        return done

    def _emit(self, t0, t1, seconds, k, batch: StepBatch) -> None:
        tokens = batch.tokens
        self.sim.rec.step(t0, t1, seconds, k, batch.prefills, batch.decodes, tokens, batch.preempted)
        if not self._on_step:
            return
        p = tuple((s.req.request_id, a, b) for s, a, b in batch.prefills)
        d = tuple((s.req.request_id, s.pos) for s in batch.decodes)
        for fn in self._on_step:
            fn(t0, t1, seconds, k, p, d, tokens, tuple(batch.preempted))

    def _apply(self, batch: StepBatch, k: int, t0: float, dt: float) -> None:
        now = self.env.now
        finished = []
        for s in batch.transient:  # the previous state block goes at the next step
            if s.pos < s.n_in and self._kept_prefill_state(s, s.pos):
                s.kept_prefill += 1
            elif self._kept_decode_state(s, s.pos):
                s.publish = s.pos  # into the cache at this step's end (``_publish_decode``)
            else:
                self._release(s, 0, 1)
        u = self.kv_unit
        if u != 1:  # when the state block at each boundary passed is freed (``_age_states``)
            for s, a, b in batch.prefills:
                for p in range(-(-a // u) * u, b, u):
                    s.set_free_at(p, now)
            ends = self._ends if k > 1 else None  # a varying run's step ends (``_run_length``)
            for s in batch.decodes:
                first = -(-s.pos // u) * u
                for p in range(first, s.pos + k, u):
                    j = p - s.pos + 1  # the run's step that computes token p
                    s.set_free_at(p, t0 + (ends[j - 1] if ends is not None else j * dt) if k > 1 else now)
        hits = {
            id(s): s.f.match.hit_node for s, _, _ in batch.prefills if u != 1 and not s.step_ends and s.f.hit_tokens
        }
        self._aging = []  # (request, sequence) whose states to age once this step's end is done
        for s, _, b in batch.prefills:
            s.prefilled(b)
            if not s.inserted and b >= s.n_in:
                self._prompt_done(s, now)
            elif self.publish_chunks and not s.inserted:
                self._chunk_done(s, now)
            elif self.own_page and not s.inserted:
                self._commit_point(s, now)
            if b >= s.target:
                if math.isnan(s.t_token):
                    s.t_token = now
                    # a prefill done in the step it started in took exactly that step's time
                    self.sim.served(s.f, s.t_first, dt if s.t_first == t0 else now - s.t_first, now, 0.0, None)
                s.sampled()
                if s.finished:
                    finished.append(s)
        for s in batch.decodes:
            s.decoded_run(k)
            if s.finished:
                finished.append(s)
        for s in finished:
            self._finish(s, now)
        if u != 1:
            self._states_freed(finished, hits, now)

    def _states_freed(self, finished: list, hits: dict, now: float) -> None:
        """vLLM align mode frees the state block a request computed past in a step (a chunk-end
        state, a decode boundary's, the hit's: ``MambaManager.allocate_new_blocks`` records the
        hit's block as ``last_state_block_idx``, ``single_type_kv_cache_manager.py`` L1842-L1844)
        at the next step, when the request's ``allocate_slots`` calls ``remove_skipped_blocks``
        (L1645-L1661), or with the rest of its blocks if it ended (``free``): so after the blocks
        of the requests that ended in this step (freed when its output is processed), request by
        request in the order the next step allocates (the running order). Those states take that
        place in the queue, a hit's state leaving the lookup's place for it (``hits``: request id
        -> its hit node, for the requests whose first step this was). Then the states of the
        requests inserted in this step are aged (``_age_states``)."""
        tree = self.sim.tree
        freed = getattr(tree, "state_freed_at", None)
        stamp = {}
        for s in (*finished, *self.running):
            node = hits.get(id(s))
            due = s.due(now)
            if not due and node is None:
                continue
            t = stamp[id(s)] = tree.set_time(now)  # after everything before it
            for p in due:
                s.set_free_at(p, t)
            if node is not None and freed is not None:
                freed(node, t)
        for s in self.running:
            if s.publish:
                self._publish_decode(s, now)
        aging, self._aging = self._aging, []
        for s, seq in aging:
            self._age_states(s, seq, stamp.get(id(s)))

    def _publish_decode(self, s: Seq, now: float) -> None:
        """A decode state vLLM keeps (``_kept_decode_state``) is cached and, the step after the
        request computed past it, freed into the free queue (``MambaManager.cache_blocks``,
        ``remove_skipped_blocks``, ``single_type_kv_cache_manager.py`` L1634-L1662), where it may be
        evicted like any block while the request decodes on: the request's sequence up to it goes
        into the cache then, locked by the request (its KV blocks are the request's until it
        ends), the state at the place its block took in the queue, and the request gives back the
        state slot and the KV blocks the cache now holds. The end inserts the decode states past
        it (one evicted meanwhile stays gone)."""
        sim, f, g = self.sim, s.f, self.sim.grid
        p, s.publish = s.publish, 0
        base = max(s.decode_in, s.n_in // self.kv_unit * self.kv_unit)
        covered = max(0, min(p - base, s.held_kv))
        self._release(s, covered, 1)
        tree = sim.tree
        t = tree.set_time(now)
        res = tree.insert(f.seq_full[: p // g], p, [p // g], t, lock=True, protect=f.locked, tag=(f, t))
        if not res.inserted:  # no room: the request keeps them (the room is still free)
            self._keep(s, covered, 1, (f, now))
            return
        if f.locked is not None:
            tree.unlock(f.locked)
        f.locked = res.end_node
        s.decode_in = p
        self._age_states(s, f.seq_full[: p // g], None)

    def _prompt_done(self, s: Seq, now: float) -> None:
        """The prompt's last token is computed: states at the chunk ends the preset keeps, the
        prompt's KV handed to the cache (no longer charged to the request)."""
        sim = self.sim
        f = s.f
        s.inserted = True
        sim.replan_prefill(f, [min(e, s.n_in) for e in s.step_ends])
        if s.published:  # the chunks' states went in with them (one evicted since is not taken again)
            done = s.published // sim.grid
            f.prefill_cps = [c for c in f.prefill_cps if c > done]
        if not sim.preset.caching or (sim.spec.is_hybrid and not f.prefill_cps):
            return  # nothing inserted now (insert_prefill's own rule): the request keeps its KV
        if self.publish_chunks and s.pos >= s.target and s.decoded + 1 >= s.n_out:
            return  # it ends in this step: released (one insert, its slot handed over), not checkpointed
        u = self.kv_unit
        end = s.n_in // u * u  # the cache keeps whole blocks: a partial one stays the request's
        start = max(f.hit_tokens, s.published)
        covered = max(0, min(end - start, s.held_kv))
        if self.own_page:  # the insert counts the prompt's pages from the hit's block on
            covered = s.held_kv
        self._release(s, covered, s.kept_prefill)  # the insert puts the kept states in the cache
        s.kept_prefill = 0
        if not sim.insert_prefill(f, now):  # no room: the KV stays the request's (the room is still free)
            self._keep(s, covered, 0, (f, now))
            return
        s.prompt_in = True
        if self.own_page:  # the prompt's pages past the tree's stay the request's to its end
            sim.tree.stamp_partial_tail(f.locked)  # a committed partial block: the tree's copy
            own = self._own(s, s.n_in)
            self._keep(s, own, 0, (f, now))
        if u != 1:  # the prompt's states are in: the end inserts the decode ones (an evicted one stays gone)
            f.prefill_cps = []
        if u != 1 and f.match is not None and getattr(sim.tree, "duplicate_kv", False):
            # the blocks recomputed between the hit and the KV match are the request's own copies
            # (``allocate_slots`` gave it new blocks, cached a second time: ``BlockHashToBlockMap
            # .insert``, ``block_pool.py`` L78-L82), held to its end: the path its insert now locks
            # stands for them, and the older copies, which no lookup touched (the hit stops before
            # them), stay in the free queue where they were, evictable (``cache_again``)
            sim.tree.cache_again(f.match, tag=(f, now))
        if u != 1:
            self._aging.append((s, f.seq_in))

    def _age_states(self, s: Seq, seq, t_step: float | None) -> None:
        """vLLM align mode frees a state's block once the request has computed past it, at the
        step after the one that computed the next token (``remove_skipped_blocks``,
        ``single_type_kv_cache_manager.py`` L1634-L1662): a state the request placed enters the
        free queue then, not when the simulator inserts it (the prompt's end, the request's end);
        one freed after this step (``t_step``) takes that place even if the insert's was earlier."""
        tree = self.sim.tree
        age = getattr(tree, "age_state", None)
        if age is None or not s.free_at:
            return
        for node in tree.match(seq).path:
            t = s.free_at.get(node.depth_tokens)
            if t is not None and node.has_state:
                if t == t_step:
                    tree.state_freed_at(node, t)
                else:
                    age(node, t)

    def _chunk_done(self, s: Seq, now: float) -> None:
        """A chunk ended inside the prompt of a request whose engine publishes every chunk
        (SGLang's ``stash_chunked_request`` -> ``checkpoint_kv_cache``): the KV so far and the
        states at the chunk ends so far go into the cache, as at the prompt's end."""
        f = s.f
        chunk = self.sim.chunk_checkpoints(f, s.step_ends, s.published)
        if chunk is None:
            return
        covered = min(s.pos - max(f.hit_tokens, s.published), s.held_kv)
        self._release(s, covered, 0)
        if self.sim.insert_chunk(f, *chunk, now):
            s.published = s.pos
            return
        self._keep(s, covered, 0, (f, now))  # nothing inserted: the KV stays the request's

    def _commit_point(self, s: Seq, now: float) -> None:
        """``own_page`` (TensorRT-LLM): a chunk that ended on a snapshot point inside the prompt is
        committed there (``update_context_resources`` -> ``try_commit_blocks`` when
        ``context_current_position`` is in ``expect_snapshot_points``): the prompt's KV so far and
        its snapshots go into the tree, as the prompt's insert would put them (the request gives
        back its pages first, the insert counting them again, rule 30), the partial block there a
        copy stamped now (rule 26); the request keeps its own pages past the tree's."""
        f = s.f
        chunk = self.sim.chunk_checkpoints(f, s.step_ends, s.published)
        if chunk is None or chunk[0] * self.sim.grid != s.pos or not chunk[1] or chunk[1][-1] != chunk[0]:
            return
        held = s.held_kv
        self._release(s, held, 0)
        if not self.sim.insert_chunk(f, *chunk, now):  # no room: the KV stays the request's
            self._keep(s, held, 0, (f, now))
            return
        s.published = s.pos
        self.sim.tree.stamp_partial_tail(f.locked)
        own = self._own(s, s.pos)
        self._keep(s, own, 0, (f, now))

    def _finish(self, s: Seq, now: float) -> None:
        sim = self.sim
        self.running.remove(s)
        self.batch_full = False  # the running batch shrank
        f = s.f
        if not self.own_page:
            self._release(s, s.held_kv, s.held_states)
        sim.decoded(f, s.t_token, now - s.t_token, now)
        seq = f.seq_full
        if s.decode_in:  # the decode states up to there went in (one evicted since stays gone)
            f.decode_cps = [c for c in f.decode_cps if c * sim.grid > s.decode_in]
        if self.publish_chunks and sim.end_state(f, s.prompt_in) is None:
            sim.end_without_insert(f, now)  # no track since its last checkpoint: nothing inserted
        elif self.own_page:  # TensorRT-LLM's pools, as ``run_des`` with fcfs (rules 26, 29)
            if s.prompt_in:  # the context's snapshots only: one evicted since stays gone
                sim.forget_lost_states(f)
            held, kept = f.locked, sim.tree.partial_tail(f.locked)
            sim.insert_decode(f, now)
            sim.tree.release_path(held, kept, tag=(f, now))  # ``close``: its blocks, last first
            self._release(s, s.held_kv, s.held_states)
        else:
            sim.insert_decode(f, now)
        if self.kv_unit != 1:
            self._aging.append((s, seq))
        self.tune_after(sim, s.req, now)
        self.tick(sim)
        s.done.succeed()


def run_continuous(sim: Simulation, env: simpy.Environment, sessions, open_loop, tune_before, tune_after, tick) -> None:
    """Drive ``sim`` through one ``ContinuousEngine``: ``sessions`` (start, turns) for a
    closed-loop trace, or ``open_loop`` (arrival times, requests in order)."""
    engine = ContinuousEngine(sim, env, tune_before, tune_after, tick)

    if sessions is not None:

        def session(start: float, turns: list[Request]):
            yield env.timeout(start)
            for r in turns:
                if r.think_time > 0:
                    yield env.timeout(r.think_time)
                yield engine.arrive(r)

        for start, turns in sessions:
            env.process(session(float(start), turns))
    else:
        ts, reqs = open_loop

        def feeder():
            for t, r in zip(ts, reqs):
                wait = float(t) - env.now
                if wait > 0:
                    yield env.timeout(wait)
                engine.arrive(r)

        env.process(feeder())
    env.run()
    assert not engine.running and not engine.waiting, "requests left in the engine"


__all__ = ["Chunk", "ContinuousEngine", "Seq", "StepBatch", "run_continuous"]
