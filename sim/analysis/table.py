"""The text tables `marconi run`, `marconi sweep` and `marconi report` print (no click, no pandas).

A column is a metric of the run summary (``sim.engine.metrics.RunSummary``: the keys of
``marconi run --format json`` and of a sweep's rows) or a knob of the configuration, shown under a
short two-line header: a group (``TTFT ms``) over its sub-columns (``p50``, ``p95``). ``--columns``
takes these keys; :data:`DEFAULT_COLUMNS` is the compact set ``marconi run`` prints.

:func:`saturation` reads a run's per-request records and says whether the engine kept up with the
offered load (the queue grows through the run when it does not) and what rate it sustains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np


def _pct(v) -> str:
    return f"{v * 100:.2f}%"


def _ms(v) -> str:
    """0.1 ms below a second; whole milliseconds with thousands separators above (a saturated run's
    TTFT read 2037224.4: seven digits and a tenth of a millisecond no one reads)."""
    return f"{v:.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def _int(v) -> str:
    return f"{int(v)}"


def _sci(v) -> str:
    return f"{v:.3e}"


def _rate(v) -> str:
    """Three significant digits, trailing zeros kept (``.3g`` printed 0.26 above 0.259 in one column)."""
    return f"{v:#.3g}".rstrip(".") if v < 100 else f"{v:.0f}"


def _one(v) -> str:
    return f"{v:.1f}"


@dataclass(frozen=True)
class Column:
    key: str
    """The summary field (or knob) the column shows."""
    group: str
    """The header's first line (columns of one group share it: ``TTFT ms``)."""
    label: str
    """The header's second line (``p50``)."""
    fmt: Callable[[object], str]
    higher_is_better: bool | None = None
    """Which way is best when sorting by this column (None: not a metric to sort by)."""
    help: str = ""
    applies: Callable[[Mapping], bool] | None = None
    """Whether the column means anything for a record (else shown as ``-``): batch sizes need steps."""


def _stepped(r: Mapping) -> bool:
    return bool(r.get("steps", 1))


#: every metric column a table can show, in display order (``--columns all``)
METRICS: tuple[Column, ...] = (
    Column("token_hit_rate", "cache hit", "token", _pct, True, "prompt tokens served from the cache"),
    Column("request_hit_rate", "cache hit", "request", _pct, True, "requests reusing >= 1 cached token"),
    Column("flops_saved", "FLOPs", "saved", _sci, True, "prefill FLOPs not recomputed"),
    Column("flops_saved_frac", "FLOPs", "saved %", _pct, True, "share of prefill FLOPs not recomputed"),
    Column("ttft_p50_ms", "TTFT ms", "p50", _ms, False, "time to first token, median"),
    Column("ttft_p95_ms", "TTFT ms", "p95", _ms, False, "time to first token, 95th percentile"),
    Column("tpot_p50_ms", "TPOT ms", "p50", _ms, False, "time per output token after the first, median"),
    Column("tpot_p95_ms", "TPOT ms", "p95", _ms, False, "time per output token, 95th percentile"),
    Column("e2e_p50_ms", "e2e ms", "p50", _ms, False, "arrival to last token, median"),
    Column("e2e_p95_ms", "e2e ms", "p95", _ms, False, "arrival to last token, 95th percentile"),
    Column("queue_p50_ms", "queue ms", "p50", _ms, False, "arrival to prefill start, median"),
    Column("queue_p95_ms", "queue ms", "p95", _ms, False, "arrival to prefill start, 95th percentile"),
    Column("throughput_rps", "served", "req/s", _rate, True, "finished requests per second"),
    Column("output_tokens_per_s", "served", "tok/s", _rate, True, "output tokens per second"),
    Column("batch_size_mean", "batch", "mean", _one, None, "requests per engine step, mean", _stepped),
    Column("preemptions", "", "preempted", _int, False, "requests preempted (continuous batching)"),
    Column("evictions", "", "evictions", _int, False, "cache entries evicted"),
    Column("rejected_inserts", "", "rejected", _int, False, "inserts that did not fit in the cache"),
)
#: why prompt tokens were missed (``sim.engine.misses``), by cause: ``--columns misses`` (not in ``all``)
MISS_COLUMNS: tuple[Column, ...] = (
    Column(
        "missed_never_shared", "missed tokens by cause", "never shared", _int, False, "shared with no earlier request"
    ),
    Column("missed_no_checkpoint", "", "no ckpt", _int, False, "shared, no state ever placed there"),
    Column("missed_last_token_rule", "", "last token", _int, False, "lookup stops at prompt-1; last token unstored"),
    Column("missed_evicted", "", "evicted", _int, False, "state evicted for an insert"),
    Column("missed_insert_rejected", "", "rejected", _int, False, "the insert placing it did not fit"),
    Column("missed_held_by_running", "", "running", _int, False, "state evicted for running requests"),
    Column("missed_speculative", "", "spec", _int, False, "state one alignment unit earlier (speculation)"),
)
BY_KEY: dict[str, Column] = {c.key: c for c in (*METRICS, *MISS_COLUMNS)}
#: short names ``--columns`` and ``--sort`` also take
ALIASES = {
    "token_hit": "token_hit_rate",
    "request_hit": "request_hit_rate",
    "rejected": "rejected_inserts",
    "throughput": "throughput_rps",
    "tokens_per_s": "output_tokens_per_s",
    "batch": "batch_size_mean",
}
#: what `marconi run` prints without ``--columns``
DEFAULT_COLUMNS = (
    "token_hit_rate",
    "request_hit_rate",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_p50_ms",
    "queue_p95_ms",
    "throughput_rps",
    "batch_size_mean",
    "preemptions",
    "evictions",
    "rejected_inserts",
)


