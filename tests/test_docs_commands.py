"""Every command of every ```bash block in docs/*.md runs (issue 45), as the README's do
(tests/test_readme_commands.py): each line verbatim through the real CLI, each in a process of its
own forked from tests/cli_forkserver.py (the CLI's imports loaded once), in a scratch folder (with
`docs/` linked into it, so the docs' example paths resolve), sizes shrunk where a full run would take
minutes (SHRINK: a flag the command sets is lowered, one it leaves out is added). A line that is not
a `marconi` command must be listed in SKIP with the reason it cannot run here (a GPU, the network);
nothing is skipped silently. docs/index.md must name every doc.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
from forked_cli import Forks

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))

# per subcommand: (flag, value or None); a flag the command sets takes this value instead of its own
SHRINK = {
    "run": [("--sessions", "3"), ("--no-progress", None)],
    "sweep": [("--sessions", "2"), ("--no-progress", None)],
    "stats": [("--sessions", "2")],
    "prepare": [("--sessions", "2")],
    "advise": [("--sessions", "4"), ("--trials", "3"), ("--workers", "1"), ("--no-progress", None)],
    "replay": [("--requests", "8")],
}
# commands (by their start) that cannot run on this machine, and why; each must still be in a doc
SKIP = {
    "python benchmarks/": "benchmarks: a CUDA GPU or an engine's own code in a folder (docs/results-*.md, presets-engines.md)",
    "marconi replay --model qwen": "a full-size preset replays on a CUDA GPU (a CPU runs replay-tiny)",
    "pip install": "installs from the network",
}


def bash_lines(text: str) -> list[str]:
    """The command lines of a doc's ```bash blocks: continuations joined, comments dropped."""
    out = []
    for body in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            line = re.split(r"(?:^|\s+)#", line, maxsplit=1)[0].strip()
            if line:
                out.append(line)
    return out


def shrink(argv: list[str]) -> list[str]:
    argv = list(argv)
    sub = argv[2] if argv[1:2] == ["traces"] and len(argv) > 2 else (argv[1] if len(argv) > 1 else "")
    hash_blocks = any(w.startswith(("mooncake:", "bailian:")) for w in argv)
    for flag, value in SHRINK.get(sub, []):
        if flag == "--sessions" and hash_blocks:  # a hash-block trace refuses --sessions: its first rows
            flag, value = "--session-range", "0:30"
        if flag in argv and value is not None:
            argv[argv.index(flag) + 1] = value
        elif flag not in argv and not (flag == "--no-progress" and "--progress" in argv):
            argv += [flag] if value is None else [flag, value]
    return argv


def skip_reason(line: str) -> str | None:
    return next((why for start, why in SKIP.items() if line.startswith(start)), None)


ALL = [(doc.name, line) for doc in DOCS for line in bash_lines(doc.read_text())]


def test_docs_have_commands_and_every_line_is_runnable_or_listed():
    assert len(ALL) >= 10
    for doc, line in ALL:
        assert line.startswith("marconi ") or skip_reason(line), (
            f"{doc}: {line!r} is neither a marconi command nor in SKIP"
        )
        words = shlex.split(line)
        assert not any("|" in w for w in words), f"{doc}: {line}: `a|b` does not paste; write one line each"
        assert "../" not in line, f"{doc}: {line}: names something outside the repository"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs-commands")
    (folder / "docs").symlink_to(ROOT / "docs")
    return folder


@pytest.fixture(scope="module")
def forks(scratch, tmp_path_factory):
    """One fork server for the module's commands (per xdist worker that runs any)."""
    env = dict(os.environ, MARCONI_CACHE_DIR=str(scratch / "cache"), TRITON_INTERPRET="1")
    server = Forks(env, scratch, tmp_path_factory.mktemp("docs-command-logs"))
    yield server
    server.close()


@pytest.mark.parametrize("doc, line", ALL, ids=[f"{d}:{i}" for i, (d, _) in enumerate(ALL)])
def test_docs_command_runs(forks, doc, line):
    why = skip_reason(line)
    if why:
        pytest.skip(why)
    argv = shrink(shlex.split(line))
    if argv[1] == "advise":
        pytest.importorskip("optuna")  # the `advise` extra
    if argv[1] == "replay":
        pytest.importorskip("torch")  # the `kernels` extra
    if argv[:2] == ["marconi", "kernels"] and shutil.which("nvidia-smi") is None:
        pytest.importorskip("triton")
    rc, _, err = forks.run(argv)
    assert rc == 0, f"{doc}: {' '.join(argv)}: exit {rc}: {err.strip()[-600:]}"


def test_index_names_every_doc():
    index = (ROOT / "docs" / "index.md").read_text()
    missing = [d.name for d in DOCS if d.name != "index.md" and f"({d.name})" not in index]
    assert not missing, f"docs/index.md does not say what {', '.join(missing)} answers"
