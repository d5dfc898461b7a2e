import json
import sys
import statistics as S

for f in sys.argv[1:]:
    rows = {
        "base": {"wall": [], "cpu": [], "pwall": [], "cr": []},
        "new": {"wall": [], "cpu": [], "pwall": [], "cr": []},
    }
    for line in open(f):
        line = line.strip()
        if line.startswith('{"src"'):
            d = json.loads(line)
            v = "base" if "/h7/base/" in d["src"] else "new"
            rows[v]["wall"].append(d["wall"])
            rows[v]["cpu"].append(d["cpu"])
        elif line.startswith('{"v"'):
            v = json.loads(line.split("} ", 1)[0] + "}")["v"]
            d = json.loads(line.split("} ", 1)[1])
            rows[v]["pwall"] += d["profiled_wall_s"]
            rows[v]["cr"] += d["could_reserve_cum_s"]
            rows[v]["calls"] = d["could_reserve_calls"]
    print(f)
    for v, r in rows.items():
        print(
            v,
            {k: (round(S.median(x), 3) if isinstance(x, list) else x) for k, x in r.items()},
            {k: [round(y, 3) for y in x] for k, x in r.items() if isinstance(x, list)},
        )
