"""The open decisions session 22's helpers left (session 23): GPU memory in GB and GiB, the Granite
and Nemotron-H defaults, NVL bridge groups, attention-only MoE configs, an unknown --gpu, sweep's
memory check, plot styles; through the real CLI in process where the CLI is what changed."""

from __future__ import annotations

import re

import pytest

from refusals import one_line
from sim.cli import main
from sim.gpus import GPUS, get_gpu

SMALL = ["--trace", "synthetic:chat:sessions=2,turns=2", "--no-progress"]
ADVISE = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", *SMALL, "--trials", "1", "--workers", "1"]


def test_the_catalogue_holds_the_datasheets_memory_in_gib():
    """The datasheets' "80GB HBM3" is a binary figure (80 x 2^30 B; nvidia-smi: 81,559 MiB); the
    catalogue held 80e9 B, so an H100's own 80GiB was more than its memory."""
    datasheet = {
        "a100-40gb": 40,
        "a100": 80,
        "h100": 80,
        "h100-pcie": 80,
        "h100-nvl": 94,
        "h20": 96,
        "h200": 141,
        "h200-nvl": 141,
        "gh200": 96,
        "gh200-144gb": 144,
        "b200": 180,
        "l40s": 48,
        "mi300x": 192,
    }
    assert {name: g.memory_bytes for name, g in GPUS.items()} == {k: v * 2**30 for k, v in datasheet.items()}
    from sim.gpus import datasheet_memory

    assert datasheet_memory(get_gpu("h100")) == "80GiB"
    # the entry's memory as a spelling of it, in either unit
    assert get_gpu("H100 80GB").name == get_gpu("h100-80gib").name == "h100"
    assert get_gpu("A100 40GiB").name == "a100-40gb"


