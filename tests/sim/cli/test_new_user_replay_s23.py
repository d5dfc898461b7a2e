"""Session 23, a new user's `marconi replay` on the CPU (their own small hybrid configs, traces and
timing files): what it printed wrong, and the fix of each."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.cost import get_model
from sim.errors import UsageError
from sim.replay.session import check_calibrate

TINY = "synthetic:chat:sessions=2,turns=2"
SMALL = ["--trace", TINY, "--no-progress", "--device", "cpu"]

# a Nemotron-H-like toy (Mamba2 + attention + MLP), as a user writes one
NEMO = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "torch_dtype": "bfloat16",
    "hidden_size": 64,
    "num_hidden_layers": 6,
    "hybrid_override_pattern": "M-M*-M",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "expand": 2,
    "intermediate_size": 128,
    "mlp_hidden_act": "relu2",
    "vocab_size": 512,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _one_line(res, start: str) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output)
    text = res.output.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert text.startswith(f"Error: {start}"), text
    return text


# ------------------------------------------------------- --calibrate of a replay that left a type out


def test_calibrate_refuses_layers_that_replay_no_attention(runner, tmp_path):
    """`--layers 1 --calibrate t.json` replayed 0 attention + 1 gated-delta layer and wrote a timing
    file whose attention terms were never fitted: 0 ms/TFLOP and 0 ms per call on a CPU (the
    device's peak on a GPU), so `marconi run --timing t.json` priced replay-tiny's attention as free.
    Refused up front in one line, nothing made."""
    cal = tmp_path / "o" / "t.json"
    res = runner.invoke(main, ["replay", *SMALL, "--model", "replay-tiny", "--layers", "1", "--calibrate", str(cal)])
    text = _one_line(res, "--calibrate with --layers 1: replay-tiny's attention layers would not be replayed")
    assert "(0 attention + 1 gated-delta of its 1 + 3)" in text and "give --layers 2 or more" in text
    assert not (tmp_path / "o").exists()


def test_calibrate_check_on_a_mamba2_config_and_the_depths_that_replay_every_type(tmp_path):
    (tmp_path / "nemo").mkdir()
    (tmp_path / "nemo" / "config.json").write_text(json.dumps(NEMO))
    spec = get_model(str(tmp_path / "nemo"))
    with pytest.raises(
        UsageError, match=r"attention layers would not be replayed \(0 attention \+ 1 Mamba2 of its 1 \+ 3\)"
    ):
        check_calibrate(spec, 1)
    for layers in (None, 2, 3, 4):  # every type replayed: nothing to say
        check_calibrate(spec, layers)
        check_calibrate(get_model("replay-tiny"), layers)


# ------------------------------------------------ validated hits with no KV to check, and no MLP

# a pure Mamba2 model (Codestral-like): no attention, no MLP
MAMBA2 = {
    "architectures": ["Mamba2ForCausalLM"],
    "model_type": "mamba2",
    "torch_dtype": "bfloat16",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_heads": 4,
    "head_dim": 32,
    "state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "expand": 2,
    "vocab_size": 512,
    "tie_word_embeddings": False,
}


def _replay(runner, *args):
    pytest.importorskip("torch")
    res = runner.invoke(main, ["replay", *SMALL, *args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("model, layers", [("replay-tiny", ["--layers", "1"]), ("mamba2", [])])
def test_hits_validated_without_kv_say_why(runner, tmp_path, model, layers):
    """A replay of no attention layer (`--layers 1` of replay-tiny, a pure Mamba2 config) validated
    every hit's states but had no KV to check: the table said "hits (validated, KV validated) 1 (1,
    0)" with no reason, which reads as the KV check skipped or failed, and summary.json counted no
    reason either (issue 41: every hit's checks validated, or a reason the summary counts). Now
    ``kv_hits_unvalidated`` counts them by reason and the line says it; the pure Mamba2 model's
    layers line said "mlp 0 (dense MLP (0))", now "mlp 0"."""
    if model == "mamba2":
        (tmp_path / "m2").mkdir()
        (tmp_path / "m2" / "config.json").write_text(json.dumps(MAMBA2))
        model = str(tmp_path / "m2")
    s = json.loads(_replay(runner, "--model", model, *layers, "--format", "json"))
    assert s["hits"] == s["hits_validated"] > 0 and s["kv_hits_validated"] == 0
    assert s["kv_hits_unvalidated"] == {"no attention layer replayed": s["hits"]}
    lines = _replay(runner, "--model", model, *layers).splitlines()
    hits = [x for x in lines if x.startswith("hits (validated, KV validated)")]
    n = s["hits"]
    assert hits[0].split("  ")[-1].strip() == f"{n} ({n}, 0); KV not checked: no attention layer replayed {n}"
    if model != "replay-tiny":
        layer_line = [x for x in lines if x.startswith("layers replayed")][0]
        assert layer_line.split("  ")[-1].strip() == "attention 0, mamba2 2, mlp 0"


def test_a_replay_with_attention_counts_no_kv_reason(runner):
    s = json.loads(_replay(runner, "--model", "replay-tiny", "--layers", "2", "--format", "json"))
    assert s["hits"] == s["hits_validated"] == s["kv_hits_validated"] > 0 and s["kv_hits_unvalidated"] == {}


def test_the_hits_line_names_both_reasons():
    from sim.cli.replay import _unvalidated

    s = {"hits_unvalidated": {"validate-every": 2}, "kv_hits_unvalidated": {"no attention layer replayed": 3}}
    assert _unvalidated(s) == "; not validated: validate-every 2; KV not checked: no attention layer replayed 3"
    assert _unvalidated({"kv_hits_unvalidated": {"never checked": 1}}) == "; KV not checked: never checked 1"


# ------------------------------------------------------------ interrupted, then run again


def _snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _interrupt_the_steps_write(monkeypatch):
    """Ctrl-C arriving while replay writes steps.parquet (requests.parquet written before it, the
    timing file before both, in the order replay writes them)."""
    import pandas as pd

    real = pd.DataFrame.to_parquet

    def to_parquet(self, path, *args, **kwargs):
        if "steps" in str(path).rsplit("/", 1)[-1]:
            raise KeyboardInterrupt
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)


def test_replay_interrupted_while_writing_leaves_no_partial_output_set(runner, tmp_path, monkeypatch):
    """`replay --out D --calibrate T` interrupted while it wrote D/steps.parquet left
    D/requests.parquet and T without D/summary.json: the rerun of the same command was refused
    ("--out: D/requests.parquet already exist; pass --force"), and `marconi plot D --kind replay`
    said D was no replay output. Now the set is renamed into place at once, with the stop signals
    held back: nothing of it is left, the line says so, and the rerun runs."""
    pytest.importorskip("torch")
    out, cal = tmp_path / "r", tmp_path / "t.json"
    args = ["replay", *SMALL, "--model", "replay-tiny", "--out", str(out), "--calibrate", str(cal)]
    with monkeypatch.context() as m:
        _interrupt_the_steps_write(m)
        res = runner.invoke(main, args)
    assert res.exit_code == 130, res.output
    assert res.output.strip().splitlines()[-1] == (
        f"Interrupted: nothing was written to --out {out} or --calibrate {cal}; a replay does not resume: "
        "rerun the same command to start over"
    )
    assert not cal.exists() and (not out.exists() or _snapshot(out) == {}), sorted(_snapshot(out))
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert sorted(_snapshot(out)) == ["requests.parquet", "steps.parquet", "summary.json"] and cal.is_file()


def test_replay_force_interrupted_while_writing_keeps_the_earlier_set_whole(runner, tmp_path, monkeypatch):
    """`replay --out D --force` over an earlier replay's D, interrupted while it wrote: the new
    requests.parquet stood beside the earlier summary.json (a folder that reads as one run and is
    two). Now D is the earlier set, byte for byte."""
    pytest.importorskip("torch")
    out = tmp_path / "r"
    args = ["replay", *SMALL, "--model", "replay-tiny", "--out", str(out)]
    assert runner.invoke(main, args).exit_code == 0
    before = _snapshot(out)
    with monkeypatch.context() as m:
        _interrupt_the_steps_write(m)
        res = runner.invoke(main, [*args, "--force", "--requests", "3"])
    assert res.exit_code == 130, res.output
    assert _snapshot(out) == before


def test_a_replay_interrupted_while_it_runs_says_a_rerun_starts_over(runner, tmp_path, monkeypatch):
    """Ctrl-C during the replay itself printed "Interrupted." alone: nothing said whether the rerun
    would resume (sweep and advise say they do) or what was left. Now the line says; without an
    output, that a rerun starts over."""
    pytest.importorskip("torch")
    import sim.replay.session as session

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "run_replay", stop)
    res = runner.invoke(main, ["replay", *SMALL, "--model", "replay-tiny", "--out", str(tmp_path / "new" / "r")])
    assert res.exit_code == 130
    assert res.output.strip() == (
        f"Interrupted: nothing was written to --out {tmp_path / 'new' / 'r'}; a replay does not resume: "
        "rerun the same command to start over"
    )
    assert not (tmp_path / "new").exists()
    res = runner.invoke(main, ["replay", *SMALL, "--model", "replay-tiny"])
    assert res.exit_code == 130 and res.output.strip() == (
        "Interrupted: a replay does not resume: rerun the same command to start over"
    )
    # both outputs named, the timing file alone too (mutation run, session 23: the --calibrate
    # half of the line survived)
    fit = tmp_path / "fit.json"
    res = runner.invoke(
        main, ["replay", *SMALL, "--model", "replay-tiny", "--out", str(tmp_path / "r2"), "--calibrate", str(fit)]
    )
    assert res.exit_code == 130 and res.output.strip() == (
        f"Interrupted: nothing was written to --out {tmp_path / 'r2'} or --calibrate {fit}; a replay does not "
        "resume: rerun the same command to start over"
    )
    res = runner.invoke(main, ["replay", *SMALL, "--model", "replay-tiny", "--calibrate", str(fit)])
    assert res.exit_code == 130 and res.output.strip().startswith(
        f"Interrupted: nothing was written to --calibrate {fit};"
    )
    assert not fit.exists() and not (tmp_path / "r2").exists()


# ------------------------------------------------------------ the replay figure on a CPU


def test_the_replay_figure_of_an_uncompared_run_shows_no_error():
    """`marconi plot DIR --kind replay` of a CPU replay titled its histogram "time-model error
    (median |err| 98.5 %)", the error against the H200 fit the table calls "not compared: the
    timing describes h200, this replay runs on the CPU". Now the panel says not compared, with the
    note, and draws no histogram; a compared run keeps both."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from sim.replay.output import fig_replay

    df = pd.DataFrame(
        dict(
            suffix_ms=[40.0, 20.0, 18.0], modelled_ms=[0.3, 0.28, 0.29], hit_tokens=[0, 100, 120],
            model_error=[-0.99, -0.986, -0.984], suffix_host_bound=[False, False, False],
        )
    )  # fmt: skip
    note = "not compared: the timing describes h200, this replay runs on the CPU"
    summary = {"time_model_median_error": 0.986, "time_model_compared": False, "time_model_note": note}
    _, panel = fig_replay(df, summary).axes
    assert panel.get_title() == "time-model error: not compared" and not panel.patches
    assert [" ".join(t.get_text().split()) for t in panel.texts] == [note]
    _, panel = fig_replay(df, dict(summary, time_model_compared=True, time_model_note="")).axes
    assert panel.get_title() == "time-model error (median |err| 98.6 %)"
    assert sum(p.get_height() for p in panel.patches) == 3


# ------------------------------------------------------------ conv widths the kernels cannot run

# a Qwen3-Next-like toy, as a user shrinks the published config
QNEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "torch_dtype": "bfloat16",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 256,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}


