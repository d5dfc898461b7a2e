"""The fifth round of bad inputs (a new user bringing their own model, GPU and traces), through the
real CLI in a forked process (tests/forked_cli.py): every refusal is one line on stderr and exit 2,
never a traceback, and nothing is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from forked_cli import shared_forks

ROOT = Path(__file__).resolve().parents[3]
# what these commands load (no torch: none of them replays); the same list as the sweep tests'
PRELOAD = ("numpy", "pandas", "pyarrow", "simpy", "tqdm", "matplotlib.pyplot", "sim.simulate", "sim.analysis.plot")
SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]


def marconi(*args, cwd: Path | None = None) -> tuple[int, str, str]:
    """``marconi ARGS`` forked from the test process's fork server: (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rc, out, err = shared_forks(env, PRELOAD).run(["marconi", *map(str, args)], timeout=120, cwd=cwd or Path.cwd())
    assert rc is not None, f"marconi {args} ran past its timeout"
    return rc, out, err


def one_line(result: tuple[int, str, str], message: str) -> None:
    rc, out, err = result
    assert rc == 2, (rc, out, err)
    text = err.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert text.startswith(f"Error: {message}"), text


ADVISE = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", "--trials", "1", "--workers", "1", "--no-progress"]


@pytest.mark.parametrize(
    "args, flag",
    [
        (ADVISE + ["--sessions-per-second", "5"], "--sessions-per-second"),
        (ADVISE + ["--arrival", "poisson"], "--arrival"),
        (["run", "--policy", "sglang+", "--no-progress", "--arrival", "poisson"], "--arrival"),
        (["sweep", "--policy", "sglang+", "--no-progress", "--arrival", "poisson"], "--arrival"),
    ],
    ids=["advise-rate", "advise-arrival", "run-arrival", "sweep-arrival"],
)
def test_arrival_options_on_a_timestamped_trace_are_refused(tmp_path, args, flag):
    """A Mooncake trace's requests arrive at its own times: advise took --sessions-per-second and
    printed `marconi run ... --sessions-per-second 5` lines that `marconi run` refuses; --arrival
    poisson changed nothing in run, sweep or advise."""
    out = tmp_path / "o"
    result = marconi(*args, "--trace", "mooncake:sample", "--out", out)
    one_line(result, f"{flag} does nothing for mooncake traces (their requests arrive at the trace's own times")
    assert not out.exists()


# ------------------------------------------------------------------------------ own model configs

CONFIGS = ROOT / "tests" / "data" / "configs"


