# for session 27: run(carry=[".s20"], timeout_s=600) on the H200 (then again on an H100 with its own OUT name): the time
# model's campaign measured after session 26's two fixes of the from-scratch times (the checks out of the
# references' time; the conv from zeros on the state's binary), half of the fit set; callB.sh the other half and the
# held-out runs. Then on CPU: python benchmarks/timing_fit.py DIR_A DIR_B --out sim/data/h200-timing.json --force
# (no --resume: the resumed-call term is gone), scored against the committed file on the held-out runs.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
FIT_MODELS="qwen3.5-9b qwen3.5-35b-a3b" HELD=0 PER_RUN_S=70 FIT4_REQUESTS=4 timeout 570 bash benchmarks/timing_campaign.sh $OUT/campaignA /tmp/marconi
echo "campaign rc=$?"; cat $OUT/campaignA/runs.txt | tr '\n' ';'
