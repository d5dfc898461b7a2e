"""LMSys-Chat-1M (``lmsys`` from the Hugging Face hub, ``lmsys:PATH`` for local parquet, or the same
rows as a JSON array or JSON Lines: ``.json`` / ``.jsonl``, gzip allowed).

Rows: ``conversation_id, model, conversation [{role, content}], turn, language, ...``. Selection
(the Marconi paper's): conversations with ``turn >= min_rounds`` (default 10), drop sessions whose
text is more than ``max_non_ascii`` (default 50%) non-ASCII characters, the first ``sessions`` in
file order (0 = all). A session stops at its first turn whose history + input + output exceeds
``max_tokens`` (32,768; output counted, unlike ShareGPT). Rendering and think times: see
``traces.chat``.

The hub dataset is gated: accept its licence on huggingface.co and put a token in ``HF_TOKEN``.
It is read in streaming mode, and local parquet is read batch by batch, so only the selected
conversations are ever held in memory; tokenization runs on all cores (``traces.chat``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from traces.base import TraceError
from traces.hub import stream_dataset
from traces.chat import build_chat_trace
from traces.packing import PackedTrace, file_identity

HUB_ID = "lmsys/lmsys-chat-1m"
COLUMNS = ("conversation_id", "conversation", "turn")


def _json_suffix(q: Path) -> bool:
    """A JSON or JSON Lines file by its name (``.json``, ``.jsonl``, either with ``.gz``)."""
    suffixes = [s.lower() for s in q.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return bool(suffixes) and suffixes[-1] in (".json", ".jsonl")


def parquet_files(path: str) -> list[Path]:
    """The files of ``lmsys:PATH``: the file, or a folder's ``.parquet`` files (else its ``.json`` /
    ``.jsonl`` files), in path order."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(q for q in p.rglob("*.parquet") if q.is_file())
        if not files:  # the rows saved as JSON (datasets' to_json writes JSON Lines)
            files = sorted(
                q
                for q in p.rglob("*")
                if q.is_file()
                and _json_suffix(q)
                and q.name not in ("dataset_info.json", "state.json", "dataset_dict.json")  # save_to_disk's
                and not any(part.startswith(".") for part in q.relative_to(p).parts)  # .cache/, .git/
            )
        if files:
            return files
        raise TraceError(f"no .parquet (or .json / .jsonl) files under {p}")
    raise TraceError(f"LMSys path not found: {p}")


