# issue 42: the SSD output beside the state loop (OVL), its bits then its time (carry .s16)
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels/test_ssd.py > $OUT/ssd-tests.txt 2>&1; echo "ssd gpu tests rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ssd-tests.txt
s=$(date +%s)
timeout 280 python3 benchmarks/ssd_bench.py --no-fla --lengths 4096,8192,32768 --json $OUT/ssd-ovl.json \
  --variant "ovl:KERNELS_CONFIG_SSD_STATE=OVL=1" --variant "ovl4:KERNELS_CONFIG_SSD_STATE=OVL=1,SIG=4" \
  --variant "ovl64:KERNELS_CONFIG_SSD_STATE=OVL=1,SIG=4,BP=64,num_stages=2" \
  --variant "ovlw4:KERNELS_CONFIG_SSD_STATE=OVL=1,SIG=4,num_warps=4" > $OUT/ssd-ovl.txt 2>&1
echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^#" $OUT/ssd-ovl.txt | tail -100
