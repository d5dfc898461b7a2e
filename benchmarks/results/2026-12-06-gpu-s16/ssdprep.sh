# issue 42 (carry .fqla): the SSD state loop with dt / gamma from a parallel kernel ahead of it (PREP=1), compiled
# for the GPU (the variant tests, not -m gpu), then timed beside the default and FLA / mamba_ssm
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null
s=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_ssd.py -k "variants or half or resume" > $OUT/ssd-variant-tests.txt 2>&1; echo "tests rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/ssd-variant-tests.txt
s=$(date +%s)
timeout 200 python3 benchmarks/ssd_bench.py --lengths 4096,8192,32768 --profile --variant "prep:KERNELS_CONFIG_SSD_STATE=PREP=1;prep64:KERNELS_CONFIG_SSD_STATE=PREP=1,BP=64,num_stages=2;prep4w:KERNELS_CONFIG_SSD_STATE=PREP=1,num_warps=4" --json $OUT/ssdprep.json > $OUT/ssdprep.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssdprep.txt | grep -v "^#   " | tail -70
