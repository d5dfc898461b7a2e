"""Replay measurements (no torch): the per-request table, the summary, the time-model error and
the ``--calibrate`` fit with its timing file.

Replay executes ``counts`` layers of each type (``layers_replayed``: the preset's full depth by
default, or an even subsample per type with ``--layers``). Modelled vs measured compares like with
like: the modelled time of a request is the timing model applied to the replayed layers (a
``HardwareTiming`` prices each type and each call; the one-rate ``TimingModel`` its overhead
shared by mixer layer). Measured times are also scaled to the whole model, type by type
(``measured_model_ms``).

``--calibrate`` fits a ``HardwareTiming`` to the per-layer-type times of every timed call (the
suffix prefills and the from-scratch reference prefills of validated hits): per type, time of one
layer = per-call time + FLOP terms, a non-negative least-squares fit of relative residuals. With
the device's peak known, no FLOP term may run above it: a fit whose data put a term that matters
above 100 % of peak is refused; a term the data cannot resolve is pinned at the peak.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.gpus import GPUS, catalogue_name
from sim.cost import (
    LAYER_KINDS,
    MODELS,
    HardwareTiming,
    ModelSpec,
    gdn_chunks,
    read_timing_file,
    spec_fields,
    timing_to_dict,
)
from sim.errors import UsageError
from sim.replay.records import CHECK
from sim.replay.flops import mamba2_linear, model_flops, padding_flops, replayed_flops

#: a queued call whose last kernel ended less than this after the host finished issuing it had
#: the GPU waiting for the host at its end (``sim.replay.clock.Stopwatch.slack_ms``): its device
#: time holds host gaps, so it is flagged host-bound and kept out of the time model's statistics
HOST_BOUND_MARGIN_MS = 0.5


#: a timed call whose host time reaches this waited for the GPU inside the call (a
#: synchronisation waits for the GPU sleep queued ahead of it, at most 50 ms:
#: ``sim.replay.clock.QUEUE_CAP_MS``; a full launch queue blocks the same way): its host time holds
#: the sleep, not the host's issue, and is left out of the host term's fit (the steady issue of
#: the 2026-12-04 campaign's calls: 5-10 ms at 8 layer calls, 21-30 ms at 64)
HOST_WAITED_MS = 40.0


def outran_sleep(host_ms: float, sleep_ms: float) -> bool:
    """A queued call whose host issue took longer than the GPU sleep queued ahead of it
    (``sleep_ms`` asked, > 0: ``sim.replay.clock.SleepRate`` runs a sleep at least that long): the
    GPU may have run out of queued work inside the call, so its device time may hold host gaps.
    Its host's steady issue is covered by a sleep sized from the kind's recent issue times
    (``sim.replay.clock.SleepWindows``), so such a call paid something its peers did not: a
    synchronisation inside the call (it then waits for the sleep itself: host time at the sleep
    and over, ``HOST_WAITED_MS``) or a host pause. The replay runs it again (``Replayer._run``:
    re-timed) and keeps the second time. Decided on the host, no device sync; never for an
    unqueued call (``sleep_ms`` 0) or NaN."""
    return bool(sleep_ms > 0 and host_ms == host_ms and host_ms > sleep_ms)


#: a timed call with more device time than this outside every layer's mark (``stalled_outside``)
STALL_MS = 20.0
#: ... and more than this share of its whole time there
STALL_SHARE = 0.5


def stalled_outside(call_ms: float, marked_ms: float) -> bool:
    """A timed call whose device time outside its layers' marks (``call_ms`` less the marks' sum
    ``marked_ms``, the hit check's bucket included) is over ``STALL_MS`` and over ``STALL_SHARE`` of
    the call: the GPU stalled on something that is not the model's work, which its host issue does
    not show (``outran_sleep`` misses it). On session 30's H100 matrix rows (5,760 timed calls of
    1-870 ms) the time outside the marks was at most 2.6 ms and 10 % of a call but once: a reference of
    7,238 tokens took 288.6 ms, 275 ms of it outside its layers, with a host issue of 5.1 ms under
    its 7.6 ms sleep, and moved its row's time saved by 84 points. The replay runs such a call
    again, as an outrun one (``HitChecker.validate``, ``Replayer._run``). NaN: False."""
    gap = call_ms - marked_ms
    return bool(gap == gap and gap > STALL_MS and gap > STALL_SHARE * call_ms)


def host_bound(slack_ms: float) -> bool:
    """A queued call's device time holds host gaps (``slack_ms`` below ``HOST_BOUND_MARGIN_MS``;
    never for NaN: unqueued calls and the CPU)."""
    return bool(slack_ms == slack_ms and slack_ms < HOST_BOUND_MARGIN_MS)


def held_up(table: pd.DataFrame, column: str = "suffix_host_bound") -> pd.Series:
    """The rows of ``table`` flagged host-bound in ``column`` (``suffix_host_bound`` for requests,
    ``host_bound`` for steps); none where the table predates the flag."""
    if column in table:
        return table[column].astype(bool)
    return pd.Series(False, index=table.index)


# dense peak TFLOP/s by (device name fragment, dtype): the datasheets (H100 / H200 SXM bf16 989,
# fp32 67; A100 312 / 19.5); an unknown device has no peak (no bound on the fit)
PEAKS = {
    ("H200", "bf16"): 989.0,
    ("H100", "bf16"): 989.0,
    ("H200", "fp16"): 989.0,
    ("H100", "fp16"): 989.0,
    ("H200", "fp32"): 67.0,
    ("H100", "fp32"): 67.0,
    ("A100", "bf16"): 312.0,
    ("A100", "fp16"): 312.0,
    ("A100", "fp32"): 19.5,
}
#: a FLOP term whose share of its layer type's modelled time is below this may be pinned at the
#: peak when the data would put it above; above it the fit is refused
MATTERS = 0.05
#: ... unless holding it at the peak costs the fit less than this much RMS relative residual
PIN_SLACK = 0.01
#: calls of at most this many tokens time the host floor (their device work is far below it)
SHORT_CALL = 64
MIN_SHORT = 10
#: calls this far above the floor are device-bound: they alone fit the device terms
ABOVE_FLOOR = 1.25
#: a layer's projection term that must be pinned (its data cannot separate it from a collinear
#: partner) is held at the rate the fit measured for the same kind of work: the projections are
#: bf16 GEMMs of the hidden size, like the MLP's, so the MLP's GEMM rate; the peak only where
#: that does not fit. The MLP is fitted first for this.
GEMM_TWIN = {"gdn_linear": "mlp_linear", "attn_linear": "mlp_linear"}
FIT_ORDER = ("mlp", "attention", "gated_delta")

TYPE_TERMS = {
    "attention": ("attn_linear", "attn_quadratic"),
    "gated_delta": ("gdn_linear", "gdn_chunk"),
    "mlp": ("mlp_linear",),
}


def device_peak(device_name: str, dtype: str) -> float:
    """The device's dense tensor peak in ``dtype`` (TFLOP/s; 0: not known): the catalogue's bf16 /
    fp16 figure where torch's name maps to an entry (an H100 NVL's 835, not the SXM's 989, which
    the name fragment "H100" gave it), else ``PEAKS`` by name fragment."""
    entry = GPUS.get(catalogue_name(str(device_name or "")))
    if entry is not None and dtype in ("bf16", "fp16"):
        return entry.bf16_tflops
    for (frag, dt), peak in PEAKS.items():
        if frag in (device_name or "") and dt == dtype:
            return peak
    return 0.0


def mixing_layers(spec: ModelSpec) -> int:
    """Layers of the model that each carry a block (attention, gated-delta or Mamba)."""
    return spec.n_attn + spec.n_gdn + spec.n_mamba


def model_counts(spec: ModelSpec) -> dict:
    """The model's layers by the replayed types (a Mamba2 model's linear layers in the
    gated-delta slot, where replay runs them)."""
    linear = spec.n_mamba if mamba2_linear(spec) else spec.n_gdn
    return {"attention": spec.n_attn, "gated_delta": linear, "mlp": spec.n_mlp}


def replayed_spec(spec: ModelSpec, counts) -> ModelSpec:
    """The cost model of what replay executes: ``counts`` layers by type (an int: that many
    gated-delta layers alone)."""
    if isinstance(counts, int):
        counts = {"attention": 0, "gated_delta": counts, "mlp": 0}
    if mamba2_linear(spec):  # the linear layers are Mamba2 layers
        return replace(spec, n_attn=counts["attention"], n_mlp=counts["mlp"], n_mamba=counts["gated_delta"], n_gdn=0)
    return replace(spec, n_attn=counts["attention"], n_mlp=counts["mlp"], n_mamba=0, n_gdn=counts["gated_delta"])


def replayed_weight_bytes(spec: ModelSpec, counts, dtype_bytes: int = 2) -> float:
    """Bytes of the weight matrices of the replayed layers (each read once by every call)."""
    r = replayed_spec(spec, counts)
    # a Mamba2 model's linear layers are n_mamba (sim.cost.weight_gb's per-layer weights)
    params = (
        r.n_attn * r.attn_layer_a + r.n_gdn * r.gdn_layer_a + r.n_mamba * r.mamba_layer_a + r.n_mlp * r.mlp_layer_a
    ) / 2
    return params * dtype_bytes


def roofline_ms(flops, weight_bytes: float, flops_per_s: float, bytes_per_s: float) -> np.ndarray:
    """The least time each call can take on a device: its FLOPs at the device's matrix-product
    ceiling or its weight reads at its copy ceiling, whichever is longer. A lower bound: KV and
    activation traffic and every kernel's fixed cost are left out."""
    return np.maximum(np.asarray(flops, dtype=float) / flops_per_s, weight_bytes / bytes_per_s) * 1e3


