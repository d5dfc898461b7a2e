"""The sixth round of bad inputs ("what users see"): an option given twice, ranges stated as they
are, a dense model given a state pool, and the newest features tried as a new user would
(``--model PATH``, ``--gpu`` / ``--tensor-parallel``, ``plot --kind misses``, ``advise``'s memory,
``models PATH``), through the real CLI in process: every refusal is one line on stderr and exit 2,
never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from sim.cli import main
from refusals import one_line as _one_line

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "tests" / "data" / "configs"
SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]


# ------------------------------------------------------------------------- an option given twice


def _commands(group: click.Group, path: tuple = ()):
    for name, cmd in sorted(group.commands.items()):
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


def _single_value_options():
    for path, cmd in _commands(main):
        for p in cmd.params:
            if isinstance(p, click.Option) and not (p.multiple or p.count or p.is_eager):
                yield path, p


SINGLE = list(_single_value_options())


def test_every_single_value_option_of_every_command_given_twice_is_one_line(runner):
    """`--capacity 5GB --capacity 10GB` ran at 10GB, silently; now every option that takes one
    value, of every command (nested groups too), given twice is refused before anything runs,
    naming it, and so is a switch given in both its spellings. The values need not be valid: the
    count is checked as the line is parsed."""
    assert len(SINGLE) > 200 and {("run",), ("sweep",), ("advise",), ("replay",), ("traces", "stats")} <= {
        path for path, _ in SINGLE
    }
    checked = 0
    for path, p in SINGLE:
        if p.is_flag and not p.secondary_opts:
            continue  # --force --force: one switch said twice the same way
        twice = [p.opts[0], p.secondary_opts[0]] if p.is_flag else [p.opts[0], "1", p.opts[0], "2"]
        res = runner.invoke(main, [*path, *twice])
        name = "/".join(o for o in [*p.opts, *p.secondary_opts] if o.startswith("--"))
        assert res.exit_code == 2, (path, twice, res.output)
        text = res.output.strip()
        assert len(text.splitlines()) == 1 and "Traceback" not in text, (path, twice, text)
        assert text.startswith(f"Error: {name} is given 2 times ({twice[0]}"), (path, twice, text)
        checked += 1
    assert checked > 150


def test_a_switch_repeated_in_one_spelling_still_runs(runner):
    """`--no-progress --no-progress` says one thing twice (scripts append it): it runs."""
    res = runner.invoke(main, ["run", *SMALL, "--no-progress", "--policy", "sglang+", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["policy"] == "sglang+"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", "--capacity", "5GB", "--capacity", "10GB"],
            "--capacity is given 2 times (--capacity 5GB, --capacity 10GB): it takes one value, give it once",
        ),
        (
            ["run", "--model", "qwen3.5-9b", "--model=llama-7b"],
            "--model is given 2 times (--model qwen3.5-9b, --model llama-7b): it takes one value",
        ),
        (
            ["run", "--progress", "--no-progress"],
            "--progress/--no-progress is given 2 times (--progress, --no-progress): it is one switch",
        ),
        (["replay", "--layers", "2", "--layers", "3", "--layers", "4"], "--layers is given 3 times"),
        (["traces", "stats", "--trace", "mooncake:sample", "--trace", "sharegpt"], "--trace is given 2 times"),
    ],
    ids=["run-capacity", "run-model", "flag-and-its-negation", "three-times", "nested-group"],
)
def test_an_option_given_twice_names_what_was_given(runner, args, message):
    _one_line(runner.invoke(main, args), message)


def test_options_that_take_several_values_stay_repeatable(runner, tmp_path):
    """multiple=True options (a sweep's axes, report's --where, plot's --kind) are not refused."""
    out = tmp_path / "s"
    res = runner.invoke(
        main,
        ["sweep", *SMALL, "--policy", "sglang+", "--capacity", "1GB", "--capacity", "2GB", "--out", str(out)]
        + ["--workers", "1"],
    )
    assert res.exit_code == 0, res.output
    assert len(list(out.glob("*.parquet"))) == 2
    res = runner.invoke(main, ["report", str(out), "--where", "policy=sglang+", "--where", "capacity=2GB"])
    assert res.exit_code == 0, res.output


# --------------------------------------------------------------------------- ranges as they are


@pytest.mark.parametrize("value", ["-1", "0", "inf", "nan"])
def test_the_memory_ratio_states_its_open_range(runner, value):
    """--mamba-full-memory-ratio -1 said `must be >= 0`, and 0 then said `must be > 0`: both (and
    inf, nan) now say the range it has, a finite number above 0."""
    res = runner.invoke(
        main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", "20GB", "--mamba-full-memory-ratio", value]
    )
    _one_line(res, "--mamba-full-memory-ratio must be a finite number > 0, not ")


def test_the_policies_json_states_the_open_bound(runner):
    rows = {r["name"]: r for r in json.loads(runner.invoke(main, ["policies", "--format", "json"]).output)}
    knob = next(k for k in rows["sglang"]["knobs"] if k["name"] == "mamba_full_memory_ratio")
    assert knob["min"] is None and knob["above"] == 0.0


# ----------------------------------------------------------------- a dense model's state pools


def _dense_config(tmp_path: Path) -> Path:
    path = tmp_path / "dense" / "config.json"
    path.parent.mkdir()
    path.write_text((CONFIGS / "llama-2-7b.json").read_text())
    return path


@pytest.mark.parametrize(
    "knob",
    [
        ["--mamba-full-memory-ratio", "2"],
        ["--max-mamba-cache-size", "8"],
        ["--state-pool", "4"],
        ["--mamba-radix-cache-strategy", "no_buffer"],
        ["--mamba-track-interval", "512"],
    ],
)
@pytest.mark.parametrize("model", ["llama-7b", "config"])
def test_a_state_pool_knob_for_a_dense_model_is_refused(runner, tmp_path, knob, model):
    """A model without recurrent layers has no mamba pool: the ratio, the pool's size and
    --state-pool changed nothing (the run's numbers were the same with any value); SGLang serves it
    from its plain radix cache, so the mamba strategy and track interval do not apply either (they
    moved its numbers: 8.91 % token hits, 9.12 % with no_buffer, 8.55 % with interval 512)."""
    name = "llama-7b" if model == "llama-7b" else str(_dense_config(tmp_path))
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", "20GB", "--model", name, *knob])
    _one_line(res, f"{knob[0]} does nothing for {name}: a model without recurrent layers has no recurrent states")


def test_gpu_memory_on_a_dense_model_says_it_is_all_kv(runner):
    """--gpu-memory alone on a dense model runs (SGLang runs it on its plain radix cache, all the
    memory for KV), with one line saying there is no split."""
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", "20GB", "--model", "llama-7b"])
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == (
        "note: llama-7b has no recurrent layers: no mamba pool to split --gpu-memory with, all of it is the KV pool"
    )
    assert "capacity 20GB" in res.stdout
    hybrid = runner.invoke(main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", "20GB"])
    assert hybrid.exit_code == 0 and hybrid.stderr == "", hybrid.output


# ---------------------------------------------------------------------------- own model configs


def _config(tmp_path: Path, fixture: str, **fields) -> Path:
    """A committed config with ``fields`` replaced."""
    cfg = json.loads((CONFIGS / fixture).read_text())
    cfg.update(fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    "fixture, fields, message",
    [
        # a field that must be >= 1 said `>= 0` for -5 (and `>= 1` for 0)
        ("llama-2-7b.json", {"hidden_size": -5}, "field 'hidden_size' must be a whole number >= 1, not -5"),
        ("llama-2-7b.json", {"num_hidden_layers": -2}, "field 'num_hidden_layers' must be a whole number >= 1"),
        # a vocabulary of 1e30 ran (priced on 64 GPUs)
        ("llama-2-7b.json", {"vocab_size": 1e30}, "field 'vocab_size' is 1,000,000,000,000,000,019,884,624,838,656"),
        # a text_config that is no object said `qwen3_5 needs field 'hidden_size'`
        ("qwen3.5-9b.json", {"text_config": 5}, "field 'text_config' must be a JSON object, not 5"),
    ],
    ids=["negative-width", "negative-layers", "huge-vocab", "text-config-not-object"],
)
def test_a_config_field_out_of_range_says_its_range(runner, tmp_path, fixture, fields, message):
    path = _config(tmp_path, fixture, **fields)
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--model", str(path)])
    _one_line(res, f"model config {path}: {message}")


def test_a_json_without_model_type_says_it_is_no_model_config(runner, tmp_path):
    """`{}` (or a tokenizer_config.json) said `model_type None is not one this reader knows`."""
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"model_max_length": 4096}))
    _one_line(
        runner.invoke(main, ["models", str(path)]),
        f"model config {path}: no 'model_type' field: not a Hugging Face model config.json (the reader knows qwen3_next",
    )


