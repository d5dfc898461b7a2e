# session 27, call A: run(carry=[".s20"], timeout_s=600): the time model's whole campaign (fit runs of four
# presets, prompts to ~80K tokens, then the held-out runs: qwen3-next-80b-a3b / qwen3.5-27b on Mooncake, the agent
# trace, ShareGPT sessions 60:100, continuous batching), measured after session 26's two fixes of the from-scratch
# times. Packed into $OUT/all.tgz as it goes.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
( while sleep 60; do tar -C /tmp -czf $OUT/all.tgz pack 2>/dev/null; done ) &
PER_RUN_S=45 FIT4_REQUESTS=2 HELD_REQUESTS=120 CONT_REQUESTS=40 timeout 560 bash benchmarks/timing_campaign.sh /tmp/pack/campaign /tmp/marconi
echo "campaign rc=$? $(( $(date +%s)-s0 )) s"; cat /tmp/pack/campaign/runs.txt | tr '\n' ';'
kill %1 2>/dev/null; tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
