"""Compact storage of a trace: one symbol buffer plus per-request offsets.

Chat turns of one session are views into one per-session chain (turn k+1's input starts with turn
k's input + output), so a 30K-request trace holds each session's tokens once. The same arrays are
what the on-disk cache stores (``save_packed`` / ``load_packed``), so a cached load is one
``np.load`` and a list of views.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traces.base import SYMBOL_DTYPE, Request, Trace, TraceError, compact, compact_dtype

# Bump when the rendering, filtering or storage of any cached trace changes.
FORMAT_VERSION = 1  # (a file without the checksums its header now records is rebuilt once, said so)


@dataclass
class PackedTrace:
    name: str
    tokens: np.ndarray  # symbol buffer: int32 when every symbol fits (always for token ids), else int64
    session_id: np.ndarray
    turn: np.ndarray
    in_off: np.ndarray
    in_len: np.ndarray
    out_off: np.ndarray
    out_len: np.ndarray
    think_time: np.ndarray
    arrival: np.ndarray  # NaN where absent
    input_len: np.ndarray  # tokens (-1: symbols * block_tokens)
    output_len: np.ndarray
    block_tokens: int = 1
    closed_loop: bool = True
    meta: dict = field(default_factory=dict)

    def to_trace(self) -> Trace:
        buf = compact(self.tokens)
        reqs = []
        arr = self.arrival
        for i in range(len(self.session_id)):
            io, il, oo, ol = int(self.in_off[i]), int(self.in_len[i]), int(self.out_off[i]), int(self.out_len[i])
            a = float(arr[i])
            reqs.append(
                Request(
                    session_id=int(self.session_id[i]),
                    turn=int(self.turn[i]),
                    input_tokens=buf[io : io + il],
                    output_tokens=buf[oo : oo + ol],
                    think_time=float(self.think_time[i]),
                    arrival=None if np.isnan(a) else a,
                    input_len=int(self.input_len[i]),
                    output_len=int(self.output_len[i]),
                )
            )
        return Trace(
            self.name, reqs, block_tokens=self.block_tokens, closed_loop=self.closed_loop, meta=dict(self.meta)
        )


class _Chain:
    """A growable symbol array (capacity doubling) holding one session's input + output chain."""

    __slots__ = ("data", "n")

    def __init__(self, first: np.ndarray):
        self.data = np.array(first, dtype=SYMBOL_DTYPE)
        self.n = len(first)

    def extends(self, inp: np.ndarray) -> bool:
        return len(inp) >= self.n and np.array_equal(inp[: self.n], self.data[: self.n])

    def append(self, arr: np.ndarray) -> None:
        need = self.n + len(arr)
        if need > len(self.data):
            grown = np.empty(max(need, 2 * len(self.data)), dtype=SYMBOL_DTYPE)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : need] = arr
        self.n = need

    def final(self) -> np.ndarray:
        return self.data[: self.n]


