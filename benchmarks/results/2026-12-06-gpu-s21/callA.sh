# session 21, call A: run(needs_h200=true, carry=[".s20"], timeout_s=600)
# 1. make test-gpu's kernel half (-n 8) and replay half (but the peers' file, FlashQLA not carried), at the final
#    code of session 20 (the replay's reference re-timing had not run on a GPU); the preset-shape matrix's summaries
#    kept (MARCONI_GPU_ROWS) for issue 41's H200 table.
# 2. the two ShareGPT held-out runs (4 layers, sessions 60:100, 200 requests, sequential) with outrun references
#    timed again: their "saved on validated hits" line.
# 3. benchmarks/attn_bench.py (issue 41 item 4).
# Everything packed into $OUT/all.tgz.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 585 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack/rows
s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -2 /tmp/pack/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rows timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error" /tmp/pack/gpu-replay.txt | tail -8
tar -C /tmp -czf $OUT/all.tgz pack
for m in qwen3-next-80b-a3b qwen3.5-27b; do s=$(date +%s)
  timeout $(( $(left) > 100 ? 90 : $(left) - 10 )) /tmp/marconi replay --model $m --trace sharegpt --session-range 60:100 --requests 200 --mode sequential --layers 4 \
    --capacity 40GB --no-progress --out /tmp/pack/sharegpt-$m > /tmp/pack/sharegpt-$m.txt 2>&1
  echo "sharegpt $m rc=$? $(( $(date +%s)-s )) s"; grep -E "saved on validated|time model error|hits" /tmp/pack/sharegpt-$m.txt
done
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s); timeout $(( $(left) - 10 )) python3 benchmarks/attn_bench.py --json /tmp/pack/attn.json > /tmp/pack/attn.txt 2>&1
echo "attn_bench rc=$? $(( $(date +%s)-s )) s"; tail -22 /tmp/pack/attn.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
