# session 19: the time model's campaign (benchmarks/timing_campaign.sh) on an H100, to commit a calibrated
# sim/data/h100-timing.json (fitted here on CPU by benchmarks/timing_fit.py) and score the held-out presets
# and traces on a second device. run(kind=nvidia-h100-x1, carry=[".s16"], timeout_s=600); ~9 minutes.
source benchmarks/results/2026-12-06-gpu-s16/env16.sh
printf '#!/bin/sh\nexec python3 -c "import sys; sys.argv[0] = \\"marconi\\"; from sim.cli import main; main()" "$@"\n' > /tmp/marconi; chmod +x /tmp/marconi
/tmp/marconi --version 2>&1 | tail -1
PER_RUN_S=55 CONT_REQUESTS=40 timeout 545 bash benchmarks/timing_campaign.sh $OUT/campaign /tmp/marconi
echo "campaign rc=$?"; cat $OUT/campaign/runs.txt | tr '\n' ';'
