"""Models read from their Hugging Face config.json (sim/hf_config.py, docs/models.md): each preset
and the spec read from the published config's numbers (tests/data/configs/, written from the
published configs) agree on KV bytes per token, state bytes and FLOPs per token; the new presets'
shapes against hand computation; bad configs are one line naming the field, exit 2."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.config import SimConfig
from sim.cost import MODELS, ModelSpec, get_model
from sim.errors import UsageError
from sim.simulate import simulate
from traces.registry import load_trace

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"

# preset -> its config fixture (qwen3.5-122b-a10b's MoE sizes are an estimate: no published config)
PAIRS = {
    "qwen3-next-80b-a3b": "qwen3-next-80b-a3b.json",
    "qwen3.5-9b": "qwen3.5-9b.json",
    "qwen3.5-27b": "qwen3.5-27b.json",
    "qwen3.5-35b-a3b": "qwen3.5-35b-a3b.json",
    "qwen3.5-397b-a17b": "qwen3.5-397b-a17b.json",
    "llama-7b": "llama-2-7b.json",
    "nemotron-h-8b": "nemotron-h-8b.json",
    "nemotron-h-56b": "nemotron-h-56b.json",
    "jamba-1.5-mini": "jamba-1.5-mini.json",
    "falcon-h1-7b": "falcon-h1-7b.json",
    "granite-4.0-h-small": "granite-4.0-h-small.json",
}


@pytest.mark.parametrize("preset", sorted(PAIRS))
def test_preset_and_its_config_agree(preset):
    p, c = get_model(preset), get_model(str(CONFIGS / PAIRS[preset]))
    assert c.kv_bytes_per_token() == p.kv_bytes_per_token()
    assert c.state_bytes() == p.state_bytes()
    for L in (1, 1024, 32_768):
        assert c.flops(L) == pytest.approx(p.flops(L), rel=1e-12)
    assert c.layers_by_type() == p.layers_by_type()
    assert c.embedding_params == p.embedding_params


def test_a_folder_holding_config_json_reads_the_same(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "nemotron-h-8b.json").read_text())
    a, b = get_model(str(tmp_path)), get_model("nemotron-h-8b")
    assert (a.kv_bytes_per_token(), a.state_bytes(), a.flops(100)) == (
        b.kv_bytes_per_token(),
        b.state_bytes(),
        b.flops(100),
    )


# ---- the new presets by hand (docs/models.md)


def test_nemotron_h_8b_by_hand():
    s = get_model("nemotron-h-8b")
    assert s.layers_by_type() == {"attention": 4, "gated_delta": 0, "mamba2": 24, "mlp": 24}
    assert s.kv_bytes_per_token() == 4 * 2 * 8 * 128 * 2 == 16_384
    # per Mamba2 layer: 128 heads x 64 x N 128 fp32 state (the engines' Nemotron-H default), conv
    # (8192 + 2*8*128) x 3 bf16
    per = 128 * 64 * 128 * 4 + (8192 + 2 * 8 * 128) * 3 * 2
    assert s.state_bytes() == 24 * per == 102_137_856
    D, di, N, G, H = 4096, 8192, 128, 8, 128
    mamba = 2 * (D * (2 * di + 2 * G * N + H) + di * D) + 2 * (di + 2 * G * N) * 4 + 8 * di * N + 5 * di
    attn = 2 * (D * 32 * 128 + 2 * D * 8 * 128 + 32 * 128 * D) + 2 * 32 * 128  # + causal linear term
    mlp = 2 * 2 * D * 21504  # squared ReLU: up and down
    assert s.flops(1) == pytest.approx(24 * mamba + 4 * attn + 24 * mlp + 4 * 2 * 32 * 128, rel=1e-12)


def test_jamba_mini_mamba1_state_and_moe_average():
    s = get_model("jamba-1.5-mini")
    assert s.layers_by_type() == {"attention": 4, "gated_delta": 0, "mamba1": 28, "mlp": 32}
    # Mamba1: d_inner x N state (bf16) and a conv over d_inner channels, 3 columns
    assert s.state_bytes() == 28 * (8192 * 16 * 2 + 8192 * 3 * 2) == 8_716_288
    assert s.kv_bytes_per_token() == 4 * 2 * 8 * 128 * 2
    # 16 dense SwiGLU blocks and 16 MoE blocks of 2 active experts + a 16-way router, per token
    dense = 3 * 4096 * 14336
    assert s.mlp_active_params * 32 == 16 * dense + 16 * (2 * dense + 4096 * 16)


def test_falcon_h1_every_layer_has_attention_and_mamba():
    s = get_model("falcon-h1-7b")
    assert s.n_attn == s.n_mamba == s.n_mlp == 44
    assert s.kv_bytes_per_token() == 44 * 2 * 2 * 128 * 2
    assert s.state_bytes() == 44 * (24 * 128 * 256 * 2 + (3072 + 2 * 256) * 3 * 2)


def test_granite_h_small_moe_every_layer():
    s = get_model("granite-4.0-h-small")
    assert (s.n_attn, s.n_mamba, s.n_mlp) == (4, 36, 40)
    assert s.mlp_active_params == 3 * 4096 * 768 * 10 + 3 * 4096 * 1536 + 4096 * 72


def test_presets_name_their_sources():
    for name in ("nemotron-h-8b", "nemotron-h-56b", "jamba-1.5-mini", "falcon-h1-7b", "granite-4.0-h-small"):
        assert "HF " in MODELS[name].source and "config.json" in MODELS[name].source


@pytest.mark.parametrize(
    "preset, total_b",
    [
        ("nemotron-h-8b", 8.1),
        ("nemotron-h-56b", 56.3),
        ("jamba-1.5-mini", 51.6),
        ("falcon-h1-7b", 7.6),
        ("granite-4.0-h-small", 32.2),
    ],
)
def test_total_params_near_the_published_count(preset, total_b):
    assert get_model(preset).total_params / 1e9 == pytest.approx(total_b, abs=0.05)


def test_pure_mamba2_codestral():
    s = get_model(str(CONFIGS / "mamba-codestral-7b.json"))
    assert s.kv_bytes_per_token() == 0 and s.n_mlp == 0 and s.n_mamba == 64
    assert s.state_bytes() == 64 * (128 * 64 * 128 * 2 + (8192 + 2 * 8 * 128) * 3 * 2)
    assert s.total_params / 1e9 == pytest.approx(7.28, abs=0.01)


def test_existing_presets_unchanged():
    """The real-shape Mamba fields default to the paper's Mamba2, so marconi-7b keeps its numbers."""
    m = get_model("marconi-7b")
    assert (m.mamba_version, m.mamba_heads, m.total_params) == (2, 0, 0.0)
    assert m.state_bytes() == 26_787_840 and m.kv_bytes_per_token() == 65_536
    assert m.flops(1) == 24 * 209_756_160 + 4 * 8 * 4096**2 + 4 * 4 * 4096 + 28 * 16 * 4096**2


