# session 32, call G: run(carry=[".s20"], timeout_s=390) after f88fc4b (continuous replay's memory: the executor's KV
# grown as it runs, open flights bounded at FLIGHT_BYTES on a GPU, the plan counting running requests, torch's cache
# emptied before a replay). The continuous GPU test (plan == executor peak), then marconi-7b at full depth on the
# Mooncake sample under the default (continuous) scheduler at 20 GB (out of memory at request 25 before, no warning)
# and at 10 GB.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/packG
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/sim/replay/test_replay_gpu.py -k continuous > /tmp/packG/gpu-continuous.txt 2>&1
echo "gpu test rc=$? $(( $(date +%s)-s0 )) s"; tail -2 /tmp/packG/gpu-continuous.txt
for c in 20 10; do s=$(date +%s)
  timeout 115 /tmp/marconi replay --model marconi-7b --trace mooncake:sample --capacity ${c}GB --requests 40 --no-progress --out /tmp/packG/m7b$c > /tmp/packG/m7b$c.txt 2>&1
  echo "marconi-7b ${c}GB rc=$? $(( $(date +%s)-s )) s"; grep -E "warning|Error|hits|failures|store peak|wall" /tmp/packG/m7b$c.txt | cut -c1-330
  python3 -c "import json; s=json.load(open('/tmp/packG/m7b$c/summary.json')); print({k: s.get(k) for k in ('step_peak_bytes','flights_parked','flights_dropped','recomputed_tokens','store_peak_bytes')})" 2>/dev/null
  tar -C /tmp -czf $OUT/packG.tgz packG
done; echo "total $(( $(date +%s)-s0 )) s"
