# issue 48's table on the H200 with FlashQLA installed (carry .fqla), issue 42's SSD table
source benchmarks/results/2026-12-06-gpu-s15/env.sh
python3 -c "import flash_qla, fla; print('flash_qla', getattr(flash_qla, '__version__', '?'), 'fla', fla.__version__)"
s=$(date +%s)
timeout 360 python3 benchmarks/kernel_bench.py --seg auto --nometa --rep 30 --host-calls 20 --profile --json $OUT/kernel.json > $OUT/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"
grep -v TileLang $OUT/kernel-bench.txt | tail -45
s=$(date +%s)
timeout 170 python3 benchmarks/ssd_bench.py --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; tail -20 $OUT/ssd.txt
