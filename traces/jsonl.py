"""Line-by-line reading of JSONL trace files with file:line error reporting."""

from __future__ import annotations

import io
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

from traces.base import RowProblem, TraceError, compression, open_binary, require_file

__all__ = [
    "JsonlReader",
    "RowProblem",
    "require",
    "require_int",
    "require_length",
    "require_int_list",
    "require_time",
    "INT64_MAX",
]

INT64_MAX = 2**63 - 1


#: files of this size or more show a progress bar while read (with ``progress``): 10^6 Mooncake rows
#: are ~100 MB and took 15-18 s with nothing on the screen
PROGRESS_BYTES = 32 << 20
#: text bytes a gzip trace holds per byte of file, about (Mooncake's conversation trace: 3.8)
GZIP_RATIO = 4


class JsonlReader:
    """Iterates ``(line_no, object)`` over a JSONL file (``.gz`` allowed), skipping blank lines.

    Bad JSON and every ``RowProblem`` passed to ``bad()`` stop with ``TraceError`` naming the file
    and line, or, with ``skip_bad_rows``, are counted in ``skipped``.
    """

    def __init__(self, path: str | Path, skip_bad_rows: bool = False, what: str = "trace", progress: bool = False):
        self.path = require_file(path, what)
        self.what = what
        self.skip_bad_rows = skip_bad_rows
        self.skipped = 0
        # a progress bar on stderr (bytes read) for a file of PROGRESS_BYTES or more of text: a gzip
        # file holds about GZIP_RATIO times its size (a 26 MB .gz of 100 MB of rows read for 15 s unseen)
        size = self.path.stat().st_size if progress else 0
        if progress and compression(self.path) == "gzip":
            size *= GZIP_RATIO
        self.progress = progress and size >= PROGRESS_BYTES

    def where(self, line_no: int) -> str:
        return f"{self.path}:{line_no}"

    def _format_hint(self, line: str) -> str:
        """What the file is instead, said with row 1's error: a JSON array, or a CSV (comma-separated
        values, a header of names): a trace file is JSON Lines."""
        text = line.strip()
        lines = f"a {self.what} trace is JSON Lines (one JSON object a line)"
        if text.startswith("["):
            return f"; the file is a JSON array: {lines}"
        if text == "{":  # `json.dump(row, f, indent=2)`: an object spread over lines
            return f"; the file is pretty-printed JSON (an object over several lines): {lines}, e.g. `jq -c . FILE`"
        if not text.startswith("{") and ("," in text or "\t" in text):
            return f"; the file looks like CSV: {lines}"
        return ""

    def bad(self, line_no: int, msg: str) -> None:
        if not self.skip_bad_rows:
            raise TraceError(f"{self.where(line_no)}: {msg}")
        self.skipped += 1

    def __iter__(self) -> Iterator[tuple[int, object]]:
        gz = compression(self.path) == "gzip"  # by its first bytes, not its name
        bar = None
        if self.progress:
            from tqdm import tqdm  # noqa: PLC0415 - only for a large file

            # the size read is of the text, the file's of the compressed bytes
            total = None if gz else self.path.stat().st_size
            bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"reading {self.path.name}", leave=False)
        try:
            # utf-8-sig: a byte-order mark (what Windows tools write first) is no part of row 1
            with io.TextIOWrapper(open_binary(self.path), encoding="utf-8-sig", errors="replace") as f:
                done = 0
                first = True  # the first line with text: a CSV or a JSON array is said to be one
                for line_no, line in enumerate(f, 1):
                    if bar is not None:
                        done += len(line)
                        if not line_no % 20_000:
                            bar.update(done - bar.n)
                    if not line.strip():
                        continue
                    hint, first = (self._format_hint(line) if first else ""), False
                    try:  # without its newline: an error at the line's end names its column there
                        obj = json.loads(line.rstrip("\r\n"))
                    except json.JSONDecodeError as exc:
                        self.bad(line_no, f"bad JSON: {exc.msg} (column {exc.colno}){hint}{_cut(line)}")
                        continue
                    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, deep nesting
                        self.bad(line_no, f"bad JSON: {str(exc).splitlines()[0] or type(exc).__name__}")
                        continue
                    if not isinstance(obj, dict):
                        self.bad(line_no, f"row is not a JSON object{hint}")
                        continue
                    yield line_no, obj
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"cannot read {self.path}: {exc}") from exc
        finally:
            if bar is not None:
                bar.close()


def _cut(line: str) -> str:
    """The hint for a bad last line with no newline after it: a file cut short (a download or a
    ``head -c`` that stopped inside a row)."""
    if line.endswith(("\n", "\r")):
        return ""
    return "; the file's last line, with no newline after it: the file is cut short? (--skip-bad-rows leaves it out)"


def require(row: dict, name: str, kind=(int, float)):
    if name not in row:
        raise RowProblem(f"missing field {name!r}")
    v = row[name]
    if kind is not None and (not isinstance(v, kind) or isinstance(v, bool)):
        raise RowProblem(f"field {name!r} has the wrong type ({type(v).__name__})")
    return v


def require_int(row: dict, name: str, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> int:
    """An integer field within [lo, hi] (by default: what a 64-bit integer holds)."""
    v = require(row, name, int)
    if not lo <= v <= hi:
        raise RowProblem(f"{name} {_short(v)} out of range {_range(lo, hi)}")
    return v


def require_length(row: dict, name: str) -> int:
    v = require(row, name, int)
    if v < 0:
        raise RowProblem(f"negative {name} {_short(v)}")
    if v > INT64_MAX:
        raise RowProblem(f"{name} {_short(v)} out of range {_range(0, INT64_MAX)}")
    return v


def require_time(row: dict, name: str) -> int | float:
    """A timestamp: a finite number (JSON's NaN / Infinity and integers beyond a float refused)."""
    v = require(row, name)
    try:
        finite = math.isfinite(v)
    except OverflowError:
        finite = False
    if not finite:
        raise RowProblem(f"{name} {_short(v)} is not a finite number")
    return v


def require_int_list(row: dict, name: str, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> list:
    """A list of integers, each within [lo, hi]."""
    v = require(row, name, list)
    for x in v:
        if not isinstance(x, int) or isinstance(x, bool):
            raise RowProblem(f"field {name!r} must be a list of integers")
        if not lo <= x <= hi:
            raise RowProblem(f"{name} holds {_short(x)}, out of range {_range(lo, hi)}")
    return v


def _short(v) -> str:
    """A number for an error message (a 10^30 id stays readable)."""
    if isinstance(v, int) and abs(v) >= 10**15:
        return f"{v:.3e}" if abs(v) < 10**300 else f"an integer of {v.bit_length()} bits"
    return repr(v)


def _range(lo: int, hi: int) -> str:
    names = {INT64_MAX: "2^63-1", -INT64_MAX - 1: "-2^63", 2**31 - 1: "2^31-1"}
    return f"[{names.get(lo, lo)}, {names.get(hi, hi)}]"
