import time
import io
import contextlib
import sys
import json
from sim.cli import main
import sim

out = io.StringIO()
w = time.perf_counter()
c = time.process_time()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:], standalone_mode=False)
    except SystemExit:
        pass
print(json.dumps({"src": sim.__file__, "wall": time.perf_counter() - w, "cpu": time.process_time() - c}))