def test_a_folder_without_config_json_says_so(runner, tmp_path):
    """`--model FOLDER` without a config.json, or a config.json that is a folder, said `no such file`
    of a folder that is there."""
    empty = tmp_path / "weights"
    empty.mkdir()
    (empty / "model.safetensors.index.json").write_text("{}")
    _one_line(
        runner.invoke(main, ["models", str(empty)]),
        f"model config {empty}: the folder holds no config.json (give its config.json)",
    )
    odd = tmp_path / "odd" / "config.json"
    odd.mkdir(parents=True)
    for given in (odd.parent, odd):
        res = runner.invoke(main, ["run", *SMALL, "--model", str(given)])
        _one_line(res, f"model config {odd}: a folder, not a file (give the config.json file itself)")


# ------------------------------------------------------------------------- GPUs and their memory


def test_more_gpus_than_heads_says_so(runner):
    """--tensor-parallel 64 on a 32-head model said `does not divide`; it is more GPUs than heads."""
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--model", "llama-7b", "--tensor-parallel", "64"])
    _one_line(res, "--tensor-parallel 64 is more GPUs than the 32 attention heads of llama-7b")
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--model", "llama-7b", "--tensor-parallel", "3"])
    _one_line(res, "--tensor-parallel 3 does not divide the 32 attention heads of llama-7b")


