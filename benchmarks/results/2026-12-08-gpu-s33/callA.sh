# session 33, call A: run(carry=[".s20"], kind="nvidia-h100-x1", timeout_s=600) at efd5594: session 30's H200 call 2
# as it stands (make test-gpu's replay half but the FlashQLA peers, the matrix's rows kept, then ssd_bench at 32K)
exec bash benchmarks/results/2026-12-07-gpu-s30/callH2.sh
