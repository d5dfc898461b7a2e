# session 23, call D (H200 warm, last ~400 s of budget): run(carry=[".s20"]): issue 41 item 4 on the H200 with both flags (qwen3-next-80b-a3b full depth, batched @16, Mooncake sample, 150 requests, 40 GB)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack; git log --oneline -1 > /tmp/pack/head.txt 2>&1
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 270 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 150 --runs marconi/exact/sequential@16 --attention cudnn --elementwise fused --out /tmp/pack/rb80-fused > /tmp/pack/replay-bench-80b-fused.txt 2>&1; echo "replay_bench fused rc=$? $(( $(date +%s)-s0 )) s"; grep -E "TFLOP|peak|hits|wall" /tmp/pack/replay-bench-80b-fused.txt | grep -v "^{" | cut -c1-250 | tail -n 6
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
