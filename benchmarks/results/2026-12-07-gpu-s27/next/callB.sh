# for session 28, second call (the same warm H200): run(carry=[".s20"], needs_h200=true, timeout_s=600): the whole
# timing campaign after session 26's fixes (as session 27's callA.sh on the H100). Then on CPU:
#   python benchmarks/timing_fit.py OUT/campaign OUT_A/fulldepth --resume --out sim/data/h200-timing.json --force
# scored as session 27's score_s27.py scores the H100 file; the pinned test in tests/sim/test_cost_rules.py moves to
# these folders and to the overlap form.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack
PER_RUN_S=45 FIT4_REQUESTS=2 HELD_REQUESTS=120 CONT_REQUESTS=40 timeout 560 bash benchmarks/timing_campaign.sh /tmp/pack/campaign /tmp/marconi
echo "campaign rc=$? $(( $(date +%s)-s0 )) s"; cat /tmp/pack/campaign/runs.txt | tr '\n' ';'
tar -C /tmp -czf $OUT/all.tgz pack/campaign; echo "total $(( $(date +%s)-s0 )) s"
