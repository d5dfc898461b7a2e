# session 20, the H200 call: run(kind=nvidia-h200, needs_h200=true, carry=[".fqla"], timeout_s=480)
# 1. issue 42's SSD table on the H200 (mamba_ssm and FLA in the run)
# 2. issue 48's gated-delta table on the H200 (FLA, FlashQLA, FlashQLA exact in the run)
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /tmp/env.txt 2>&1; cat /tmp/env.txt
s0=$(date +%s); left() { local l=$(( 455 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack; cp /tmp/env.txt /tmp/pack/
s=$(date +%s)
timeout 200 python3 benchmarks/ssd_bench.py --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" /tmp/pack/ssd.txt | tail -14
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(left) python3 benchmarks/kernel_bench.py --rep 20 --host-calls 0 --json /tmp/pack/kernel.json > /tmp/pack/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"; tail -16 /tmp/pack/kernel-bench.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
