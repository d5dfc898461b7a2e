# issue 41, session 17: the held-out time-model runs after the re-time of outrun calls, every
# per-request / per-step table kept under $OUT (carry .s16, as ../2026-12-06-gpu-s16/h200.sh;
# asks for an H200: the committed timing is the H200's, another GPU's errors are "not compared").
# About 3-4 minutes: each step's timeout is what is left of 225 s.
source benchmarks/results/2026-12-06-gpu-s16/env16.sh
s0=$(date +%s)
left() { local l=$(( 225 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
M="python3 benchmarks/replay_matrix.py --out $OUT/matrix"
# 1. qwen3-next-80b-a3b on the Mooncake sample, fcfs and continuous (4 layers, 60 requests, 40GB)
s=$(date +%s)
timeout $(left) $M --models qwen3-next-80b-a3b --traces mooncake --schedulers fcfs,continuous --per-run-s 75 > $OUT/matrix-80b-mooncake.txt 2>&1
echo "80b mooncake rc=$? $(( $(date +%s)-s )) s"; tail -6 $OUT/matrix-80b-mooncake.txt
# 2. the agent trace (synthetic:agent) on both held-out presets, fcfs
s=$(date +%s)
timeout $(left) $M --models qwen3.5-27b,qwen3-next-80b-a3b --traces agent --schedulers fcfs --per-run-s 50 > $OUT/matrix-agent.txt 2>&1
echo "agent rc=$? $(( $(date +%s)-s )) s"; tail -5 $OUT/matrix-agent.txt
# 3. ShareGPT sessions 60:100 (never in a fit) on qwen3.5-27b, fcfs
s=$(date +%s)
timeout $(left) $M --models qwen3.5-27b --traces sharegpt --schedulers fcfs --per-run-s 40 > $OUT/matrix-sharegpt.txt 2>&1
echo "sharegpt rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/matrix-sharegpt.txt
# 4. every run that came back re-priced per request, with the committed timing and with the
#    candidate resume term (CPU work; the parquet files stay under $OUT/matrix/<run>/)
ls -d $OUT/matrix/*/ > /dev/null 2>&1 && {
  python3 benchmarks/reprice_requests.py $OUT/matrix/*/ --csv $OUT/reprice.csv > $OUT/reprice.txt 2>&1
  python3 benchmarks/reprice_requests.py $OUT/matrix/*/ --quiet \
    --timing benchmarks/results/2026-12-06-time41/h200-timing-resume.json > $OUT/reprice-resume.txt 2>&1
  grep "timed prefills" $OUT/reprice.txt $OUT/reprice-resume.txt | sed "s#$OUT/##"
}
# 5. the re-time's GPU test (a stalled queued call outran its sleep; timed again, back to back)
[ $(left) -gt 20 ] && { timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/sim/replay/test_replay_gpu.py \
  -k outran > $OUT/retime-gpu-test.txt 2>&1; echo "retime gpu test rc=$?"; tail -1 $OUT/retime-gpu-test.txt; }
# 6. if time is left: what waited inside the 80b's timed calls (sync sites, allocations, GC), first 30 requests
if [ $(left) -gt 40 ]; then
  timeout $(left) python3 benchmarks/replay_stall_probe.py --out $OUT/stalls-80b.csv -- --trace mooncake:sample \
    --model qwen3-next-80b-a3b --layers 4 --requests 30 --capacity 40GB --mode des --scheduler fcfs --no-progress \
    > $OUT/stalls-80b.txt 2>&1; echo "stall probe rc=$?"; tail -25 $OUT/stalls-80b.txt
fi
echo "total $(( $(date +%s)-s0 )) s"
