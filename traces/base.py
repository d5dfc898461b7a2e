"""The request table every loader produces and the simulator consumes.

A trace is a list of requests grouped into sessions. Token sequences are numpy integer arrays of
*symbols*: token ids for tokenized traces (``block_tokens == 1``) or prefix-block hash ids for
hash-block traces (Mooncake: 512 tokens per symbol, Bailian: 16). Two requests share a prefix of
k symbols iff their first k symbols are equal; the cache tree never needs to know which kind it
holds.

Symbols are int32 when every symbol of the trace fits (any tokenizer's vocabulary does: half the
memory of int64), else int64; all arrays of one trace share one dtype, because the cache tree
compares raw bytes.

Timing comes in one of two shapes:
- closed loop (``Trace.closed_loop``): sessions start on a schedule chosen at simulation time
  (``traces.arrivals``); each turn arrives ``think_time`` seconds after the previous turn's
  response finished (for the first turn: after the session start);
- open loop: every request carries an absolute ``arrival`` in seconds (Mooncake, Bailian,
  marconi-jsonl ``ts``).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SYMBOL_DTYPE = np.int64  # the wide symbol type (hash ids that do not fit int32)
COMPACT_DTYPE = np.int32  # what a trace uses when all of its symbols fit
_I32 = np.iinfo(np.int32)


class TraceError(ValueError):
    """Bad trace input: reported to the user as one line (CLI exit code 2)."""


class RowProblem(ValueError):
    """A malformed row: becomes ``TraceError('FILE:LINE: message')`` or a skipped row."""


@dataclass(slots=True)
class Request:
    session_id: int
    turn: int
    input_tokens: np.ndarray  # symbols of the prompt (full history for chat turns)
    output_tokens: np.ndarray  # symbols of the response
    think_time: float = 0.0  # closed loop: seconds after the previous response (or session start)
    arrival: float | None = None  # open loop: absolute arrival time in seconds
    input_len: int = -1  # tokens; -1 means len(input_tokens) * block_tokens
    output_len: int = -1  # tokens; -1 means len(output_tokens) * block_tokens
    request_id: int = -1  # position in Trace.requests, set by Trace

    def n_input_tokens(self, block_tokens: int) -> int:
        return self.input_len if self.input_len >= 0 else len(self.input_tokens) * block_tokens

    def n_output_tokens(self, block_tokens: int) -> int:
        return self.output_len if self.output_len >= 0 else len(self.output_tokens) * block_tokens


@dataclass
class Trace:
    name: str
    requests: list[Request]
    block_tokens: int = 1  # tokens per symbol
    closed_loop: bool = True
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.requests:
            raise TraceError(f"trace {self.name!r} has no requests (after filtering)")
        if self.block_tokens < 1:
            raise TraceError(f"trace {self.name!r}: block_tokens must be >= 1")
        # int32 when every array already is (packed traces), else int64 throughout, as before
        dtype = (
            COMPACT_DTYPE
            if all(
                r.input_tokens.dtype == COMPACT_DTYPE and r.output_tokens.dtype == COMPACT_DTYPE for r in self.requests
            )
            else SYMBOL_DTYPE
        )
        for i, r in enumerate(self.requests):
            r.request_id = i
            if r.input_tokens.dtype != dtype:
                r.input_tokens = np.asarray(r.input_tokens, dtype=dtype)
            if r.output_tokens.dtype != dtype:
                r.output_tokens = np.asarray(r.output_tokens, dtype=dtype)
            if not self.closed_loop and r.arrival is None:
                raise TraceError(f"trace {self.name!r}: open-loop request {i} has no arrival time")

    @property
    def symbol_dtype(self) -> np.dtype:
        return self.requests[0].input_tokens.dtype

    @property
    def n_sessions(self) -> int:
        return len({r.session_id for r in self.requests})

    def sessions(self) -> dict[int, list[Request]]:
        """Requests of each session in turn order (sessions in order of first appearance)."""
        out: dict[int, list[Request]] = {}
        for r in self.requests:
            out.setdefault(r.session_id, []).append(r)
        for reqs in out.values():
            reqs.sort(key=lambda r: r.turn)
        return out

    def input_tokens_total(self) -> int:
        return sum(r.n_input_tokens(self.block_tokens) for r in self.requests)

    def output_tokens_total(self) -> int:
        return sum(r.n_output_tokens(self.block_tokens) for r in self.requests)


def joined(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` then ``b``, as ``np.concatenate((a, b))`` gives it, but a read-only view of their
    buffer, not a copy, where ``b`` starts where ``a`` ends in one array: a request's prompt and
    reply in the trace's buffer (a chat turn, a hash-block row). Every cache of a run (the live one
    and the duel tuner's nine shadows) kept its own copy of each request's sequence: ten copies of
    the trace, which took a 155 MB spelled-out Mooncake slice to 2 GB."""
    if not len(b):
        return a
    owner = a.base
    if (
        owner is not None
        and b.base is owner
        and a.dtype == b.dtype
        and a.ndim == b.ndim == 1
        and a.flags.c_contiguous
        and b.flags.c_contiguous
        and a.ctypes.data + a.nbytes == b.ctypes.data
    ):
        # both lie in ``owner``'s memory and meet: the span from a's start to b's end is in it too
        if owner.ndim == 1 and owner.dtype == a.dtype and owner.flags.c_contiguous:
            # a slice of the owner: no per-call wrapper object as ``as_strided`` leaves (~0.7 KB a
            # request kept by the miss ledger, more than a copy of a short hash-block row)
            start = (a.ctypes.data - owner.ctypes.data) // a.itemsize
            view = owner[start : start + len(a) + len(b)]
            view.flags.writeable = False
            return view
        view = np.lib.stride_tricks.as_strided(a, shape=(len(a) + len(b),), strides=(a.itemsize,), writeable=False)
        return view
    return np.concatenate((a, b))


