# session 26, call B: run(carry=[".s20"], timeout_s=600): the conv alone from zeros / from a state (conv_bench.py), then
# make test-gpu's replay half at the session head, every matrix row kept with its settings and requests.parquet (the
# hit checks' compares now out of the references' times: the Mooncake rows' time saved rescored with rescore_resume.py)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsB; git log --oneline -1 > /tmp/pack/headB.txt 2>&1; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
timeout 80 python3 benchmarks/conv_bench.py --dims 8192 --lengths 8192,32768 --rounds 2 --profile --variant own:KERNELS_CONFIG_CONV=ONE_BINARY=0 --variant bd64w4:KERNELS_CONFIG_CONV=BD=64,num_warps=4 --json /tmp/pack/conv.json > /tmp/pack/conv.txt 2>&1; echo "conv rc=$? $(( $(date +%s)-s0 )) s"; grep -v Warn /tmp/pack/conv.txt | head -n 40
tar -C /tmp -czf $OUT/all.tgz pack
MARCONI_GPU_ROWS=/tmp/pack/rowsB timeout $(( 585 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=12 tests/sim/replay > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s0 )) s"; grep -E "passed|failed|FAILED|Error|SKIP" /tmp/pack/gpu-replay.txt | tail -n 12
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