def metric_key(name: str) -> str:
    """The summary key of a column name or alias; ValueError when it is none."""
    key = ALIASES.get(name, name)
    if key not in BY_KEY:
        raise ValueError(name)
    return key


def parse_columns(text: str, default: Sequence[str] = DEFAULT_COLUMNS, extra: Sequence[str] = ()) -> list[str]:
    """``--columns``: ``default``, ``all``, or a comma list of column names (``default`` inside the
    list stands for the default set: ``default,e2e_p95_ms``); ``extra`` are further names allowed
    (a report's knobs). ValueError naming the first unknown name."""
    out: list[str] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        if word == "default":
            out += list(default)
        elif word == "all":
            out += [c.key for c in METRICS]
        elif word == "misses":
            out += ["token_hit_rate", *(c.key for c in MISS_COLUMNS)]
        elif word in extra:
            out.append(word)
        else:
            out.append(metric_key(word))
    if not out:
        raise ValueError(text)
    return list(dict.fromkeys(out))


def column_names() -> str:
    """The names ``--columns`` takes, for an error line."""
    return ", ".join(c.key for c in METRICS)


def applies(key: str, record: Mapping) -> bool:
    """Whether metric ``key`` means anything for ``record`` (the table's ``-``): a batch size needs
    engine steps, which an fcfs run has none of."""
    col = next((c for c in METRICS if c.key == key), None)
    return col is None or col.applies is None or col.applies(record)


def _cell(col: Column | None, value, record: Mapping) -> str:
    if col is not None and col.applies is not None and not col.applies(record):
        return "-"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if col is None:
        return f"{value:g}" if isinstance(value, float) else str(value)
    return col.fmt(value)


def format_table(records: Sequence[Mapping], columns: Sequence[str], first: str = "policy") -> str:
    """A text table: ``first`` (left-aligned) then ``columns`` (right-aligned), one line per record,
    under a two-line header (groups over their sub-columns) and a rule. A key that is not a metric
    (a knob) is its own header, and is left-aligned when it holds text."""
    keys = [first, *columns]
    cols = [BY_KEY.get(k) for k in keys]
    groups = [c.group if c else "" for c in cols]
    labels = [c.label if c else k.replace("_", " ") for k, c in zip(keys, cols)]
    cells = [[_cell(c, r.get(k), r) for k, c in zip(keys, cols)] for r in records]
    left = [i == 0 or (cols[i] is None and any(isinstance(r.get(k), str) for r in records)) for i, k in enumerate(keys)]
    widths = [
        max(len(labels[i]), *(len(row[i]) for row in cells)) if cells else len(labels[i]) for i in range(len(keys))
    ]
    # a group wider than its columns widens its last column
    i = 0
    while i < len(keys):
        j = i
        while j + 1 < len(keys) and groups[j + 1] == groups[i] and groups[i]:
            j += 1
        span = sum(widths[i : j + 1]) + 2 * (j - i)
        if len(groups[i]) > span:
            widths[j] += len(groups[i]) - span
        i = j + 1

    def line(values: Sequence[str], align: Sequence[bool]) -> str:
        return "  ".join(v.ljust(w) if a else v.rjust(w) for v, w, a in zip(values, widths, align)).rstrip()

    # the group line: each group's name centred over its span
    parts, i = [], 0
    while i < len(keys):
        j = i
        while j + 1 < len(keys) and groups[j + 1] == groups[i] and groups[i]:
            j += 1
        span = sum(widths[i : j + 1]) + 2 * (j - i)
        parts.append(groups[i].center(span) if groups[i] else " " * span)
        i = j + 1
    out = []
    if any(groups):
        out.append("  ".join(parts).rstrip())
    out.append(line(labels, left))
    out.append(line(["-" * w for w in widths], left))
    out += [line(row, left) for row in cells]
    return "\n".join(out)


