"""`ngcx render` and `ngcx catalog ls` parsed without typer: the calls users and scripts make most.

Why: hpccm renders a recipe in ~0.07 s; `ngcx render` spent ~0.03 s importing typer and, since
typer 0.29, ~0.07 s more on pydantic, which typer loads to coerce any option value
(bench/results/cli.json: the what-if rows). Issue 13 asks for no slower than hpccm, and the
catalog cache (ngcx.catalog.cache) already made the work itself cheap; the parser was the cost.

Why it cannot drift from the typer commands: it takes only the command lines it fully
understands (the command's own arguments and options, each given once, no value that looks like
an option, no `--help`) and runs them through the same functions typer's commands call
(render.render_command, catalog.list_releases). Anything else returns False and goes to typer,
so every help text and usage error stays typer's own. tests/commands/test_fastpath.py runs command
lines through both paths and compares what the user sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Command:
    """What one command accepts: its arguments in order, its options (parameter name, converter) and flags."""

    words: tuple[str, ...]
    run: Callable[..., None]
    arguments: tuple[str, ...] = ()
    options: dict[str, tuple[str, Callable[[str], Any]]] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)


def _render(**params: Any) -> None:
    from .render import render_command

    render_command(**params)


def _catalog_ls(**params: Any) -> None:
    from .catalog import list_releases

    list_releases(**params)


# Must list exactly what the typer commands declare (commands/render.py and commands/catalog.py register):
# tests/commands/test_fastpath.py compares these tables with the registered click parameters.
COMMANDS = (
    Command(("render",), _render, arguments=("ref",),
            options={"-o": ("output", Path), "--output": ("output", Path), "--variant": ("variant", str),
                     "--base": ("base", str), "--context": ("context", Path), "--catalog": ("catalog_file", Path)}),
    Command(("catalog", "ls"), _catalog_ls,
            options={"--catalog": ("catalog_file", Path)}, flags={"--json": "json_out"}),
)


def parse(command: Command, args: Sequence[str]) -> dict[str, Any] | None:
    """The parameters of `args` (what follows the command's words), or None for anything unusual."""
    params: dict[str, Any] = {}
    positional: list[str] = []
    tokens = list(args)
    while tokens:
        token = tokens.pop(0)
        if not token or not token.startswith("-"):
            positional.append(token)
            continue
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in command.flags and not eq:
            dest, convert = command.flags[name], bool
            value = "1"
        elif name in command.options:
            dest, convert = command.options[name]
            if not eq:
                if not tokens:
                    return None
                value = tokens.pop(0)
        else:
            return None  # --help, `--`, an unknown or combined option: typer says what it means
        if dest in params or not value or value.startswith("-"):
            return None
        params[dest] = convert(value)
    if len(positional) != len(command.arguments) or any(not p for p in positional):
        return None
    params.update(zip(command.arguments, positional, strict=True))
    return params


def run(argv: Sequence[str]) -> bool:
    """Run `argv` here when it is a command line this module fully understands; False = ask typer."""
    for command in COMMANDS:
        if tuple(argv[: len(command.words)]) == command.words:
            params = parse(command, argv[len(command.words):])
            if params is None:
                return False
            command.run(**params)
            return True
    return False
