"""Range / list parsing, grid expansion, config ids, and the CLI's flag errors and --dry-run."""

from __future__ import annotations

import math

import pytest

from sim.errors import UsageError
from sim.experiments.grid import expand_grid, make_task, parse_values

from .conftest import marconi


def test_float_range_is_inclusive_and_exact():
    vals = parse_values("0:2:0.1", "float")
    assert len(vals) == 21
    assert vals[0] == 0.0 and vals[-1] == 2.0
    assert vals[3] == 0.3  # decimal steps: no 0.30000000000000004
    assert parse_values("0:1:0.3", "float") == [0.0, 0.3, 0.6, 0.9]  # stop off the grid: not included


def test_lists_ranges_and_repeats_combine_in_order_without_duplicates():
    assert parse_values(["0.25,1", "1:3:1", "0.25"], "float") == [0.25, 1.0, 2.0, 3.0]
    assert parse_values("1:5", "int") == [1, 2, 3, 4, 5]
    assert parse_values("1GB,2GB,5GB", "size") == [10**9, 2 * 10**9, 5 * 10**9]
    assert parse_values("1GB:3GB:1GB,10GB", "size") == [10**9, 2 * 10**9, 3 * 10**9, 10 * 10**9]
    assert parse_values("512MiB", "size") == [512 * 2**20]
    assert parse_values("0:1:0.5,auto", "alpha") == [0.0, 0.5, 1.0, "auto"]
    assert parse_values("vllm+,sglang+,marconi", "str") == ["vllm+", "sglang+", "marconi"]
    # a synthetic spec's k=v list stays with its spec
    assert parse_values("synthetic:chat:sessions=5,seed=2,sharegpt", "trace") == [
        "synthetic:chat:sessions=5,seed=2",
        "sharegpt",
    ]


@pytest.mark.parametrize(
    "text,kind",
    [
        ("2:1", "float"),
        ("0:1:0", "float"),
        ("0:1:-1", "float"),
        ("a:b", "float"),
        ("1:2:3:4", "int"),
        ("1.5", "int"),
        ("x", "float"),
        ("", "float"),
        ("1GB:5GB", "size"),
        ("0:1e9:1e-9", "float"),
    ],
)
def test_bad_values_are_usage_errors(text, kind):
    with pytest.raises(UsageError):
        parse_values(text, kind, "--knob")


def test_grid_product_and_alpha_only_multiplies_alpha_policies(trace_files):
    tasks = expand_grid(
        {"trace": trace_files},
        {
            "policy": ["vllm+", "sglang+", "marconi"],
            "capacity_bytes": [10**8, 3 * 10**8],
            "alpha": parse_values("0:2:0.5", "float"),
            "sessions_per_second": [1.0, 5.0],
        },
    )
    per_trace_cap_rate = 2 * 2 * 2
    assert len(tasks) == per_trace_cap_rate * (1 + 1 + 5)
    by_policy = {p: [t for t in tasks if t.config.policy == p] for p in ("vllm+", "sglang+", "marconi")}
    assert len(by_policy["vllm+"]) == len(by_policy["sglang+"]) == per_trace_cap_rate
    assert len(by_policy["marconi"]) == 5 * per_trace_cap_rate
    assert all(math.isnan(t.knobs["alpha"]) and t.alpha_mode == "none" for t in by_policy["vllm+"])
    assert sorted({t.knobs["alpha"] for t in by_policy["marconi"]}) == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert len({t.config_id for t in tasks}) == len(tasks)
    # grouped by trace: all tasks of the first trace come first
    assert [t.trace_kwargs["trace"] for t in tasks] == sorted(
        [t.trace_kwargs["trace"] for t in tasks], key=trace_files.index
    )


