"""Median of N: wall of the whole `marconi run` and cProfile cumtime of could_reserve."""

import cProfile
import pstats
import sys
import time
import io
import contextlib
import statistics
import json
from sim.cli import main

n = int(sys.argv[1])
args = sys.argv[2:]
walls, cums, profwalls = [], [], []
for _ in range(n):
    out = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(args, standalone_mode=False)
        except SystemExit:
            pass
    walls.append(time.perf_counter() - t)
    pr = cProfile.Profile()
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pr.enable()
        try:
            main(args, standalone_mode=False)
        except SystemExit:
            pass
        pr.disable()
    profwalls.append(time.perf_counter() - t)
    st = pstats.Stats(pr).stats
    c = [v for k, v in st.items() if k[2] == "could_reserve"]
    cums.append(sum(v[3] for v in c))
    calls = sum(v[0] for v in c)
print(
    json.dumps(
        {
            "args": args,
            "wall_s": walls,
            "median_wall_s": statistics.median(walls),
            "profiled_wall_s": profwalls,
            "median_profiled_wall_s": statistics.median(profwalls),
            "could_reserve_cum_s": cums,
            "median_could_reserve_s": statistics.median(cums),
            "could_reserve_calls": calls,
        }
    )
)
print(out.getvalue(), file=sys.stderr)
