"""One timing for a device and dtype, fitted across the shapes of several presets.

``marconi replay --calibrate`` fits the hardware model to one run, so to one preset's widths: its
``layer_call_ms`` then holds that preset's weight reads, and its FLOP rates that preset's GEMM
shapes. Carried to a preset of other widths (a MoE of hidden size 2048, a 27B of 5120) such a fit
was 37-68 % off (H200, 2026-12-04). ``fit_across`` fits the same terms to the replays of several
presets at once, with two terms that scale with the shape, so the fit carries:

* ``ms_per_weight_gb[kind]``: each call of a layer reads its weights once (``sim.cost.weight_gb``);
* ``ms_per_act_gb[kind]``: per token, the activations its products write (``sim.cost.act_gb``).

Per layer kind, one non-negative least-squares fit of relative residuals over every timed
one-call prefill of every run (the calls whose measured time holds host gaps left out), the
features ``[1, weight GB, FLOP terms in TFLOP..., activation GB]``; a FLOP term the free
fit puts above the device's peak is held at the peak and the rest refitted. The file records the
device, the dtype, the versions, the models and the widths and lengths it covered
(``HardwareTiming.covers``), so a run outside them says so.

The host term (``HardwareTiming.host_ms_per_call`` / ``host_ms_per_layer``, ``fit_host``) comes
from the host issue times recorded beside the same calls (``suffix_host_ms``): per depth the
median, then a line over the depths (layer calls per call), the calls whose host waited for the
GPU left out. ``request_errors`` prices a host-bound call with the later of its device and host
times (``sim.replay.measure.call_model_ms``).

The "overlap" form (``form="overlap"``, ``HardwareTiming.layer_form``) prices a layer as its fixed
time, the larger of its weights read and its per-token terms (linear FLOPs, activations: the
projections' GEMMs stream the weights while they compute), then its core (attention's quadratic
FLOPs and keys and values read, the gated-delta chunk term: kernels of their own after the
projections). Its fit (``fit_overlap``) alternates: mark each call weight-bound or compute-bound
under the current terms, fit the terms by bounded least squares with the other regime's columns
zeroed, until the marking repeats; the iterate of least true (max-form) residual is kept. The
additive form priced 512-4K-token calls 1.07-1.14x on clean H100 rows while long calls came out
right (docs/replay-cost-model.md).

``benchmarks/timing_fit.py`` runs it on the folders of ``benchmarks/timing_campaign.sh``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from sim.cost import (
    LAYER_FORMS,
    LAYER_KINDS,
    HardwareTiming,
    ModelSpec,
    default_timing,
    gdn_chunks,
    act_gb,
    attn_run_b,
    kv_read_gb_per_layer_token,
    weight_gb,
)
from sim.errors import UsageError
from sim.gpus import catalogue_name
from sim.replay.measure import (
    SAVED_DRAWS,
    TYPE_TERMS,
    held_up,
    calibrate as measure_calibrate,
    call_model_ms,
    fit_host_depths,
    host_issue_times,
    nnls,
    replayed_spec,
    saved_interval,
    timed_calls,
)

#: fewest timed calls of a kind per term before a fit is attempted
MIN_CALLS_PER_TERM = 3
#: the resumed-call term (``fit_resume``) is fitted on resumed gated-delta calls of at least this
#: many kernel chunks: below, a call's fixed time, not its chunks, sets its residual
RESUME_MIN_CHUNKS = 16


@dataclass(frozen=True)
class Run:
    """One replay's measurements: its preset, the layers it replayed by kind, its request table
    (``requests.parquet``) and a name for the report."""

    spec: ModelSpec
    counts: dict
    table: pd.DataFrame
    name: str = ""
    weight: float = 1.0  # of each of its calls in the fit


def features(spec: ModelSpec, kind: str, p: int, L: int, form: str = "additive") -> list[float]:
    """Per layer of ``kind``, the fit's columns for one call prefilling tokens ``[p, L)``: a
    constant, the weights read (GB), each FLOP term (TFLOP) and, for attention, the context's
    keys and values read (GB). The "overlap" form's attention core is what the causal kernel runs
    (``sim.cost.attn_run_b``) and its keys and values are read at the query heads too, as the
    replay's SDPA path copies them (``HardwareTiming.kv_query_heads``)."""
    n = L - p
    w = weight_gb(spec)[kind]
    act = act_gb(spec)[kind] * n  # activations its products write
    if kind == "attention":
        overlap = form == "overlap"
        lin = spec.attn_layer_a * n * 1e-12
        quad = (attn_run_b(spec) if overlap else spec.attn_layer_b) * (L * L - p * p) * 1e-12
        kv = kv_read_gb_per_layer_token(spec, overlap) * L if n > 1 else 0.0
        return [1.0, w, lin, quad, act, kv]
    if kind == "gated_delta":
        chunk = spec.linear_chunk_flops * gdn_chunks(p, L)
        return [1.0, w, spec.linear_layer_a * n * 1e-12, chunk * 1e-12, act]
    return [1.0, w, spec.mlp_layer_a * n * 1e-12, act]


