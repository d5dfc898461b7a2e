"""User-facing errors: the CLI prints their message on one line and exits with code 2."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

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


# ------------------------------------------------------------------------------- SIGTERM / SIGHUP

#: signals handled as Ctrl-C is (finished work kept, one line), exiting with 128 + the signal
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_STOPPED_BY = [signal.SIGINT]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be (every cleanup that
    handles Ctrl-C handles it); ``signum`` gives the exit code, 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(int(signum))  # args: the number (copies and pickles rebuild it from that)
        self.signum = int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


def note_stop(signum: int) -> None:
    """Records the signal that stops the command (its exit code)."""
    _STOPPED_BY[0] = signum


def stop_exit_code() -> int:
    """128 + the signal that stopped the command: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + int(_STOPPED_BY[0])


def stop_message() -> str:
    """The one line a stopped command prints."""
    signum = _STOPPED_BY[0]
    return "Interrupted." if signum == signal.SIGINT else f"Interrupted ({signal.Signals(signum).name})."


def raise_stop(signum: int, frame=None) -> None:
    """Handler of SIGTERM / SIGHUP: records the signal, ignores further ones (the cleanup a first
    signal starts is not cut short), and raises ``Terminated``."""
    note_stop(signum)
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise Terminated(signum)


@contextmanager
def stop_signals_as_interrupts():
    """SIGTERM and SIGHUP raise ``Terminated`` (a KeyboardInterrupt) in the main thread while the
    block runs; the previous handlers come back after it. Elsewhere (another thread) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STOPPED_BY[0] = signal.SIGINT
    previous = {s: signal.signal(s, raise_stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