def modelled_ms(spec: ModelSpec, timing, counts, hit: int, n: int, splits: int = 0) -> float:
    """Modelled prefill time of tokens [hit, n) on the replayed layers."""
    rspec = replayed_spec(spec, counts)
    if isinstance(timing, HardwareTiming):
        return timing.prefill_time_s(rspec, hit, n, splits) * 1e3
    share = mixing_layers(rspec) / max(1, mixing_layers(spec))  # a Mamba2 model's n_mamba too
    return timing.overhead_ms * share + rspec.prefill_flops(hit, n) * 1e3 / (timing.effective_tflops * 1e12)


def call_model_ms(timing, rspec: ModelSpec, device_ms: float, splits: int, held: bool, sleep_ms: float = 0.0) -> float:
    """What a timed prefill's measured time is compared with: its modelled device time
    (``device_ms``, on the replayed layers ``rspec``), or for a host-bound call (``held``: the GPU
    ran out of queued work and ended just after the host's last launch) the later of that and
    the host's issue of its ``1 + splits`` calls less the GPU sleep queued ahead of it
    (``sleep_ms``: the measured time starts when the sleep ends, so the sleep hid that much of the
    issue; 0 or NaN: none), where the timing has a host term (``HardwareTiming.host_issue_ms``)."""
    if held and isinstance(timing, HardwareTiming) and timing.has_host_term:
        hidden = sleep_ms if sleep_ms == sleep_ms and sleep_ms > 0 else 0.0
        return max(device_ms, timing.host_issue_ms(rspec, 1 + splits) - hidden)
    return device_ms


def host_issue_times(table: pd.DataFrame) -> np.ndarray:
    """The host issue times (ms) of the one-call timed prefills of a request table whose host did
    not wait for the GPU (``HOST_WAITED_MS``): what the host term is fitted to."""
    if "suffix_host_ms" not in table or not len(table):
        return np.zeros(0)
    host = table["suffix_host_ms"].to_numpy(float)
    one = table["kernel_calls"].to_numpy() == 1 if "kernel_calls" in table else np.ones(len(table), bool)
    timed = table["suffix_ms"].notna().to_numpy()
    return host[one & timed & np.isfinite(host) & (host > 0) & (host < HOST_WAITED_MS)]


