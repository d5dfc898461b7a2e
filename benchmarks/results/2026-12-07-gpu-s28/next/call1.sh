# session 28, first call: run(carry=[".s20"], needs_h200=true, timeout_s=600). needs_h200 is what the work needs:
# qwen3-next-80b-a3b at full depth on the Mooncake sample (issue 41 item 4) ran out of an H100's 80 GB (session 27).
# Then the Gluon SSD loop's GPU tests (the two-warpgroup and bulk-copy variants) and ssd_bench with them (issue 42).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack1; nvidia-smi > /tmp/pack1/nvidia-smi.txt 2>&1; git log --oneline -1 > /tmp/pack1/head.txt 2>&1
timeout 200 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out /tmp/pack1/rb80 > /tmp/pack1/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^\s" /tmp/pack1/replay-bench-80b.txt | grep -v "^{" | tail -8
tar -C /tmp -czf $OUT/all.tgz pack1; s=$(date +%s)
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels/test_ssd.py -k gluon > /tmp/pack1/gpu-gluon.txt 2>&1; echo "gluon tests rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/pack1/gpu-gluon.txt
tar -C /tmp -czf $OUT/all.tgz pack1; s=$(date +%s)
timeout 150 python3 benchmarks/ssd_bench.py --no-mamba --variant glu2:KERNELS_CONFIG_SSD_STATE=GLUON=2 --variant glu2t:KERNELS_CONFIG_SSD_STATE=GLUON=2,TMA_B=1 --variant tma:KERNELS_CONFIG_SSD_STATE=TMA_B=1 --json /tmp/pack1/ssd.json > /tmp/pack1/ssd.txt 2>&1; echo "ssd rc=$? $(( $(date +%s)-s )) s"; grep -v Warn /tmp/pack1/ssd.txt | cut -c1-100 | head -n 70
tar -C /tmp -czf $OUT/all.tgz pack1; echo "total $(( $(date +%s)-s0 )) s"
