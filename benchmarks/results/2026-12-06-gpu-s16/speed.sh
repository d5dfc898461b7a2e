# issue 41 item 4 (carry .whl): qwen3-next-80b-a3b at full depth on the Mooncake sample, batched, every hit validated,
# share of the peak over the timed calls and over the wall time
source benchmarks/results/2026-12-06-gpu-s16/env.sh
s=$(date +%s)
timeout 330 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 150 --runs marconi/exact/sequential@16 --out $OUT/rb80 > $OUT/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; tail -40 $OUT/replay-bench-80b.txt
