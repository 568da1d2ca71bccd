"""The `ngcx` command: a typer app whose subcommands live one module per stage of the flow.

Start-up must stay fast (`ngcx --help` < 0.3 s): command modules import only typer and the
standard library at module level; catalogs, Jinja2, the Docker SDK and cloud SDKs are imported
inside the command functions that need them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import typer

from ngcx.errors import CheckFailed, UserError

# Each module exposes register(app: typer.Typer). Order = order in `ngcx --help`.
COMMAND_MODULES = (
    "init", "catalog", "render", "base", "build", "lock", "test", "push", "login", "run",
    "deploy", "deployments", "hosts", "images", "doctor",
)


def stage_modules() -> Iterator[tuple[str, ModuleType]]:
    """The stage modules, in `ngcx --help` order. A missing one is an ImportError, never a silent
    gap: a deleted command module must fail `ngcx --help` and the CLI tests (issue 8)."""
    for name in COMMAND_MODULES:
        yield name, importlib.import_module(f"ngcx.{name}")


def build_app() -> typer.Typer:
    """Assemble the CLI from the stage modules."""
    app = typer.Typer(
        name="ngcx",
        help="Version-pinned GPU containers: catalog -> Dockerfile -> verified image -> registry -> GPU.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
    )
    for _name, module in stage_modules():
        module.register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    app = build_app()
    try:
        # Without standalone mode click RETURNS typer.Exit's code instead of exiting with it.
        rc = app(args=argv, standalone_mode=False)
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


if __name__ == "__main__":
    main()
