"""Streaming a Hugging Face hub dataset: token from the environment, one-line errors."""

from __future__ import annotations

import os
from collections.abc import Iterator

from traces.base import TraceError


def stream_dataset(name: str, split: str, *, what: str, local_hint: str) -> Iterator[tuple[int, dict]]:
    """Rows of ``name`` (``split``) streamed with ``datasets.load_dataset``; ``HF_TOKEN`` (or
    ``HUGGING_FACE_HUB_TOKEN``) is passed for gated datasets. Any failure (no package, no
    network, no access) becomes a ``TraceError`` naming ``what`` and how to load it locally."""
    try:
        import datasets
    except ImportError as exc:
        raise TraceError(f"{what} from the hub needs the 'datasets' package: pip install 'marconi-sim[lmsys]' "
                         f"(or {local_hint})") from exc
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    try:
        ds = datasets.load_dataset(name, split=split, streaming=True, token=token)
        for row, rec in enumerate(ds):
            yield row, rec
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - network, auth and dataset errors alike
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise TraceError(f"cannot load {name} from the Hugging Face hub ({type(exc).__name__}: {first}); "
                         f"{local_hint}") from exc