def as_symbols(tokens) -> np.ndarray:
    return np.asarray(tokens, dtype=SYMBOL_DTYPE)


def compact_dtype(lo: int, hi: int) -> type:
    """int32 when every symbol in [lo, hi] fits, else int64."""
    return COMPACT_DTYPE if _I32.min <= lo and hi <= _I32.max else SYMBOL_DTYPE


def compact(symbols: np.ndarray) -> np.ndarray:
    """``symbols`` as int32 when they all fit (a copy only when the dtype changes)."""
    if symbols.dtype == COMPACT_DTYPE or not len(symbols):
        return symbols.astype(COMPACT_DTYPE, copy=False)
    return symbols.astype(compact_dtype(int(symbols.min()), int(symbols.max())), copy=False)


def require_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path when it is a readable file, else TraceError saying what is wrong."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise TraceError(f"{what} path is a directory, not a file: {p}")
    # a trace is read more than once (its identity for the caches, then its rows), which a pipe
    # (stdin, `<(zcat trace.gz)`) cannot do
    pipe = "save it to a file and give that path; a .gz file is read as it is"
    if not p.exists():
        if str(path) == "-":
            raise TraceError(f"{what}: a trace is read from a file, not from stdin ('-'): {pipe}")
        raise TraceError(f"{what} file not found: {p}")
    if not p.is_file():
        raise TraceError(f"{what} path is not a regular file: {p} (a pipe or device: {pipe})")
    return p


#: the first bytes of the compressed formats a trace file may come in (gzip is read as it is)
_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\xfd7zXZ\x00": "xz",
    b"BZh": "bzip2",
    b"PK\x03\x04": "zip",
}


