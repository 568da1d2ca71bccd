"""`ngcx-runtime`: argparse main whose subcommands come from modules (info, optimize, serve, bench, selftest).

Why argparse and lazy modules: the runtime ships inside slim images with numpy as its only
import-time dependency; each subcommand module exposes add_parser(subparsers) and sets
func(args) -> int. Every module in COMMANDS ships in every image (cli/render/dockerfile.py copies the whole
package), so a missing one is an ImportError, never a silently absent command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("info", "optimize", "serve", "bench", "selftest")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ngcx-runtime", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f".{name}", __package__).add_parser(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that carry a one-line message for the user (exit 2, no traceback)."""
    from .errors import RuntimeUserError

    found: list[type[BaseException]] = [RuntimeUserError]
    serve = sys.modules.get(f"{__package__}.serve")
    if serve is not None and hasattr(serve, "ServeError"):
        found.append(serve.ServeError)
    return tuple(found)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - filtered right below
        if isinstance(exc, _user_errors()):
            print(f"ngcx-runtime {args.command}: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
