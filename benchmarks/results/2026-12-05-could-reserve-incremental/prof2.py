import cProfile
import pstats
import io
import contextlib
import sys
from sim.cli import main

pr = cProfile.Profile()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    pr.enable()
    try:
        main(sys.argv[1:], standalone_mode=False)
    except SystemExit:
        pass
    pr.disable()
st = pstats.Stats(pr)
print("total_tt %.3f" % st.total_tt)
for k, v in sorted(st.stats.items(), key=lambda kv: -kv[1][3]):
    if k[2] in (
        "keys",
        "_changed",
        "_touched",
        "_recount",
        "could_reserve",
        "iter_nodes",
        "update",
        "lock",
        "unlock",
        "schedule",
    ):
        print(k[0].split("/work/main/")[-1].split("/tmp/h7/base/")[-1], k[2], v[0], "tot %.3f cum %.3f" % (v[2], v[3]))