def _config(tmp_path: Path, fixture: str, **fields) -> Path:
    """A committed config with ``fields`` replaced (inside ``text_config`` where it has one)."""
    cfg = json.loads((CONFIGS / fixture).read_text())
    (cfg.get("text_config") or cfg).update(fields)
    path = tmp_path / "my model" / "config.json"  # a folder with a space: read as given
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    "fixture, fields, message",
    [
        ("qwen3-next-80b-a3b.json", {"hidden_size": 0}, "field 'hidden_size' must be >= 1, not 0"),
        ("llama-2-7b.json", {"vocab_size": 0}, "field 'vocab_size' must be >= 1, not 0"),
        ("llama-2-7b.json", {"intermediate_size": 0}, "field 'intermediate_size' must be >= 1, not 0"),
        ("qwen3.5-9b.json", {"linear_num_key_heads": 0}, "field 'linear_num_key_heads' must be >= 1, not 0"),
        (
            "qwen3-next-80b-a3b.json",
            {"linear_num_value_heads": 3},
            "field 'linear_num_key_heads' (16) must divide 'linear_num_value_heads' (3)",
        ),
        ("qwen3-next-80b-a3b.json", {"linear_conv_kernel_dim": 0}, "field 'linear_conv_kernel_dim' must be >= 1"),
        ("qwen3-next-80b-a3b.json", {"num_experts_per_tok": 0}, "field 'num_experts_per_tok' must be >= 1, not 0"),
        ("qwen3-next-80b-a3b.json", {"decoder_sparse_step": 0}, "field 'decoder_sparse_step' must be >= 1, not 0"),
        ("nemotron-h-8b.json", {"mamba_num_heads": 0}, "field 'mamba_num_heads' must be >= 1, not 0"),
        ("nemotron-h-8b.json", {"n_groups": 7}, "field 'n_groups' (7) must divide 'mamba_num_heads' (128)"),
        ("nemotron-h-8b.json", {"hybrid_override_pattern": 5}, "field 'hybrid_override_pattern' must be a string"),
        ("mamba-codestral-7b.json", {"num_heads": 0}, "field 'num_heads' must be >= 1, not 0"),
        ("falcon-h1-7b.json", {"mamba_d_state": 0}, "field 'mamba_d_state' must be >= 1, not 0"),
        ("granite-4.0-h-small.json", {"num_experts_per_tok": 0}, "field 'num_experts_per_tok' must be >= 1"),
        ("jamba-1.5-mini.json", {"attn_layer_offset": 100}, "field 'attn_layer_offset' (100) must be below"),
        ("jamba-1.5-mini.json", {"expert_layer_offset": 2}, "field 'expert_layer_offset' (2) must be below"),
        ("jamba-1.5-mini.json", {"num_experts": 0}, "field 'num_experts' must be >= 1, not 0"),
        ("jamba-1.5-mini.json", {"mamba_d_conv": 0}, "field 'mamba_d_conv' must be >= 1, not 0"),
    ],
    ids=[
        "hidden-0",
        "vocab-0",
        "ffn-0",
        "gdn-k-heads-0",
        "gdn-v-heads-not-multiple",
        "gdn-conv-0",
        "top-k-0",
        "sparse-step-0",
        "mamba-heads-0",
        "mamba-groups-not-dividing",
        "pattern-not-str",
        "codestral-heads-0",
        "falcon-state-0",
        "granite-top-k-0",
        "jamba-attn-offset-past-period",
        "jamba-expert-offset-past-period",
        "jamba-experts-0",
        "jamba-conv-0",
    ],
)
def test_config_widths_that_describe_no_layer_are_one_line(tmp_path, fixture, fields, message):
    """A zero width or a layout no engine could load was read as given: 0 Mamba heads gave a
    model with 0 FLOPs whose replay hit 92 %; a Jamba attention offset past its period, a model
    with no attention layer at all."""
    path = _config(tmp_path, fixture, **fields)
    one_line(marconi("models", path.parent), f"model config {path.parent}: {message}")
    one_line(marconi("run", *SMALL, "--model", path, "--policy", "marconi"), f"model config {path}: {message}")


def test_a_dense_qwen_reads_no_sparse_step(tmp_path):
    """decoder_sparse_step places MoE layers: a dense config (no experts) never reads it, so its 0
    is no error there (the engines' modelling code reads it only when there are experts)."""
    rows = []
    for step in (0, 1):
        path = _config(tmp_path / str(step), "qwen3-next-80b-a3b.json", num_experts=0, decoder_sparse_step=step)
        rc, out, err = marconi("models", path)
        assert rc == 0, err
        row = out.splitlines()[-1]
        assert row.startswith(str(path)), row
        rows.append(row[len(str(path)) :].split())
    assert rows[0] == rows[1] and rows[0][:2] == ["12", "attn"], rows


# ------------------------------------------------------------------------------ own chat traces


def _sharegpt(tmp_path: Path, *conversations: list[tuple[str, str]]) -> str:
    path = tmp_path / "chats.json"
    records = [
        {"id": str(i), "conversations": [{"from": r, "value": v} for r, v in c]} for i, c in enumerate(conversations)
    ]
    path.write_text(json.dumps(records))
    return f"sharegpt:{path}"


TWO_ROUNDS = [("human", "hi there"), ("gpt", "hello"), ("human", "how are you"), ("gpt", "fine")]