def best_first(records: Sequence[Mapping], metric: str) -> list[Mapping]:
    """``records`` sorted best first by ``metric`` (higher first for hit rates and throughput, lower
    first for latencies and counts); NaN / missing values last; ties keep their order."""
    col = BY_KEY[metric]
    sign = -1.0 if col.higher_is_better in (True, None) else 1.0

    def key(r):
        v = r.get(metric)
        bad = v is None or (isinstance(v, float) and math.isnan(v))
        return (bad, 0.0 if bad else sign * float(v))

    return sorted(records, key=key)


@dataclass(frozen=True)
class Saturation:
    """Whether the engine kept up with the offered load, from one run's per-request records."""

    saturated: bool
    queue_first_s: float
    """Mean queueing delay of the first third of requests by arrival (s)."""
    queue_last_s: float
    """Mean queueing delay of the last third (s)."""
    busy_s: float
    """Time at least one request was in prefill or decode (s)."""
    served_rps: float
    """Finished requests per second of busy time: what the engine sustains when saturated."""


def saturation(arrival_s, queue_s, e2e_s) -> Saturation | None:
    """Reads the per-request records of one run (arrays: arrival, queueing delay, end-to-end
    latency, seconds; NaN for unfinished requests). Saturated when the queue grows through the run:
    the mean queueing delay of the last third of requests (by arrival) is over twice that of the
    first third and over one second. The sustainable rate is the requests finished per second of
    busy time (the union of the requests' [prefill start, last token] spans): at saturation the
    engine is busy throughout, so it is the rate it serves. None for fewer than 6 finished requests."""
    arrival = np.asarray(arrival_s, dtype=float)
    queue = np.asarray(queue_s, dtype=float)
    e2e = np.asarray(e2e_s, dtype=float)
    ok = ~(np.isnan(arrival) | np.isnan(queue) | np.isnan(e2e))
    if ok.sum() < 6:
        return None
    arrival, queue, e2e = arrival[ok], queue[ok], e2e[ok]
    order = np.argsort(arrival, kind="stable")
    third = len(order) // 3
    q_first = float(queue[order[:third]].mean())
    q_last = float(queue[order[-third:]].mean())
    start = arrival + queue
    end = arrival + e2e
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(start.tolist(), end.tolist())):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    served = len(arrival) / busy if busy > 0 else math.inf
    return Saturation(q_last > max(2 * q_first, 1.0), q_first, q_last, busy, served)


def saturation_warning(
    runs: Sequence[tuple[str, Saturation | None]],
    offered_rps: float,
    sessions_per_second: float | None,
    per_session: float,
    time_scale: float = 1.0,
) -> str:
    """One warning line for the saturated runs of ``runs`` (policy, Saturation), or "" when none is:
    the queue's growth, the rate each sustains, the offered rate, and the setting the engine would
    keep up at: on closed-loop traces (sessions arrive at ``sessions_per_second`` with
    ``per_session`` requests each: ``offered_rps`` is their product, a steady-state figure) the
    session rate, on open-loop traces (``sessions_per_second`` None) the ``--time-scale``."""
    sat = [(p, s) for p, s in runs if s is not None and s.saturated]
    if not sat:
        return ""
    names = ", ".join(p for p, _ in sat)
    worst = max(sat, key=lambda ps: ps[1].queue_last_s)[1]
    low, high = (f(s.served_rps for _, s in sat) for f in (min, max))
    served = _plain(low) if _plain(low) == _plain(high) else f"{_plain(low)}-{_plain(high)}"
    text = (
        f"warning: offered load exceeds what the engine serves ({names}): the mean queueing delay grows "
        f"from {_plain(worst.queue_first_s)} s to {_plain(worst.queue_last_s)} s (first vs last third of arrivals); "
        f"the engine sustains about {served} requests/s of busy time against "
    )
    if math.isinf(offered_rps) and not sessions_per_second:  # an open-loop burst: no gap to stretch
        return text + "requests that all arrive at once (the trace's arrivals: no --time-scale spreads them)"
    text += f"{_plain(offered_rps)} offered"
    if sessions_per_second:
        keep_up = low / per_session
        text += (
            f" ({sessions_per_second:g} session{'' if sessions_per_second == 1 else 's'}/s x "
            f"{_plain(per_session)} requests a session): about --sessions-per-second {_plain(keep_up, 2)} or less "
            "keeps up"
        )
    else:
        scale = time_scale * offered_rps / low
        text += f" (the trace's arrivals): about --time-scale {_plain(scale, 2)} or more keeps up"
    return text


def _plain(v: float, digits: int = 3) -> str:
    """``v`` to ``digits`` significant digits without an exponent between 1e-4 and 1e9 (``.3g``
    wrote a queue of 1390 s as ``1.39e+03 s`` and a time scale of 180 as ``--time-scale 1.8e+02``)."""
    if not math.isfinite(v) or v == 0 or not 1e-4 <= abs(v) < 1e9:
        return f"{v:.{digits}g}"
    r = float(f"{v:.{digits}g}")
    text = f"{r:.{max(digits - 1 - math.floor(math.log10(abs(r))), 0)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
