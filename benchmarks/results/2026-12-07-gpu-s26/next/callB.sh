# for session 27: run(carry=[".s20"], timeout_s=600): the campaign's other half (callA.sh says why) and its held-out
# runs (qwen3-next-80b-a3b, qwen3.5-27b on Mooncake, the agent trace, ShareGPT sessions 60:100, continuous batching)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
FIT_MODELS="qwen3.5-122b-a10b qwen3.5-397b-a17b" PER_RUN_S=55 CONT_REQUESTS=40 FIT4_REQUESTS=4 timeout 570 bash benchmarks/timing_campaign.sh $OUT/campaignB /tmp/marconi
echo "campaign rc=$?"; cat $OUT/campaignB/runs.txt | tr '\n' ';'
