# session 30, H200 call 2 (the same warm H200): run(carry=[".s20"], needs_h200=true, timeout_s=600). make test-gpu's
# replay half but the FlashQLA peers, the preset matrix's rows kept (issue 41's H200 table), then ssd_bench at 32K.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packH2/rows
MARCONI_GPU_ROWS=/tmp/packH2/rows timeout 430 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packH2/gpu-replay.txt 2>&1
echo "replay rc=$? $(( $(date +%s)-s0 )) s"; tail -14 /tmp/packH2/gpu-replay.txt
tar -C /tmp -czf $OUT/packH2.tgz packH2; s=$(date +%s)
timeout $(left) python3 benchmarks/ssd_bench.py --lengths 32768 --variant two:KERNELS_CONFIG_SSD_STATE=WS=0 --json /tmp/packH2/ssd32k.json > /tmp/packH2/ssd32k.txt 2>&1
echo "ssd 32k rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/packH2/ssd32k.txt | grep -v "^#" | cut -c1-120
tar -C /tmp -czf $OUT/packH2.tgz packH2; echo "total $(( $(date +%s)-s0 )) s"
