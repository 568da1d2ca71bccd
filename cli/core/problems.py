"""Typed problems: what is wrong with a file the user wrote, where, and how to fix it.

Why a type instead of strings: the same problem is printed as one line on a terminal, as an
object under `--json`, and counted by tests by its `rule`. Every validator that collects more
than one violation (the catalog's rules, `ngcx.yaml`) returns a list of these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .errors import UserError


@dataclass(frozen=True)
class Problem:
    """One violation. where = file[:line], field = dotted path inside it ("" for the whole file)."""

    where: str
    field: str
    rule: str
    message: str
    hint: str = ""

    def line(self) -> str:
        head = f"{self.where}: {self.field}: " if self.field else f"{self.where}: "
        text = head + self.message + (f" ({self.hint})" if self.hint else "")
        return one_line(text)

    def as_dict(self) -> dict[str, str]:
        """The fields plus the rendered line, for --json (scripts filter on rule, people read line)."""
        return {**asdict(self), "line": self.line()}


def one_line(text: str) -> str:
    """Escape newlines, tabs and other control characters so a problem stays on its line."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ProblemsFound(UserError):
    """A file broke one or more rules: the first problem as the error line, all of them kept."""

    def __init__(self, what: str, problems: list[Problem], check_command: str = "") -> None:
        self.problems = problems
        more = ""
        if len(problems) > 1:
            more = f" (+{len(problems) - 1} more" + (f": run `{check_command}`)" if check_command else ")")
        super().__init__(f"{what} is invalid: {problems[0].line()}{more}")


def schema_problems(exc: Any, source: str, lines: dict[tuple, int], unknown_key_hint: str) -> list[Problem]:
    """A pydantic ValidationError on a YAML file the user wrote -> one Problem per error, at file:line.

    lines maps key paths to line numbers (core/yamlio.py load_mapping_with_lines). YAML reads an
    unquoted 25.10 as the number 25.1: that one says so, instead of pydantic's "valid string".
    """
    out = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if p != "[key]")
        field, at = ".".join(str(p) for p in loc), where(source, lines, loc)
        kind, value = err["type"], err.get("input")
        if kind == "extra_forbidden":
            out.append(Problem(at, field, "schema.unknown-key", "unknown key", unknown_key_hint))
        elif kind == "missing":
            out.append(Problem(at, field, "schema.missing", "required key is missing"))
        elif kind == "string_type" and isinstance(value, int | float) and not isinstance(value, bool):
            out.append(Problem(at, field, "schema.number-not-string", f"{value!r} is a number, not a string",
                               'quote it, e.g. "25.10": YAML reads 25.10 as 25.1'))
        else:
            out.append(Problem(at, field, f"schema.{kind}", err["msg"].removeprefix("Value error, ")))
    return out


def where(source: str, lines: dict[tuple, int], loc: tuple) -> str:
    """file:line of the deepest known prefix of loc (just the file when none is known)."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return f"{source}:{lines[loc[:n]]}"
    return source
