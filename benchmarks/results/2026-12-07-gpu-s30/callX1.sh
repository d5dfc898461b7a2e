# session 30, call 1: run(carry=[".s20"], needs_h200=true, timeout_s=600).
# needs_h200 is what the work needs: qwen3-next-80b-a3b at full depth on the Mooncake sample (issue 41 item 4) ran out
# of an H100's 80 GB. Then make test-gpu's replay half but the FlashQLA peers, the preset matrix's rows kept (the H200 table).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packX1/rows; nvidia-smi > /tmp/packX1/nvidia-smi.txt 2>&1; git log --oneline -1 > /tmp/packX1/head.txt 2>&1
timeout 200 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out /tmp/packX1/rb80 > /tmp/packX1/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^\s" /tmp/packX1/replay-bench-80b.txt | grep -v "^{" | tail -8
tar -C /tmp -czf $OUT/all.tgz packX1; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/packX1/rows timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packX1/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -25 /tmp/packX1/gpu-replay.txt
tar -C /tmp -czf $OUT/all.tgz packX1; echo "total $(( $(date +%s)-s0 )) s"
