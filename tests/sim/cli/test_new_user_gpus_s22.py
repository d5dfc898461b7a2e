"""A new user's config.json and GPU name (session 22, second round): an fp32 checkpoint, a
--gpu-memory too large to read, the NVL / GH200 GPUs, a timing file of another dtype; through the
real CLI in process."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from refusals import one_line
from sim.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
RUN = ["run", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]


def _config(tmp_path, name: str, **edits) -> str:
    cfg = json.loads((CONFIGS / name).read_text())
    cfg.update(edits)
    path = tmp_path / f"{name.removesuffix('.json')}-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_models_says_an_fp32_checkpoint_is_served_in_bf16(runner, tmp_path):
    """An fp32 Nemotron-H 8B was priced at 4 bytes a KV, conv and state element (32,768 B a token,
    twice the bf16 row) without a word; the engines serve it in bf16 (--dtype auto): the bf16 row's
    bytes, and a note saying so."""
    fp32, bf16 = _config(tmp_path, "nemotron-h-8b.json", torch_dtype="float32"), str(CONFIGS / "nemotron-h-8b.json")
    res = runner.invoke(main, ["models", fp32, bf16])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[2].split()[-4:] == lines[3].split()[-4:] == ["16,384", "102,137,856", "6,234", "1.43e+10"]
    assert (
        lines[4] == f"note: {fp32}: fp32 checkpoint served in bf16 (vLLM's and SGLang's --dtype auto; docs/models.md)"
    )
    assert [line.split(": Mamba state in fp32")[0] for line in lines[5:]] == [f"note: {fp32}", f"note: {bf16}"]
    rows = json.loads(runner.invoke(main, ["models", fp32, bf16, "--format", "json"]).output)
    assert [r["note"] for r in rows] == ["fp32 checkpoint served in bf16", None]


def test_gpu_memory_too_large_names_what_the_option_takes(runner):
    """--gpu h100 --gpu-memory 1e30GB said "use inf for a cache that never evicts", and --gpu-memory
    inf was then refused as more than the memory of 1x h100."""
    one_line(
        runner.invoke(main, [*RUN, "--policy", "sglang", "--gpu", "h100", "--gpu-memory", "1e30GB"]),
        "--gpu-memory 1e30GB is too large: give at most the memory of the --gpu h100 group (80GiB a GPU)",
    )
    # without --gpu, inf is what it says, and run takes it
    one_line(
        runner.invoke(main, [*RUN, "--policy", "sglang", "--gpu-memory", "1e30GB"]),
        "--gpu-memory 1e30GB is too large: give a size, or inf for no limit",
    )
    res = runner.invoke(main, [*RUN, "--policy", "sglang", "--gpu-memory", "inf"])
    assert res.exit_code == 0 and " | capacity inf | " in res.output.splitlines()[0], res.output


def test_a_timing_file_of_another_dtype_is_said_on_stderr(runner, tmp_path):
    """run --timing with a file fitted in fp32 (a CPU calibration) priced a bf16 model without a
    word (replay says it): one warning line on stderr, the exit and the header as before."""
    h200 = json.loads((Path(__file__).resolve().parents[3] / "sim" / "data" / "h200-timing.json").read_text())
    assert h200["dtype"] == "bf16"
    (tmp_path / "bf16.json").write_text(json.dumps(h200))
    (tmp_path / "fp32.json").write_text(json.dumps({**h200, "dtype": "fp32"}))
    args = [*RUN, "--model", "qwen3.5-9b", "--policy", "marconi", "--timing"]
    same = runner.invoke(main, [*args, str(tmp_path / "bf16.json")])
    other = runner.invoke(main, [*args, str(tmp_path / "fp32.json")])
    assert same.exit_code == other.exit_code == 0 and same.stderr == "", (same.output, other.output)
    assert other.stderr.splitlines() == [
        f"warning: timing file {tmp_path / 'fp32.json'} was fitted in fp32, and qwen3.5-9b runs in bf16: its times "
        "are the fp32 fit's as they are (fit one in bf16: marconi replay --dtype bf16 --calibrate FILE)"
    ]
    assert other.stdout.replace("fp32.json", "bf16.json") == same.stdout
    # an fp16 checkpoint runs in fp16: the bf16 file is the other dtype there
    fp16 = _config(tmp_path, "nemotron-h-8b.json", torch_dtype="float16")
    res = runner.invoke(main, [*RUN, "--model", fp16, "--policy", "marconi", "--timing", str(tmp_path / "bf16.json")])
    assert res.exit_code == 0 and "was fitted in bf16, and " in res.stderr and "runs in fp16" in res.stderr, res.output


def test_report_and_plot_on_an_advise_folder_say_what_it_holds(runner, tmp_path):
    """`marconi report A` / `marconi plot A` on an `advise --out A` folder said "no results in A"
    (as of an empty folder); they name the advise study and where its recommendation is."""
    out = tmp_path / "a"
    args = ["advise", "--for", "vllm", "--trace", "synthetic:chat:sessions=2,turns=2", "--trials", "2"]
    res = runner.invoke(main, [*args, "--no-progress", "--out", str(out)])
    assert res.exit_code == 0 and (out / "advice.json").is_file(), res.output
    tail = f"its recommendation is {out / 'advice.json'} (rerun the same `marconi advise --out` to print it again)"
    one_line(
        runner.invoke(main, ["report", str(out)]),
        f"{out} holds a `marconi advise` study, not the results of `marconi sweep` or `marconi run`: {tail}",
    )
    one_line(
        runner.invoke(main, ["plot", str(out), "--out", str(tmp_path / "figs")]),
        f"{out} holds a `marconi advise` study, not the rows of `marconi sweep`: {tail}",
    )
    assert not (tmp_path / "figs").exists()


def test_report_of_a_sweep_read_from_another_folder_names_the_uncalibrated_gpu(runner, tmp_path, monkeypatch):
    """A sweep of `--model m.json --gpu h100-nvl` reported from another folder (m.json not found from
    there) dropped the "uncalibrated for GPU h100-nvl" note the sweep's header had."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "m.json").write_text((CONFIGS / "nemotron-h-8b.json").read_text())
    monkeypatch.chdir(work)
    args = ["sweep", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "sglang+"]
    res = runner.invoke(main, [*args, "--model", "m.json", "--gpu", "h100-nvl,h100", "--workers", "1", "--out", "s"])
    assert res.exit_code == 0, res.output
    here = runner.invoke(main, ["report", "s"])
    monkeypatch.chdir(tmp_path)
    there = runner.invoke(main, ["report", "w/s"])
    assert here.exit_code == there.exit_code == 0, there.output
    assert here.output.splitlines()[-1] == there.output.splitlines()[-1] == "note: uncalibrated for GPU h100-nvl"


