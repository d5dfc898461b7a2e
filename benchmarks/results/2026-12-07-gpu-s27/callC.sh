# session 27, call C: run(carry=[".fqla2"], timeout_s=400): the peers' replay tests with FlashQLA installed
source benchmarks/results/2026-12-06-gpu-s21/env21.sh; export LD_LIBRARY_PATH=/tmp/site/z3/lib:$LD_LIBRARY_PATH
s0=$(date +%s); python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_peers_gpu.py 2>&1 | tail -n 15; echo "peers rc=${PIPESTATUS[0]} $(( $(date +%s)-s0 )) s"