@pytest.mark.parametrize(
    "conversations, args, why",
    [
        (
            [TWO_ROUNDS] * 3,
            [],
            "none of its 3 conversations has 10 or more rounds (a round: a message and its reply; the most is 2): "
            "lower --min-rounds",
        ),
        ([], ["--min-rounds", "1"], "the file holds no conversation"),
        (
            [[("alien", "hi"), ("gpt", "hello")], [("gpt", "hello"), ("human", "hi")]],
            ["--min-rounds", "1"],
            "none of the 2 conversations selected has a user message followed by an assistant reply (roles: human /"
            " user, then gpt / assistant)",
        ),
        (
            [TWO_ROUNDS],
            ["--min-rounds", "1", "--max-tokens", "5"],
            "each of the 1 conversations selected starts with a request longer than --max-tokens 5",
        ),
        (
            [TWO_ROUNDS, [("alien", "hi"), ("gpt", "hello")]],
            ["--min-rounds", "1", "--max-tokens", "5"],
            "1 of the 2 conversations selected have no user message followed by an assistant reply (roles: human / "
            "user, then gpt / assistant); the other 1 start with a request longer than --max-tokens 5",
        ),
    ],
    ids=["min-rounds", "no-records", "no-user-turn", "over-the-cap", "both"],
)
def test_a_chat_trace_left_empty_says_which_filter_emptied_it(tmp_path, conversations, args, why):
    """A user's own ShareGPT file of short chats, under the default --min-rounds 10, was "has no
    requests (after filtering)", naming no filter; so were unknown roles and a first turn over
    --max-tokens."""
    spec = _sharegpt(tmp_path, *conversations)
    one_line(marconi("traces", "stats", spec, *args, "--no-progress"), f"trace {spec!r} has no requests: {why}")


def test_an_lmsys_file_left_empty_says_which_filter_emptied_it(tmp_path):
    """LMSys's filters: rounds first, then the non-ASCII share."""
    import pandas as pd

    chat = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    russian = [{"role": "user", "content": "привет"}, {"role": "assistant", "content": "да"}]
    rows = [{"conversation_id": str(i), "conversation": c, "turn": 1} for i, c in enumerate([chat, russian])]
    path = tmp_path / "lmsys.parquet"
    pd.DataFrame(rows).to_parquet(path)
    spec = f"lmsys:{path}"
    one_line(
        marconi("traces", "stats", spec, "--no-progress"),
        f"trace {spec!r} has no requests: none of its 2 conversations has 10 or more rounds and at most 50% "
        "non-ASCII text (2 have fewer rounds, the most 1: lower --min-rounds)",
    )
    pd.DataFrame(rows[1:]).to_parquet(path)
    one_line(
        marconi("traces", "stats", spec, "--no-progress", "--min-rounds", "1"),
        f"trace {spec!r} has no requests: each of its 1 conversations is more than 50% non-ASCII text",
    )


# ------------------------------------------------------------------------------ own GPU