def compression(path: Path) -> str | None:
    """The compression of a trace file by its first bytes, whatever its name ends in (a gzip file
    named ``trace.jsonl`` is gzip; a plain file named ``trace.jsonl.gz`` is plain): 'gzip',
    another format's name, or None for an uncompressed file."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def open_binary(path: Path):
    """A binary stream of a trace file's content: a gzip file (told by its first bytes, not its
    name) decompressed; another compression is one TraceError saying to decompress it first."""
    kind = compression(path)
    if kind is not None and kind != "gzip":
        raise TraceError(
            f"cannot read {path}: it is {kind}-compressed; decompress it first (a gzip file is read as it is)"
        )
    if kind == "gzip":
        import gzip  # noqa: PLC0415 - only for a gzip file

        f = gzip.open(path, "rb")
    else:
        f = open(path, "rb")
    try:
        head = f.peek(4)[:4]
    except (OSError, EOFError, zlib.error):  # a corrupt .gz: said by the reader, where it reads
        head = b""
    wide = _wide_text(head)
    if wide:
        f.close()
        windows = " (what Windows PowerShell's '>' writes)" if wide.startswith("UTF-16") else ""
        raise TraceError(
            f"cannot read {path}: it is {wide} text{windows}; convert it to UTF-8, e.g. iconv -f {wide.lower()} -t utf-8"
        )
    return f


def _wide_text(head: bytes) -> str | None:
    """'UTF-16' / 'UTF-32' when the first bytes are a byte-order mark of either, 'UTF-16LE' for JSON's
    first character followed by NUL bytes (UTF-16 without a mark); None for UTF-8 and anything else."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    if len(head) >= 4 and head[:1] in (b"{", b"[") and head[1:2] == b"\x00" and head[3:4] == b"\x00":
        return "UTF-16LE"
    return None


# --------------------------------------------------------------------------------------------
# Limits that protect memory from a malformed or hostile trace

DEFAULT_MAX_REQUEST_TOKENS = 10_000_000


def available_memory() -> int:
    """Bytes of memory available to a new allocation (physical memory when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 1 << 40


#: the memory a run of a trace takes, in multiples of the trace's symbol buffer: the buffer, and
#: about as much again for the caches' keys, their lookup memos and the records (measured: 1.3x
#: the buffer with sglang, 1.7x with marconi's duel tuner, on 1,500 spelled Mooncake rows)
RUN_MEMORY_FACTOR = 2


class SizeBudget:
    """Checks, row by row while a trace is read, that one request stays within
    ``max_request_tokens`` and that the symbol buffer the trace will need, and a run of it beside
    (``RUN_MEMORY_FACTOR`` times the buffer), fit in memory, so a row claiming 10^12 tokens is an
    error naming its row instead of an out-of-memory kill (a 50 MB Mooncake file spelled out with
    --hash-block-tokens, 16.5 GB of symbols, was built in 20 GB of memory available, and its run
    then filled the 24 GB machine)."""

    def __init__(
        self,
        max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
        memory_bytes: int | None = None,
        bytes_per_symbol: int = 8,
    ):
        self.max_request_tokens = max_request_tokens
        self.memory_bytes = available_memory() if memory_bytes is None else memory_bytes
        self.bytes_per_symbol = bytes_per_symbol
        self.symbols = 0

    def check_request(self, n_tokens: int) -> None:
        """RowProblem when one request's ``n_tokens`` (input + output) is over the limit."""
        if n_tokens > self.max_request_tokens:
            raise RowProblem(
                f"{n_tokens:,} tokens in one request, more than the limit of "
                f"{self.max_request_tokens:,} (max_request_tokens)"
            )

    def add(self, n_symbols: int, where: str) -> None:
        """Counts ``n_symbols`` more; TraceError naming ``where`` (FILE:LINE) once the trace's
        symbol buffer would not fit in the memory available (fatal even when skipping bad rows)."""
        need = (self.symbols + n_symbols) * self.bytes_per_symbol
        if need * RUN_MEMORY_FACTOR > self.memory_bytes:
            raise TraceError(
                f"{where}: the trace would need {_size(need)} for its symbols up to this row, and a run "
                f"of it about as much again ({_size(need * RUN_MEMORY_FACTOR)} in all), more than the "
                f"{_size(self.memory_bytes)} of memory available"
            )
        self.symbols += n_symbols


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes:,} bytes"
