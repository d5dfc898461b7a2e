source benchmarks/results/2026-12-06-gpu-s16/env.sh
T=sim/data/h200-timing.json
A="--trace synthetic:agent --model qwen3.5-27b --layers 4 --requests 64 --mode sequential --capacity 40GB --timing $T --no-progress"
# issue 41 item 3: the held-out 27b agent run again, with per-kind sleeps, the measured sleep rate and the presized reference
s=$(date +%s)
timeout 160 python3 benchmarks/replay_stall_probe.py --out $OUT/stalls.csv -- $A > $OUT/stalls.txt 2>&1; echo "probe rc=$? $(( $(date +%s)-s )) s"; tail -62 $OUT/stalls.txt
# the Mooncake sample on the same preset: time error with every prefill counted
s=$(date +%s)
timeout 130 bash -c "$(declare -f marconi); marconi replay --trace mooncake:sample --model qwen3.5-27b --layers 4 --requests 60 --capacity 40GB --timing $T --no-progress --out /tmp/s16mc" > $OUT/mooncake.txt 2>&1; echo "mooncake rc=$? $(( $(date +%s)-s )) s"; tail -22 $OUT/mooncake.txt
cp /tmp/s16mc/summary.json $OUT/mooncake-summary.json 2>/dev/null; cp /tmp/s16mc/requests.parquet $OUT/mooncake-requests.parquet 2>/dev/null
python3 - <<'PY' 2>&1 | tee $OUT/mooncake-errors.txt
import pandas as pd
d = pd.read_parquet("/tmp/s16mc/requests.parquet")
t = d[d["suffix_ms"].notna() & (d["suffix_ms"] > 0)]
e = t["model_error"].abs()
hb = t["suffix_host_bound"].astype(bool)
print(f"all {len(t)} timed prefills: median {e.median():.1%}, P95 {e.quantile(0.95):.1%}; host-bound {int(hb.sum())}")
print(f"device-bound {int((~hb).sum())}: median {e[~hb].median():.1%}, P95 {e[~hb].quantile(0.95):.1%}")
print("host ms p50/p95", t["suffix_host_ms"].quantile([0.5, 0.95]).round(2).tolist(), "splits>0:", int((t["splits"] > 0).sum()))
PY
s=$(date +%s)
timeout 150 python3 benchmarks/replay_matrix.py --out $OUT/matrix --models qwen3-next-80b-a3b --traces mooncake --timing $T --per-run-s 70 > $OUT/matrix.txt 2>&1; echo "matrix rc=$? $(( $(date +%s)-s )) s"; tail -8 $OUT/matrix.txt