def _config(tmp_path, name: str, fields: dict) -> str:
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(fields))
    return str(tmp_path / name)


@pytest.mark.parametrize(
    "base, field, width, kernel, says",
    [
        (QNEXT, "linear_conv_kernel_dim", 1, [], "its gated-delta layers' conv width is 1; replay's causal conv"),
        (NEMO, "conv_kernel", 1, [], "its Mamba2 layers' conv width is 1; replay's causal conv"),
        (
            QNEXT,
            "linear_conv_kernel_dim",
            6,
            ["--kernel", "triton"],
            "its gated-delta layers' conv width is 6, and the Triton conv kernel (--kernel triton) runs widths 2 to 5; "
            "use --kernel torch",
        ),
        (
            NEMO,
            "conv_kernel",
            8,
            ["--kernel", "ours"],
            "its Mamba2 layers' conv width is 8, and the Triton conv kernel (--kernel triton) runs widths 2 to 5",
        ),
    ],
    ids=["gdn-1", "mamba2-1", "gdn-6-triton", "mamba2-8-triton"],
)
def test_a_conv_width_the_kernels_cannot_run_is_one_line(runner, tmp_path, base, field, width, kernel, says):
    """A config.json whose conv width is 1 (no conv window), or above the Triton conv kernel's 5
    (the GPU's default backend; --kernel triton on a CPU), loaded the trace and stopped inside the
    replay with the kernel's ValueError ("weight must be [D, W] with 2 <= W <= 5"): a traceback,
    exit 1. `marconi models` reads these configs, `run` simulates them; replay now refuses them up
    front in one line, before any output folder is made."""
    model = _config(tmp_path, "m", dict(base, **{field: width}))
    out = tmp_path / "o"
    res = runner.invoke(main, ["replay", *SMALL, "--model", model, *kernel, "--out", str(out)])
    _one_line(res, f"model {model}: {says}")
    assert not out.exists()


