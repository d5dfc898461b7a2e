# the next session's `make test-gpu` at the final code, in three calls (session 19 on the H100: the replay suite's
# first 34 tests took 400 s, the peers' whole replays compile TileLang for minutes):
#   run(carry=[".fqla"], timeout_s=600): bash next-tests.sh kernels     (the kernel suite, -n 8: ~130 s)
#   run(carry=[".fqla"], timeout_s=600): bash next-tests.sh replay      (the replay suite but the peers' file)
#   run(carry=[".fqla"], timeout_s=600): bash next-tests.sh peers       (tests/sim/replay/test_replay_peers_gpu.py)
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
s=$(date +%s)
if [ "$1" = kernels ]; then
  timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1
elif [ "$1" = peers ]; then
  timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_peers_gpu.py > $OUT/gpu-peers.txt 2>&1
else
  timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > $OUT/gpu-replay.txt 2>&1
fi
echo "$1 rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/gpu-*.txt
