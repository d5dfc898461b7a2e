"""User-facing errors: the CLI prints their message on one line and exits with code 2."""

from __future__ import annotations

from policies.base import PolicyError
from traces.base import TraceError


class UsageError(ValueError):
    """Bad flags or impossible settings (unknown model, capacity below one checkpoint...)."""


#: every error that is the user's to fix (bad flags, bad trace, bad policy): one line, exit code 2
USER_ERRORS = (UsageError, TraceError, PolicyError)


def interrupted(exc: BaseException | None) -> bool:
    """A Ctrl-C: a KeyboardInterrupt, or an error raised while one propagated (an interrupt that
    lands while a thread waits on a lock can leave the lock unheld, and its release then raises
    RuntimeError with the interrupt as its context)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__context__
    return False
