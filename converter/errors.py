"""Errors kept as data and turned into one clear line (plus details) at the CLI boundary."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def one_line(text) -> str:
    """`text` with every control character (newline, escape, ...) and lone surrogate written as a
    visible escape, so that a key or a path from a file can never start a line of its own, move
    the cursor or fail to print."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))


def is_text(value: str) -> bool:
    """Whether a string is Unicode text that can be written out (no lone surrogates, which JSON
    escapes and pickles can carry but no UTF-8 file can hold)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def quoted(text) -> str:
    """A key, name or path from an input, in quotes, safe to print (see one_line)."""
    return "'" + one_line(text) + "'"


MAX_SIZE = 1 << 62  # bytes: past any disk or memory; a size option's bound


def shown_value(text) -> str:
    """An option's value quoted for a message, cut to 40 characters (with its length) where longer."""
    text = str(text)
    return quoted(text) if len(text) <= 40 else f"{quoted(text[:40])}... ({len(text)} characters)"


class PortError(Exception):
    exit_code = 2

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = list(details or [])

    def render(self) -> str:
        """The message and one indented line per detail; text that came from an input cannot
        add lines of its own."""
        return "\n".join([one_line(self.message)] + [f"  {one_line(d)}" for d in self.details])


class UserError(PortError):
    """Bad input: the message says what is wrong and what to do. Exit code 2, and one line whatever
    the count of details: the first SHOWN of them follow the message, with how many more there are."""

    SHOWN = 3

    def render(self) -> str:
        if not self.details:
            return one_line(self.message)
        shown = "; ".join(one_line(d)[:300] for d in self.details[:self.SHOWN])
        more = f" (and {len(self.details) - self.SHOWN} more)" if len(self.details) > self.SHOWN else ""
        joint = " " if self.message.rstrip().endswith(":") else ": "
        return f"{one_line(self.message)}{joint}{shown}{more}"


class CheckFailed(PortError):
    """The result was produced but does not match what was asked. Exit code 1."""

    exit_code = 1
