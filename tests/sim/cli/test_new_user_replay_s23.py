"""Session 23, a new user's `marconi replay` on the CPU (their own small hybrid configs, traces and
timing files): what it printed wrong, and the fix of each."""

from __future__ import annotations

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
