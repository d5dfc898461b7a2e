# make test-gpu's two halves side by side on the one GPU (kernels compile on the CPUs, replay runs on the GPU),
# then the SSD loop's last variants against the previous default (carry .s16)
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
( timeout 330 make test-gpu-kernels GPU_PY=python3 > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s" >> $OUT/rc.txt ) &
( timeout 330 make test-gpu-replay GPU_PY=python3 > $OUT/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; tail -4 $OUT/gpu-kernels.txt; grep -E "^(FAILED|ERROR)" $OUT/gpu-kernels.txt $OUT/gpu-replay.txt; tail -6 $OUT/gpu-replay.txt
s=$(date +%s)
timeout 200 python3 benchmarks/ssd_bench.py --no-fla --lengths 4096,8192,32768 --json $OUT/ssd-final.json \
  --variant "s3:KERNELS_CONFIG_SSD_STATE=num_stages=3" --variant "cs:KERNELS_CONFIG_SSD_STATE=CS=1" \
  --variant "old:KERNELS_CONFIG_SSD_STATE=OVL=0,BP=32,num_stages=3" > $OUT/ssd-final.txt 2>&1
echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^#" $OUT/ssd-final.txt | grep -v "states128" | tail -80
