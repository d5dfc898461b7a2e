# session 33, call C (after fd7a97f: the out-of-memory line says what the replay held): run(carry=[".s20"],
# kind="nvidia-h100-x1", timeout_s=190). marconi-7b at full depth on the Mooncake sample, continuous, 20 GB, store
# on the host (call B: out of memory at request 25 after 83 s, no warning): as it is, then with expandable segments.
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/packC
for alloc in "" "expandable_segments:True"; do s=$(date +%s); tag=${alloc:+-exp}
  PYTORCH_CUDA_ALLOC_CONF=$alloc timeout 88 /tmp/marconi replay --model marconi-7b --trace mooncake:sample --capacity 20GB --store host --requests 40 --no-progress --out /tmp/packC/m7b20host$tag > /tmp/packC/m7b20host$tag.txt 2>&1
  echo "marconi-7b 20GB host ${alloc:-default} rc=$? $(( $(date +%s)-s )) s"; cut -c1-700 /tmp/packC/m7b20host$tag.txt | grep -v "^\s*$" | tail -4
  tar -C /tmp -czf $OUT/packC.tgz packC
done; echo "total $(( $(date +%s)-s0 )) s"
