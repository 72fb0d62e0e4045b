"""What both commands share at the command line: one line per error and an exit code."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import warnings

import click

from ..errors import PortError, one_line

CONTEXT = {"help_option_names": ["-h", "--help"]}


def say(line: str) -> None:
    """One line to stderr; a name from an input (a rule file's name, a path) cannot start a line
    of its own (see one_line)."""
    from .. import progress
    if not progress.write(one_line(line)):  # above the progress line, where one is drawn
        click.echo(one_line(line), err=True)


class OneLineUsage(click.UsageError):
    """A usage error as one line that says what to do, instead of click's usage block."""

    def __init__(self, message: str, command: str):
        super().__init__(message)
        self.command = command

    def show(self, file=None) -> None:
        click.echo(f"error: {one_line(self.format_message()).rstrip('.')} (see '{self.command} --help')", err=True)


class OneLineCommand(click.Command):
    """A click command whose usage errors (an unknown option, a bad value, a missing argument)
    are one line and exit 2, like every other bad input."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else (info_name or self.name)
            raise OneLineUsage(exc.format_message(), command) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the main thread runs as SIGINT's KeyboardInterrupt is, so that
    the same cleanup runs (staged outputs removed, nothing committed); exit 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def terminations():
    """SIGTERM and SIGHUP raise Terminated while the command runs (in the main thread only, where
    Python runs signal handlers); a second signal during the cleanup is ignored, not raised again
    inside it. The handlers before are put back at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen = []

    def handler(signum, frame):
        if not seen:
            seen.append(signum)
            raise Terminated(signum)
    kept = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, before in kept.items():
            signal.signal(sig, before)


def one_line_errors(func):
    """Bad input becomes one line and exit 2; a failed check exit 1; never a traceback. SIGINT,
    SIGTERM and SIGHUP clean up alike and exit 128 + the signal."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            with terminations(), warnings.catch_warnings():
                # numpy's floating-point warnings (a NaN subtracted, a float32 overflow) are what the report
                # says in its own words; printed, they would add lines to a one-line refusal
                warnings.filterwarnings("ignore", r"(invalid value|overflow|divide by zero) encountered", RuntimeWarning)
                return func(*args, **kwargs)
        except PortError as exc:
            click.echo(f"error: {exc.render()}", err=True)  # escaped by render; details on indented lines
            sys.exit(exc.exit_code)
        except Terminated as exc:
            say(f"terminated ({signal.Signals(exc.signum).name}); nothing was written")
            sys.exit(128 + exc.signum)
        except KeyboardInterrupt:
            say("interrupted; nothing was written")
            sys.exit(130)
        except MemoryError:
            say("error: out of memory; close other programs or convert on a larger machine")
            sys.exit(2)
        except OSError as exc:
            if exc.errno is None:  # not the operating system's: paddle raises OSError for its kernels' errors
                say(f"error: {one_line(exc)}")
            else:
                where = f" ({one_line(exc.filename)})" if exc.filename else ""
                say(f"error: {one_line(exc.strerror or exc)}{where}; check the paths and free disk space")
            sys.exit(2)
        except Exception as exc:  # an internal bug: one line, the traceback only on request
            if os.environ.get("CONVERTER_DEBUG"):
                raise
            say(f"internal error: {type(exc).__name__}: {one_line(exc)} (set CONVERTER_DEBUG=1 for the traceback "
                "and report it)")
            sys.exit(3)

    return wrapper


def progress_shown(quiet: bool) -> bool:
    """A progress bar unless --quiet, and only on a terminal."""
    return not quiet and sys.stderr.isatty()
