# the next session's first call: run(kind=nvidia-h200, needs_h200=true, carry=[".fqla"], timeout_s=600).
# needs_h200 is for step 1: qwen3-next-80b-a3b at full depth on the Mooncake sample, 150 requests, plans ~119 GB
# on the GPU (an H100 ran out of memory, ../2026-12-06-gpu-s16/replay-bench-80b-h100-oom.txt): issue 41 item 4's
# share of peak. Steps 2-3 on the same machine: the gated-delta kernel at 16/32 heads with the opt-in DISCARD output
# beside the default and FLA; the SSD table at the lengths where it misses (4K, 8K) with the opt-in TMA_B loop and
# DISCARD output beside the default, every peer in the run. About 7 minutes; then B and C at once
# (a held H200 serves calls that do not ask for one; it goes back after 30 s idle).
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
s=$(date +%s)
timeout 200 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 150 --runs marconi/exact/sequential@16 --out $OUT/rb80 > $OUT/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" $OUT/replay-bench-80b.txt | grep -v "^{" | tail -6
s=$(date +%s)
timeout 110 python3 benchmarks/kernel_bench.py --no-flashqla --shapes 16/32 --rep 20 --host-calls 0 --variant "disc:KERNELS_CONFIG_OUT=DISCARD=1" --json $OUT/kernel.json > $OUT/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/kernel-bench.txt | tail -16
s=$(date +%s)
timeout 200 python3 benchmarks/ssd_bench.py --lengths 4096,8192 --variant "tma:KERNELS_CONFIG_SSD_STATE=TMA_B=1" --variant "disc:KERNELS_CONFIG_SSD_OUT=DISCARD=1" --variant "both:KERNELS_CONFIG_SSD_STATE=TMA_B=1;KERNELS_CONFIG_SSD_OUT=DISCARD=1" --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | tail -60
tar -C $OUT -czf /tmp/a.tgz . 2>/dev/null; mv /tmp/a.tgz $OUT/
