# the next session's second call, at once after A on the held H200: run(kind=nvidia-h200, carry=[".s16"],
# timeout_s=600) (no needs_h200: a held H200 serves it). The replay GPU suite (issue 41's GPU matrix), then
# issue 41's held-out matrix and re-pricing (time41.sh, ~225 s). The 80b full-depth step is A's.
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
timeout 250 make test-gpu-replay GPU_PY=python3 > $OUT/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-replay.txt
bash benchmarks/results/2026-12-06-gpu-s17/time41.sh
tar -C $OUT -czf /tmp/b.tgz matrix stalls-80b.csv 2>/dev/null; mv /tmp/b.tgz $OUT/
