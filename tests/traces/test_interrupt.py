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

    def no_terminate():
        raise AssertionError("Pool.terminate()'s clean-up is what _abandon_pool avoids")

    pool.terminate = no_terminate
    handler_alive_at_kill = []
    for w in pool._pool:  # the handler must be gone before a worker dies (or it starts another)
        real_kill = w.kill

        def kill(real_kill=real_kill):
            handler_alive_at_kill.append(pool._worker_handler.is_alive())
            real_kill()

        w.kill = kill
    chat._abandon_pool(pool)
    assert handler_alive_at_kill == [False, False]  # woken at once, not after its 5 s join
    assert not pool._worker_handler.is_alive() and pool._state == TERMINATE
    assert not any(_alive(p) for p in pids)
    time.sleep(0.5)  # a live worker handler would have started replacements by now
    assert [w.pid for w in pool._pool if w.exitcode is None] == []
    assert not pool._terminate.still_active()
    assert not pending.ready()  # the queued work was dropped, not waited for


def test_a_pool_without_the_parts_abandon_uses_is_terminated():
    """A pool object without the worker handler, workers list or finalizer ``_abandon_pool``
    relies on (another Python's) is ended by its own ``terminate()`` and ``join()``."""
    from traces import chat

    calls = []

    class Other:
        def terminate(self):
            calls.append("terminate")

        def join(self):
            calls.append("join")

    chat._abandon_pool(Other())
    assert calls == ["terminate", "join"]


_REAL_TOKENIZE: list = []


def _failing_on_question_7(messages):
    """A worker's tokenization that fails on one conversation (module level: the pool pickles it
    by name)."""
    if messages[0][1] == "question 7":
        raise ValueError("a tokenizer error")
    return _REAL_TOKENIZE[0](messages)


def test_a_worker_error_abandons_the_pool_and_a_finished_trace_closes_it(monkeypatch):
    """``build_chat_trace`` with enough conversations for the pool (``POOL_MIN_CONVERSATIONS``):
    a worker's error reaches the caller and the pool is abandoned (no waiting for its queued
    work); a trace that finishes closes and joins the pool instead."""
    from traces import chat

    convs = [
        (f"c{i}", [("user", f"question {i}"), ("assistant", f"answer {i}")]) for i in range(chat.POOL_MIN_CONVERSATIONS)
    ]
    abandoned, closed = [], []
    real_abandon, real_start = chat._abandon_pool, chat._start_pool

    def start(procs, init_args):
        pool = real_start(procs, init_args)
        real_close = pool.close

        def close():
            closed.append(pool)
            real_close()

        pool.close = close
        return pool

    monkeypatch.setattr(chat, "_start_pool", start)
    monkeypatch.setattr(chat, "_abandon_pool", lambda pool: (abandoned.append(pool), real_abandon(pool)))
    trace = chat.build_chat_trace("t", iter(convs), "qwen3.5", num_proc=2)
    assert len(closed) == 1 and abandoned == [] and trace.meta.get("dropped_sessions", 0) == 0

    _REAL_TOKENIZE.append(chat._tokenize_one)
    monkeypatch.setattr(chat, "_tokenize_one", _failing_on_question_7)  # the workers fork after: they run it
    with pytest.raises(ValueError, match="a tokenizer error"):
        chat.build_chat_trace("t", iter(convs), "qwen3.5", num_proc=2)
    assert len(abandoned) == 1 and len(closed) == 1
    assert all(w.exitcode is not None for w in abandoned[0]._pool)
