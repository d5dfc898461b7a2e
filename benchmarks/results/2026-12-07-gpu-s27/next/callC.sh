# session 28, third call (the same warm H200): run(carry=[".s20"], needs_h200=true, timeout_s=600): make test-gpu (kernel half -n 8, then the replay half
# but the FlashQLA peers: call C) at the session's code, the preset matrix's rows kept (MARCONI_GPU_ROWS).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 580 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packC/rows; git log --oneline -1 > /tmp/packC/head.txt 2>&1
s=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/packC/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/packC/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz packC; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/packC/rows timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packC/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -25 /tmp/packC/gpu-replay.txt
tar -C /tmp -czf $OUT/all.tgz packC; echo "total $(( $(date +%s)-s0 )) s"
