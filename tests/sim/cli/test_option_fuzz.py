"""Issue 21: fuzzing each option family through the real CLI (click's runner, in process), in the
style of ``tests/traces/test_fuzz.py``: a drawn value gives exit code 0 or one ``Error:`` line and
exit code 2, never a traceback, and exit 0 exactly when an independent reading of the value says it
is valid. Families: sizes (--capacity), rates (--sessions-per-second, --time-scale), alphas (--alpha
of run and sweep), block sizes (--block-size), paths (--events / --out against existing files,
folders and the input trace, with and without --force: files compared before and after); issue
47: options that cannot act (scheduler, tuning and trace options against the scheduler, policy and
trace in use) and timing-file values (the range where they describe a machine).

Each example is a simulation of a 2-4 request trace (milliseconds); derandomized, so a failure
reproduces.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config import UNLIMITED

FUZZ = settings(
    max_examples=30,
    deadline=timedelta(seconds=20),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TINY = ["--trace", "synthetic:chat:sessions=1,turns=2", "--no-progress"]
RUNNER = CliRunner()

NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),  # 'nan', 'inf', '-0.0', '1e+300'
    st.integers(-(10**25), 10**25).map(str),
    st.sampled_from(["0", "-0", "1e999", "-1e999", "1e-320", ".5", "5.", "0x10", "1_000", "", " ", "1,2", "two"]),
)


def _invoke(args: list[str]):
    res = RUNNER.invoke(main, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in (0, 2), (res.exit_code, res.output)
    event(f"exit {res.exit_code}")
    if res.exit_code == 2:
        text = res.output.strip()
        assert text.startswith("Error: ") and len(text.splitlines()) == 1 and "Traceback" not in text, text
    return res


def _float(text: str) -> float | None:
    """The value a number-reading option sees (Python's float, as click reads FLOAT), or None."""
    try:
        return float(text)
    except ValueError:
        return None


# ------------------------------------------------------------------ sizes

UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 10**3,
    "g": 10**9,
}


def _state_bytes() -> int:
    from sim.cost import get_model

    return get_model("marconi-7b").state_bytes()


@FUZZ
@given(
    number=st.one_of(st.floats(-1e3, 1e16, allow_nan=False).map(lambda x: f"{x:g}"), NUMBER),
    unit=st.sampled_from([*UNITS, "GB", "GiB", "xb", "gbs"]),
)
def test_fuzz_capacity(number, unit):
    text = f"{number}{unit}"
    res = _invoke(["run", *TINY, "--policy", "sglang+", "--capacity", text])
    value = _float(number)
    plain = number.strip() == number and value is not None and "_" not in number and not number.startswith("0x")
    if text.strip().lower() in ("inf", "infinite", "unlimited"):
        expect = UNLIMITED
    elif plain and unit.lower() in UNITS and math.isfinite(value) and not number.lstrip().startswith(("+", "-")):
        expect = int(value * UNITS[unit.lower()]) if value * UNITS[unit.lower()] < UNLIMITED else None
    else:
        expect = None
    ok = expect is not None and expect >= _state_bytes()
    assert (res.exit_code == 0) == ok, (text, expect, res.output)
    if ok:
        from sim.config import format_size

        assert f"| capacity {format_size(expect)} |" in res.stdout.splitlines()[0]
    elif expect is not None and expect > 0:
        assert "smaller than one state checkpoint" in res.output or "capacity must be positive" in res.output


# ------------------------------------------------------------------ rates


@FUZZ
@given(rate=NUMBER, flag=st.sampled_from(["--sessions-per-second", "--time-scale"]))
def test_fuzz_rates(rate, flag):
    # --time-scale acts on open-loop traces only (issue 47: refused on a closed-loop one); both
    # rates are read where the model means something: 1e-6..1e6 (1e-320 made the clock NaN)
    trace = TINY if flag == "--sessions-per-second" else ["--trace", "mooncake:sample", "--session-range", "0:3"]
    res = _invoke(["run", *trace, "--no-progress", "--policy", "sglang+", flag, rate])
    value = _float(rate)
    ok = value is not None and 1e-6 <= value <= 1e6
    assert (res.exit_code == 0) == ok, (flag, rate, res.output)
    if value is not None and not ok:
        assert flag in res.output


# ------------------------------------------------------------------ alphas


