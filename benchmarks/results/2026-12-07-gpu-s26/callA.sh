# session 26, call A: run(carry=[".s20"], timeout_s=600): the conv from zeros / from a state alone (conv_bench.py,
# launch variants), the replay probe with the from-scratch call measured last, make test-gpu's kernel half at the
# session head, the SSD table with the state-emitting peers (mamba_ssm / FLA at chunk 64 with fp32 states)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1; git log --oneline -1 > /tmp/pack/headA.txt 2>&1
timeout 100 python3 benchmarks/conv_bench.py --dims 8192 --lengths 8192,32768 --rounds 2 --profile --variant own:KERNELS_CONFIG_CONV=ONE_BINARY=0 --variant bd64w4:KERNELS_CONFIG_CONV=BD=64,num_warps=4 --json /tmp/pack/conv.json > /tmp/pack/conv.txt 2>&1; echo "conv rc=$? $(( $(date +%s)-s0 )) s"; grep -v Warn /tmp/pack/conv.txt | head -n 60
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 90 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 17,4096,0 --profile --out /tmp/pack/probe-last.jsonl > /tmp/pack/probe-last.txt 2>&1; echo "probe rc=$? $(( $(date +%s)-s )) s"; grep -v "^{" /tmp/pack/probe-last.txt | grep -E "^ +[0-9]|conv" | cut -c1-120
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 210 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; grep -E "FAILED|passed|failed" /tmp/pack/gpu-kernels.txt | tail -n 8
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout $(( 585 - ($(date +%s) - s0) )) python3 benchmarks/ssd_bench.py --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/pack/ssd.txt | cut -c1-110 | head -n 70
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
