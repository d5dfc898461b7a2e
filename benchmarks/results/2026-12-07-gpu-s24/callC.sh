# session 24, call C: run(carry=[".s20"], timeout_s=600), at the conv fix (e855240): make test-gpu's kernel half; where a
# resumed gated-delta layer's time goes now (replay_cost_probe --profile, qwen3-next-80b-a3b at 4 layers, 8,192-token
# suffixes from 0 / 17 / 4096 / 4113; call B measured it before the fix); the matrix's Mooncake rows again (time saved);
# then make test-gpu's replay half but the matrix, with the time left
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsC; git log --oneline -1 > /tmp/pack/headC.txt 2>&1
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernelsC.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s0 )) s"; grep -E "FAILED|passed|failed" /tmp/pack/gpu-kernelsC.txt | tail -n 6
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 110 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 0,4096 --profile --out /tmp/pack/probeC.jsonl > /tmp/pack/probeC.txt 2>&1; echo "probe rc=$? $(( $(date +%s)-s )) s"; grep -v "^{" /tmp/pack/probeC.txt | cut -c1-120 | head -n 70
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rowsC timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_matrix_gpu.py -k "mooncake and not marconi and not nemotron" > /tmp/pack/gpu-matrixC.txt 2>&1; echo "matrix mooncake rc=$? $(( $(date +%s)-s )) s"; tail -n 3 /tmp/pack/gpu-matrixC.txt
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout $(( 540 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay -k "not test_contract_at_preset_shapes" > /tmp/pack/gpu-replay-restC.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error" /tmp/pack/gpu-replay-restC.txt | tail -n 8
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
