# for session 25 (after A and B): run(carry=[".s20"], timeout_s=600): the first half of a timing fit with the opt-in paths on
# (--attention cudnn --elementwise fused) and ~80K-token prompts (FIT4), so that the flags can become defaults and
# the Mooncake sample's prompts (to 87,169 tokens) lie inside the fit; the second half: FIT_MODELS="qwen3.5-122b-a10b
# qwen3.5-397b-a17b", then HELD=1 with FIT_MODELS="" for the held-out runs; fit and score here with
# `python benchmarks/timing_fit.py DIR` (CPU)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
mkdir -p /tmp/pack; git log --oneline -1 > /tmp/pack/head.txt 2>&1
EXTRA="--attention cudnn --elementwise fused" FIT_MODELS="qwen3.5-9b qwen3.5-35b-a3b" FIT4_REQUESTS=6 HELD=0 PER_RUN_S=120 \
  timeout 570 bash benchmarks/timing_campaign.sh /tmp/pack/campaign /tmp/marconi
tar -C /tmp -czf $OUT/all.tgz pack