def test_a_ray_address_with_no_cluster_is_one_line(runner, tmp_path, monkeypatch):
    """`sweep` / `advise --engine ray --ray-address auto` with no Ray cluster running ended in Ray's
    ConnectionError traceback (advise left a study.journal of no trial behind)."""
    import pytest

    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    trace = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
    ray = ["--engine", "ray", "--ray-address", "auto"]
    for args, out in (
        (["sweep", *trace, "--policy", "sglang+", *ray], tmp_path / "s"),
        (["advise", "--for", "vllm", *trace, "--trials", "2", *ray], tmp_path / "a"),
    ):
        res = runner.invoke(main, [*args, "--out", str(out)])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert res.output.splitlines()[-1].startswith("Error: --ray-address auto: no Ray cluster reached ("), res.output
        assert res.output.splitlines()[-1].endswith(
            "start one (ray start --head) or leave --ray-address out for a local Ray"
        )
        assert not out.exists()


def test_where_that_selects_no_rows_names_the_values_there(runner, tmp_path, monkeypatch):
    """`report --where model=./m.json` on a sweep of `--model m.json` said only "selects no rows":
    the values the column holds are named (a size column as sizes, under the key as given)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.json").write_text((CONFIGS / "nemotron-h-8b.json").read_text())
    args = ["sweep", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "sglang+"]
    res = runner.invoke(main, [*args, "--model", "m.json", "--capacity", "2GB,10GB", "--workers", "1", "--out", "s"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["report", "s", "--where", "model=./m.json"])
    one_line(res, "--where 'model=./m.json' selects no rows (model holds: m.json)")
    res = runner.invoke(main, ["report", "s", "--where", "capacity=3GB"])
    one_line(res, "--where 'capacity=3GB' selects no rows (capacity holds: 2GB, 10GB)")


def test_advise_on_a_group_names_the_engine_s_tensor_parallel_flag(runner, tmp_path):
    """advise --gpu h100 on Qwen3.5-35B-A3B (70GB of weights: a group of 2) sized the cache for 2
    GPUs, and recommended `vllm serve ...` without --tensor-parallel-size: copied as it is, the
    engine runs on one GPU, where that cache does not fit."""
    cfg = str(CONFIGS / "qwen3.5-35b-a3b.json")
    args = ["--trace", "synthetic:chat:sessions=2,turns=2", "--trials", "2", "--no-progress", "--model", cfg]
    ckpt = shlex.quote(str(CONFIGS))  # the config's folder: the checkpoint served (served_model)
    for engine, words in (
        ("vllm", f"recommended: vllm serve {ckpt} --enable-prefix-caching --tensor-parallel-size 2 "),
        ("sglang", f"recommended: python -m sglang.launch_server --model-path {ckpt} --tp-size 2 "),
        ("trtllm", f"recommended: trtllm-serve {ckpt} --extra_llm_api_options extra.yaml --tp_size 2  # extra.yaml:"),
    ):
        res = runner.invoke(main, ["advise", "--for", engine, *args, "--gpu", "h100", "--out", str(tmp_path / engine)])
        assert res.exit_code == 0 and " | GPU 2x h100 | " in res.output.splitlines()[0], res.output
        assert res.output.splitlines()[2].startswith(words), res.output
        assert json.loads((tmp_path / engine / "advice.json").read_text())["command"] == res.output.splitlines()[2][13:]
    # one GPU (an H200 holds the weights): no flag
    res = runner.invoke(main, ["advise", "--for", "vllm", *args, "--gpu", "h200", "--out", str(tmp_path / "one")])
    assert res.exit_code == 0 and "--tensor-parallel-size" not in res.output, res.output


def test_advise_tensor_parallel_alone_takes_the_memory_of_the_group_it_prices(runner, tmp_path):
    """advise --tensor-parallel 4 (no --gpu, no --gpu-memory) said "GPU 4x h200 | --gpu-memory
    80GB": 80GB for the four GPUs, 2.68GB of cache beside Qwen3.5-35B-A3B's 69.3GB of weights; the
    memory is now that of the group priced (4 x 141GB), or of a --timing file's GPU."""
    cfg = str(CONFIGS / "qwen3.5-35b-a3b.json")
    args = ["advise", "--for", "vllm", "--trace", "synthetic:chat:sessions=2,turns=2", "--trials", "2", "--no-progress"]
    res = runner.invoke(main, [*args, "--model", cfg, "--tensor-parallel", "4", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert (
        f"model {cfg} | GPU 4x h200 | --gpu-memory 564GiB = 605.6GB: bf16 weights 69.3GB, "
        in res.output.splitlines()[0]
    )
    h100 = Path(__file__).resolve().parents[3] / "sim" / "data" / "h100-timing.json"
    extra = ["--tensor-parallel", "2", "--timing", str(h100), "--out", str(tmp_path / "b")]
    res = runner.invoke(main, [*args, "--model", cfg, *extra])
    assert res.exit_code == 0 and f"model {cfg} | --gpu-memory 160GiB = 171.8GB: " in res.output.splitlines()[0], (
        res.output
    )


def test_sweep_says_a_timing_file_of_another_dtype_too(runner, tmp_path):
    """sweep --timing with an fp32 file on bf16 models said nothing (run says it now): one line on
    stderr per model, the sweep run as before."""
    h200 = json.loads((Path(__file__).resolve().parents[3] / "sim" / "data" / "h200-timing.json").read_text())
    (tmp_path / "fp32.json").write_text(json.dumps({**h200, "dtype": "fp32"}))
    args = ["sweep", "--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress", "--policy", "sglang+"]
    res = runner.invoke(
        main,
        [*args, "--model", "qwen3.5-9b,qwen3.5-27b", "--timing", str(tmp_path / "fp32.json"), "--workers", "1"]
        + ["--out", str(tmp_path / "s")],
    )
    assert res.exit_code == 0, res.output
    assert [line.split(": its times")[0] for line in res.stderr.splitlines()] == [
        f"warning: timing file {tmp_path / 'fp32.json'} was fitted in fp32, and {m} runs in bf16"
        for m in ("qwen3.5-9b", "qwen3.5-27b")
    ]


def test_advise_says_a_timing_file_of_another_dtype_too(runner, tmp_path):
    h200 = json.loads((Path(__file__).resolve().parents[3] / "sim" / "data" / "h200-timing.json").read_text())
    (tmp_path / "fp32.json").write_text(json.dumps({**h200, "dtype": "fp32"}))
    args = ["advise", "--for", "vllm", "--trace", "synthetic:chat:sessions=2,turns=2", "--trials", "2"]
    res = runner.invoke(
        main,
        [*args, "--no-progress", "--model", "qwen3.5-9b", "--timing", str(tmp_path / "fp32.json")]
        + ["--out", str(tmp_path / "a")],
    )
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(
        f"warning: timing file {tmp_path / 'fp32.json'} was fitted in fp32, and qwen3.5-9b runs in bf16: its times"
    ), res.stderr
    assert res.stdout.startswith("advise --for vllm | model qwen3.5-9b | ")


def test_ttft_panels_of_a_narrow_range_carry_numbers(runner, tmp_path):
    """`plot --kind ttft` on a small sweep (TTFTs of 15 to 50 ms) drew its log x axis with no
    number at all: no power of ten in view, and the minor labels hidden. Each panel's axis now
    shows at least two numbers, inside its range."""
    import pytest

    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from sim.analysis import plot

    args = ["sweep", "--trace", "synthetic:chat:sessions=3,turns=2", "--no-progress", "--policy", "sglang+"]
    res = runner.invoke(
        main, [*args, "--gpu", "h100-nvl,h200", "--save-requests", "--workers", "1", "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    for kind, axis in (("ttft", "xaxis"), ("ttft-load", "yaxis")):
        fig = plot.make_figure(tmp_path, kind)
        fig.canvas.draw()
        for ax in fig.axes:
            lo, hi = sorted(getattr(ax, axis).get_view_interval())
            assert hi / lo < 10, (kind, lo, hi)  # the case in question: less than a decade
            ticks = [*getattr(ax, axis).get_major_ticks(), *getattr(ax, axis).get_minor_ticks()]
            shown = [t.label1.get_text() for t in ticks if t.label1.get_text() and lo <= t.get_loc() <= hi]
            assert len(shown) >= 2 and all(float(s) > 0 for s in shown), (kind, shown)
        matplotlib.pyplot.close(fig)


def test_the_recommendation_names_what_it_serves():
    """The recommendation's command line serves the model: a config.json's folder (the
    checkpoint's, quoted for the shell), ``MODEL`` for a preset (it names no checkpoint); the
    marconi line is the simulator's own run of the preset or config (it was ``marconi --alpha
    auto``, no command)."""
    from sim.cost import get_model
    from sim.experiments.advise.space import ENGINES, build_space, served_model

    assert served_model("qwen3.5-9b") == "MODEL" and served_model("") == "MODEL"
    assert served_model("ckpt/config.json") == "ckpt" and served_model("cfg.json") == "."
    assert served_model("my models/q/config.json") == "'my models/q'" and served_model("./q") == "./q"
    assert ENGINES["vllm"].command.startswith("vllm serve {model} ")
    assert ENGINES["lmdeploy"].command.startswith("lmdeploy serve api_server {model} ")
    assert ENGINES["marconi"].command == "marconi run --model {preset} --policy marconi"
    spec = get_model("qwen3.5-9b")
    space = build_space("marconi", spec, 80 * 10**9)
    line = space.command(space.defaults(), model="qwen3.5-9b")
    assert line.startswith("marconi run --model qwen3.5-9b --policy marconi --alpha "), line
    space = build_space("vllm", spec, 80 * 10**9)
    line = space.command(space.defaults(), gpus=2, model="my ckpt/config.json")
    assert line.startswith("vllm serve 'my ckpt' --enable-prefix-caching --tensor-parallel-size 2"), line
