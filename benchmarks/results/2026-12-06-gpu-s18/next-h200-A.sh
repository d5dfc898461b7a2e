# the next session's first call: run(kind=nvidia-h200, needs_h200=true, carry=[".fqla"], timeout_s=600).
# needs_h200 is for step 1 alone: qwen3-next-80b-a3b at full depth on the Mooncake sample, 150 requests, plans
# ~119 GB on the GPU (an H100 ran out of memory, 2026-12-06-gpu-s16/replay-bench-80b-h100-oom.txt): issue 41
# item 4's share of peak. Steps 2-3 use the same machine: the kernel GPU suite on the H200 (issues 42, 48) and the
# SSD table with the TMA_B variant and every peer. About 9 minutes; then call B at once (the H200 stays held 30 s).
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
s=$(date +%s)
timeout 200 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 150 --runs marconi/exact/sequential@16 --out $OUT/rb80 > $OUT/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" $OUT/replay-bench-80b.txt | grep -v "^{" | tail -6
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-kernels.txt
s=$(date +%s)
timeout 150 python3 benchmarks/ssd_bench.py --variant "tma:KERNELS_CONFIG_SSD_STATE=TMA_B=1" --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | tail -70
tar -C $OUT -czf /tmp/a.tgz . 2>/dev/null; mv /tmp/a.tgz $OUT/
