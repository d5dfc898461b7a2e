# session 27, call D: run(carry=[".s20"], timeout_s=300): the time model's full-depth fit runs on this GPU (qwen3.5-9b,
# 32 layers, the campaign's FIT1 / FIT2 traces, as the H200 file's 2026-12-02 fit runs), then issue 41 item 4's
# qwen3-next-80b-a3b at full depth over the Mooncake sample's first 50 requests (57.6 GiB peak on the H200).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
FIT1=synthetic:chat:sessions=24,turns=6,prompt_tokens=2000,user_tokens=30,output_tokens=150,prompts=4
FIT2=synthetic:chat:sessions=12,turns=4,prompt_tokens=6000,user_tokens=600,output_tokens=100,prompts=6
mkdir -p /tmp/pack/fulldepth; s0=$(date +%s)
for i in 1 2; do eval T=\$FIT$i; s=$(date +%s)
  timeout 100 /tmp/marconi replay --model qwen3.5-9b --trace $T --mode sequential --capacity 40GB --no-progress --format json \
    --out /tmp/pack/fulldepth/fit-fd$i-qwen3.5-9b > /tmp/pack/fulldepth/fit-fd$i-qwen3.5-9b.json 2> /tmp/pack/fulldepth/fit-fd$i-qwen3.5-9b.err
  echo "fit-fd$i rc=$? $(( $(date +%s)-s )) s"; tail -2 /tmp/pack/fulldepth/fit-fd$i-qwen3.5-9b.err
done
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(( 285 - ($(date +%s) - s0) )) python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out /tmp/pack/rb80 > /tmp/pack/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" /tmp/pack/replay-bench-80b.txt | grep -v "^{" | tail -8
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
