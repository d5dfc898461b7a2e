# make test-gpu's two halves side by side on the one GPU (kernels compile on the CPUs, replay runs on the GPU)
source benchmarks/results/2026-12-06-gpu-s15/env.sh
s=$(date +%s)
( timeout 580 make test-gpu-kernels GPU_PY=python3 > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s" >> $OUT/rc.txt ) &
( timeout 580 make test-gpu-replay GPU_PY=python3 > $OUT/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; tail -4 $OUT/gpu-kernels.txt; grep -E "^(FAILED|ERROR)" $OUT/gpu-kernels.txt $OUT/gpu-replay.txt; tail -6 $OUT/gpu-replay.txt
