"""The ``marconi`` command line: parse -> config -> library -> print.

Every command is listed in ``COMMANDS`` (a module per command group, each with ``register(main)``);
a module that fails to import fails the CLI loudly. ``Main`` is the one place that turns a user
error (``sim.errors.USER_ERRORS``: bad flags, bad trace, bad policy) into one line on stderr and
exit code 2. Library code never imports this package or click.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def _interrupted_while_starting(signum, frame) -> None:
    """Ctrl-C (or SIGTERM, SIGHUP) while the CLI's modules load (a second or two): the same one
    line and exit code as later, not a traceback from inside an import. A sweep's worker process
    being prepared (it imports the ``marconi`` script again) dies of the signal silently, as it
    would without this handler."""
    mp = sys.modules.get("multiprocessing")
    if mp is not None and getattr(mp.current_process(), "_inheriting", False):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    sys.stderr.write("Interrupted.\n" if signum == signal.SIGINT else f"Interrupted ({signal.Signals(signum).name}).\n")
    os._exit(128 + signum)


_MAIN_THREAD = threading.current_thread() is threading.main_thread()  # only it may set handlers
_STARTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_DEFAULTS = {s: signal.signal(s, _interrupted_while_starting) for s in _STARTING} if _MAIN_THREAD else {}

import click  # noqa: E402 - after the handler above

from kernels import cli as kernels_cli  # noqa: E402
from sim.cli import advise, models, plot, policies, replay, report, run, sweep, traces  # noqa: E402
from sim.cli.options import refuse_repeated_options  # noqa: E402
from sim.errors import USER_ERRORS, interrupted, stop_exit_code, stop_message, stop_signals_as_interrupts  # noqa: E402


#: click >= 8.2 raises this for a command group typed without a command (8.1 shows the help itself)
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _tolerant_output() -> None:
    """stdout and stderr in an encoding without the outputs' characters (α in a variant's label,
    ≥ in messages: ``PYTHONIOENCODING=latin-1``, a Latin-1 locale) write them as ``\\u03b1``
    escapes: the table printed up to the first α, then a UnicodeEncodeError traceback."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding not in ("utf-8", "utf8") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change: left as it is
                pass


class WholeCommandHelp(click.Group):
    """A group whose help lists each command with the whole first paragraph of its help, wrapped
    (click cuts it at 45 characters or so: `marconi traces --help` showed "...hit-rate upper...")."""

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            text = cmd.short_help or (cmd.help or "").split("\n\n")[0]
            rows.append((name, " ".join(text.replace("\b", "").split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class Main(WholeCommandHelp):
    """Turns our known user errors, and click's own usage errors of a command (a bad type, a
    missing value), into one clear line and exit code 2 (no traceback), and Ctrl-C into one line
    and exit code 130 (128 + SIGINT, what shells report); SIGTERM and SIGHUP are handled as Ctrl-C
    is (``sim.errors.Terminated``), exit codes 143 and 129."""

    def invoke(self, ctx):
        _tolerant_output()
        with stop_signals_as_interrupts():
            return self._invoke(ctx)

    def _invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(2)
        except _NO_ARGS_IS_HELP as exc:  # a command group alone: its help, as click shows it
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:  # click's own (a bad type, a missing value): one line as well
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            click.echo(f"Error: {' '.join(exc.format_message().split())}{where}", err=True)
            sys.exit(2)
        except BaseException as exc:
            if not interrupted(exc) or isinstance(exc, SystemExit):
                raise
            click.echo(stop_message(), err=True)
            sys.exit(stop_exit_code())

    #: the command groups made by ``main.group`` (traces, kernels) list their commands as main does
    group_class = WholeCommandHelp


@click.group(cls=Main)
@click.version_option(package_name="marconi-sim")
def main() -> None:
    """Simulate prefix caching of recurrent state for hybrid LLMs (Marconi and baselines)."""


#: command groups in registration order (``sweep`` derives its options from ``run``)
COMMANDS = (run, models, policies, traces, kernels_cli, sweep, report, plot, replay, advise)
for _module in COMMANDS:
    _module.register(main)
refuse_repeated_options(main)  # every command: an option of one value given twice is one line
if _MAIN_THREAD:  # loaded: Ctrl-C is a KeyboardInterrupt again (Main turns it into one line)
    for _sig, _handler in _DEFAULTS.items():
        signal.signal(_sig, _handler)
