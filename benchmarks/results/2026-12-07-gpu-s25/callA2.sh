# session 25, call A2 (call A trimmed to the budget left after the failed starts): the Gluon SSD loop's GPU tests,
# its time beside the Triton loop and mamba_ssm, the conv fix timed by the replay probe
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack; git log --oneline -1 > /tmp/pack/headA.txt 2>&1; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/kernels/test_ssd.py -k gluon > /tmp/pack/gpu-gluon.txt 2>&1; echo "gluon tests rc=$? $(( $(date +%s)-s0 )) s"; grep -E "FAILED|passed|failed|Error" /tmp/pack/gpu-gluon.txt | tail -n 8
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 170 python3 benchmarks/ssd_bench.py --no-fla --variant glu:KERNELS_CONFIG_SSD_STATE=GLUON=1 --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/pack/ssd.txt | cut -c1-100 | head -n 60
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout 100 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 0,4096 --profile --out /tmp/pack/probe.jsonl > /tmp/pack/probe.txt 2>&1; echo "probe rc=$? $(( $(date +%s)-s )) s"; grep -v "^{" /tmp/pack/probe.txt | cut -c1-120 | head -n 50
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
