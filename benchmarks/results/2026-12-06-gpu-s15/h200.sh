# the H200 call (carry .fqla): the kernel GPU tests (mamba_ssm's Triton scan importable), issue 42's SSD table, issue 48's table
source benchmarks/results/2026-12-06-gpu-s15/env.sh
s=$(date +%s)
timeout 250 make test-gpu-kernels GPU_PY=python3 > $OUT/gpu-kernels-h200.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/gpu-kernels-h200.txt
s=$(date +%s)
timeout 100 python3 benchmarks/ssd_bench.py --json $OUT/ssd-h200.json > $OUT/ssd-h200.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd-h200.txt | tail -28
s=$(date +%s)
timeout 200 python3 benchmarks/kernel_bench.py --shapes 16/32 --rep 20 --host-calls 0 --json $OUT/kernel-h200.json > $OUT/kernel-bench-h200.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"
grep -v TileLang $OUT/kernel-bench-h200.txt | grep -v "^# {" | tail -40
