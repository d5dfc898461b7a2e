# session 28, second call (the same warm H200): run(carry=[".s20"], timeout_s=600): the whole timing campaign
# (as session 27's callA on the H100), for the H200 file's refit in the overlap form.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack2
PER_RUN_S=45 FIT4_REQUESTS=2 HELD_REQUESTS=120 CONT_REQUESTS=40 timeout 560 bash benchmarks/timing_campaign.sh /tmp/pack2/campaign /tmp/marconi
echo "campaign rc=$? $(( $(date +%s)-s0 )) s"; cat /tmp/pack2/campaign/runs.txt | tr '\n' ';'
tar -C /tmp -czf $OUT/all.tgz pack2/campaign; echo "total $(( $(date +%s)-s0 )) s"
