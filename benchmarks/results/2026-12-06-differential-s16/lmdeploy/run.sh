#!/bin/bash
# Every row of README.md: bash run.sh LMDEPLOY_CHECKOUT DEPS_DIRS (from the repository root;
# DEPS_DIRS: pip --target folders joined by ':'). Each run writes NAME.txt (the summary) and
# NAME.csv (per-request hits).
set -u
LMD=$1; DEPS=$2; OUT=$(dirname "$0")
run() {
  name=$1; shift
  rm -f "$OUT/$name.csv"  # the script opens --out with "x" (it never overwrites)
  PYTHONPATH=benchmarks:. python benchmarks/differential_lmdeploy.py --lmdeploy "$LMD" --deps "$DEPS" \
    "$@" --out "$OUT/$name.csv" > "$OUT/$name.txt" 2> "$OUT/$name.err" || echo "$name: exit $?"
  rm -f "$OUT/$name.err"
}
# ample memory (nothing evicted)
run sharegpt-20 --sessions 20
run sharegpt-100 --sessions 100
run sharegpt-40-block16 --sessions 40 --block-size 16
for c in 0 8192 2048; do
  run mooncake-symbols-chunk$c --trace mooncake:sample --prefill-chunk $c
  run mooncake-tokens-chunk$c --trace mooncake:sample --hash-block-tokens --prefill-chunk $c
done
run mooncake-tokens-chunk1000 --trace mooncake:sample --hash-block-tokens --prefill-chunk 1000
run mooncake-symbols-block512-chunk8192 --trace mooncake:sample --block-size 512 --prefill-chunk 8192
# state pressure: KV unbounded, --state-pool checkpoint rows
for n in 3 10 30; do run sharegpt-100-statepool$n --sessions 100 --capacity inf --state-pool $n; done
run mooncake-symbols-chunk2048-statepool1000 --trace mooncake:sample --prefill-chunk 2048 --capacity inf --state-pool 1000
run mooncake-tokens-chunk2048-statepool1000 --trace mooncake:sample --hash-block-tokens --prefill-chunk 2048 --capacity inf --state-pool 1000
run mooncake-symbols-chunk8192-statepool300 --trace mooncake:sample --prefill-chunk 8192 --capacity inf --state-pool 300
run mooncake-tokens-chunk8192-statepool300 --trace mooncake:sample --hash-block-tokens --prefill-chunk 8192 --capacity inf --state-pool 300
# KV pressure: a bounded KV pool, a state pool large enough to hold every checkpoint of the run
run sharegpt-20-16GB-statepool300 --sessions 20 --capacity 16GB --state-pool 300
run sharegpt-20-16GB-statepool300-wallclock --sessions 20 --capacity 16GB --state-pool 300 --engine-clock wall
run sharegpt-100-56GB-statepool1000 --sessions 100 --capacity 56GB --state-pool 1000
run mooncake-tokens-chunk8192-100GB-statepool900 --trace mooncake:sample --hash-block-tokens --prefill-chunk 8192 --capacity 100GB --state-pool 900
run mooncake-symbols-chunk8192-100GB-statepool900 --trace mooncake:sample --prefill-chunk 8192 --capacity 100GB --state-pool 900