@pytest.mark.parametrize(
    "memory, message",
    [
        # the split then said it `leaves 0B for KV ... lower --mamba-full-memory-ratio`
        ("0", "--gpu-memory must be a size > 0 (bytes with a unit), not '0'"),
        ("0GB", "--gpu-memory must be a size > 0 (bytes with a unit), not '0GB'"),
        # advise's form said `cannot read size '2x80GB'`
        ("2x80GB", "--gpu-memory 2x80GB: N x SIZE is `marconi advise`'s form; here give the memory itself (160GB)"),
    ],
    ids=["zero", "zero-gb", "advise-form"],
)
def test_run_gpu_memory_that_is_no_memory(runner, memory, message):
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang", "--gpu-memory", memory])
    _one_line(res, message)


ADVISE = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", *SMALL, "--trials", "1", "--workers", "1"]


@pytest.mark.parametrize(
    "extra, message",
    [
        # said `use inf for a cache that never evicts`, which advise refuses
        (["--gpu-memory", "1e30GB"], "--gpu-memory must be a finite size > 0, not '1e30GB'"),
        # two GPUs' memory priced as a group of four, silently
        (
            ["--gpu-memory", "2x80GB", "--tensor-parallel", "4"],
            "--gpu-memory 2x80GB is the memory of 2 GPUs, --tensor-parallel 4 a group of 4: give the same count",
        ),
    ],
    ids=["huge", "count-and-group-differ"],
)
def test_advise_memory_that_contradicts_itself(runner, tmp_path, extra, message):
    out = tmp_path / "adv"
    res = runner.invoke(main, [*ADVISE, "--out", str(out), *extra])
    _one_line(res, message)
    assert not out.exists()


# ---------------------------------------------------------------------------------- plot misses


def test_plot_misses_refuses_rows_without_miss_counts(runner, tmp_path):
    """Rows of an older version (no missed_* values) beside newer ones were drawn as all hits."""
    import pandas as pd

    out = tmp_path / "s"
    res = runner.invoke(
        main,
        ["sweep", *SMALL, "--policy", "sglang+", "--capacity", "1GB,2GB", "--out", str(out), "--workers", "1"],
    )
    assert res.exit_code == 0, res.output
    older = sorted(out.glob("*.parquet"))[0]
    rows = pd.read_parquet(older)
    rows.drop(columns=[c for c in rows.columns if c.startswith("missed_")]).to_parquet(older)
    figs = tmp_path / "figs"
    res = runner.invoke(main, ["plot", str(out), "--kind", "misses", "--out", str(figs)])
    _one_line(res, "--kind misses: 1 of 2 rows have no missed-token counts (written by an older version)")
    assert not list(figs.glob("misses.*"))
    newer = "1GB" if int(rows["capacity_bytes"].iloc[0]) == 2 * 10**9 else "2GB"
    res = runner.invoke(
        main, ["plot", str(out), "--kind", "misses", "--out", str(figs), "--where", f"capacity={newer}"]
    )
    assert res.exit_code == 0, res.output  # the newer rows alone draw
    assert sorted(p.name for p in figs.iterdir()) == ["misses.png", "misses.svg"]
    every = tmp_path / "every"  # --kind all draws the figures the rows hold, and says why misses is not one
    res = runner.invoke(main, ["plot", str(out), "--kind", "all", "--out", str(every)])
    assert res.exit_code == 0, res.output
    assert "note: misses not drawn: --kind misses: 1 of 2 rows have no missed-token counts" in res.stderr
    # a sweep without marconi's static alphas: the alpha figure is named, not the end of --kind all
    assert "note: alpha not drawn: no static-alpha rows of policy 'marconi'" in res.stderr
    assert (every / "hit-rate.png").exists() and (every / "ttft-load.png").exists()
    assert not (every / "misses.png").exists() and not (every / "alpha.png").exists()


