"""Output folders of ``run``, ``sweep`` and ``plot``: checked (created and written to) before any
work starts, and removed again when the command fails before putting anything in them."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import UsageError


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
