# session 26, call A: make test-gpu kernel half at the session head, the SSD table with the state-emitting peers (mamba_ssm and FLA at chunk 64 with fp32 states), the probe with the from-scratch call last
# (the conv's -m gpu test from e855240 and the Gluon SSD tests included), the SSD table with FLA beside mamba_ssm, the
# probe with the from-scratch call measured last as well as first (is the conv's zero path slower, or the first
# measured config?)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
timeout 90 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 17,4096,0 --profile --out /tmp/pack/probe-last.jsonl > /tmp/pack/probe-last.txt 2>&1; echo "probe rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^{" /tmp/pack/probe-last.txt | grep -E "^ +[0-9]|conv" | cut -c1-120
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; grep -E "FAILED|passed|failed" /tmp/pack/gpu-kernels.txt | tail -n 8
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout $(( 585 - ($(date +%s) - s0) )) python3 benchmarks/ssd_bench.py --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/pack/ssd.txt | cut -c1-100 | head -n 40
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
