"""Per-request records (an observer of the engine's events) and the summary of one simulation."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sim.engine.misses import CAUSES
from traces.base import Request

if TYPE_CHECKING:  # pragma: no cover
    from sim.cache.tree import HybridRadixTree
    from sim.cost import ModelSpec
    from traces.base import Trace

#: keys of the JSON summary `marconi run --format json` prints (then rejected, saturated, alpha)
SUMMARY_KEYS = [
    "policy",
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "queue_p50_ms",
    "queue_p95_ms",
    "throughput_rps",
    "output_tokens_per_s",
    "batch_size_mean",
    "preemptions",
    "requests",
    "aborted_requests",
    "evictions",
    *(f"missed_{c}" for c in CAUSES),
    "hit_after_preemption",
]

_OCCUPANCY_POINTS = 2000  # occupancy series kept at most this many samples (reservoir by stride)


@dataclass(frozen=True)
class _Summary:
    """The dict-style reading every summary group shares (``s["key"]``, ``s.get``, ``s.keys()``):
    the keys and values of ``to_dict()``."""

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def keys(self):
        return self.to_dict().keys()

    def get(self, key: str, default=None):
        return self.to_dict().get(key, default)

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()


#: the dict-style reads every typed summary shares (``sim.replay.summary.ReplaySummary`` too)
SummaryReads = _Summary


@dataclass(frozen=True)
class DuelTuning(_Summary):
    """What ``--alpha auto --tuner duel`` (``sim.tuning.duel``) chose and how it got there."""

    tuned_alpha: float
    """The alpha the run ended on; NaN when the tuner chose SGLang+'s LRU (see ``tuned_choice``)."""
    tuned_choice: str
    """The candidate the run ended on as text: an alpha (``"%g"``) or ``"lru"``."""
    tuned_at_request: int | None
    """Index of the request at which the first tuning round ran; None before any round."""
    tuning_rounds: int
    """Tuning rounds run (count)."""
    tuning_switches: int
    """Rounds that switched to another candidate (count)."""
    tuning_seconds: float
    """Wall-clock time spent tuning (seconds of this process, not simulated time)."""
    first_eviction_request: int | None
    """Index of the request whose insert first evicted; None if nothing was evicted."""


@dataclass(frozen=True)
class ReplayTuning(_Summary):
    """What ``--alpha auto --tuner replay`` (``sim.tuning.replay``, the artifact's bootstrap-window
    replay) chose; all None/0 when the run never reached a tuning round."""

    tuned_alpha: float | None
    """The alpha adopted; NaN when LRU won, None when no round ran."""
    tuned_choice: str | None
    """The candidate adopted as text (an alpha ``"%g"`` or ``"lru"``); None when no round ran."""
    tuned_at_request: int | None
    """Index of the request at which the first round ran; None when no round ran."""
    tuning_rounds: int
    """Tuning rounds run (count)."""
    tuning_seconds: float
    """Wall-clock time spent replaying (seconds of this process, not simulated time)."""
    first_eviction_request: int | None
    """Index of the request at which the first eviction was seen; None if nothing was evicted."""


@dataclass(frozen=True)
class OracleTuning(_Summary):
    """``marconi-oracle`` (``sim.tuning.oracle``): the best static alpha in hindsight."""

    tuned_alpha: float
    """The alpha of the best run (by token hit rate; ties: the smallest alpha)."""
    tuned_choice: str
    """That alpha as text (``"%g"``)."""
    tuned_at_request: None
    """Always None: nothing is adopted during the run."""
    oracle_hit_rates: dict[str, float]
    """Token hit rate (fraction) of each alpha of the grid, keyed by the alpha as ``"%g"``."""