@pytest.mark.parametrize(
    "spelling, name",
    [
        ("H100 SXM", "h100"),
        ("nvidia-h100", "h100"),
        ("NVIDIA H100 80GB HBM3", "h100"),  # as torch.cuda.get_device_name says it
        ("h100_pcie", "h100-pcie"),
        ("A100-80GB", "a100"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_gpu_spellings_name_the_catalogue_entry(spelling, name):
    """`--gpu "H100 SXM"` (or the name nvidia-smi prints) was "not one of 'a100-40gb', 'a100',
    'h100', ...": every spelling of an entry reads as it, in run's header and sweep's grid alike."""
    from sim.gpus import get_gpu

    assert get_gpu(spelling).name == name  # the library reads it as the CLI does
    rc, out, err = marconi("run", *SMALL, "--policy", "sglang+", "--gpu", spelling)
    assert rc == 0, err
    assert f"| GPU 1x {name} |" in out.splitlines()[0]


def test_a_gpu_spelling_of_no_entry_is_still_refused():
    """A memory the entry does not have (H100 NVL's 94GB on the SXM entry) or another part (MI300,
    not MI300X; an H200 PCIe, which NVIDIA sells as the H200 NVL) is no alias: one line listing the
    catalogue. (h100-nvl was here: it is an entry of its own since session 22.)"""
    for spelling in ("h100-94gb", "mi300", "h200-pcie"):
        one_line(
            marconi("run", *SMALL, "--policy", "sglang+", "--gpu", spelling),
            f"Invalid value for '--gpu': unknown GPU '{spelling}' (close: ",
        )


def test_the_help_names_marconi_7b_s_calibrated_gpu():
    """--help said "A100 for marconi-7b", but `--gpu a100` (80GB) is "uncalibrated": the paper's
    fit is of the 40GB part, which --gpu a100-40gb prices as calibrated."""
    flat = " ".join(marconi("run", "--help")[1].split())
    assert "A100 40GB (a100-40gb) for marconi-7b and llama-7b]" in flat
    first = [
        marconi("run", *SMALL, "--policy", "sglang+", "--gpu", g)[1].splitlines()[0] for g in ("a100-40gb", "a100")
    ]
    assert "uncalibrated" not in first[0] and "uncalibrated for GPU a100" in first[1], first


# ------------------------------------------------------------------------------ byte-order marks

BOM = "\ufeff"
SAMPLE = ROOT / "traces" / "data" / "mooncake_conversation_300.jsonl"


def _stats(spec: str, *args) -> list[str]:
    rc, out, err = marconi("traces", "stats", spec, "--no-progress", *args)
    assert rc == 0, err
    return out.splitlines()[1:]  # all but the line naming the trace


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_jsonl_trace_with_a_byte_order_mark_reads_as_without(tmp_path, gz):
    """A JSONL saved by a Windows tool starts with a UTF-8 byte-order mark: row 1 was 'bad JSON:
    Unexpected UTF-8 BOM'."""
    import gzip

    text = "".join(SAMPLE.read_text().splitlines(keepends=True)[:20])
    plain, marked = tmp_path / "plain.jsonl", tmp_path / ("bom.jsonl.gz" if gz else "bom.jsonl")
    plain.write_text(text)
    data = (BOM + text).encode()
    marked.write_bytes(gzip.compress(data) if gz else data)
    assert _stats(f"mooncake:{marked}") == _stats(f"mooncake:{plain}")


def test_a_sharegpt_file_and_a_model_config_with_a_byte_order_mark_read_as_without(tmp_path):
    plain = _sharegpt(tmp_path, TWO_ROUNDS, TWO_ROUNDS[:2])
    marked = tmp_path / "bom.json"
    marked.write_text(BOM + Path(plain.split(":", 1)[1]).read_text(), encoding="utf-8")
    assert _stats(f"sharegpt:{marked}", "--min-rounds", "1") == _stats(plain, "--min-rounds", "1")
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(BOM + (CONFIGS / "nemotron-h-8b.json").read_text(), encoding="utf-8")
    rc, out, err = marconi("models", config.parent)
    assert rc == 0 and "4 attn + 24 mamba2 + 24 mlp" in out, err


def test_a_swebench_trajectory_with_a_byte_order_mark_reads_as_without(tmp_path):
    from traces.registry import TraceOptions, load_trace

    traj = ROOT / "tests" / "traces" / "swebench_fixtures" / "fc__marshmallow-1867.traj"
    marked = tmp_path / "bom.traj"
    marked.write_bytes(BOM.encode() + traj.read_bytes())
    a, b = (load_trace(f"swebench:{p}", TraceOptions()) for p in (marked, traj))
    assert len(a.requests) == len(b.requests) > 1
    assert all((x.input_tokens == y.input_tokens).all() for x, y in zip(a.requests, b.requests))


# ------------------------------------------------------------------------------ stdin and pipes


def test_a_trace_from_stdin_or_a_pipe_says_to_save_it_to_a_file(tmp_path):
    """`--trace mooncake:-` was "mooncake file not found: -"; a pipe (`<(zcat t.gz)`, a FIFO) "is
    not a regular file", with no word on what to do: a trace is read twice (its identity for the
    caches, then its rows)."""
    save = "save it to a file and give that path; a .gz file is read as it is"
    one_line(
        marconi("traces", "stats", "mooncake:-"), f"mooncake: a trace is read from a file, not from stdin ('-'): {save}"
    )
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    for args in (["traces", "stats", f"mooncake:{fifo}"], ["run", "--trace", f"sharegpt:{fifo}", "--no-progress"]):
        what = "mooncake" if args[0] == "traces" else "ShareGPT"
        one_line(marconi(*args), f"{what} path is not a regular file: {fifo} (a pipe or device: {save})")


# ------------------------------------------------------------------------------ a hub repo id


@pytest.mark.parametrize(
    "args",
    [
        ["models"],
        ["run", *SMALL, "--policy", "sglang+"],
        ["advise", "--for", "sglang", *SMALL, "--trials", "1", "--workers", "1"],
    ],
    ids=["models", "run", "advise"],
)
@pytest.mark.parametrize(
    "repo, preset",
    [
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b"),
        ("ai21labs/AI21-Jamba-1.5-Mini", "jamba-1.5-mini"),
        ("mistralai/Mamba-Codestral-7B-v0.1", None),
    ],
    ids=["qwen", "jamba", "no-preset"],
)
def test_a_hugging_face_repo_id_says_it_is_not_fetched(tmp_path, args, repo, preset):
    """`--model Qwen/Qwen3-Next-80B-A3B-Instruct` (how the engines take a model) was "model config
    ...: no such file": it names the preset of that model, or how to get its config.json. A
    relative path in a folder here keeps its own error; "" is no path (it read ./config.json)."""
    flag = [] if args[0] == "models" else ["--model"]
    out = ["--out", tmp_path / "o"] if args[0] == "advise" else []
    use = f"use the preset {preset!r}, or " if preset else ""
    one_line(
        marconi(*args, *flag, repo, *out, cwd=tmp_path),
        f"model {repo!r} is no file or folder here, and a Hugging Face repo id is not fetched: {use}download its "
        f"config.json (huggingface-cli download {repo} config.json) and give that path",
    )
    assert not (tmp_path / "o").exists()


def test_a_missing_path_in_a_folder_here_and_an_empty_model_keep_their_errors(tmp_path):
    (tmp_path / "Qwen").mkdir()
    one_line(marconi("models", "Qwen/typo", cwd=tmp_path), "model config Qwen/typo: no such file")
    one_line(marconi("models", ""), "unknown model ''; valid: marconi-7b,")


def test_two_spellings_of_one_gpu_are_one_grid_point(tmp_path):
    """`sweep --gpu h100,H100` said "gpu(2) = 1 configuration (2 grid points; policies that
    ignore alpha run once)": the reason was wrong (the two are one GPU)."""
    rc, out, err = marconi("sweep", *SMALL, "--policy", "sglang+", "--gpu", "h100,H100 SXM", "--out", tmp_path / "s")
    assert rc == 0, err
    assert out.splitlines()[0].startswith("grid: one point = 1 configuration | "), out
    assert out.splitlines()[0].endswith("| GPU h100"), out  # calibrated: no note follows


def test_report_and_plot_of_a_replay_folder_point_to_its_plot(tmp_path):
    """`marconi plot REPLAY_DIR --kind hit-rate` said "`marconi report REPLAY_DIR` prints them",
    which refuses a replay folder; report asked "(a `marconi replay --out` folder?)" and stopped."""
    import pandas as pd

    folder = tmp_path / "rp"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"settings": {"model": "replay-tiny"}, "summary": {"hits": 3}}))
    pd.DataFrame({"request_id": [0, 1]}).to_parquet(folder / "requests.parquet")
    draw = f"`marconi plot {folder} --kind replay` draws it"
    one_line(
        marconi("report", folder),
        f"{folder} holds a `marconi replay --out` result, not a run's or a sweep's results: {draw}",
    )
    one_line(
        marconi("plot", folder, "--kind", "hit-rate", "--out", tmp_path / "f"),
        f"{folder} holds a `marconi replay --out` result, not the rows of `marconi sweep`: {draw}",
    )
    assert not (tmp_path / "f").exists()