#: per kind, the columns of ``features`` that are per-token terms (the overlap form's max with the
#: weights read, column 1) and those of the core (added after it)
PER_TOKEN_COLUMNS = {"attention": [2, 4], "gated_delta": [2, 4], "mlp": [2, 3]}
CORE_COLUMNS = {"attention": [3, 5], "gated_delta": [3], "mlp": []}
#: the overlap fit's alternations at most, and its seeded restarts around the additive fit
OVERLAP_ITERATIONS = 100
OVERLAP_STARTS = 8


def calls_of(run: Run, kind: str, form: str = "additive") -> tuple[np.ndarray, np.ndarray, list]:
    """The one-call prefills of ``run`` with ``kind`` layers: features (of ``form``), measured ms
    per layer and ``(p, L)`` of each."""
    k = run.counts.get(kind, 0)
    X, y, where = [], [], []
    if not k:
        return np.zeros((0, 0)), np.zeros(0), where
    for segs, by in timed_calls(run.table):
        v = by.get(kind)
        if len(segs) != 1 or v is None or not np.isfinite(v) or v <= 0:
            continue
        p, L = int(segs[0][0]), int(segs[0][1])
        X.append(features(run.spec, kind, p, L, form))
        y.append(v / k)
        where.append((p, L))
    return np.asarray(X, float), np.asarray(y, float), where


def overlap_predict(X: np.ndarray, c: np.ndarray, kind: str) -> np.ndarray:
    """The overlap form's per-layer ms of calls with ``features`` ``X`` under terms ``c``: the
    constant, the larger of the weights read and the per-token terms, then the core."""
    lin, core = PER_TOKEN_COLUMNS[kind], CORE_COLUMNS[kind]
    out = c[0] + np.maximum(c[1] * X[:, 1], X[:, lin] @ c[lin])
    return out + X[:, core] @ c[core] if core else out


def fit_overlap(X: np.ndarray, y: np.ndarray, kind: str, lo: np.ndarray, start: np.ndarray, weight=None, seed=0):
    """The overlap form's terms for ``kind`` (``overlap_predict``) by relative-residual least
    squares, each term at least ``lo`` (FLOP terms no faster than the peak, the weights no faster
    than the bandwidth, the rest non-negative): from ``start`` (the additive fit) and
    ``OVERLAP_STARTS`` seeded starts around it, alternate marking each call weight-bound
    (weights read >= per-token terms) or compute-bound and solving the bounded least squares with
    the other regime's columns zeroed, until a marking repeats; the iterate of least true
    residual. Returns ``(terms, cost)``."""
    lin = PER_TOKEN_COLUMNS[kind]
    s = (1.0 if weight is None else np.sqrt(weight)) / y
    rng = np.random.default_rng(seed)
    starts = [np.maximum(start, lo)]
    starts += [np.maximum(start * np.exp(rng.normal(0.0, 0.5, len(start))), lo) for _ in range(OVERLAP_STARTS)]
    best, best_cost = None, np.inf
    for c in starts:
        seen: set = set()
        for _ in range(OVERLAP_ITERATIONS):
            bound = c[1] * X[:, 1] >= X[:, lin] @ c[lin]
            key = bound.tobytes()
            if key in seen:
                break
            seen.add(key)
            Z = X.copy()
            Z[np.ix_(bound, lin)] = 0.0  # weight-bound calls: the weights read, not the per-token terms
            Z[~bound, 1] = 0.0  # compute-bound calls: the per-token terms, not the weights read
            c = lo + nnls(Z * s[:, None], (y - Z @ lo) * s)
            cost = float(np.sum(((overlap_predict(X, c, kind) - y) * s) ** 2))
            if cost < best_cost:
                best, best_cost = c.copy(), cost
    return best, best_cost


