"""What-if for the cli suite: `ngcx COMMAND ...` with only COMMAND's stage module imported and registered.

Not how the shipped CLI starts: cli/main.py imports and registers all its stage modules before it
parses the command line. Timed beside the real `ngcx` so BENCHMARKS.md can say, in figures from the
same run, what that up-front registration costs and what registering only the command asked for
would save. Usage: python bench/whatif_one_command.py render pytorch:24.11
"""

from __future__ import annotations

import importlib
import sys

import typer


def main(argv: list[str]) -> None:
    app = typer.Typer(name="ngcx", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                      pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """ngcx, one command registered."""

    importlib.import_module(f"ngcx.{argv[0]}").register(app)
    app(args=argv)


if __name__ == "__main__":
    main(sys.argv[1:])
