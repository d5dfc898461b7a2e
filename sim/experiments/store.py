"""The results folder of a sweep: one parquet row per configuration, written atomically.

Layout of a results folder (``--out``)::

    OUT/<config_id>.parquet              one row: every knob + every summary metric + wall time
    OUT/_requests/<config_id>.parquet    per-request records (``--save-requests``)
    OUT/_occupancy/<config_id>.parquet   cache occupancy over time (``--save-requests``)

Every file is written atomically (temp file + rename) and the row file last, so a row file means
the configuration is complete; a rerun still verifies each stored result before skipping it
(:func:`stored_status`: readable, one row, the configuration's id, detail files with the row's
request count), so a file truncated or emptied outside the sweep is recomputed, never counted done.
``pandas.read_parquet(OUT)`` reads the rows (pyarrow skips the ``_``/``.``-prefixed
detail folders and temp files); :func:`load_results` is a schema-tolerant reader.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import time
from pathlib import Path
from typing import Iterable

from sim.errors import UsageError
from sim.experiments.grid import Task

REQUESTS_DIR = "_requests"
OCCUPANCY_DIR = "_occupancy"
#: row columns that depend on the run, not the configuration (excluded when comparing engines)
RUNTIME_COLUMNS = ("wall_s", "trace_load_s", "worker_pid", "tuning_seconds")


def _atomic_parquet(df, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.stem}-{os.getpid()}-{time.monotonic_ns()}.parquet"
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def row_path(out: Path, config_id: str) -> Path:
    return Path(out) / f"{config_id}.parquet"


def _detail_paths(out: Path, config_id: str) -> tuple[Path, Path]:
    out = Path(out)
    return out / REQUESTS_DIR / f"{config_id}.parquet", out / OCCUPANCY_DIR / f"{config_id}.parquet"


#: columns every sweep row has (a parquet file without them in a results folder is someone else's)
ROW_COLUMNS = ("config_id", "policy", "alpha_mode", "capacity_bytes")

DONE, MISSING, BAD, STALE = "done", "missing", "bad", "stale"
#: the row column holding the digest of what the row was computed from (trace file content, timing
#: file, the code's row version; the options are in the config id)
DIGEST_COLUMN = "input_digest"


def stored_digest(path: Path) -> str | None:
    """The input digest a stored row records ("" for a row written before digests), None when the
    file cannot be read."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        table = pq.read_table(path)
    except Exception:  # noqa: BLE001 - a bad file
        return None
    if DIGEST_COLUMN not in table.column_names or not table.num_rows:
        return ""
    return str(table.column(DIGEST_COLUMN)[0].as_py() or "")


def _config_ids(path: Path) -> tuple[int, set] | None:
    """(rows, distinct config_id values) of a stored parquet file; None when it cannot be read."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - only resumes and readers need it

    try:
        table = pq.read_table(path, columns=["config_id"])
    except Exception:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, KeyError... for a bad file
        return None
    return table.num_rows, set(table.column("config_id").to_pylist())


def stored_status(out: Path, task: Task, save_requests: bool, digest: str | None = None) -> str:
    """DONE when ``task``'s stored result is complete and sound: its row file reads, holds one row
    with the task's config id, and (``save_requests``) both detail files read, hold only that id,
    and the requests file has the row's request count. MISSING when there is no row file, STALE
    when ``digest`` is given and the row was computed from other inputs (a changed trace file),
    BAD otherwise (STALE and BAD are recomputed and replaced)."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    rp = row_path(out, task.config_id)
    if rp.is_dir() or rp.is_symlink() and not rp.exists():
        return BAD
    if not rp.exists():
        return MISSING
    ids = _config_ids(rp)
    if ids is None or ids != (1, {task.config_id}):
        return BAD
    if digest is not None and stored_digest(rp) != digest:
        return STALE
    if not save_requests:
        return DONE
    req_p, occ_p = _detail_paths(out, task.config_id)
    req, occ = _config_ids(req_p), _config_ids(occ_p)
    if req is None or occ is None or req[1] - {task.config_id} or occ[1] - {task.config_id}:
        return MISSING if not req_p.exists() or not occ_p.exists() else BAD
    try:
        expected = pq.read_table(rp, columns=["requests"]).column("requests")[0].as_py()
    except Exception:  # noqa: BLE001 - a row of an older layout without the count: trust the ids
        expected = None
    return BAD if expected is not None and req[0] != expected else DONE


def is_done(out: Path, task: Task, save_requests: bool, digest: str | None = None) -> bool:
    return stored_status(out, task, save_requests, digest) == DONE


