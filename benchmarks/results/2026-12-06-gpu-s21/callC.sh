# session 21, call C: run(kind=nvidia-h100-x1, carry=[".s20"], timeout_s=480): replay --attention cudnn (e53efb3)
# 1. its GPU tests (tests/sim/replay/test_replay_gpu.py -k cudnn)
# 2. issue 41 item 4: qwen3-next-80b-a3b at full depth, batched (@16), Mooncake sample's first 50 requests, 8 GB,
#    --attention sdpa then cudnn in one process each, back to back on this GPU
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack
s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_gpu.py -k cudnn > /tmp/pack/gpu-cudnn.txt 2>&1; echo "cudnn tests rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/pack/gpu-cudnn.txt
tar -C /tmp -czf $OUT/all.tgz pack
for a in sdpa cudnn; do s=$(date +%s)
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 130 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h100-timing.json --capacity 8GB --requests 50 --runs marconi/exact/sequential@16 --attention $a --out /tmp/pack/rb80-$a > /tmp/pack/replay-bench-80b-50-$a.txt 2>&1
  echo "replay_bench $a rc=$? $(( $(date +%s)-s )) s"; grep -E "hits|failures|tflops|peak_share|wall_s|warmup" /tmp/pack/replay-bench-80b-50-$a.txt | grep -v "^{" | head -14
  tar -C /tmp -czf $OUT/all.tgz pack
done
echo "total $(( $(date +%s)-s0 )) s"
