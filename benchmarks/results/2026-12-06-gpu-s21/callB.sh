# session 21, call B: run(kind=nvidia-h100-x1, carry=[".fqla"], timeout_s=600), right after call A while warm
# 1. issue 41 item 4 on the H100: qwen3-next-80b-a3b at full depth, batched, on the Mooncake sample (150 requests;
#    expandable segments against fragmentation);
#    --capacity 8GB so the store, the queues and the longest request's call and check fit in 80 GB
#    (at 40 GB it ran out of memory in session 20)
# 2. make test-gpu's last file: tests/sim/replay/test_replay_peers_gpu.py (FLA and FlashQLA)
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /tmp/env.txt 2>&1; cat /tmp/env.txt
s0=$(date +%s); left() { local l=$(( 585 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack; cp /tmp/env.txt /tmp/pack/
s=$(date +%s)
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 300 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h100-timing.json --capacity 8GB --requests 150 --runs marconi/exact/sequential@16 --out /tmp/pack/rb80 > /tmp/pack/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" /tmp/pack/replay-bench-80b.txt | grep -v "^{" | cut -c1-400 | tail -12
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack/gpu-peers.txt 2>&1; echo "peers rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/pack/gpu-peers.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
