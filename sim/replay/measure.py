"""Replay measurements (no torch): the per-request table, the summary, the time-model error and
the ``--calibrate`` fit with its timing file.

Modelled vs measured time compares like with like: the replay executes ``L`` gated-delta layers,
so the modelled time of a request is the timing model applied to those layers' FLOPs, with the
per-call overhead shared by layer (``overhead_ms * L / layers of the model``). A calibrated
timing file goes the other way: the fitted overhead of the L replayed layers is scaled to the
model's layer count and the fitted throughput is taken for every layer (attention and MLP layers
are not executed: that they run at the linear layers' throughput is an assumption).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost import ModelSpec, TimingModel
from sim.errors import UsageError
from sim.replay.flops import model_flops, segments_flops

TIMING_FORMAT = "marconi-timing/1"


def mixing_layers(spec: ModelSpec) -> int:
    """Layers of the model that each carry a block (attention, gated-delta or Mamba)."""
    return spec.n_attn + spec.n_gdn + spec.n_mamba


def replayed_spec(spec: ModelSpec, layers: int) -> ModelSpec:
    """The cost model of what replay executes: ``layers`` gated-delta layers and nothing else."""
    return replace(spec, n_attn=0, n_mlp=0, n_mamba=0, n_gdn=layers)


def modelled_ms(spec: ModelSpec, timing: TimingModel, layers: int, hit: int, n: int) -> float:
    share = layers / max(1, mixing_layers(spec))
    return timing.overhead_ms * share + replayed_spec(spec, layers).prefill_flops(hit, n) * 1e3 / (
        timing.effective_tflops * 1e12)


def request_table(records, spec: ModelSpec, timing: TimingModel, layers: int) -> pd.DataFrame:
    """One row per request: what the simulator claimed, what replay executed and measured."""
    rows = []
    rspec = replayed_spec(spec, layers)
    for r in records:
        n, hit = r.input_tokens, r.hit_tokens if r.restored else 0
        sim_hit = r.hit_tokens
        rows.append(dict(
            request=r.request, input_tokens=n, output_tokens=r.output_tokens,
            hit_checkpoint=r.hit_checkpoint, hit_tokens=sim_hit, restored=r.restored,
            validated=r.validated, failed=r.failed, max_rec_error=r.max_rec_error,
            max_conv_error=r.max_conv_error, max_out_error=r.max_out_error,
            kernel_calls=len(r.suffix_segments), late_admits=r.late_admits,
            suffix_ms=r.suffix_ms, full_ms=r.full_ms, tail_ms=r.tail_ms,
            replay_flops=segments_flops(spec, r.suffix_segments, layers),
            replay_full_flops=segments_flops(spec, [(0, n)], layers),
            replay_flops_simulated=rspec.prefill_flops(hit, n),
            executed_flops=model_flops(spec, r.suffix_segments, layers),
            executed_full_flops=model_flops(spec, [(0, n)], layers),
            simulated_flops=spec.prefill_flops(sim_hit, n),
            simulated_full_flops=spec.flops(n),
            modelled_ms=modelled_ms(spec, timing, layers, hit, n),
            modelled_full_ms=modelled_ms(spec, timing, layers, 0, n),
        ))
    df = pd.DataFrame(rows)
    if len(df):
        df["model_error"] = (df["modelled_ms"] - df["suffix_ms"]) / df["suffix_ms"]
    return df


def error_stats(df: pd.DataFrame, column: str = "model_error") -> tuple[float, float]:
    """Median and P95 of the absolute relative error (timed requests only)."""
    e = df[column].abs().replace([np.inf, -np.inf], np.nan).dropna() if len(df) else pd.Series([])
    if e.empty:
        return float("nan"), float("nan")
    return float(e.median()), float(e.quantile(0.95))


def summary(df: pd.DataFrame, *, failures: int, store_peak_bytes: int, wall_s: float,
            late_admits: int = 0) -> dict:
    hits = df[df["hit_tokens"] > 0] if len(df) else df
    val = df[df["validated"]] if len(df) else df
    paired = val[val["full_ms"].notna() & val["suffix_ms"].notna()]
    measured_full = df[df["full_ms"].notna()] if len(df) else df
    med, p95 = error_stats(df)
    worst = float(val[["max_rec_error", "max_conv_error", "max_out_error"]].to_numpy().max()) \
        if len(val) else 0.0
    tokens = int(df["input_tokens"].sum()) if len(df) else 0
    return dict(
        requests=int(len(df)),
        input_tokens=tokens,
        hits=int(len(hits)),
        hit_tokens=int(hits["hit_tokens"].sum()) if len(hits) else 0,
        hits_validated=int(len(val)),
        failures=int(failures),
        max_restore_error=worst,
        max_rec_error=float(val["max_rec_error"].max()) if len(val) else 0.0,
        max_conv_error=float(val["max_conv_error"].max()) if len(val) else 0.0,
        max_out_error=float(val["max_out_error"].max()) if len(val) else 0.0,
        measured_ms_with_cache=float(df["suffix_ms"].sum()) if len(df) else 0.0,
        measured_ms_without_cache=float(measured_full["full_ms"].sum()) if len(df) else 0.0,
        requests_full_measured=int(len(measured_full)),
        measured_ms_saved_validated=float((paired["full_ms"] - paired["suffix_ms"]).sum()),
        modelled_ms_saved_validated=float((paired["modelled_full_ms"] - paired["modelled_ms"]).sum()),
        measured_flops_saved=float((df["executed_full_flops"] - df["executed_flops"]).sum()) if len(df) else 0.0,
        simulated_flops_saved=float((df["simulated_full_flops"] - df["simulated_flops"]).sum()) if len(df) else 0.0,
        replay_flops_executed=float(df["replay_flops"].sum()) if len(df) else 0.0,
        replay_flops_simulated=float(df["replay_flops_simulated"].sum()) if len(df) else 0.0,
        time_model_median_error=med,
        time_model_p95_error=p95,
        store_peak_bytes=int(store_peak_bytes),
        late_admits=int(late_admits),
        wall_s=float(wall_s),
        tokens_per_s=tokens / wall_s if wall_s > 0 else float("nan"),
    )


# ---- calibration ------------------------------------------------------------------------------

def fit_linear(flops: np.ndarray, ms: np.ndarray) -> tuple[float, float]:
    """Fit ``ms = overhead + flops / throughput`` minimising the squared *relative* residuals
    (rows weighted by 1 / measured ms, so short requests count as much as long ones);
    returns ``(overhead_ms, tflops)``. The overhead is kept >= 0."""
    flops = np.asarray(flops, dtype=float)
    ms = np.asarray(ms, dtype=float)
    ok = np.isfinite(ms) & (ms > 0) & np.isfinite(flops)
    flops, ms = flops[ok], ms[ok]
    if len(ms) < 2 or np.ptp(flops) == 0:
        raise UsageError("calibration needs at least two timed requests of different sizes")
    w = 1.0 / ms
    A = np.stack([w, flops * w], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(ms), rcond=None)
    if a < 0 or b <= 0:   # refit through the origin for the throughput alone
        a = 0.0
        b = float(np.sum(flops * w * 1.0) / np.sum((flops * w) ** 2))
    return float(a), float(1.0 / b / 1e9)   # b: ms per FLOP -> TFLOP/s = 1e-9 / b


def calibrate(df: pd.DataFrame, spec: ModelSpec, base: TimingModel, layers: int,
              device: str = "") -> tuple[TimingModel, dict]:
    """A timing model for the whole preset fitted to the measured suffix prefills. The fit's
    x is the cost model's FLOPs of each request (not the executed ones, which include chunk
    padding): the simulator will apply the timing to its own FLOPs."""
    timed = df[df["suffix_ms"].notna() & (df["suffix_ms"] > 0)]
    a, tflops = fit_linear(timed["replay_flops_simulated"].to_numpy(), timed["suffix_ms"].to_numpy())
    overhead_model = a * mixing_layers(spec) / layers
    t = TimingModel(tflops, overhead_model, base.decode_ms_per_token,
                    source=f"marconi replay --calibrate ({layers} {spec.name} gated-delta layers"
                           f"{' on ' + device if device else ''}, {len(timed)} requests)")
    fitted = timed["replay_flops_simulated"] * 1e3 / (tflops * 1e12) + a
    err = ((fitted - timed["suffix_ms"]) / timed["suffix_ms"]).abs()
    info = dict(overhead_ms_replayed=a, tflops=tflops, requests=int(len(timed)),
                median_error=float(err.median()), p95_error=float(err.quantile(0.95)))
    return t, info


def write_timing(path, timing: TimingModel, spec: ModelSpec, info: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_name(f".tmp-{Path(path).name}")  # renamed when complete: never a truncated file
    tmp.write_text(json.dumps(dict(
        format=TIMING_FORMAT, model=spec.name, effective_tflops=timing.effective_tflops,
        overhead_ms=timing.overhead_ms, decode_ms_per_token=timing.decode_ms_per_token,
        source=timing.source, fit=info), indent=2) + "\n")
    tmp.replace(path)


def read_timing(path, model: str | None = None) -> TimingModel:
    """A timing file written by ``marconi replay --calibrate`` (bad input, or a file fitted for
    another model than ``model``: UsageError)."""
    try:
        d = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read timing file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"timing file {path} is not JSON: {exc}") from None
    if not isinstance(d, dict) or d.get("format") != TIMING_FORMAT:
        raise UsageError(f"timing file {path} is not a {TIMING_FORMAT} file "
                         "(write one with marconi replay --calibrate FILE)")
    if model is not None and d.get("model") != model:
        raise UsageError(f"timing file {path} was calibrated for {d.get('model')}, not {model}")
    values = {}
    for key, lowest in (("effective_tflops", None), ("overhead_ms", 0.0), ("decode_ms_per_token", 0.0)):
        try:
            v = d[key]
            if isinstance(v, bool):
                raise TypeError
            values[key] = float(v)
        except (KeyError, TypeError, ValueError, OverflowError):
            raise UsageError(f"timing file {path}: missing or bad field {key!r}") from None
        # NaN, Infinity and "nan" read as floats: refused, as are a zero throughput and negative times
        ok = 0 < values[key] < math.inf if lowest is None else lowest <= values[key] < math.inf
        if not ok:
            need = "a finite number > 0" if lowest is None else "a finite number >= 0"
            raise UsageError(f"timing file {path}: {key} must be {need}, not {v!r}")
    return TimingModel(values["effective_tflops"], values["overhead_ms"], values["decode_ms_per_token"],
                       source=str(d.get("source", path)))
