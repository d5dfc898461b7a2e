"""User-facing errors: the CLI prints their message on one line and exits with code 2."""

from __future__ import annotations

from policies.base import PolicyError
from traces.base import TraceError


class UsageError(ValueError):
    """Bad flags or impossible settings (unknown model, capacity below one checkpoint...)."""


#: every error that is the user's to fix (bad flags, bad trace, bad policy): one line, exit code 2
USER_ERRORS = (UsageError, TraceError, PolicyError)