def test_a_run_says_how_many_bad_rows_it_skipped(tmp_path):
    """`run --skip-bad-rows` replayed what was left and said nothing of what was skipped (only
    `traces stats` counted it)."""
    rows = SAMPLE.read_text().splitlines()[:12]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([*rows[:5], "{not json", '{"timestamp": 1}', *rows[5:]]) + "\n")
    for fmt in ("table", "json"):
        rc, out, err = marconi("run", "--trace", f"mooncake:{path}", "--skip-bad-rows", "--policy", "sglang+",
                               "--no-progress", "--format", fmt)  # fmt: skip
        assert rc == 0, err
        assert f"note: 2 bad rows of mooncake:{path} skipped (--skip-bad-rows)" in err.splitlines(), err
    one_line(
        marconi("run", "--trace", f"mooncake:{path}", "--policy", "sglang+", "--no-progress"), f"{path}:6: bad JSON"
    )


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory) -> Path:
    """A sweep without --save-requests: marconi at two static alphas and two capacities."""
    results = tmp_path_factory.mktemp("sweep") / "s"
    args = ["--policy", "marconi", "--alpha", "0,1", "--capacity", "1GB,2GB", "--workers", "1"]
    rc, out, err = marconi("sweep", *SMALL, *args, "--out", results)
    assert rc == 0, err
    return results


