# session 28, third call (the same warm H200): run(carry=[".s20"], timeout_s=600): make test-gpu's replay half but the
# FlashQLA peers, the preset matrix's rows kept (MARCONI_GPU_ROWS); then the two qwen3.5-9b full-depth fit runs (the
# host term's second depth) as session 27's callD on the H100.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 580 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack3/rows /tmp/pack3/fulldepth; git log --oneline -1 > /tmp/pack3/head.txt 2>&1
s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack3/rows timeout 360 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack3/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; tail -25 /tmp/pack3/gpu-replay.txt
tar -C /tmp -czf $OUT/all.tgz pack3
FIT1=synthetic:chat:sessions=24,turns=6,prompt_tokens=2000,user_tokens=30,output_tokens=150,prompts=4
FIT2=synthetic:chat:sessions=12,turns=4,prompt_tokens=6000,user_tokens=600,output_tokens=100,prompts=6
for i in 1 2; do eval T=\$FIT$i; s=$(date +%s)
  timeout $(( $(left) < 100 ? $(left) : 100 )) /tmp/marconi replay --model qwen3.5-9b --trace $T --mode sequential --capacity 40GB --no-progress --format json \
    --out /tmp/pack3/fulldepth/fit-fd$i-qwen3.5-9b > /tmp/pack3/fulldepth/fit-fd$i-qwen3.5-9b.json 2> /tmp/pack3/fulldepth/fit-fd$i-qwen3.5-9b.err
  echo "fit-fd$i rc=$? $(( $(date +%s)-s )) s"
done
tar -C /tmp -czf $OUT/all.tgz pack3; echo "total $(( $(date +%s)-s0 )) s"