@FUZZ
@given(
    alpha=st.one_of(NUMBER, st.just("auto"), st.just("AUTO")),
    sweep=st.booleans(),
    policy=st.sampled_from(["marconi", "sglang+,marconi"]),
)
def test_fuzz_alpha(tmp_path_factory, alpha, sweep, policy):
    if sweep:  # lists and ranges of values; a dry run checks every configuration
        out = tmp_path_factory.mktemp("s") / "s"
        res = _invoke(["sweep", *TINY, "--policy", policy, "--alpha", alpha, "--out", str(out), "--dry-run"])
        assert not out.exists()
    else:
        res = _invoke(["run", *TINY, "--policy", policy, "--alpha", alpha, "--format", "json"])
    value = _float(alpha)
    ok = alpha == "auto" or (
        value is not None
        and 0 <= value < math.inf
        and "_" not in alpha
        and (not sweep or alpha.strip() == alpha and not alpha.startswith("0x"))
    )
    if sweep and "," in alpha:
        ok = all(_float(a) is not None and 0 <= _float(a) < math.inf for a in alpha.split(","))
    assert (res.exit_code == 0) == ok, (alpha, sweep, res.output)
    if ok and not sweep and alpha != "auto":  # the static alpha the run used, as given
        assert json.loads(res.stdout)[-1]["alpha"] == value


@FUZZ
@given(alpha=NUMBER)
def test_fuzz_alpha_for_a_policy_without_alpha(alpha):
    """Any --alpha with sglang+ alone is refused: NaN as a bad value, the rest as doing nothing."""
    res = _invoke(["run", *TINY, "--policy", "sglang+", "--alpha", alpha])
    assert res.exit_code == 2
    value = _float(alpha)
    if value is not None and 0 <= value < math.inf:
        assert "--alpha does nothing for sglang+" in res.output


# ------------------------------------------------------------------ block sizes


@FUZZ
@given(
    size=st.one_of(st.integers(-10, 5000), st.integers(-(2**40), 2**40), st.sampled_from([0, 1, 4096, 4097])),
    policy=st.sampled_from(["vllm-all", "vllm-align", "lmdeploy"]),
)
def test_fuzz_block_size(size, policy):
    res = _invoke(["run", *TINY, "--policy", policy, "--block-size", str(size), "--capacity", "5GB"])
    assert (res.exit_code == 0) == (0 <= size <= 4096), (size, res.output)
    if res.exit_code == 2:
        assert "--block-size must be 0 (the engine's default) or 1 to 4096 tokens" in res.output


# ------------------------------------------------------------------ paths

PARTS = ["t.jsonl", "f", "d", "new", "e.jsonl", "e.parquet", "e.txt", "summary.json"]
BAILIAN = [
    {
        "chat_id": 1,
        "parent_chat_id": -1,
        "turn": 1,
        "timestamp": 0.0,
        "input_length": 32,
        "output_length": 3,
        "type": "text",
        "hash_ids": [1, 2],
    },
    {
        "chat_id": 2,
        "parent_chat_id": 1,
        "turn": 2,
        "timestamp": 1.0,
        "input_length": 48,
        "output_length": 3,
        "type": "text",
        "hash_ids": [1, 2, 3],
    },
]


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@FUZZ
@given(parts=st.lists(st.sampled_from(PARTS), min_size=1, max_size=3), force=st.booleans(), as_out=st.booleans())
def test_fuzz_output_paths(tmp_path_factory, parts, force, as_out):
    root = tmp_path_factory.mktemp("p")
    trace = root / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in BAILIAN))
    (root / "f").write_text("a file")
    (root / "d").mkdir()
    (root / "d" / "e.jsonl").write_text("old events")
    (root / "d" / "summary.json").write_text("old summary")
    target = root.joinpath(*parts)
    before = _tree(root)
    flag = "--out" if as_out else "--events"
    # what an independent reading of the path says, before the run
    resolved = target.resolve()
    blocked = next((p for p in (root.joinpath(*parts[:i]) for i in range(1, len(parts))) if p.is_file()), None)
    if as_out:
        writes = [resolved / n for n in ("summary.json", "requests.parquet", "occupancy.parquet")]
        ok = blocked is None and not (resolved.exists() and not resolved.is_dir())
    else:
        writes = [resolved]
        ok = blocked is None and not resolved.is_dir() and resolved.suffix in (".jsonl", ".json", ".parquet")
    ok = ok and trace.resolve() not in writes and (force or not any(w.exists() for w in writes))
    res = _invoke(
        [
            "run",
            "--trace",
            f"bailian:{trace}",
            "--no-progress",
            "--policy",
            "sglang+",
            flag,
            str(target),
            *(["--force"] if force else []),
        ]
    )
    assert (res.exit_code == 0) == ok, (parts, force, flag, res.output)
    after = _tree(root)
    assert after[str(trace.relative_to(root))] == before[str(trace.relative_to(root))]  # never the input
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    allowed = {str(w.relative_to(root)) for w in writes if root in w.parents} if ok else set()
    assert changed <= allowed, (changed, allowed, res.output)
    if ok:
        assert all(w.is_file() for w in writes)
    assert not [p for p in root.rglob(".tmp-*")]  # no temporary file left behind


# ------------------------------------------------------------------ issue 47: options that cannot act

SCHEDULERS = ["auto", "fcfs", "continuous"]


