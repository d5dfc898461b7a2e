# session 24, call A: run(carry=[".s20"], timeout_s=600): make test-gpu's kernel half at the SSD SHARE change (dd09124+),
# issue 42's SSD table with SHARE beside the copies (SHARE=0) and 4 stages, then make test-gpu's replay half (the
# matrix with marconi-7b / nemotron-h-8b rows, each row's requests.parquet kept)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rows; git log --oneline -1 > /tmp/pack/head.txt 2>&1; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s0 )) s"; grep -E "FAILED|passed|failed" /tmp/pack/gpu-kernels.txt | tail -n 6
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 130 python3 benchmarks/ssd_bench.py --variant copy:KERNELS_CONFIG_SSD_STATE=SHARE=0 --variant st4:KERNELS_CONFIG_SSD_STATE=num_stages=4 --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {\|Warning\|__version__" /tmp/pack/ssd.txt | tail -n 70
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rows timeout $(( 590 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=8 tests/sim/replay > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error|SKIP" /tmp/pack/gpu-replay.txt | tail -n 12
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
