# session 22, call C5 (the kernel table alone, the last device time): run(carry=[".fqla2"], timeout_s=150): issue 48's gated-delta
# table with FLA, FlashQLA and FlashQLA exact in the run and the per-kernel profile at 32K (the gap per stage), ours
# called plainly too (--nometa); then replay GPU tests at the final replay code (fused, full depth, batched)
source benchmarks/results/2026-12-06-gpu-s21/env21.sh > /tmp/env.txt 2>&1; cat /tmp/env.txt; export LD_LIBRARY_PATH=/tmp/site/z3/lib:$LD_LIBRARY_PATH; python3 -c "import flash_qla, fla; print('flash_qla and fla import')" 2>&1 | tail -1
s0=$(date +%s); left() { local l=$(( 228 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack; cp /tmp/env.txt /tmp/pack/
s=$(date +%s)
timeout 135 python3 benchmarks/kernel_bench.py --shapes 16/32 --rep 20 --host-calls 0 --nometa --profile --json /tmp/pack/kernel.json > /tmp/pack/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# profile\|^#  " /tmp/pack/kernel-bench.txt | tail -14
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
