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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traces.base import SYMBOL_DTYPE, Request, Trace, TraceError, compact, compact_dtype

# Bump when the rendering, filtering or storage of any cached trace changes.
FORMAT_VERSION = 1


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


def file_identity(path: Path) -> dict:
    """Identity of a local source file or folder for cache keys (path, size, mtime)."""
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise TraceError(f"trace file not found: {p}")
    if p.is_dir():
        files = sorted(q for q in p.rglob("*") if q.is_file())
        h = hashlib.sha256()
        for q in files:
            st = q.stat()
            h.update(f"{q.relative_to(p)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        return {"path": str(p), "tree": h.hexdigest()[:16]}
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


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
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_packed(path: Path) -> PackedTrace | None:
    """The cached trace at ``path``, or None when absent or unreadable (it is then rebuilt)."""
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
                return None
    except (OSError, ValueError, KeyError):
        return None
    meta = header["meta"]
    return PackedTrace(
        name=header["name"],
        tokens=tokens,
        block_tokens=header["block_tokens"],
        closed_loop=header["closed_loop"],
        meta=meta,
        **arrays,
    )
