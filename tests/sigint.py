"""Start a child process as a shell would for Ctrl-C tests: SIGINT at its default disposition and
unblocked, whatever the test process inherited or changed (a child inherits an ignored or blocked
SIGINT across exec, and would then never see the test's Ctrl-C)."""

import signal


def as_from_a_shell() -> None:
    """``preexec_fn`` for ``subprocess.Popen``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
