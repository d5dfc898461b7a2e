# session 27, call B: run(carry=[".s20"], timeout_s=600): make test-gpu (kernel half -n 8, then the replay half
# but the FlashQLA peers: call C) at the session's code, the preset matrix's rows kept (MARCONI_GPU_ROWS).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 580 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack/rows; git log --oneline -1 > /tmp/pack/head.txt 2>&1
s=$(date +%s)
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/pack/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rows timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -25 /tmp/pack/gpu-replay.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