def _sound(path: Path, config_id: str, rows: int) -> bool:
    """Whether ``path`` already holds exactly what would be written: ``rows`` rows of ``config_id``."""
    ids = _config_ids(path) if path.is_file() else None
    return ids is not None and ids[0] == rows and ids[1] <= {config_id}


def _clear(path: Path) -> None:
    """A folder or dangling link where a result file goes (a resume folder edited by hand) is
    refused in one line rather than a traceback from the rename."""
    if path.is_dir() and not path.is_symlink():
        raise UsageError(f"{path} is a folder where the sweep keeps a result file: move it away and rerun")


def check_layout(out: Path, tasks: Iterable[Task]) -> None:
    """Refuses, before any configuration runs, a results folder whose entries have the wrong kind:
    a folder where a row or detail file goes, a file where a detail folder goes."""
    out = Path(out)
    if not out.is_dir():
        return
    for d in (REQUESTS_DIR, OCCUPANCY_DIR):
        if (out / d).exists() and not (out / d).is_dir():
            raise UsageError(f"{out / d} is a file where the sweep keeps a folder: move it away and rerun")
    # a parquet file of one's own there is read as a row by report, plot and the closing table: the
    # sweep ran every configuration, then stopped at it ("... is not a row of marconi sweep")
    foreign = [f for f in row_files(out) if not re.fullmatch(r"[0-9a-f]{20}", f.stem)]
    if foreign:
        raise UsageError(
            f"{foreign[0]} is not a row of `marconi sweep`, and report, plot and the sweep's table read every "
            f"parquet file in {out}: move it out, or give another --out"
        )
    for task in tasks:
        for p in (row_path(out, task.config_id), *_detail_paths(out, task.config_id)):
            _clear(p)


def write_result(out: Path, task: Task, result: dict, digest: str | None = None) -> None:
    """Details first, the row last: the row file marks the configuration complete. A sound file of
    an earlier attempt is kept as it is (written once) unless the stored row was computed from
    other inputs (``digest``, recorded in the row); an unsound one is replaced (atomically)."""
    import pandas as pd  # noqa: PLC0415 - pandas is slow to import; only writers need it

    rp = row_path(out, task.config_id)
    for p in (rp, *_detail_paths(out, task.config_id)):
        _clear(p)
    for d in (REQUESTS_DIR, OCCUPANCY_DIR):
        if (Path(out) / d).exists() and not (Path(out) / d).is_dir():
            raise UsageError(f"{Path(out) / d} is a file where the sweep keeps a folder: move it away and rerun")
    stale = digest is not None and rp.is_file() and stored_digest(rp) != digest
    req_p, occ_p = _detail_paths(out, task.config_id)
    for df, p in ((result["requests"], req_p), (result["occupancy"], occ_p)):
        if df is not None and (stale or not _sound(p, task.config_id, len(df))):
            df = df.copy()
            df.insert(0, "config_id", task.config_id)
            _atomic_parquet(df, p)
    row = dict(result["row"])
    if digest is not None:
        row[DIGEST_COLUMN] = digest
    if stale or not _sound(rp, task.config_id, 1):
        _atomic_parquet(pd.DataFrame([row]), rp)


# ---------------------------------------------------------------------------------- reading


def row_files(out: str | os.PathLike) -> list[Path]:
    """Finished row files (temp files of running writers start with '.')."""
    return sorted(p for p in Path(out).glob("*.parquet") if not p.name.startswith("."))


def summary_kind(folder: str | os.PathLike) -> str | None:
    """What wrote the folder's summary.json: "run" (`marconi run --out`: a list of rows), "replay"
    (`marconi replay --out`: settings and summary), "other", or None without one."""
    import json  # noqa: PLC0415

    f = Path(folder) / "summary.json"
    if not f.is_file():
        return None
    try:
        d = json.loads(f.read_text())
    except (OSError, ValueError):
        return "other"
    if isinstance(d, dict) and {"settings", "summary"} <= set(d):
        return "replay"
    return "run" if isinstance(d, list) and all(isinstance(r, dict) and "token_hit_rate" in r for r in d) else "other"


def replay_folder_words(folder: str | os.PathLike, isnt: str) -> str:
    """What to do with a `marconi replay --out` folder given to report or plot (``isnt``: what the
    command wanted)."""
    command = f"marconi plot {shlex.quote(str(folder))} --kind replay"  # as it pastes: a space quoted
    return f"{folder} holds a `marconi replay --out` result, not {isnt}: `{command}` draws it"


