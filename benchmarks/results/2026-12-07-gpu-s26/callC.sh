# session 26, call C (one call where only one may come): run(carry=[".s20"], timeout_s=600): the conv alone from zeros
# (its own binary and the state's) / from a state; the Mooncake rows of the preset matrix (both session-26 fixes: the
# checks out of the references' time, the conv from zeros on the state's binary) kept with their requests.parquet;
# make test-gpu's kernel half with what time is left
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsC; git log --oneline -1 > /tmp/pack/headC.txt 2>&1; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
timeout 70 python3 benchmarks/conv_bench.py --dims 8192 --lengths 8192,32768 --rounds 2 --profile --variant own:KERNELS_CONFIG_CONV=ONE_BINARY=0 --json /tmp/pack/conv.json > /tmp/pack/conv.txt 2>&1; echo "conv rc=$? $(( $(date +%s)-s0 )) s"; grep -v Warn /tmp/pack/conv.txt | head -n 30
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rowsC timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_matrix_gpu.py -k mooncake > /tmp/pack/gpu-mooncake.txt 2>&1; echo "mooncake rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED" /tmp/pack/gpu-mooncake.txt | tail -n 6
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout $(( 585 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; grep -E "FAILED|passed|failed" /tmp/pack/gpu-kernels.txt | tail -n 8
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
