# the next session's kernel call (carry .fqla: test wheels, mamba_ssm's Triton files, FLA, FlashQLA + TileLang;
# the sixteenth session's env.sh installs them): the kernel GPU suite at the current code (the SSD overlap test
# includes OVL=1,TMA_B=1), then the SSD table with the TMA_B variant beside the default and the peers. ~6 minutes.
source benchmarks/results/2026-12-06-gpu-s16/env.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import fla, mamba_ssm, flash_qla; print('peers ok')"
s=$(date +%s)
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels > $OUT/gpu-kernels.txt 2>&1; echo "kernels rc=$? $(( $(date +%s)-s )) s"; tail -2 $OUT/gpu-kernels.txt
s=$(date +%s)
timeout 300 python3 benchmarks/ssd_bench.py --variant "tma:KERNELS_CONFIG_SSD_STATE=TMA_B=1" --variant "disc:KERNELS_CONFIG_SSD_OUT=DISCARD=1" --json $OUT/ssd.json > $OUT/ssd.txt 2>&1; echo "ssd_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/ssd.txt | tail -70
s=$(date +%s)
timeout 110 python3 benchmarks/kernel_bench.py --no-flashqla --shapes 16/32 --rep 20 --host-calls 0 --variant "disc:KERNELS_CONFIG_OUT=DISCARD=1" --json $OUT/kernel.json > $OUT/kernel-bench.txt 2>&1; echo "kernel_bench rc=$? $(( $(date +%s)-s )) s"; grep -v "^# {" $OUT/kernel-bench.txt | tail -16
