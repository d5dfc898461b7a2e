# session 28, third call (the same warm H200): run(carry=[".s20"], timeout_s=600): make test-gpu's replay half but the
# FlashQLA peers, the preset matrix's rows kept (MARCONI_GPU_ROWS); the kernel half then as time allows.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 560 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack3/rows; git log --oneline -1 > /tmp/pack3/head.txt 2>&1
s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack3/rows timeout 360 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack3/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -25 /tmp/pack3/gpu-replay.txt
tar -C /tmp -czf $OUT/all.tgz pack3; s=$(date +%s)
timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack3/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/pack3/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz pack3; echo "total $(( $(date +%s)-s0 )) s"
