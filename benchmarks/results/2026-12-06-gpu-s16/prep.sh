# issue 42 (carry .s16): PREP=1 against the default on the GPU: the same outputs, then the time
source benchmarks/results/2026-12-06-gpu-s16/env16.sh > /dev/null
timeout 60 python3 - <<'PY' 2>&1 | tail -4
import os, torch
from kernels import chunk_ssd
g = torch.Generator(device="cuda").manual_seed(0)
T, H, P, N, G = 8192 + 77, 128, 64, 128, 8
r = lambda *s: torch.randn(*s, generator=g, device="cuda")
x, dt, B, C = r(1, T, H, P).bfloat16(), r(1, T, H).bfloat16(), r(1, T, G, N).bfloat16(), r(1, T, G, N).bfloat16()
A, D, bias = -torch.rand(H, device="cuda", generator=g) - 0.5, r(H), r(H) * 0.5
kw = dict(D=D, dt_bias=bias, cu_seqlens=[0, 3000, T], start_positions=[0, 40])
res = {}
for v in ("PREP=0", "PREP=1"):
    os.environ["KERNELS_CONFIG_SSD_STATE"] = v
    res[v] = chunk_ssd(x, dt, A, B, C, **kw)
a, b = res["PREP=0"], res["PREP=1"]
print("bitwise equal y / final / boundaries:", [torch.equal(u, w) for u, w in zip(a, b)])
print("max abs diff:", [float((u.float() - w.float()).abs().max()) for u, w in zip(a, b)])
PY
timeout 150 python3 benchmarks/ssd_bench.py --no-mamba --no-fla --lengths 8192,32768 --variant "prep:KERNELS_CONFIG_SSD_STATE=PREP=1" > $OUT/prep.txt 2>&1; echo "ssd_bench rc=$?"; grep -v "^#" $OUT/prep.txt | tail -26