@dataclass(frozen=True)
class RunSummary(_Summary):
    """The summary of one simulation: one typed field per metric, in the order of the dict
    ``to_dict()`` gives (the run's JSON, the sweep's rows); ``tuning`` adds its own fields at the
    end. Latency and step fields are always there (0 where they do not apply: the steps of an
    fcfs run). Dict-style reads (``s["token_hit_rate"]``, ``s.get``, ``s.keys()``) see
    ``to_dict()``."""

    policy: str
    """The policy preset's name."""
    token_hit_rate: float
    """Prompt tokens served from the cache over all prompt tokens (fraction)."""
    request_hit_rate: float
    """Requests that reused at least one cached token (fraction)."""
    flops_saved: float
    """Prefill FLOPs not spent thanks to cache hits (FLOPs, summed over requests)."""
    flops_saved_frac: float
    """``flops_saved`` over the prefill FLOPs of all prompts (fraction)."""
    ttft_p5_ms: float
    """Time to first token, 5th percentile over finished requests (ms)."""
    ttft_p50_ms: float
    """Time to first token, median over finished requests (ms)."""
    ttft_p95_ms: float
    """Time to first token, 95th percentile over finished requests (ms)."""
    ttft_mean_ms: float
    """Time to first token, mean over finished requests (ms)."""
    requests: int
    """Requests in the trace (count)."""
    input_tokens: int
    """Prompt tokens over all requests (tokens)."""
    hit_tokens: int
    """Prompt tokens served from the cache (tokens)."""
    evictions: int
    """Cache evictions (count of evicted nodes)."""
    checkpoints_admitted: int
    """Recurrent-state checkpoints admitted to the cache (count)."""
    checkpoints_hit: int
    """Requests whose lookup resumed from a cached checkpoint (count)."""
    checkpoints_evicted: int
    """Recurrent-state checkpoints evicted (count)."""
    kv_tokens_evicted: int
    """KV-cache tokens evicted (tokens)."""
    rejected_inserts: int
    """Inserts the cache refused (count)."""
    peak_bytes: int
    """Peak cache occupancy, KV plus states (bytes)."""
    capacity_overshoots: int
    """Inserts that ended above capacity (count; only the published-artifact compat mode has any)."""
    final_kv_bytes: int
    """KV cache held at the end (bytes)."""
    final_state_bytes: int
    """Recurrent states held at the end (bytes)."""
    e2e_p50_ms: float | None
    """End-to-end latency (arrival to last token), median over finished requests (ms)."""
    e2e_p95_ms: float | None
    """End-to-end latency, 95th percentile over finished requests (ms)."""
    tpot_p50_ms: float | None
    """Time per output token after the first, median (ms; requests with one output token left out;
    None when no finished request has two)."""
    tpot_p95_ms: float | None
    """Time per output token after the first, 95th percentile (ms)."""
    queue_p50_ms: float | None
    """Queueing delay (arrival to prefill start), median over finished requests (ms)."""
    queue_p95_ms: float | None
    """Queueing delay, 95th percentile over finished requests (ms)."""
    throughput_rps: float
    """Finished requests per second of simulated time, first arrival to last token (1/s)."""
    output_tokens_per_s: float
    """Output tokens of finished requests per second of simulated time (tokens/s)."""
    steps: int
    """Engine steps (``--scheduler continuous``; 0 otherwise)."""
    batch_size_mean: float
    """Requests per engine step, mean over steps (requests)."""
    batch_size_p50: float
    """Requests per engine step, median (requests)."""
    batch_size_p95: float
    """Requests per engine step, 95th percentile (requests)."""
    batch_size_max: int
    """Requests per engine step, largest (requests)."""
    step_tokens_mean: float
    """Tokens per engine step, mean over steps (tokens)."""
    step_tokens_p50: float
    """Tokens per engine step, median (tokens)."""
    step_tokens_p95: float
    """Tokens per engine step, 95th percentile (tokens)."""
    step_tokens_max: int
    """Tokens per engine step, largest (tokens)."""
    preemptions: int
    """Requests preempted by the continuous scheduler (count)."""
    memory_overshoots: int
    """Steps whose charged memory exceeded the budget (count)."""
    peak_charged_bytes: int
    """Peak memory charged by the continuous scheduler (bytes)."""
    missed_never_shared: int = 0
    """Prompt tokens missed: shared with no earlier request (tokens; ``sim.engine.misses``)."""
    missed_no_checkpoint: int = 0
    """Prompt tokens missed: shared, but no state was ever placed there (the grid) (tokens)."""
    missed_last_token_rule: int = 0
    """Prompt tokens missed: the lookup stops at prompt - 1, the last sampled token is not stored (tokens)."""
    missed_evicted: int = 0
    """Prompt tokens missed: the state was evicted to make room for an insert (tokens)."""
    missed_insert_rejected: int = 0
    """Prompt tokens missed: the insert that would have placed the state did not fit (tokens)."""
    missed_held_by_running: int = 0
    """Prompt tokens missed: the state was evicted to make room for running requests (tokens)."""
    missed_speculative: int = 0
    """Prompt tokens missed: speculative decoding keeps the state one alignment unit earlier (tokens)."""
    hit_after_preemption: int = 0
    """Hit tokens of preempted requests' lookups past what each shared with earlier requests at its
    first lookup: its own chunks, published before the preemption, or requests served since (tokens;
    part of ``hit_tokens``)."""
    aborted_requests: int = 0
    """Requests the engine aborted at arrival, their prompt longer than it takes (SGLang's
    ``max_req_input_len``, its KV pool less 6 tokens): not looked up, computed or finished, and
    left out of the hit rates, ``input_tokens`` and the FLOPs (count; ``aborted`` in
    requests.parquet)."""
    running_cap: int = 0
    """Requests the continuous scheduler ran at most at once: ``--max-num-seqs``, or an engine's
    own lower cap (SGLang: its mamba pool's states // states per running request) (count; 0
    under ``fcfs`` and ``sequential``)."""
    tuning: DuelTuning | ReplayTuning | OracleTuning | None = None
    """What an auto-tuned run (``--alpha auto``) or a hindsight bound chose; None for a static run."""

    def to_dict(self) -> dict:
        """The summary as the plain dict of old: every metric, then the tuning group's fields."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tuning"}
        if self.tuning is not None:
            d.update(self.tuning.to_dict())
        return d


@dataclass
class SimResult:
    summary: RunSummary
    requests: pd.DataFrame
    occupancy: pd.DataFrame = field(default_factory=pd.DataFrame)


class Recorder:
    """Columnar per-request arrays, filled in place (no per-request dicts)."""

    def __init__(self, n: int, spec: "ModelSpec") -> None:
        self.spec = spec
        self.arrival = np.full(n, np.nan)
        self.input_tokens = np.zeros(n, dtype=np.int64)
        self.hit_tokens = np.zeros(n, dtype=np.int64)
        self.state_hit = np.zeros(n, dtype=bool)
        self.queue_s = np.zeros(n)
        self.prefill_s = np.zeros(n)
        self.decode_s = np.zeros(n)
        self.done = np.zeros(n, dtype=bool)
        self.first_token = np.full(n, np.nan)  # time of the first output token (prefill end)
        self.finish = np.full(n, np.nan)  # time of the last output token
        self.output_tokens = np.zeros(n, dtype=np.int64)
        # --scheduler continuous: steps as histograms (batch size -> steps, tokens -> steps)
        self.steps = 0
        self.batch_hist: dict[int, int] = {}
        self.token_hist: dict[int, int] = {}
        self.preemptions = 0
        self.memory_overshoots = 0
        self.peak_charged_bytes = 0
        self.running_cap = 0  # the continuous scheduler's running-request cap (set by it)
        self._occ_t: list[float] = []
        self._occ_kv: list[int] = []
        self._occ_state: list[int] = []
        self._occ_every = 1
        self._occ_seen = 0
        self.misses = None  # sim.engine.misses.MissLedger: the miss_* columns (why a request missed)
        self.aborted = np.zeros(n, dtype=bool)  # refused by the engine at arrival (``abort``)

    # ---- the engine's events this observer listens to (sim.engine.events)
    def lookup(
        self, request: Request, t: float, hit_checkpoint: int | None, hit_tokens: int, input_tokens: int
    ) -> None:
        i = request.request_id
        if self.arrival[i] != self.arrival[i]:  # NaN: no arrive event came first (fcfs)
            self.arrival[i] = t
        self.hit_tokens[i] = hit_tokens
        self.input_tokens[i] = input_tokens
        self.state_hit[i] = hit_checkpoint is not None

    def prefill(
        self, request: Request, t_start: float, t_end: float, start_pos: int, end_pos: int, seconds: float
    ) -> None:
        i = request.request_id
        self.queue_s[i] = t_start - self.arrival[i]
        self.prefill_s[i] = seconds
        self.first_token[i] = t_end

    def decode(
        self, request: Request, t_start: float, t_end: float, start_pos: int, end_pos: int, seconds: float
    ) -> None:
        i = request.request_id
        self.decode_s[i] = seconds
        self.done[i] = True
        self.finish[i] = t_end
        self.output_tokens[i] = end_pos - start_pos

    def arrive(self, request: Request, t: float) -> None:
        self.arrival[request.request_id] = t

    def abort(self, request: Request, t: float, input_tokens: int) -> None:
        """The engine aborted ``request`` at its arrival ``t`` (its ``input_tokens``-token prompt is
        longer than the engine takes: SGLang's ``max_req_input_len``): no lookup, prefill or output;
        not finished, and left out of the summary's hit rates, prompt tokens and FLOPs."""
        i = request.request_id
        self.arrival[i] = t
        self.input_tokens[i] = input_tokens
        self.aborted[i] = True

    def step(self, t_start, t_end, seconds, steps, prefills, decodes, tokens, preempted) -> None:
        self.steps += steps
        b = len(prefills) + len(decodes)
        self.batch_hist[b] = self.batch_hist.get(b, 0) + steps
        self.token_hist[tokens] = self.token_hist.get(tokens, 0) + steps
        self.preemptions += len(preempted)

    def charged(self, used_bytes: int) -> None:
        """The memory charged now (``--scheduler continuous``: the cache's entries plus what the
        running requests hold): its peak is kept."""
        if used_bytes > self.peak_charged_bytes:
            self.peak_charged_bytes = used_bytes

    def overshoot(self) -> None:
        """A running request was charged beyond the capacity (too large to fit even alone)."""
        self.memory_overshoots += 1

    def occupancy(self, t: float, kv_bytes: int, state_bytes: int) -> None:
        # sample k is kept when k is a multiple of the stride (k from 0: the first sample always
        # stays, and a halving keeps exactly the multiples of the doubled stride)
        seen = self._occ_seen
        self._occ_seen += 1
        if seen % self._occ_every:
            return
        self._occ_t.append(t)
        self._occ_kv.append(kv_bytes)
        self._occ_state.append(state_bytes)
        if len(self._occ_t) >= 2 * _OCCUPANCY_POINTS:  # halve the resolution, keep the span
            self._occ_t = self._occ_t[::2]
            self._occ_kv = self._occ_kv[::2]
            self._occ_state = self._occ_state[::2]
            self._occ_every *= 2

    def result(self, trace: "Trace", tree: "HybridRadixTree", policy: str) -> SimResult:
        spec = self.spec
        reqs = trace.requests
        served = ~self.aborted  # an aborted request is neither a hit nor a miss
        flops_total = np.array([spec.flops(int(L)) if ok else 0.0 for L, ok in zip(self.input_tokens, served)])
        flops_saved = np.array([spec.flops(int(h)) if h else 0.0 for h in self.hit_tokens])
        ttft = self.queue_s + self.prefill_s
        e2e = self.finish - self.arrival
        n_out = self.output_tokens
        with np.errstate(invalid="ignore", divide="ignore"):  # TPOT: (e2e - TTFT) / (output - 1)
            tpot = np.where(n_out > 1, (self.finish - self.first_token) / (n_out - 1), np.nan)
        df = pd.DataFrame(
            {
                "request_id": np.arange(len(reqs)),
                "session_id": [r.session_id for r in reqs],
                "turn": [r.turn for r in reqs],
                "arrival_s": self.arrival,
                "input_tokens": self.input_tokens,
                "hit_tokens": self.hit_tokens,
                "state_hit": self.state_hit,
                "flops": flops_total,
                "flops_saved": flops_saved,
                "queue_s": self.queue_s,
                "prefill_s": self.prefill_s,
                "ttft_s": ttft,
                "decode_s": self.decode_s,
                "output_tokens": n_out,
                "tpot_s": tpot,
                "e2e_s": e2e,
                "aborted": self.aborted.copy(),
            }
        )
        if self.misses is not None:
            for name, col in self.misses.columns().items():
                df[name] = col
        st = tree.stats
        total_in = int(self.input_tokens[served].sum())
        done = self.done
        t_ms = ttft[done] * 1e3 if done.any() else np.zeros(1)
        summary = RunSummary(
            policy=policy,
            token_hit_rate=float(self.hit_tokens.sum() / total_in) if total_in else 0.0,
            request_hit_rate=float((self.hit_tokens[served] > 0).mean()) if served.any() else 0.0,
            flops_saved=float(flops_saved.sum()),
            flops_saved_frac=float(flops_saved.sum() / flops_total.sum()) if flops_total.sum() else 0.0,
            ttft_p5_ms=float(np.percentile(t_ms, 5)),
            ttft_p50_ms=float(np.percentile(t_ms, 50)),
            ttft_p95_ms=float(np.percentile(t_ms, 95)),
            ttft_mean_ms=float(t_ms.mean()),
            requests=int(len(reqs)),
            input_tokens=total_in,
            hit_tokens=int(self.hit_tokens.sum()),
            evictions=int(st.evictions),
            checkpoints_admitted=int(st.states_admitted),
            checkpoints_hit=int(self.state_hit.sum()),
            checkpoints_evicted=int(st.states_evicted),
            kv_tokens_evicted=int(st.kv_tokens_evicted),
            rejected_inserts=int(st.rejected_inserts),
            peak_bytes=int(st.peak_bytes),
            capacity_overshoots=int(st.overshoots),
            final_kv_bytes=int(tree.kv_tokens * tree.kv_bytes_per_token),
            final_state_bytes=int(tree.n_states * tree.state_bytes),
            **self._latency(done, e2e, tpot),
            **self._steps(),
            **({f"missed_{c}": int(v.sum()) for c, v in self.misses.counts.items()} if self.misses is not None else {}),
            hit_after_preemption=int(self.misses.after_preemption.sum()) if self.misses is not None else 0,
            aborted_requests=int(self.aborted.sum()),
        )
        occ = pd.DataFrame({"t_s": self._occ_t, "kv_bytes": self._occ_kv, "state_bytes": self._occ_state})
        return SimResult(summary, df, occ)

    def _latency(self, done: np.ndarray, e2e: np.ndarray, tpot: np.ndarray) -> dict:
        """End-to-end latency, TPOT, queueing delay and throughput of the finished requests."""
        out = {}
        for name, v in (("e2e", e2e[done]), ("tpot", tpot[done]), ("queue", self.queue_s[done])):
            # none to measure (no request decoded a second token: TPOT of prompts with 0 or 1
            # output tokens) is None, the tables' "-", not a 0.0 that reads as instant decoding
            v = v[~np.isnan(v)] * 1e3
            out[f"{name}_p50_ms"] = float(np.percentile(v, 50)) if len(v) else None
            out[f"{name}_p95_ms"] = float(np.percentile(v, 95)) if len(v) else None
        span = float(np.nanmax(self.finish) - np.nanmin(self.arrival)) if done.any() else 0.0
        out["throughput_rps"] = float(done.sum() / span) if span > 0 else 0.0
        out["output_tokens_per_s"] = float(self.output_tokens[done].sum() / span) if span > 0 else 0.0
        return out

    def _steps(self) -> dict:
        """Engine steps (``--scheduler continuous``; zeros otherwise): batch size and tokens per
        step as distributions, preemptions, memory charged."""
        return {
            "steps": self.steps,
            **_hist_stats("batch_size", self.batch_hist),
            **_hist_stats("step_tokens", self.token_hist),
            "preemptions": self.preemptions,
            "memory_overshoots": self.memory_overshoots,
            "peak_charged_bytes": self.peak_charged_bytes,
            "running_cap": self.running_cap,
        }


def _hist_stats(name: str, hist: dict[int, int]) -> dict:
    """Mean, p50, p95 and max of a histogram {value: count}."""
    if not hist:
        return {f"{name}_mean": 0.0, f"{name}_p50": 0.0, f"{name}_p95": 0.0, f"{name}_max": 0}
    vals = np.array(sorted(hist), dtype=float)
    counts = np.array([hist[int(v)] for v in vals], dtype=float)
    cum = np.cumsum(counts) / counts.sum()

    def pct(q: float) -> float:
        return float(vals[min(int(np.searchsorted(cum, q)), len(vals) - 1)])

    return {
        f"{name}_mean": float((vals * counts).sum() / counts.sum()),
        f"{name}_p50": pct(0.5),
        f"{name}_p95": pct(0.95),
        f"{name}_max": int(vals[-1]),
    }
