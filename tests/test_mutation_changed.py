"""benchmarks/mutation.py --changed-since REV: only sites on lines that ``git diff REV`` adds or
changes are drawn (session 17: a sample of a whole module seldom reached the session's new code,
e.g. 8 of kernels/ssd.py's 646 sites). On a two-commit repository made here."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _mutation():
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "benchmarks" / "mutation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
        env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"},
    ).stdout.strip()  # fmt: skip


def test_only_the_lines_changed_since_a_revision_are_mutated(tmp_path):
    mut = _mutation()
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    src = repo / "m.py"
    old = "def f(a, b):\n    x = a + b\n    return x * 2\n\n\ndef g(a):\n    return a - 1\n"
    src.write_text(old)
    _git(repo, "add", "m.py")
    _git(repo, "commit", "-q", "-m", "one")
    base = _git(repo, "rev-parse", "HEAD")
    # line 3 changed, lines 6-7 kept, two blank lines and a function added at the end (lines 8-11)
    src.write_text(old.replace("x * 2", "x * 3") + "\n\ndef h(a):\n    return a < 4\n")
    _git(repo, "commit", "-q", "-am", "two")
    assert mut.changed_lines(repo, base, "HEAD", ["m.py"]) == {"m.py": {3, 8, 9, 10, 11}}
    src.write_text(src.read_text().replace("a - 1", "a - 2"))  # uncommitted: the working tree's diff
    assert mut.changed_lines(repo, base, None, ["m.py"]) == {"m.py": {3, 7, 8, 9, 10, 11}}
    assert mut.changed_lines(repo, "HEAD", "HEAD", ["m.py"]) == {}
    _git(repo, "checkout", "-q", "m.py")
    sites = mut.list_mutants(repo, "m", ["m.py"])
    changed = mut.changed_lines(repo, base, "HEAD", ["m.py"])["m.py"]
    kept = {m.line for m in sites if changed & set(range(m.line, m.end_line + 1))}
    assert kept == {3, 11} and {m.line for m in sites} >= {2, 3, 7, 11}
