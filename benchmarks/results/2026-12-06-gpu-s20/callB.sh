# session 20, call B (at once after A, same machine): run(carry=[".s20"], timeout_s=600): the time model's
# campaign (benchmarks/timing_campaign.sh: fit set and held-out runs) packed as $OUT/campaign.tgz. Then on the CPU:
# tar -xzf campaign.tgz; python benchmarks/timing_fit.py campaign --resume --out sim/data/<gpu>-timing.json
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
PER_RUN_S=55 CONT_REQUESTS=40 timeout 530 bash benchmarks/timing_campaign.sh /tmp/campaign /tmp/marconi
echo "campaign rc=$?"; tr '\n' ';' < /tmp/campaign/runs.txt
tar -C /tmp -czf $OUT/campaign.tgz campaign; ls -la $OUT
