# session 28, the next call on the same warm machine: run(carry=[".s20"], timeout_s=600): the Gluon SSD loop's GPU tests
# (two warpgroups, bulk copies), ssd_bench with the variants (issue 42), then make test-gpu's kernel half (-n 8).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packX2; git log --oneline -1 > /tmp/packX2/head.txt 2>&1
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels/test_ssd.py -k gluon > /tmp/packX2/gpu-gluon.txt 2>&1; echo "gluon tests rc=$? $(( $(date +%s)-s0 )) s"; tail -3 /tmp/packX2/gpu-gluon.txt
tar -C /tmp -czf $OUT/all.tgz packX2; s=$(date +%s)
timeout 150 python3 benchmarks/ssd_bench.py --no-mamba --variant glu2:KERNELS_CONFIG_SSD_STATE=GLUON=2 --variant glu2t:KERNELS_CONFIG_SSD_STATE=GLUON=2,TMA_B=1 --json /tmp/packX2/ssd.json > /tmp/packX2/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/packX2/ssd.txt | cut -c1-100 | head -n 50
tar -C /tmp -czf $OUT/all.tgz packX2; s=$(date +%s)
timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/packX2/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/packX2/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz packX2; echo "total $(( $(date +%s)-s0 )) s"
