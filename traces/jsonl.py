"""Line-by-line reading of JSONL trace files with file:line error reporting."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from traces.base import TraceError


class RowProblem(ValueError):
    """A malformed row: becomes ``TraceError('FILE:LINE: message')`` or a skipped row."""


class JsonlReader:
    """Iterates ``(line_no, object)`` over a JSONL file (``.gz`` allowed), skipping blank lines.

    Bad JSON and every ``RowProblem`` passed to ``bad()`` stop with ``TraceError`` naming the file
    and line, or, with ``skip_bad_rows``, are counted in ``skipped``.
    """

    def __init__(self, path: str | Path, skip_bad_rows: bool = False, what: str = "trace"):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise TraceError(f"{what} file not found: {self.path}")
        self.skip_bad_rows = skip_bad_rows
        self.skipped = 0

    def bad(self, line_no: int, msg: str) -> None:
        if not self.skip_bad_rows:
            raise TraceError(f"{self.path}:{line_no}: {msg}")
        self.skipped += 1

    def __iter__(self) -> Iterator[tuple[int, object]]:
        opener = gzip.open if self.path.suffix == ".gz" else open
        try:
            with opener(self.path, "rt", encoding="utf-8", errors="replace") as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        self.bad(line_no, f"bad JSON: {exc.msg} (column {exc.colno})")
                        continue
                    if not isinstance(obj, dict):
                        self.bad(line_no, "row is not a JSON object")
                        continue
                    yield line_no, obj
        except (OSError, EOFError) as exc:
            raise TraceError(f"cannot read {self.path}: {exc}") from exc


def require(row: dict, name: str, kind=(int, float)):
    if name not in row:
        raise RowProblem(f"missing field {name!r}")
    v = row[name]
    if kind is not None and (not isinstance(v, kind) or isinstance(v, bool)):
        raise RowProblem(f"field {name!r} has the wrong type ({type(v).__name__})")
    return v


def require_length(row: dict, name: str) -> int:
    v = require(row, name, int)
    if v < 0:
        raise RowProblem(f"negative {name} {v}")
    return v


def require_int_list(row: dict, name: str) -> list:
    v = require(row, name, list)
    if any(not isinstance(x, int) or isinstance(x, bool) for x in v):
        raise RowProblem(f"field {name!r} must be a list of integers")
    return v
