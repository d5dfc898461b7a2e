"""A new user's own model and GPU (session 25): config.json files, the GPU catalogue, tensor
parallel groups, through the real CLI in process."""

from __future__ import annotations

import json
from pathlib import Path

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
