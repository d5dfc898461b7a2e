"""Trace loaders, tokenization and arrival synthesis: everything that produces a ``Trace``.

Entry point: ``load_trace(spec, TraceOptions(...))`` (see ``traces.registry`` for the specs).
"""

from traces.base import Request, Trace, TraceError
from traces.registry import TraceOptions, load_trace

__all__ = ["Request", "Trace", "TraceError", "TraceOptions", "load_trace"]