def test_config_id_is_stable_and_tracks_every_knob():
    a = make_task({"trace": "sharegpt", "sessions": 5}, policy="marconi", alpha=1, sessions_per_second=1)
    b = make_task({"trace": "sharegpt", "sessions": 5}, policy="marconi", alpha=1.0, sessions_per_second=1.0)
    assert a.config_id == b.config_id  # 1 and 1.0 are the same knob value
    assert (
        a.config_id
        == make_task({"trace": "sharegpt", "sessions": 5, "response_time": 7.5}, policy="marconi", alpha=1.0).config_id
    )  # explicit default
    others = [
        make_task({"trace": "sharegpt", "sessions": 5, "response_time": 5}, policy="marconi", alpha=1.0),
        make_task({"trace": "sharegpt", "sessions": 6}, policy="marconi", alpha=1.0),
        make_task({"trace": "sharegpt", "sessions": 5}, policy="marconi", alpha=0.5),
        make_task({"trace": "sharegpt", "sessions": 5}, policy="marconi", alpha=1.0, seed=1),
        make_task({"trace": "sharegpt", "sessions": 5}, policy="marconi", alpha=1.0, capacity_bytes=10**9),
    ]
    assert len({a.config_id, *(t.config_id for t in others)}) == 6
    # alpha means nothing to sglang+: one id whatever alpha is given
    assert make_task({}, policy="sglang+", alpha=0.5).config_id == make_task({}, policy="sglang+", alpha=2.0).config_id


def test_dry_run_counts_the_grid_and_writes_nothing(tmp_path, trace_files):
    out = tmp_path / "res"
    p = marconi(
        "sweep",
        "--out",
        out,
        "--dry-run",
        "--trace",
        ",".join(trace_files),
        "--policy",
        "vllm+,sglang+,marconi",
        "--alpha",
        "0:2:0.1",
        "--capacity",
        "1GB,2GB,3GB,4GB,5GB,10GB",
        "--max-num-seqs",
        "251:256",
        "--time-scale",
        "0.5,1,2",
    )
    # per trace x time scale: 6 engine sizes x 6 capacities x (1 + 1 + 21) configurations (--seed,
    # which seeds Poisson session starts, is refused under uniform arrivals; options the
    # trace reads: --response-time, which marconi-jsonl traces do not read, is refused, and so is
    # --sessions-per-second, which their own arrival times replace)
    assert "= 4,968 configurations" in p.stdout, p.stdout
    assert "to run: 4,968" in p.stdout
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--alpha", "0:2:x"], "--alpha"),
        (["--capacity", "5GB:1GB:1GB"], "runs backwards"),
        (["--policy", "nope"], "unknown policy"),
        (["--mode", "des,fast"], "--mode"),
        (["--sessions-per-second", "0,1"], "sessions-per-second"),
        (["--sessions", "1.5"], "--sessions"),
        (["--workers", "0"], "--workers"),
    ],
)
def test_bad_flags_exit_2_with_one_line(tmp_path, args, msg):
    p = marconi("sweep", "--out", tmp_path / "res", "--dry-run", *args, check=False)
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:") and msg in err[0], p.stderr


# ---------------------------------------------------------------- row identity: every field counts
# a value other than the default for every field of the run configuration; a field not listed
# here gets one derived from its choices or its type, and a field whose value cannot be derived
# fails test_id_alternatives_cover_every_field until it is listed (and its effect on the id decided)
SIM_ALTERNATIVES = {
    "policy": "sglang+",
    "model": "qwen3.5-9b",
    "capacity_bytes": 10**9,
    "alpha": 0.5,
    "state_alignment": "chunk",
    "chunk_size": 128,
    "mode": "sequential",
    "compat": "paper-fixed",
    "sessions_per_second": 2.0,
    "arrival": "poisson",
    "servers": 2,
    "ttft_model": "jamba",
    "seed": 3,
    "alpha_grid": "0:1:0.5",
    "bootstrap_multiplier": 3,
    "tuning_objective": "hit-rate",
    "tuning_start": "snapshot",
    "tuning_workers": 2,
    "retune_every": 100,
    "tuning_lru": False,
    "tuner": "replay",
    "duel_candidates": "lru,0,1",
    "duel_every": 10,
    "duel_window": 50,
    "duel_margin": 0.1,
    "prefill_chunk_tokens": 4096,
    "block_size": 64,
    "state_pool": "4",
    "timing_file": "timing.json",
    "gpu_memory": "80GB",
    "additional_snapshot_offsets_from_start": "1024",
    "additional_snapshot_offsets_from_end": "0",
}
TRACE_ALTERNATIVES = {
    "trace": "synthetic:chat",
    "sessions": 7,
    "min_rounds": 2,
    "max_tokens": 4096,
    "tokenizer": "qwen3",
    "skip_bad_rows": True,
    "response_time": 5.0,
    "time_scale": 2.0,
    "trace_seed": 1,
    "session_range": "0:3",
    "hash_block_tokens": True,
}


