# the H200 call (carry .fqla): the kernel GPU tests on 8 workers (mamba_ssm's Triton scan importable, FLA / FlashQLA
# not unpacked yet), then issue 42's SSD table (states at every 64 / 128 / 256 tokens) and issue 48's six shapes
NO_FQLA=1 source benchmarks/results/2026-12-06-gpu-s16/env.sh
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -4 $OUT/gpu-kernels.txt
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null
s=$(date +%s)
timeout 130 python3 benchmarks/ssd_bench.py --profile --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | tail -75
s=$(date +%s)
timeout 230 python3 benchmarks/kernel_bench.py --nometa --rep 20 --host-calls 0 --json $OUT/kernel.json > $OUT/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"
grep -v TileLang $OUT/kernel-bench.txt | grep -v "^# {" | tail -30
