# session 31, call B: run(carry=[".s20"], timeout_s=600) on the warm Hopper after call A. Long prompts at full depth
# with the hit checks' outputs in groups of layers where they do not fit (HitChecker.output_bytes: what the GPU has
# free, asked per check). qwen3-next-80b-a3b on the Mooncake sample as issue 41 item 4 asks (batched; it ran out of
# an H100's memory in session 20: 99.7 GB planned), then marconi-7b at full depth on the same sample (session 30:
# out of memory at 40 GB, and 71.9 GB planned with --store host).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packB; nvidia-smi > /tmp/packB/nvidia-smi.txt 2>&1
timeout 300 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out /tmp/packB/rb80 > /tmp/packB/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^\s" /tmp/packB/replay-bench-80b.txt | grep -v "^{" | tail -12
tar -C /tmp -czf $OUT/packB.tgz packB; s=$(date +%s)
timeout $(left) /tmp/marconi replay --model marconi-7b --trace mooncake:sample --capacity 20GB --requests 40 --no-progress --out /tmp/packB/m7b-mooncake > /tmp/packB/m7b-mooncake.txt 2>&1
echo "marconi-7b mooncake rc=$? $(( $(date +%s)-s )) s"; tail -25 /tmp/packB/m7b-mooncake.txt
tar -C /tmp -czf $OUT/packB.tgz packB; echo "total $(( $(date +%s)-s0 )) s"
