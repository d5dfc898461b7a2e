# session 28: the H200 did not come (three tries); on an H100 (run(kind="nvidia-h100-x1", carry=[".s20"], timeout_s=600)):
# the Gluon SSD loop's GPU tests (two warpgroups, bulk copies) and ssd_bench with the variants (issue 42), then
# make test-gpu's replay half but the FlashQLA peers with the preset matrix's rows kept (issue 41: the copy fix's rows,
# beside session 27's H100 rows).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 575 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packH/rows; nvidia-smi > /tmp/packH/nvidia-smi.txt 2>&1; git log --oneline -1 > /tmp/packH/head.txt 2>&1
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels/test_ssd.py -k gluon > /tmp/packH/gpu-gluon.txt 2>&1; echo "gluon tests rc=$? $(( $(date +%s)-s0 )) s"; tail -3 /tmp/packH/gpu-gluon.txt
tar -C /tmp -czf $OUT/all.tgz packH; s=$(date +%s)
timeout 140 python3 benchmarks/ssd_bench.py --no-mamba --variant glu2:KERNELS_CONFIG_SSD_STATE=GLUON=2 --variant glu2t:KERNELS_CONFIG_SSD_STATE=GLUON=2,TMA_B=1 --json /tmp/packH/ssd.json > /tmp/packH/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/packH/ssd.txt | cut -c1-100 | head -n 50
tar -C /tmp -czf $OUT/all.tgz packH; s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/packH/rows timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/packH/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -25 /tmp/packH/gpu-replay.txt
tar -C /tmp -czf $OUT/all.tgz packH; echo "total $(( $(date +%s)-s0 )) s"
