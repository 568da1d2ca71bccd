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
    """Print a table: drawn here when it is plain text that fits, by rich otherwise.

    Why two ways: importing rich and laying out its Table costs ~0.03 s, a sixth of `ngcx catalog
    ls` (bench/results/cli.json), for a grid rich would draw the same way. plain_table() draws
    rich's grid (box.HEAVY_HEAD, padding 1, title centred) for ASCII cells without markup, and
    returns None for anything else (wide or markup-looking text, a table wider than the terminal),
    which rich then wraps and measures as before. tests/core/test_output.py compares the two.
    """
    width = max(100, _term_width())
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    utf8 = (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"  # else rich picks ASCII boxes
    text = plain_table(title, list(columns), cells, width, styled=_styled()) if utf8 else None
    if text is not None:
        sys.stdout.write(text)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        t.add_column(col)
    for row in cells:
        t.add_row(*row)
    Console(width=width).print(t)


def plain_table(title: str | None, columns: list[str], rows: list[list[str]], width: int,
                styled: bool = False) -> str | None:
    """rich's grid for plain cells, or None where only rich lays the table out right."""
    texts = [*columns, *(c for row in rows for c in row), title or ""]
    if not rows or any(len(row) != len(columns) for row in rows):
        return None
    if any(not t.isascii() or not t.isprintable() or "[" in t for t in texts):  # wide, control or markup
        return None
    widths = [max(len(c), *(len(row[i]) for row in rows)) + 2 for i, c in enumerate(columns)]
    total = sum(widths) + len(widths) + 1
    if total > width or (title and len(title) > total):
        return None

    def line(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * w for w in widths) + right + "\n"

    def cells(row: list[str], bar: str, style: str = "") -> str:
        body = bar.join(" " + (_style(c, style) if style else c) + " " * (w - 1 - len(c))
                        for c, w in zip(row, widths, strict=True))
        return bar + body + bar + "\n"

    head = ""
    if title:
        pad = total - len(title)
        head = " " * (pad // 2) + (_style(title, "3") if styled else title) + " " * (pad - pad // 2) + "\n"
    return (head + line("┏", "━", "┳", "┓") + cells(columns, "┃", "1" if styled else "")
            + line("┡", "━", "╇", "┩") + "".join(cells(row, "│") for row in rows) + line("└", "─", "┴", "┘"))


def _style(text: str, sgr: str) -> str:
    """An SGR style (1 bold, 3 italic) around text, as rich shows a title and a header on a terminal."""
    return f"\x1b[{sgr}m{text}\x1b[0m"


def _styled() -> bool:
    """Styles only for a person at a terminal that takes them (rich's own rule, NO_COLOR included)."""
    import os

    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


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
