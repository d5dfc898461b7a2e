# the session's last call (carry .s16; asks for an H200: step 2 plans ~119 GB on the GPU)
source benchmarks/results/2026-12-06-gpu-s16/env16.sh
# 1. issue 42: the SSD state loop with dt / gamma from a parallel kernel ahead of it (PREP=1), compiled here, timed
s=$(date +%s)
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_ssd.py -k "variants or half" > $OUT/ssd-variant-tests.txt 2>&1; echo "tests rc=$? $(( $(date +%s)-s )) s"; tail -1 $OUT/ssd-variant-tests.txt
s=$(date +%s)
timeout 90 python3 benchmarks/ssd_bench.py --no-fla --lengths 8192,32768 --variant "prep:KERNELS_CONFIG_SSD_STATE=PREP=1;prep64:KERNELS_CONFIG_SSD_STATE=PREP=1,BP=64,num_stages=2" --json $OUT/ssdprep.json > $OUT/ssdprep.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^#" $OUT/ssdprep.txt | tail -34
# 2. issue 41 item 4: qwen3-next-80b-a3b at full depth on the Mooncake sample, batched, every hit validated
s=$(date +%s)
timeout 150 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing sim/data/h200-timing.json --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out $OUT/rb80 > $OUT/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" $OUT/replay-bench-80b.txt | tail -22
# 3. issue 41: the matrix on the two held-out presets, Mooncake, both schedulers, time error with every prefill
s=$(date +%s)
timeout 190 python3 benchmarks/replay_matrix.py --out $OUT/matrix --models qwen3-next-80b-a3b,qwen3.5-27b --traces mooncake --schedulers fcfs,continuous --per-run-s 45 > $OUT/matrix.txt 2>&1; echo "matrix rc=$? $(( $(date +%s)-s )) s"; tail -8 $OUT/matrix.txt
