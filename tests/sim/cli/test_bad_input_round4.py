"""The fourth round of bad inputs (a new user's audit of the newest features: ``--model PATH``,
``--gpu``, ``--tensor-parallel``, the traces commands), through the real CLI: every refusal is one
line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import UsageError
from refusals import one_line as _one_line

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
H200_TIMING = Path(__file__).resolve().parents[3] / "sim" / "data" / "h200-timing.json"


def _config(tmp_path: Path, fixture: str, text: str | None = None, **fields) -> Path:
    """A fixture config with ``fields`` replaced (``...``: removed), or ``text`` as the file."""
    path = tmp_path / "config.json"
    if text is None:
        cfg = json.loads((CONFIGS / fixture).read_text())
        for k, v in fields.items():
            cfg.pop(k, None) if v is ... else cfg.__setitem__(k, v)
        text = json.dumps(cfg)  # NaN / Infinity written as json writes them (and reads them back)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "fixture, fields, message",
    [
        (
            "nemotron-h-8b.json",
            {"hidden_size": float("nan")},
            "field 'hidden_size' must be a whole number >= 1, not nan",
        ),
        (
            "nemotron-h-8b.json",
            {"hidden_size": float("inf")},
            "field 'hidden_size' must be a whole number >= 1, not inf",
        ),
        ("nemotron-h-8b.json", {"num_hidden_layers": 0}, "field 'num_hidden_layers' must be >= 1, not 0"),
        ("qwen3-next-80b-a3b.json", {"full_attention_interval": 0}, "field 'full_attention_interval' must be >= 1"),
        ("qwen3-next-80b-a3b.json", {"mlp_only_layers": 5}, "field 'mlp_only_layers' must be a list of layer numbers"),
        ("qwen3-next-80b-a3b.json", {"mlp_only_layers": ["a"]}, "field 'mlp_only_layers' must be a list of layer"),
        ("falcon-h1-7b.json", {"mamba_d_ssm": "x"}, "field 'mamba_d_ssm' must be a whole number >= 0, not 'x'"),
        ("falcon-h1-7b.json", {"mamba_d_ssm": -5}, "field 'mamba_d_ssm' must be a whole number >= 0, not -5"),
        ("nemotron-h-8b.json", {"num_key_value_heads": 3}, "field 'num_key_value_heads' (3) must divide"),
        ("qwen3-next-80b-a3b.json", {"num_experts_per_tok": 600}, "field 'num_experts_per_tok' (600) is more than"),
    ],
    ids=[
        "nan",
        "infinity",
        "no-layers",
        "interval-0",
        "mlp-only-int",
        "mlp-only-str",
        "d-ssm-str",
        "d-ssm-neg",
        "kv-not-dividing",
        "top-k-over-experts",
    ],
)
def test_config_fields_that_crashed_or_passed_are_one_line(runner, tmp_path, fixture, fields, message):
    path = _config(tmp_path, fixture, **fields)
    for args in (["models", str(path)], ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--model", str(path)]):
        _one_line(
            runner.invoke(main, [*args, "--no-progress"] if args[0] == "run" else args),
            f"model config {path}: {message}",
        )


@pytest.mark.parametrize("command", ["prepare", "stats"])
@pytest.mark.parametrize("flag, shown", [("--no-progress", False), ("--progress", True), (None, True)])
def test_traces_commands_take_no_progress(runner, monkeypatch, command, flag, shown):
    """``traces prepare`` / ``stats`` had no --no-progress (refused as an unknown option), so a
    large file's reading bar (or the tokenizing bar) could not be silenced as in run / sweep."""
    import traces.jsonl

    monkeypatch.setattr(traces.jsonl, "PROGRESS_BYTES", 0)  # the bundled sample counts as large
    res = runner.invoke(main, ["traces", command, "--trace", "mooncake:sample", *([flag] if flag else [])])
    assert res.exit_code == 0, res.output
    assert ("reading mooncake" in res.output) == shown, res.output