def test_advise_takes_a_gpus_whole_memory_in_gib(runner, tmp_path):
    """`advise --gpu h100 --gpu-memory 80GiB` said "more than the memory of 1x h100 (80GB)"."""
    res = runner.invoke(main, [*ADVISE, "--gpu", "h100", "--gpu-memory", "80GiB", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "| GPU 1x h100 | --gpu-memory 80GiB = 85.9GB: bf16 weights 18GB" in res.output.splitlines()[0]
    res = runner.invoke(main, [*ADVISE, "--gpu", "h100", "--gpu-memory", "2x80GiB", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert "| GPU 2x h100 | --gpu-memory 160GiB = 171.8GB: " in res.stdout.splitlines()[0]
    # the default is the catalogue's figure, in its unit; a byte more is refused, in the same unit
    res = runner.invoke(main, [*ADVISE, "--gpu", "h100", "--out", str(tmp_path / "c")])
    assert res.exit_code == 0 and "| GPU 1x h100 | --gpu-memory 80GiB = 85.9GB: " in res.output.splitlines()[0], (
        res.output
    )
    one_line(
        runner.invoke(main, [*ADVISE, "--gpu", "h100", "--gpu-memory", "85899345921", "--out", str(tmp_path / "d")]),
        "--gpu-memory 85899345921 is more than the memory of 1x h100 (80GiB = 85.9GB): lower it",
    )


def test_run_takes_capacity_and_gpu_memory_in_gib_exactly(runner):
    """run: --capacity and --gpu-memory in GiB are exact (80GiB = 85,899,345,920 B): the cache left
    beside qwen3.5-27b's 54e9 B of weights on one H100 is 31,899,345,920 B, no byte more."""
    args = ["run", *SMALL, "--model", "qwen3.5-27b", "--gpu", "h100"]
    assert runner.invoke(main, [*args, "--capacity", "29.708GiB"]).exit_code == 0  # 31,898,722,107 B
    one_line(
        runner.invoke(main, [*args, "--capacity", "29.709GiB"]),  # 31,899,795,849 B
        "--capacity 31.9GB and qwen3.5-27b's bf16 weights (54GB) are more than the memory of 1x h100 (80GiB = 85.9GB)",
    )
    one_line(
        runner.invoke(main, [*args, "--capacity", "81GiB"]),
        "--capacity 81GiB is more than the memory of 1x h100 (80GiB = 85.9GB): lower it",
    )
    sglang = ["run", *SMALL, "--model", "qwen3.5-9b", "--gpu", "h100", "--policy", "sglang"]
    assert runner.invoke(main, [*sglang, "--gpu-memory", "62GiB"]).exit_code == 0
    one_line(
        runner.invoke(main, [*sglang, "--gpu-memory", "64GiB"]),
        "--gpu-memory 64GiB and qwen3.5-9b's bf16 weights (18GB) are more than the memory of 1x h100 (80GiB = 85.9GB)",
    )


@pytest.mark.parametrize("command, flag", [("run", "--capacity"), ("sweep", "--capacity"), ("replay", "--capacity")])
def test_every_size_option_says_both_units(runner, command, flag):
    """replay's --capacity said only "Cache capacity." where run's and sweep's say what GB and GiB are."""
    res = runner.invoke(main, [command, "--help"])
    text = re.sub(r"\s+", " ", re.split(rf"{flag} (?:TEXT|LIST)", res.output)[1].split(" --", 1)[0])
    assert "5GB = 5e9 B, 5GiB = 5*2^30 B" in text, text


def test_gpu_memory_options_say_both_units(runner):
    for command in ("run", "advise"):
        text = re.sub(r"\s+", " ", runner.invoke(main, [command, "--help"]).output)
        assert re.search(r"--gpu-memory TEXT [^-]*(\d+)GB = \1e9 B, \1GiB = \1\*2\^30 B", text), command


def _granite(tmp_path, drop=(), **edits) -> str:
    import json
    from pathlib import Path

    cfg = json.loads(
        (Path(__file__).resolve().parents[2] / "data" / "configs" / "granite-4.0-h-small.json").read_text()
    )
    for k in drop:
        del cfg[k]
    cfg.update(edits)
    path = tmp_path / f"granite-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_granite_without_num_local_experts_takes_the_config_class_default(tmp_path):
    """A Granite 4.0 hybrid config.json without num_local_experts was read as a dense model (the
    shared MLP alone); GraniteMoeHybridConfig takes 8 experts, top-2 (num_experts_per_tok left out)."""
    from sim.cost import get_model
    from sim.errors import UsageError
    from sim.hf_config import read_config

    # d 4096, experts 768 wide, shared 1536, 40 layers: top-2 of 8 SwiGLU experts, the shared one, the router
    r = read_config(_granite(tmp_path, drop=("num_local_experts", "num_experts_per_tok")))
    assert r["mlp_active_params"] == 3 * 4096 * 768 * 2 + 3 * 4096 * 1536 + 4096 * 8 == 37_781_504
    full = read_config(_granite(tmp_path))  # 72 experts, top-10 as published
    block_72 = 3 * 4096 * 768 * 72 + 3 * 4096 * 1536 + 4096 * 72
    block_8 = 3 * 4096 * 768 * 8 + 3 * 4096 * 1536 + 4096 * 8
    assert full["total_params"] - r["total_params"] == 40 * (block_72 - block_8)
    # FLOPs: 2 a weight, the MLP's share of a token
    spec = get_model(_granite(tmp_path, drop=("num_local_experts", "num_experts_per_tok")))
    published = get_model(_granite(tmp_path))
    assert spec.mlp_active_params == 37_781_504
    assert published.mlp_active_params == 3 * 4096 * 768 * 10 + 3 * 4096 * 1536 + 4096 * 72
    # 0 given: dense, the shared MLP alone (Granite 4.0 H 1B / 350M write it so)
    assert read_config(_granite(tmp_path, num_local_experts=0))["mlp_active_params"] == 3 * 4096 * 1536
    # the published top-10 with the default 8 experts: refused, naming the field to give
    with pytest.raises(UsageError) as err:
        read_config(_granite(tmp_path, drop=("num_local_experts",)))
    assert str(err.value).endswith(
        "field 'num_local_experts' is left out, and granitemoehybrid's default of 8 experts is fewer than "
        "'num_experts_per_tok' (10): give it"
    )


def test_nemotron_h_state_is_fp32_unless_the_config_names_a_dtype(runner, tmp_path):
    """A Nemotron-H config without mamba_ssm_cache_dtype was priced with its Mamba state in the model
    dtype (bf16); vLLM's --mamba-ssm-cache-dtype auto takes fp32 for Nemotron-H
    (NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE) and SGLang's --mamba-ssm-dtype is
    float32: 24 layers x (128 x 64 x 128 x 4 B state + (8192 + 2 x 8 x 128) x 3 x 2 B conv)."""
    import json
    from pathlib import Path

    from sim.cost import get_model

    res = runner.invoke(main, ["models", "nemotron-h-8b", "docs/examples/nemotron-h-8b"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    state = 24 * (128 * 64 * 128 * 4 + (8192 + 2 * 8 * 128) * 3 * 2)
    assert lines[2].split()[-3] == lines[3].split()[-3] == f"{state:,}" == "102,137,856"
    note = (
        "Mamba state in fp32: no mamba_ssm_cache_dtype in the config, and vLLM (its Nemotron-H default for "
        "--mamba-ssm-cache-dtype auto) and SGLang (--mamba-ssm-dtype float32) keep it so (docs/models.md)"
    )
    assert lines[4:] == [f"note: nemotron-h-8b: {note}", f"note: docs/examples/nemotron-h-8b: {note}"]
    rows = json.loads(runner.invoke(main, ["models", "nemotron-h-8b", "jamba-1.5-mini", "--format", "json"]).output)
    assert [bool(r["state_note"]) for r in rows] == [True, False]
    # a dtype the config names is kept, and nothing said
    cfg = json.loads((Path(__file__).resolve().parents[2] / "data" / "configs" / "nemotron-h-8b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "mamba_ssm_cache_dtype": "bfloat16"}))
    spec = get_model(str(tmp_path))
    assert spec.state_bytes() == 24 * (128 * 64 * 128 * 2 + 10240 * 3 * 2) and spec.state_note == ""
    res = runner.invoke(main, ["models", str(tmp_path)])
    assert not any(line.startswith("note:") for line in res.output.splitlines())


def test_nvl_groups_beyond_their_nvlink_bridge_all_reduce_over_pcie():
    """H100 NVL (and PCIe) GPUs are NVLink-bridged in pairs, H200 NVL in 2s or 4s: --tensor-parallel 4
    on h100-nvl priced every all-reduce at the bridge's 600 GB/s; past the bridge the ring crosses
    PCIe Gen5 (128 GB/s both ways, 64 GB/s each way)."""
    from sim.cost import default_timing
    from sim.gpus import ALLREDUCE_LATENCY_S, allreduce_s

    nvl, h200nvl, sxm = get_gpu("h100-nvl"), get_gpu("h200-nvl"), get_gpu("h100")
    mb = 1e6
    assert allreduce_s(nvl, mb, 2) == ALLREDUCE_LATENCY_S + 2 * (1 / 2) * mb / 300e9  # the pair's NVLink
    assert allreduce_s(nvl, mb, 4) == ALLREDUCE_LATENCY_S + 2 * (3 / 4) * mb / 64e9  # PCIe
    assert allreduce_s(get_gpu("h100-pcie"), mb, 4) == allreduce_s(nvl, mb, 4)
    assert allreduce_s(h200nvl, mb, 4) == ALLREDUCE_LATENCY_S + 2 * (3 / 4) * mb / 450e9  # a 4-way bridge
    assert allreduce_s(h200nvl, mb, 8) == ALLREDUCE_LATENCY_S + 2 * (7 / 8) * mb / 64e9
    assert allreduce_s(sxm, mb, 8) == ALLREDUCE_LATENCY_S + 2 * (7 / 8) * mb / 450e9  # NVSwitch: no bridge
    # nemotron-h-8b: 52 blocks, each token's 4096 bf16 activations all-reduced after each
    two, four = default_timing("nemotron-h-8b", "h100-nvl", 2), default_timing("nemotron-h-8b", "h100-nvl", 4)
    assert two.comm_ms_per_token == pytest.approx(52 * 2 * (1 / 2) * 8192 / 300e9 * 1e3, rel=1e-12)  # 0.00142
    assert four.comm_ms_per_token == pytest.approx(52 * 2 * (3 / 4) * 8192 / 64e9 * 1e3, rel=1e-12)  # 0.009984
    assert "over 600 GB/s links;" in two.source
    assert "over 128 GB/s links (PCIe: 4 GPUs span h100-nvl's NVLink bridges of 2)" in four.source


QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B config.json, the fields the reader uses
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json, the fields the reader uses (no head_dim)
    "model_type": "mixtral",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _json(tmp_path, cfg: dict, name: str) -> str:
    import json

    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def test_attention_only_moe_configs_read_by_hand(runner, tmp_path):
    """qwen3_moe and mixtral configs were refused ("model_type ... is not one this reader knows"):
    attention-only MoE models, read as the dense llama path is, to compare with the hybrids."""
    from sim.cost import get_model

    q = get_model(_json(tmp_path, QWEN3_30B_A3B, "qwen3.json"))
    # KV: 48 layers x (K, V) x 4 KV heads x 128 x 2 B
    assert q.kv_bytes_per_token() == 48 * 2 * 4 * 128 * 2 == 98_304 and q.state_bytes() == 0 and not q.is_hybrid
    # a layer: q, k, v, o; score + value products 2 x 32 x 128 a token (causal: the linear half);
    # MoE: top-8 of 128 SwiGLU experts 768 wide and the router
    attn = 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 32 * 128 * 2048  # 18,874,368
    qmoe = 3 * 2048 * 768 * 8 + 2048 * 128  # 38,010,880
    assert q.flops(1) == 48 * (2 * attn + 2 * 32 * 128 + 2 * qmoe + 2 * 32 * 128)
    assert q.flops(1024) / 1024 == 48 * (2 * attn + 2 * 32 * 128 + 2 * qmoe) + 48 * 2 * 32 * 128 * 1024
    # 30.5B weights in all (Qwen3-30B-A3B)
    assert q.total_params == 48 * (attn + 3 * 2048 * 768 * 128 + 2048 * 128) + 2 * 151936 * 2048 == 30_531_911_680

    m = get_model(_json(tmp_path, MIXTRAL_8X7B, "mixtral.json"))
    assert m.attn_head_dim == 4096 // 32 == 128  # MixtralConfig: hidden / heads
    assert m.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2 == 131_072
    attn = 4096 * 4096 + 2 * 4096 * 8 * 128 + 4096 * 4096  # 41,943,040
    moe = 3 * 4096 * 14336 * 2 + 4096 * 8  # 352,354,304
    assert m.flops(1) == 32 * (2 * attn + 2 * 32 * 128 + 2 * moe + 2 * 32 * 128)
    assert m.total_params == 32 * (attn + 3 * 4096 * 14336 * 8 + 4096 * 8) + 2 * 32000 * 4096 == 46_702_526_464
    # left out: the config classes' KV heads and experts (Qwen3MoeConfig 4, 128 top-8; Mixtral 8, 8 top-2)
    lean = {k: v for k, v in QWEN3_30B_A3B.items() if k not in ("num_key_value_heads", "num_experts")}
    assert get_model(_json(tmp_path, lean, "lean.json")).kv_bytes_per_token() == 98_304
    lean = {k: v for k, v in MIXTRAL_8X7B.items() if k not in ("num_local_experts", "num_experts_per_tok")}
    assert get_model(_json(tmp_path, lean, "lean-m.json")).flops(1) == m.flops(1)
    # Qwen3-MoE's dense layers: mlp_only_layers [0] -> layer 0 a SwiGLU 6144 wide, 47 MoE blocks
    dense0 = get_model(_json(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0]}, "d0.json"))
    assert dense0.flops(1) - q.flops(1) == 2 * (3 * 2048 * 6144 - qmoe) == -524_288
    # and the CLI: models lists them, run compares them with a hybrid
    res = runner.invoke(main, ["models", str(tmp_path / "qwen3.json"), str(tmp_path / "mixtral.json")])
    assert res.exit_code == 0, res.output
    assert [line.split()[1:6] for line in res.output.splitlines()[2:]] == [
        ["48", "attn", "+", "48", "mlp"],
        ["32", "attn", "+", "32", "mlp"],
    ]
    res = runner.invoke(main, ["run", *SMALL, "--policy", "sglang+", "--model", str(tmp_path / "mixtral.json")])
    assert res.exit_code == 0, res.output


def test_a_model_type_still_unknown_is_one_line_naming_it(runner, tmp_path):
    path = _json(tmp_path, {**MIXTRAL_8X7B, "model_type": "deepseek_v3"}, "ds.json")
    one_line(
        runner.invoke(main, ["models", path]),
        f"model config {path}: model_type 'deepseek_v3' is not one this reader knows (qwen3_next, qwen3_5, "
        "qwen3_5_moe, nemotron_h, jamba, falcon_h1, granitemoehybrid, mamba2, llama, mistral, qwen2, qwen3, "
        "qwen3_moe, mixtral)",
    )


CATALOGUE = (
    "the catalogue (sim/gpus.py): a100-40gb, a100, h100, h100-pcie, h100-nvl, h20, h200, h200-nvl, gh200, "
    "gh200-144gb, b200, l40s, mi300x"
)


@pytest.mark.parametrize(
    "command, gpu, close",
    [
        (["run", *SMALL], "h800", " (close: h200, h100, gh200)"),
        (["advise", "--for", "sglang", *SMALL], "NVIDIA H100 96GB", " (close: h100, h200, a100)"),
        (["run", *SMALL], "L40", " (close: l40s)"),
        (["run", *SMALL], "tpu-v5", ""),
    ],
)
def test_an_unknown_gpu_names_the_close_entries_and_the_catalogue(runner, tmp_path, command, gpu, close):
    """`--gpu h800` printed click's list of choices alone; now the entries its spelling is close to
    (difflib, on the name without vendor, form factor and memory), then the catalogue: one line, exit 2."""
    res = runner.invoke(main, [*command, "--gpu", gpu, "--out", str(tmp_path / "o")])
    one_line(res, f"Invalid value for '--gpu': unknown GPU {gpu!r}{close}; {CATALOGUE}")
    assert not (tmp_path / "o").exists()


def test_sweep_and_the_library_name_the_close_entries_too(runner, tmp_path):
    from sim.errors import UsageError

    res = runner.invoke(main, ["sweep", *SMALL, "--gpu", "h100,h10", "--out", str(tmp_path / "s")])
    one_line(res, f"--gpu: Invalid value for '--gpu': unknown GPU 'h10' (close: h100, h20); {CATALOGUE}")
    with pytest.raises(UsageError) as err:
        get_gpu("a10")
    assert str(err.value) == f"unknown GPU 'a10' (close: a100); {CATALOGUE}"


def test_sweep_checks_the_memory_of_all_its_workers_once(runner, tmp_path, monkeypatch):
    """Each sweep worker ran the trace reader's memory check alone, against the whole machine's
    memory: N workers of one large trace could fill it. The parent now checks them together before
    they start: each holds the trace (its symbols) and a run of it as much again."""
    import sim.experiments.runners as runners

    trace = runners.task_trace({"trace": "synthetic:chat:sessions=2,turns=2"})
    per_worker = 2 * sum(r.input_tokens.nbytes + r.output_tokens.nbytes for r in trace.requests)
    monkeypatch.setattr(runners, "available_memory", lambda: int(2.5 * per_worker), raising=False)  # room for 2
    args = ["sweep", *SMALL, "--policy", "sglang+", "--capacity", "1GB,2GB,3GB,4GB", "--out", str(tmp_path / "s")]
    res = runner.invoke(main, [*args, "--workers", "4"])
    one_line(res, "4 sweep workers: each worker holds ")
    assert res.output.strip().endswith("of memory available: give --workers 2 or fewer"), res.output
    assert not list((tmp_path / "s").glob("**/*.parquet"))  # refused before any worker ran
    # the default (a worker a CPU) is lowered to what fits, and said
    monkeypatch.setattr(runners.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runners, "available_memory", lambda: int(1.5 * per_worker))  # room for 1
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith("note: 1 sweep worker, not 4 (one a CPU): each worker holds "), res.stderr
    assert "ran 4 configurations" in res.stdout
    # within the memory: no word
    monkeypatch.setattr(runners, "available_memory", lambda: 4 * per_worker)
    assert runners.fit_workers([], 4, explicit=True) == (4, "")


def test_plot_gives_each_policy_and_scheduler_its_own_style(runner, tmp_path):
    """A sweep of one policy under two schedulers: `plot` drew sglang+ [fcfs] and sglang+ [continuous]
    in the same colour and line (panels coloured by their own cycle; the hit-rate figure's one legend
    then showed both alike). Now each (policy, scheduler) series has one style across the figure: a
    colour per policy, a line style per scheduler (continuous solid, fcfs dashed)."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import to_hex

    from sim.analysis.plot import make_figure

    out = tmp_path / "s"
    args = ["sweep", *SMALL, "--policy", "sglang+,marconi", "--alpha", "0", "--scheduler", "fcfs,continuous"]
    res = runner.invoke(main, [*args, "--capacity", "1GB,2GB", "--save-requests", "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    for kind in ("hit-rate", "ttft", "occupancy"):
        figs = make_figure(out, kind)
        figs = figs if isinstance(figs, (list, tuple)) else [figs]
        styles: dict = {}
        for fig in (f[-1] if isinstance(f, tuple) else f for f in figs):
            for ax in fig.axes:
                for line in ax.get_lines():
                    style = (to_hex(line.get_color()), line.get_linestyle())
                    assert styles.setdefault(line.get_label(), style) == style, (kind, line.get_label())
        assert set(styles) == {
            "sglang+ [fcfs]",
            "sglang+ [continuous]",
            "marconi [fcfs]",
            "marconi [continuous]",
        }, (kind, styles)
        assert len(set(styles.values())) == 4, (kind, styles)  # every series its own
        for policy in ("sglang+", "marconi"):  # a colour per policy, a line per scheduler
            fcfs, cont = styles[f"{policy} [fcfs]"], styles[f"{policy} [continuous]"]
            assert fcfs[0] == cont[0] and (cont[1], fcfs[1]) == ("-", "--"), (kind, styles)
        assert styles["sglang+ [fcfs]"][0] != styles["marconi [fcfs]"][0]


def test_sweep_checks_the_memory_of_the_configurations_left_to_run(runner, tmp_path, monkeypatch):
    """The memory check weighs the configurations this command runs: not those already stored, and
    no more than --limit (mutation run, session 23: the stored ones counted, or --limit ignored,
    survived)."""
    import sim.cli.sweep as sweep_cli

    seen = []

    def fit(todo, count, explicit):
        seen.append(list(todo))
        return count, ""

    monkeypatch.setattr(sweep_cli, "fit_workers", fit)
    args = ["sweep", *SMALL, "--policy", "sglang+", "--capacity", "1GB,2GB,3GB,4GB", "--out", str(tmp_path / "s")]
    assert runner.invoke(main, [*args, "--limit", "2", "--workers", "1"]).exit_code == 0
    assert len(seen[-1]) == 2
    assert runner.invoke(main, [*args, "--limit", "1", "--workers", "1"]).exit_code == 0
    third = seen[-1]
    assert len(third) == 1 and all(t not in seen[0] for t in third)
    assert runner.invoke(main, [*args, "--workers", "1"]).exit_code == 0
    assert len(seen[-1]) == 1 and seen[-1] != third  # the last one left


def test_sweep_takes_a_tokenizer_folder_holding_its_file(runner, tmp_path):
    """`--tokenizer hf:DIR` names DIR/tokenizer.json, as the loader reads it: a folder holding it
    passes the sweep's up-front check, one without it is refused naming the file (mutation run,
    session 23: reading the folder as the file survived)."""
    tok = tmp_path / "tok"
    tok.mkdir()
    args = ["sweep", "--trace", "sharegpt", "--sessions", "2", "--policy", "sglang+", "--no-progress", "--dry-run"]
    res = runner.invoke(main, [*args, "--tokenizer", f"hf:{tok}", "--out", str(tmp_path / "a")])
    one_line(res, f"--tokenizer hf:{tok}: no such file: {tok / 'tokenizer.json'}")
    (tok / "tokenizer.json").write_text("{}")
    res = runner.invoke(main, [*args, "--tokenizer", f"hf:{tok}", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("bad", [3, [0, "1"], [True], [0.5]])
def test_qwen3_moe_mlp_only_layers_must_be_layer_numbers(tmp_path, bad):
    """``mlp_only_layers`` is a list of layer numbers (Qwen3MoeConfig): a number, a string, a bool
    or a float among them is one line naming the field (mutation run, session 23: the check's
    ``or`` / ``and`` swapped survived)."""
    from sim.cost import get_model
    from sim.errors import UsageError

    with pytest.raises(UsageError, match=r"field 'mlp_only_layers' must be a list of layer numbers$"):
        get_model(_json(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": bad}, "bad.json"))
    assert get_model(_json(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0, 47]}, "ok.json")).n_mlp == 48