def fit_host_depths(by_depth: dict) -> tuple[float, float, dict]:
    """The host term ``(host_ms_per_call, host_ms_per_layer, info)`` from host issue times by
    depth (``{layer calls per call: [times, ...]}``): per depth the median (robust to the host's
    noise), then the line through the depths' medians weighted by their calls, never negative;
    with one depth all of it per layer call (a call's fixed host time cannot be told apart
    there); none: (0, 0)."""
    by = {int(n): np.asarray(v, float) for n, v in by_depth.items() if n > 0 and len(v)}
    if not by:
        return 0.0, 0.0, dict(depths={})
    depth = np.array(sorted(by), float)
    med = np.array([float(np.median(by[int(d)])) for d in depth])
    w = np.array([float(len(by[int(d)])) for d in depth])
    if len(depth) == 1:
        call, layer = 0.0, float(med[0] / depth[0])
    else:
        sw = np.sqrt(w)
        call, layer = np.linalg.lstsq(np.c_[np.ones_like(depth), depth] * sw[:, None], med * sw, rcond=None)[0]
        if layer < 0:  # the host's time does not grow with depth: one time per call
            call, layer = float(np.average(med, weights=w)), 0.0
        elif call < 0:  # through the origin
            call, layer = 0.0, float(np.sum(w * med * depth) / np.sum(w * depth * depth))
    info = dict(depths={int(d): dict(calls=int(c), median_ms=float(m)) for d, c, m in zip(depth, w, med)})
    return float(call), float(layer), info


def _scale(spec: ModelSpec, counts) -> dict:
    full = model_counts(spec)
    return {k: (full[k] / counts[k] if counts.get(k) else 0.0) for k in LAYER_KINDS}


ERROR_COLUMNS = ("max_rec_error", "max_conv_error", "max_out_error", "max_kv_error")


def request_table(records, spec: ModelSpec, timing, counts, shadow=None) -> pd.DataFrame:
    """One row per request: what the simulator claimed, what replay executed and measured
    (per layer type too); ``shadow``: the fp32 shadow replay's records (``--validate shadow``),
    whose errors become ``shadow_*`` columns."""
    if isinstance(counts, int):
        counts = {"attention": 0, "gated_delta": counts, "mlp": 0}
    shadow_of = {r.request: r for r in shadow} if shadow is not None else None
    rows = []
    rspec = replayed_spec(spec, counts)
    scale = _scale(spec, counts)
    for r in records:
        n, hit = r.input_tokens, r.hit_tokens if r.restored else 0
        sim_hit = r.hit_tokens
        splits = max(0, len(r.suffix_segments) - 1)
        row = dict(
            request=r.request,
            input_tokens=n,
            output_tokens=r.output_tokens,
            hit_checkpoint=r.hit_checkpoint,
            hit_tokens=sim_hit,
            restored=r.restored,
            validated=r.validated,
            kv_validated=r.kv_validated,
            failed=r.failed,
            max_rec_error=r.max_rec_error,
            max_conv_error=r.max_conv_error,
            max_out_error=r.max_out_error,
            max_kv_error=r.max_kv_error,
            kernel_calls=len(r.suffix_segments),
            splits=splits,
            late_admits=r.late_admits,
            segments=[list(x) for x in r.suffix_segments],
            suffix_ms=r.suffix_ms,
            full_ms=r.full_ms,
            tail_ms=r.tail_ms,
            suffix_host_ms=r.suffix_host_ms,
            suffix_host_bound=host_bound(r.suffix_slack_ms),
            full_host_bound=host_bound(r.full_slack_ms),
            full_host_ms=r.full_host_ms,
            # the call's end after the host's (Stopwatch.slack_ms; NaN unqueued): with the host and
            # measured times it gives how much of the host's issue the queued sleep covered
            suffix_slack_ms=r.suffix_slack_ms,
            full_slack_ms=r.full_slack_ms,
            # the GPU sleep asked ahead of the call (0 unqueued): the host issue it hid
            suffix_sleep_ms=r.suffix_sleep_ms,
            full_sleep_ms=r.full_sleep_ms,
            # its first call's host issue outran the sleep ahead of it (outran_sleep): run again,
            # the second time kept; the first call's device and host ms beside
            suffix_retimed=r.suffix_retimed,
            suffix_first_ms=r.suffix_first_ms,
            suffix_first_host_ms=r.suffix_first_host_ms,
            # the from-scratch reference likewise (HitChecker._retime_reference)
            full_retimed=r.full_retimed,
            full_first_ms=r.full_first_ms,
            full_first_host_ms=r.full_first_host_ms,
            # --saved-timing alternate: suffix, reference, reference, suffix; suffix_ms / full_ms
            # are each pair's mean, these the second calls' own
            alternated=r.alternated,
            suffix_again_ms=r.suffix_again_ms,
            full_again_ms=r.full_again_ms,
            replay_flops=replayed_flops(spec, counts, r.suffix_segments),
            replay_full_flops=replayed_flops(spec, counts, [(0, n)]),
            replay_flops_simulated=rspec.prefill_flops(hit, n),
            executed_flops=model_flops(spec, r.suffix_segments),
            executed_full_flops=model_flops(spec, [(0, n)]),
            # the part of executed - simulated that the kernel's 64-token chunks make
            executed_padding_flops=padding_flops(spec, r.suffix_segments),
            executed_full_padding_flops=padding_flops(spec, [(0, n)]),
            simulated_flops=spec.prefill_flops(sim_hit, n),
            simulated_full_flops=spec.flops(n),
            modelled_ms=modelled_ms(spec, timing, counts, hit, n, splits),
            modelled_full_ms=modelled_ms(spec, timing, counts, 0, n),
            modelled_host_ms=timing.host_issue_ms(rspec, 1 + splits)
            if isinstance(timing, HardwareTiming) and timing.has_host_term
            else float("nan"),
            integrity_checked=r.integrity_checked,
            output_groups=r.output_groups,
            unvalidated=r.unvalidated if sim_hit > 0 and not r.validated else "",
            lookups=r.lookups,
        )
        if shadow_of is not None:
            sh = shadow_of.get(r.request)
            row["shadow_validated"] = bool(sh is not None and sh.validated)
            row["shadow_failed"] = bool(sh is not None and sh.failed)
            for c in ERROR_COLUMNS:
                row["shadow_" + c] = getattr(sh, c) if sh is not None else float("nan")
        for which, by in (("suffix", r.suffix_ms_by_type), ("full", r.full_ms_by_type)):
            for k in LAYER_KINDS + ("other", CHECK):
                row[f"{which}_ms_{k}"] = by.get(k, float("nan")) if by else float("nan")
        row["measured_model_ms"] = (
            (sum(row[f"suffix_ms_{k}"] * scale[k] for k in LAYER_KINDS) + row["suffix_ms_other"])
            if r.suffix_ms_by_type
            else float("nan")
        )
        rows.append(row)
    if not rows:
        # no request replayed (an engine preset aborted every prompt at arrival: a capacity below
        # each): the columns without rows, so the summary's reads are of an empty table, not a
        # KeyError ('full_ms') from a frame without columns
        from sim.replay.records import RequestRecord  # noqa: PLC0415

        stub = request_table([RequestRecord(0, 1, 0)], spec, timing, counts, [] if shadow is not None else None)
        return stub.iloc[0:0]
    df = pd.DataFrame(rows)
    if len(df):
        # a host-bound prefill against the later of its device time and the host's issue time less
        # the sleep queued ahead of it (call_model_ms), where the timing has a host term; every
        # other one against its device time
        held = df["suffix_host_bound"] & df["modelled_host_ms"].notna()
        hidden = df["suffix_sleep_ms"].fillna(0.0).clip(lower=0.0)
        df["modelled_call_ms"] = df["modelled_ms"].where(
            ~held, np.maximum(df["modelled_ms"], df["modelled_host_ms"] - hidden)
        )
        df["model_error"] = (df["modelled_call_ms"] - df["suffix_ms"]) / df["suffix_ms"]
    return df