@pytest.mark.parametrize(
    "args, words",
    [
        ([], None),  # the preset's own timing: the header as it always was
        (["--gpu", "h200"], "capacity 5GB | GPU 1x h200 | "),  # calibrated: said nothing of the GPU
        (["--gpu", "l40s"], "capacity 5GB | GPU 1x l40s | "),
        (["--tensor-parallel", "2"], "capacity 5GB | GPU 2x h200 | "),  # said nothing of the group
        (["--tensor-parallel", "4", "--gpu", "h100"], "capacity 5GB | GPU 4x h100 | "),
        (["--timing", str(H200_TIMING)], f"capacity 5GB | timing {H200_TIMING} | "),  # said nothing of it
    ],
    ids=["default", "calibrated", "uncalibrated", "tp", "tp-gpu", "timing-file"],
)
def test_run_header_names_the_gpus_or_the_timing_file(runner, args, words):
    base = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    res = runner.invoke(main, [*base, "--model", "qwen3.5-9b", *args])
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[0]
    assert ("GPU " in header.replace("for GPU", "") or "| timing " in header) == (words is not None), header
    if words:
        assert words in header, header


@pytest.mark.parametrize("device, gpu, ok", [(None, None, True), (None, "h100", False), ("h100", "h100", True)])
def test_gpu_with_a_timing_file_that_names_no_gpu_is_refused(runner, tmp_path, device, gpu, ok):
    """A timing file that names no GPU (``replay --calibrate`` on the CPU writes one) is used as it
    is: --gpu beside it changed nothing (same times, no word in the header) and is refused."""
    timing = {"format": "marconi-timing/1", "effective_tflops": 100.0, "overhead_ms": 1.0, "decode_ms_per_token": 5.0}
    if device:
        timing["device"] = device
    path = tmp_path / "t.json"
    path.write_text(json.dumps(timing))
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    res = runner.invoke(main, [*args, "--timing", str(path), *(["--gpu", gpu] if gpu else [])])
    if ok:
        assert res.exit_code == 0, res.output
    else:
        _one_line(res, f"--gpu {gpu} does nothing with timing file {path} (it names no GPU")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_outputs_onto_a_model_config_are_refused_even_with_force(runner, tmp_path):
    """``--model PATH`` is an input like the trace: ``--events`` / ``--calibrate`` onto it (with
    --force) replaced the user's config.json with events or a timing file."""
    folder = tmp_path / "nemotron"
    folder.mkdir()
    config = folder / "config.json"
    shutil.copy(CONFIGS / "nemotron-h-8b.json", config)
    before = _sha(config)
    small = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
    res = runner.invoke(main, ["run", *small, "--model", str(config), "--events", str(config), "--force"])
    _one_line(res, f"--events {config}: is an input of this command")
    res = runner.invoke(main, ["run", *small, "--model", str(folder), "--out", str(folder)])
    _one_line(res, f"--out {folder / 'summary.json'}: is inside {folder}, which is an input")
    args = ["replay", *small, "--device", "cpu", "--model", str(folder), "--calibrate", str(config), "--force"]
    _one_line(runner.invoke(main, args), f"--calibrate {config}: is inside {folder}, which is an input")
    res = runner.invoke(main, ["sweep", *small, "--model", f"marconi-7b,{folder}", "--out", str(folder / "rows")])
    _one_line(res, f"--out {folder / 'rows'}: is inside {folder}, which is an input")
    res = runner.invoke(main, ["advise", "--for", "sglang", *small, "--model", str(folder), "--out", str(folder)])
    _one_line(res, f"--out {folder}: is an input of this command")
    assert _sha(config) == before and sorted(p.name for p in folder.iterdir()) == ["config.json"]


def test_an_out_folder_of_another_commands_results_is_refused(runner, tmp_path):
    """``run --out`` into a sweep's folder put summary.json beside the rows: ``report`` then showed
    the run alone (the sweep's rows hidden) and the sweep's resume and ``plot`` stopped at the run's
    parquet files; advise's journal went in the same way. Each command keeps to its own kind."""
    small = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
    cmds = {
        "sweep": ["sweep", *small, "--policy", "marconi", "--workers", "1"],
        "run": ["run", *small, "--policy", "marconi"],
        "advise": ["advise", "--for", "sglang", *small, "--trials", "1", "--workers", "1"],
    }
    for kind, args in cmds.items():
        assert runner.invoke(main, [*args, "--out", str(tmp_path / kind)]).exit_code == 0
    before = _hashes(tmp_path)
    holds = {
        "sweep": "holds the rows of `marconi sweep`",
        "run": "holds the results of `marconi run` / `replay` (summary.json)",
        "advise": "holds a `marconi advise` study (study.journal)",
    }
    replay = ["replay", *small, "--device", "cpu", "--model", "replay-tiny", "--requests", "2"]
    for kind, args in [*cmds.items(), ("run", replay)]:
        for other in cmds:
            if other != kind:
                res = runner.invoke(main, [*args, "--out", str(tmp_path / other)])
                _one_line(
                    res, f"--out {tmp_path / other}: {holds[other]}; write this command's results to another folder"
                )
    assert _hashes(tmp_path) == before


