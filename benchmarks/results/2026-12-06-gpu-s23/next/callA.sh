# for session 24's first call: run(carry=[".s20"], timeout_s=600): make test-gpu at the final code of session 23
# (kernel half with -n 8; replay half whole: the matrix now has marconi-7b and nemotron-h-8b rows and keeps each
# row's requests.parquet); the three FlashQLA tests need .fqla2 (callB)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rows; git log --oneline -1 > /tmp/pack/head.txt 2>&1
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s0 )) s"; tail -n 2 /tmp/pack/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rows timeout $(( 585 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 tests/sim/replay > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error|SKIP" /tmp/pack/gpu-replay.txt | tail -n 12
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
