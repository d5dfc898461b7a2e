# session 33, call B (the same warm machine as call A): run(carry=[".s20"], timeout_s=600). make test-gpu's kernel
# half (-n 8), then marconi-7b at full depth on the Mooncake sample under continuous batching (session 32's out of
# memory at 20 GB): at 20 GB with the store on the host, and at 10 GB uncut; step_peak_bytes / flights off the summary.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packB; nvidia-smi > /tmp/packB/nvidia-smi.txt 2>&1
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/packB/gpu-kernels.txt 2>&1
echo "kernels rc=$? $(( $(date +%s)-s0 )) s"; tail -3 /tmp/packB/gpu-kernels.txt
tar -C /tmp -czf $OUT/packB.tgz packB
for run in "20 host" "10 gpu"; do set -- $run; s=$(date +%s); l=$(left); [ $l -gt 200 ] && l=$(( l / ( $1 == 20 ? 2 : 1 ) ))
  timeout $l /tmp/marconi replay --model marconi-7b --trace mooncake:sample --capacity ${1}GB --store $2 --requests 40 --no-progress --out /tmp/packB/m7b$1$2 > /tmp/packB/m7b$1$2.txt 2>&1
  echo "marconi-7b ${1}GB store $2 rc=$? $(( $(date +%s)-s )) s"; grep -E "warning|Error|hits|failures|store peak|wall|TFLOP" /tmp/packB/m7b$1$2.txt | cut -c1-330
  python3 -c "import json; s=json.load(open('/tmp/packB/m7b$1$2/summary.json')); print({k: s.get(k) for k in ('step_peak_bytes','flights_parked','flights_dropped','recomputed_tokens','store_peak_bytes','wall_s')})" 2>/dev/null
  tar -C /tmp -czf $OUT/packB.tgz packB
done; echo "total $(( $(date +%s)-s0 )) s"
