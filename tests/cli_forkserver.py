"""Runs ``marconi`` command lines, each in a process of its own, without each paying for Python's
start and the CLI's imports (0.6-3 CPU s a command: torch, Triton, matplotlib, pandas): this
process imports the CLI as the ``marconi`` script does (``from sim.cli import main``) and the
heavy packages the commands load, then forks one child per command, which runs ``main`` on its
argv in its own folder with its stdout and stderr sent to files, as a fresh ``marconi`` would.
Nothing runs a command in this process itself: no command sees another's state.

Protocol (one JSON object a line): ``{"argv": [...], "cwd": ..., "out": ..., "err": ...,
"timeout": s}`` on stdin -> ``{"rc": code}`` on stdout (``rc`` None: killed at the timeout). With
``"script": path`` the child runs that Python script as ``python path argv[1:]`` would (as
``__main__``, its folder first on ``sys.path``) instead of the CLI.
Started by tests/forked_cli.py with the commands' environment; its arguments, if any, name the
modules to preload instead of ``PRELOAD``.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

# run as a script, this folder leads sys.path, and its test package tests/sim would shadow sim
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

from sim.cli import main  # noqa: E402 - as the `marconi` script: installs the CLI's start-up signal handlers

# what the README's commands import on top of the CLI (an optional extra that is missing is left
# to the command, which reports it itself); imported, never run: the children start clean
PRELOAD = (
    "numpy",
    "pandas",
    "pyarrow",
    "torch",
    "triton",
    "matplotlib",
    "optuna",
    "simpy",
    "tqdm",
    "matplotlib.pyplot",
    "sim.simulate",
    "sim.replay.session",
    "sim.experiments.advise.search",
    "kernels.chunk_gdn",
    "kernels.conv",
    "kernels.reference",
)


def _preload(names: tuple[str, ...]) -> None:
    # compiled Triton (a GPU run) loads its CUDA driver lazily; the default list leaves it to the
    # children all the same, so that no CUDA state is ever made before a fork
    gpu = os.environ.get("TRITON_INTERPRET") != "1" and names is PRELOAD
    for name in names:
        if gpu and name.startswith(("triton", "kernels")):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a missing extra: the command's own import reports it
            pass


def _child(req: dict) -> None:
    """In the forked child: become ``marconi <argv>`` and exit with its code."""
    os.setpgid(0, 0)
    os.chdir(req["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 lives as long as the process
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = [req["argv"][0], *req["argv"][1:]]
    code = 1
    try:
        if req.get("script"):
            sys.argv[0] = req["script"]
            sys.path.insert(0, os.path.dirname(os.path.abspath(req["script"])))
            runpy.run_path(req["script"], run_name="__main__")
        else:
            main(req["argv"][1:], prog_name="marconi")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as Python would, then the exit code 1
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.02)


def serve(names: tuple[str, ...]) -> None:
    _preload(names)
    if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("INTERP_PATCH_ONCE") != "0":  # as tests/conftest.py
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from interp_patch_once import install

        install()
        del sys.path[0]
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        rc = _wait(pid, req.get("timeout", 600))
        sys.stdout.write(json.dumps({"rc": rc}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(tuple(sys.argv[1:]) or PRELOAD)
