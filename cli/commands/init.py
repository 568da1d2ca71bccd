"""`ngcx init`: start a project folder around a model (project/init.py plans and writes it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..project.init import init_project


def register(app: typer.Typer) -> None:
    @app.command("init")
    def init_cmd(
        model: Annotated[Path, typer.Option("--model", "-m", help="The model: .onnx, .pt2 or a SavedModel folder.")],
        folder: Annotated[Path, typer.Argument(help="Project folder (default: here).")] = Path("."),
        base: Annotated[str | None, typer.Option("--base", help="Catalog release to build FROM, e.g. "
                                                 "onnxruntime:25.08 (default: newest that reads the model).")] = None,
        name: Annotated[str | None, typer.Option("--name", help="Project / image name (default: the folder's).")]
        = None,
        handler: Annotated[bool, typer.Option("--handler", help="Also write handler.py (pre/post-processing).")]
        = False,
        force: Annotated[bool, typer.Option("--force", help="Overwrite files that already exist.")] = False,
    ) -> None:
        """Start a project: sniff the model's signature, write ngcx.yaml, examples.yaml (and handler.py)."""
        written = init_project(folder, model, base, name, handler, force)
        root = folder.resolve()
        for path in written:
            print(f"wrote {path.relative_to(root) if path.is_relative_to(root) else path}")
        where = "" if root == Path.cwd().resolve() else f" (in {folder})"
        print(f"next{where}: fill in the expected outputs in examples.yaml, then `ngcx build`, `ngcx test`, "
              "`ngcx run`", file=sys.stderr)
