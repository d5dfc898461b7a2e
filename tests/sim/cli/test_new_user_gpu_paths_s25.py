"""A new user's own model and GPU (session 25): config.json files, the GPU catalogue, tensor
parallel groups, through the real CLI in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from refusals import one_line
from sim.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


def _config(tmp_path, name: str, **edits) -> str:
    cfg = json.loads((CONFIGS / name).read_text())
    cfg.update(edits)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_a_bad_state_dtype_names_the_field_the_config_gives(runner, tmp_path):
    """A config naming its state dtype as mamba_ssm_cache_dtype (vLLM's spelling) with a bad value
    was refused naming 'mamba_ssm_dtype', a field that config does not hold."""
    path = _config(tmp_path, "nemotron-h-8b.json", mamba_ssm_cache_dtype="int8")
    one_line(
        runner.invoke(main, ["models", path]),
        f"model config {path}: field 'mamba_ssm_cache_dtype' names dtype 'int8', not one of float32, bfloat16, float16",
    )
    path = _config(tmp_path, "qwen3-next-80b-a3b.json", mamba_ssm_cache_dtype="int8")
    one_line(
        runner.invoke(main, ["models", path]),
        f"model config {path}: field 'mamba_ssm_cache_dtype' names dtype 'int8', not one of float32, bfloat16, float16",
    )


SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
ADVISE = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", *SMALL, "--trials", "1", "--workers", "1"]


def test_advise_gpu_memory_with_a_count_and_no_gpu_prices_that_group(runner, tmp_path):
    """`advise --gpu-memory 2x80GiB` without --gpu recommended `--tp-size 2` (the cache sized for
    two GPUs) while its TTFT was priced on one GPU (the preset's), and its `marconi run` line had
    no --tensor-parallel: the group it spells is priced, as with --gpu."""
    res = runner.invoke(main, [*ADVISE, "--gpu-memory", "2x80GiB", "--out", str(tmp_path / "two")])
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == "note: --gpu-memory 2x80GiB: priced as a group of 2x h200 (--tensor-parallel 2)"
    assert "| GPU 2x h200 | --gpu-memory 160GiB" in res.stdout
    assert "--tp-size 2" in res.stdout
    assert "--model qwen3.5-9b --tensor-parallel 2 " in res.stdout  # the reproducing run line
    # the preset's own count (1 for qwen3.5-9b) spelled out: no note, no group
    res = runner.invoke(main, [*ADVISE, "--gpu-memory", "1x80GiB", "--out", str(tmp_path / "one")])
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert "| GPU" not in res.stdout and "--tensor-parallel" not in res.stdout


def test_tpot_of_requests_without_a_second_output_token_is_absent(runner, tmp_path):
    """A trace whose requests ask for no output tokens printed TPOT p50 0.0 (and 0.0 in JSON), a
    time per output token no request had: it is "-" in the table, null in JSON."""
    path = tmp_path / "zero.jsonl"
    rows = [
        {
            "session_id": s,
            "turn_id": t,
            "ts": s + 5.0 * t,
            "num_input_tokens": 100 * (t + 1),
            "num_output_tokens": 0,
            "input_tokens": list(range(100 * (t + 1))),
            "output_tokens": [],
        }
        for t in range(2)
        for s in range(3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["run", "--trace", f"marconi-jsonl:{path}", "--model", "qwen3.5-9b", "--policy", "sglang+", "--no-progress"]
    res = runner.invoke(main, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert (row["tpot_p50_ms"], row["tpot_p95_ms"]) == (None, None)
    assert row["ttft_p50_ms"] > 0 and row["e2e_p50_ms"] == pytest.approx(row["ttft_p50_ms"])  # prefill only
    res = runner.invoke(main, [*args, "--columns", "tpot_p50_ms,tpot_p95_ms"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1].split() == ["sglang+", "-", "-"]


def test_a_gpu_memory_in_gib_is_also_printed_in_gb_where_gb_sums_use_it(runner, tmp_path):
    """advise printed `--gpu-memory 80GiB: bf16 weights 18GB, --mem-fraction-static 0.88 -> cache
    57.6GB`, and 0.88 x 80 - 18 is 52.4, not 57.6: the memory was GiB, every other size GB. The
    memory is now given in GB too (80GiB = 85.9GB: 0.88 x 85.9 - 18 = 57.6), and so are the
    refusals that set a GPU's memory beside weights in GB."""
    res = runner.invoke(main, [*ADVISE, "--gpu", "h100", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    head = res.stdout.splitlines()[0]
    assert "| --gpu-memory 80GiB = 85.9GB: bf16 weights 18GB, --mem-fraction-static 0.88 -> cache 57.6GB |" in head
    assert round(0.88 * 80 * 2**30 / 1e9 - 18, 1) == 57.6
    res = runner.invoke(main, ["run", *SMALL, "--model", "qwen3.5-27b", "--gpu", "a100-40gb", "--tensor-parallel", "1"])
    one_line(
        res,
        "qwen3.5-27b's bf16 weights (54GB) are more than the memory of 1x a100-40gb (40GiB = 42.95GB): give "
        "--tensor-parallel 2",
    )


def test_a_gpu_memory_below_one_state_names_gpu_memory(runner):
    """`run --policy sglang --gpu-memory 1MB` said `capacity 1MB is smaller than one state
    checkpoint`, a --capacity the user never gave (--gpu-memory replaces it for sglang)."""
    args = ["run", "--sessions", "3", "--no-progress", "--model", "nemotron-h-8b", "--policy", "sglang"]
    one_line(
        runner.invoke(main, [*args, "--gpu-memory", "1MB"]),
        "--gpu-memory 1MB is smaller than one state checkpoint of nemotron-h-8b (102MB)",
    )
    one_line(
        runner.invoke(main, [*args, "--capacity", "1MB"]),
        "capacity 1MB is smaller than one state checkpoint of nemotron-h-8b (102MB)",
    )


def _first_prefill_steps(runner, events, model: str, policy: str) -> tuple[int, list]:
    """The prompt length of request 0 and the prefill chunks its steps ran."""
    events.unlink(missing_ok=True)
    res = runner.invoke(main, ["run", *SMALL, "--model", model, "--policy", policy, "--events", str(events)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    n = next(r["input_tokens"] for r in rows if r["event"] == "lookup" and r["request_id"] == 0)
    return n, [p for r in rows if r["event"] == "step" for p in r["prefills"] if p[0] == 0]


def test_vllm_on_a_dense_model_prefills_without_the_mamba_block_split(runner, tmp_path):
    """`run --policy vllm` on a dense config.json (llama-2-7b) cut every prefill at the last block
    boundary before the prompt's end (vLLM's _mamba_block_aligned_split): two steps for one
    prompt, so its TTFT was twice SGLang's at the same hits; vLLM runs that split only for a model
    with Mamba layers (need_mamba_block_aligned_split), so a dense prompt is one step."""
    events = tmp_path / "ev.jsonl"
    for policy in ("vllm", "vllm-0.11-align"):
        n, steps = _first_prefill_steps(runner, events, str(CONFIGS / "llama-2-7b.json"), policy)
        assert steps == [[0, 0, n]], (policy, steps)
    # a hybrid model keeps it: qwen3.5-9b's 528-token block cuts the prompt at 528
    n, steps = _first_prefill_steps(runner, events, "qwen3.5-9b", "vllm")
    assert n > 528 and steps == [[0, 0, 528], [0, 528, n]], steps


def test_advise_tensor_parallel_out_of_range_is_named(runner, tmp_path):
    """`advise --tensor-parallel -2` said `timing: every term must be non-negative` (its memory's
    default priced a group of -2 GPUs before any check); it is refused as run refuses it."""
    for tp in ("-2", "65"):
        res = runner.invoke(main, [*ADVISE, "--tensor-parallel", tp, "--out", str(tmp_path / "a")])
        one_line(res, f"--tensor-parallel must be in 0..64, not {tp}")
        assert not (tmp_path / "a").exists()


def test_a_group_that_splits_several_mamba_groups_unevenly_is_refused(runner):
    """`run --model nemotron-h-8b --tensor-parallel 16` ran, its 8 Mamba groups replicated to 16;
    vLLM's and SGLang's MambaMixer2 assert n_groups % tp == 0 or n_groups == 1, so no engine serves
    it. A single group (Granite 4.0-H) is still replicated."""
    from sim.cost import get_model, group_spec

    res = runner.invoke(main, ["run", *SMALL, "--model", "nemotron-h-8b", "--tensor-parallel", "16"])
    one_line(
        res,
        "--tensor-parallel 16 does not divide the 8 Mamba groups of nemotron-h-8b (vLLM and SGLang replicate a "
        "single group only): give a divisor of 8",
    )
    assert group_spec(get_model("nemotron-h-8b"), 8).mamba_n_groups == 8
    assert group_spec(get_model("granite-4.0-h-small"), 16).mamba_n_groups == 16


def test_advise_gpu_memory_group_refusals_are_one_line(runner, tmp_path):
    """A --gpu-memory NxSIZE whose group no engine runs, or that leaves no cache, printed its
    'priced as a group' note and then the refusal, which named --tensor-parallel 3, a flag never
    given: one line naming the --gpu-memory."""
    out = str(tmp_path / "a")
    for memory, gpu, message in (
        ("3x80GiB", [], "--gpu-memory 3x80GiB spells a group of 3 GPUs: --tensor-parallel 3 does not divide the 16"),
        ("3x80GiB", ["--gpu", "h100"], "--gpu-memory 3x80GiB spells a group of 3 GPUs: --tensor-parallel 3 does not"),
        ("100x80GB", [], "--gpu-memory 100x80GB spells a group of 100 GPUs: --tensor-parallel must be in 0..64"),
        ("2x0GB", ["--gpu", "h100"], "--gpu-memory must be a finite size > 0, not '2x0GB'"),
    ):
        res = runner.invoke(main, [*ADVISE, "--gpu-memory", memory, *gpu, "--out", out])
        one_line(res, message)
    big = [a if a != "qwen3.5-9b" else "qwen3.5-397b-a17b" for a in ADVISE]
    res = runner.invoke(main, [*big, "--gpu-memory", "4x141GiB", "--out", out])
    one_line(res, "--gpu-memory 564GiB = 605.6GB leaves no cache for qwen3.5-397b-a17b under sglang")


def test_a_vllm_block_beyond_the_hash_names_the_policy_and_model(runner):
    """`run --policy sglang,vllm --model nemotron-h-56b.json` said only `a 4128-token block is
    larger than the simulator hashes (4096 tokens)`: which policy, and what to do, went unsaid."""
    path = str(CONFIGS / "nemotron-h-56b.json")
    res = runner.invoke(main, ["run", *SMALL, "--model", path, "--policy", "sglang,vllm"])
    one_line(
        res,
        f"vllm: vLLM's block for {path} is 4128 tokens (one layer's state page over its attention page per "
        "token), more than the 4096 the simulator hashes: pick another policy",
    )


def test_advise_for_throughput_shows_the_throughput_it_compared(runner, tmp_path):
    """`advise --objective throughput` printed token hit and TTFT p95 beside the defaults, never the
    throughput it chose by: a row of output tokens per second now does, as advice.json holds it."""
    res = runner.invoke(main, [*ADVISE, "--objective", "throughput", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "a" / "advice.json").read_text())
    d, r = data["defaults"]["tuned"]["output_tokens_per_s"], data["recommended"]["tuned"]["output_tokens_per_s"]
    (row,) = [line for line in res.stdout.splitlines() if line.startswith("output tok/s (whole trace)")]
    assert row.split()[4:6] == [f"{d:,.1f}", f"{r:,.1f}"]
    res = runner.invoke(main, [*ADVISE, "--out", str(tmp_path / "b")])
    assert res.exit_code == 0 and "output tok/s" not in res.stdout