def _hashes(root: Path) -> dict:
    return {str(p): _sha(p) for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def test_plot_of_a_run_folder_points_to_report(runner, tmp_path):
    """``plot`` of a ``run --out`` folder told the user to move the run's own occupancy.parquet out."""
    out = tmp_path / "run"
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    assert runner.invoke(main, [*args, "--out", str(out)]).exit_code == 0
    res = runner.invoke(main, ["plot", str(out), "--out", str(tmp_path / "figs")])
    _one_line(res, f"{out} holds the results of `marconi run` / `replay` (summary.json), not the rows of `marconi")
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--policy", "sglang", "--gpu", "h100", "--gpu-memory", "81GiB"], "--gpu-memory 81GiB is more than"),
        (["sweep", "--policy", "sglang", "--gpu", "h200,h100", "--gpu-memory", "100GB"], "--gpu-memory 100GB is more"),
        (
            ["advise", "--for", "sglang", "--model", "qwen3.5-9b", "--gpu", "h100", "--gpu-memory", "500GB"],
            "--gpu-memory",
        ),
    ],
    ids=["run", "sweep", "advise"],
)
def test_gpu_memory_beyond_the_gpus_is_refused(runner, tmp_path, args, message):
    """--gpu-memory is the memory of the --gpu group: 500GB on one H100 was priced as if it held it."""
    small = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
    res = runner.invoke(main, [*args, *small, "--out", str(tmp_path / "o")])
    _one_line(res, message)
    assert (
        "the memory of 1x h100 (80GiB = 85.9GB): lower it, or give --tensor-parallel for a larger group" in res.output
    )
    assert not (tmp_path / "o").exists()


