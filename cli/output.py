"""Terminal output shared by the commands: JSON for machines, rich tables for people, and the
redaction every line goes through that might carry a credential in a URL (pip, BuildKit logs).

rich is imported inside the functions so that `ngcx --help` never pays for it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

CREDENTIALS_IN_URL = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@", re.IGNORECASE)


def emit_json(data: Any) -> None:
    """Print one JSON document (stable key order as given)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a simple table."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    Console(width=max(100, _term_width())).print(t)


def _term_width() -> int:
    import shutil

    return shutil.get_terminal_size((120, 24)).columns


def human_size(n: float | None, places: int = 2) -> str:
    """Decimal units (as `docker images` counts), "-" for an unknown size.

    One helper for every command (there were two); `places=1` keeps the figures that `ngcx base`,
    `ngcx doctor` and `ngcx push` have always printed, the others print 2 places."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.{places}f} {unit}"
        size /= 1000
    return f"{size:.{places}f} GB"


def redact(text: str) -> str:
    """Hide user:password@ in any URL before it reaches a terminal or a log."""
    return CREDENTIALS_IN_URL.sub(r"\g<scheme>***@", text)
