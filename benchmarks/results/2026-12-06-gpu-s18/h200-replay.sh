# session 18, call 2 (carry .s16; needs an H200: step 1 is the 80b at full depth, ~119 GB planned at 150 requests,
# 57.6 GiB peak at 50): issue 41's full-depth share of peak, the replay GPU suite, the held-out matrix (time41.sh)
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
timeout 95 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out $OUT/rb80 > $OUT/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" $OUT/replay-bench-80b.txt | grep -v "^{" | tail -8
s=$(date +%s)
timeout 230 make test-gpu-replay GPU_PY=python3 > $OUT/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-replay.txt
bash benchmarks/results/2026-12-06-gpu-s17/time41.sh
tar -C $OUT -czf /tmp/h200r.tgz matrix stalls-80b.csv rb80 2>/dev/null; mv /tmp/h200r.tgz $OUT/; ls $OUT
