"""What both commands share at the command line: one line per error and an exit code, and
report files written like converted weights (atomic, never clobbering without --force)."""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
import sys

import click

from .errors import PortError, one_line


def say(line: str) -> None:
    """One line to stderr; a name from an input (a rule file's name, a path) cannot start a line
    of its own (see one_line)."""
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


def one_line_errors(func):
    """Bad input becomes one line and exit 2; a failed check exit 1; never a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except PortError as exc:
            click.echo(f"error: {exc.render()}", err=True)  # escaped by render; details on indented lines
            sys.exit(exc.exit_code)
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


def write_output(path: str | None, text: str, force: bool) -> None:
    """A report file, through the same atomic, no-clobber commit as converted weights (the
    caller has checked it with every other output before anything was written)."""
    write_outputs({path: text}, force)


def write_outputs(texts: dict[str | None, str], force: bool) -> None:
    """Report files (path -> text; a None path is skipped) written together: each is written
    and synced before any is given its name, so that a write that fails (a full disk) leaves
    none of them; then they are committed in order, and one that cannot be leaves the later
    ones unwritten."""
    from contextlib import ExitStack

    from .io.atomic import AtomicOutput
    items = [(path, text) for path, text in texts.items() if path]
    with ExitStack() as stack:
        staged = []
        for path, text in reversed(items):  # entered last to first: the stack commits first to last
            output = AtomicOutput(path, force=force)
            stack.enter_context(output).write(text.encode("utf-8"))
            staged.append(output)
        for output in staged:
            output.sync()


def write_json(path: str | None, body: dict, force: bool = False) -> None:
    """Strict JSON: NaN and infinite numbers (a ratio over every budget, an output that is NaN)
    are null, since parsers other than Python's refuse NaN and Infinity; the rows' verdicts say
    what they meant."""
    write_output(path, json_text(body), force)


def json_text(body: dict) -> str:
    return json.dumps(_finite_or_null(body), indent=1, default=str, allow_nan=False) + "\n"


def _finite_or_null(value):
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy's floats too
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value
