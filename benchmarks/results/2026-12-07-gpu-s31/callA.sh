# session 31, call A: run(carry=[".s20"], timeout_s=600) on any Hopper. make test-gpu's replay half (but the FlashQLA
# peers: no FlashQLA carry) at 28738e3, the first GPU run of session 30's stall retime (sim.replay.measure); the
# preset matrix's rows kept and tarred.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/packA/rows; nvidia-smi > /tmp/packA/nvidia-smi.txt 2>&1
MARCONI_GPU_ROWS=/tmp/packA/rows timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packA/gpu-replay.txt 2>&1
echo "replay rc=$? $(( $(date +%s)-s0 )) s"; tail -20 /tmp/packA/gpu-replay.txt
tar -C /tmp -czf $OUT/packA.tgz packA; echo "total $(( $(date +%s)-s0 )) s"
