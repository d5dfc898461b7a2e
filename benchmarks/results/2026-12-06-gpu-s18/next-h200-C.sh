# the next session's third call, at once after B on the held H200: run(kind=nvidia-h200, carry=[".s16"],
# timeout_s=300): issue 41's held-out matrix, the re-pricing and the re-time's GPU test (time41.sh, ~225 s).
bash benchmarks/results/2026-12-06-gpu-s17/time41.sh
tar -C $OUT -czf /tmp/c.tgz matrix stalls-80b.csv 2>/dev/null; mv /tmp/c.tgz $OUT/
