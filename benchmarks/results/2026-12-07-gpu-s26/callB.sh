# session 26, call B: run(carry=[".s20"], timeout_s=600): make test-gpu's replay half at the session head, every matrix
# row kept with its settings and requests.parquet (the hit checks' compares now out of the references' times: the
# Mooncake rows' time saved rescored with rescore_resume.py)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsB; git log --oneline -1 > /tmp/pack/headB.txt 2>&1; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
MARCONI_GPU_ROWS=/tmp/pack/rowsB timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=12 tests/sim/replay > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s0 )) s"; grep -E "passed|failed|FAILED|Error|SKIP" /tmp/pack/gpu-replay.txt | tail -n 12
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
