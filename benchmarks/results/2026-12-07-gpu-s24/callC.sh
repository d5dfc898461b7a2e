# session 24, call C: run(carry=[".s20"], timeout_s=320), at the conv fix (e855240+): where a resumed gated-delta
# layer's time goes now (replay_cost_probe --profile, qwen3-next-80b-a3b at 4 layers, 8,192-token suffixes from
# 0 / 17 / 4096 / 4113; call B measured it before the fix); make test-gpu's kernel half; the matrix's qwen3.5-9b and
# qwen3-next-80b-a3b Mooncake rows again (time saved). The device budget left (447 s) holds no more.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsC; git log --oneline -1 > /tmp/pack/headC.txt 2>&1
timeout 90 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 0,4096 --profile --out /tmp/pack/probeC.jsonl > /tmp/pack/probeC.txt 2>&1; echo "probe rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^{" /tmp/pack/probeC.txt | cut -c1-120 | head -n 70
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernelsC.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; grep -E "FAILED|passed|failed" /tmp/pack/gpu-kernelsC.txt | tail -n 6
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rowsC timeout $(( 290 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_matrix_gpu.py -k "qwen3.5-9b-mooncake or qwen3-next-80b-a3b-mooncake-fcfs" > /tmp/pack/gpu-matrixC.txt 2>&1; echo "matrix mooncake rc=$? $(( $(date +%s)-s )) s"; tail -n 3 /tmp/pack/gpu-matrixC.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
