# the next session's second H200 call (carry .s16): the replay GPU suite, then issue 41's held-out matrix
# (time41.sh, ~225 s) with every per-run table in one archive
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
timeout 260 make test-gpu-replay GPU_PY=python3 > $OUT/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-replay.txt
bash benchmarks/results/2026-12-06-gpu-s17/time41.sh
tar -C $OUT -czf /tmp/next2.tgz matrix stalls-80b.csv 2>/dev/null; mv /tmp/next2.tgz $OUT/
