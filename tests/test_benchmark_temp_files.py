"""A benchmark leaves nothing behind in the temporary folder: `benchmarks/trace_memory.py`, which
tests/test_benchmarks.py runs on every `make test`, kept its trace cache
(`/tmp/marconi-trace-memory-*`, one more folder a run: 14 of them on this machine by session 24)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_trace_memory_removes_its_trace_cache(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "trace_memory.py"), "--trace", "synthetic:chat", "--sessions", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cached load" in proc.stdout
    assert not list(tmp_path.glob("marconi-trace-memory-*")), sorted(p.name for p in tmp_path.iterdir())
