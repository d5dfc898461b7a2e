# session 21, the one call the budget left after the refused starts: run(carry=[".s20"], timeout_s=600)
# (no kernel changed since make test-gpu's kernel half passed at d12fec1: not rerun)
# 1. make test-gpu's replay half (but the peers' file) at the final code, the preset-shape matrix's summaries kept;
# 2. the two ShareGPT held-out runs with outrun references timed again ("saved on validated hits");
# 3. benchmarks/attn_bench.py (issue 41 item 4);
# 4. issue 41 item 4: qwen3-next-80b-a3b at full depth, batched (@16), Mooncake sample, --capacity 8GB (fits an 80 GB
#    card; OOM at 40 GB in session 20), with what time is left.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 585 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack/rows
s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rows timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error" /tmp/pack/gpu-replay.txt | tail -8
tar -C /tmp -czf $OUT/all.tgz pack
for m in qwen3-next-80b-a3b qwen3.5-27b; do s=$(date +%s)
  timeout 70 /tmp/marconi replay --model $m --trace sharegpt --session-range 60:100 --requests 200 --mode sequential --layers 4 \
    --capacity 40GB --no-progress --out /tmp/pack/sharegpt-$m > /tmp/pack/sharegpt-$m.txt 2>&1
  echo "sharegpt $m rc=$? $(( $(date +%s)-s )) s"; grep -E "saved on validated|time model error|hits" /tmp/pack/sharegpt-$m.txt
done
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s); timeout 60 python3 benchmarks/attn_bench.py --json /tmp/pack/attn.json > /tmp/pack/attn.txt 2>&1
echo "attn_bench rc=$? $(( $(date +%s)-s )) s"; tail -22 /tmp/pack/attn.txt
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(( $(left) - 10 )) python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h100-timing.json --capacity 8GB --requests 150 --runs marconi/exact/sequential@16 --out /tmp/pack/rb80 > /tmp/pack/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" /tmp/pack/replay-bench-80b.txt | grep -v "^{" | cut -c1-400 | tail -10
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