def test_plot_all_draws_what_a_sweep_without_records_has(tmp_path, small_sweep):
    """`plot --kind all` of a sweep run without --save-requests drew two figures, then stopped
    with exit 2 at ttft ("no requests records"): it draws every figure it can and says which not."""
    results, figs = small_sweep, tmp_path / "f"
    rc, out, err = marconi("plot", results, "--kind", "all", "--out", figs)
    assert rc == 0, err
    drawn = ("hit-rate", "alpha", "ttft-load", "misses")
    assert out.split() == [str(figs / f"{k}.{x}") for k in drawn for x in ("png", "svg")], out
    assert sorted(p.name for p in figs.iterdir()) == sorted(f"{k}.{x}" for k in drawn for x in ("png", "svg"))
    assert err.strip() == (
        f"note: ttft, occupancy not drawn: {results} has no per-request records (rerun the sweep with --save-requests)"
    )
    one_line(marconi("plot", results, "--kind", "ttft", "--out", figs), "no requests records in")  # asked for: refused


@pytest.mark.parametrize(
    "args",
    [["sweep", "--policy", "sglang+"], ADVISE],
    ids=["sweep", "advise"],
)
def test_a_ray_address_without_the_ray_engine_is_refused(tmp_path, args):
    """`--ray-address HOST` without `--engine ray` ran on this machine's process pool, not on the
    cluster named, without a word."""
    out = tmp_path / "o"
    one_line(
        marconi(*args, *SMALL, "--ray-address", "10.0.0.1:6379", "--out", out),
        "--ray-address does nothing with --engine local (it is read by --engine ray): add --engine ray or leave it out",
    )
    assert not out.exists()