def test_a_wide_conv_runs_on_the_torch_backend(tmp_path):
    from sim.replay.session import check_kernel_shapes

    spec = get_model(_config(tmp_path, "m", dict(QNEXT, linear_conv_kernel_dim=6)))
    check_kernel_shapes(spec, "torch")  # plain torch runs any width >= 2
    with pytest.raises(UsageError, match="runs widths 2 to 5"):
        check_kernel_shapes(spec, "fla")  # the peers keep the project's Triton conv
    for w in (2, 5):
        check_kernel_shapes(get_model(_config(tmp_path, f"w{w}", dict(QNEXT, linear_conv_kernel_dim=w))), "triton")


@pytest.mark.parametrize(
    "base, fields, says",
    [
        (QNEXT, {"linear_key_head_dim": 288}, "its gated-delta layers' key head dim is 288"),
        (QNEXT, {"linear_value_head_dim": 320}, "its gated-delta layers' value head dim is 320"),
        (NEMO, {"mamba_head_dim": 320, "mamba_num_heads": 2}, "its Mamba2 layers' head dim is 320"),
        (NEMO, {"ssm_state_size": 300}, "its Mamba2 layers' state dim is 300"),
    ],
    ids=["gdn-k", "gdn-v", "mamba2-p", "mamba2-n"],
)
def test_a_head_dim_the_triton_kernels_cannot_run_is_one_line(runner, tmp_path, base, fields, says):
    """The Triton kernels (a GPU's default) run head dims up to 256 (and a Mamba2 state dim up to
    256): a config.json with a 288-wide key head stopped inside the replay with "ValueError: head
    dim K=288 is not supported" (the SSD's "headdim=320 is not supported"), a traceback. Refused
    up front in one line; the torch backend runs them."""
    model = _config(tmp_path, "m", dict(base, **fields))
    res = runner.invoke(main, ["replay", *SMALL, "--model", model, "--kernel", "triton"])
    text = _one_line(res, f"model {model}: {says}")
    assert text.endswith("and the Triton kernels (--kernel triton) run up to 256; use --kernel torch")
    from sim.replay.session import check_kernel_shapes

    check_kernel_shapes(get_model(model), "torch")


