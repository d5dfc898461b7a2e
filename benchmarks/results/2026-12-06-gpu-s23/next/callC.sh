# for session 24: run(carry=[".s20"], timeout_s=300): where a resumed gated-delta layer's 11-21 % per chunk goes
# (docs/replay-cost-model.md, "A prefill resumed from a state"): the kernel from an initial state and from position 512,
# per kernel (--profile at the longest T); then the replay's own probe from position 0 / 17 / 4096 per layer type
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
mkdir -p /tmp/pack; git log --oneline -1 > /tmp/pack/head.txt 2>&1
timeout 150 python3 benchmarks/kernel_bench.py --resumed --profile --no-fla --no-flashqla --rep 20 --host-calls 0 --shapes 16/32,4/8 --T 32768,8192 --json /tmp/pack/resumed.json > /tmp/pack/kernel-resumed.txt 2>&1; echo "kernel_bench rc=$?"; grep -v "^# {" /tmp/pack/kernel-resumed.txt | tail -n 40
tar -C /tmp -czf $OUT/all.tgz pack
timeout 120 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 0,17,4096 --out /tmp/pack/probe.jsonl > /tmp/pack/probe.txt 2>&1; echo "probe rc=$?"; tail -n 12 /tmp/pack/probe.txt
tar -C /tmp -czf $OUT/all.tgz pack