class TraceBuilder:
    """Accumulates requests into a PackedTrace, keeping the order in which they are added.

    ``add_chain`` takes a session already laid out as one buffer (chat rendering);
    ``add_request`` takes one request at a time (any order across sessions) and stores it in its
    session's current chain when its input extends that chain's input + output, else it starts a
    new chain for the session.
    """

    def __init__(self, name: str, block_tokens: int = 1, closed_loop: bool = True):
        self.name = name
        self.block_tokens = block_tokens
        self.closed_loop = closed_loop
        self._chunks: list = []  # np.ndarray or _Chain
        self._rows: list[tuple] = []  # (session, turn, chunk, in_rel, in_len, out_rel, out_len, think, arrival, il, ol)
        self._open: dict[int, int] = {}  # session -> index of its current _Chain in _chunks
        self.meta: dict = {}
        self._n_symbols = 0

    @property
    def n_requests(self) -> int:
        return len(self._rows)

    @property
    def n_symbols(self) -> int:
        """Symbols stored so far (what ``build`` will concatenate)."""
        return self._n_symbols

    def add_chain(self, buffer: np.ndarray, session_id: int, turns: list[tuple]) -> None:
        """``turns``: tuples ``(turn, input_end, output_end, think_time, arrival, input_len,
        output_len)`` with input = buffer[:input_end], output = buffer[input_end:output_end]."""
        c = len(self._chunks)
        self._chunks.append(np.asarray(buffer))
        self._n_symbols += len(buffer)
        for turn, ie, oe, think, arrival, il, ol in turns:
            self._rows.append(
                (session_id, turn, c, 0, ie, ie, oe - ie, think, np.nan if arrival is None else arrival, il, ol)
            )

    def add_request(
        self,
        session_id: int,
        turn: int,
        inp,
        out,
        think: float = 0.0,
        arrival: float | None = None,
        input_len: int = -1,
        output_len: int = -1,
    ) -> None:
        inp = np.asarray(inp, dtype=SYMBOL_DTYPE)
        out = np.asarray(out, dtype=SYMBOL_DTYPE)
        ci = self._open.get(session_id)
        chain = self._chunks[ci] if ci is not None else None
        if chain is not None and chain.extends(inp):
            self._n_symbols += len(inp) - chain.n
            chain.append(inp[chain.n :])
        else:
            chain = _Chain(inp)
            ci = len(self._chunks)
            self._chunks.append(chain)
            self._open[session_id] = ci
            self._n_symbols += len(inp)
        n = len(inp)
        chain.append(out)
        self._n_symbols += len(out)
        self._rows.append(
            (
                session_id,
                turn,
                ci,
                0,
                n,
                n,
                len(out),
                think,
                np.nan if arrival is None else arrival,
                input_len,
                output_len,
            )
        )

    def add_session(self, session_id: int, requests: list[tuple]) -> None:
        """``requests``: tuples ``(turn, input, output, think_time, arrival, input_len, output_len)``."""
        for turn, inp, out, think, arrival, il, ol in requests:
            self.add_request(session_id, turn, inp, out, think, arrival, il, ol)

    def build(self) -> PackedTrace:
        if not self._rows:
            raise TraceError(f"trace {self.name!r} has no requests (after filtering)")
        arrays = [c.final() if isinstance(c, _Chain) else c for c in self._chunks]
        bases = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=bases[1:])
        nonempty = [a for a in arrays if len(a)]
        lo = min((int(a.min()) for a in nonempty), default=0)
        hi = max((int(a.max()) for a in nonempty), default=0)
        # straight into int32 when every symbol fits: no int64 copy of the whole trace on the way
        tokens = np.concatenate(arrays, dtype=compact_dtype(lo, hi)) if arrays else np.zeros(0, compact_dtype(0, 0))
        self._chunks = []
        cols = list(zip(*self._rows))
        i64 = lambda c: np.asarray(c, dtype=np.int64)  # noqa: E731
        base = bases[i64(cols[2])]
        return PackedTrace(
            name=self.name,
            tokens=tokens,
            session_id=i64(cols[0]),
            turn=i64(cols[1]),
            in_off=base + i64(cols[3]),
            in_len=i64(cols[4]),
            out_off=base + i64(cols[5]),
            out_len=i64(cols[6]),
            think_time=np.asarray(cols[7], dtype=np.float64),
            arrival=np.asarray(cols[8], dtype=np.float64),
            input_len=i64(cols[9]),
            output_len=i64(cols[10]),
            block_tokens=self.block_tokens,
            closed_loop=self.closed_loop,
            meta=dict(self.meta),
        )


# --------------------------------------------------------------------------------------------
# Disk cache

_ARRAYS = (
    "session_id",
    "turn",
    "in_off",
    "in_len",
    "out_off",
    "out_len",
    "think_time",
    "arrival",
    "input_len",
    "output_len",
)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("MARCONI_CACHE_DIR")
    if env:
        return Path(env).expanduser() / "traces"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "marconi-sim" / "traces"


def cache_explicit(cache_dir: str | os.PathLike | None = None) -> str | None:
    """How the user chose the cache folder (``MARCONI_CACHE_DIR=...`` or the cache_dir option), or
    None for the default folder."""
    if cache_dir:
        return f"cache folder {cache_dir}"
    env = os.environ.get("MARCONI_CACHE_DIR")
    return f"MARCONI_CACHE_DIR={env}" if env else None


def cache_unwritable(root: Path) -> str | None:
    """Why traces cannot be cached under ``root`` (created here when missing), or None."""
    above = next((p for p in [root, *root.parents] if p.exists()), None)
    if above is not None and not above.is_dir():
        return f"{above} is a file, not a folder"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as exc:
        return f"cannot write to {root} ({exc.strerror or exc})"
    return None