# ------------------------------------------------ a CPU-fitted timing file with --gpu / --tensor-parallel


@pytest.fixture
def cpu_fit(tmp_path):
    """A timing file as `marconi replay --device cpu --calibrate` writes one: no GPU named, fitted
    in fp32 (the committed H200 fit with its device taken out and its dtype changed)."""
    from pathlib import Path

    import sim

    d = json.loads((Path(sim.__file__).parent / "data" / "h200-timing.json").read_text())
    d.pop("device")
    d["dtype"] = "fp32"
    path = tmp_path / "cpu-fit.json"
    path.write_text(json.dumps(d))
    return path


NO_GROUP = "--tensor-parallel 2 needs the GPU timing file {f} was calibrated on (to price its all-reduces), "
NO_GPU = "--gpu h100 does nothing with timing file {f} (it names no GPU: its times are used as they are)"


@pytest.mark.parametrize(
    "flags, says", [(["--tensor-parallel", "2"], NO_GROUP), (["--gpu", "h100"], NO_GPU)], ids=["tp", "gpu"]
)
def test_a_cpu_fit_with_a_gpu_group_is_one_line_before_any_work(runner, tmp_path, cpu_fit, flags, says):
    """`marconi replay --device cpu --calibrate t.json`, then `run --timing t.json --tensor-parallel
    2` (or `--gpu h100`): the refusal came from building the simulation, so `run` printed the
    file's fp32 warning above it (two lines; with --gpu a progress bar too), `sweep` printed its
    grid and "already done: 0, to run: 3" and made its --out folder, `advise` started its search.
    Now each refuses in one line before the trace is loaded."""
    common = ["--model", "qwen3.5-9b", "--trace", TINY, "--timing", str(cpu_fit), *flags, "--no-progress"]
    says = says.format(f=cpu_fit)
    res = runner.invoke(main, ["run", *common, "--policy", "marconi"])
    _one_line(res, says)
    out = tmp_path / "sw"
    res = runner.invoke(main, ["sweep", *common, "--policy", "sglang+,marconi", "--out", str(out)])
    _one_line(res, says)
    assert not out.exists()


