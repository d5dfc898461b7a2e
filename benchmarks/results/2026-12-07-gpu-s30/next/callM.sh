# for a later session (any Hopper, after make test-gpu): run(carry=[".s20"], timeout_s=600). Tells the Mooncake rows'
# time-saved miss apart (session 30, saved_share.py): the order of a hit's two calls (--saved-timing alternate: suffix,
# reference, reference, suffix, each the mean of its two) against a per-token difference of the calls themselves.
# Two dense presets (reference / suffix per token 1.002-1.014 there) and one MoE preset (1.000: the control), the
# matrix's settings (4 layers, 60 requests of the Mooncake sample, fcfs, 40 GB), once and alternated. Score with
# saved_share.py pointed at the rows (ROWS), and table_s30.py's columns.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/packM
for m in qwen3.5-9b qwen3.5-27b qwen3-next-80b-a3b; do for t in once alternate; do s=$(date +%s)
  timeout 90 /tmp/marconi replay --model $m --trace mooncake:sample --capacity 40GB --layers 4 --requests 60 \
    --scheduler fcfs --saved-timing $t --no-progress --out /tmp/packM/$m-$t > /tmp/packM/$m-$t.txt 2>&1
  echo "$m $t rc=$? $(( $(date +%s)-s )) s"; grep -E "saved on|time model" /tmp/packM/$m-$t.txt
  tar -C /tmp -czf $OUT/packM.tgz packM
done; done; echo "total $(( $(date +%s)-s0 )) s"
