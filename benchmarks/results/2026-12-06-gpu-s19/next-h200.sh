# the next session's first call: run(kind=nvidia-h200, needs_h200=true, carry=[".fqla"], timeout_s=600).
# 1. issue 41 item 4: qwen3-next-80b-a3b at full depth on the Mooncake sample (plans ~119 GB: an H100 ran out of memory).
# 2. the SSD table at the current defaults on the H200 (issue 42's table), every peer in the run.
# Everything under $OUT is also packed into $OUT/all.tgz.
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
s=$(date +%s)
timeout 220 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 150 --runs marconi/exact/sequential@16 --out /tmp/rb80 > $OUT/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" $OUT/replay-bench-80b.txt | grep -v "^{" | tail -6
s=$(date +%s)
timeout 300 python3 benchmarks/ssd_bench.py --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | tail -40
tar -czf /tmp/all.tgz -C /tmp rb80 -C $OUT . 2>/dev/null; mv /tmp/all.tgz $OUT/