def advise_folder_words(folder: str | os.PathLike, isnt: str) -> str:
    """What a `marconi advise --out` folder given to report or plot holds ("" where it is no such
    folder; ``isnt``: what the command wanted): it said "no results in" the folder."""
    f = Path(folder)
    if not ((f / "advice.json").is_file() or (f / "study.journal").is_file()):
        return ""
    if not (f / "advice.json").is_file():  # an interrupted study: it named an advice.json that is not there
        return (
            f"{folder} holds a `marconi advise` study, not {isnt}, and no recommendation yet (no advice.json: "
            "the study was stopped); rerun the same `marconi advise --out` to finish it"
        )
    return (
        f"{folder} holds a `marconi advise` study, not {isnt}: its recommendation is {f / 'advice.json'} "
        "(rerun the same `marconi advise --out` to print it again)"
    )


#: row files from which reading a folder shows a progress bar (on a terminal): about 9 ms a file,
#: so a 40,000-configuration sweep's table and `report` were minutes with nothing on screen
MANY_ROWS = 500


def load_results(out: str | os.PathLike, progress: bool | None = None):
    """All rows of a results folder as one DataFrame (columns unioned across files). ``progress``:
    a bar on stderr while the files are read; None = on a terminal, from ``MANY_ROWS`` files."""
    import pandas as pd  # noqa: PLC0415 - pandas is slow to import; only readers need it

    files = row_files(out)
    if not files and advise_folder_words(out, ""):
        raise UsageError(advise_folder_words(out, "the rows of `marconi sweep`"))
    if not files:
        raise UsageError(f"no results in {out} (expected <config_id>.parquet files from `marconi sweep`)")
    if (Path(out) / "summary.json").is_file() and not any(f.stem.isalnum() and len(f.stem) == 20 for f in files):
        if summary_kind(out) == "replay":  # `marconi report` prints no replay: the plot of its kind
            raise UsageError(replay_folder_words(out, "the rows of `marconi sweep`"))
        raise UsageError(
            f"{out} holds the results of `marconi run` / `replay` (summary.json), not the rows of `marconi sweep`: "
            f"`marconi report {shlex.quote(str(out))}` prints them"
        )
    frames = [_read(f) for f in _reading(files, progress)]
    for f, df in zip(files, frames):
        missing = [c for c in ROW_COLUMNS if c not in df.columns]
        if missing:
            raise UsageError(
                f"{f} is not a row of `marconi sweep` (no {', '.join(missing)} column): move it out of {out}"
            )
    return pd.concat(frames, ignore_index=True, sort=False)


def _reading(files: list, progress: bool | None):
    """``files``, with a bar on stderr while they are read (``load_results``' ``progress``)."""
    import sys  # noqa: PLC0415

    if progress is None:
        progress = len(files) >= MANY_ROWS and sys.stderr.isatty()
    if not progress:
        return files
    from tqdm import tqdm  # noqa: PLC0415 - only a long read shows it

    return tqdm(files, desc="reading rows", unit="row", leave=False, file=sys.stderr)


def _read(path: Path):
    """One results file; a corrupt or foreign one is a one-line UsageError naming it."""
    import pandas as pd

    try:
        with open(path, "rb") as f:  # a handle: pyarrow opens only UTF-8 names (a folder renamed by hand)
            return pd.read_parquet(f)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... for a bad file
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise UsageError(
            f"cannot read results file {path}: {first} (delete it and rerun the sweep to recompute it)"
        ) from None


class NoRecords(UsageError):
    """A sweep saved no per-request / occupancy records (it ran without --save-requests)."""


def load_details(out: str | os.PathLike, kind: str = "requests", config_ids: Iterable[str] | None = None):
    """Per-request (``kind="requests"``) or occupancy records of the given configurations."""
    import pandas as pd  # noqa: PLC0415 - pandas is slow to import; only readers need it

    folder = Path(out) / (REQUESTS_DIR if kind == "requests" else OCCUPANCY_DIR)
    if config_ids is None:
        files = row_files(folder)
    else:
        wanted = [folder / f"{c}.parquet" for c in dict.fromkeys(config_ids)]
        files = [f for f in wanted if f.exists()]
        if files and len(files) < len(wanted):  # drawn without them, a variant's curve went missing unsaid
            raise NoRecords(
                f"{len(wanted) - len(files)} of {len(wanted)} configurations have no {kind} records in {folder} "
                "(rows written without --save-requests): rerun the same sweep with --save-requests to add them, "
                "or leave those rows out with --where"
            )
    if not files:
        raise NoRecords(f"no {kind} records in {folder}: rerun the sweep with --save-requests")
    return pd.concat([_read(f) for f in files], ignore_index=True)


def is_nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)