@FUZZ
@given(
    policy=st.sampled_from(["sglang+", "marconi", "sglang+,marconi", "vllm+"]),
    alpha=st.sampled_from(["auto", "1"]),
    scheduler=st.sampled_from(SCHEDULERS),
    tuner=st.sampled_from([None, "duel", "replay"]),
    option=st.sampled_from(
        [("--max-num-seqs", "8"), ("--duel-every", "5"), ("--bootstrap-multiplier", "3"), ("--alpha-grid", "0,1")]
    ),
)
def test_fuzz_options_that_cannot_act(policy, alpha, scheduler, tuner, option):
    """An option is refused exactly when no configuration reads it, read independently here: the
    batching knob under fcfs; a tuning knob without a policy tuned by --alpha auto (marconi); a
    duel knob under --tuner replay, a replay-tuner knob under the duel tuner (the default)."""
    args = ["run", *TINY, "--policy", policy, "--scheduler", scheduler, *option]
    uses_alpha = "marconi" in policy.split(",")
    if uses_alpha:
        args += ["--alpha", alpha]
    if tuner:
        args += ["--tuner", tuner]
    res = _invoke(args)
    flag = option[0]
    tuned = uses_alpha and alpha == "auto"
    if flag == "--max-num-seqs":
        inert = scheduler == "fcfs" or (tuner is not None and not tuned)
    else:
        inert = not tuned or (flag == "--duel-every" and tuner == "replay")
        inert = inert or (flag == "--bootstrap-multiplier" and tuner != "replay")
    if tuner is not None and not tuned:  # --tuner itself is a tuning knob: nothing reads it either
        inert = True
    assert (res.exit_code == 2) == inert, (args, res.output)
    if inert:
        assert "does nothing" in res.output, res.output


@FUZZ
@given(
    option=st.sampled_from(
        [
            ("--sessions", "3"),
            ("--min-rounds", "2"),
            ("--max-tokens", "5000"),
            ("--response-time", "3"),
            ("--time-scale", "2"),
            ("--trace-seed", "4"),
        ]
    ),
    trace=st.sampled_from(["synthetic:chat:sessions=1,turns=2", "mooncake:sample"]),
)
def test_fuzz_trace_options_the_trace_does_not_read(option, trace):
    from traces.registry import trace_source

    res = _invoke(["run", "--trace", trace, "--session-range", "0:2", "--no-progress", "--policy", "sglang+", *option])
    from sim.cli.checks import _synthetic_unread

    key = option[0][2:].replace("-", "_")
    # a synthetic spec's own sessions= (and seed=), and its kind's think times, take their options' place
    own = _synthetic_unread(trace, key)
    reads = key in trace_source(trace).reads and not own
    assert (res.exit_code == 0) == reads, (trace, option, res.output)
    if not reads:
        said = (
            f"{option[0]} does nothing for {trace} ("
            if own
            else f"{option[0]} does nothing for {trace.split(':')[0]} traces"
        )
        assert said in res.output, res.output


# ------------------------------------------------------------------ issue 47: timing files

_H200 = json.loads((Path(__file__).parents[3] / "sim" / "data" / "h200-timing.json").read_text())
TIMING_VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=False),
    st.sampled_from([0.0, -1.0, 1e300, 1e9, 1e10, 0.5, 1.0, 1.5, 64, 65, 10**9, 989.0, 2000.0]),
)


@FUZZ
@given(field=st.sampled_from(["peak_tflops", "gpus", "mlp_linear", "call_ms"]), value=TIMING_VALUE)
def test_fuzz_timing_file_values(tmp_path_factory, field, value):
    """A timing file is accepted exactly when it describes a machine, read independently: terms and
    times finite and non-negative, a term at most 1e9 ms per TFLOP and no faster than the peak (the
    file's 989 TFLOP/s, the H200's when 0), a call at most 1e6 ms, a whole number of 1 to 64 GPUs."""
    d = json.loads(json.dumps(_H200))
    if field == "mlp_linear":
        d["ms_per_tflop"]["mlp_linear"] = value
    else:
        d[field] = value
    path = tmp_path_factory.mktemp("t") / "timing.json"
    path.write_text(json.dumps(d))
    res = _invoke(["run", *TINY, "--model", "qwen3.5-9b", "--policy", "sglang+", "--timing", str(path)])
    fin = math.isfinite(value)
    fastest = min(v for k, v in d["ms_per_tflop"].items() if v and k != "mlp_linear" or k == "mlp_linear" and v)
    if field == "peak_tflops":
        peak = value if fin and value > 0 else 989.0
        ok = fin and value >= 0 and 1e3 / (fastest * peak) <= 1 + 1e-9
    elif field == "gpus":
        ok = fin and value == int(value) and 1 <= value <= 64  # a whole number (2.5 is no GPU count)
    elif field == "mlp_linear":
        ok = fin and 0 <= value <= 1e9 and (value == 0 or 1e3 / (value * 989.0) <= 1 + 1e-9)
    else:
        ok = fin and 0 <= value <= 1e6
    assert (res.exit_code == 0) == ok, (field, value, res.output)