def _fit_columns(X: np.ndarray, y: np.ndarray, caps: dict, weight=None) -> np.ndarray:
    """Relative-residual NNLS of ``y ~ X c``; each column ``j`` in ``caps`` (a FLOP term in ms per
    TFLOP, the weights read in ms per GB) held at ``caps[j]`` or slower (the device's peak, its
    memory bandwidth) where the free fit is faster, the rest refitted around them."""
    w = (1.0 if weight is None else np.sqrt(weight)) / y
    ones = y * w
    c = nnls(X * w[:, None], ones)
    caps = {j: v for j, v in caps.items() if v > 0}
    held = {j for j, v in caps.items() if 0 < c[j] < v}
    while held:
        lo = np.zeros(X.shape[1])
        for j in held:
            lo[j] = caps[j]
        free = [j for j in range(X.shape[1]) if j not in held]
        sub = nnls((X[:, free] * w[:, None]), ones - (X @ lo) * w)
        c = lo.copy()
        c[free] = sub
        more = {j for j, v in caps.items() if j not in held and 0 < c[j] < v}
        if not more:
            break
        held |= more
    return c


def resume_extras(run: Run, timing: HardwareTiming) -> np.ndarray:
    """Per validated hit of ``run`` whose suffix ran as one call from its restored state over at
    least ``RESUME_MIN_CHUNKS`` kernel chunks, the suffix's extra gated-delta time per chunk and
    layer over the same request's from-scratch reference (timed in the same run): the suffix's
    per-layer time less the layer's fixed time (``timing.layer_fixed_ms``) less the reference's
    per-chunk time (its time less the fixed time, over its chunks) times the suffix's chunks. A
    difference of two measurements of the same prompt: the rest of the model does not enter it.
    In the overlap form a call's fixed part is its fixed time and whatever of the weights read its
    per-token terms do not hide (``call + max(read, per-token) - per-token``: a compute-bound call
    hides the whole read); in the additive form that is ``layer_fixed_ms``. Calls whose measured
    time holds host gaps are left out."""
    k = run.counts.get("gated_delta", 0)
    t = run.table
    need = ("suffix_ms_gated_delta", "full_ms_gated_delta", "validated", "restored")
    if not k or not run.spec.n_gdn or not len(t) or any(c not in t for c in need):
        return np.zeros(0)
    rspec = replayed_spec(run.spec, run.counts)

    def fixed(p: int, L: int) -> float:  # the layer's priced time less its FLOP terms, in the timing's own form
        work, core = timing.work_parts(rspec, p, L, gdn_chunks(p, L))
        k = "gated_delta"
        return timing.layer_times(rspec, work, 1, core)[k] - work[k] - core[k]

    one = t["kernel_calls"] == 1 if "kernel_calls" in t else True
    ok = t["validated"].astype(bool) & t["restored"].astype(bool) & one & ~held_up(t) & ~held_up(t, "full_host_bound")
    out = []
    for row in t[ok].itertuples(index=False):
        p, L = int(row.hit_tokens), int(row.input_tokens)
        c, c0 = gdn_chunks(p, L), gdn_chunks(0, L)
        s, f = row.suffix_ms_gated_delta / k, row.full_ms_gated_delta / k
        if p <= 0 or c < RESUME_MIN_CHUNKS or not (np.isfinite(s) and np.isfinite(f)):
            continue
        out.append((s - fixed(p, L) - (f - fixed(0, L)) * c / c0) / c)
    return np.asarray(out, float)


def fit_resume(runs: list[Run], timing: HardwareTiming) -> tuple[float, dict]:
    """``HardwareTiming.gdn_resume_ms_per_chunk`` from ``runs``: the median, over their resumed
    calls, of the extra per chunk each pays over its own from-scratch reference
    (``resume_extras``), never negative; 0 where the runs hold none. Fitted apart from the
    other terms, from pairs: the fit traces' resumed calls are few beside their from-scratch
    ones, and a free column in the main fit trades the per-chunk term against them."""
    e = np.concatenate([resume_extras(r, timing) for r in runs] or [np.zeros(0)])
    if not len(e):
        return 0.0, dict(pairs=0)
    held = max(0.0, float(np.median(e)))
    return held, dict(pairs=int(len(e)), median=held, q25=float(np.quantile(e, 0.25)), q75=float(np.quantile(e, 0.75)))