def test_advise_refuses_a_cpu_fit_on_a_gpu_group_before_its_search(runner, cpu_fit, tmp_path):
    pytest.importorskip("optuna")
    args = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", "--trace", TINY, "--timing", str(cpu_fit)]
    out = tmp_path / "advise"  # where a search would go (the default ./advise: the repository, when the check failed)
    res = runner.invoke(main, [*args, "--tensor-parallel", "2", "--trials", "2", "--no-progress", "--out", str(out)])
    _one_line(res, NO_GROUP.format(f=cpu_fit))
    assert not out.exists()  # refused before the search made its folder


def test_a_cpu_fit_alone_is_used_and_its_dtype_said_once(runner, cpu_fit):
    res = runner.invoke(
        main, ["run", "--model", "qwen3.5-9b", "--trace", TINY, "--timing", str(cpu_fit), "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    lines = [x for x in res.output.splitlines() if x.startswith("warning: timing file")]
    assert lines == [
        f"warning: timing file {cpu_fit} was fitted in fp32, and qwen3.5-9b runs in bf16: its times are the fp32 "
        "fit's as they are (fit one in bf16: marconi replay --dtype bf16 --calibrate FILE)"
    ]


# ------------------------------------------------ a replay of nothing, and standard JSON


def _strict(text: str) -> dict:
    """JSON as strict parsers read it (NaN and Infinity are not JSON)."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("scheduler", ["fcfs", "continuous"])
def test_a_replay_whose_engine_aborts_every_request_summarises_none(runner, tmp_path, scheduler):
    """`--policy sglang --capacity 20KB`: the engine preset aborts every prompt at arrival (longer
    than its KV pool), so no request is replayed, and the summary stopped with "KeyError: 'full_ms'"
    (a traceback, exit 1) reading a request table without columns. Now it is a summary of 0
    requests that names the 4 aborted, and its JSON is standard (null where it wrote NaN)."""
    pytest.importorskip("torch")
    out = tmp_path / "r"
    args = ["replay", *SMALL, "--model", "replay-tiny", "--policy", "sglang", "--capacity", "20KB"]
    res = runner.invoke(main, [*args, "--scheduler", scheduler, "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    s = _strict(res.output)
    assert s["requests"] == s["hits"] == s["failures"] == 0 and s["aborted_requests"] == 4
    assert s["time_model_median_error"] is None
    assert _strict((out / "summary.json").read_text())["summary"] == s
    res = runner.invoke(main, [*args, "--scheduler", scheduler])
    assert res.exit_code == 0, res.output
    line = [x for x in res.output.splitlines() if x.startswith("requests")][0]
    assert line.split("  ")[-1].strip() == (
        "0 (0 input tokens); 4 more aborted at arrival (prompt longer than the engine takes), not replayed"
    )


def test_a_batched_replays_json_is_standard(runner, tmp_path):
    """A batched replay (--mode sequential --batch 4) times no request alone: its time-model
    errors are NaN, written as `NaN` in --format json and summary.json; now null."""
    pytest.importorskip("torch")
    out = tmp_path / "b"
    args = ["replay", *SMALL, "--model", "replay-tiny", "--mode", "sequential", "--batch", "4", "--out", str(out)]
    res = runner.invoke(main, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    s = _strict(res.output)
    assert s["time_model_median_error"] is None and s["hits"] > 0
    assert _strict((out / "summary.json").read_text())["summary"]["time_model_p95_error"] is None


def test_the_replay_figure_of_no_timed_prefill_says_so_without_a_warning(recwarn):
    """`marconi plot DIR --kind replay` of a replay that replayed no request (every one aborted at
    arrival) printed matplotlib's "UserWarning: No artists with labels found to put in legend" on
    stderr; now the panel says there was no timed prefill."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from sim.replay.output import fig_replay

    cols = ["suffix_ms", "modelled_ms", "hit_tokens", "model_error", "suffix_host_bound"]
    scatter, _ = fig_replay(pd.DataFrame(columns=cols), {"time_model_compared": False}).axes
    assert [t.get_text() for t in scatter.texts] == ["no timed prefill"] and scatter.get_legend() is None
    assert not [w for w in recwarn if "legend" in str(w.message)]


# ------------------------------------------------ a timing file of a config, used from another folder


def test_a_config_fit_goes_with_its_model_from_another_folder(tmp_path, monkeypatch):
    """`marconi replay --model cfg/qnext --calibrate t.json` in one folder, then from another
    `marconi run --model /abs/cfg/qnext --timing /abs/t.json`: "timing file t.json was calibrated for
    cfg/qnext, not /abs/cfg/qnext" (the file recorded the path as spelled, read from the current
    folder). The file now records the model's shapes too, so the same model matches in any
    spelling, from anywhere, after the config moved; another model is still refused."""
    from sim.cost import HardwareTiming, read_timing_file
    from sim.replay.measure import write_timing

    work = tmp_path / "work"
    work.mkdir()
    _config(work, "qnext", QNEXT)
    _config(work, "other", dict(QNEXT, hidden_size=256))
    monkeypatch.chdir(work)
    t = HardwareTiming(
        ms_per_tflop={
            "attn_linear": 2.0,
            "attn_quadratic": 4.0,
            "gdn_linear": 2.5,
            "gdn_chunk": 9.0,
            "mlp_linear": 1.6,
        },
        layer_call_ms={"attention": 0.05, "gated_delta": 0.09, "mlp": 0.03},
        call_ms=0.4,
        decode_ms_per_token=5.0,
    )
    path = work / "t.json"
    write_timing(path, t, get_model("qnext"), {"median_error": 0.1})
    assert json.loads(path.read_text())["model"] == "qnext"
    read_timing_file(path, model="qnext")  # as spelled
    monkeypatch.chdir(tmp_path)  # elsewhere: the recorded "qnext" reads nothing here
    assert read_timing_file(path, model=str(work / "qnext")).ms_per_tflop["gdn_chunk"] == 9.0
    assert read_timing_file(path, model=str(work / "qnext" / "config.json")).call_ms == 0.4
    (work / "qnext").rename(work / "moved")
    read_timing_file(path, model=str(work / "moved"))
    with pytest.raises(UsageError, match=r"was calibrated for qnext, not .*other$"):
        read_timing_file(path, model=str(work / "other"))
    with pytest.raises(UsageError, match="was calibrated for qnext, not qwen3.5-9b$"):
        read_timing_file(path, model="qwen3.5-9b")
    # a preset's file records no shapes: its name is its identity
    write_timing(tmp_path / "p.json", t, get_model("replay-tiny"), {})
    assert "model_spec" not in json.loads((tmp_path / "p.json").read_text())
    # and a config's file never goes with a preset, even one of the same shapes (mutation run,
    # session 23: the preset rule's "or" as "and" survived)
    twin = dataclasses.replace(get_model("replay-tiny"), name=str(work / "twin"))
    write_timing(tmp_path / "c.json", t, twin, {})
    assert "model_spec" in json.loads((tmp_path / "c.json").read_text())
    with pytest.raises(UsageError, match="was calibrated for .*twin, not replay-tiny$"):
        read_timing_file(tmp_path / "c.json", model="replay-tiny")


@pytest.mark.parametrize("store", ["gpu", "host"])
def test_summary_json_names_the_store_the_header_names(runner, tmp_path, store):
    """A CPU replay's header says "store cpu" (the checkpoints sit in the CPU's memory whatever
    --store asks), and summary.json's settings said "store": "gpu" (the option's default): the two
    outputs disagreed. Now settings["store"] is where it ran, ``store_requested`` what was asked."""
    pytest.importorskip("torch")
    out = tmp_path / "r"
    res = runner.invoke(main, ["replay", *SMALL, "--model", "replay-tiny", "--store", store, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].endswith("| store cpu")
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert (settings["store"], settings["store_requested"]) == ("cpu", store)


def test_a_seed_beyond_64_bits_is_one_line(runner, tmp_path):
    """`--seed 99999999999999999999` reached torch's generator and stopped with "ValueError:
    Overflow when unpacking long long" (a traceback) after the trace was loaded; the largest seed
    torch takes, 2^64 - 1, runs."""
    out = tmp_path / "o"
    res = runner.invoke(main, ["replay", *SMALL, "--model", "replay-tiny", "--seed", str(1 << 64), "--out", str(out)])
    _one_line(res, f"--seed must be below 2^64 = {1 << 64} (torch seeds the replayed weights with 64 bits)")
    assert not out.exists()
    pytest.importorskip("torch")
    res = runner.invoke(
        main, ["replay", *SMALL, "--model", "replay-tiny", "--seed", str((1 << 64) - 1), "--requests", "2"]
    )
    assert res.exit_code == 0, res.output


def test_the_saved_line_of_a_replay_without_hits_has_no_share_note():
    """A replay with no validated hit (trtllm's default placements: no reuse) printed "measured 0.0
    ms, modelled 0.0 ms (0.0% of the prefill time without the cache: a difference of two totals, each
    within the time model's error, so the two may differ even in sign)": nothing was saved, and
    nothing differs in sign. The note stays for a small saving of real hits."""
    from sim.cli.replay import saved_line

    none = dict(
        measured_ms_saved_validated=0.0,
        modelled_ms_saved_validated=0.0,
        measured_ms_without_cache=900.0,
        hits_validated=0,
    )
    assert saved_line(none) == "measured 0.0 ms, modelled 0.0 ms"
    small = dict(none, measured_ms_saved_validated=9.0, modelled_ms_saved_validated=-2.0, hits_validated=3)
    assert saved_line(small).startswith("measured 9.0 ms, modelled -2.0 ms (1.0% of the prefill time without the cache")


def test_replays_progress_switch_says_what_it_is(runner):
    """91c577d gave every command's --progress/--no-progress its help but replay's."""
    text = " ".join(runner.invoke(main, ["replay", "--help"]).output.split())
    assert "--progress / --no-progress A progress bar on stderr. [default: progress]" in text


def test_every_preset_passes_the_kernel_shape_check():
    """The presets a GPU replays on the Triton backend pass ``check_kernel_shapes`` (8c26017 read
    marconi-7b's Mamba2 head dim as its whole d_inner, 8192, where the preset names no heads and
    the replay makes 64-wide ones: it refused the preset on a GPU)."""
    from sim.cost import MODELS
    from sim.replay.session import check_kernel_shapes

    for name in MODELS:
        for backend in ("triton", "torch"):
            check_kernel_shapes(get_model(name), backend)


def test_a_timing_file_missing_a_term_is_named(runner, tmp_path):
    """A timing file without one of its terms (gdn_chunk taken out) said "Error: timing: terms must
    be attn_linear, ..." without naming the file (run, replay, sweep and advise read it)."""
    from pathlib import Path

    import sim

    d = json.loads((Path(sim.__file__).parent / "data" / "h200-timing.json").read_text())
    del d["ms_per_tflop"]["gdn_chunk"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    res = runner.invoke(main, ["run", "--trace", TINY, "--no-progress", "--timing", str(bad)])
    _one_line(res, f"timing file {bad}: terms must be attn_linear, attn_quadratic, gdn_linear, gdn_chunk, mlp_linear")
    res = runner.invoke(main, ["replay", *SMALL, "--model", "replay-tiny", "--timing", str(bad)])
    _one_line(res, f"timing file {bad}: terms must be")


def test_a_forced_rerun_under_fcfs_removes_the_earlier_continuous_steps(runner, tmp_path):
    """``--force`` into a folder of a continuous replay: its steps.parquet is the earlier run's, and
    an fcfs replay writes none, so it goes (mutation run, session 23: ``res.steps is not None``
    negated survived); the continuous rerun writes its own."""
    pytest.importorskip("torch")
    out = tmp_path / "r"
    res = runner.invoke(
        main, ["replay", *SMALL, "--model", "replay-tiny", "--scheduler", "continuous", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert (out / "steps.parquet").is_file()
    res = runner.invoke(
        main, ["replay", *SMALL, "--model", "replay-tiny", "--scheduler", "fcfs", "--out", str(out), "--force"]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["requests.parquet", "summary.json"]
