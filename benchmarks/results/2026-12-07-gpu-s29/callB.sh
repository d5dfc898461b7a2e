# session 29, second call (the same warm machine): run(carry=[".s20"], timeout_s=600): make test-gpu's replay half
# but the FlashQLA peers (no FlashQLA carry), the preset matrix's rows kept (on an H200: issue 41's H200 table).
# The rows are tarred: folders under $OUT deeper than the transfer allows do not come back, as this call's did not.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 580 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packB/rows; nvidia-smi > /tmp/packB/nvidia-smi.txt 2>&1; git log --oneline -1 > /tmp/packB/head.txt 2>&1
MARCONI_GPU_ROWS=/tmp/packB/rows timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packB/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s0 )) s"; tail -25 /tmp/packB/gpu-replay.txt
tar -C /tmp -czf $OUT/packB.tgz packB; echo "total $(( $(date +%s)-s0 )) s"