def error_stats(df: pd.DataFrame, column: str = "model_error", device_bound: bool = True) -> tuple[float, float]:
    """Median and P95 of the absolute relative error (timed requests only; ``device_bound``:
    without the prefills whose measured time holds host gaps, ``suffix_host_bound``)."""
    if device_bound:
        df = df[~held_up(df)]
    e = df[column].abs().replace([np.inf, -np.inf], np.nan).dropna() if len(df) else pd.Series([])
    if e.empty:
        return float("nan"), float("nan")
    return float(e.median()), float(e.quantile(0.95))


def _quantiles(x: pd.Series) -> dict:
    x = x.astype(float)
    return dict(p50=float(x.quantile(0.5)), p95=float(x.quantile(0.95)), max=float(x.max()))


#: bootstrap draws of ``saved_interval``, and the share of them its interval spans
SAVED_DRAWS = 2000
SAVED_LEVEL = 0.95
#: resampled hit indices ``saved_interval`` holds at once (a run of 100K validated hits would take
#: 2000 x 100K at once)
SAVED_BLOCK = 1 << 20


def _saved_fields(paired: pd.DataFrame) -> list | None:
    """``[error, low, high]`` of ``saved_interval`` over the paired hits; None where not finite."""
    if not len(paired):
        return None
    got = saved_interval(
        (paired["full_ms"] - paired["suffix_ms"]).to_numpy(float),
        (paired["modelled_full_ms"] - paired["modelled_ms"]).to_numpy(float),
    )
    return [float(x) for x in got] if all(np.isfinite(got)) else None


def saved_spread(paired: pd.DataFrame) -> float | None:
    """The measured time saved's standard error over the validated hits timed alternated
    (``--saved-timing alternate``): each such hit's saving is measured twice, by its first pair
    (suffix, then reference) and its second (reference, then suffix), and reported as their mean;
    half their difference is that mean's spread. Summed in quadrature over the hits, in ms; None
    where no hit was alternated. (A first call's time is twice the mean less its ``*_again_ms``.)
    On the Mooncake sample one 512-token hit on an 87,169-token prompt saved +3.5 ms by its first
    pair and +18.9 ms by its second, modelled 0.8 ms: the spread says what the sum cannot."""
    if not len(paired) or "alternated" not in paired:
        return None
    a = paired[paired["alternated"].fillna(False).astype(bool)]
    if not len(a):
        return None
    second = (a["full_again_ms"] - a["suffix_again_ms"]).to_numpy(float)
    first = 2 * (a["full_ms"] - a["suffix_ms"]).to_numpy(float) - second
    return float(np.sqrt(np.sum(((first - second) / 2) ** 2)))


