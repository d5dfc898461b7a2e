# for the next session, on an H200 (issue 42's H200 table): run(carry=[".s20"], kind="nvidia-h200", timeout_s=600).
# ssd_bench with the fused program beside the default, mamba_ssm and FLA, 4K / 8K then 32K (the full run takes
# longer than one call's 200 s slice), then the fused and Gluon SSD GPU tests.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packS; nvidia-smi > /tmp/packS/nvidia-smi.txt 2>&1
timeout 220 python3 benchmarks/ssd_bench.py --small --variant ws:KERNELS_CONFIG_SSD_STATE=WS=1 --json /tmp/packS/ssd-small.json > /tmp/packS/ssd-small.txt 2>&1; echo "ssd small rc=$? $(( $(date +%s)-s0 )) s"; grep -v Warn /tmp/packS/ssd-small.txt | grep -v "^#" | cut -c1-110
cp -r /tmp/packS $OUT/; s=$(date +%s)
timeout 150 python3 benchmarks/ssd_bench.py --lengths 32768 --variant ws:KERNELS_CONFIG_SSD_STATE=WS=1 --json /tmp/packS/ssd32k.json > /tmp/packS/ssd32k.txt 2>&1; echo "ssd 32k rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/packS/ssd32k.txt | grep -v "^#" | cut -c1-110
cp -r /tmp/packS $OUT/; s=$(date +%s)
timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels/test_ssd.py -k "fused or gluon" > /tmp/packS/gpu-fused.txt 2>&1; echo "fused tests rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/packS/gpu-fused.txt
cp -r /tmp/packS $OUT/; echo "total $(( $(date +%s)-s0 )) s"