def calibrate_run(df: pd.DataFrame, spec: ModelSpec, base, counts, **options) -> tuple[HardwareTiming, dict]:
    """``marconi replay --calibrate``'s fit of one replay's request table: ``measure.calibrate``,
    then, for a gated-delta model whose run holds resumed suffix / reference pairs, the resumed-call
    term (``fit_resume`` on that first fit) and the fit again around it, as ``fit_across(...,
    resume=True)`` fits the committed file; ``info["resume"]`` says what it found."""
    t, info = measure_calibrate(df, spec, base, counts, **options)
    if not spec.n_gdn:
        return t, info
    held, found = fit_resume([Run(spec, counts, df, "calibrate")], t)
    if held > 0:
        t, info = measure_calibrate(df, spec, base, counts, resume_ms_per_chunk=held, **options)
    info["resume"] = found
    return t, info


def host_calls(run: Run) -> tuple[int, np.ndarray]:
    """The layer calls of one call of ``run`` (every replayed layer of every kind) and the host
    issue times of its one-call timed prefills whose host did not wait for the GPU
    (``sim.replay.measure.host_issue_times``)."""
    return sum(run.counts.values()), host_issue_times(run.table)


def fit_host(runs: list[Run]) -> tuple[float, float, dict]:
    """The host term of ``runs`` (``sim.replay.measure.fit_host_depths`` over their host issue
    times, grouped by the layer calls of a call)."""
    by: dict[int, list] = {}
    for r in runs:
        n, host = host_calls(r)
        by.setdefault(n, []).extend(host.tolist())
    return fit_host_depths(by)


def fit_across(
    runs: list[Run],
    base: HardwareTiming,
    *,
    peak_tflops: float = 0.0,
    device: str = "",
    dtype: str = "",
    source: str = "",
    resume: bool = False,
    bandwidth_tbs: float = 0.0,
    drop_resume: bool = False,
    form: str = "additive",
) -> tuple[HardwareTiming, dict]:
    """A HardwareTiming fitted to every run's timed prefills at once (module docstring); with
    ``resume``, the resumed-call term too: ``fit_resume`` on a first fit's layer times, then the
    gated-delta terms fitted again with each resumed call's term taken out of its time (the fixed
    time a short resumed call held is then not its own). What
    the runs cannot show is kept from ``base``: the per-sequence step times, decode and the call
    time where no run has one. Floors are 0: device-time measurements (each call queued behind a
    sleep) show the device's time, never the host's. ``form``: the layer form fitted
    (``sim.cost.LAYER_FORMS``; "overlap": ``fit_overlap`` from the additive fit's terms)."""
    if not runs:
        raise UsageError("timing fit: no runs given")
    if form not in LAYER_FORMS:
        raise UsageError(f"timing fit: form must be one of {', '.join(LAYER_FORMS)}, not {form!r}")
    cap = 1e3 / peak_tflops if peak_tflops > 0 else 0.0
    weight_cap = 1.0 / bandwidth_tbs if bandwidth_tbs > 0 else 0.0  # ms per GB at the datasheet's TB/s
    ms_per_tflop = dict(base.ms_per_tflop)
    layer_ms, per_gb = dict(base.layer_call_ms), dict.fromkeys(LAYER_KINDS, 0.0)
    act, kv = dict.fromkeys(LAYER_KINDS, 0.0), 0.0
    info: dict = {"terms": {}}
    held = 0.0
    if resume:  # the term from pairs (a first fit's fixed times), then the gated-delta terms fitted around it
        first, _ = fit_across(
            runs, base, peak_tflops=peak_tflops, device=device, dtype=dtype, source=source,
            bandwidth_tbs=bandwidth_tbs, form=form,
        )  # fmt: skip
        held, info["resume"] = fit_resume(runs, first)
    for kind in LAYER_KINDS:
        terms = TYPE_TERMS[kind]
        parts = [calls_of(r, kind, form) for r in runs]
        if kind == "gated_delta" and held:
            parts = [
                (X, y - held * np.array([gdn_chunks(p, L) if p > 0 else 0 for p, L in wh], float), wh)
                for X, y, wh in parts
            ]
        Xs = [X for X, y, _ in parts if len(y)]
        if not Xs:
            continue
        X = np.concatenate(Xs)
        y = np.concatenate([y for _, y, _ in parts if len(y)])
        wt = np.concatenate([np.full(len(y), r.weight) for r, (_, y, _) in zip(runs, parts) if len(y)])
        if len(y) < MIN_CALLS_PER_TERM * (len(terms) + 2):
            raise UsageError(f"timing fit: {len(y)} timed calls with {kind} layers are too few")
        caps = dict.fromkeys(range(2, 2 + len(terms)), cap)
        caps[1] = weight_cap  # a call reads its layer's weights no faster than the memory's bandwidth
        c = _fit_columns(X, y, caps, wt)
        if form == "overlap":  # from the additive fit's terms, each held within the same bounds
            lo = np.zeros(X.shape[1])
            for j, v in caps.items():
                lo[j] = v
            c, _ = fit_overlap(X, y, kind, lo, c, wt)
        layer_ms[kind], per_gb[kind] = float(c[0]), float(c[1])
        for j, t in enumerate(terms, start=2):
            ms_per_tflop[t] = float(c[j])
        act[kind] = float(c[2 + len(terms)])
        if kind == "attention":
            kv = float(c[3 + len(terms)])
        err = np.abs((overlap_predict(X, c, kind) if form == "overlap" else X @ c) - y) / y
        info["terms"][kind] = dict(
            calls=int(len(y)), median_error=float(np.median(err)), p95_error=float(np.quantile(err, 0.95))
        )
    other = []
    for r in runs:
        for segs, by in timed_calls(r.table):
            v = by.get("other", float("nan"))
            if np.isfinite(v):
                other.append(v / len(segs))
    covers = dict(
        models=sorted({r.spec.name for r in runs}),
        d_model=[min(r.spec.d_model for r in runs), max(r.spec.d_model for r in runs)],
        max_tokens=int(max(int(r.table["input_tokens"].max()) for r in runs if len(r.table))),
    )
    # ``drop_resume``: the runs' resumed calls carried an extra the kernels no longer have (the
    # conv's state read, fixed in e855240): it is taken out of them for the fit, not priced
    resume_ms = 0.0 if drop_resume else held
    if resume and drop_resume:
        info["resume"]["dropped"] = True
    host_call, host_layer, info["host"] = fit_host(runs)
    if info["host"]["depths"]:
        covers["host_layer_calls"] = [min(info["host"]["depths"]), max(info["host"]["depths"])]
    t = replace(
        base,
        ms_per_tflop=ms_per_tflop,
        layer_call_ms=layer_ms,
        ms_per_weight_gb=per_gb,
        ms_per_act_gb=act,
        ms_per_kv_gb=kv,
        call_ms=float(np.median(other)) if other else base.call_ms,
        layer_floor_ms=dict.fromkeys(LAYER_KINDS, 0.0),
        peak_tflops=peak_tflops or base.peak_tflops,
        gpus=1,
        source=source or base.source,
        device=device or base.device,
        dtype=dtype or base.dtype,
        covers=covers,
        uncalibrated=False,
        host_ms_per_call=host_call,
        host_ms_per_layer=host_layer,
        gdn_resume_ms_per_chunk=resume_ms,
        layer_form=form,
        kv_query_heads=form == "overlap",
    )
    info["form"] = form
    info["fraction_of_peak"] = t.fraction_of_peak()
    info["runs"] = [r.name for r in runs]
    return t, info


