#!/usr/bin/env bash
# Replay measurements that span the shapes of every Qwen preset (the time model's fit set) and
# held-out runs on presets (qwen3-next-80b-a3b, qwen3.5-27b) and traces the fit does not see (Mooncake, an agent trace, ShareGPT
# sessions 60:100, continuous batching). Run on a GPU:
#   bash benchmarks/timing_campaign.sh OUTDIR [MARCONI]     (MARCONI: how to call the CLI)
# Each run writes OUTDIR/<name>/{summary.json,requests.parquet[,steps.parquet]} and a log line;
# `python benchmarks/timing_fit.py OUTDIR` fits and scores the time model on them.
# EXTRA: replay options for every run (a fit for the opt-in paths: EXTRA="--attention cudnn
# --elementwise fused"); FIT4_REQUESTS > 0 adds fit runs of prompts of ~80K tokens (the Mooncake
# sample's longest is 87,169; the 2026-12-04 fit reached 33,905); HELD=0 leaves the held-out runs out
# (a fit split over several device calls: FIT_MODELS one or two presets a call). The Mooncake runs time
# each validated hit's two prefills alternated (MOONCAKE_SAVED, default alternate: suffix, reference,
# reference, suffix), since a 512-token block saves less than a long call's run-to-run drift.
set -u
OUT=${1:?usage: timing_campaign.sh OUTDIR [MARCONI]}
MARCONI=${2:-marconi}
LAYERS=${LAYERS:-4}
PER_RUN_S=${PER_RUN_S:-150}
mkdir -p "$OUT"
FIT1=synthetic:chat:sessions=24,turns=6,prompt_tokens=2000,user_tokens=30,output_tokens=150,prompts=4
FIT2=synthetic:chat:sessions=12,turns=4,prompt_tokens=6000,user_tokens=600,output_tokens=100,prompts=6
FIT3=synthetic:chat:sessions=6,turns=3,prompt_tokens=24000,user_tokens=3000,output_tokens=100,prompts=3
FIT4=synthetic:chat:sessions=3,turns=2,prompt_tokens=80000,user_tokens=4000,output_tokens=50,prompts=3
EXTRA=${EXTRA:-}
MOONCAKE_SAVED=${MOONCAKE_SAVED:-alternate}
run() {  # name, then replay options
  local name=$1; shift
  local t0=$SECONDS
  timeout "$PER_RUN_S" $MARCONI replay --layers "$LAYERS" --capacity 40GB --no-progress --format json \
    --out "$OUT/$name" $EXTRA "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$? $((SECONDS - t0))s" | tee -a "$OUT/runs.txt"
}
FIT_MODELS=${FIT_MODELS:-"qwen3.5-9b qwen3.5-35b-a3b qwen3.5-122b-a10b qwen3.5-397b-a17b"}
HELD_MODELS=${HELD_MODELS:-"qwen3-next-80b-a3b qwen3.5-27b"}
for m in $FIT_MODELS; do
  run "fit1-$m" --model "$m" --trace "$FIT1" --mode sequential --requests "${FIT1_REQUESTS:-60}"
  run "fit2-$m" --model "$m" --trace "$FIT2" --mode sequential --requests "${FIT2_REQUESTS:-32}"
  run "fit3-$m" --model "$m" --trace "$FIT3" --mode sequential --requests "${FIT3_REQUESTS:-18}"
  if [ "${FIT4_REQUESTS:-0}" -gt 0 ]; then
    run "fit4-$m" --model "$m" --trace "$FIT4" --mode sequential --requests "$FIT4_REQUESTS"
  fi
done
[ "${HELD:-1}" = 0 ] && exit 0
for m in $HELD_MODELS; do
  run "mooncake-$m" --model "$m" --trace mooncake:sample --requests "${HELD_REQUESTS:-150}" --scheduler fcfs \
    --saved-timing "$MOONCAKE_SAVED"
  run "agent-$m" --model "$m" --trace synthetic:agent --requests "${HELD_REQUESTS:-150}" --mode sequential
done
run "cont-mooncake-qwen3.5-27b" --model qwen3.5-27b --trace mooncake:sample --requests "${CONT_REQUESTS:-60}" --scheduler continuous \
  --saved-timing "$MOONCAKE_SAVED"
run "cont-agent-qwen3-next-80b-a3b" --model qwen3-next-80b-a3b --trace synthetic:agent --requests "${CONT_REQUESTS:-60}" --scheduler continuous
for m in $HELD_MODELS; do
  run "sharegpt-$m" --model "$m" --trace sharegpt --session-range 60:100 --requests 200 --mode sequential
done
