"""Issue 21: Ctrl-C during `marconi sweep` through a real ``marconi`` process and a real SIGINT to its
process group (what a terminal sends): one line, exit code 130, no traceback (from the fork server
or the workers), no worker process left, and no hang; a rerun resumes.

Before the fix, 1 in 22 tries hung after "interrupted" (a worker killed by the SIGINT while it held
the pool's queue lock), a second Ctrl-C left workers behind, and 8 in 22 printed a KeyboardInterrupt
traceback from the fork server's preload or a worker. The delays below land the SIGINT while the
fork server imports its preload, while workers start, and while configurations run (twice in a row:
the second lands while the workers are being stopped).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sigint import as_from_a_shell

MARCONI = Path(sys.executable).parent / "marconi"
ARGS = [
    "sweep",
    "--policy",
    "sglang+,marconi",
    "--alpha",
    "0:2:0.5",
    "--capacity",
    "1GB,2GB",
    "--trace",
    "synthetic:agent:sessions=150",
    "--workers",
    "2",
    "--no-progress",
]


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for t in Path(f"/proc/{p}/task").glob("*"):
            kids = (t / "children").read_text().split() if (t / "children").exists() else []
            for k in map(int, kids):
                if k not in out:
                    out.add(k)
                    todo.append(k)
    return out


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not MARCONI.exists(), reason="Linux /proc, marconi")
@pytest.mark.parametrize(
    "delay, twice", [(0.0, False), (0.3, False), (1.2, True)], ids=["preload", "workers-start", "running-ctrl-c-twice"]
)
def test_ctrl_c_in_sweep_is_one_line_and_leaves_nothing(tmp_path, delay, twice):
    out = tmp_path / "s"
    env = dict(os.environ, MARCONI_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [str(MARCONI), *ARGS, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=as_from_a_shell,
    )
    seen: set[int] = set()
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        buf = b""
        t0 = time.monotonic()
        while b"already done" not in buf:  # the grid is built: the pool starts now
            assert proc.poll() is None and time.monotonic() - t0 < 60, buf
            time.sleep(0.02)
            buf += proc.stdout.read() or b""
        t1 = time.monotonic()
        while time.monotonic() - t1 < delay:
            seen |= _descendants(proc.pid)
            time.sleep(0.05)
        seen |= _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        if twice:  # an impatient second Ctrl-C while the workers are being stopped
            time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("marconi sweep hung after Ctrl-C")
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip() in ("interrupted: rerun the same command to finish", "Interrupted."), err
    time.sleep(0.5)  # the fork server notices its parent is gone
    left = [p for p in seen if _alive(p)]
    assert not left, f"processes left behind: {left}"
