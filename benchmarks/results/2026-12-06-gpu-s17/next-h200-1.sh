# written for the next session's first H200 call (carry .fqla: the test wheels, mamba_ssm's Triton files, FLA,
# FlashQLA + TileLang): the kernel GPU suite at the final SSD default (its overlapped loop at 3 stages was timed,
# not yet compared bit for bit on a GPU), the SSD table with FLA's chunk_simple_gla and mamba_ssm in one run,
# issue 48's six shapes with FlashQLA. Every output goes into one archive (a call returns few files).
NO_FQLA=1 source benchmarks/results/2026-12-06-gpu-s16/env.sh
s=$(date +%s)
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/gpu-kernels.txt
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null
s=$(date +%s)
timeout 120 python3 benchmarks/ssd_bench.py --profile --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | grep -v states128 | tail -40
s=$(date +%s)
timeout 220 python3 benchmarks/kernel_bench.py --nometa --rep 20 --host-calls 0 --json $OUT/kernel.json > $OUT/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"
grep -v TileLang $OUT/kernel-bench.txt | grep -v "^# {" | tail -30
tar -C $OUT -czf /tmp/next1.tgz . 2>/dev/null; mv /tmp/next1.tgz $OUT/; ls $OUT
