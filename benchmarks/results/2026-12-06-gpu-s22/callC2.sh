# session 22, call C2 (C again with z3-solver 4.15.4 in .fqla2, which TileLang links): run(carry=[".fqla2"], timeout_s=600): issue 48's gated-delta table with FlashQLA and FlashQLA
# exact in the run, the per-kernel profile at 32K (ours, FLA, FlashQLA: the gap per stage) and ours called plainly
# (--nometa); issue 42's SSD table (mamba_ssm, FLA); then the peers' replay file of make test-gpu
source benchmarks/results/2026-12-06-gpu-s21/env21.sh > /tmp/env.txt 2>&1; cat /tmp/env.txt; export LD_LIBRARY_PATH=/tmp/site/z3/lib:$LD_LIBRARY_PATH; python3 -c "import flash_qla, fla; print('flash_qla and fla import')" 2>&1 | tail -1
s0=$(date +%s); left() { local l=$(( 400 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack; cp /tmp/env.txt /tmp/pack/; git log --oneline -1 > /tmp/pack/head.txt 2>&1
s=$(date +%s)
timeout 200 python3 benchmarks/kernel_bench.py --rep 20 --host-calls 0 --nometa --seg auto --profile --json /tmp/pack/kernel.json > /tmp/pack/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# profile\|^#  " /tmp/pack/kernel-bench.txt | tail -16
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout 90 python3 benchmarks/ssd_bench.py --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" /tmp/pack/ssd.txt | tail -10
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(( $(left) - 80 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_peers_gpu.py > /tmp/pack/gpu-peers.txt 2>&1; echo "peers rc=$? $(( $(date +%s)-s )) s"; tail -4 /tmp/pack/gpu-peers.txt
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_gpu.py -k "fused or full_depth or batched_replay" > /tmp/pack/gpu-replay-final.txt 2>&1; echo "replay final rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/pack/gpu-replay-final.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
