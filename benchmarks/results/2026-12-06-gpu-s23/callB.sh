# session 23, call B (H200 warm after A): run(carry=[".s20"]): make test-gpu's replay half whole (A's 290 s cap cut it), the matrix's summaries kept
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rows; git log --oneline -1 > /tmp/pack/head.txt 2>&1
MARCONI_GPU_ROWS=/tmp/pack/rows timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s0 )) s"; grep -E "passed|failed|FAILED|Error|SKIP|s call" /tmp/pack/gpu-replay.txt | tail -n 30
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
