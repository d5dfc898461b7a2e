# for the next session (any Hopper): run(carry=[".s20"], timeout_s=600), twice: PART=kernels, then PART=replay.
# make test-gpu with the fused SSD program as every call's default (KERNELS_CONFIG_SSD_STATE=WS=1 for the whole
# run): what switching the default on Hopper would run. Tests that set KERNELS_CONFIG_SSD_STATE themselves replace
# the whole setting and keep comparing the two-kernel path with its variants, as they do today. If both halves
# pass: "half-ovl" gets WS=1 in kernels/ssd.py's SSD_CONFIGS, those tests name WS=0, and make test-gpu runs again.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
export KERNELS_CONFIG_SSD_STATE=WS=1
s0=$(date +%s); mkdir -p /tmp/packF
if [ "${PART:-kernels}" = kernels ]; then
  timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/packF/gpu-kernels-ws.txt 2>&1
  echo "kernels (WS=1) rc=$? $(( $(date +%s)-s0 )) s"; tail -3 /tmp/packF/gpu-kernels-ws.txt
else
  timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packF/gpu-replay-ws.txt 2>&1
  echo "replay (WS=1) rc=$? $(( $(date +%s)-s0 )) s"; tail -3 /tmp/packF/gpu-replay-ws.txt
fi
tar -C /tmp -czf $OUT/packF-${PART:-kernels}.tgz packF