def request_errors(run: Run, timing: HardwareTiming) -> pd.DataFrame:
    """Per timed request of ``run``: measured and modelled prefill ms on the replayed layers and
    the relative error (every request with a measured time; ``host_bound`` marks those whose
    measured time holds host gaps)."""
    rspec = replayed_spec(run.spec, run.counts)
    rows = []
    for row in run.table.itertuples(index=False):
        d = row._asdict()
        ms = d.get("suffix_ms")
        if ms is None or not np.isfinite(ms) or ms <= 0:
            continue
        hit = int(d["hit_tokens"]) if d["restored"] else 0
        n = int(d["input_tokens"])
        model = timing.prefill_time_s(rspec, hit, n, int(d["splits"])) * 1e3
        held = bool(d.get("suffix_host_bound", False))
        priced = call_model_ms(timing, rspec, model, int(d["splits"]), held, float(d.get("suffix_sleep_ms", 0.0)))
        full = d.get("full_ms", float("nan"))
        rows.append(
            dict(
                run=run.name,
                model=run.spec.name,
                hit=hit,
                tokens=n,
                measured_ms=float(ms),
                modelled_ms=model,
                # a host-bound call against the later of its device and host issue times
                # (measure.call_model_ms; its device time where the timing has no host term)
                modelled_call_ms=priced,
                error=(priced - ms) / ms,
                host_bound=held,
                # a validated hit's from-scratch reference: the time the hit saved, both ways
                saved_ms=float(full) - float(ms) if d.get("validated") and np.isfinite(full) else float("nan"),
                modelled_saved_ms=(timing.prefill_time_s(rspec, 0, n) * 1e3 - model)
                if d.get("validated") and np.isfinite(full)
                else float("nan"),
            )
        )
    return pd.DataFrame(rows)


