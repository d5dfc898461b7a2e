# session 23, call C (H200 warm): run(carry=[".fqla2"]): issue 48's table with FlashQLA and FLA, the per-kernel profile;
# issue 42's SSD table (mamba_ssm and FLA columns); the peers' file's FlashQLA tests
source benchmarks/results/2026-12-06-gpu-s21/env21.sh > /tmp/env.txt 2>&1; cat /tmp/env.txt; export LD_LIBRARY_PATH=/tmp/site/z3/lib:$LD_LIBRARY_PATH; python3 -c "import flash_qla, fla; print('flash_qla and fla import')" 2>&1 | tail -n 1
s0=$(date +%s); left() { local l=$(( 470 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack; cp /tmp/env.txt /tmp/pack/; git log --oneline -1 > /tmp/pack/head.txt 2>&1
s=$(date +%s)
timeout 200 python3 benchmarks/kernel_bench.py --rep 20 --host-calls 0 --nometa --seg auto --profile --json /tmp/pack/kernel.json > /tmp/pack/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# profile\|^#  " /tmp/pack/kernel-bench.txt | tail -n 16
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout 170 python3 benchmarks/ssd_bench.py --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" /tmp/pack/ssd.txt | grep -E "states |nostates|mamba256|fla" | tail -n 24
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_peers_gpu.py -k flashqla > /tmp/pack/gpu-peers.txt 2>&1; echo "peers flashqla rc=$? $(( $(date +%s)-s )) s"; tail -n 4 /tmp/pack/gpu-peers.txt
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