def test_gpu_memory_within_the_group_and_the_default_group(runner, tmp_path):
    """What is left beside the weights runs (run's --gpu-memory is the memory after them): 66GB
    beside marconi-7b's 14GB on one H100, 142GB beside qwen3.5-9b's 18GB on --tensor-parallel 2 of
    them (80GB and 150GB ran before session 21, more than the GPUs hold with the weights). advise's
    default --gpu-memory on --gpu is the memory of the group the timing prices (the preset's count
    when --tensor-parallel is 0): qwen3.5-397b-a17b on H200 is 8 of them (was one: 'leaves no cache')."""
    small = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
    for extra in (
        ["--gpu-memory", "66GB"],
        ["--model", "qwen3.5-9b", "--tensor-parallel", "2", "--gpu-memory", "142GB"],
    ):
        res = runner.invoke(main, ["run", *small, "--policy", "sglang", "--gpu", "h100", *extra])
        assert res.exit_code == 0, res.output
    args = ["advise", "--for", "sglang", *small, "--model", "qwen3.5-397b-a17b", "--gpu", "h200", "--trials", "1"]
    res = runner.invoke(main, [*args, "--workers", "1", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "| model qwen3.5-397b-a17b | GPU 8x h200 | --gpu-memory 1128GiB = 1211GB: " in res.output.splitlines()[0]


def test_a_sweep_row_whose_model_config_was_edited_is_recomputed(runner, tmp_path):
    """A row is computed from the model's config.json as from its trace: edited, the row was kept
    as 'already done' (numbers of the old model); now it is recomputed, and an unchanged one kept."""
    folder = tmp_path / "model"
    folder.mkdir()
    cfg = json.loads((CONFIGS / "toy-mamba2-hybrid.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "rows"
    args = ["sweep", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    args += ["--model", f"{folder},marconi-7b", "--out", str(out), "--workers", "1"]
    assert runner.invoke(main, args).exit_code == 0
    res = runner.invoke(main, args)
    assert "already done: 2, to run: 0" in res.output, res.output
    cfg["hidden_size"] *= 2
    (folder / "config.json").write_text(json.dumps(cfg))
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "already done: 1, to run: 1" in res.output and "or the model's config.json" in res.output, res.output


def test_an_advise_study_on_an_edited_model_config_starts_again(runner, tmp_path):
    pytest.importorskip("optuna")
    folder = tmp_path / "model"
    folder.mkdir()
    cfg = json.loads((CONFIGS / "toy-mamba2-hybrid.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "adv"
    args = ["advise", "--for", "sglang", "--trace", "synthetic:chat:sessions=2,turns=2", "--model", str(folder)]
    args += ["--trials", "1", "--workers", "1", "--out", str(out), "--no-progress"]
    assert runner.invoke(main, args).exit_code == 0
    res = runner.invoke(main, args)
    assert res.exit_code == 0 and "note:" not in res.output, res.output
    cfg["hidden_size"] *= 2
    (folder / "config.json").write_text(json.dumps(cfg))
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert f"the study in {out} ran (or the model's config.json" in res.output
    assert (out / "study.journal.stale-1").is_file()


@pytest.mark.parametrize("spec", ["swebench:hf:", "swebench:hf::test", "swebench:marconi:hf:"])
@pytest.mark.parametrize("command", [["traces", "stats"], ["traces", "prepare"], ["run"]])
def test_a_hub_trace_without_a_dataset_name_is_one_line(runner, spec, command):
    """'swebench:hf:' went to the hub with an empty name: 'cannot load  from the Hugging Face hub
    (IndexError: list index out of range)'."""
    res = runner.invoke(main, [*command, "--trace", spec, "--no-progress"])
    _one_line(res, "swebench:hf: needs a dataset name: --trace swebench:hf:DATASET[:SPLIT]")


@pytest.mark.parametrize(
    "args, grid",
    [
        (
            ["--policy", "marconi,sglang+"],
            "grid: policy(2) = 2 configurations | trace {t} | model marconi-7b | capacity 5GB",
        ),
        (
            ["--policy", "marconi", "--model", "qwen3.5-9b,nemotron-h-8b", "--capacity", "2GB", "--gpu", "h200"],
            "grid: model(2) = 2 configurations | trace {t} | capacity 2GB | GPU h200",
        ),
        (
            ["--policy", "sglang", "--gpu-memory", "40GB,60GB", "--gpu", "b200"],
            "grid: gpu_memory(2) = 2 configurations | trace {t} | model marconi-7b | GPU b200 | uncalibrated for GPU b200",
        ),
    ],
    ids=["policies", "models", "gpu-memory"],
)
def test_the_sweep_grid_line_says_what_every_configuration_shares(runner, tmp_path, args, grid):
    """The grid line named only what varied: a sweep's output never said its trace, model or capacity."""
    trace = "synthetic:chat:sessions=2,turns=2"
    res = runner.invoke(
        main, ["sweep", "--trace", trace, "--no-progress", *args, "--dry-run", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == grid.format(t=trace)


def test_replay_on_cpu_of_a_mamba_only_config_warns_not_crashes(runner, monkeypatch):
    """--device cpu with a wide Mamba2-only model (Codestral Mamba's config.json) divided by its
    attention + gated-delta layers (0) for the time warning: ZeroDivisionError. The replay itself is
    stopped right after the warning (a wide model's CPU replay runs in
    test_bad_input_round2.test_replay_on_cpu_warns_of_a_wide_model)."""
    pytest.importorskip("torch")
    import sim.replay.session as session

    def stop(*a, **k):
        raise UsageError("stopped after the warning")

    monkeypatch.setattr(session, "run_replay", stop)
    args = ["replay", "--trace", "synthetic:chat:sessions=1,turns=1", "--device", "cpu", "--requests", "1"]
    args += ["--layers", "1", "--no-progress", "--format", "json", "--model", str(CONFIGS / "mamba-codestral-7b.json")]
    res = runner.invoke(main, args)
    assert res.exit_code == 2 and "stopped after the warning" in res.stderr, res.output
    warning = res.stderr.strip().splitlines()[:-1]
    assert len(warning) == 1 and " (d_model 4096) will take about " in warning[0], warning
    assert "for 1 request of 1 layer (0.14 TFLOP of from-scratch prefills" in warning[0], warning


def test_run_header_with_the_jamba_ttft_table_names_it_and_the_gpu(runner):
    """--ttft-model jamba --gpu l40s decodes (and so schedules) at the L40S's scaled figures, but the
    header said nothing of the table, the GPU or the datasheet scaling."""
    args = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    res = runner.invoke(main, [*args, "--ttft-model", "jamba", "--gpu", "l40s"])
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[0]
    assert "| capacity 5GB | GPU 1x l40s | des, fcfs (1 server) |" in header, header  # jamba's table: fcfs
    assert header.endswith("| TTFT from the paper's Jamba-1.5-Mini table (A100); uncalibrated for GPU l40s"), header


def test_an_out_folder_named_like_the_preset_is_not_an_input(runner, tmp_path, monkeypatch):
    """``--model qwen3.5-9b --out qwen3.5-9b``: the preset is the preset (get_model's order) even
    once a folder of its name exists, so that folder is no input and a rerun resumes in it."""
    monkeypatch.chdir(tmp_path)
    small = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "marconi"]
    res = runner.invoke(main, ["run", *small, "--model", "qwen3.5-9b", "--out", "qwen3.5-9b"])
    assert res.exit_code == 0, res.output
    args = ["sweep", *small, "--model", "marconi-7b", "--out", "marconi-7b", "--workers", "1"]
    assert runner.invoke(main, args).exit_code == 0
    res = runner.invoke(main, args)
    assert res.exit_code == 0 and "already done: 1, to run: 0" in res.output, res.output


@pytest.mark.parametrize(
    "spec, message",
    [
        ("synthetic:chat:turns=0", "synthetic:chat: turns must be >= 1 (got 0)"),
        ("synthetic:chat:turns=2.5", "synthetic:chat: turns must be a whole number (got 2.5)"),
        ("synthetic:agent:prompts=0", "synthetic:agent: prompts must be >= 1 (got 0)"),
        ("synthetic:chat:vocab=1", "synthetic:chat: vocab must be >= 2 (got 1)"),
        ("synthetic:chat:sessions=2.5", "synthetic:chat: sessions must be a whole number (got 2.5)"),
    ],
)
def test_synthetic_parameters_read_as_something_else_are_refused(runner, spec, message):
    """turns=0 ran one turn, turns=2.5 two, prompts=0 one, vocab=1 two: said nowhere."""
    _one_line(runner.invoke(main, ["traces", "stats", "--trace", spec, "--no-progress"]), message)


def test_synthetic_whole_valued_floats_and_zero_shots_still_run(runner):
    for spec in ("synthetic:chat:turns=3.0,sessions=2", "synthetic:few-shot:shots=0,sessions=2"):
        res = runner.invoke(main, ["traces", "stats", "--trace", spec, "--no-progress", "--format", "json"])
        assert res.exit_code == 0, res.output


def test_a_sharegpt_file_under_the_marconi_swebench_construction_is_one_line(runner, tmp_path):
    """`swebench:marconi:` read a ShareGPT JSON (a top-level list of conversation records) as one
    trajectory whose 'messages' were the records, and ran on it."""
    path = tmp_path / "sharegpt.json"
    convs = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    path.write_text(json.dumps([{"id": "a", "conversations": convs}, {"id": "b", "conversations": convs}]))
    res = runner.invoke(main, ["run", "--trace", f"swebench:marconi:{path}", "--no-progress"])
    _one_line(
        res,
        f"{path}: holds ShareGPT conversations, not one trajectory's messages (use --trace sharegpt:PATH)",
    )


def test_gpu_names_are_not_case_sensitive(runner):
    """`run --gpu H200` was refused ("'H200' is not one of ... 'h200'") where sweep took it."""
    args = ["run", "--trace", "synthetic:chat:sessions=3,turns=2", "--policy", "marconi", "--no-progress"]
    upper = runner.invoke(main, [*args, "--gpu", "H200"])
    lower = runner.invoke(main, [*args, "--gpu", "h200"])
    assert upper.exit_code == 0 and "GPU 1x h200" in upper.output, upper.output
    assert upper.output == lower.output
