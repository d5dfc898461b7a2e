# for session 25's first call: run(carry=[".s20"], timeout_s=600), the conv fix (e855240) measured: the replay probe per
# kernel from 0 / 17 / 4096 / 4113 (session 24's call B measured it before the fix: gated-delta 6.91 / 8.75 / 8.71 ms on
# an H100), make test-gpu's kernel half, the matrix's Mooncake rows (time saved; rescore with ../rescore_resume.py).
# Where the probe shows no extra: gdn_resume_ms_per_chunk -> 0 in sim/data/*-timing.json (docs/replay-cost-model.md)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsC; git log --oneline -1 > /tmp/pack/headC.txt 2>&1
timeout 120 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 0,4096 --profile --out /tmp/pack/probeC.jsonl > /tmp/pack/probeC.txt 2>&1; echo "probe rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^{" /tmp/pack/probeC.txt | cut -c1-120 | head -n 70
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernelsC.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; grep -E "FAILED|passed|failed" /tmp/pack/gpu-kernelsC.txt | tail -n 6
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rowsC timeout $(( 585 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_matrix_gpu.py -k "mooncake" > /tmp/pack/gpu-matrixC.txt 2>&1; echo "matrix mooncake rc=$? $(( $(date +%s)-s )) s"; tail -n 3 /tmp/pack/gpu-matrixC.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
