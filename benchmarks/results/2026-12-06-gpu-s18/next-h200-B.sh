# the next session's second call, at once after A on the held H200: run(kind=nvidia-h200, carry=[".s16"],
# timeout_s=600) (no needs_h200: the held H200 serves it). make test-gpu on the H200: the kernel half (-n 8; the
# TMA_B and DISCARD bit checks among it) and the replay half (issue 41's GPU matrix).
source benchmarks/results/2026-12-06-gpu-s17/env.sh
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-kernels.txt
s=$(date +%s)
timeout 330 make test-gpu-replay GPU_PY=python3 > $OUT/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-replay.txt
