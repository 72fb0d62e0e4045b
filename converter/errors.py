"""Errors kept as data and turned into one clear line (plus details) at the CLI boundary."""

from __future__ import annotations


class PortError(Exception):
    exit_code = 2

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = list(details or [])

    def render(self) -> str:
        return "\n".join([self.message] + [f"  {d}" for d in self.details])


class UserError(PortError):
    """Bad input: the message says what is wrong and what to do. Exit code 2."""

    exit_code = 2


class CheckFailed(PortError):
    """The result was produced but does not match what was asked. Exit code 1."""

    exit_code = 1