# ------------------------------------------------------------------- trtllm on a dense model


@pytest.mark.parametrize("extra", [[], ["--periodic-snapshot-interval", "64"]], ids=["default", "interval"])
def test_trtllm_on_a_dense_model_is_refused(runner, extra):
    """The trtllm preset keeps KV only up to a recurrent-state snapshot (TensorRT-LLM's hybrid
    manager): on llama-7b it read 0 % hits (57.8 % with an interval) beside 63 % for every other
    engine; a dense model runs TensorRT-LLM's plain KV cache, which is not modelled."""
    res = runner.invoke(main, ["run", *SMALL, "--policy", "vllm,trtllm", "--model", "llama-7b", *extra])
    _one_line(res, "trtllm models TensorRT-LLM's hybrid cache manager (KV reused only up to a recurrent-state")
    ok = runner.invoke(main, ["run", *SMALL, "--policy", "trtllm-1.2-interval", "--model", "llama-7b"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--gpu", "a100-40gb", "--model", "qwen3.5-27b", "--tensor-parallel", "1"],
            "qwen3.5-27b's bf16 weights (54GB) are more than the memory of 1x a100-40gb (40GiB = 42.95GB): give "
            "--tensor-parallel 2 (the smallest group that holds them and splits its heads)",
        ),
        (
            ["--gpu", "l40s", "--model", "qwen3.5-397b-a17b"],  # the preset's 8 GPUs are H200s
            "qwen3.5-397b-a17b's bf16 weights (794GB) are more than the memory of 8x l40s (384GiB = 412.3GB): give "
            "--tensor-parallel 16 (the smallest group that holds them and splits its heads; 16 GPUs = 2 nodes of "
            "8: all-reduce over the inter-node link, 25 GB/s each way)",
        ),
        (
            ["--gpu", "h100", "--model", "llama-7b", "--capacity", "100GB"],
            "--capacity 100GB is more than the memory of 1x h100 (80GiB = 85.9GB): lower it, or give --tensor-parallel",
        ),
    ],
    ids=["weights-27b-on-a100-40gb", "weights-397b-on-l40s", "capacity-over-the-gpu"],
)
def test_a_gpu_group_that_cannot_hold_the_model_or_the_cache_is_refused(runner, extra, message):
    """--gpu priced a model its group cannot hold (397B on L40S ran, 77 ms TTFT) and a cache larger
    than its memory (100GB on one H100)."""
    _one_line(runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", *extra]), message)


def test_a_gpu_group_that_holds_the_model_runs(runner):
    for extra in (["--gpu", "a100-40gb", "--model", "qwen3.5-27b", "--tensor-parallel", "2"], ["--gpu", "h100"]):
        res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--capacity", "inf", *extra])
        assert res.exit_code == 0, res.output


@pytest.mark.parametrize("value", ["-1", "0"])
def test_synthetic_sessions_state_their_least(runner, value):
    """synthetic:chat:sessions=-1 said `must be >= 0`, and 0 then said `must be >= 1`."""
    res = runner.invoke(main, ["run", "--trace", f"synthetic:chat:sessions={value}", "--no-progress"])
    _one_line(res, f"synthetic:chat: sessions must be >= 1 (got {value})")


@pytest.mark.parametrize("mode", ["sequential", "des"])
def test_sglang_keeps_a_dense_models_kv_to_the_requests_end(mode):
    """SGLang serves a model without recurrent layers from its plain radix cache: the second turn
    of a session (the first turn's 100-token prompt and 10-token answer, then 20 new tokens) hits
    the 100 + 10 - 1 tokens the first request stored. The preset applied extra_buffer (auto) to it
    and kept KV only up to the 64-token tracked state: 64. A hybrid model keeps that rule."""
    import numpy as np

    from sim.config import SimConfig
    from sim.simulate import simulate
    from traces.base import Request, Trace

    def toks(start, n):
        return np.arange(start, start + n, dtype=np.int64)

    first_in, first_out = toks(0, 100), toks(500, 10)
    reqs = [
        Request(session_id=0, turn=0, input_tokens=first_in, output_tokens=first_out),
        Request(
            session_id=0,
            turn=1,
            input_tokens=np.concatenate((first_in, first_out, toks(900, 20))),
            output_tokens=toks(700, 5),
        ),
    ]

    def hits(model):
        cfg = SimConfig(policy="sglang", model=model, capacity_bytes=10**11, mode=mode)
        return list(simulate(Trace("two-turns", reqs), cfg).requests["hit_tokens"])

    assert hits("llama-7b") == [0, 109]
    assert hits("qwen3.5-9b") == [0, 64]  # extra_buffer: KV up to the last tracked state
