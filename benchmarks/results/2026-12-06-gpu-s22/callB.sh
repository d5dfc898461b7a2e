# session 22, call B: run(carry=[".s20"], timeout_s=600): --elementwise fused (kernels.norms) on a GPU:
# its kernel tests at the presets' widths, the replay's fused GPU tests, then issue 41 item 4's run
# (qwen3-next-80b-a3b at full depth, batched @16, Mooncake sample, cudnn attention) with torch's ops
# and with the fused ones back to back
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 585 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack; git log --oneline -1 > /tmp/pack/head.txt 2>&1
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in *H200*) TIMING=sim/data/h200-timing.json; N=150; CAP=40GB;; *) TIMING=sim/data/h100-timing.json; N=50; CAP=8GB;; esac
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/kernels/test_norms.py tests/sim/replay/test_replay_gpu.py -k "norms or fused" > /tmp/pack/gpu-fused.txt 2>&1; echo "fused tests rc=$? $(( $(date +%s)-s )) s"; tail -4 /tmp/pack/gpu-fused.txt
tar -C /tmp -czf $OUT/all.tgz pack
for E in torch fused; do s=$(date +%s)
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(( $(left) / 2 + 20 )) python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing $TIMING --capacity $CAP --requests $N --runs marconi/exact/sequential@16 --attention cudnn --elementwise $E --out /tmp/pack/rb80-$E > /tmp/pack/replay-bench-80b-$E.txt 2>&1; echo "replay_bench $E rc=$? $(( $(date +%s)-s )) s"; grep -v "^\s" /tmp/pack/replay-bench-80b-$E.txt | grep -v "^{" | cut -c1-300 | tail -6
  tar -C /tmp -czf $OUT/all.tgz pack
done; echo "total $(( $(date +%s)-s0 )) s"
