# session 21, call B on an H200 (if one comes): run(carry=[".fqla"], timeout_s=600), right after call A while warm
# 1. issue 41 item 4: qwen3-next-80b-a3b at full depth, batched, on the Mooncake sample (150 requests, 40 GB)
# 2. issue 42's SSD table (mamba_ssm and FLA in the run)
# 3. issue 48's gated-delta table (FLA, FlashQLA, FlashQLA exact in the run)
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /tmp/env.txt 2>&1; cat /tmp/env.txt
s0=$(date +%s); left() { local l=$(( 585 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack; cp /tmp/env.txt /tmp/pack/
s=$(date +%s)
timeout 230 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB --requests 150 --runs marconi/exact/sequential@16 --out /tmp/pack/rb80 > /tmp/pack/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" /tmp/pack/replay-bench-80b.txt | grep -v "^{" | cut -c1-400 | tail -10
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout 150 python3 benchmarks/ssd_bench.py --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" /tmp/pack/ssd.txt | tail -12
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(( $(left) - 10 )) python3 benchmarks/kernel_bench.py --rep 20 --host-calls 0 --json /tmp/pack/kernel.json > /tmp/pack/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"; tail -14 /tmp/pack/kernel-bench.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
