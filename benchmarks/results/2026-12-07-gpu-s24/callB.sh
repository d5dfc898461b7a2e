# session 24, call B: run(carry=[".s20"], timeout_s=600): where a resumed gated-delta layer's time goes (kernel_bench
# --resumed --profile; replay_cost_probe from 0 / 17 / 4096), the matrix's marconi-7b / nemotron-h-8b rows, the agent
# trace held-out runs on qwen3.5-27b and qwen3-next-80b-a3b (4 layers, 60 requests, fcfs)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack/rowsB; git log --oneline -1 > /tmp/pack/headB.txt 2>&1
timeout 130 python3 benchmarks/kernel_bench.py --resumed --profile --no-fla --no-flashqla --rep 20 --host-calls 0 --shapes 16/32,4/8 --T 32768,8192 --json /tmp/pack/resumed.json > /tmp/pack/kernel-resumed.txt 2>&1; echo "kernel_bench rc=$?"; grep -v "^# {" /tmp/pack/kernel-resumed.txt | grep -v Warn | tail -n 45
tar -C /tmp -czf $OUT/all.tgz pack
timeout 100 python3 benchmarks/replay_cost_probe.py --model qwen3-next-80b-a3b --layers 4 --reps 3 --suffixes 8192 --prefixes 0,17,4096 --out /tmp/pack/probe.jsonl > /tmp/pack/probe.txt 2>&1; echo "probe rc=$?"; tail -n 12 /tmp/pack/probe.txt
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rowsB timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_matrix_gpu.py -k "marconi or nemotron" > /tmp/pack/gpu-matrix-mamba.txt 2>&1; echo "matrix mamba rc=$? $(( $(date +%s)-s )) s"; tail -n 4 /tmp/pack/gpu-matrix-mamba.txt
tar -C /tmp -czf $OUT/all.tgz pack
for m in qwen3.5-27b qwen3-next-80b-a3b; do s=$(date +%s)
  timeout $(( 575 - ($(date +%s) - s0) )) /tmp/marconi replay --model $m --trace synthetic:agent --layers 4 --requests 60 --scheduler fcfs --capacity 40GB --no-progress --format json --out /tmp/pack/agent-$m > /tmp/pack/agent-$m.json 2> /tmp/pack/agent-$m.err; echo "agent $m rc=$? $(( $(date +%s)-s )) s"; tail -n 3 /tmp/pack/agent-$m.err
  tar -C /tmp -czf $OUT/all.tgz pack; done
echo "total $(( $(date +%s)-s0 )) s"
