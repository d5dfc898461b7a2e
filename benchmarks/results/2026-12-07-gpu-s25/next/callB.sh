# for session 26: run(carry=[".s20"], timeout_s=600): make test-gpu's replay half at the final code, every matrix row kept
# with its settings and requests.parquet (timing_fit.py scores them held out; the ShareGPT rows after the session-25
# refits)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsB; git log --oneline -1 > /tmp/pack/headB.txt 2>&1
MARCONI_GPU_ROWS=/tmp/pack/rowsB timeout 585 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=8 tests/sim/replay > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s0 )) s"; grep -E "passed|failed|FAILED|Error|SKIP" /tmp/pack/gpu-replay.txt | tail -n 12
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
