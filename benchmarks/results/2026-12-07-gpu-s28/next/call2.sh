# session 28, second call (the same warm H200): run(carry=[".s20"], timeout_s=600): the two qwen3.5-9b full-depth fit
# runs (the host term's second depth, as session 27's callD on the H100), then the whole timing campaign (as session
# 27's callA) in the time left, for the H200 file's refit in the overlap form.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 575 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack2/fulldepth
FIT1=synthetic:chat:sessions=24,turns=6,prompt_tokens=2000,user_tokens=30,output_tokens=150,prompts=4
FIT2=synthetic:chat:sessions=12,turns=4,prompt_tokens=6000,user_tokens=600,output_tokens=100,prompts=6
for i in 1 2; do eval T=\$FIT$i; s=$(date +%s)
  timeout 90 /tmp/marconi replay --model qwen3.5-9b --trace $T --mode sequential --capacity 40GB --no-progress --format json \
    --out /tmp/pack2/fulldepth/fit-fd$i-qwen3.5-9b > /tmp/pack2/fulldepth/fit-fd$i-qwen3.5-9b.json 2> /tmp/pack2/fulldepth/fit-fd$i-qwen3.5-9b.err
  echo "fit-fd$i rc=$? $(( $(date +%s)-s )) s"
done
tar -C /tmp -czf $OUT/all.tgz pack2
PER_RUN_S=45 FIT4_REQUESTS=2 HELD_REQUESTS=120 CONT_REQUESTS=40 timeout $(left) bash benchmarks/timing_campaign.sh /tmp/pack2/campaign /tmp/marconi
echo "campaign rc=$? $(( $(date +%s)-s0 )) s"; cat /tmp/pack2/campaign/runs.txt | tr '\n' ';'
tar -C /tmp -czf $OUT/all.tgz pack2; echo "total $(( $(date +%s)-s0 )) s"
