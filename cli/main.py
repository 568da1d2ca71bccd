"""The `ngcx` command: a typer app assembled from commands/, one module per command or group.

Start-up must stay fast (`ngcx --help` < 0.3 s, `ngcx render` no slower than hpccm: issue 13):
command modules import only typer and the standard library at module level; catalogs, Jinja2, the
Docker SDK and cloud SDKs are imported inside the command functions that need them. And `ngcx CMD`
imports and registers only the module that owns CMD (COMMAND_OWNERS): the other fourteen modules
cost ~0.05 s of every call and are only needed to list or reject commands (`--help`, no command,
an unknown one), where all of them are registered exactly as before. The plain command lines of
`ngcx render` and `ngcx catalog ls` do not even import typer (commands/fastpath.py): typer 0.29's parser
alone costs more than hpccm's whole render.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from .core.errors import CheckFailed, UserError

if TYPE_CHECKING:
    import typer

# Each module of commands/ exposes register(app: typer.Typer). Order = order in `ngcx --help`.
COMMAND_MODULES = (
    "init", "catalog", "render", "base", "build", "lock", "test", "push", "verify", "login", "run",
    "sbom", "deploy", "deployments", "hosts", "images", "dashboard", "doctor",
)

# Command (or group) name as typed -> the module whose register() adds it. Static so that picking
# the module costs no import; tests/commands/test_cli.py checks it against what every module registers.
COMMAND_OWNERS = {
    "init": "init", "catalog": "catalog", "render": "render", "base": "base", "build": "build",
    "lock": "lock", "test": "test", "push": "push", "verify": "verify", "login": "login", "logout": "login",
    "run": "run",
    "deploy": "deploy", "deployments": "deployments", "hosts": "hosts", "images": "images", "dashboard": "dashboard",
    "doctor": "doctor", "sbom": "sbom",
}

def stage_modules(names: Iterable[str] | None = None) -> Iterator[tuple[str, ModuleType]]:
    """The command modules of commands/ (all, in `ngcx --help` order, unless `names` says which). A missing one is an
    ImportError, never a silent gap: a deleted command module must fail `ngcx --help` and the CLI tests
    (issue 8)."""
    for name in COMMAND_MODULES if names is None else names:
        yield name, importlib.import_module(f".commands.{name}", __package__)


def modules_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The modules a command line needs: the owner of its first word when that is a known command,
    else all of them (`--help`, no arguments, an unknown command: click lists or rejects commands
    from what is registered, so its help and its "No such command" need every one)."""
    owner = COMMAND_OWNERS.get(argv[0]) if argv else None
    return (owner,) if owner else COMMAND_MODULES


def build_app(modules: Sequence[str] | None = None) -> typer.Typer:
    """Assemble the CLI from the stage modules (all by default, in `ngcx --help` order)."""
    import typer

    app = typer.Typer(
        name="ngcx",
        help="Version-pinned GPU containers: catalog -> Dockerfile -> verified image -> registry -> GPU.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
    )
    if modules is not None and tuple(modules) != COMMAND_MODULES:
        # typer runs a lone command as the whole program (`ngcx render X` would lose its `render`);
        # an empty callback keeps the group, so usage lines and errors read as with every module.
        app.callback()(_group)
    for _name, module in stage_modules(modules):
        module.register(app)
    return app


def _group() -> None:
    """No root options: the callback only keeps `ngcx CMD` a group of one."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    # pydantic looks for its plugins in every installed distribution's entry points when the first model is built
    # (a cold-cache `ngcx render` validates the catalog: BENCHMARKS.md#cli); ngcx validates with no plugin. A user
    # who wants theirs in ngcx's process sets the variable to a list of names.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        rc = _run(args)
    except UserError as exc:
        print(f"ngcx: error: {exc.line()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except CheckFailed:
        sys.exit(CheckFailed.exit_code)
    except KeyboardInterrupt:
        print("ngcx: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        # typer >= 0.29 vendors click (typer._click), so `click.exceptions.ClickException` no
        # longer matches: recognise click's exceptions by name / interface, whichever click it is.
        if type(exc).__name__ == "Abort":          # click's form of Ctrl-C (and of EOF at a prompt)
            print("ngcx: interrupted", file=sys.stderr)
            sys.exit(130)
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            sys.exit(code)
        raise
    if rc == 130:  # typer >= 0.29 turns Ctrl-C into Exit(130) itself; say so as for every other exit
        print("ngcx: interrupted", file=sys.stderr)
    sys.exit(rc if isinstance(rc, int) else 0)


def _run(args: list[str]) -> object:
    """Run one command line: the hot commands' plain lines in commands/fastpath.py, everything else in typer."""
    from .commands import fastpath

    if fastpath.run(args):
        return 0
    # Without standalone mode click RETURNS typer.Exit's code instead of exiting with it.
    return build_app(modules_for(args))(args=args, standalone_mode=False)


if __name__ == "__main__":
    main()
