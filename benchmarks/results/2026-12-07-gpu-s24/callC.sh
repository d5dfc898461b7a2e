# session 24, call C: run(carry=[".s20"], timeout_s=560): which kernels a replayed gated-delta layer resumed from a
# state spends its extra in (replay_cost_probe --profile, qwen3-next-80b-a3b at 4 layers, 8,192-token suffixes from
# 0 / 17 / 4096 / 4113), then make test-gpu's replay half but the matrix (calls A and B ran its 24 rows) at the
# final SSD code (SHARE reverted: the kernels as calls A's 169 passed)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack; git log --oneline -1 > /tmp/pack/headC.txt 2>&1
timeout 150 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 0,4096 --profile --out /tmp/pack/probeC.jsonl > /tmp/pack/probeC.txt 2>&1; echo "probe rc=$?"; grep -v "^{" /tmp/pack/probeC.txt | cut -c1-130
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
timeout $(( 550 - ($(date +%s) - s0) )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=5 tests/sim/replay -k "not test_contract_at_preset_shapes" > /tmp/pack/gpu-replay-rest.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error|SKIP" /tmp/pack/gpu-replay-rest.txt | tail -n 12
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
