#!/bin/bash
# Back-to-back per-test CPU of one test file, before (a worktree at the session's start, BEFORE)
# and after (this tree): ab.sh TAG SIDE FILE [pytest args]; SIDE = before | after | after39 |
# before39 (the 39 sides: Triton 3.9 first on PYTHONPATH, as make test's second pass).
# Writes raw/ab_TAG_SIDE.jsonl ([test id, CPU s, wall s], cputime_plugin.py in this folder).
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../../.." && pwd)
tag=$1 side=$2; shift 2
case $side in before*) root=${BEFORE:-/tmp/s11/before} ;; *) root=$main ;; esac
pp=$root:$here  # the tree's own sim, kernels first (the editable install points at this tree)
case $side in *39*) pp=$main/.venv/triton-3.9.0:$root:$here ;; esac
out=$here/ab_${tag}_${side}.jsonl
rm -f "$out"
cd "$root" && TRITON_INTERPRET=1 CPUTIME_T1=1 CPUTIME_OUT=$out PYTHONPATH=$pp \
  "$main/.venv/bin/python" -m pytest -q -p no:cacheprovider -n 0 -p cputime_plugin "$@" 2>&1 | tail -2
python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sys.argv[1].split('/')[-1], 'tests', len(r), 'CPU s %.1f' % sum(x[1] for x in r), 'wall s %.1f' % sum(x[2] for x in r))" "$out"
