"""``Forks``: runs ``marconi`` command lines through tests/cli_forkserver.py (started on first use),
each in a process of its own forked from one that has the CLI and its heavy imports loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORKSERVER = Path(__file__).resolve().parent / "cli_forkserver.py"


class Forks:
    """tests/cli_forkserver.py, started on first use: ``run`` forks it into ``marconi <argv>``."""

    def __init__(self, env: dict, cwd: Path, logs: Path) -> None:
        self.env, self.cwd, self.logs, self.proc, self.n = env, cwd, logs, None, 0

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int | None, str, str]:
        if self.proc is None:
            self.proc = subprocess.Popen(
                [sys.executable, str(FORKSERVER)], cwd=self.cwd, env=self.env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        self.n += 1
        out, err = self.logs / f"{self.n}.out", self.logs / f"{self.n}.err"
        req = {"argv": argv, "cwd": str(self.cwd), "out": str(out), "err": str(err), "timeout": timeout}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return -1, "", f"the fork server died (exit {self.proc.wait()})"
        texts = [f.read_text(errors="replace") for f in (out, err)]
        for f in (out, err):
            f.unlink()
        return json.loads(line)["rc"], texts[0], texts[1]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc.stdout.close()