def saved_interval(measured, modelled, seed: int = 0, draws: int = SAVED_DRAWS) -> tuple[float, float, float]:
    """The time saved's error over a run's validated hits (each hit's measured and modelled ms
    saved: modelled total over measured total, minus 1) and its ``SAVED_LEVEL`` bootstrap interval
    (``draws`` resamples of the hits with replacement, ``seed``): how far the measurement itself
    pins the figure. Where each hit saves a small part of a long call (a Mooncake block of 512
    tokens out of 80K), the two calls' run-to-run spread is many times the time saved and a few
    hits set the sum: the interval says so. NaNs where the hits saved no measured positive total."""
    measured, modelled = np.asarray(measured, float), np.asarray(modelled, float)
    if not len(measured) or measured.sum() <= 0:
        return (float("nan"),) * 3
    point = modelled.sum() / measured.sum() - 1
    rng, n = np.random.default_rng(seed), len(measured)
    # resamples a block at a time: at most SAVED_BLOCK indices held, whatever the hit count
    step = max(1, SAVED_BLOCK // n)
    ratio = np.empty(draws)
    for i in range(0, draws, step):
        pick = rng.integers(0, n, size=(min(step, draws - i), n))
        m = measured[pick].sum(axis=1)
        ratio[i : i + len(pick)] = np.where(m > 0, modelled[pick].sum(axis=1) / np.where(m > 0, m, 1.0) - 1, np.inf)
    lo, hi = np.quantile(ratio, [(1 - SAVED_LEVEL) / 2, (1 + SAVED_LEVEL) / 2])
    return float(point), float(lo), float(hi)


def summary(
    df: pd.DataFrame,
    *,
    failures,
    store_peak_bytes: int,
    wall_s: float,
    late_admits: int = 0,
    counts=None,
    spec: ModelSpec | None = None,
    kv_hits_validated: int = 0,
) -> dict:
    hits = df[df["hit_tokens"] > 0] if len(df) else df
    val = df[df["validated"]] if len(df) else df
    paired = val[val["full_ms"].notna() & val["suffix_ms"].notna()]
    measured_full = df[df["full_ms"].notna()] if len(df) else df
    # with a host term (the timing prices host-bound prefills: modelled_host_ms) the headline
    # error counts every timed prefill; without one the host-bound ones are left out (their time
    # holds host gaps the device model does not price) and counted
    host_term = bool(len(df)) and "modelled_host_ms" in df and bool(df["modelled_host_ms"].notna().any())
    med, p95 = error_stats(df, device_bound=not host_term)
    dev_med, dev_p95 = error_stats(df)
    worst = (
        float(val[["max_rec_error", "max_conv_error", "max_out_error", "max_kv_error"]].to_numpy().max())
        if len(val)
        else 0.0
    )
    tokens = int(df["input_tokens"].sum()) if len(df) else 0
    kinds = [getattr(f, "kind", "") for f in failures] if not isinstance(failures, int) else []
    n_fail = failures if isinstance(failures, int) else len(failures)
    out = dict(
        requests=int(len(df)),
        input_tokens=tokens,
        hits=int(len(hits)),
        hit_tokens=int(hits["hit_tokens"].sum()) if len(hits) else 0,
        hits_validated=int(len(val)),
        # per request, as hits and hits_validated (the checker's count is per lookup: a request
        # preempted and looked up again is checked again, its record is the last lookup's)
        kv_hits_validated=int(val["kv_validated"].sum()) if "kv_validated" in val else int(kv_hits_validated),
        failures=int(n_fail),
        kv_failures=int(sum(k.startswith("kv") for k in kinds)),
        max_restore_error=worst,
        max_rec_error=float(val["max_rec_error"].max()) if len(val) else 0.0,
        max_conv_error=float(val["max_conv_error"].max()) if len(val) else 0.0,
        max_out_error=float(val["max_out_error"].max()) if len(val) else 0.0,
        max_kv_error=float(val["max_kv_error"].max()) if len(val) else 0.0,
        measured_ms_with_cache=float(df["suffix_ms"].sum()) if len(df) else 0.0,
        measured_ms_without_cache=float(measured_full["full_ms"].sum()) if len(df) else 0.0,
        requests_full_measured=int(len(measured_full)),
        measured_ms_saved_validated=float((paired["full_ms"] - paired["suffix_ms"]).sum()),
        modelled_ms_saved_validated=float((paired["modelled_full_ms"] - paired["modelled_ms"]).sum()),
        # the saved's error (modelled / measured - 1) and its 95 % bootstrap interval over the hits
        time_saved_interval=_saved_fields(paired),
        time_saved_spread_ms=saved_spread(paired),
        measured_flops_saved=float((df["executed_full_flops"] - df["executed_flops"]).sum()) if len(df) else 0.0,
        simulated_flops_saved=float((df["simulated_full_flops"] - df["simulated_flops"]).sum()) if len(df) else 0.0,
        padding_flops_saved=float((df["executed_full_padding_flops"] - df["executed_padding_flops"]).sum())
        if len(df)
        else 0.0,
        replay_flops_executed=float(df["replay_flops"].sum()) if len(df) else 0.0,
        replay_flops_simulated=float(df["replay_flops_simulated"].sum()) if len(df) else 0.0,
        time_model_median_error=med,
        time_model_p95_error=p95,
        time_model_p95_error_all=error_stats(df, device_bound=False)[1],
        host_bound_prefills=int(held_up(df).sum()),
        retimed_prefills=int(df["suffix_retimed"].sum()) if len(df) and "suffix_retimed" in df else 0,
        retimed_references=int(df["full_retimed"].sum()) if len(df) and "full_retimed" in df else 0,
        time_model_host_term=host_term,
        time_model_median_error_device_bound=dev_med,
        time_model_p95_error_device_bound=dev_p95,
        store_peak_bytes=int(store_peak_bytes),
        late_admits=int(late_admits),
        wall_s=float(wall_s),
        tokens_per_s=tokens / wall_s if wall_s > 0 else float("nan"),
        splits=int(df["splits"].sum()) if len(df) else 0,
    )
    # every hit not validated, by reason (RequestRecord.unvalidated): hits = hits_validated + these
    why = (
        hits.loc[~hits["validated"], "unvalidated"] if len(hits) and "unvalidated" in hits else pd.Series([], dtype=str)
    )
    out["hits_unvalidated"] = {str(k): int(v) for k, v in why.replace("", "never checked").value_counts().items()}
    # every validated hit whose KV went unchecked, by reason: kv_hits_validated + these = hits_validated
    if len(val) and "kv_validated" in val:
        no_kv = int((~val["kv_validated"].astype(bool)).sum())
        no_attention = counts is not None and not dict(counts).get("attention", 0)
        reason = "no attention layer replayed" if no_attention else "never checked"
        out["kv_hits_unvalidated"] = {reason: no_kv} if no_kv else {}
    else:
        out["kv_hits_unvalidated"] = {}
    # the host's time to issue a timed prefill (Python, dispatch, launches): what a wall-clock
    # measurement of short calls sees instead of the device's work (sim.replay.clock.Stopwatch)
    host = df["suffix_host_ms"].dropna() if len(df) and "suffix_host_ms" in df else pd.Series([], dtype=float)
    out["host_issue_ms"] = _quantiles(host) if len(host) else {}
    # the per-hit error distribution (validated hits): p50 / p95 / max of each kind
    out["restore_errors"] = {c[4:-6]: _quantiles(val[c]) for c in ERROR_COLUMNS} if len(val) else {}
    if len(df) and "integrity_checked" in df:
        out["integrity_checked"] = int(df["integrity_checked"].sum())
        out["integrity_failures"] = int(sum(k.endswith("integrity") and not k.startswith("shadow") for k in kinds))
    if len(df) and "output_groups" in df:
        # checks whose suffix outputs did not fit HitChecker.output_bytes: compared in groups of layers
        out["outputs_grouped"] = int((df["output_groups"] > 1).sum())
    if len(df) and "shadow_validated" in df:
        sv = df[df["shadow_validated"]]
        out["shadow_hits_validated"] = int(len(sv))
        out["shadow_failures"] = int(sum(k.startswith("shadow") for k in kinds))
        out["shadow_restore_errors"] = (
            {c[4:-6]: _quantiles(sv["shadow_" + c]) for c in ERROR_COLUMNS} if len(sv) else {}
        )
    if counts is not None:
        out["layers_replayed"] = dict(counts)
        by = {k: float(df[f"suffix_ms_{k}"].sum()) if len(df) else 0.0 for k in LAYER_KINDS + ("other",)}
        # "other" holds what the layer marks leave out too (embedding, the gaps between a split
        # call's segments: ~0.2 ms a request on a CPU), so that the parts add to the total; a total
        # re-timed below its marks (measure.outran_sleep) keeps the marks' own
        rest = out["measured_ms_with_cache"] - sum(by[k] for k in LAYER_KINDS)
        by["other"] = max(by["other"], rest)
        out["measured_ms_by_layer_type"] = by
        if spec is not None:
            sc = _scale(spec, counts)
            out["measured_model_ms_by_layer_type"] = {k: by[k] * sc.get(k, 1.0) for k in by}
        # executed FLOPs of the replayed layers over the timed prefills' device time
        t = float(df["suffix_ms"].sum()) if len(df) else 0.0
        out["replay_tflops_timed"] = out["replay_flops_executed"] / (t * 1e-3) / 1e12 if t > 0 else float("nan")
        flops_all = (
            out["replay_flops_executed"]
            + float(df.loc[df["full_ms"].notna() & (df["hit_tokens"] > 0), "replay_full_flops"].sum())
            if len(df)
            else 0.0
        )
        out["replay_tflops_wall"] = flops_all / wall_s / 1e12 if wall_s > 0 else float("nan")
    return out


def batch_summary(calls, spec: ModelSpec, counts, *, wall_s: float, peak_tflops: float = 0.0, flushes=None) -> dict:
    """The summary keys of batched replay (``--batch`` > 1): per kind of timed call (``suffix``:
    queued requests from their restored states; ``reference``: the from-scratch prefills that
    check hits; ``single``: a request run alone) the calls, sequences, tokens, device time and
    executed TFLOP/s; over all of them the executed TFLOP/s of the timed calls and over the wall
    time, each as a share of the device's peak (0 when unknown). ``calls``: objects with
    ``kind``, ``segments`` [(start, end)], ``ms`` and ``slack_ms`` (``batched.BatchCall``)."""
    by: dict = {}
    flops_all = ms_all = 0.0
    host_bound_calls = 0
    for c in calls:
        d = by.setdefault(c.kind, dict(calls=0, sequences=0, tokens=0, ms=0.0, flops=0.0))
        f = replayed_flops(spec, counts, c.segments)
        d["calls"] += 1
        d["sequences"] += len(c.segments)
        d["tokens"] += int(sum(e - s for s, e in c.segments))
        d["ms"] += float(c.ms)
        d["flops"] += f
        flops_all += f
        ms_all += float(c.ms)
        host_bound_calls += bool(host_bound(c.slack_ms))
    for d in by.values():
        d["sequences_per_call"] = d["sequences"] / d["calls"]
        d["tokens_per_call"] = d["tokens"] / d["calls"]
        d["tflops"] = d["flops"] / (d["ms"] * 1e-3) / 1e12 if d["ms"] > 0 else float("nan")
        d["peak_share"] = d["tflops"] / peak_tflops if peak_tflops > 0 else 0.0
    timed = flops_all / (ms_all * 1e-3) / 1e12 if ms_all > 0 else float("nan")
    wall = flops_all / wall_s / 1e12 if wall_s > 0 else float("nan")
    return dict(
        batch_calls=by,
        batch_flushes=dict(flushes or {}),
        batch_calls_host_bound=int(host_bound_calls),
        replay_flops_timed_calls=flops_all,
        replay_tflops_timed=timed,
        replay_tflops_wall=wall,
        replay_peak_share_timed=timed / peak_tflops if peak_tflops > 0 and timed == timed else 0.0,
        replay_peak_share_wall=wall / peak_tflops if peak_tflops > 0 and wall == wall else 0.0,
    )


# ---- calibration ------------------------------------------------------------------------------


def nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares ``min ||A x - y||, x >= 0`` for a few columns: the best
    unconstrained solution over every subset of free columns (exact for the few terms here)."""
    k = A.shape[1]
    best, best_r = np.zeros(k), float(np.sum(y * y))
    for m in range(1, k + 1):
        for cols in itertools.combinations(range(k), m):
            sub = A[:, cols]
            x, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(x < 0):
                continue
            r = float(np.sum((sub @ x - y) ** 2))
            if r < best_r - 1e-15 * max(1.0, best_r):
                best, best_r = np.zeros(k), r
                best[list(cols)] = x
    return best


def fit_linear(flops: np.ndarray, ms: np.ndarray) -> tuple[float, float]:
    """Fit ``ms = overhead + flops / throughput`` minimising the squared *relative* residuals;
    returns ``(overhead_ms, tflops)`` (both non-negative)."""
    flops = np.asarray(flops, dtype=float)
    ms = np.asarray(ms, dtype=float)
    ok = np.isfinite(ms) & (ms > 0) & np.isfinite(flops)
    flops, ms = flops[ok], ms[ok]
    if len(ms) < 2 or np.ptp(flops) == 0:
        raise UsageError("calibration needs at least two timed requests of different sizes")
    w = 1.0 / ms
    a, b = nnls(np.stack([w, flops * w], axis=1), np.ones_like(ms))
    if b <= 0:
        raise UsageError("calibration: time does not grow with FLOPs in these measurements")
    return float(a), float(1.0 / b / 1e9)


def _features(spec: ModelSpec, kind: str, segments) -> list[float]:
    """Per-layer features of one timed call list of ``kind``: [calls, FLOPs of each term]."""
    calls = len(segments)
    if kind == "attention":
        lin = sum(spec.attn_layer_a * (e - s) for s, e in segments)
        quad = sum(spec.attn_layer_b * (e * e - s * s) for s, e in segments)
        return [calls, lin, quad]
    if kind == "gated_delta":  # a Mamba2 model's mixer in this slot: its per-token FLOPs, no chunk term
        lin = sum(spec.linear_layer_a * (e - s) for s, e in segments)
        chunk = sum(spec.linear_chunk_flops * gdn_chunks(s, e) for s, e in segments)
        return [calls, lin, chunk]
    return [calls, sum(spec.mlp_layer_a * (e - s) for s, e in segments)]


def timed_calls(df: pd.DataFrame) -> list[tuple[list, dict]]:
    """Every timed prefill of the table as ``(segments, {kind: ms over the replayed layers})``:
    the suffix prefills and the from-scratch references of validated hits, less those whose
    measured time holds host gaps (``*_host_bound``)."""
    out = []
    for row in df.itertuples(index=False):
        d = row._asdict()
        if not d.get("suffix_host_bound", False) and (
            np.isfinite(d["suffix_ms_mlp"])
            or np.isfinite(d["suffix_ms_gated_delta"])
            or np.isfinite(d["suffix_ms_attention"])
        ):
            segs = [tuple(x) for x in d["segments"]]
            if segs:
                out.append((segs, {k: d[f"suffix_ms_{k}"] for k in LAYER_KINDS + ("other",)}))
        if d["hit_tokens"] > 0 and d["validated"] and np.isfinite(d["full_ms_other"]) and not d.get("full_host_bound"):
            out.append(([(0, d["input_tokens"])], {k: d[f"full_ms_{k}"] for k in LAYER_KINDS + ("other",)}))
    return out


def _tokens(spec: ModelSpec, kind: str, X: np.ndarray) -> np.ndarray:
    """Tokens of each one-call row, from its linear-FLOPs feature."""
    per = {"attention": spec.attn_layer_a, "gated_delta": spec.linear_layer_a, "mlp": spec.mlp_layer_a}[kind]
    return X[:, 1] / per


def _rms(A: np.ndarray, b: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(np.mean((A @ x - b) ** 2)))


def _fit_kind(
    Xs: np.ndarray, y: np.ndarray, cap: float, terms, pin_at: dict | None = None
) -> tuple[np.ndarray, list, list]:
    """Relative-residual NNLS of ``y = call + sum(c_t x_t)`` (x in TFLOPs); with ``cap`` (ms per
    TFLOP at the peak) every term is held at or below the peak and the rest refitted. A term the
    free fit put above the peak is ``pinned`` where it does not matter (its share of the time is
    under ``MATTERS``) or where the data fit as well with it held (a collinear partner, such as the
    per-chunk term beside the per-token one, takes its time: the RMS relative residual grows by
    less than ``PIN_SLACK``); otherwise it is returned as ``bad``: the measurements need a term
    faster than the chip. ``pin_at``: the rate (ms per TFLOP, at least ``cap``) a term is held at
    when it must be pinned (a measured rate of the same kind of work), tried before the peak."""
    w = 1.0 / y
    A, b = Xs * w[:, None], np.ones_like(y)
    x = nnls(A, b)
    bad, pinned = [], []
    if cap:
        over = [t for j, t in enumerate(terms, start=1) if x[j] < cap]
        held = worse = None
        for at in ((pin_at or {}), {}):  # at the given rates first, then at the peak
            lo = np.array([0.0] + [max(cap, at.get(t, cap)) if t in over else cap for t in terms])
            held = lo + nnls(A, b - A @ lo)
            worse = _rms(A, b, held) - _rms(A, b, x)
            if worse < PIN_SLACK or not at:
                break
        for j, t in enumerate(terms, start=1):
            if x[j] < cap:
                share = float(np.median(cap * Xs[:, j] / y))
                if x[j] > 0 and share >= MATTERS and worse >= PIN_SLACK:
                    bad.append((t, 1e3 / x[j]))
                else:
                    pinned.append(t)
        x = held
    return x, bad, pinned


def fit_hardware(
    spec: ModelSpec,
    counts: dict,
    calls,
    *,
    peak_tflops: float = 0.0,
    decode_ms_per_token: float = 0.0,
    source: str = "",
) -> tuple[HardwareTiming, dict]:
    """Fit a HardwareTiming to timed calls ``[(segments, {kind: ms over counts[kind] layers})]``:
    per kind, the host floor ``h`` (a layer takes ``max(h, call + FLOP terms)``) chosen among
    the measured per-layer times' low quantiles (or none) to minimise the relative error, the
    rest by ``_fit_kind`` on the calls above the floor."""
    cap = 1e3 / peak_tflops if peak_tflops > 0 else 0.0  # ms per TFLOP at the peak
    # in the canonical order; filled in FIT_ORDER
    ms_per_tflop = {t: cap for k in LAYER_KINDS for t in TYPE_TERMS[k]}
    layer_ms, floor_ms = dict.fromkeys(LAYER_KINDS, 0.0), dict.fromkeys(LAYER_KINDS, 0.0)
    info = {"terms": {}, "pinned": []}
    for kind in FIT_ORDER:
        terms = TYPE_TERMS[kind]
        if not counts.get(kind):
            continue
        X, y = [], []
        for segs, by in calls:
            v = by.get(kind)
            # one-call prefills only: a split request's two calls are timed together, and the
            # floor applies per call
            if len(segs) == 1 and v is not None and np.isfinite(v) and v > 0:
                X.append(_features(spec, kind, segs))
                y.append(v / counts[kind])
        if len(y) < len(terms) + 1:
            raise UsageError(f"calibration needs at least {len(terms) + 1} timed calls with {kind} layers")
        X, y = np.asarray(X, float), np.asarray(y, float)
        Xs = X.copy()
        Xs[:, 1:] *= 1e-12  # FLOPs -> TFLOPs
        # the host floor: the median time of calls that compute next to nothing (at most
        # SHORT_CALL tokens), where it exists; the device terms from the calls clearly above it
        short = _tokens(spec, kind, X) <= SHORT_CALL
        cands = [0.0] + ([float(np.median(y[short]))] if short.sum() >= MIN_SHORT else [])
        pin_at = {t: ms_per_tflop[twin] for t, twin in GEMM_TWIN.items()}  # the twin is fitted first
        best = None
        for h in cands:
            sel = y > ABOVE_FLOOR * h if h > 0 else np.ones(len(y), bool)
            if sel.sum() < len(terms) + 1:
                continue
            x, bad, pinned = _fit_kind(Xs[sel], y[sel], cap, terms, pin_at)
            pred = np.maximum(h, Xs @ x)
            e = float(np.mean(((pred - y) / y) ** 2))
            if best is None or e < best[0] - 1e-15:
                best = (e, h, x, bad, pinned, pred)
        _, h, x, bad, pinned, pred = best
        if bad:
            t, rate = bad[0]
            raise UsageError(
                f"calibration refused: the measurements put {t} at {rate / peak_tflops:.0%} of the device's "
                f"{peak_tflops:g} TFLOP/s peak (over 100 % is not physical: check the timer and "
                "that the work was really executed)"
            )
        info["pinned"] += pinned
        layer_ms[kind], floor_ms[kind] = float(x[0]), h
        for j, t in enumerate(terms, start=1):
            ms_per_tflop[t] = float(x[j])
        err = np.abs(pred - y) / y
        info["terms"][kind] = dict(
            calls=int(len(y)),
            layer_call_ms=float(x[0]),
            layer_floor_ms=h,
            calls_above_floor=int((y > ABOVE_FLOOR * h).sum()) if h else int(len(y)),
            median_error=float(np.median(err)),
            p95_error=float(np.quantile(err, 0.95)),
        )
    other = [by.get("other", float("nan")) / len(segs) for segs, by in calls]
    other = [v for v in other if np.isfinite(v)]
    call_ms = float(np.median(other)) if other else 0.0
    info["terms"] = {k: info["terms"][k] for k in LAYER_KINDS if k in info["terms"]}  # canonical order
    t = HardwareTiming(
        ms_per_tflop, layer_ms, call_ms, decode_ms_per_token, peak_tflops, 1, source=source, layer_floor_ms=floor_ms
    )
    info["fraction_of_peak"] = t.fraction_of_peak()
    info["call_ms"] = call_ms
    return t, info


def calibrate(
    df: pd.DataFrame,
    spec: ModelSpec,
    base,
    counts,
    device: str = "",
    peak_tflops: float = 0.0,
    decode_ms_per_token: float | None = None,
    host: bool = False,
    resume_ms_per_chunk: float = 0.0,
):
    """A HardwareTiming for the whole preset fitted to the measured per-layer-type times; with
    ``host`` (timed on a GPU, queued: host issue times that are the host's), the host term from
    the calls' host issue times (``fit_host_depths``: one depth, so all of it per layer call);
    with ``resume_ms_per_chunk`` (``calibration.fit_resume``'s term), that term in the timing and
    taken out of each resumed one-call prefill's gated-delta time before the fit."""
    if isinstance(counts, int):
        counts = {"attention": 0, "gated_delta": counts, "mlp": 0}
    calls = timed_calls(df)
    if resume_ms_per_chunk:
        k = counts.get("gated_delta", 0)
        calls = [
            (segs, dict(by, gated_delta=by["gated_delta"] - resume_ms_per_chunk * gdn_chunks(*segs[0]) * k))
            if len(segs) == 1 and segs[0][0] > 0 and by.get("gated_delta") is not None
            else (segs, by)
            for segs, by in calls
        ]
    decode = base.decode_ms_per_token if decode_ms_per_token is None else decode_ms_per_token
    src = (
        f"marconi replay --calibrate ({', '.join(f'{v} {k}' for k, v in counts.items() if v)} layers of "
        f"{spec.name}{' on ' + device if device else ''}, {len(calls)} timed calls)"
    )
    t, info = fit_hardware(spec, counts, calls, peak_tflops=peak_tflops, decode_ms_per_token=decode, source=src)
    if host:
        call, layer, info["host"] = fit_host_depths({sum(counts.values()): host_issue_times(df)})
        t = replace(t, host_ms_per_call=call, host_ms_per_layer=layer)
    if resume_ms_per_chunk:
        t = replace(t, gdn_resume_ms_per_chunk=float(resume_ms_per_chunk))
    timed = df[df["suffix_ms"].notna() & (df["suffix_ms"] > 0) & ~held_up(df)]
    fitted = np.array(
        [
            modelled_ms(spec, t, counts, h if r else 0, n, s)
            for h, r, n, s in zip(timed["hit_tokens"], timed["restored"], timed["input_tokens"], timed["splits"])
        ]
    )
    err = np.abs(fitted - timed["suffix_ms"].to_numpy()) / timed["suffix_ms"].to_numpy()
    info.update(
        requests=int(len(timed)),
        calls=len(calls),
        median_error=float(np.median(err)) if len(err) else float("nan"),
        p95_error=float(np.quantile(err, 0.95)) if len(err) else float("nan"),
    )
    return t, info


def write_timing(path, timing, spec: ModelSpec, info: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_name(f".tmp-{Path(path).name}")  # renamed when complete: never a truncated file
    d = timing_to_dict(timing)
    device = catalogue_name(str(info.get("device", "")))  # the file records its device (sim/gpus.py)
    if device:
        d["device"] = device
    d["model"] = spec.name
    if spec.name.strip().lower() not in MODELS:  # a config.json's model: its shapes, not only its path as spelled
        d["model_spec"] = spec_fields(spec)
    tmp.write_text(json.dumps(dict(d, fit=info), indent=2, default=float) + "\n")
    tmp.replace(path)


def read_timing(path, model: str | None = None):
    """A timing file written by ``marconi replay --calibrate`` (see ``sim.cost.read_timing_file``)."""
    return read_timing_file(path, model=model)
