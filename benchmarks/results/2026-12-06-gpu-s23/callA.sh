# session 23, call A: run(carry=[".s20"], timeout_s=600): make test-gpu at the final code of session 22 (kernel half
# with -n 8, replay half whole, the preset matrix's summaries kept); then, with the time left, issue 42's SSD table and
# issue 41 item 4's run with the fused ops (on an H200 these are the tables the issues ask for)
source benchmarks/results/2026-12-06-gpu-s20/env20.sh
s0=$(date +%s); left() { local l=$(( 585 - ($(date +%s) - s0) )); echo $(( l > 5 ? l : 5 )); }
mkdir -p /tmp/pack/rows; git log --oneline -1 > /tmp/pack/head.txt 2>&1; nvidia-smi > /tmp/pack/nvidia-smi.txt 2>&1
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in *H200*) TIMING=sim/data/h200-timing.json; N=150; CAP=40GB;; *) TIMING=sim/data/h100-timing.json; N=50; CAP=8GB;; esac
s=$(date +%s)
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rs tests/kernels > /tmp/pack/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -n 2 /tmp/pack/gpu-kernels.txt
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
MARCONI_GPU_ROWS=/tmp/pack/rows timeout 290 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/sim/replay > /tmp/pack/gpu-replay.txt 2>&1; echo "replay rc=$? $(( $(date +%s)-s )) s"; grep -E "passed|failed|FAILED|Error|SKIP" /tmp/pack/gpu-replay.txt | tail -n 12
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
timeout $(( $(left) > 100 ? 90 : $(left) )) python3 benchmarks/ssd_bench.py --json /tmp/pack/ssd.json > /tmp/pack/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" /tmp/pack/ssd.txt | tail -n 10
tar -C /tmp -czf $OUT/all.tgz pack
s=$(date +%s)
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(( $(left) - 5 )) python3 benchmarks/replay_bench.py --trace mooncake:sample --model qwen3-next-80b-a3b --timing $TIMING --capacity $CAP --requests $N --runs marconi/exact/sequential@16 --attention cudnn --elementwise fused --out /tmp/pack/rb80-fused > /tmp/pack/replay-bench-80b-fused.txt 2>&1; echo "replay_bench fused rc=$? $(( $(date +%s)-s )) s"; grep -E "TFLOP|peak|hits|wall" /tmp/pack/replay-bench-80b-fused.txt | grep -v "^{" | cut -c1-250 | tail -n 4
tar -C /tmp -czf $OUT/all.tgz pack; echo "total $(( $(date +%s)-s0 )) s"
