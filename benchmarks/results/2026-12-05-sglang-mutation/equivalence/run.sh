#!/bin/bash
# usage: run.sh TAG  (runs the workloads with PYTHONPATH=/tmp/sglmut, writes /tmp/eqchk/TAG/*.txt)
T=$1; O=/tmp/eqchk/$T; rm -rf $O; mkdir -p $O
P=sglang-0.5.9-extra-buffer,sglang-0.5.9-no-buffer,sglang
cd /tmp
run() { name=$1; shift; PYTHONPATH=/tmp/sglmut nice /work/main/.venv/bin/marconi run --policy $P --model qwen3.5-27b --out $O/$name "$@" >/dev/null 2>$O/$name.err; }
run mc6 --trace mooncake:sample --capacity 6GB
run mc20 --trace mooncake:sample --capacity 20GB
run sg1 --trace sharegpt --sessions 100 --capacity 1GB
run sg3 --trace sharegpt --sessions 100 --capacity 3GB
run sgc --trace sharegpt --sessions 100 --capacity 2GB --scheduler continuous --sessions-per-second 5
run sgpool --trace sharegpt --sessions 100 --capacity 4GB --state-pool 8
run sgseq --trace sharegpt --sessions 100 --capacity 1GB --mode sequential
