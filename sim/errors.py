"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class UsageError(ValueError):
    """Bad flags or impossible settings (unknown policy, capacity below one checkpoint...)."""