def _sim_fields():
    from sim.config import SimConfig

    return {f.name: f for f in SimConfig.knobs()}


def sim_alternative(name: str):
    """A non-default value of SimConfig field ``name``: listed, or from its choices, or its type."""
    if name in SIM_ALTERNATIVES:
        return SIM_ALTERNATIVES[name]
    f = _sim_fields()[name]
    choices = f.metadata.get("choices")
    if choices:
        return next(c for c in choices if c != f.default)
    if isinstance(f.default, bool):
        return not f.default
    if isinstance(f.default, (int, float)):
        return f.default + 1
    pytest.fail(f"SimConfig.{name}: list a non-default value in SIM_ALTERNATIVES")


def test_id_alternatives_cover_every_field_of_the_run_configuration():
    from sim.experiments.grid import _trace_defaults

    assert set(TRACE_ALTERNATIVES) == set(_trace_defaults())
    assert all(v != _trace_defaults()[k] for k, v in TRACE_ALTERNATIVES.items())
    for name, f in _sim_fields().items():
        assert sim_alternative(name) != f.default, name


@pytest.mark.parametrize("knob", sorted(_sim_fields()))
def test_every_simulation_knob_is_part_of_the_config_id_except_speed_knobs(knob):
    from sim.experiments.grid import BATCHING_KNOBS, SPEED_KNOBS, TUNING_KNOBS

    # tuning knobs count only for an auto-tuned policy (they are reset otherwise: next test); the
    # artifact's replay (--compat paper-fixed) runs in sequential mode; batching knobs count only
    # for --scheduler continuous
    from policies.base import policy_knobs

    # a policy knob counts for the policies that read it (the others run once at its default: next
    # tests); marconi reads most, the engines' own knobs are priced on their first reader
    readers = policy_knobs().get(knob, ["marconi"])
    base = {
        "policy": "marconi" if "marconi" in readers else readers[0],
        "alpha": "auto" if knob in TUNING_KNOBS else 1.0,
    }
    if knob == "compat":
        base["mode"] = "sequential"
    if knob in BATCHING_KNOBS:
        base["scheduler"] = "continuous"
    a = make_task({}, **base)
    # the default scheduler (auto) is continuous here: the alternative that changes the run is fcfs
    b = make_task({}, **{**base, knob: "fcfs" if knob == "scheduler" else sim_alternative(knob)})
    if knob in SPEED_KNOBS:
        assert a.config_id == b.config_id  # changes how fast, not what
    else:
        assert a.config_id != b.config_id, knob


def _policy_knobs() -> dict:
    from policies.base import policy_knobs

    return {k: v for k, v in policy_knobs().items() if k != "alpha"}  # alpha: its own rule (make_task)