def saved_error(errors: pd.DataFrame, seed: int = 0, draws: int = SAVED_DRAWS) -> tuple[float, float, float]:
    """The time saved's error over the validated hits of ``request_errors``' frame (modelled over
    measured, minus 1) and its ``SAVED_LEVEL`` bootstrap interval (``measure.saved_interval``): how
    far the measurement itself pins the figure. NaNs where no hit saved a measured positive total."""
    if not len(errors):  # request_errors' frame of a run without timed requests has no columns
        return (float("nan"),) * 3
    h = errors[np.isfinite(errors["saved_ms"])]
    return saved_interval(h["saved_ms"].to_numpy(float), h["modelled_saved_ms"].to_numpy(float), seed, draws)


#: how a time-model note that replaces the error lines starts (the comparison means nothing)
NOT_COMPARED = "not compared"


def replay_timing(
    timing,
    spec: ModelSpec,
    dtype: str,
    device_kind: str,
    device_name: str = "",
    max_tokens: int = 0,
    layer_calls: int = 0,
    attention: str = "sdpa",
    elementwise: str = "torch",
):
    """The timing a replay compares its measurements with, and one line on how far to trust the
    comparison (empty when the timing describes this run): ``timing`` given (``--timing``) or the
    preset's default, at one GPU (replay runs the whole model on one device). On a catalogue GPU
    the default is the one ``marconi run --gpu`` prices that GPU with: its committed calibration,
    else the home device's scaled by the datasheets, compared and said ("uncalibrated for GPU
    h100: ..."). Refused: the default timing fitted in another dtype than the replay's on a GPU (a
    ``--timing`` file is the user's choice, said in the line). Not compared: a CPU (but a
    ``--timing`` file that names no GPU, as one calibrated on a CPU), a ``--timing`` file fitted
    on another GPU, or a GPU the catalogue does not know. A timing fitted with another
    ``attention`` backend or ``elementwise`` ops than the replay's is said in the line."""
    explicit = timing is not None
    t = timing if explicit else default_timing(spec.name)
    home = getattr(t, "device", "")
    here = catalogue_name(device_name) if device_kind == "cuda" else ""
    if not explicit and home and here not in ("", home):
        t = default_timing(spec.name, gpu=here, tensor_parallel=1)
    if isinstance(t, HardwareTiming) and t.gpus != 1:
        t = replace(t, gpus=1, comm_ms_per_call=0.0, comm_ms_per_token=0.0)
    fitted = getattr(t, "device", "")
    if device_kind != "cuda":
        if explicit and not fitted:  # a file calibrated here, on a CPU (it names no GPU): compared
            t_dtype = getattr(t, "dtype", "")
            return t, (
                f"the timing was fitted in {t_dtype}, this replay runs {dtype}" if t_dtype not in ("", dtype) else ""
            )
        return t, f"{NOT_COMPARED}: the timing describes {fitted or 'a GPU'}, this replay runs on the CPU"
    if fitted and here != fitted:
        return t, (
            f"{NOT_COMPARED}: the timing was fitted on {fitted}, this GPU is {here or device_name} "
            "(fit one here: --calibrate FILE, then --timing FILE)"
        )
    notes = []
    if t.uncalibrated:
        notes.append(
            f"uncalibrated for GPU {t.device}: the {home} calibration scaled by the datasheets "
            "(fit one here: --calibrate FILE, then --timing FILE)"
        )
    t_dtype = getattr(t, "dtype", "")
    if t_dtype and t_dtype != dtype:
        if not explicit:
            raise UsageError(
                f"the default timing was fitted in {t_dtype}: a --dtype {dtype} replay's time-model "
                f"errors would compare across dtypes; give --timing FILE fitted in {dtype} "
                f"(marconi replay --dtype {dtype} --calibrate FILE)"
            )
        notes.append(f"the timing was fitted in {t_dtype}, this replay runs {dtype}")
    if isinstance(t, HardwareTiming) and t.attention != attention:
        notes.append(f"the timing was fitted with {t.attention} attention, this replay runs {attention}")
    if isinstance(t, HardwareTiming) and t.elementwise != elementwise:
        notes.append(
            f"the timing was fitted with {t.elementwise} norms and activations, this replay runs {elementwise}"
        )
    if isinstance(t, HardwareTiming):
        cover = t.coverage_note(spec, max_tokens, layer_calls)
        if cover:
            notes.append(cover)
    return t, "; ".join(notes)
