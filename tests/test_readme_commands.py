"""Every command shown in the README's code blocks runs (issues 12 and 20), so the README cannot
drift from the code: each `marconi ...` line verbatim through the real CLI, each in a process of
its own (the first through the installed `marconi` script, the others forked from
tests/cli_forkserver.py, which has the CLI and its heavy imports loaded once), with
small sizes added where a full run would take minutes; every line pastes as written (no `a|b`
alternatives, no placeholders, nothing outside the repository such as ../shared); `make` targets
are checked with `make -n` (running `make test` here would run this suite inside itself); a
`source .venv/bin/activate` line must name the Makefile's venv. The default output shown in
the README must be the stored default table (tests/sim/cli/data/default_run.txt, checked byte for
byte against `marconi run` by tests/sim/cli/test_default_output.py).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from forked_cli import Forks

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MARCONI = str(Path(sys.executable).parent / "marconi")

# small sizes, per subcommand: (flag, value or None), added unless the command sets the flag
SMALL = {
    "run": [("--sessions", "3"), ("--no-progress", None)],
    # --save-requests: the README's plot kinds ttft and occupancy read per-request records
    "sweep": [("--sessions", "2"), ("--save-requests", None), ("--no-progress", None)],
    "stats": [("--sessions", "2")],
    "prepare": [("--sessions", "2")],
    "advise": [("--sessions", "4"), ("--trials", "3"), ("--workers", "1"), ("--no-progress", None)],
}


def _kernels_check_passes(out: str) -> str | None:
    """``marconi kernels check``: a pass/fail table of at least ten checks, every one PASS (these
    checks were tests/kernels/test_cli.py's own run of the command: one run, not two)."""
    lines = [ln for ln in out.splitlines() if ln.endswith(("PASS", "FAIL"))]
    if len(lines) < 10 or not all(ln.endswith("PASS") for ln in lines) or "all checks passed" not in out:
        return f"{len(lines)} checks, failed: {[ln for ln in lines if not ln.endswith('PASS')]}\n{out[-1000:]}"
    return None


# what a command's output must show, besides exit 0 (README line -> check returning a failure or None)
OUTPUT_CHECKS = {"marconi kernels check": _kernels_check_passes}


def code_blocks(text: str, shell: bool = True) -> list[str]:
    """Shell blocks (```bash, sh, console: commands) or the others (```: output shown)."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    return [body for tag, body in blocks if (tag in ("bash", "sh", "shell", "console")) == shell]


def commands(text: str) -> list[str]:
    """Command lines of the README's code blocks: continuations joined, comments dropped."""
    out = []
    for block in code_blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if line.startswith(("marconi ", "make ", "source ")) or line in ("marconi", "make"):
                out.append(line)
    return out


def small(argv: list[str], tmp: Path) -> list[str]:
    argv = list(argv)
    sub = argv[2] if argv[1:2] == ["traces"] and len(argv) > 2 else (argv[1] if len(argv) > 1 else "")
    # a trace that does not read --sessions (hash-block, Marconi JSONL) refuses it (issue 47): the
    # first sessions of it are --session-range 0:N
    fixed_sessions = any(t.startswith(("mooncake:", "bailian:", "marconi-jsonl:")) for t in argv)
    for flag, value in SMALL.get(sub, []):
        if flag == "--sessions" and fixed_sessions:
            flag = "--session-range"
            value = f"0:{value}"
        if flag not in argv and not (flag == "--no-progress" and "--progress" in argv):
            argv += [flag] if value is None else [flag, value]
    return argv


def test_readme_has_commands():
    found = commands(README)
    assert any(c.startswith("marconi run") for c in found) and any(c.startswith("make run") for c in found)


def test_every_readme_command_pastes_as_written():
    """No alternatives (`a|b`), placeholders (SPEC, PATH) or paths outside the repository."""
    for command in commands(README):
        words = shlex.split(command)
        assert not any("|" in w for w in words), f"{command}: `a|b` does not paste; write one line each"
        assert not any(w.isalpha() and w.isupper() for w in words), f"{command}: a placeholder does not paste"
        assert "../" not in command, f"{command}: names something outside the repository"


@pytest.mark.slow  # the longest single test: collected first (tests/conftest.py)
def test_every_readme_command_runs(tmp_path):
    """In README order, in one folder (the sweep writes results/ that plot reads)."""
    env = dict(os.environ, MARCONI_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="1")
    work, logs = tmp_path / "work", tmp_path / "logs"
    logs.mkdir()
    # the shipped example configs (`--model docs/examples/...`) where a fresh clone has them
    shutil.copytree(ROOT / "docs" / "examples", work / "docs" / "examples")
    failures = []
    ran = 0
    forks = Forks(env, work, logs)
    try:
        for command in commands(README):
            if command.startswith("source "):
                venv = re.search(r"^VENV \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
                assert command.split()[1] == f"{venv}/bin/activate", f"{command}: the Makefile's venv is {venv}"
                continue
            if command.startswith("make"):
                target = command.split()[1]
                plan = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
                if plan.returncode != 0 or not plan.stdout.strip():
                    failures.append(f"{command}: make -n {target} failed: {plan.stderr.strip()[-300:]}")
                if target == "run":  # what `make run` runs, at a small size
                    command = "marconi run"
                else:
                    continue
            argv = small(shlex.split(command), work)
            if argv[:2] == ["marconi", "kernels"] and shutil.which("nvidia-smi") is None:
                pytest.importorskip("triton")  # the interpreter on CPU needs the kernels extra
            if ran == 0:  # the installed `marconi` script itself, once
                proc = subprocess.run(
                    [MARCONI, *argv[1:]], cwd=work, env=env, capture_output=True, text=True, timeout=600
                )
                rc, out, err = proc.returncode, proc.stdout, proc.stderr
            else:
                rc, out, err = forks.run(argv)
            ran += 1
            if rc != 0:
                failures.append(f"{' '.join(argv)}: exit {rc}: {err.strip()[-400:]}")
            elif command in OUTPUT_CHECKS and (why := OUTPUT_CHECKS[command](out)):
                failures.append(f"{command}: {why}")
    finally:
        forks.close()
    checked = set(OUTPUT_CHECKS) & set(commands(README))
    assert checked == set(OUTPUT_CHECKS), f"no longer in the README: {set(OUTPUT_CHECKS) - checked}"
    assert ran >= 8 and forks.n == ran - 1
    assert not failures, "\n".join(failures)


def test_readme_model_configs_are_in_the_repository():
    """`--model PATH` and `marconi models PATH` in the README name a config the repository ships."""
    paths = [w for c in commands(README) for w in shlex.split(c) if w.startswith("docs/examples/")]
    assert paths, "the README reads a model from its config.json"
    for p in paths:
        assert (ROOT / p).is_file() or (ROOT / p / "config.json").is_file(), p


def test_readme_default_output_is_the_stored_table():
    stored = (ROOT / "tests" / "sim" / "cli" / "data" / "default_run_continuous.txt").read_text().splitlines()
    shown = [b for b in code_blocks(README, shell=False) if any(x.startswith("policy ") for x in b.splitlines())]
    assert shown, "the README shows the default output"
    assert shown[0].strip("\n").splitlines() == stored[1:], "README's default table differs from `marconi run`'s"


def test_kernels_check_output_rule():
    table = "".join(f"check {i:<30} PASS\n" for i in range(10)) + "all checks passed\n"
    assert _kernels_check_passes(table) is None
    assert "9 checks" in _kernels_check_passes(table.split("\n", 1)[1])
    assert "FAIL" in _kernels_check_passes(table.replace("check 3 " + " " * 29 + "PASS", "check 3 FAIL"))
    assert _kernels_check_passes(table.replace("all checks passed", "")) is not None
