# the next session's time-model call on whatever GPU comes (an H100 so far): run(carry=[".s16"], timeout_s=600).
# benchmarks/timing_campaign.sh's fit set and held-out runs, every run folder packed into ONE archive
# ($OUT/campaign.tgz: a call returns a bounded number of files; session 19 lost its campaign that way).
# Then on the CPU: tar -xzf campaign.tgz; python benchmarks/timing_fit.py campaign --out sim/data/<gpu>-timing.json
# (the GPU named as sim.gpus.catalogue_name names it) and the held-out errors it prints. ~9.5 minutes.
source benchmarks/results/2026-12-06-gpu-s16/env16.sh
printf '#!/bin/sh\nexec python3 -c "import sys; sys.argv[0] = \\"marconi\\"; from sim.cli import main; main()" "$@"\n' > /tmp/marconi; chmod +x /tmp/marconi
PER_RUN_S=55 CONT_REQUESTS=40 timeout 530 bash benchmarks/timing_campaign.sh /tmp/campaign /tmp/marconi
echo "campaign rc=$?"; tr '\n' ';' < /tmp/campaign/runs.txt
tar -C /tmp -czf $OUT/campaign.tgz campaign; ls -la $OUT
