# session 30, H200 call 1: run(carry=[".s20"], needs_h200=true, timeout_s=600). needs_h200: qwen3-next-80b-a3b at
# full depth on the Mooncake sample (issue 41 item 4) ran out of an H100's 80 GB (session 20). Then make test-gpu's
# kernel half (-n 8; the fused SSD program now "half-ovl"'s default), then ssd_bench's 4K / 8K (issue 42's H200 table)
# with the two kernels (WS=0) as a variant beside the default, mamba_ssm and FLA.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 570 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/packH1; nvidia-smi > /tmp/packH1/nvidia-smi.txt 2>&1
timeout 190 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out /tmp/packH1/rb80 > /tmp/packH1/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^\s" /tmp/packH1/replay-bench-80b.txt | grep -v "^{" | tail -8
tar -C /tmp -czf $OUT/packH1.tgz packH1; s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/packH1/gpu-kernels.txt 2>&1
echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/packH1/gpu-kernels.txt
tar -C /tmp -czf $OUT/packH1.tgz packH1; s=$(date +%s)
timeout $(left) python3 benchmarks/ssd_bench.py --small --variant two:KERNELS_CONFIG_SSD_STATE=WS=0 --json /tmp/packH1/ssd-small.json > /tmp/packH1/ssd-small.txt 2>&1
echo "ssd small rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/packH1/ssd-small.txt | grep -v "^#" | cut -c1-120
tar -C /tmp -czf $OUT/packH1.tgz packH1; echo "total $(( $(date +%s)-s0 )) s"
