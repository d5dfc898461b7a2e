"""`marconi advise`: the search finds a setting known by construction, its `marconi run` line
reproduces the prediction exactly, an interrupted study resumes without repeating a trial, the
same seed gives the same study, and bad input is one line with exit code 2."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from sim.config import SimConfig
from sim.cost import get_model
from sim.errors import UsageError
from sim.experiments.advise import search, space
from sim.experiments.advise.search import Evaluator, Problem, advise, open_study, run_study
from sim.experiments.advise.space import ENGINES, Engine, Knob, Memory, build_space, parse_gpu_memory, weight_bytes
from sim.simulate import simulate
from traces.base import Request, Trace

from .conftest import marconi, synthetic_trace, write_marconi_jsonl
from sigint import as_from_a_shell

pytest.importorskip("optuna")

TINY = get_model("replay-tiny")
PREFIX, N_PREFIXES, POOL_RANGE = 256, 8, (1, 40)
KV_TOKENS, NEEDED_STATES = 2000, 24


def pool_trace(seed: int = 0) -> Trace:
    """80 single-request sessions over 8 prefixes of 256 tokens, drawn with Zipf weights (prefix i
    with weight 1/(i+1)), each with a fresh 32-token suffix and 16 output tokens, one a second.

    Under SGLang no_buffer with 256-token prefill chunks every request keeps three states (the
    prefix, the prompt end, the request end) and the mamba list is LRU, so the state pool must
    hold about three states per prefix: fewer and a popular prefix's state is evicted before its
    next use, more and the KV pool (the rest of the cache) cannot hold the prefixes. With the
    cache of KV_TOKENS tokens + NEEDED_STATES states the hit rate peaks at exactly
    NEEDED_STATES states (the exhaustive oracle below checks it)."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 50_000, PREFIX) for _ in range(N_PREFIXES)]
    w = 1 / np.arange(1, N_PREFIXES + 1)
    w /= w.sum()
    reqs = []
    for k in range(80):
        i = int(rng.choice(N_PREFIXES, p=w))
        inp = np.concatenate([prefixes[i], rng.integers(0, 50_000, 32)])
        reqs.append(
            Request(session_id=k, turn=0, input_tokens=inp, output_tokens=rng.integers(0, 50_000, 16), arrival=float(k))
        )
    return Trace("pool", reqs, closed_loop=False)


POOL_CAPACITY = KV_TOKENS * TINY.kv_bytes_per_token() + NEEDED_STATES * TINY.state_bytes()


@pytest.fixture
def pool_engine(monkeypatch):
    """An engine whose one knob is the state pool in states (SGLang's --max-mamba-cache-size),
    with the whole memory left by the weights as cache and the prefill chunk at the prefix."""
    eng = Engine(
        "pool-test",
        {"no_buffer": "sglang-v1"},
        Memory("--mem-fraction", 1.0, of="free"),
        knobs=(
            Knob(
                "state_pool",
                "--max-mamba-cache-size",
                4,
                low=POOL_RANGE[0],
                high=POOL_RANGE[1],
                integer=True,
                apply=lambda v, ctx: {"state_pool": str(v)},
            ),
        ),
        fixed={"prefill_chunk_tokens": PREFIX},
    )
    monkeypatch.setitem(ENGINES, "pool-test", eng)
    return eng


