#!/usr/bin/env bash
# Every row of README.md: the differentials on mooncake:sample, block spelling and token spelling
# (--hash-block-tokens). Run from benchmarks/:
#   bash results/2026-12-05-differential-mooncake-tokens/run.sh [vllm|sglang|pools]   (vllm and sglang when left out)
# ENGINES: the folder holding vllm-0.34.0/ (the unzipped wheel), sglang-0.5.23/ and deps/ (each
# script's docstring says how to make them). The CSVs are written beside this file.
set -u
ENGINES=${ENGINES:-/work/engines}
PY=${PY:-../.venv/bin/python}
R=results/2026-12-05-differential-mooncake-tokens
VLLM="$PY differential_vllm.py --vllm $ENGINES/vllm-0.34.0 --trace mooncake:sample --policies vllm"
SGL="$PY differential_sglang.py --sglang $ENGINES/sglang-0.5.23 --deps $ENGINES/deps --trace mooncake:sample"
run() {  # name, command...
  local name=$1; shift
  echo "== $name: $*" | sed "s#$ENGINES#ENGINES#g"
  "$@" --out "$R/$name.csv" 2>&1 | grep -v -e UserWarning -e warnings.warn
}
vllm() {
  for sp in blocks tokens; do
    flag=$([ $sp = tokens ] && echo --hash-block-tokens || true)
    for ret in 0 2048 -1; do
      run vllm-b1024-r$ret-ample-$sp $VLLM $flag --block-size 1024 --retention $ret
      run vllm-b1024-r$ret-100GB-$sp $VLLM $flag --block-size 1024 --retention $ret --capacity 100GB
    done
    run vllm-b1024-continuous-$sp $VLLM $flag --block-size 1024 --scheduler continuous
  done
  # the preset's own block (528 tokens), which 512-token symbols cannot hold: token spelling only
  for ret in 0 1056 -1; do
    run vllm-b528-r$ret-ample-tokens $VLLM --hash-block-tokens --retention $ret
    run vllm-b528-r$ret-100GB-tokens $VLLM --hash-block-tokens --retention $ret --capacity 100GB
  done
  run vllm-b528-continuous-tokens $VLLM --hash-block-tokens --scheduler continuous
}
sglang() {
  for sp in blocks tokens; do
    flag=$([ $sp = tokens ] && echo --hash-block-tokens || true)
    for mem in ample 40GB; do
      run sglang-$mem-$sp $SGL $flag --memory $mem
    done
    run sglang-continuous-$sp $SGL $flag --scheduler continuous
    run sglang-fcfs-$sp $SGL $flag --scheduler fcfs
  done
}
# with eviction under continuous batching (the engine gets the simulator's pools)
pools() {
  for sp in blocks tokens; do
    flag=$([ $sp = tokens ] && echo --hash-block-tokens || true)
    run sglang-continuous-40GB-pools-$sp $SGL $flag --scheduler continuous --memory 40GB --pools
    run sglang-continuous-6GB-pools-no_buffer-$sp $SGL $flag --scheduler continuous --memory 6GB --pools --presets sglang/no_buffer
  done
}
${1:-vllm}
[ -n "${1:-}" ] || sglang
