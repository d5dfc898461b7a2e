# session 18 (carry .fqla: test wheels, mamba_ssm's Triton files, FLA, FlashQLA + TileLang): the kernel GPU suite
# at this session's code, issue 48's six shapes with FLA and FlashQLA, issue 42's SSD table with FLA's
# chunk_simple_gla and mamba_ssm (no --profile: it ran first and took the whole step in session 17's call)
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s0=$(date +%s)
left() { local l=$(( ${BUDGET:-575} - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
s=$(date +%s)
timeout 215 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-kernels.txt
s=$(date +%s)
timeout 100 python3 benchmarks/ssd_bench.py --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | tail -40
s=$(date +%s)
timeout $(left) python3 benchmarks/kernel_bench.py --rep 20 --host-calls 0 --json $OUT/kernel.json > $OUT/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"
grep -v TileLang $OUT/kernel-bench.txt | grep -v "^# {" | tail -30
tar -C $OUT -czf /tmp/k.tgz . 2>/dev/null; mv /tmp/k.tgz $OUT/; ls $OUT