@pytest.fixture(scope="module")
def pool_spec(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    return f"marconi-jsonl:{write_marconi_jsonl(pool_trace(), path)}"


def pool_problem(spec: str, **kw) -> Problem:
    gpu = POOL_CAPACITY + weight_bytes(TINY)
    # the construction counts the state pool's slots per request served alone (fcfs: no running
    # requests' slots beside the cache's)
    kw.setdefault("fixed", {"scheduler": "fcfs"})
    return Problem({"trace": spec}, "pool-test", "replay-tiny", f"{gpu}B", **kw)


def test_oracle_peaks_at_the_constructed_split(pool_spec):
    """The construction holds: over every pool size, the best hit rate is at NEEDED_STATES alone."""
    trace = pool_trace()
    hits = {}
    for n in range(POOL_RANGE[0], POOL_RANGE[1] + 1):
        cfg = SimConfig(
            policy="sglang-v1",
            model="replay-tiny",
            capacity_bytes=POOL_CAPACITY,
            state_pool=str(n),
            prefill_chunk_tokens=PREFIX,
            scheduler="fcfs",
        )
        hits[n] = simulate(trace, cfg).summary["token_hit_rate"]
    best = max(hits.values())
    assert [n for n, h in hits.items() if h == best] == [NEEDED_STATES]
    assert hits[NEEDED_STATES - 4] < best and hits[NEEDED_STATES + 4] < best


def test_advise_finds_the_split_within_the_budget(pool_engine, pool_spec, tmp_path):
    adv = advise(pool_problem(pool_spec), tmp_path / "study", 25, progress=False)
    assert adv.space.ctx.capacity_bytes == POOL_CAPACITY
    assert adv.recommended.params == {"state_pool": NEEDED_STATES}
    assert adv.recommended.state_pool == NEEDED_STATES
    assert adv.recommended.tuned["token_hit_rate"] > adv.defaults.tuned["token_hit_rate"]
    assert adv.defaults.params == {"state_pool": 4}  # trial 0: the engine's defaults
    assert ("--max-mamba-cache-size", str(NEEDED_STATES)) in adv.recommended.flags


def cli(*args):
    """The `marconi` command in this process (click's runner: stdout and stderr apart)."""
    from click.testing import CliRunner

    from sim.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def _run_json(line: str) -> dict:
    words = shlex.split(line)
    assert words[:2] == ["marconi", "run"]
    res = cli(*words[1:])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    return row


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_printed_run_line_reproduces_the_prediction_exactly(engine, tmp_path):
    """The CLI end to end on a small chat trace, for each engine as it ships today: the `marconi
    run` lines it prints (tuned part and held-out part, recommendation and defaults) give exactly
    the metrics it predicted, with today's preset and its knobs."""
    spec = f"marconi-jsonl:{write_marconi_jsonl(synthetic_trace(sessions=8, turns=3), tmp_path / 't.jsonl')}"
    out = tmp_path / "adv"
    args = (
        "advise",
        "--trace",
        spec,
        "--for",
        engine,
        "--model",
        "replay-tiny",
        "--gpu-memory",
        "2MB",
        "--trials",
        "6",
        "--holdout",
        "0.5",
        "--workers",
        "1",
        "--out",
        out,
        "--no-progress",
    )
    p = marconi(*args, "--format", "json")
    data = json.loads(p.stdout)
    assert data == json.loads((out / "advice.json").read_text())
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert data["parts"] == ["0:4", "4:"] and data["trials"] == 6
    assert data["recommended"]["policy"] == data["defaults"]["policy"] == engine  # today's preset
    for who in ("recommended", "defaults"):
        assert f"--policy {engine} " in data[who]["marconi_run"]
        for part, line in (("tuned", "marconi_run"), ("held_out", "marconi_run_held_out")):
            row = _run_json(data[who][line])
            for key in ("token_hit_rate", "ttft_p95_ms", "ttft_p50_ms", "request_hit_rate", "evictions"):
                assert row[key] == data[who][part][key], (who, part, key)
    assert "--session-range 4:" in data["recommended"]["marconi_run_held_out"]
    # the table says the same (a rerun: the study is complete, no trial runs again)
    table = cli(*args).stdout
    assert data["command"] in table and data["recommended"]["marconi_run"] in table
    assert "token hit (held out)" in table and "Pareto front" in table
    today = {
        "sglang": "--mamba-radix-cache-strategy",
        "vllm": "--prefix-cache-retention-interval",
        "trtllm": "periodic_snapshot_interval",
    }[engine]
    assert today in data["command"] and "--mamba-scheduler-strategy" not in data["command"]


TODAY_DEFAULTS = {
    "sglang": {
        "mamba_radix_cache_strategy": "auto",
        "page_size": 1,
        "mamba_track_interval": 256,
        "mamba_full_memory_ratio": 0.9,
        "prefill_chunk_tokens": 8192,
    },
    "vllm": {
        "prefix_cache_retention_interval": 0,
        "block_size": 0,
        "prefill_chunk_tokens": 8192,
    },
    "trtllm": {"periodic_snapshot_interval": 0},
}


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_todays_presets_accept_every_sampled_setting(engine, tmp_path):
    """A study of today's engine: trial 0 is today's engine defaults, every trial is a
    combination the preset accepts (none pruned, none failed), and the recommendation passes the
    preset's own check."""
    from policies.base import get_preset

    trace = synthetic_trace(sessions=6, turns=2)
    spec = f"marconi-jsonl:{write_marconi_jsonl(trace, tmp_path / 't.jsonl')}"
    adv = advise(Problem({"trace": spec}, engine, "replay-tiny", "2MB"), tmp_path / "s", 16, progress=False)
    assert adv.defaults.params == TODAY_DEFAULTS[engine]
    assert adv.report.pruned == [] and adv.report.failed == [] and adv.trials == 16
    for row in adv.history:
        task = search.make_trial_task({"trace": spec}, adv.space, row.params, adv.problem)
        assert task.config.policy == engine
        get_preset(engine).check(TINY, task.config)
        if row.params.get("mamba_radix_cache_strategy") == "no_buffer":  # no page / track interval there
            assert "page_size" not in row.params and task.config.page_size == 1
    if engine == "trtllm":  # the default takes no snapshot, so it reuses nothing; any interval does
        assert adv.defaults.tuned["token_hit_rate"] == 0 < adv.recommended.tuned["token_hit_rate"]


def test_a_combination_the_preset_refuses_is_pruned_not_a_crash(tmp_path):
    """--page-size 16 fixed: the search still offers no_buffer, which SGLang refuses with a page
    above 1; those trials are pruned (no simulation) and the study finishes."""
    spec = f"marconi-jsonl:{write_marconi_jsonl(synthetic_trace(sessions=4, turns=2), tmp_path / 't.jsonl')}"
    problem = Problem({"trace": spec}, "sglang", "replay-tiny", "2MB", fixed={"page_size": 16})
    adv = advise(problem, tmp_path / "s", 12, progress=False)
    assert adv.report.pruned and all("needs --page-size 1" in why for _, why in adv.report.pruned)
    assert adv.report.failed == [] and "page_size" not in adv.defaults.params
    assert "--page-size 16" in adv.recommended.run_tuned


def test_a_pool_too_small_to_run_a_request_is_pruned_not_a_crash(tmp_path):
    """SGLang refuses to start when its mamba pool holds fewer states than one running request
    needs (3, or 5 with extra_buffer's tracking slots: ``resolve_max_num_reqs``), or none at all;
    the simulator finds that only when it builds the engine. At 400KB for replay-tiny (136KB of
    cache beside the weights, 7,296-byte states) a sampled --mamba-full-memory-ratio near its
    floor leaves 0-4 states: those trials are pruned with the engine's reason, and the study
    finishes (the first such trial stopped it: a traceback in the advise notebook)."""
    spec = f"marconi-jsonl:{write_marconi_jsonl(synthetic_trace(sessions=4, turns=2), tmp_path / 't.jsonl')}"
    problem = Problem({"trace": spec}, "sglang", "replay-tiny", "400KB")
    adv = advise(problem, tmp_path / "s", 16, progress=False)
    whys = [why for _, why in adv.report.pruned]
    assert any("serves no request" in why for why in whys)
    assert all("serves no request" in why or "leaves no room for one state" in why for why in whys)
    assert adv.report.failed == [] and adv.trials == 16 - len(adv.report.pruned)


def _params(study) -> list:
    return [(t.number, t.params, t.value, t.state.name) for t in study.get_trials(deepcopy=False)]


def test_same_seed_same_study_and_resume_repeats_no_trial(pool_engine, pool_spec, tmp_path, monkeypatch):
    problem = pool_problem(pool_spec, seed=3)
    spec = get_model("replay-tiny")
    sp = build_space("pool-test", spec, parse_gpu_memory(problem.gpu_memory))
    kw = {"trace": pool_spec}

    def fresh(name, n, ev):
        study, new = open_study(tmp_path / name, problem, "maximize")
        assert new
        run_study(study, sp, problem, kw, n, ev, progress=False)
        return study

    calls = []
    real = Evaluator.map
    interrupt = False

    def counting(self, tasks):
        calls.append([t.config.state_pool for t in tasks])
        if len(calls) == 3 and interrupt:
            raise KeyboardInterrupt
        return real(self, tasks)

    monkeypatch.setattr(Evaluator, "map", counting)
    with Evaluator("local", 2) as ev:  # two worker processes, batches of two trials
        a = fresh("a", 8, ev)
        b = fresh("b", 8, ev)
        assert _params(a) == _params(b)
        assert len({json.dumps(t.params) for t in a.get_trials()}) > 3

        # an interrupt in the third batch (trials 4 and 5 asked, not told), then a resume
        calls.clear()
        interrupt = True
        study, _ = open_study(tmp_path / "c", problem, "maximize")
        rep = run_study(study, sp, problem, kw, 8, ev, progress=False)
        assert rep.interrupted and rep.ran == 4
        states = [t.state.name for t in study.get_trials()]
        assert states == ["COMPLETE"] * 4 + ["RUNNING"] * 2
        before = _params(study)[:4]
        interrupt = False
        calls.clear()
        study, new = open_study(tmp_path / "c", problem, "maximize")
        assert not new
        rep = run_study(study, sp, problem, kw, 8, ev, progress=False)
        assert rep.kept == 4 and rep.resumed == 2 and rep.ran == 4 and not rep.interrupted
        assert sum(len(c) for c in calls) == 4  # the 4 finished trials were not run again
        assert _params(study)[:4] == before
        assert _params(study) == _params(a)  # the same study as without the interrupt
        # the same budget again adds nothing
        assert run_study(study, sp, problem, kw, 8, ev, progress=False).ran == 0


def test_other_problem_in_the_folder_is_refused(pool_engine, pool_spec, tmp_path):
    advise(pool_problem(pool_spec), tmp_path / "s", 2, progress=False)
    with pytest.raises(UsageError, match="holds the study of another search"):
        advise(pool_problem(pool_spec, seed=1), tmp_path / "s", 2, progress=False)


def test_memory_rule_and_spaces():
    spec = get_model("qwen3.5-9b")
    assert weight_bytes(spec) == 18 * 10**9
    assert parse_gpu_memory("2x80GB") == 160 * 10**9
    sg = build_space("sglang", spec, 80 * 10**9)
    assert sg.ctx.capacity_bytes == int(80e9 * 0.88) - 18 * 10**9
    assert [k.flag for k in sg.all_knobs] == [
        "--mamba-radix-cache-strategy",
        "--page-size",
        "--mamba-track-interval",
        "--mamba-full-memory-ratio",
        "--chunked-prefill-size",
    ]
    # today's --mamba-full-memory-ratio r: the preset's own split of the cache (its --gpu-memory)
    fields_ = sg.sim_fields({"mamba_radix_cache_strategy": "auto", "mamba_full_memory_ratio": 1.0})
    assert fields_["policy"] == "sglang" and fields_["gpu_memory"] == str(sg.ctx.capacity_bytes)
    cfg = SimConfig(model="qwen3.5-9b", **fields_)
    assert space.pool_states(cfg, spec) == sg.ctx.capacity_bytes // 2 // spec.state_bytes()
    # no_buffer has no page size (it needs 1) and no track interval
    nb = sg.sim_fields({"mamba_radix_cache_strategy": "no_buffer", "page_size": 64, "mamba_track_interval": 512})
    assert "page_size" not in nb and "mamba_track_interval" not in nb  # the SimConfig defaults: 1, 256
    assert [f for f, _ in sg.flags({"mamba_radix_cache_strategy": "no_buffer"})] == [
        "--mamba-radix-cache-strategy",
        "--mamba-full-memory-ratio",
        "--chunked-prefill-size",
    ]
    # the earlier version: SGLang 0.5.9's --mamba-scheduler-strategy, the ratio as a state pool
    old = build_space("sglang-0.5.9", spec, 80 * 10**9)
    assert [k.flag for k in old.all_knobs] == [
        "--mamba-scheduler-strategy",
        "--mamba-full-memory-ratio",
        "--chunked-prefill-size",
    ]
    fields_ = old.sim_fields({"mode": "extra_buffer", "mamba_full_memory_ratio": 1.0, "prefill_chunk_tokens": 4096})
    assert fields_["policy"] == "sglang-0.5.9-extra-buffer"
    assert int(fields_["state_pool"]) == old.ctx.capacity_bytes // 2 // spec.state_bytes()
    # vLLM today: retention on multiples of every block searched (528, 1056, 2112: vLLM refuses an
    # interval off the block); not searched under EAGLE / MTP (fixed)
    vl = build_space("vllm", spec, 80 * 10**9)
    assert [k.flag for k in vl.all_knobs] == [
        "--prefix-cache-retention-interval",
        "--block-size",
        "--max-num-batched-tokens",
    ]
    assert vl.knobs[0].values(vl.ctx) == (0, 2112, 4224, 8448, -1)
    eagle = build_space("vllm", spec, 80 * 10**9, {"speculative_method": "eagle"})
    assert "prefix_cache_retention_interval" not in eagle.defaults()
    assert build_space("vllm-0.11", spec, 80 * 10**9).preset_of({"mode": "all"}) == "vllm-0.11-all"
    tr = build_space("trtllm", spec, 80 * 10**9)
    assert [k.name for k in tr.all_knobs] == ["periodic_snapshot_interval"] and tr.defaults() == {
        "periodic_snapshot_interval": 0
    }
    lm = build_space("lmdeploy", spec, 80 * 10**9)  # a fraction of what the weights leave
    assert lm.ctx.capacity_bytes == int((80e9 - 18e9) * 0.8)
    assert lm.sim_fields({"prefix_cache_state_budget": 0})["state_pool"] == ""
    # a knob the user fixed is not searched
    assert "prefill_chunk_tokens" not in [
        k.name for k in build_space("sglang", spec, 80 * 10**9, {"prefill_chunk_tokens": 2048}).knobs
    ]
    # MoE: every expert's weights count
    assert weight_bytes(get_model("qwen3.5-35b-a3b")) == 70 * 10**9


def test_derived_knobs_come_from_params_metadata(monkeypatch):
    """A preset knob whose Params metadata carries choices or a range is searched without an
    entry in the engine table (here: a range added to the chunked-prefill knob)."""
    from dataclasses import fields as dc_fields

    from policies.engine_common import ChunkedPrefill

    f = {x.name: x for x in dc_fields(ChunkedPrefill)}["prefill_chunk_tokens"]
    monkeypatch.setattr(f, "metadata", {**f.metadata, "range": (512, 8192, "log")})
    eng = Engine("t", {"v": "sglang-v1"}, Memory("--m", 0.9))
    (k,) = space.derived_knobs(eng)
    assert (k.name, k.flag, k.low, k.high, k.log, k.integer) == (
        "prefill_chunk_tokens",
        "--prefill-chunk",
        512,
        8192,
        True,
        True,
    )


def test_range_knobs_from_knob_min_max_are_searched(monkeypatch):
    """``policies.base.knob(min=, max=)`` writes ``min`` / ``max``: a knob with both is a range
    (one bound only is no range); the preset's own ``extra_knobs`` count too."""
    from dataclasses import fields as dc_fields

    from policies.trtllm_current import TrtllmParams

    f = {x.name: x for x in dc_fields(TrtllmParams)}["periodic_snapshot_interval"]
    assert space.derived_knobs(Engine("t", {"v": "trtllm"}, Memory("--m", 0.9))) == []  # min=0 only
    monkeypatch.setattr(f, "metadata", {**f.metadata, "max": 2048})
    (k,) = space.derived_knobs(Engine("t", {"v": "trtllm"}, Memory("--m", 0.9)))
    assert (k.name, k.low, k.high, k.integer, k.log, k.default) == (
        "periodic_snapshot_interval",
        0,
        2048,
        True,
        False,
        0,
    )
    from policies.engine_common import StatePool

    g = {x.name: x for x in dc_fields(StatePool)}["state_pool"]
    monkeypatch.setattr(g, "metadata", {**g.metadata, "choices": ("", "10")})
    names = [k.name for k in space.derived_knobs(Engine("t", {"v": "sglang"}, Memory("--m", 0.9)))]
    assert "state_pool" in names  # an extra_knobs class of the sglang preset


@pytest.mark.parametrize(
    "args, message",
    [
        (("--for", "sglang", "--model", "llama-7b"), "nothing to tune for llama-7b"),
        (("--for", "trtllm", "--model", "llama-7b"), "nothing to tune for llama-7b"),
        (("--for", "sglang", "--model", "qwen3.5-9b", "--gpu-memory", "20GB"), "leaves no cache"),
        (("--for", "sglang", "--model", "qwen3.5-9b", "--gpu-memory", "20.5GB"), "cannot hold one request"),
        (
            ("--for", "vllm", "--model", "qwen3.5-9b", "--objective", "throughput", "--scheduler", "fcfs"),
            "does not measure it",
        ),
        (("--for", "vllm", "--model", "qwen3.5-9b", "--gpu-memory", "lots"), "cannot read size"),
        (("--for", "vllm", "--model", "qwen3.5-9b", "--holdout", "1.5"), "--holdout"),
        # a fixed knob the engine's presets do not read: refused, as `marconi run` would refuse the printed line
        (
            ("--for", "sglang-0.5.9", "--model", "qwen3.5-9b", "--mamba-track-interval", "512"),
            "--mamba-track-interval does nothing for sglang-0.5.9-no-buffer, sglang-0.5.9-extra-buffer (it is read by sglang)",
        ),
        # a fixed setting today's defaults cannot run with
        (
            ("--for", "sglang", "--model", "qwen3.5-9b", "--mamba-track-interval", "100", "--page-size", "64"),
            "defaults cannot run here",
        ),
        (("--for", "marconi", "--model", "qwen3.5-9b", "--block-size", "64"), "--block-size does nothing for marconi"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    out = tmp_path / "o"
    p = cli("advise", "--trace", "synthetic:chat", "--sessions", "4", *args, "--out", out, "--no-progress")
    assert p.exit_code == 2, p.output
    assert len(p.stderr.strip().splitlines()) == 1 and message in p.stderr, p.stderr
    assert not out.exists()  # nothing left behind


def test_session_range_selects_sessions_in_order():
    from traces.sessions import select_sessions

    t = synthetic_trace(sessions=6, turns=2)
    part = select_sessions(t, "2:4")
    order = list(dict.fromkeys(r.session_id for r in t.requests))
    assert list(dict.fromkeys(r.session_id for r in part.requests)) == order[2:4]
    assert [r.request_id for r in part.requests] == list(range(len(part.requests)))
    assert len(select_sessions(t, "4:").requests) + len(select_sessions(t, "0:4").requests) == len(t.requests)


def test_study_folder_holds_the_journal(pool_engine, pool_spec, tmp_path):
    advise(pool_problem(pool_spec), tmp_path / "s", 2, progress=False)
    assert (tmp_path / "s" / search.STUDY_FILE).stat().st_size > 0
    assert isinstance(Path(tmp_path / "s"), Path)


def test_ctrl_c_keeps_finished_trials_and_the_rerun_finishes(tmp_path):
    """A real `marconi advise` (two worker processes) gets SIGINT on its process group after its
    first finished trials: one line, exit 130, the finished trials kept; the same command again
    finishes the study without running them again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from .conftest import ROOT

    spec = f"marconi-jsonl:{write_marconi_jsonl(synthetic_trace(sessions=4, turns=2), tmp_path / 't.jsonl')}"
    out = tmp_path / "adv"
    args = [
        "advise",
        "--trace",
        spec,
        "--for",
        "sglang",
        "--model",
        "replay-tiny",
        "--gpu-memory",
        "2MB",
        "--trials",
        "400",
        "--workers",
        "2",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from sim.cli import main; main()", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=as_from_a_shell,
    )
    try:
        os.set_blocking(proc.stderr.fileno(), False)
        buf, t0 = b"", time.monotonic()
        while b"best token-hit" not in buf:  # the progress bar shows the best after the first trial
            assert time.monotonic() - t0 < 120 and proc.poll() is None, buf[-500:]
            time.sleep(0.05)
            buf += proc.stderr.read() or b""
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        time.sleep(0.2)
        buf += proc.stderr.read() or b""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = buf.decode(errors="replace")
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip() and "advise sglang" not in ln]
    assert proc.returncode == 130 and len(lines) == 1 and "rerun the same command to resume" in lines[0], text[-2000:]
    assert "Traceback" not in text
    import optuna

    from sim.experiments.advise.search import STUDY_FILE, STUDY_NAME

    def trials():
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / STUDY_FILE)))
        return optuna.load_study(study_name=STUDY_NAME, storage=storage).get_trials()

    first = [(t.number, t.params, t.value) for t in trials() if t.state.name == "COMPLETE"]
    n = len(first)
    assert n >= 1
    args[args.index("--trials") + 1] = str(n + 2)
    res = cli(*args[:-4], "--workers", "1", "--out", out, "--no-progress", "--format", "json")
    assert res.exit_code == 0, res.output
    after = trials()
    assert [(t.number, t.params, t.value) for t in after][:n] == first  # kept, not run again
    assert len(after) <= n + 4 and sum(t.state.name == "COMPLETE" for t in after) == n + 2


def test_a_gain_within_min_gain_keeps_the_defaults():
    from sim.experiments.advise.search import MIN_GAIN, beats

    assert MIN_GAIN == 0.01
    assert beats(0.52, 0.50, "token-hit") and not beats(0.504, 0.50, "token-hit")
    assert beats(90.0, 100.0, "ttft-p95") and not beats(99.5, 100.0, "ttft-p95")
    assert beats(0.1, 0.0, "token-hit") and not beats(0.0, 0.0, "token-hit")


def test_a_grid_the_trace_blocks_cannot_carry_is_never_searched():
    """Mooncake's 512-token hash blocks: SGLang's page stays 1 (16..64 would not line up, so the
    knob is gone), and a preset whose default grid does not line up is refused, not crashed."""
    spec = get_model("qwen3.5-27b")
    sg = build_space("sglang", spec, 80 * 10**9, block_tokens=512)
    assert "page_size" not in [k.name for k in sg.all_knobs]
    vl = build_space("vllm", spec, 80 * 10**9, block_tokens=512)
    task = search.make_trial_task(
        {"trace": "mooncake:sample"}, vl, vl.defaults(), Problem({}, "vllm", "qwen3.5-27b", "80GB")
    )
    assert "does not line up with the trace's 512-token blocks" in search.refusal(task, spec, 512)
    assert search.refusal(task, spec, 1) is None


def test_throughput_is_measured_by_the_default_scheduler_not_by_fcfs():
    """Continuous batching is the default (``--scheduler auto`` in des mode): it measures
    throughput; a fixed fcfs scheduler (or sequential mode, where auto is fcfs) does not."""
    from sim.experiments.advise.search import check_objective

    check_objective("throughput", {})
    check_objective("throughput", {"scheduler": "continuous"})
    for fixed in ({"scheduler": "fcfs"}, {"mode": "sequential"}, {"servers": 2}):
        with pytest.raises(UsageError, match="does not measure it"):
            check_objective("throughput", fixed)


def test_an_engine_off_the_hash_block_grid_names_the_way_to_run_it(tmp_path):
    """vLLM's 528-token blocks on Mooncake's 512-token hash blocks: the refusal names
    --hash-block-tokens, as `marconi run --policy vllm` does (it named no way out)."""
    trace = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    p = cli(
        "advise",
        "--for",
        "vllm",
        "--trace",
        f"mooncake:{trace}",
        "--model",
        "qwen3.5-9b",
        "--out",
        out,
        "--no-progress",
    )
    assert p.exit_code == 2, p.output
    assert p.stderr.strip().splitlines() == [
        "Error: --for vllm: the engine's defaults cannot run here: a 528-token grid (vllm) does not line up with "
        "the trace's 512-token blocks; --hash-block-tokens runs it on the trace spelled out as tokens"
    ]
    assert not out.exists()
