"""Errors kept as data and turned into one clear line at the CLI boundary."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message says what is wrong and what to do. Exit code 2."""

    exit_code = 2

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = list(details or [])

    def render(self) -> str:
        lines = [self.message]
        lines.extend(f"  {d}" for d in self.details)
        return "\n".join(lines)


class CheckFailed(Exception):
    """The result was produced but does not match what was asked. Exit code 1."""

    exit_code = 1

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = list(details or [])

    def render(self) -> str:
        lines = [self.message]
        lines.extend(f"  {d}" for d in self.details)
        return "\n".join(lines)