def test_replay_refuses_a_policy_knob_its_policy_does_not_read_and_a_policy_list():
    """`replay --policy sglang+ --alpha 1` replayed sglang+ as if --alpha meant something (`run`
    refuses it); `--policy sglang+,marconi` was "unknown policy 'sglang+,marconi'"."""
    replay = ["replay", "--device", "cpu", "--model", "replay-tiny", *SMALL, "--requests", "2"]
    one_line(
        marconi(*replay, "--policy", "sglang+", "--alpha", "1"),
        "--alpha does nothing for sglang+ (it is read by marconi)",
    )
    one_line(
        marconi(*replay, "--policy", "sglang+,marconi"),
        "--policy 'sglang+,marconi': a replay runs one policy (`marconi run` compares several): replay each on its own",
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", *SMALL, "--policy", "marconi", "--chunk-size", "32"],
            "--chunk-size does nothing with --state-alignment exact (it is read by --state-alignment chunk): leave it "
            "out or add --state-alignment chunk",
        ),
        (
            ["sweep", *SMALL, "--policy", "marconi", "--chunk-size", "32,64"],
            "--chunk-size does nothing with --state-alignment exact",
        ),
        (
            ["replay", "--device", "cpu", "--model", "replay-tiny", *SMALL, "--batch-tokens", "100"],
            "--batch-tokens does nothing with --batch 1 (it sizes the calls of --batch > 1): leave it out",
        ),
    ],
    ids=["run-chunk", "sweep-chunk", "replay-batch-tokens"],
)
def test_options_that_cannot_act_here_are_refused(tmp_path, args, message):
    """--chunk-size without --state-alignment chunk, --batch-tokens without --batch > 1: each was
    taken and changed nothing."""
    one_line(marconi(*args, "--out", tmp_path / "o"), message)
    assert not (tmp_path / "o").exists()


def test_the_same_options_where_they_act_run(tmp_path):
    rc, out, err = marconi("run", *SMALL, "--policy", "marconi", "--chunk-size", "32", "--state-alignment", "chunk")
    assert rc == 0, err


@pytest.mark.parametrize(
    "args",
    [
        ["run", *SMALL, "--seed", "3"],
        ["sweep", *SMALL, "--seed", "0:2"],
        ["run", "--trace", "mooncake:sample", "--seed", "1"],
    ],
    ids=["run", "sweep", "open-loop"],
)
def test_a_seed_that_draws_nothing_is_refused(tmp_path, args):
    """--seed seeds the Poisson session starts only: `sweep --seed 0:2` under uniform arrivals gave
    three identical rows (no variance where one looked for it); `--arrival poisson` reads it."""
    one_line(
        marconi(*args, "--policy", "sglang+", "--no-progress", "--out", tmp_path / "o"),
        "--seed does nothing with --arrival uniform (it seeds --arrival poisson's session starts; --trace-seed "
        "seeds the trace): leave it out or add --arrival poisson",
    )
    assert not (tmp_path / "o").exists()
    if args[0] == "run" and args[2] != "mooncake:sample":  # where it draws, it is taken
        rc, out, err = marconi(*args, "--policy", "sglang+", "--no-progress", "--arrival", "poisson")
        assert rc == 0, err


def test_traces_list_names_every_shipped_sample():
    """`mooncake:sample-synthetic` is shipped and loads, but `traces list` and --trace's help did
    not name it: a user could not find it."""
    rc, out, err = marconi("traces", "list")
    assert rc == 0, err
    assert any(line.split()[:1] == ["mooncake:sample-synthetic"] for line in out.splitlines()), out
    assert _stats("mooncake:sample-synthetic")[:2] == ["sessions                300", "requests                300"]


def test_a_csv_or_a_json_array_given_as_a_jsonl_trace_says_what_it_is(tmp_path):
    """A CSV (the Azure traces' format) or a JSON array given as a Mooncake trace was "bad JSON:
    Expecting value (column 1)" or "row is not a JSON object": row 1's line says what the file is."""
    lines = "a mooncake trace is JSON Lines (one JSON object a line)"
    csv = tmp_path / "t.csv"
    csv.write_text("timestamp,input_length,output_length\n0,100,10\n")
    one_line(
        marconi("traces", "stats", f"mooncake:{csv}"),
        f"{csv}:1: bad JSON: Expecting value (column 1); the file looks like CSV: {lines}",
    )
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:3]]
    for name, text in (("one.json", json.dumps(rows)), ("pretty.json", json.dumps(rows, indent=2))):
        (tmp_path / name).write_text(text)
        one_line(marconi("traces", "stats", f"mooncake:{tmp_path / name}"), f"{tmp_path / name}:1: ")
        assert f"; the file is a JSON array: {lines}" in marconi("traces", "stats", f"mooncake:{tmp_path / name}")[2]
    cut = tmp_path / "cut.jsonl"  # a JSON Lines file with a bad row 1 keeps its plain message
    cut.write_text(SAMPLE.read_text().splitlines()[0][:-5] + "\n")
    one_line(marconi("traces", "stats", f"mooncake:{cut}"), f"{cut}:1: bad JSON: ")
    assert "JSON Lines" not in marconi("traces", "stats", f"mooncake:{cut}")[2]


