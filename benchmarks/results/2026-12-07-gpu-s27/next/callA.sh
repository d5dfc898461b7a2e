# for session 28, first call: run(carry=[".s20"], needs_h200=true, timeout_s=600). needs_h200 is what the work needs:
# qwen3-next-80b-a3b at full depth on the Mooncake sample (issue 41 item 4) ran out of an H100's 80 GB (session 27,
# callD); on the H200 (141 GB) it peaked at 57.6 GiB (session 20). Then, on the same warm H200, the whole timing
# campaign (callB.sh) for the H200 file's refit in the overlap form, and make test-gpu with the matrix rows (callC.sh).
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); mkdir -p /tmp/pack; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1; git log --oneline -1 > /tmp/pack/head.txt 2>&1
timeout 300 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --capacity 40GB --requests 50 --runs marconi/exact/sequential@16 --out /tmp/pack/rb80 > /tmp/pack/replay-bench-80b.txt 2>&1; echo "replay_bench rc=$? $(( $(date +%s)-s0 )) s"; grep -v "^\s" /tmp/pack/replay-bench-80b.txt | grep -v "^{" | tail -8
tar -C /tmp -czf $OUT/all.tgz pack; s=$(date +%s)
FIT1=synthetic:chat:sessions=24,turns=6,prompt_tokens=2000,user_tokens=30,output_tokens=150,prompts=4
FIT2=synthetic:chat:sessions=12,turns=4,prompt_tokens=6000,user_tokens=600,output_tokens=100,prompts=6
mkdir -p /tmp/pack/fulldepth
for i in 1 2; do eval T=\$FIT$i; s=$(date +%s)
  timeout 100 /tmp/marconi replay --model qwen3.5-9b --trace $T --mode sequential --capacity 40GB --no-progress --format json \
    --out /tmp/pack/fulldepth/fit-fd$i-qwen3.5-9b > /tmp/pack/fulldepth/fit-fd$i-qwen3.5-9b.json 2> /tmp/pack/fulldepth/fit-fd$i-qwen3.5-9b.err
  echo "fit-fd$i rc=$? $(( $(date +%s)-s )) s"
done
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