@pytest.mark.parametrize("knob", sorted(_policy_knobs()))
def test_a_policy_knob_its_policy_does_not_read_does_not_split_its_rows(knob):
    """`sweep --policy sglang,vllm --gpu-memory 20GB,40GB` ran vllm (which reads --capacity) once
    per value: two rows of the same numbers."""
    readers = _policy_knobs()[knob]
    idle = next(p for p in ("marconi", "vllm", "sglang", "lmdeploy", "trtllm") if p not in readers)
    a = make_task({}, policy=idle)
    assert make_task({}, policy=idle, **{knob: sim_alternative(knob)}).config_id == a.config_id, (knob, idle)


def test_batching_knobs_do_not_split_fcfs_rows():
    from sim.experiments.grid import BATCHING_KNOBS

    a = make_task({}, policy="marconi", alpha=1.0, scheduler="fcfs")
    for knob in BATCHING_KNOBS:
        alt = {knob: sim_alternative(knob)}
        assert make_task({}, policy="marconi", alpha=1.0, scheduler="fcfs", **alt).config_id == a.config_id


def test_auto_scheduler_rows_are_those_of_the_scheduler_that_ran():
    """``--scheduler auto`` (the default) records the scheduler it resolved to: its rows and config
    ids are those of the explicit choice (continuous in des mode, fcfs in sequential mode)."""
    auto = make_task({}, policy="marconi", alpha=1.0)
    assert auto.config_id == make_task({}, policy="marconi", alpha=1.0, scheduler="continuous").config_id
    assert auto.knobs["scheduler"] == "continuous"
    seq = make_task({}, policy="marconi", alpha=1.0, mode="sequential")
    assert seq.config_id == make_task({}, policy="marconi", alpha=1.0, mode="sequential", scheduler="fcfs").config_id
    assert seq.knobs["scheduler"] == "fcfs"


def test_tuning_knobs_do_not_split_static_alpha_rows():
    from sim.experiments.grid import TUNING_KNOBS

    a = make_task({}, policy="marconi", alpha=1.0)
    for knob in TUNING_KNOBS:
        assert make_task({}, policy="marconi", alpha=1.0, **{knob: sim_alternative(knob)}).config_id == a.config_id


@pytest.mark.parametrize("knob", sorted(TRACE_ALTERNATIVES))
def test_every_trace_option_is_part_of_the_config_id(knob):
    a = make_task({}, policy="marconi", alpha=1.0)
    b = make_task({knob: TRACE_ALTERNATIVES[knob]}, policy="marconi", alpha=1.0)
    assert a.config_id != b.config_id and b.knobs[knob] == TRACE_ALTERNATIVES[knob]


def test_parsed_values_have_the_knobs_types():
    # Decimal(1) == 1, so compare types too: an int knob must get ints, a float knob floats
    assert [type(v) for v in parse_values("1:3,7", "int")] == [int] * 4
    assert [type(v) for v in parse_values("0:1:0.5,2", "float")] == [float] * 4
    assert [type(v) for v in parse_values("1GB:2GB:1GB", "size")] == [int] * 2
    assert [type(v) for v in parse_values("0.5,auto", "alpha")] == [float, str]


def test_a_later_trace_option_at_its_default_keeps_earlier_config_ids():
    """``--session-range`` and ``--hash-block-tokens`` (added after ROW_VERSION 1) are left out of the
    id while at their defaults, so a
    results folder written before it resumes; set, it is part of the id (test above)."""
    import hashlib
    import json

    from sim.experiments.grid import ROW_VERSION, _trace_defaults

    task = make_task({}, policy="marconi", alpha=1.0, scheduler="fcfs")
    tk = {k: v for k, v in _trace_defaults().items() if k not in ("session_range", "hash_block_tokens")}
    # fcfs runs also leave the scheduler's knobs out (they predate it)
    dropped = ("tuning_workers", "scheduler", "max_num_batched_tokens", "max_num_seqs")
    ident = {k: v for k, v in task.config.as_row().items() if k not in dropped}
    identity = {"v": ROW_VERSION, "trace": tk, "config": {**ident, "alpha": 1.0}}
    assert task.config_id == hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:20]
