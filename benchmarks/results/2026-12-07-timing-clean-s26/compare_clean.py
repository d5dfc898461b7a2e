"""The H100 time model refitted with the replay's two measurement biases out (session 26, CPU only):
run from the repository root,

    .venv/bin/python benchmarks/results/2026-12-07-timing-clean-s26/compare_clean.py [VARIANT ...]

Scores the committed sim/data/h100-timing.json and each variant's fit on the 24 clean matrix rows
(2026-12-07-gpu-s26 callC/rowsC Mooncake, callE/rowsS ShareGPT: H100, both fixes) and on the
session-20 campaign (2026-12-06-gpu-s20 campaign + fulldepth): per run, per-request prefill error
median / P95 over all prefills and the time saved's error (benchmarks/timing_fit.py's ``after all``
and ``after saved`` columns). The fit set is chosen by symlinking every run into a scratch folder,
the fitted ones under a ``fit-`` name (timing_fit fits the runs whose folder name starts with the
prefix). Writes ``fit-<variant>.json`` (the fitted timing, as ``timing_fit --out``) and
``scores.csv`` here, prints the tables.

Variants:
  s20     the committed flow (s20 campaign fit* + fulldepth fit-fd*, --resume --drop-resume): a check
          that it gives the committed file back
  clean   (i) the clean rows only: all ShareGPT rows + the Mooncake rows of qwen3.5-9b,
          qwen3.5-35b-a3b, marconi-7b, nemotron-h-8b (--resume: the post-fix resumed-call term)
  mixed   (ii) s20's fit runs + the clean fit rows of (i) (--resume --drop-resume, as committed)
  s20noref  (iii) s20's fit runs with the hit references' calls left out of the fit (bias 1: the
          check timed inside the reference); --resume --drop-resume
  s20fix  (iv) as s20noref, and the conv's from-zeros binary extra (bias 2, callC/conv.txt: 0.2010
          vs 0.1573 ms at 8192 tokens x 8192 channels on this H100) taken out of every from-zeros
          gated-delta call of the s20 fit runs
  mixfix  (v) s20fix's corrected s20 fit runs + the clean fit rows of (i); the s20 runs' resumed
          extra (pre-e855240, the committed fit.resume median) taken out of their resumed calls
          before the fit, then --resume (the resumed term measured on the clean rows only)
  cleanmoon  the clean Mooncake fit rows only (qwen3.5-9b, qwen3.5-35b-a3b, marconi-7b, nemotron-h-8b):
          long prompts, as the held-out rows
  cleantot  as clean, with each call's untimed gap (suffix_ms less every bucket: grows with the
          tokens, ~0.04-0.06 ms on ShareGPT calls, ~0.8 ms on 4k+ Mooncake calls) spread over its
          layer kinds in proportion to their times: the fit then sees the call's whole time
  s20tot  as s20noref, the gap spread the same way over the s20 fit runs' suffix calls
  clean3moon  as clean, each clean Mooncake fit row linked three times (its calls weigh 3x: the
          ShareGPT rows' short calls no longer outnumber the long ones)
  clean1k  as clean, the calls under 1024 tokens left out of the fit (the s20 fit traces' calls are
          almost all longer: does the call-length mix, not the biases, make the committed fit?)

Then, per clean row, the committed timing's time-saved error with a 90 % bootstrap interval over the
row's validated hits (1000 resamples, seed 0): how much of it the row's own measurement noise can hold.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing_fit as tf  # noqa: E402
from sim.cost import LAYER_KINDS, gdn_chunks, read_timing_file, timing_to_dict  # noqa: E402
from sim.replay.calibration import request_errors  # noqa: E402
from sim.replay.measure import replayed_spec, timed_calls  # noqa: E402

R = ROOT / "benchmarks" / "results"
VERSIONS = "torch 2.11.0+cu130, triton 3.6.0"
S20 = [R / "2026-12-06-gpu-s20/campaign", R / "2026-12-06-gpu-s20/fulldepth"]
NEW = [R / "2026-12-07-gpu-s26/callC/rowsC", R / "2026-12-07-gpu-s26/callE/rowsS"]
#: the clean rows held out of every fit (presets/traces the committed fit did not see)
HELD_NEW = ("qwen3-next-80b-a3b-mooncake", "qwen3.5-27b-mooncake")
#: the conv's from-zeros extra per token and channel (ms): (0.2010 - 0.1573) ms / (8192 x 8192)
CONV_MS_PER_TOKEN_CHANNEL = (0.2010 - 0.1573) / (8192 * 8192)
COMMITTED = read_timing_file(ROOT / "sim/data/h100-timing.json")
S20_RESUME_MS = json.loads((ROOT / "sim/data/h100-timing.json").read_text())["fit"]["resume"]["median"]


def runs_of() -> dict[str, tuple[str, Path]]:
    """Every run: display name -> (source, folder)."""
    out = {}
    for root, src in [(p, "s20") for p in S20] + [(p, "s26") for p in NEW]:
        for d in sorted(root.iterdir()):
            if d.is_dir() and (d / "summary.json").is_file():
                out[f"{src}:{d.name}"] = (src, d)
    return out


ALL = runs_of()


def s20_fit(name: str) -> bool:
    return name.startswith("s20:fit")


def clean_fit(name: str) -> bool:
    return name.startswith("s26:") and not name.split(":", 1)[1].startswith(HELD_NEW)


FIT_SETS = {
    "s20": s20_fit,
    "clean": clean_fit,
    "mixed": lambda n: s20_fit(n) or clean_fit(n),
    "s20noref": s20_fit,
    "s20fix": s20_fit,
    "mixfix": lambda n: s20_fit(n) or clean_fit(n),
    "cleanmoon": lambda n: clean_fit(n) and "-mooncake-" in n,
    "cleantot": clean_fit,
    "s20tot": s20_fit,
    "clean3moon": clean_fit,
    "clean1k": clean_fit,
}
#: per variant, runs linked more than once into the fit (their calls weigh that many times)
COPIES = {"clean3moon": lambda n: 3 if "-mooncake-" in n else 1}
#: (resume, drop_resume) per variant
RESUME = {
    "s20": (True, True),
    "clean": (True, False),
    "mixed": (True, True),
    "s20noref": (True, True),
    "s20fix": (True, True),
    "mixfix": (True, False),
    "cleanmoon": (True, False),
    "cleantot": (True, False),
    "s20tot": (True, True),
    "clean3moon": (True, False),
    "clean1k": (True, False),
}


def scratch(chosen, copies=None) -> Path:
    """A folder of links to every run, the chosen ones named ``fit-...`` (``copies(name)`` times),
    the rest ``ho-...``."""
    d = Path(tempfile.mkdtemp(prefix="timing-clean-"))
    for name, (src, path) in ALL.items():
        run = name.split(":", 1)[1]
        (d / f"{'fit' if chosen(name) else 'ho'}-{src}-{run}").symlink_to(path)
        for i in range(1, copies(name) if copies and chosen(name) else 1):
            (d / f"fit-{src}-copy{i}-{run}").symlink_to(path)
    return d


def display(link_name: str) -> str:
    _, src, run = link_name.split("-", 2)
    return f"{src}:{run}"


def drop_references(t: pd.DataFrame) -> pd.DataFrame:
    """The hit references' calls out of the fit (measure.timed_calls skips a reference whose
    ``full_ms_other`` is not finite); their gated-delta times stay for the resumed-call pairs."""
    t = t.copy()
    t["full_ms_other"] = np.nan
    return t


def drop_conv_extra(t: pd.DataFrame, spec, counts) -> pd.DataFrame:
    """The conv's from-zeros binary extra out of every from-zeros gated-delta call (a suffix that
    starts at token 0, a reference)."""
    k = counts.get("gated_delta", 0)
    if not k or not spec.n_gdn:
        return t
    ch = 2 * spec.gdn_k_heads * spec.gdn_head_k_dim + spec.gdn_v_heads * spec.gdn_head_v_dim
    t = t.copy()
    per = k * ch * CONV_MS_PER_TOKEN_CHANNEL
    zero = np.array([len(s) >= 1 and int(s[0][0]) == 0 for s in t["segments"]])
    tokens0 = np.array([int(s[0][1]) - int(s[0][0]) if len(s) else 0 for s in t["segments"]], float)
    t.loc[zero, "suffix_ms_gated_delta"] = t.loc[zero, "suffix_ms_gated_delta"] - per * tokens0[zero]
    t["full_ms_gated_delta"] = t["full_ms_gated_delta"] - per * t["input_tokens"].astype(float)
    return t


def drop_s20_resume(t: pd.DataFrame, counts) -> pd.DataFrame:
    """The s20 runs' resumed extra (the committed fit's median, per chunk and layer) out of their
    one-call resumed suffixes."""
    k = counts.get("gated_delta", 0)
    if not k:
        return t
    t = t.copy()
    one = (t["kernel_calls"] == 1) if "kernel_calls" in t else pd.Series(True, index=t.index)
    res = t["restored"].astype(bool) & (t["hit_tokens"] > 0) & one
    ch = np.array([gdn_chunks(int(p), int(L)) for p, L in zip(t["hit_tokens"], t["input_tokens"])], float)
    t.loc[res, "suffix_ms_gated_delta"] = t.loc[res, "suffix_ms_gated_delta"] - k * S20_RESUME_MS * ch[res]
    return t


KINDS = ("attention", "gated_delta", "mlp")


def fold_gap(t: pd.DataFrame) -> pd.DataFrame:
    """Each call's time outside every bucket (``suffix_ms`` / ``full_ms`` less the kinds and
    ``other``; ``full_ms`` leaves the ``check`` bucket out, ``suffix_ms_check`` is 0 on every clean
    row) spread over its layer kinds in proportion to their measured times."""
    t = t.copy()
    for side in ("suffix", "full"):
        cols = [f"{side}_ms_{k}" for k in KINDS]
        kinds = t[cols].fillna(0).sum(axis=1)
        f = ((t[f"{side}_ms"] - t[f"{side}_ms_other"].fillna(0)) / kinds).where(kinds > 0)
        for c in cols:
            t[c] = t[c] * f
    return t


def drop_short(t: pd.DataFrame, n: int = 1024) -> pd.DataFrame:
    """The suffix calls of fewer than ``n`` tokens and the references of fewer than ``n`` out of the
    fit (measure.timed_calls skips a suffix with no finite kind time, a reference with no finite
    ``full_ms_other``)."""
    t = t.copy()
    sfx = t["input_tokens"] - np.where(t["restored"].astype(bool), t["hit_tokens"], 0)
    for k in KINDS + ("other",):
        t.loc[sfx < n, f"suffix_ms_{k}"] = np.nan
    t.loc[t["input_tokens"] < n, "full_ms_other"] = np.nan
    return t


def patched_loader(variant: str):
    orig = tf.load_runs

    def load(root: Path):
        out = []
        for run, settings, steps in orig(root):
            if variant == "clean1k" and run.name.startswith("fit-s26-"):
                run = replace(run, table=drop_short(run.table))
            if variant == "cleantot" and run.name.startswith("fit-s26-"):
                run = replace(run, table=fold_gap(run.table))
            if run.name.startswith("fit-s20-"):
                t = run.table
                if variant == "s20tot":
                    t = fold_gap(drop_references(t))
                if variant in ("s20noref", "s20fix", "mixfix"):
                    t = drop_references(t)
                if variant in ("s20fix", "mixfix"):
                    t = drop_conv_extra(t, run.spec, run.counts)
                if variant == "mixfix":
                    t = drop_s20_resume(t, run.counts)
                run = replace(run, table=t)
            out.append((run, settings, steps))
        return out

    return orig, load


def saved_interval(run, timing, n: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """The time saved's error and its 90 % bootstrap interval over the run's validated hits (%)."""
    e = request_errors(run, timing)
    h = e[np.isfinite(e["saved_ms"])]
    if not len(h) or h["saved_ms"].sum() <= 0:
        return (np.nan, np.nan, np.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(h), size=(n, len(h)))
    m, s = h["modelled_saved_ms"].to_numpy(), h["saved_ms"].to_numpy()
    b = 100 * (m[idx].sum(axis=1) / s[idx].sum(axis=1) - 1)
    return (100 * (m.sum() / s.sum() - 1), float(np.quantile(b, 0.05)), float(np.quantile(b, 0.95)))


def score(run, timing) -> dict:
    e = request_errors(run, timing)
    saved = e["saved_ms"].sum()
    a = e["error"].abs().replace([np.inf, -np.inf], np.nan).dropna()
    return dict(
        median=100 * a.median(),
        p95=100 * a.quantile(0.95),
        saved=100 * (e["modelled_saved_ms"].sum() / saved - 1) if saved > 0 else np.nan,
    )


def main(argv) -> int:
    variants = argv or list(FIT_SETS)
    plain = tf.load_runs(scratch(lambda n: False))  # every run, unmodified, for the scores
    runs = {display(r.name): r for r, _, _ in plain}
    rows = []
    for name, run in runs.items():
        rows.append(dict(run=name, variant="committed", fitted=False, **score(run, COMMITTED.with_gpus(1))))
    terms = {}
    for v in variants:
        orig, load = patched_loader(v)
        tf.load_runs = load
        try:
            resume, drop = RESUME[v]
            _, _, timing, info = tf.fit([scratch(FIT_SETS[v], COPIES.get(v))], "fit", VERSIONS, resume, True, drop)
        finally:
            tf.load_runs = orig
        info["variant"] = v
        d = timing_to_dict(timing)
        (HERE / f"fit-{v}.json").write_text(
            json.dumps(dict(d, versions=info["versions"], fit=info), indent=2, default=float) + "\n"
        )
        terms[v] = dict(
            layer_call_ms=d["layer_call_ms"],
            ms_per_tflop=d["ms_per_tflop"],
            ms_per_act_gb=d["ms_per_act_gb"],
            ms_per_weight_gb=d["ms_per_weight_gb"],
            gdn_resume_ms_per_chunk=timing.gdn_resume_ms_per_chunk,
            resume=info.get("resume"),
        )
        for name, run in runs.items():
            rows.append(dict(run=name, variant=v, fitted=FIT_SETS[v](name), **score(run, timing)))
        print(f"{v}: fitted {sum(FIT_SETS[v](n) for n in runs)} runs", terms[v], flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(HERE / "scores.csv", index=False, float_format="%.2f")
    tables(df)
    length_table(
        runs,
        {
            "committed": COMMITTED.with_gpus(1),
            **{
                v: read_timing_file(HERE / f"fit-{v}.json").with_gpus(1)
                for v in ("clean", "s20fix", "cleanmoon")
                if (HERE / f"fit-{v}.json").is_file()
            },
        },
    )
    print("\ncommitted timing, time saved error on the clean rows with its 90 % bootstrap interval over hits (%)")
    for name, run in runs.items():
        if name.startswith("s26:"):
            e, lo, hi = saved_interval(run, COMMITTED.with_gpus(1))
            print(f"{name:45s} {e:+7.1f}  [{lo:+7.1f}, {hi:+7.1f}]")
    return 0


def length_table(runs: dict, timings: dict) -> None:
    """Per layer kind and call length, the median of modelled / measured layer time over the
    one-call timed prefills (suffixes and references) of the clean fcfs rows, every preset pooled;
    then the measured per-token time (us a layer) of from-zero calls of three presets, the s20
    fit runs beside the clean rows (how much the biases moved the fit's input)."""
    rows, tok = [], []
    for name, run in runs.items():
        s20 = name.startswith("s20:fit")
        if not (s20 or (name.startswith("s26:") and name.endswith("-fcfs"))):
            continue
        rs = replayed_spec(run.spec, run.counts)
        for segs, by in timed_calls(run.table):
            if len(segs) != 1:
                continue
            p, L = int(segs[0][0]), int(segs[0][1])
            n = L - p
            b = "<512" if n < 512 else ("512-4k" if n < 4096 else "4k+")
            if s20 or name.startswith("s26:"):
                if p == 0 and run.spec.name in ("qwen3.5-9b", "qwen3.5-27b", "qwen3.5-35b-a3b") and n >= 1024:
                    nb = "1-4k" if n < 4096 else ("4-16k" if n < 16384 else "16k+")
                    for k in LAYER_KINDS:
                        tok.append(
                            dict(src="s20" if s20 else "s26", model=run.spec.name, kind=k, n=nb,
                                 us=1e3 * by[k] / run.counts[k] / n)
                        )  # fmt: skip
            if s20:
                continue
            for v, tm in timings.items():
                layers, fixed = tm._layers(rs), tm.layer_fixed_ms(rs)
                work = tm.work_tflop(rs, p, L, gdn_chunks(p, L))
                for k in LAYER_KINDS:
                    if layers[k]:
                        rows.append(dict(kind=k, length=b, variant=v, r=layers[k] * (fixed[k] + work[k]) / by[k]))
    d = pd.DataFrame(rows).groupby(["kind", "length", "variant"])["r"].median().unstack("variant")
    print("\nmodelled / measured layer time, clean fcfs rows, one-call prefills, presets pooled (median)")
    print(d[list(timings)].round(2).to_string())
    t = pd.DataFrame(tok).groupby(["model", "kind", "n", "src"])["us"].median().unstack("src")
    print("\nmeasured us a token and layer, from-zero calls of 1k+ tokens: s20 fit runs vs clean rows")
    print(t.round(3).to_string())


def fmt(r) -> str:
    s = "-" if not np.isfinite(r["saved"]) else f"{r['saved']:+.0f}"
    return f"{r['median']:.1f} / {r['p95']:.1f} / {s}"


def tables(df: pd.DataFrame) -> None:
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    order = list(dict.fromkeys(df["variant"]))
    df = df.assign(cell=df.apply(fmt, axis=1))
    wide = df.pivot(index="run", columns="variant", values="cell")[order]
    new = wide[wide.index.str.startswith("s26:")]
    print("\nclean rows (s26), median / P95 per-request error % (all prefills) / time saved error %")
    print(new.to_string())
    print("\ns20 runs")
    print(wide[wide.index.str.startswith("s20:")].to_string())
    target = df["run"].str.startswith(("s26:qwen3-next-80b-a3b-", "s26:qwen3.5-27b-"))
    t = wide[wide.index.str.startswith(("s26:qwen3-next-80b-a3b-", "s26:qwen3.5-27b-"))].T
    t.columns = [
        c.replace("s26:", "").replace("qwen3-next-80b-a3b", "80b").replace("qwen3.5-27b", "27b") for c in t.columns
    ]
    print("\nthe issue's presets (80b, 27b) on the clean rows, per variant: median / P95 / time saved error %")
    print(t.to_string())
    print("\nof those 8 rows: median < 10 and P95 < 20 / time saved within 10 % / rows the variant fitted")
    for v in order:
        x = df[(df["variant"] == v) & target]
        ok = ((x["median"] < 10) & (x["p95"] < 20)).sum()
        print(f"{v:10s} {ok}/8  {(x['saved'].abs() <= 10).sum()}/8  {int(x['fitted'].sum())}")
    print("\nsummary (mean of per-run medians; max P95; max |time saved error|)")
    out = []
    held_new = df["run"].str.startswith(tuple(f"s26:{h}" for h in HELD_NEW))
    s20_held = df["run"].str.startswith("s20:") & ~df["run"].str.startswith("s20:fit")
    for v in order:
        x = df[df["variant"] == v]
        row = {"variant": v}
        for label, m in (
            ("s26 held-out (80b/27b Mooncake)", held_new),
            ("s26 all 24", df["run"].str.startswith("s26:")),
            ("s20 held-out", s20_held),
        ):
            y = x[m[x.index]]
            sv = y["saved"].dropna().abs()
            row[f"{label} med"] = round(y["median"].mean(), 1)
            row[f"{label} P95max"] = round(y["p95"].max(), 1)
            row[f"{label} |saved| max"] = round(sv.max(), 0) if len(sv) else np.nan
        out.append(row)
    print(pd.DataFrame(out).set_index("variant").T.to_string())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
