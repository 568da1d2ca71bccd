"""User-facing errors: one clear line, exit code 2, never a traceback.

Why a dedicated type: every stage (catalog, render, build, push, deploy) can fail because of
what the user typed or configured; those failures must reach the terminal as one line that says
what is wrong, where, and how to fix it, while real bugs still surface as tracebacks.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix (bad input, missing service, wrong credentials). Exit 2."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        """The single line printed to stderr."""
        return f"{self.message} ({self.hint})" if self.hint else self.message


class CheckFailed(Exception):
    """A verification ran and found a mismatch (e.g. `ngcx test`): exit 1, report already printed."""

    exit_code = 1


class CapacityError(Exception):
    """The cloud has no stock for this type in this zone (NoStock, ZoneNotSupported…): try the next."""

    def __init__(self, code: str, where: str) -> None:
        self.code, self.where = code, where
        super().__init__(f"{code} ({where})")
