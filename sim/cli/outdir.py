"""Outputs of every command: folders checked (created and written to) before any work starts and
removed again when the command fails before putting anything in them; files refused when they are
an input or exist already (unless ``--force``), and written under a temporary name then renamed."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import UsageError
from traces.registry import trace_source


@contextmanager
def output_folder(path: Path | None, flag: str = "--out", keep: bool = True) -> Iterator[Path | None]:
    """Creates ``path`` and its missing parents now, so ``--out /proc/x`` or ``--out file/sub``
    is a one-line error (naming ``flag``) before a long simulation rather than a traceback after
    it. Folders created here are removed when the body fails and they are still empty, or at the
    end when ``keep`` is False (a dry run)."""
    if path is None:
        yield None
        return
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    if p.exists() and not p.is_dir():
        what = "is" if p == path else f"is inside {p}, which is"
        raise UsageError(f"{flag} {path}: {what} a file, not a folder")
    created: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        with tempfile.TemporaryFile(dir=path):  # can we write there (read-only file systems)?
            pass
    except OSError as exc:
        _remove_empty(created)
        raise UsageError(f"{flag} {path}: cannot create or write the folder ({exc.strerror or exc})") from None
    try:
        yield path
    except BaseException:
        _remove_empty(created)
        raise
    if not keep:
        _remove_empty(created)


def _remove_empty(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()  # only when empty: results already written stay
        except OSError:
            return


# ---------------------------------------------------------------------------------- files a command writes


def input_paths(trace_spec: str | None = None, *files: str | os.PathLike | None) -> list[Path]:
    """The files and folders a command reads: the path inside a trace spec (``mooncake:PATH``,
    ``swebench:marconi:PATH``; every ``:``-separated tail that exists on disk) and ``files``
    (``--timing``), resolved. Outputs are checked against them: nothing is ever written onto (or
    into) an input. A source whose arg is not a path (``synthetic:KIND``) has none."""
    found: list[Path] = []
    source = trace_source(trace_spec) if trace_spec else None
    parts = str(trace_spec or "").split(":") if source is None or source.path_arg else []
    for i in range(1, len(parts)):
        tail = ":".join(parts[i:])
        if tail and Path(tail).expanduser().exists():
            found.append(Path(tail).expanduser().resolve())
    found += [Path(f).expanduser().resolve() for f in files if f]
    return found


def _is_input(path: Path, inputs: list[Path]) -> Path | None:
    """The input that ``path`` is, or lies inside, or None."""
    p = Path(path).expanduser().resolve()
    for src in inputs:
        if p == src or (src.is_dir() and src in p.parents):
            return src
    return None


def check_output_folder(path: Path | None, flag: str, inputs: list[Path]) -> None:
    """Refuses an output folder that is an input of the command, or lies inside an input folder
    (a sweep's rows would become part of a trace folder)."""
    if path is None:
        return
    src = _is_input(path, inputs)
    if src is not None:
        what = "is" if Path(path).expanduser().resolve() == src else f"is inside {src}, which is"
        raise UsageError(f"{flag} {path}: {what} an input of this command; write the output elsewhere")


def check_output_files(files: dict[Path, str], *, force: bool, inputs: list[Path]) -> None:
    """Refuses, before any work, to write a file of ``files`` (path -> the flag that names it)
    that is an input of the command (or inside an input folder), even with ``--force``, or that
    exists already, unless ``force``: one line naming the flag and what to do."""
    existing = []
    for path, flag in files.items():
        src = _is_input(path, inputs)
        if src is not None:
            what = "is" if Path(path).expanduser().resolve() == src else f"is inside {src}, which is"
            raise UsageError(f"{flag} {path}: {what} an input of this command; write the output elsewhere")
        if Path(path).is_dir():
            raise UsageError(f"{flag} {path}: is a folder, not a file")
        above = next((p for p in Path(path).parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise UsageError(f"{flag} {path}: is inside {above}, which is a file, not a folder")
        if Path(path).exists():
            existing.append((flag, Path(path)))
    if existing and not force:
        flags = sorted({flag for flag, _ in existing})
        names = ", ".join(str(p) for _, p in existing)
        raise UsageError(
            f"{' and '.join(flags)}: {names} already exist{'s' if len(existing) == 1 else ''}; "
            "pass --force to replace, or choose another name"
        )


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a hidden temporary name beside ``path``, then rename it onto ``path``: a
    crash or Ctrl-C leaves either the old file or the complete new one, never a truncated file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.stem}-", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
