"""What-if for the cli suite: `ngcx ...` with typer's pydantic-based option coercion swapped out.

Not how the shipped CLI runs, and not a proposal to ship: it patches a private typer function
(typer.core.build_runtime_param, typer 0.29). typer >= 0.29 builds a pydantic TypeAdapter for every
parameter that is not a boolean flag, even one left at its default None, so any `ngcx` command with
an argument or a str / Path option imports pydantic (~0.07 s) and generates schemas. Timed beside the
real `ngcx` so BENCHMARKS.md can say, in figures from the same run, what that costs. Only the plain
annotations `render` and `catalog ls` use (str, Path, either or None, and bool flags such as --help)
are coerced here by hand; any other annotation or value falls back to typer's own coercion.
Usage: python bench/whatif_no_pydantic.py render pytorch:24.11
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.core
from typer._coercion import RuntimeParam, TypeDescriptor

PLAIN = {str: str, Path: Path, bool: bool}


def _plain(annotation: Any) -> type | None:
    """str, Path or bool for those types or them `| None`; None for anything else."""
    if annotation in PLAIN:
        return PLAIN[annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and args[0] in PLAIN:
            return PLAIN[args[0]]
    return None


@dataclass(frozen=True)
class PlainRuntimeParam(RuntimeParam):
    """str(value) or Path(value), a flag's bool as it is: what typer < 0.29 (click's STRING, Path and
    BOOL types) amounted to for these options; typer's coercion for anything else."""

    make: type = str

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        if self.make is bool:
            if isinstance(value, bool):
                return value
            return _original(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)
        return self.make(value)


_original = typer.core.build_runtime_param


def build_runtime_param(descriptor: TypeDescriptor) -> RuntimeParam:
    info = descriptor.parameter_info
    make = _plain(descriptor.annotation)
    if make is None or descriptor.file_annotation is not None or info.parser is not None:
        return _original(descriptor)
    return PlainRuntimeParam(parameter_info=info, annotation=descriptor.annotation, make=make)


if __name__ == "__main__":
    typer.core.build_runtime_param = build_runtime_param
    from ngcx.main import main

    main()
