# session 22, call AB (one call if only one comes): run(carry=[".s20"], timeout_s=600):
# 1. make test-gpu's kernel half (-n 8; kernels.norms' GPU tests among them)
# 2. the replay's fused GPU tests; 3. issue 41 item 4's run (qwen3-next-80b-a3b, full depth, batched @16, Mooncake
#    sample, cudnn attention) with torch's ops and with the fused ones back to back;
# 4. the rest of make test-gpu's replay half (but the peers' file) with the time left, the matrix's summaries kept
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 585 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack/rows; git log --oneline -1 > /tmp/pack/head.txt 2>&1
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in *H200*) TIMING=sim/data/h200-timing.json; N=150; CAP=40GB;; *) TIMING=sim/data/h100-timing.json; N=50; CAP=8GB;; esac
s=$(date +%s)
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -2 /tmp/pack/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay/test_replay_gpu.py -k "fused" > /tmp/pack/gpu-fused.txt 2>&1; echo "fused tests rc=$? $(( $(date +%s)-s )) s"; tail -2 /tmp/pack/gpu-fused.txt
tar -C /tmp -czf $OUT/all.tgz pack
for E in torch fused; do s=$(date +%s)
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 120 python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing $TIMING --capacity $CAP --requests $N --runs marconi/exact/sequential@16 --attention cudnn --elementwise $E --out /tmp/pack/rb80-$E > /tmp/pack/replay-bench-80b-$E.txt 2>&1; echo "replay_bench $E rc=$? $(( $(date +%s)-s )) s"; grep -E "TFLOP|peak|hits|wall" /tmp/pack/replay-bench-80b-$E.txt | grep -v "^{" | cut -c1-250 | tail -4
  tar -C /tmp -czf $OUT/all.tgz pack
done
s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rows timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay --ignore tests/sim/replay/test_replay_peers_gpu.py -k "not fused" > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error" /tmp/pack/gpu-replay.txt | tail -8
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
