"""Spec of the tables every read command prints (ngcx.core.output.table).

Why compare with rich: a table is drawn by ngcx itself when its cells are plain text that fits
(importing rich costs ~0.03 s of `ngcx catalog ls`, issue 13), and by rich otherwise; a user must
not be able to tell which one drew it. So every table plain_table() draws is checked against what
rich draws for the same input, and every input it declines really needs rich.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from ngcx.core import output

COLUMNS = ["image:release", "CUDA", "note"]
ROWS = [["cuda:24.05", "12.4", ""], ["pytorch:26.03 *", "13.0", "render-only"]]


def rich_table(title: str | None, columns: list[str], rows: list[list[str]], width: int = 100) -> str:
    """What output.table printed before it drew tables itself (and still prints where it declines)."""
    t = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    buf = io.StringIO()
    Console(width=width, file=buf).print(t)
    return buf.getvalue()


@pytest.mark.parametrize(("title", "columns", "rows"), [
    ("ngcx catalog (/work/main/registry.yaml)", COLUMNS, ROWS),       # the shape of `ngcx catalog ls`
    (None, COLUMNS, ROWS),
    ("t", ["a"], [["1"], [""], ["a much longer cell"]]),
    ("odd", ["x", "yyyy"], [["a", "bb"]]),                           # odd padding around the title
    ("even", ["x", "yyyyy"], [["a", "bb"]]),
])
def test_drawn_tables_are_exactly_what_rich_draws(title, columns, rows) -> None:
    mine = output.plain_table(title, columns, rows, 100)
    assert mine is not None
    assert mine == rich_table(title, columns, rows)


@pytest.mark.parametrize(("title", "rows", "why"), [
    ("t", [], "no rows: rich draws the empty grid its own way"),
    ("t", [["a" * 120, "x", "y"]], "wider than the terminal: rich wraps the cells"),
    ("a title much longer than the narrow table it sits on", [["a", "b", "c"]], "rich wraps the title"),
    ("t", [["naïve", "x", "y"]], "non-ASCII: a character's width is not its length"),
    ("t", [["[bold]x[/bold]", "x", "y"]], "rich reads [..] as markup"),
    ("t", [["a\tb", "x", "y"]], "a control character"),
    ("t", [["a", "b"]], "a row shorter than the header"),
])
def test_tables_only_rich_lays_out_right_are_left_to_rich(title, rows, why) -> None:
    assert output.plain_table(title, ["a", "b", "c"] if rows else COLUMNS, rows, 100) is None, why


def test_table_prints_the_same_either_way(capsys) -> None:
    """output.table itself (what commands call), for a table it draws and one it leaves to rich."""
    output.table("ngcx images", COLUMNS, ROWS)
    assert capsys.readouterr().out == rich_table("ngcx images", COLUMNS, ROWS)
    rows = [["naïve", "12.4", None]]
    output.table("ngcx images", COLUMNS, rows)
    assert capsys.readouterr().out == rich_table("ngcx images", COLUMNS, [["naïve", "12.4", ""]])


def test_a_terminal_gets_rich_styles_on_title_and_header() -> None:
    text = output.plain_table("T", ["a"], [["1"]], 100, styled=True)
    assert text is not None
    assert "\x1b[3mT\x1b[0m" in text and "┃ \x1b[1ma\x1b[0m ┃" in text
    assert "\x1b" not in output.plain_table("T", ["a"], [["1"]], 100)
