# the next session's first call on whatever GPU comes: run(carry=[".s20"], timeout_s=600).
# 1. make test-gpu's replay half at the final code (this session changed the replay's reference timing after the
#    suite last ran, at d12fec1);
# 2. the two ShareGPT held-out runs again (4 layers, sessions 60:100, 200 requests, sequential), now with outrun
#    references timed again: their "saved on validated hits" line against the campaign's -39 / -16 %
#    (modelled against measured; +6.4 / +8.4 % over the pairs where neither call was host-bound).
# 3. benchmarks/attn_bench.py (issue 41 item 4: is cuDNN faster at head dim 256, and does bucketing keep its plans few?).
# Everything packed into $OUT/all.tgz.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
mkdir -p /tmp/pack; s0=$(date +%s)
s=$(date +%s)
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -2 /tmp/pack/gpu-replay.txt
for m in qwen3-next-80b-a3b qwen3.5-27b; do s=$(date +%s)
  timeout 100 /tmp/marconi replay --model $m --trace sharegpt --session-range 60:100 --requests 200 --mode sequential --layers 4 \
    --capacity 40GB --no-progress --out /tmp/pack/sharegpt-$m > /tmp/pack/sharegpt-$m.txt 2>&1
  echo "sharegpt $m rc=$? $(( $(date +%s)-s )) s"; grep -E "saved on validated|time model error|hits" /tmp/pack/sharegpt-$m.txt
done
# 3. issue 41 item 4: the replay's attention at head dim 256 against SDPA's cuDNN kernel (plain and length-bucketed)
s=$(date +%s); timeout 120 python3 benchmarks/attn_bench.py --json /tmp/pack/attn.json > /tmp/pack/attn.txt 2>&1
echo "attn_bench rc=$? $(( $(date +%s)-s )) s"; tail -26 /tmp/pack/attn.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
