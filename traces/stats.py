"""Trace statistics and the hit rates an infinite cache reaches (upper bounds for any policy).

A request's hit = the longest prefix of its input that appeared (as a prefix) in the input +
output of an earlier request, in replay order. Bounds reported, in tokens:

- ``kv``: KV-only cache (pure transformer): the whole hit;
- ``hybrid_every``: hybrid model with a state checkpoint at every position: the whole hit again
  (with infinite memory every matched position has its state, so it equals ``kv``);
- ``hybrid_64``: hybrid model whose states exist only every 64 tokens: the hit rounded down to a
  multiple of 64.

Hash-block traces count a matched symbol as ``block_tokens`` tokens (the trailing partial block as
its real size). Prefixes are kept as 64-bit polynomial hashes of every prefix in a Python set;
since the set is prefix-closed, the longest match is a binary search.
"""

from __future__ import annotations

import numpy as np

from traces.arrivals import sequential_timestamps
from traces.base import Trace, TraceError, available_memory

_B = np.uint64(0x9E3779B97F4A7C15 | 1)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _inverse(b: int) -> int:
    return pow(b, -1, 1 << 64)


_BINV = np.uint64(_inverse(int(_B)))


class _Powers:
    def __init__(self):
        self.pow = np.ones(1, dtype=np.uint64)
        self.inv = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.pow) < n:
            m = max(n, 2 * len(self.pow))
            with np.errstate(over="ignore"):
                p = np.full(m, _B, dtype=np.uint64)
                p[0] = 1
                self.pow = np.cumprod(p, dtype=np.uint64)
                q = np.full(m, _BINV, dtype=np.uint64)
                q[0] = 1
                self.inv = np.cumprod(q, dtype=np.uint64)
        return self.pow[:n], self.inv[:n]


def prefix_hashes(seq: np.ndarray, powers: _Powers | None = None) -> np.ndarray:
    """h[i] = hash(seq[:i+1]) = sum_j x_j * B^(i-j) mod 2^64, vectorised."""
    n = len(seq)
    powers = powers or _Powers()
    pw, inv = powers.get(n)
    with np.errstate(over="ignore"):
        x = np.asarray(seq, dtype=np.int64).view(np.uint64) * _MIX1 + _MIX2
        return pw * np.cumsum(x * inv, dtype=np.uint64)


def replay_order(trace: Trace, rate: float = 1.0) -> np.ndarray:
    """Request ids in sequential-mode order (sessions at ``i / rate``, cumulative think times)."""
    return np.argsort(sequential_timestamps(trace, rate), kind="stable")


#: traces of this many requests or more show a progress bar while their bounds are computed (with
#: ``progress``): 640,000 Mooncake rows took 13-20 s with nothing on the screen after the reading bar
PROGRESS_REQUESTS = 50_000


#: memory of one distinct prefix in the bounds' set (a Python int in a set: 70 bytes measured)
PREFIX_BYTES = 80


def upper_bounds(trace: Trace, rate: float = 1.0, boundary: int = 64, progress: bool = False) -> dict:
    seen: set[int] = set()
    # the set holds every distinct prefix: one per token of a spelled-out hash-block trace, which
    # filled the machine; stopped in one line once it would outgrow the memory available at the start
    memory = available_memory()
    most = int(memory * 0.9) // PREFIX_BYTES
    powers = _Powers()
    bt = trace.block_tokens
    kv = b64 = 0
    hit_requests = 0
    total_in = 0
    order = replay_order(trace, rate)
    if progress and len(order) >= PROGRESS_REQUESTS:
        from tqdm import tqdm  # noqa: PLC0415 - only for a large trace

        order = tqdm(order, desc="infinite-cache bounds", unit="req", leave=False, miniters=10_000)
    for rid in order:
        r = trace.requests[int(rid)]
        inp, out = r.input_tokens, r.output_tokens
        seq = np.concatenate([inp, out]) if len(out) else inp
        h = prefix_hashes(seq, powers)
        n = len(inp)
        lo, hi = 0, n  # longest k with h[k-1] in seen (prefix-closed set)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(h[mid - 1]) in seen:
                lo = mid
            else:
                hi = mid - 1
        k = lo
        n_in = r.n_input_tokens(bt)
        hit = min(k * bt, n_in)
        total_in += n_in
        kv += hit
        b64 += (hit // boundary) * boundary
        hit_requests += hit > 0
        seen.update(h[k:].tolist())
        if len(seen) > most:
            spelled = trace.meta.get("hash_block_tokens")
            raise TraceError(
                f"{trace.name}: the infinite-cache bounds keep every distinct prefix, {len(seen):,} after "
                f"{total_in:,} prompt tokens, about {len(seen) * PREFIX_BYTES / 1e9:,.1f} GB: more than the "
                f"{memory / 1e9:,.1f} GB of memory available"
                + ("; without --hash-block-tokens they keep one a hash block, not one a token" if spelled else "")
            )
    return {
        "kv_hit_rate": kv / total_in if total_in else 0.0,
        "hybrid_every_hit_rate": kv / total_in if total_in else 0.0,
        f"hybrid_{boundary}_hit_rate": b64 / total_in if total_in else 0.0,
        "kv_hit_tokens": kv,
        f"hybrid_{boundary}_hit_tokens": b64,
        "request_hit_rate": hit_requests / len(trace.requests),
        "distinct_prefixes": len(seen),
    }


def trace_stats(trace: Trace, rate: float = 1.0, progress: bool = False) -> dict:
    bt = trace.block_tokens
    ins = np.array([r.n_input_tokens(bt) for r in trace.requests], dtype=np.int64)
    outs = np.array([r.n_output_tokens(bt) for r in trace.requests], dtype=np.int64)
    sess = trace.sessions()
    turns = np.array([len(v) for v in sess.values()])
    out = {
        "trace": trace.name,
        "sessions": len(sess),
        "requests": len(trace.requests),
        "block_tokens": bt,
        "closed_loop": trace.closed_loop,
        "input_tokens": int(ins.sum()),
        "output_tokens": int(outs.sum()),
        "mean_input_tokens": float(ins.mean()),
        "max_input_tokens": int(ins.max()),
        "mean_output_tokens": float(outs.mean()),
        "mean_turns_per_session": float(turns.mean()),
        "max_turns_per_session": int(turns.max()),
    }
    if not trace.closed_loop:
        arr = np.array([r.arrival for r in trace.requests], dtype=np.float64)
        out["duration_s"] = float(arr.max() - arr.min())
    out.update(upper_bounds(trace, rate, progress=progress))
    return out
