# session 29, first call (any Hopper): run(carry=[".s20"], timeout_s=600): the fused Gluon SSD program's GPU tests
# (WS=1), ssd_bench with it beside the default, mamba_ssm and FLA (issue 42), then make test-gpu's kernel half (-n 8).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packA; nvidia-smi > /tmp/packA/nvidia-smi.txt 2>&1; git log --oneline -1 > /tmp/packA/head.txt 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels/test_ssd.py -k "fused or gluon" > /tmp/packA/gpu-fused.txt 2>&1; echo "fused tests rc=$? $(( $(date +%s)-s0 )) s"; grep -E "passed|failed|Error|assert" /tmp/packA/gpu-fused.txt | tail -12
cp -r /tmp/packA $OUT/; s=$(date +%s)
timeout 200 python3 benchmarks/ssd_bench.py --variant ws:KERNELS_CONFIG_SSD_STATE=WS=1 --json /tmp/packA/ssd.json > /tmp/packA/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/packA/ssd.txt | cut -c1-110 | head -n 60
cp -r /tmp/packA $OUT/; s=$(date +%s)
timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/packA/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/packA/gpu-kernels.txt
cp -r /tmp/packA $OUT/; echo "total $(( $(date +%s)-s0 )) s"