def _is_parquet(f: Path) -> bool:
    """A parquet file: named ``.parquet``, or starting with ``PAR1`` whatever its name ends in."""
    if f.suffix.lower() == ".parquet":
        return True
    try:
        with open(f, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError as exc:
        raise TraceError(f"cannot read {f}: {exc.strerror or exc}") from None


def _iter_json(f: Path, skip_bad_rows: bool, stats: dict) -> Iterator[tuple[str, str, dict]]:
    """The rows of a JSON array or JSON Lines file (gzip allowed): ``(FILE:LINE, FILE#ROW, record)``;
    lines that are not JSON stop the load, or with ``skip_bad_rows`` are counted in ``stats``."""
    import zlib  # noqa: PLC0415

    from traces.base import open_binary  # noqa: PLC0415
    from traces.sharegpt import JsonRecordReader  # noqa: PLC0415 - the same JSON array / JSON Lines reader

    with open_binary(f) as fh:
        reader = JsonRecordReader(fh, str(f), skip_bad_rows)
        try:
            for row, (rec, line) in enumerate(reader):
                if not isinstance(rec, dict):
                    rec = {"conversation": None}  # said as the row's error: not a list of messages
                yield f"{f}:{line}", f"{f}#{row}", rec
        except (OSError, EOFError, zlib.error) as exc:  # a corrupt or cut .gz stream
            raise TraceError(f"cannot read {f}: {exc}") from None
        finally:
            stats["skipped_rows"] += reader.skipped  # lines that are not JSON: rows, skipped
            stats["rows"] += reader.skipped
        if reader.truncated:
            raise TraceError(f"{f}: the file ends inside a record (cut short?)")


def source_identity(path: str | None) -> dict:
    if path is None:
        return {"hub": HUB_ID}
    parquet_files(path)
    return file_identity(Path(path).expanduser())


def _iter_local(path: str, skip_bad_rows: bool, stats: dict) -> Iterator[tuple[str, str, dict]]:
    """``(where, default id, record)`` of every row of the parquet or JSON files of ``path``."""
    import pyarrow.parquet as pq

    for f in parquet_files(path):
        if not _is_parquet(f):  # JSON / JSON Lines
            yield from _iter_json(f, skip_bad_rows, stats)
            continue
        try:
            pf = pq.ParquetFile(f)
            names = set(pf.schema_arrow.names)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
            raise _unreadable(f, exc) from exc
        missing = [c for c in ("conversation",) if c not in names]
        if missing:
            raise TraceError(f"{f}: missing column {missing[0]!r} (columns: {', '.join(sorted(names))})")
        cols = [c for c in COLUMNS if c in names]
        row = 0
        batches = pf.iter_batches(columns=cols, batch_size=1024)
        while True:
            try:  # a corrupt page shows only when its batch is read
                batch = next(batches, None)
                recs = batch.to_pylist() if batch is not None else None
            except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError, ArrowInvalid, UnicodeDecodeError...
                raise _unreadable(f, exc, row) from exc
            if recs is None:
                break
            for rec in recs:
                yield f"{f}: row {row}", f"{f}#{row}", rec
                row += 1


def _unreadable(f: Path, exc: Exception, row: int | None = None) -> TraceError:
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    if row is None:
        return TraceError(f"cannot read parquet file {f}: {first}")
    return TraceError(f"{f}: row {row}: cannot read the file from here on: {first}")


def _iter_hub() -> Iterator[tuple[str, str, dict]]:
    hint = "it is gated: accept its licence and set HF_TOKEN, or download it and use --trace lmsys:PATH"
    for row, rec in stream_dataset(HUB_ID, "train", what="LMSys-Chat-1M", local_hint=hint):
        yield f"{HUB_ID}: row {row}", f"{HUB_ID}#{row}", rec


def non_ascii_fraction(texts: list[str]) -> float:
    total = sum(len(t) for t in texts)
    if not total:
        return 0.0
    ascii_chars = sum(len(t.encode("ascii", "ignore")) for t in texts)
    return 1.0 - ascii_chars / total


def _messages(rec: dict) -> list[tuple[str, str]]:
    conv = rec.get("conversation")
    if not isinstance(conv, list):
        if "conversation" not in rec and isinstance(rec.get("conversations"), list):
            raise ValueError("no 'conversation', but ShareGPT's 'conversations': --trace sharegpt:PATH reads it")
        raise ValueError("'conversation' is not a list of messages")
    out = []
    for k, m in enumerate(conv):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {k} lacks a string 'role' or 'content'")
        out.append((m["role"], m["content"]))
    return out


def iter_selected(path: str | None, options, stats: dict) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    stats.update(skipped_rows=0, rows=0, non_ascii_dropped=0, most_rounds=0)
    source = _iter_hub() if path is None else _iter_local(path, options.skip_bad_rows, stats)
    kept = 0
    for where, default_id, rec in source:
        stats["rows"] += 1
        try:
            msgs = _messages(rec)
            turn = rec.get("turn")
            if turn is None:
                turn = len(msgs) // 2
            if not isinstance(turn, int) or turn < 0:
                raise ValueError(f"bad turn {turn!r}")
        except ValueError as exc:
            if not options.skip_bad_rows:
                raise TraceError(f"{where}: {exc}") from None
            stats["skipped_rows"] += 1
            continue
        stats["most_rounds"] = max(stats["most_rounds"], turn)
        if turn < options.min_rounds:
            continue
        if non_ascii_fraction([t for _, t in msgs]) > options.max_non_ascii:
            stats["non_ascii_dropped"] += 1
            continue
        yield str(rec.get("conversation_id", default_id)), msgs
        kept += 1
        if options.sessions and kept >= options.sessions:
            return


def _none_selected(stats: dict, options) -> str:
    """Why no conversation passed the selection: none read, too few rounds, mostly non-ASCII."""
    skipped = stats.get("skipped_rows", 0)
    bad = f" ({skipped:,} bad rows skipped)" if skipped else ""
    read = stats.get("rows", 0) - skipped
    if read <= 0:
        return f"the source holds no conversation{bad}"
    short = read - stats.get("non_ascii_dropped", 0)
    if short:  # the rounds are checked first: these had too few
        return (
            f"none of its {read:,} conversations has {options.min_rounds} or more rounds and at most "
            f"{options.max_non_ascii:.0%} non-ASCII text ({short:,} have fewer rounds, the most "
            f"{stats.get('most_rounds', 0)}: lower --min-rounds){bad}"
        )
    return f"each of its {read:,} conversations is more than {options.max_non_ascii:.0%} non-ASCII text{bad}"


def load_packed(path: str | None, options) -> PackedTrace:
    stats: dict = {}
    name = "lmsys" if path is None else f"lmsys:{path}"
    packed = build_chat_trace(
        name,
        iter_selected(path, options, stats),
        options.tokenizer,
        max_total_tokens=options.max_tokens,
        words_per_minute=options.words_per_minute,
        num_proc=options.num_proc,
        expected=options.sessions or None,
        progress=options.progress,
        none_selected=lambda: _none_selected(stats, options),
    )
    stats.pop("most_rounds", None)
    packed.meta.update(
        source=name,
        min_rounds=options.min_rounds,
        sessions_requested=options.sessions,
        max_non_ascii=options.max_non_ascii,
        think_time=f"typing at {options.words_per_minute:g} wpm; first turn 0",
        **stats,
    )
    return packed
