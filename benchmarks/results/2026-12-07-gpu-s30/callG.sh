# session 30: run(carry=[".s20"], timeout_s=600), twice on the same warm Hopper: PART=kernels, then PART=replay.
# make test-gpu with the fused SSD program as "half-ovl"'s default (WS=1; the variant tests pin WS=0), the kernel half
# with -n 8, then ssd_bench's small lengths with the two kernels (WS=0) as a variant beside the new default; the
# replay half but the FlashQLA peers (no FlashQLA carry), the preset matrix's rows kept and tarred.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packG/rows; nvidia-smi > /tmp/packG/nvidia-smi.txt 2>&1
if [ "${PART:-kernels}" = kernels ]; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/packG/gpu-kernels.txt 2>&1
  echo "kernels rc=$? $(( $(date +%s)-s0 )) s"; tail -3 /tmp/packG/gpu-kernels.txt
  tar -C /tmp -czf $OUT/packG-kernels.tgz packG; s=$(date +%s)
  timeout $(left) python3 benchmarks/ssd_bench.py --small --variant two:KERNELS_CONFIG_SSD_STATE=WS=0 --json /tmp/packG/ssd-small.json > /tmp/packG/ssd-small.txt 2>&1
  echo "ssd small rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/packG/ssd-small.txt | grep -v "^#" | cut -c1-120
  tar -C /tmp -czf $OUT/packG-kernels.tgz packG
else
  MARCONI_GPU_ROWS=/tmp/packG/rows timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packG/gpu-replay.txt 2>&1
  echo "replay rc=$? $(( $(date +%s)-s0 )) s"; tail -20 /tmp/packG/gpu-replay.txt
  tar -C /tmp -czf $OUT/packG-replay.tgz packG
fi
echo "total $(( $(date +%s)-s0 )) s"
