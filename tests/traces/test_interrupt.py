"""Ctrl-C while a trace is tokenized in the process pool: a real ``marconi`` process, a real SIGINT.

Before the fix, a Ctrl-C delivered to the whole process group (what a terminal does) while
``pool.map`` was waiting killed the workers mid-task and the parent waited forever for their
results (reproduced with a 0.5 s delay after the first progress line).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sigint import as_from_a_shell

MARCONI = shutil.which("marconi", path=str(Path(sys.executable).parent)) or shutil.which("marconi")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _read_until(proc: subprocess.Popen, needle: bytes, timeout: float) -> bytes:
    os.set_blocking(proc.stderr.fileno(), False)
    buf = b""
    t0 = time.monotonic()
    while needle not in buf:
        if time.monotonic() - t0 > timeout or proc.poll() is not None:
            raise AssertionError(f"no {needle!r} on stderr: {buf[-500:]!r}")
        time.sleep(0.05)
        buf += proc.stderr.read() or b""
    return buf


@pytest.mark.skipif(not sys.platform.startswith("linux") or MARCONI is None, reason="needs Linux /proc and marconi")
@pytest.mark.parametrize("group, delay", [(True, 0.5), (False, 0.0)], ids=["ctrl-c-group", "parent-only"])
def test_ctrl_c_while_tokenizing_exits_promptly(tmp_path, group, delay):
    env = dict(os.environ, MARCONI_CACHE_DIR=str(tmp_path / "cache"))  # cold cache: tokenizes
    proc = subprocess.Popen(
        [MARCONI, "traces", "prepare", "sharegpt", "--sessions", "0", "--min-rounds", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=as_from_a_shell,
    )
    try:
        err = _read_until(proc, b"tokenizing sharegpt", timeout=120)  # the first batch is done
        workers = _children(proc.pid)
        assert len(workers) >= 1 or (os.cpu_count() or 1) == 1, "the tokenizer pool is not running"
        time.sleep(delay)  # lands inside pool.map of a later batch
        (os.killpg if group else os.kill)(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("marconi hung after Ctrl-C")
        time.sleep(0.2)
        err += proc.stderr.read() or b""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.decode(errors="replace")
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-2000:]
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip() and "tokenizing" not in ln]
    assert len(lines) == 1, lines
    assert proc.returncode == 130 and lines == ["Interrupted."], (proc.returncode, text[-500:])
    for w in workers:  # no orphaned tokenizer process keeps running
        assert not Path(f"/proc/{w}").exists() or "zombie" in Path(f"/proc/{w}/status").read_text()


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")
def test_an_abandoned_pool_ends_its_workers_and_starts_no_new_ones():
    """``chat._abandon_pool`` (the Ctrl-C / error path, instead of ``Pool.terminate()``, whose
    clean-up can wait forever for a queue lock a killed worker held): with tasks still running,
    every worker is killed and reaped, the worker handler has stopped (it would start new workers
    for the dead ones), and the pool's finalizer no longer runs the terminate clean-up at exit."""
    from multiprocessing.pool import TERMINATE

    from traces import chat

    pool = chat._start_pool(2, ("qwen3.5", None, None, 90.0))
    pending = pool.map_async(time.sleep, [5.0] * 4)  # the workers busy, tasks queued behind them
    time.sleep(1.0)
    pids = [w.pid for w in pool._pool]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    chat._abandon_pool(pool)
    assert not pool._worker_handler.is_alive() and pool._state == TERMINATE
    assert not any(_alive(p) for p in pids)
    time.sleep(0.5)  # a live worker handler would have started replacements by now
    assert [w.pid for w in pool._pool if w.exitcode is None] == []
    assert not pool._terminate.still_active()
    assert not pending.ready()  # the queued work was dropped, not waited for
