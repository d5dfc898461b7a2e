# issue 42: the overlapped output as the 16-bit default on Hopper (BP 64, SIG 4) and the output reading the
# emitted boundary states (HB), against the previous default, in one run (carry .s16)
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels/test_ssd.py > $OUT/ssd-tests2.txt 2>&1; echo "ssd gpu tests rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ssd-tests2.txt
s=$(date +%s)
timeout 330 python3 benchmarks/ssd_bench.py --no-fla --lengths 4096,8192,32768 --json $OUT/ssd-default.json \
  --variant "hb0:KERNELS_CONFIG_SSD_STATE=HB=0" --variant "sig8:KERNELS_CONFIG_SSD_STATE=SIG=8" \
  --variant "s3:KERNELS_CONFIG_SSD_STATE=num_stages=3" --variant "old:KERNELS_CONFIG_SSD_STATE=OVL=0,BP=32,num_stages=3" \
  --variant "oldhb0:KERNELS_CONFIG_SSD_STATE=OVL=0,BP=32,num_stages=3,HB=0" > $OUT/ssd-default.txt 2>&1
echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^#" $OUT/ssd-default.txt | tail -130
