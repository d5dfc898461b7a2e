#!/bin/bash
# Per-test CPU ranking, one directory / file at a time, -n 0 (session 11, before any change).
# usage: rank.sh OUT.jsonl PATH...
cd "$(dirname "$0")/../../../.." || exit 1
out=$(realpath -m "$1"); shift  # (relative to the repository root)
for p in "$@"; do
  echo "== $p $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >&2
  TRITON_INTERPRET=1 CPUTIME_T1=1 CPUTIME_OUT="$out" \
    PYTHONPATH=benchmarks/results/2026-12-05-test-speed-s11/raw \
    .venv/bin/python -m pytest -q -p no:cacheprovider -n 0 -p cputime_plugin "$p" 2>&1 | tail -3 >&2
done
