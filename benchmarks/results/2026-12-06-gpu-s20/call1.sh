# session 20, call 1: run(kind=nvidia-h200, needs_h200=true, carry=[".fqla"], timeout_s=600)
# 1. issue 41 item 4: qwen3-next-80b-a3b at full depth on the Mooncake sample (plans ~119 GB)
# 2. make test-gpu's kernel half (-n 8)
# 3. issue 42's SSD table on this GPU, every peer in the run
# Everything is packed into $OUT/all.tgz (a call returns at most 8 files).
source benchmarks/results/2026-12-06-gpu-s16/env.sh > $OUT/env.txt 2>&1; cat $OUT/env.txt
s0=$(date +%s); left() { local l=$(( 575 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
s=$(date +%s)
timeout 200 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 150 --runs marconi/exact/sequential@16 --out /tmp/rb80 > $OUT/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" $OUT/replay-bench-80b.txt | grep -v "^{" | tail -8
s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/gpu-kernels.txt
s=$(date +%s)
timeout $(left) python3 benchmarks/ssd_bench.py --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | tail -30
mkdir -p /tmp/pack && cp -r /tmp/rb80 /tmp/pack/ 2>/dev/null; cp $OUT/*.txt $OUT/*.json /tmp/pack/ 2>/dev/null; tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
