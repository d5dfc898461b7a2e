# the H200 call on the budget's last minutes (carry .fqla): the kernel GPU tests spread over 8 workers
NO_FQLA=1 source benchmarks/results/2026-12-06-gpu-s15/env.sh
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels-h200.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -4 $OUT/gpu-kernels-h200.txt
