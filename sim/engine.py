"""Replay a trace through one policy: the discrete-event engine (simpy) and the sequential mode.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from policies.admission import AdmissionContext
from policies.presets import PolicyPreset, get_preset
from sim.blocks import block_symbols
from sim.config import UNLIMITED, SimConfig, format_size
from sim.cost import ModelSpec, TimingModel, default_timing, get_model
from sim.errors import UsageError
from sim.metrics import Recorder, SimResult
from sim.tree import HybridRadixTree, Node
from traces.base import Request, Trace


@dataclass(slots=True)
class _Flight:
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


def session_start_times(n: int, rate: float, kind: str, seed: int) -> np.ndarray:
    """Paper: session i starts at i / rate; or Poisson arrivals at that rate (seeded)."""
    if kind == "uniform":
        return np.arange(n) / rate
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


class Simulation:
    def __init__(self, trace: Trace, config: SimConfig, *, spec: ModelSpec | None = None,
                 timing: TimingModel | None = None, progress=None) -> None:
        config.validate()
        self.trace = trace
        self.config = config
        self.spec = spec or get_model(config.model)
        self.timing = timing or default_timing(config.model)
        self.preset: PolicyPreset = get_preset(config.policy)
        self.progress = progress
        # paper / paper-fixed: the artifact's replay semantics; only "paper" keeps its two bugs
        self.paper = config.compat in ("paper", "paper-fixed")
        self.paper_bugs = config.compat == "paper"
        auto = isinstance(config.alpha, str)  # "auto": start at 0, the tuner sets it (policies.tuning)
        alpha0 = 0.0 if auto else float(config.alpha)
        self._check_grid()
        hybrid = self.spec.is_hybrid
        if hybrid and self.preset.caching and not self.preset.unlimited and config.capacity_bytes < self.spec.state_bytes():
            raise UsageError(
                f"capacity {format_size(config.capacity_bytes)} is smaller than one state checkpoint of "
                f"{config.model} ({format_size(self.spec.state_bytes())})")
        admission, eviction = self.preset.build(self.spec, alpha0, self.paper_bugs)
        if self.paper and hasattr(eviction, "artifact_order"):
            eviction.artifact_order = True
        self.admission = admission
        self.tree = HybridRadixTree(
            capacity_bytes=UNLIMITED if self.preset.unlimited else config.capacity_bytes,
            kv_bytes_per_token=self.spec.kv_bytes_per_token(),
            state_bytes=self.spec.state_bytes(),
            block_tokens=self.grid,
            policy=eviction,
            hybrid=hybrid,
            exact_capacity=not self.paper,
        )
        self.tree.logical_clock = self.paper
        # the artifact's tree: every split gets a (branch) state; its vLLM+ fills partial blocks
        self.tree.split_states = self.paper and admission.name == "judicious"
        self.tree.fill_block = self.paper_block
        self.refresh_path = eviction.refresh == "path"
        self.tuner = None
        if auto and self.preset.uses_alpha and self.preset.caching:
            from policies.tuning import make_tuner

            self.tuner = make_tuner(self)
        self.chunk_tokens = config.chunk_size if config.state_alignment == "chunk" else None
        self.rec = Recorder(len(trace.requests), self.spec)
        self._clock = 0  # paper mode: logical clock, one tick per lookup / insert / eviction call

    def _check_grid(self) -> None:
        B = self.trace.block_tokens
        pg = self.preset.grid_for(self.spec, self.config)
        grid = max(pg, B)
        if pg > 1 and (pg < B or pg % B):
            raise UsageError(
                f"policy {self.preset.name} checkpoints every {pg} tokens, finer than "
                f"(or not a multiple of) the trace's {B}-token blocks")
        if self.config.state_alignment == "chunk" and B > 1 and max(B, self.config.chunk_size) % min(B, self.config.chunk_size):
            raise UsageError(f"--chunk-size {self.config.chunk_size} does not line up with the trace's {B}-token blocks")
        # paper vLLM+ on a token trace: a token tree with a state every block (and at the end),
        # partial blocks matched as prefixes and filled later, as the artifact's block tree does
        self.paper_block = 0
        if self.paper and self.preset.admission == "every-block" and B == 1 and grid > 1:
            self.paper_block, grid = grid, 1
        self.grid = grid
        self.regrid = grid // B  # > 1: symbols are re-hashed into coarser blocks

    # ------------------------------------------------------------------ per-request steps
    def _symbols(self, r: Request) -> tuple[np.ndarray, np.ndarray, int, int]:
        B = self.trace.block_tokens
        tok_in = r.n_input_tokens(B)
        tok_full = tok_in + r.n_output_tokens(B)
        full = np.concatenate((r.input_tokens, r.output_tokens)) if len(r.output_tokens) else r.input_tokens
        if self.regrid == 1:
            return r.input_tokens, full, tok_in, tok_full
        g = self.regrid
        sym_full = block_symbols(full, g)
        # only whole input blocks are cached at prefill end; the partial one ends inside a block
        sym_in = sym_full[: len(r.input_tokens) // g]
        # tok_in stays the real prompt length (hit-rate denominator, prefill time); the prefill
        # insert covers the whole blocks only (insert_prefill)
        return sym_in, sym_full, tok_in, tok_full

    def _now(self, t: float) -> float:
        if self.paper:  # the tree's clock also ticks on every eviction call
            self.tree.now += 1
        else:
            self.tree.now = t
        return self.tree.now

    def lookup(self, r: Request, t: float, lock: bool) -> _Flight:
        seq_in, seq_full, tok_in, tok_full = self._symbols(r)  # tok_in: the real prompt length
        if not self.preset.caching:
            self.rec.lookup(r, t, 0, tok_in)
            return _Flight(r, seq_in, seq_full, tok_in, tok_full, 0, [], [], None)
        tree = self.tree
        now = self._now(t)
        cap = None
        if self.preset.lookup_cap_minus_one:
            # at least one prompt token is recomputed: hit <= input_len - 1 tokens, in grid symbols
            cap = max((tok_in - 1) // self.grid, 0)
        m = tree.match(seq_in, max_hit_sym=cap)
        hit_tokens = min(m.hit_tokens, tok_in)
        if m.hit_sym > 0:
            if self.refresh_path:
                for node in m.path:
                    tree.touch(node, now)
            else:
                tree.touch(m.hit_node, now)
        n_in = len(seq_in)
        ctx = AdmissionContext(n_in, len(seq_full), self.grid, self.chunk_tokens, self.paper,
                               prefill_chunk_tokens=self.config.prefill_chunk_tokens,
                               input_tokens=tok_in)
        if self.paper and self.admission.needs_full_divergence and m.match_sym > m.hit_sym:
            ctx.divergence_full = tree.match(seq_full).match_sym
        prefill_cps = self.admission.prefill_checkpoints(m, ctx)
        decode_cps = self.admission.decode_checkpoints(m, ctx)
        locked = None
        if lock and m.hit_sym > 0:
            locked = m.hit_node
            tree.lock(locked)
        self.rec.lookup(r, t, hit_tokens, tok_in, m.hit_sym > 0 and self.spec.is_hybrid)
        return _Flight(r, seq_in, seq_full, tok_in, tok_full, hit_tokens, prefill_cps, decode_cps, locked)

    def insert_prefill(self, f: _Flight, t: float) -> None:
        if not self.preset.caching or len(f.seq_in) == 0:
            return
        if not f.prefill_cps and self.spec.is_hybrid:
            return  # KV without a state at its end cannot serve a hybrid hit; decode-end insert stores it
        now = self._now(t)
        res = self.tree.insert(f.seq_in, f.tok_in if self.regrid == 1 else len(f.seq_in) * self.grid,
                               f.prefill_cps, now, lock=True, protect=f.locked)
        if f.locked is not None:
            self.tree.unlock(f.locked)
        f.locked = res.end_node if res.inserted else None
        self._after_insert(res, t)

    def insert_decode(self, f: _Flight, t: float) -> None:
        if not self.preset.caching:
            return
        now = self._now(t)
        cps = f.decode_cps if not f.prefill_cps else sorted(set(f.prefill_cps) | set(f.decode_cps))
        res = self.tree.insert(f.seq_full, f.tok_full, cps, now, protect=f.locked)
        if f.locked is not None:
            self.tree.unlock(f.locked)
            f.locked = None
        if self.refresh_path and res.inserted and res.end_node is not None:
            self.tree.touch_path(res.end_node, now)
        self._after_insert(res, t)

    def _after_insert(self, res, t: float) -> None:
        tree = self.tree
        self.rec.occupancy(t, tree.kv_tokens * tree.kv_bytes_per_token, tree.n_states * tree.state_bytes)

    # ------------------------------------------------------------------ drivers
    def run(self) -> SimResult:
        if self.preset.name == "marconi-oracle":
            from policies.tuning import run_oracle

            return run_oracle(self.trace, self.config, self.progress)
        if self.config.mode == "sequential":
            self._run_sequential()
        else:
            self._run_des()
        res = self.rec.result(self)
        if self.tuner is not None:
            res.summary.update(self.tuner.summary())
        return res

    def _tune_before(self, r: Request, t: float) -> None:
        if self.tuner is not None:
            self.tuner.seen(r, t)
            self.tuner.before_insert(len(self.tuner.order))

    def _tune_after(self, r: Request, t: float) -> None:
        if self.tuner is not None:  # r: the request whose last insert just finished
            self.tuner.after_insert(len(self.tuner.order), r, t)

    def _timestamps(self) -> np.ndarray:
        reqs = self.trace.requests
        if not self.trace.closed_loop:
            return np.array([r.arrival for r in reqs], dtype=float)
        sessions = self.trace.sessions()
        starts = session_start_times(len(sessions), self.config.sessions_per_second,
                                     self.config.arrival, self.config.seed)
        ts = np.zeros(len(reqs))
        for start, turns in zip(starts, sessions.values()):
            t = start
            for r in turns:
                t += r.think_time
                ts[r.request_id] = t
        return ts

    def _run_sequential(self) -> None:
        ts = self._timestamps()
        order = np.argsort(ts, kind="stable")
        reqs = self.trace.requests
        for i in order:
            r = reqs[i]
            t = float(ts[i])
            if self.paper and self.preset.caching:
                self._paper_step(r, t)
                self._tick()
                continue
            f = self.lookup(r, t, lock=not self.paper)
            f.decode_cps = sorted(set(f.prefill_cps) | set(f.decode_cps))
            f.prefill_cps = []
            self.rec.timing(r, t, 0.0, self._prefill_s(f), self._decode_s(f))
            self._tune_before(r, t)
            self.insert_decode(f, t)
            self._tune_after(r, t)
            self._tick()

    # ------------------------------------------------------------------ the artifact's replay
    def _paper_step(self, r: Request, t: float) -> None:
        """One request as the Marconi artifact replays it (marconi.md §3-§5, §8).

        Logical clock: +1 for the lookup, +1 for the insert call, +1 for the insert's own match of
        input + output, +1 for the eviction call (inside the tree). Refresh: Marconi touches the
        deepest matched node on both matches; the LRU baselines touch the whole matched path (and
        SGLang+ the edge the match ends inside), and the inserted path after the insert. Room is
        made for the artifact's estimate of the insert's bytes (``_paper_need``), not the exact
        bytes. Nothing is pinned.
        """
        seq_in, seq_full, tok_in, tok_full = self._symbols(r)
        tree = self.tree
        now = self._now(t)
        m = tree.match(seq_in)
        hit_tokens = min(m.hit_tokens, tok_in)
        self._paper_refresh(m, now)
        self.rec.lookup(r, t, hit_tokens, tok_in, m.hit_sym > 0 and self.spec.is_hybrid)
        f = _Flight(r, seq_in, seq_full, tok_in, tok_full, hit_tokens, [], [], None)
        self.rec.timing(r, t, 0.0, self._prefill_s(f), self._decode_s(f))
        self._tune_before(r, t)  # the artifact tunes inside insert(), before its match and eviction
        self._now(t)  # insert()
        now = self._now(t)  # insert's match of input + output
        mf = tree.match(seq_full)
        self._paper_refresh(mf, now)
        n = len(seq_full)
        if self.paper_block:
            cps = list(range(self.paper_block, n + 1, self.paper_block))
            if n % self.paper_block:
                cps.append(n)
        else:  # judicious: the tail state; the branch state comes with the split (tree.split_states)
            cps = [n]
        res = tree.insert(seq_full, tok_full, cps, now, need_bytes=self._paper_need(mf, tok_full))
        if self.refresh_path and res.inserted and res.end_node is not None:
            tree.touch_path(res.end_node, tree.now)
        self._after_insert(res, t)
        self._tune_after(r, t)

    def _paper_refresh(self, m, now: float) -> None:
        tree = self.tree
        if not self.refresh_path:
            if m.hit_sym > 0:
                tree.touch(m.hit_node, now)
            return
        for node in m.path:
            tree.touch(node, now)
        if m.split_node is not None and not self.paper_block:
            tree.touch(m.split_node, now)  # SGLang+'s match also walks into the split edge

    def _paper_need(self, mf, tok_full: int) -> float:
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

    def _prefill_s(self, f: _Flight) -> float:
        if self.config.ttft_model == "jamba":
            return self.timing.jamba_ttft_s(f.tok_in - f.hit_tokens)
        return self.timing.prefill_time_s(self.spec, f.hit_tokens, f.tok_in)

    def _decode_s(self, f: _Flight) -> float:
        return self.timing.decode_time_s(f.tok_full - f.tok_in)

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def _run_des(self) -> None:
        env = simpy.Environment()
        servers = simpy.Resource(env, capacity=self.config.servers)

        def serve(r: Request):
            arrival = env.now
            f = self.lookup(r, arrival, lock=True)
            self._tune_before(r, arrival)  # des: the window counts arrivals
            with servers.request() as slot:
                yield slot
                start = env.now
                prefill = self._prefill_s(f)
                yield env.timeout(prefill)
                self.insert_prefill(f, env.now)
            decode = self._decode_s(f)
            yield env.timeout(decode)
            self.insert_decode(f, env.now)
            self._tune_after(r, env.now)
            self.rec.timing(r, arrival, start - arrival, prefill, decode)
            self._tick()

        if self.trace.closed_loop:
            sessions = self.trace.sessions()
            starts = session_start_times(len(sessions), self.config.sessions_per_second,
                                         self.config.arrival, self.config.seed)

            def session(start: float, turns: list[Request]):
                yield env.timeout(start)
                for r in turns:
                    if r.think_time > 0:
                        yield env.timeout(r.think_time)
                    yield env.process(serve(r))

            for start, turns in zip(starts, sessions.values()):
                env.process(session(float(start), turns))
        else:
            ts = self._timestamps()
            order = np.argsort(ts, kind="stable")
            reqs = self.trace.requests

            def feeder():
                for i in order:
                    wait = float(ts[i]) - env.now
                    if wait > 0:
                        yield env.timeout(wait)
                    env.process(serve(reqs[i]))

            env.process(feeder())
        env.run()


def simulate(trace: Trace, config: SimConfig, progress=None) -> SimResult:
    """Replay ``trace`` under ``config``; the one entry point the CLI and sweeps call."""
    return Simulation(trace, config, progress=progress).run()
