#!/bin/bash
# before (worktree at f9fd454, the tests before this session's speed changes) and after (the
# working tree), back to back, per file; one xdist worker (-n 1: torch on one thread in the
# worker, OMP_NUM_THREADS=1 for test_replay_cli's subprocesses, as under `make test`).
# Usage: ab.sh BEFORE_DIR AFTER_DIR FILE... ; prints "file tree CPU-user CPU-sys wall result"
B=$1; A=$2; shift 2
for f in "$@"; do
  for d in "$B" "$A"; do
    cd "$d" || exit 1
    tag=$([ "$d" = "$B" ] && echo before || echo after)
    r=$( { TRITON_INTERPRET=1 /usr/bin/time -f "TIME %U %S %e" /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider -n 1 $f 2>&1; } | grep -E "TIME|passed|failed" | tr '\n' ' ')
    echo "$f $tag $(uptime | sed 's/.*average: //') | $r"
  done
done
