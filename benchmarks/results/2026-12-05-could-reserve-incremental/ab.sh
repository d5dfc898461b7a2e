#!/bin/bash
# ab2.sh N args... : alternate base / new copies (HEAD vs HEAD + this change), N rounds
N=$1; shift
for i in $(seq $N); do
  for v in base new; do
    (cd /tmp/h7/$v && PYTHONPATH=/tmp/h7/$v /work/main/.venv/bin/python /tmp/h7/timeone.py "$@")
    (cd /tmp/h7/$v && PYTHONPATH=/tmp/h7/$v /work/main/.venv/bin/python /tmp/h7/bench.py 1 "$@" 2>/dev/null | sed "s|^|{\"v\":\"$v\"} |")
  done
done
