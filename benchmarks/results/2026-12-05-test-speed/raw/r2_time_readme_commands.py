"""CPU and wall seconds of each README command as tests/test_readme_commands.py runs it (shrunk by
its ``small``), one subprocess at a time; the lines of r2_readme_commands_cpu.txt."""

import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "/work/main/tests")
import test_readme_commands as t  # noqa: E402

tmp = Path(tempfile.mkdtemp(prefix="rb-"))
env = dict(os.environ, MARCONI_CACHE_DIR=str(tmp / "cache"), TRITON_INTERPRET="1")
shutil.copytree(t.ROOT / "docs" / "examples", tmp / "docs" / "examples")


def cpu():
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime


for command in t.commands(t.README):
    if command.startswith("source"):
        continue
    if command.startswith("make"):
        if command.split()[1] != "run":
            continue
        command = "marconi run"
    argv = t.small(shlex.split(command), tmp)
    c0, w0 = cpu(), time.time()
    p = subprocess.run([t.MARCONI, *argv[1:]], cwd=tmp, env=env, capture_output=True, text=True)
    print(f"{cpu() - c0:6.1f} {time.time() - w0:6.1f} rc={p.returncode} {' '.join(argv)}", flush=True)
