"""Trace loaders, tokenization and arrival synthesis: everything that produces a ``Trace``."""

from traces.base import Request, Trace, TraceError

__all__ = ["Request", "Trace", "TraceError"]
