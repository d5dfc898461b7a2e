# the kernel GPU tests tests.sh's 330 s cut (the last seven of test_state_variants.py), then time41.sh (carry .s16)
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels/test_state_variants.py > $OUT/gpu-state-variants.txt 2>&1; echo "state variants rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-state-variants.txt
bash benchmarks/results/2026-12-06-gpu-s17/time41.sh
# the SSD table at the final default (overlapped, 3 stages) against the previous default, mamba_ssm in the same run
s=$(date +%s)
timeout 110 python3 benchmarks/ssd_bench.py --no-fla --lengths 4096,8192,32768 --json $OUT/ssd-table.json \
  --variant "old:KERNELS_CONFIG_SSD_STATE=OVL=0,BP=32,num_stages=3" > $OUT/ssd-table.txt 2>&1
echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^#" $OUT/ssd-table.txt | grep -v "states128" | tail -50