# ---- bad configs: one line naming the field, exit 2


def _write(tmp_path, d) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return str(p)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2'"),
        ({"hybrid_override_pattern": None}, "'hybrid_override_pattern'"),
        ({"hybrid_override_pattern": "M*-X" * 13}, "unknown block 'X'"),
        ({"hybrid_override_pattern": "M*-"}, "52 characters"),
        # MLP blocks alone: 0 bytes a cached node, marconi's FLOP efficiency divided by zero (a traceback)
        ({"hybrid_override_pattern": "-E" * 26}, "block: nothing to cache"),
        ({"mamba_num_heads": None}, "'mamba_num_heads'"),
        ({"hidden_size": "big"}, "'hidden_size' must be a whole number"),
        ({"torch_dtype": "int4"}, "dtype 'int4'"),
    ],
)
def test_bad_config_is_one_line(tmp_path, edit, message):
    d = json.loads((CONFIGS / "nemotron-h-8b.json").read_text())
    for k, v in edit.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    path = _write(tmp_path, d)
    with pytest.raises(UsageError, match=message):
        get_model(path)
    r = CliRunner().invoke(main, ["models", path])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1 and message.split("'")[0] in r.output


@pytest.mark.parametrize(
    "fixture, edit, message",
    [
        # a list inside layer_types was a TypeError traceback (unhashable list in a set)
        (
            "qwen3.5-9b.json",
            {"layer_types": [["linear_attention"]] * 32},
            "'layer_types' has unknown type ['linear_attention']",
        ),
        ("granite-4.0-h-small.json", {"layer_types": [{"t": 1}] * 40}, "'layer_types' has unknown type {'t': 1}"),
        # the string "false" was read as true (bool("false")): an output gate priced, a tied table counted twice
        ("qwen3.5-9b.json", {"attn_output_gate": "false"}, "'attn_output_gate' must be true or false, not 'false'"),
        ("qwen3.5-9b.json", {"tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false"),
        ("llama-2-7b.json", {"tie_word_embeddings": 0}, "'tie_word_embeddings' must be true or false, not 0"),
    ],
)
def test_a_wrongly_typed_list_entry_or_flag_is_one_line(tmp_path, fixture, edit, message):
    d = json.loads((CONFIGS / fixture).read_text())
    (d.get("text_config") or d).update(edit)
    path = _write(tmp_path, d)
    r = CliRunner().invoke(main, ["models", path])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and message in r.output


def test_real_flags_still_count(tmp_path):
    """attn_output_gate false drops the gate's projection (d x heads x head_dim per attention
    layer: 8 x 4096 x 16 x 256); tie_word_embeddings true counts the vocabulary table once."""
    base = json.loads((CONFIGS / "qwen3.5-9b.json").read_text())
    base["text_config"].update(attn_output_gate=False, tie_word_embeddings=True)
    a, b = get_model(str(CONFIGS / "qwen3.5-9b.json")), get_model(_write(tmp_path, base))
    assert a.total_params - b.total_params == 8 * 4096 * 16 * 256 + 248320 * 4096


def test_missing_file_and_not_json(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        get_model(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="not JSON"):
        get_model(str(tmp_path / "bad.json"))
    with pytest.raises(UsageError, match="config.json path"):
        get_model("no-such-preset")


# ---- the CLI: models PATH, run --model PATH


def test_cli_models_prints_the_config_row():
    path = str(CONFIGS / "jamba-1.5-mini.json")
    r = CliRunner().invoke(main, ["models", path, "--format", "json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.output)
    assert row["name"] == path and row["state_bytes"] == 8_716_288 and row["kv_bytes_per_token"] == 16_384
    r = CliRunner().invoke(main, ["models", path])
    assert r.exit_code == 0 and "4 attn + 28 mamba1 + 32 mlp" in r.output and "8,716,288" in r.output


def test_run_with_a_config_equals_run_with_its_preset():
    trace = load_trace("synthetic:chat:sessions=3,turns=3")
    rows = []
    for model in ("nemotron-h-8b", str(CONFIGS / "nemotron-h-8b.json")):
        cfg = SimConfig(policy="marconi", model=model, capacity_bytes=2 * 10**9, alpha=1.0)
        rows.append(simulate(trace, cfg).summary)
    a, b = rows
    assert a.token_hit_rate == b.token_hit_rate and a.flops_saved == b.flops_saved
    assert a.ttft_p50_ms == b.ttft_p50_ms  # the same default timing: the config's weights pick 1 H200


def test_modelspec_from_config_is_a_modelspec():
    assert isinstance(get_model(str(CONFIGS / "falcon-h1-7b.json")), ModelSpec)


def test_jamba_dt_rank_auto_is_the_ceiling_of_d_over_16(tmp_path):
    """A Jamba config without ``mamba_dt_rank`` (or with "auto", as transformers' JambaConfig
    defaults it) takes ceil(hidden_size / 16): 4096 / 16 = 256, Jamba 1.5 Mini's own value, so the
    spec, its FLOPs and its parameter count equal the published config's."""
    cfg = json.loads((CONFIGS / "jamba-1.5-mini.json").read_text())
    assert cfg["mamba_dt_rank"] == 256
    b = get_model(str(CONFIGS / "jamba-1.5-mini.json"))
    for rank in (None, "auto"):
        edited = {k: v for k, v in cfg.items() if k != "mamba_dt_rank"}
        if rank is not None:
            edited["mamba_dt_rank"] = rank
        folder = tmp_path / str(rank)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(edited))
        a = get_model(str(folder))
        assert (a.mamba_dt_rank, a.flops(100), a.total_params) == (256, b.flops(100), b.total_params)