def cache_key(parts: dict) -> str:
    blob = json.dumps({**parts, "format_version": FORMAT_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


#: bytes read from a file for its content sample (``content_sample``): SAMPLE_BLOCKS blocks of SAMPLE_BYTES
SAMPLE_BYTES = 1 << 16
SAMPLE_BLOCKS = 16


def content_sample(path: Path, size: int | None = None) -> str:
    """A cheap digest of a file's content: its first and last blocks and blocks spread evenly in
    between (``SAMPLE_BLOCKS`` x ``SAMPLE_BYTES``, the whole file when smaller), with its size. A
    file edited in place (same size, mtime set back) changes it unless every change falls between
    the samples; with the size and mtime in the identity beside it, stale results need both."""
    h = hashlib.sha256()
    size = Path(path).stat().st_size if size is None else size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        if size <= SAMPLE_BYTES * SAMPLE_BLOCKS:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            step = (size - SAMPLE_BYTES) / (SAMPLE_BLOCKS - 1)
            for i in range(SAMPLE_BLOCKS):
                f.seek(int(i * step))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def file_identity(path: Path) -> dict:
    """Identity of a local source file or folder for cache keys and stored results (path, size,
    mtime and a content sample of each file)."""
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise TraceError(f"trace file not found: {p}")
    try:
        if p.is_dir():
            files = sorted(q for q in p.rglob("*") if q.is_file())
            h = hashlib.sha256()
            for q in files:
                st = q.stat()
                h.update(f"{q.relative_to(p)}:{st.st_size}:{st.st_mtime_ns}:{content_sample(q, st.st_size)}\n".encode())
            return {"path": str(p), "tree": h.hexdigest()[:16]}
        st = p.stat()
        return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample": content_sample(p, st.st_size)}
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from None


def inputs_digest(paths, *extra) -> str:
    """One digest of the files and folders ``paths`` (``file_identity`` of each) and ``extra``
    values (options, a code version): what a stored result was computed from."""
    parts = [file_identity(Path(p)) for p in paths]
    blob = json.dumps([parts, list(extra)], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _checks(tokens: np.ndarray, arrays: dict) -> dict:
    """What a cache file's header records of its arrays, to be verified on load: their lengths and
    a CRC-32 of each (a file cut, or arrays replaced, is rebuilt, never trusted)."""
    out = {}
    for name, a in (("tokens", tokens), *arrays.items()):
        a = np.ascontiguousarray(a)
        out[name] = [int(a.size), zlib.crc32(a.view(np.uint8).reshape(-1)) if a.size else 0]
    return out


def check_packed(packed: "PackedTrace") -> str | None:
    """Why the arrays of ``packed`` cannot be a trace (None when they can): row arrays of one
    length, offsets and lengths within the symbol buffer."""
    n = len(packed.session_id)
    if any(len(getattr(packed, k)) != n for k in _ARRAYS):
        return "its row arrays differ in length"
    total = len(packed.tokens)
    for off, ln in (("in_off", "in_len"), ("out_off", "out_len")):
        o, l_ = getattr(packed, off), getattr(packed, ln)
        if n and (o.min() < 0 or l_.min() < 0 or (o + l_).max() > total):
            return f"{off}/{ln} point outside its {total:,} symbols"
    return None


def save_packed(packed: PackedTrace, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = packed.tokens
    if len(tokens) and tokens.min() >= np.iinfo(np.int32).min and tokens.max() <= np.iinfo(np.int32).max:
        tokens = tokens.astype(np.int32)
    header = {
        "name": packed.name,
        "block_tokens": packed.block_tokens,
        "closed_loop": packed.closed_loop,
        "meta": packed.meta,
        "format_version": FORMAT_VERSION,
        "checks": _checks(tokens, {k: getattr(packed, k) for k in _ARRAYS}),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(
                f,
                tokens=tokens,
                header=np.asarray(json.dumps(header, default=str)),
                **{k: getattr(packed, k) for k in _ARRAYS},
            )
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from the other users
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class CacheProblem(Exception):
    """A cache file that fails its own check (truncated, corrupted, arrays cut): it is rebuilt."""


def load_packed(path: Path, strict: bool = False) -> PackedTrace | None:
    """The cached trace at ``path``, or None when absent or of another format version (it is then
    rebuilt). A file that fails its check (not a zip, truncated, arrays that differ from the
    lengths and CRCs its header records) is None too, or ``CacheProblem`` with ``strict``."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            if header.get("format_version") != FORMAT_VERSION:
                return None
            arrays = {k: z[k] for k in _ARRAYS}
            tokens = z["tokens"]
            if tokens.dtype not in (np.int32, SYMBOL_DTYPE):
                raise CacheProblem(f"symbols of dtype {tokens.dtype}")
            checks = header.get("checks")
            if checks is None:
                raise CacheProblem("written by an older version, without checksums")
            if _checks(tokens, arrays) != checks:
                raise CacheProblem("arrays differ from the lengths and checksums its header records")
            packed = PackedTrace(
                name=header["name"],
                tokens=tokens,
                block_tokens=header["block_tokens"],
                closed_loop=header["closed_loop"],
                meta=header["meta"],
                **arrays,
            )
            why = check_packed(packed)
            if why:
                raise CacheProblem(why)
    except CacheProblem:
        if strict:
            raise
        return None
    except Exception as exc:  # noqa: BLE001 - BadZipFile, OSError, ValueError, KeyError, EOFError, zlib.error...
        if strict:
            raise CacheProblem(
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
            ) from None
        return None
    return packed
