"""``Forks``: runs ``marconi`` command lines through tests/cli_forkserver.py (started on first use),
each in a process of its own forked from one that has the CLI and its heavy imports loaded."""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FORKSERVER = Path(__file__).resolve().parent / "cli_forkserver.py"


class Forks:
    """tests/cli_forkserver.py, started on first use: ``run`` forks it into ``marconi <argv>``."""

    def __init__(self, env: dict, cwd: Path, logs: Path, preload: tuple[str, ...] = ()) -> None:
        """``preload``: the modules the server loads (default: cli_forkserver.PRELOAD, torch too)."""
        self.env, self.cwd, self.logs, self.proc, self.n = env, cwd, logs, None, 0
        self.preload = preload

    def run(
        self, argv: list[str], timeout: float = 600, cwd: Path | None = None, script: Path | None = None
    ) -> tuple[int | None, str, str]:
        """``marconi <argv[1:]>`` (or ``python script argv[1:]``) in ``cwd`` (default: the
        server's): (exit code, stdout, stderr); the code is None when the command ran past
        ``timeout`` seconds and was killed."""
        if self.proc is None:
            with (self.logs / "server.err").open("w") as log:  # what the server itself says
                self.proc = subprocess.Popen(
                    [sys.executable, str(FORKSERVER), *self.preload], cwd=self.cwd, env=self.env,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                )  # fmt: skip
        self.n += 1
        out, err = self.logs / f"{self.n}.out", self.logs / f"{self.n}.err"
        req = {"argv": argv, "cwd": str(cwd or self.cwd), "out": str(out), "err": str(err), "timeout": timeout}
        if script is not None:
            req["script"] = str(script)
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            why = (self.logs / "server.err").read_text(errors="replace")[-2000:]
            return -1, "", f"the fork server died (exit {self.proc.wait()}): {why}"
        texts = [f.read_text(errors="replace") for f in (out, err)]
        for f in (out, err):
            f.unlink()
        return json.loads(line)["rc"], texts[0], texts[1]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc.stdout.close()


_SHARED: dict[tuple, Forks] = {}


def shared_forks(env: dict, preload: tuple[str, ...] = ()) -> Forks:
    """One server per test process and environment, for helpers called from many tests (closed,
    its logs removed, when the process exits)."""
    env = {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's, changes every test
    key = (tuple(sorted(env.items())), preload)
    if key not in _SHARED:
        logs = Path(tempfile.mkdtemp(prefix="marconi-forks-"))
        forks = _SHARED[key] = Forks(env, Path.cwd(), logs, preload)
        atexit.register(shutil.rmtree, logs, True)
        atexit.register(forks.close)
    return _SHARED[key]
