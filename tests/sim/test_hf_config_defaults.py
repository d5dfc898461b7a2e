"""A config.json as transformers reads it: fields left out take the family's config-class default,
the layer patterns in each spelling the families write, ``dtype`` before ``torch_dtype``
(sim/hf_config.py). Numbers hand-checked in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cost import get_model
from sim.errors import UsageError
from sim.hf_config import read_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _cfg(name: str, drop=(), **edits) -> dict:
    cfg = json.loads((CONFIGS / name).read_text())
    for k in drop:
        cfg.pop(k)
    cfg.update(edits)
    return cfg


def _write(tmp_path, cfg: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _nemotron_h_4b(**edits) -> dict:
    # nvidia/Nemotron-H-4B-Base-8K: hidden 3072, 32 heads, 8 KV heads of 128 (not 3072 / 32 = 96),
    # 112 Mamba heads of 64, the 8B's pattern; NVIDIA's config class names the head dim
    # attention_head_dim
    fields = dict(hidden_size=3072, intermediate_size=12288, mamba_num_heads=112, attention_head_dim=128)
    fields.update(edits)
    cfg = _cfg("nemotron-h-8b.json", drop=("head_dim",), **fields)
    return {k: v for k, v in cfg.items() if v is not None}


def test_nemotron_h_head_dim_spellings_and_default(tmp_path):
    # 4 attention layers x 8 KV heads x 128 x (K, V) x 2 bytes
    kv = 4 * 8 * 128 * 2 * 2
    assert kv == 16_384
    spec = get_model(_write(tmp_path, _nemotron_h_4b()))
    assert (spec.attn_head_dim, spec.kv_bytes_per_token()) == (128, kv)
    # per Mamba layer: 112 x 64 x 128 fp32 state (the engines' Nemotron-H default) + (7168 + 2 x 8 x
    # 128) x 3 bf16 conv
    assert spec.state_bytes() == 24 * (112 * 64 * 128 * 4 + (7168 + 2048) * 3 * 2) == 89_407_488
    # neither spelling: NemotronHConfig's 128, not hidden / heads
    spec = get_model(_write(tmp_path, _nemotron_h_4b(attention_head_dim=None)))
    assert (spec.attn_head_dim, spec.kv_bytes_per_token()) == (128, kv)
    # head_dim given wins
    assert get_model(_write(tmp_path, _nemotron_h_4b(head_dim=64))).attn_head_dim == 64


@pytest.mark.parametrize(
    "name, field, expect",
    [
        # the family's config class default where it is not the generic rule
        ("nemotron-h-8b.json", "num_key_value_heads", 8),  # not the 32 heads
        ("jamba-1.5-mini.json", "num_key_value_heads", 8),  # not the 32 heads
        ("qwen3-next-80b-a3b.json", "num_key_value_heads", 2),  # not the 16 heads
        ("llama-2-7b.json", "num_key_value_heads", 32),  # LlamaConfig: the heads
        ("granite-4.0-h-small.json", "num_key_value_heads", 32),  # GraniteMoeHybridConfig: the heads
    ],
)
def test_kv_heads_left_out_take_the_config_class_default(tmp_path, name, field, expect):
    r = read_config(_write(tmp_path, _cfg(name, drop=(field,) if field in _cfg(name) else ())))
    assert r["attn_kv_heads"] == expect
    # null is the heads in every family (transformers' backward compatibility)
    r = read_config(_write(tmp_path, _cfg(name, **{field: None})))
    assert r["attn_kv_heads"] == r["attn_heads"]


def test_qwen3_next_head_dim_left_out_is_256(tmp_path):
    # Qwen3NextConfig's head_dim is 256 (2048 / 16 = 128 priced half the KV): 12 x 2 x 256 x 2 x 2
    spec = get_model(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json", drop=("head_dim",))))
    assert spec.kv_bytes_per_token() == 24_576 == get_model("qwen3-next-80b-a3b").kv_bytes_per_token()
    assert spec.flops(1024) == get_model("qwen3-next-80b-a3b").flops(1024)


def test_dtype_wins_over_torch_dtype(tmp_path):
    # transformers keeps `dtype` where a config has both: bf16 KV, 24,576 B a token, not fp8's
    # (an fp32 one is served in bf16 and no longer tells them apart by its bytes)
    cfg = _cfg("qwen3-next-80b-a3b.json", torch_dtype="float8_e4m3fn", dtype="bfloat16")
    assert get_model(_write(tmp_path, cfg)).kv_bytes_per_token() == 24_576
    cfg = _cfg("qwen3-next-80b-a3b.json", torch_dtype="bfloat16", dtype="float8_e4m3fn")
    assert get_model(_write(tmp_path, cfg)).kv_bytes_per_token() == 24_576 // 2
    cfg = _cfg("qwen3-next-80b-a3b.json", torch_dtype="bfloat16", dtype="float32")
    assert get_model(_write(tmp_path, cfg)).dtype_note == "fp32 checkpoint served in bf16"
    # an empty one is refused, not read as left out (it priced bf16)
    for value in ([], ""):
        with pytest.raises(UsageError, match="field 'torch_dtype' names dtype"):
            read_config(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json", torch_dtype=value)))
    # a bad one is named by its own field
    with pytest.raises(UsageError, match="field 'dtype' names dtype 'int4'"):
        read_config(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json", dtype="int4")))


_NEW = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_OLD = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


@pytest.mark.parametrize("names", [_NEW, _OLD])
@pytest.mark.parametrize("field", ["layers_block_type", "layer_types"])
def test_nemotron_h_pattern_as_a_list(tmp_path, names, field):
    # transformers' NemotronHConfig writes the pattern as a list, num_hidden_layers deprecated
    cfg = _cfg("nemotron-h-8b.json", drop=("hybrid_override_pattern", "num_hidden_layers"))
    cfg[field] = [names[c] for c in _cfg("nemotron-h-8b.json")["hybrid_override_pattern"]]
    path = _write(tmp_path, cfg)
    ref = read_config(str(CONFIGS / "nemotron-h-8b.json"))
    r = read_config(path)
    assert {k: v for k, v in r.items() if k not in ("name", "source")} == {
        k: v for k, v in ref.items() if k not in ("name", "source")
    }
    assert (r["n_attn"], r["n_mamba"], r["n_mlp"]) == (4, 24, 24)
    # beside a hybrid_override_pattern the list wins, as transformers reads them
    r = read_config(_write(tmp_path, {**cfg, "hybrid_override_pattern": "M*" * 26, "num_hidden_layers": 52}, "b.json"))
    assert (r["n_attn"], r["n_mamba"], r["n_mlp"]) == (4, 24, 24)
    cfg[field] = cfg[field][:-1] + ["sliding_attention"]
    with pytest.raises(UsageError, match=f"field '{field}' has unknown type 'sliding_attention'"):
        read_config(_write(tmp_path, cfg))


def test_granite_layer_types_in_the_new_names(tmp_path):
    cfg = _cfg("granite-4.0-h-small.json")
    new = {"mamba": "linear_attention", "attention": "full_attention"}
    cfg["layer_types"] = [new[t] for t in cfg["layer_types"]]
    r = read_config(_write(tmp_path, cfg))
    assert (r["n_attn"], r["n_mamba"]) == (4, 36)
    assert get_model(_write(tmp_path, cfg)).state_bytes() == get_model("granite-4.0-h-small").state_bytes()


def test_qwen_attention_interval_and_heads_left_out(tmp_path):
    # no full_attention_interval and no layer_types: the Qwen config classes' interval 4, as the
    # published 80B-A3B (layers 3, 7, ..., 47 attention): 12 attention, 36 gated delta
    r = read_config(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json", drop=("full_attention_interval",))))
    assert (r["n_attn"], r["n_gdn"]) == (12, 36)
    # Qwen3.5's text config: head dim 256, 4 KV heads (Qwen3.5-9B's own): 8 x 4 x 256 x 2 x 2
    cfg = _cfg("qwen3.5-9b.json")
    for k in ("head_dim", "num_key_value_heads"):
        cfg["text_config"].pop(k)
    spec = get_model(_write(tmp_path, cfg))
    assert spec.kv_bytes_per_token() == 32_768 == get_model("qwen3.5-9b").kv_bytes_per_token()
    # Qwen3.5-MoE's: 256 and 2 (Qwen3.5-35B-A3B's): 10 x 2 x 256 x 2 x 2
    cfg = _cfg("qwen3.5-35b-a3b.json")
    for k in ("head_dim", "num_key_value_heads"):
        cfg["text_config"].pop(k)
    assert get_model(_write(tmp_path, cfg)).kv_bytes_per_token() == 20_480


def test_a_weights_file_is_refused_unread(tmp_path, monkeypatch):
    # a 17 MiB file (a weights shard given by mistake: GBs were read whole, and decoded)
    path = tmp_path / "model-00001-of-00004.safetensors"
    with open(path, "wb") as fh:
        fh.truncate(17 * 2**20)
    monkeypatch.setattr(Path, "read_text", lambda *a, **k: pytest.fail("read"))
    with pytest.raises(UsageError, match=r"is 18 MB: no config\.json is that large \(a weights file\?\)"):
        read_config(str(path))


@pytest.mark.parametrize("value", ["auto", None])
def test_mamba_head_dim_auto_or_left_out(tmp_path, value):
    # Granite: "auto" (or left out) is mamba_expand x hidden / heads = 2 x 4096 / 128 = 64, as published
    ref = get_model("granite-4.0-h-small")
    cfg = _cfg("granite-4.0-h-small.json", drop=("mamba_d_head",) if value is None else ())
    if value:
        cfg["mamba_d_head"] = value
    spec = get_model(_write(tmp_path, cfg))
    assert (spec.mamba_d_inner, spec.state_bytes(), spec.flops(1024)) == (8192, ref.state_bytes(), ref.flops(1024))
    # Falcon-H1: mamba_d_ssm / heads = 3072 / 24 = 128, as published
    ref = get_model("falcon-h1-7b")
    cfg = _cfg("falcon-h1-7b.json", drop=("mamba_d_head",) if value is None else ())
    if value:
        cfg["mamba_d_head"] = value
    spec = get_model(_write(tmp_path, cfg, "f.json"))
    assert (spec.mamba_d_inner, spec.state_bytes()) == (3072, ref.state_bytes()) == (3072, 70_152_192)
    # mamba_d_ssm null: FalconH1Config's mamba_expand x hidden = 6144, heads of 256: 24 x 256 x 256 x 2
    # state + (6144 + 512) x 3 x 2 conv, per layer
    cfg["mamba_d_ssm"] = None
    spec = get_model(_write(tmp_path, cfg, "g.json"))
    assert spec.state_bytes() == 44 * (24 * 256 * 256 * 2 + (6144 + 512) * 3 * 2) == 140_169_216
    # heads that do not divide the width: refused, naming the field to give
    cfg = _cfg("granite-4.0-h-small.json", drop=("mamba_d_head",), mamba_n_heads=100)
    with pytest.raises(UsageError, match="'mamba_d_head' is left out, and 'mamba_n_heads' \\(100\\) does not divide"):
        read_config(_write(tmp_path, cfg, "h.json"))


def test_a_default_that_does_not_fit_is_named_as_left_out(tmp_path):
    # Falcon-H1's config class takes 8 KV heads; 7B's 12 heads do not split into 8 groups
    cfg = _cfg("falcon-h1-7b.json", drop=("num_key_value_heads",))
    with pytest.raises(UsageError, match="'num_key_value_heads' is left out, and falcon_h1's default of 8 does not"):
        read_config(_write(tmp_path, cfg))
    cfg["num_attention_heads"] = 16  # 16 heads of 128 (head_dim given), 8 KV heads: 44 x 8 x 128 x 2 x 2
    assert get_model(_write(tmp_path, cfg, "b.json")).kv_bytes_per_token() == 180_224


@pytest.mark.parametrize(
    "url, repo",
    [
        ("https://huggingface.co/Qwen/Qwen3.5-9B/resolve/main/config.json", "Qwen/Qwen3.5-9B"),
        ("https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K/blob/main/config.json", "nvidia/Nemotron-H-8B-Base-8K"),
        ("hf://Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-9B"),
    ],
)
def test_a_hub_url_says_it_is_not_fetched(url, repo):
    # a pasted Hub URL said "no such file (give a config.json or a folder holding one)"
    with pytest.raises(UsageError) as exc:
        get_model(url)
    text = str(exc.value)
    assert text.startswith(
        f"model {url!r} is no file or folder here, and a Hugging Face URL is not fetched: use the preset"
    )
    assert f"huggingface-cli download {repo} config.json" in text


def test_another_url_says_it_is_not_fetched():
    with pytest.raises(UsageError, match="is a URL, and nothing is fetched: download the config.json"):
        get_model("https://example.com/models/config.json")


@pytest.mark.parametrize(
    "quant, dtype, bits",
    [
        ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "fp8", 8),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4", 4),
        ({"quant_method": "gptq", "bits": 8}, "int8", 8),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}},
            },
            "fp8",
            8,
        ),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4", 4),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "4-bit", 4),
    ],
)
def test_quantized_weights_take_their_bytes(tmp_path, quant, dtype, bits):
    # Nemotron-H 8B: 8,067,805,184 weights, 2 x 131072 x 4096 of them the vocabulary tables (kept
    # bf16 by these checkpoints); the rest at `bits`: the bf16 price was 16.1GB whatever the checkpoint
    ref = read_config(str(CONFIGS / "nemotron-h-8b.json"))
    tables = 2 * 131072 * 4096
    r = read_config(_write(tmp_path, _cfg("nemotron-h-8b.json", quantization_config=quant)))
    assert r["weight_dtype"] == dtype
    assert r["weight_bytes"] == (ref["total_params"] - tables) * bits / 8 + tables * 2
    # everything else as the bf16 checkpoint's
    assert {k: v for k, v in r.items() if k not in ("name", "source", "weight_dtype", "weight_bytes")} == {
        k: v for k, v in ref.items() if k not in ("name", "source")
    }


def test_unknown_quantization_is_priced_as_bf16(tmp_path):
    r = read_config(_write(tmp_path, _cfg("nemotron-h-8b.json", quantization_config={"quant_method": "eetq"})))
    assert "weight_bytes" not in r and "weight_dtype" not in r
    # odd shapes of known methods: bf16 too, no traceback
    for q in (
        {"quant_method": "compressed-tensors", "config_groups": [1, 2]},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": "8"}}}},
        {"quant_method": "awq", "bits": True},
        {"quant_method": None},
        "fp8",
    ):
        r = read_config(_write(tmp_path, _cfg("nemotron-h-8b.json", quantization_config=q), "q.json"))
        assert "weight_bytes" not in r, q
    assert get_model(_write(tmp_path, _cfg("nemotron-h-8b.json"), "b.json")).weight_dtype == "bf16"


def test_quantized_weights_in_the_memory_checks(tmp_path):
    from sim.cost import gpu_count
    from sim.experiments.advise.space import weight_bytes

    # Qwen3-Next-80B-A3B in fp8: 80GB of weights, not 160GB; its default group on H100 is 2, not 4
    fp8 = {"quant_method": "fp8", "fmt": "e4m3"}
    spec = get_model(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json", quantization_config=fp8)))
    bf16 = get_model(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json"), "b.json"))
    tables = 2 * 151936 * 2048
    assert weight_bytes(spec) == int((bf16.total_params - tables) + 2 * tables)
    assert weight_bytes(bf16) == int(bf16.total_params * 2)
    assert (gpu_count(spec, "h100"), gpu_count(bf16, "h100")) == (2, 4)


def test_default_group_splits_the_heads(tmp_path):
    from sim.cost import gpu_count

    # Falcon-H1 7B's shapes with a 26x MLP: 132B weights, 264GB bf16; 12 attention heads, 2 KV heads,
    # 24 Mamba heads. On H100 (80GiB: 64.4GB each at 3/4) 5 GPUs hold it; no power of two <= 64
    # splits 12 heads and holds it (8 was priced: "GPU 8x h100"); 6 does
    spec = get_model(_write(tmp_path, _cfg("falcon-h1-7b.json", intermediate_size=12288 * 26)))
    assert 264e9 < spec.total_params * 2 < 265e9
    # on L40S (48GiB) 12 hold it in 3/4, across two servers of 8: 6 in one server hold it in 0.88
    # of their memory (264GB of 309GB: every engine keeps a cache), and are served instead
    assert (gpu_count(spec, "h100"), gpu_count(spec, "h200"), gpu_count(spec, "l40s")) == (6, 4, 6)
    # a power of two that splits the heads stays the choice (Qwen3-Next: 16 heads; 160GB on H100: 4)
    assert gpu_count(get_model(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json"), "q.json")), "h100") == 4


def test_an_empty_config_says_so(tmp_path):
    (tmp_path / "config.json").write_text("")
    with pytest.raises(UsageError, match=r"config\.json is empty \(a download that did not finish\?\)$"):
        read_config(str(tmp_path))


@pytest.mark.parametrize("value", [[], 0, "", False])
def test_a_bad_head_dim_is_refused_not_defaulted(tmp_path, value):
    # an empty list (or 0) was falsy and read as left out: Falcon-H1 7B's heads priced at 3072 / 12 = 256
    with pytest.raises(UsageError, match="field 'head_dim' must be"):
        read_config(_write(tmp_path, _cfg("falcon-h1-7b.json", head_dim=value)))
    # null is left out: hidden / heads for Falcon-H1 (256; the published 128 given, 45,056 B a token)
    assert read_config(_write(tmp_path, _cfg("falcon-h1-7b.json", head_dim=None), "n.json"))["attn_head_dim"] == 256


def test_shared_expert_left_out_takes_the_family_default(tmp_path):
    # Qwen3NextConfig's and Qwen3_5MoeTextConfig's shared expert is 512 wide (it read none): the
    # published 80B-A3B (512) reads the same without the field
    full = read_config(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json")))
    left_out = read_config(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json", drop=("shared_expert_intermediate_size",))))
    assert (left_out["mlp_active_params"], left_out["total_params"]) == (
        full["mlp_active_params"],
        full["total_params"],
    )
    # Qwen3.5-397B-A17B's 1024 left out: 512, 3 x 4096 x 512 fewer in each of its 60 MoE blocks
    cfg = _cfg("qwen3.5-397b-a17b.json")
    full = read_config(_write(tmp_path, cfg))
    del cfg["text_config"]["shared_expert_intermediate_size"]
    r = read_config(_write(tmp_path, cfg))
    assert full["mlp_active_params"] - r["mlp_active_params"] == 3 * 4096 * 512
    assert full["total_params"] - r["total_params"] == 60 * 3 * 4096 * 512
    # GraniteMoeHybridConfig's 1024 (granite-4.0-h-small gives 1536): 3 x 4096 x 512 fewer a layer
    full = read_config(_write(tmp_path, _cfg("granite-4.0-h-small.json")))
    r = read_config(_write(tmp_path, _cfg("granite-4.0-h-small.json", drop=("shared_intermediate_size",))))
    assert full["mlp_active_params"] - r["mlp_active_params"] == 3 * 4096 * 512
    # given as 0: no shared expert (Qwen3-Next: 3 x 2048 x 512 a block fewer)
    r = read_config(_write(tmp_path, _cfg("qwen3-next-80b-a3b.json", shared_expert_intermediate_size=0)))
    assert left_out["mlp_active_params"] - r["mlp_active_params"] == 3 * 2048 * 512
