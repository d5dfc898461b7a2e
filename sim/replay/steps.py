"""Executed engine steps of a ``--scheduler continuous`` replay as rows (no torch): what each
timed step ran, its measured time, the calibration features of its work, and modelled-vs-measured
errors for any timing model.

``step_table(steps, spec, timing, counts)`` builds ``steps.parquet``'s rows from the step
executor's ``ExecutedStep`` records; ``with_model(table, spec, timing, counts)`` recomputes the
modelled time and the error of every row for another timing model (a re-fitted one), and
``step_summary`` gives the summary keys. Times are over the replayed layers (``counts``), as in
the request table: the modelled time is the timing model applied to the replayed layers
(``measure.replayed_spec``).

Features (per layer of a kind, so a fit divides the measured per-type time by the replayed count,
as ``measure.fit_hardware`` does for requests): ``tflop_<term>`` over the step's prefill chunks
(the terms of ``sim.cost.TERMS``, ``HardwareTiming.work_tflop``'s FLOP counts before its ms per
TFLOP), ``decode_tflop_<term>`` over its decode tokens taken as one-token segments at their
contexts (what the batch executes: one kernel chunk each), ``work_tflop_<kind>`` the two summed by
layer kind, and the batch's shape: ``n_seqs``, ``n_prefill_seqs``, ``n_decode``,
``prefill_tokens``, ``context_sum`` (of the decodes), ``gdn_chunks``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from sim.cost import LAYER_KINDS, TERMS, HardwareTiming, ModelSpec, gdn_chunks
from sim.replay.flops import replayed_flops
from sim.replay.measure import held_up, host_bound, mixing_layers, replayed_spec

KIND_OF_TERM = {
    "attn_linear": "attention",
    "attn_quadratic": "attention",
    "gdn_linear": "gated_delta",
    "gdn_chunk": "gated_delta",
    "mlp_linear": "mlp",
}


@dataclass
class ExecutedStep:
    """One timed engine step: step ``index`` of step event ``event`` (a coasted run of
    ``steps_in_event`` decode steps has its first steps timed), at simulated time ``t``."""

    event: int
    index: int
    steps_in_event: int
    t: float
    prefills: tuple  # ((request_id, start, end), ...)
    decodes: tuple  # ((request_id, context), ...)
    measured_ms: float = float("nan")  # the batched forward, state gather / scatter included
    ms_by_type: dict = field(default_factory=dict)  # layer type -> ms (Marks), "other" too
    host_ms: float = float("nan")  # the host's time to issue the step
    slack_ms: float = float("nan")  # its device end after the host's (Stopwatch.slack_ms)


def term_flops(spec: ModelSpec, start: int, end: int) -> dict:
    """FLOPs of one layer of each term over tokens ``[start, end)`` in one call (ragged chunks
    whole), the terms of ``HardwareTiming.work_tflop``."""
    if end <= start:
        return dict.fromkeys(TERMS, 0.0)
    n = end - start
    return {  # a Mamba2 model's mixer in the gated-delta terms, as work_tflop prices it
        "attn_linear": spec.attn_layer_a * n,
        "attn_quadratic": spec.attn_layer_b * (end * end - start * start),
        "gdn_linear": spec.linear_layer_a * n,
        "gdn_chunk": spec.linear_chunk_flops * gdn_chunks(start, end),
        "mlp_linear": spec.mlp_layer_a * n,
    }


def step_features(spec: ModelSpec, prefills, decodes) -> dict:
    """The calibration features of one step (module docstring); ``prefills`` as ``(start, end)``
    or ``(request, start, end)``, ``decodes`` as contexts or ``(request, context)``."""
    pre = [(int(p[-2]), int(p[-1])) for p in prefills]
    ctx = [int(d[-1]) if isinstance(d, (tuple, list)) else int(d) for d in decodes]
    out = {}
    tp = dict.fromkeys(TERMS, 0.0)
    for a, b in pre:
        for k, v in term_flops(spec, a, b).items():
            tp[k] += v
    td = dict.fromkeys(TERMS, 0.0)
    for c in ctx:
        for k, v in term_flops(spec, c, c + 1).items():
            td[k] += v
    for t in TERMS:
        out[f"tflop_{t}"] = tp[t] * 1e-12
    for t in TERMS:
        out[f"decode_tflop_{t}"] = td[t] * 1e-12
    for kind in LAYER_KINDS:
        out[f"work_tflop_{kind}"] = sum((tp[t] + td[t]) * 1e-12 for t in TERMS if KIND_OF_TERM[t] == kind)
    out.update(
        n_seqs=len(pre) + len(ctx),
        n_prefill_seqs=len(pre),
        n_decode=len(ctx),
        prefill_tokens=sum(b - a for a, b in pre),
        context_sum=sum(ctx),
        gdn_chunks=sum(gdn_chunks(a, b) for a, b in pre) + len(ctx),
    )
    return out


def modelled_step_ms(spec: ModelSpec, timing, counts, prefills, contexts) -> float:
    """Modelled time of one step on the replayed layers ``counts``: ``step_time_s`` of the
    replayed model; the one-rate ``TimingModel``'s per-call overhead and decode read shared by
    mixer layer (as ``measure.modelled_ms`` shares its overhead)."""
    rspec = replayed_spec(spec, counts)
    pre = [(int(a), int(b)) for a, b in prefills]
    ctx = [int(c) for c in contexts]
    if isinstance(timing, HardwareTiming):
        return timing.step_time_s(rspec, pre, ctx) * 1e3
    share = mixing_layers(rspec) / max(1, mixing_layers(spec))  # a Mamba2 model's n_mamba too
    flops = rspec.decode_flops(len(ctx), sum(ctx)) if ctx else 0.0
    flops += sum(rspec.prefill_flops(a, b) for a, b in pre)
    ms = flops * 1e3 / (timing.effective_tflops * 1e12) + (timing.overhead_ms * share if pre else 0.0)
    return max(ms, timing.decode_ms_per_token * share) if ctx else ms


def _segments(prefills, decodes) -> list:
    return [(int(a), int(b)) for _, a, b in prefills] + [(int(c), int(c) + 1) for _, c in decodes]


def step_table(steps, spec: ModelSpec, timing, counts) -> pd.DataFrame:
    """One row per executed step (``ExecutedStep``): what it ran, measured and modelled ms over
    the replayed layers (per layer type too), the executed FLOPs of the replayed layers and the
    calibration features."""
    rows = []
    for s in steps:
        contexts = [c for _, c in s.decodes]
        row = dict(
            event=s.event,
            index=s.index,
            steps_in_event=s.steps_in_event,
            t=s.t,
            tokens=sum(b - a for _, a, b in s.prefills) + len(s.decodes),
            prefills=[list(p) for p in s.prefills],
            decodes=[list(d) for d in s.decodes],
            measured_ms=s.measured_ms,
            host_ms=s.host_ms,
            host_bound=host_bound(s.slack_ms),
        )
        for k in LAYER_KINDS + ("other",):
            row[f"measured_ms_{k}"] = s.ms_by_type.get(k, float("nan")) if s.ms_by_type else float("nan")
        row["modelled_ms"] = modelled_step_ms(spec, timing, counts, [(a, b) for _, a, b in s.prefills], contexts)
        row["replay_flops"] = replayed_flops(spec, counts, _segments(s.prefills, s.decodes))
        row.update(step_features(spec, s.prefills, s.decodes))
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df["error"] = (df["modelled_ms"] - df["measured_ms"]) / df["measured_ms"]
    return df


def with_model(table: pd.DataFrame, spec: ModelSpec, timing, counts) -> pd.DataFrame:
    """``table`` with ``modelled_ms`` and ``error`` recomputed for ``timing`` (a copy)."""
    df = table.copy()
    if not len(df):
        return df
    df["modelled_ms"] = [
        modelled_step_ms(spec, timing, counts, [(a, b) for _, a, b in p], [c for _, c in d])
        for p, d in zip(df["prefills"], df["decodes"])
    ]
    df["error"] = (df["modelled_ms"] - df["measured_ms"]) / df["measured_ms"]
    return df


def error_stats(table: pd.DataFrame, device_bound: bool = True) -> dict:
    """Median and P95 of the absolute relative step-time error (timed steps; ``device_bound``:
    without the steps whose measured time holds host gaps, ``host_bound``)."""
    if device_bound:
        table = table[~held_up(table, "host_bound")]
    e = table["error"].abs().replace([np.inf, -np.inf], np.nan).dropna() if len(table) else pd.Series([], dtype=float)
    if e.empty:
        return dict(median=float("nan"), p95=float("nan"))
    return dict(median=float(e.median()), p95=float(e.quantile(0.95)))


def _pcts(x: pd.Series) -> dict:
    x = x.astype(float).dropna()
    if x.empty:
        return dict(p50=float("nan"), p95=float("nan"), max=float("nan"))
    return dict(p50=float(x.quantile(0.5)), p95=float(x.quantile(0.95)), max=float(x.max()))


def step_summary(table: pd.DataFrame, *, counts: dict, wall_s: float, peak_tflops: float = 0.0, **extra) -> dict:
    """The summary keys of the step executor: ``steps_executed``, ``step_time_error`` (median /
    P95), ``step_measured_ms`` / ``step_modelled_ms`` percentiles, the measured time by layer
    type, executed TFLOP/s of the replayed layers over the timed steps and over the wall time and
    the former's share of the device's peak (0 when unknown); ``extra`` (the executor's counts)
    is added as is."""
    n = len(table)
    t = float(table["measured_ms"].sum()) if n else 0.0
    flops = float(table["replay_flops"].sum()) if n else 0.0
    tf = flops / (t * 1e-3) / 1e12 if t > 0 else float("nan")
    out = dict(
        steps_executed=int(n),
        step_time_error=error_stats(table),
        step_time_error_all=error_stats(table, device_bound=False),
        steps_host_bound=int(held_up(table, "host_bound").sum()),
        step_measured_ms=_pcts(table["measured_ms"]) if n else _pcts(pd.Series([], dtype=float)),
        step_modelled_ms=_pcts(table["modelled_ms"]) if n else _pcts(pd.Series([], dtype=float)),
        step_measured_ms_total=t,
        step_modelled_ms_total=float(table["modelled_ms"].sum()) if n else 0.0,
        step_measured_ms_by_layer_type={
            k: float(table[f"measured_ms_{k}"].sum()) if n else 0.0 for k in LAYER_KINDS + ("other",)
        },
        step_tokens_executed=int(table["tokens"].sum()) if n else 0,
        step_flops_executed=flops,
        step_tflops_timed=tf,
        step_tflops_wall=flops / wall_s / 1e12 if wall_s > 0 else float("nan"),
        step_peak_share=tf / peak_tflops if peak_tflops > 0 and tf == tf else 0.0,
        step_layers_replayed=dict(counts),
    )
    out.update(extra)
    return out


__all__ = [
    "ExecutedStep",
    "error_stats",
    "modelled_step_ms",
    "step_features",
    "step_summary",
    "step_table",
    "term_flops",
    "with_model",
]


# ---- calibration of the per-sequence term ------------------------------------------------------

#: the share of a run's executed steps (the first, in event order) the per-sequence time is fitted
#: on; the rest are held out to measure the error
STEP_FIT_FRACTION = 0.5


def seq_fittable(timing) -> bool:
    """Whether ``fit_seq_ms`` can fit ``timing``'s per-sequence times: a hardware timing in the
    additive form without per-GB terms (one preset's, as ``marconi replay --calibrate`` fits it)."""
    return (
        isinstance(timing, HardwareTiming)
        and timing.layer_form == "additive"
        and not any(v for d in (timing.ms_per_weight_gb, timing.ms_per_act_gb) for v in d.values())
        and not timing.ms_per_kv_gb
    )


def fit_seq_ms(table: pd.DataFrame, spec: ModelSpec, timing: HardwareTiming, counts) -> dict:
    """The per-sequence time of each layer kind (``HardwareTiming.seq_ms``) that best explains the
    measured per-type step times of ``table`` beyond ``timing``'s other terms: per kind, the
    residual ``measured / layers - (call + FLOP terms)`` regressed on ``n_seqs - 1`` through the
    origin, weighted for relative error, clipped at 0; host-bound steps left out. The residual is
    the additive form without shape terms: a one-preset timing as ``marconi replay --calibrate``
    fits it (a timing in the overlap form, or with per-GB terms, is refused: its step would be
    mispriced here)."""
    if not seq_fittable(timing):
        raise ValueError("fit_seq_ms fits a one-preset additive timing (no per-GB terms, layer_form 'additive')")
    out = dict.fromkeys(LAYER_KINDS, 0.0)
    table = table[~held_up(table, "host_bound")]  # their times hold host gaps
    if not len(table):
        return out
    c = timing.ms_per_tflop
    x = table["n_seqs"].to_numpy(dtype=float) - 1.0
    for kind in LAYER_KINDS:
        n = counts.get(kind, 0) if isinstance(counts, dict) else 0
        col = f"measured_ms_{kind}"
        if not n or col not in table:
            continue
        meas = table[col].to_numpy(dtype=float) / n
        work = sum(
            c[t] * (table[f"tflop_{t}"].to_numpy(dtype=float) + table[f"decode_tflop_{t}"].to_numpy(dtype=float))
            for t in TERMS
            if KIND_OF_TERM[t] == kind
        ) / max(1, timing.gpus)
        resid = meas - (timing.layer_call_ms[kind] + work)
        ok = np.isfinite(meas) & (meas > 0) & (x > 0)
        if not ok.any():
            continue
        w = 1.0 / meas[ok] ** 2
        out[kind] = max(0.0, float(np.sum(w * x[ok] * resid[ok]) / np.sum(w * x[ok] ** 2)))
    return out


def calibrate_steps(table: pd.DataFrame, spec: ModelSpec, timing: HardwareTiming, counts, fit_fraction=None):
    """``timing`` with its per-sequence times fitted on the first ``fit_fraction`` of the executed
    steps (event order), and the info: step-time error on the held-out rest with and without the
    fitted term (``median_error`` / ``p95_error``, ``before_median_error`` / ...), rows of each part."""
    frac = STEP_FIT_FRACTION if fit_fraction is None else float(fit_fraction)
    if not isinstance(timing, HardwareTiming):
        raise ValueError("the per-sequence step time is a term of the hardware timing model")
    order = table.sort_values(["event", "index"], kind="stable")
    cut = int(round(len(order) * frac))
    fit, held = order.iloc[:cut], order.iloc[cut:]
    seq = fit_seq_ms(fit, spec, timing, counts)
    fitted = replace(timing, seq_ms=seq)
    before = error_stats(with_model(held, spec, timing, counts))
    after = error_stats(with_model(held, spec, fitted, counts))
    info = dict(
        seq_ms=seq,
        fit_steps=int(len(fit)),
        held_out_steps=int(len(held)),
        median_error=after["median"],
        p95_error=after["p95"],
        before_median_error=before["median"],
        before_p95_error=before["p95"],
    )
    return fitted, info
