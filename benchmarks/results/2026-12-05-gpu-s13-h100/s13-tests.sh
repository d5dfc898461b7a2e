source .gpu/env.sh
s=$(date +%s)
timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu tests/sim/replay --durations=10 > $OUT/test-gpu-replay.txt 2>&1; echo "replay tests rc=$? $(( $(date +%s)-s )) s"; tail -30 $OUT/test-gpu-replay.txt
