"""Streaming a Hugging Face hub dataset: token from the environment, one-line errors, no waiting.

Before ``datasets`` is asked for anything, the hub must be usable: offline mode
(``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) or an endpoint that does not answer within a few
seconds fails at once with one line, instead of the libraries' retries (about 25 s). A local folder
given as the dataset name (a downloaded copy of a hub dataset) needs no hub.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from traces.base import TraceError

PROBE_TIMEOUT = 3.0  # seconds: one HEAD request to the hub endpoint, no retries
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's reading of boolean environment variables


def hub_unusable() -> str | None:
    """Why the hub cannot be reached now (offline mode, or no answer from the endpoint), or None."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in TRUE:
            return f"offline mode ({var}={os.environ[var]})"
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=PROBE_TIMEOUT).close()
    except urllib.error.HTTPError:
        return None  # the hub answered (an error status still means it is reachable)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{endpoint} is unreachable ({reason})"
    return None


def _choose_split(datasets, name: str, token: str | None) -> str:
    """``train`` when the dataset has it, else its only split (e.g. ``train.raw``), else the
    first split named ``train*``."""
    splits = list(datasets.get_dataset_split_names(name, token=token))
    if "train" in splits:
        return "train"
    if len(splits) == 1:
        return splits[0]
    trains = [s for s in splits if s.startswith("train")]
    if trains:
        return trains[0]
    raise TraceError(f"{name} has no 'train' split; name one of {', '.join(splits)} (NAME:SPLIT)")


def stream_dataset(name: str, split: str | None, *, what: str, local_hint: str) -> Iterator[tuple[int, dict]]:
    """Rows of ``name`` (``split``; None: chosen from the dataset's split list) streamed with
    ``datasets.load_dataset``; ``HF_TOKEN`` (or ``HUGGING_FACE_HUB_TOKEN``) is passed for gated
    datasets. Any failure (no package, hub unreachable, no access) becomes a ``TraceError`` naming
    ``what`` and how to load it locally."""
    try:
        import datasets
    except ImportError as exc:
        raise TraceError(
            f"{what} from the hub needs the 'datasets' package: pip install 'marconi-sim[lmsys]' (or {local_hint})"
        ) from exc
    if not Path(name).expanduser().is_dir():
        why = hub_unusable()
        if why:
            raise TraceError(f"cannot load {name} from the Hugging Face hub: {why}; {local_hint}")
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    try:
        if split is None:
            split = _choose_split(datasets, name, token)
        ds = datasets.load_dataset(name, split=split, streaming=True, token=token)
        for row, rec in enumerate(ds):
            yield row, rec
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - network, auth and dataset errors alike
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise TraceError(
            f"cannot load {name} from the Hugging Face hub ({type(exc).__name__}: {first}); {local_hint}"
        ) from exc