@pytest.mark.parametrize(
    "args",
    [
        ["run", *SMALL, "--policy", "sglang"],
        ["sweep", *SMALL, "--policy", "sglang"],
        ["advise", "--for", "sglang", "--model", "qwen3.5-9b", *SMALL, "--trials", "1", "--workers", "1"],
    ],
    ids=["run", "sweep", "advise"],
)
def test_a_gpu_memory_without_its_unit_is_refused(tmp_path, args):
    """`--gpu-memory 80` (GB meant) was 80 bytes: "the engine's split of --gpu-memory 80B leaves 80B
    for KV" (run) or "leaves no cache" (advise), which named bytes but not the missing unit. A large
    byte count (what advise's `marconi run` lines print) stays a size."""
    one_line(
        marconi(*args, "--gpu-memory", "80", "--out", tmp_path / "o"),
        "--gpu-memory 80 is 80 bytes (a number without a unit is bytes): give its unit, e.g. 80GB",
    )
    assert not (tmp_path / "o").exists()
    if args[0] == "run":
        assert marconi(*args, "--gpu-memory", "52400000000")[0] == 0


def test_plot_where_takes_report_s_key_value_form(tmp_path, small_sweep):
    """`report --where capacity=2GB` filters; `plot --where capacity=2GB` was "invalid syntax" (a
    pandas query only): both forms filter now, and a value no row has says so."""
    for where in ("capacity=2GB", "capacity_bytes == 2e9"):
        rc, out, err = marconi("plot", small_sweep, "--where", where, "--out", tmp_path / "f", "--force")
        assert rc == 0, err
    one_line(
        marconi("plot", small_sweep, "--where", "capacity=3GB", "--out", tmp_path / "g"),
        "--where 'capacity=3GB' selects no rows",
    )
    one_line(
        marconi("plot", small_sweep, "--where", "capaciti=2GB", "--out", tmp_path / "g"),
        "--where 'capaciti=2GB': no column",
    )


def test_a_named_policy_the_trace_blocks_cannot_carry_is_refused_before_any_runs(tmp_path, monkeypatch):
    """`--policy sglang,vllm` on Mooncake: vllm's 528-token grid is off the 512-token blocks. The
    refusal came when vllm's turn came, after sglang had been simulated (its progress shown, its
    time spent); now before any policy runs, and nothing is written."""
    out = tmp_path / "o"
    args = ["run", "--trace", "mooncake:sample", "--policy", "sglang,vllm", "--model", "qwen3.5-9b"]
    rc, stdout, err = marconi(*args, "--capacity", "10GB", "--out", out)
    one_line(
        (rc, stdout, err),
        "policy vllm checkpoints every 528 tokens, finer than (or not a multiple of) the trace's 512-token blocks",
    )
    assert "simulating" not in err and not out.exists()
    # the check itself, without the CLI: the first named policy that does not fit is named
    from types import SimpleNamespace

    from sim.cli.run import refuse_unfitting_policies
    from sim.config import SimConfig
    from sim.errors import UsageError

    trace = SimpleNamespace(block_tokens=512)
    cfgs = [SimConfig(policy=p, model="qwen3.5-9b") for p in ("sglang", "vllm", "vllm+")]
    with pytest.raises(UsageError, match="policy vllm checkpoints every 528 tokens"):
        refuse_unfitting_policies(cfgs, trace)
    refuse_unfitting_policies(cfgs[:1], trace)  # sglang fits: nothing said
    refuse_unfitting_policies(cfgs, SimpleNamespace(block_tokens=1))  # token traces carry every grid
