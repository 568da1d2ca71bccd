"""`ngcx lock`: pin a project's requirements in ngcx.lock (project/lock.py resolves them in the base image)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import UserError
from ..project.lock import lock_project
from .options import CatalogOpt


def register(app: typer.Typer) -> None:
    @app.command("lock")
    def lock_cmd(
        file: Annotated[Path | None, typer.Option("-f", "--file", help="ngcx.yaml (default: ./ngcx.yaml).")] = None,
        base: Annotated[str | None, typer.Option(
            "--base", help="OS base to build a missing base release on ('offline' = bootstrapped).")] = None,
        ca_cert: Annotated[Path | None, typer.Option(
            "--ca-cert", help="CA bundle for pip (default: $PIP_CERT, $REQUESTS_CA_BUNDLE, $SSL_CERT_FILE).")] = None,
        pip_index_url: Annotated[str | None, typer.Option("--pip-index-url", help="pip index.")] = None,
        pip_extra_index_url: Annotated[list[str] | None, typer.Option(
            "--pip-extra-index-url", help="Extra pip index (repeatable).")] = None,
        catalog_file: CatalogOpt = None,
    ) -> None:
        """Resolve the project's requirements inside its base image into ngcx.lock (build then uses it)."""
        from ..build.image import BuildOptions
        from ..catalog import load_catalog
        from ..project import find_project_file
        from ..project.spec import load_project

        found = find_project_file(file) if file else find_project_file()
        if found is None:
            raise UserError(f"no ngcx.yaml {'at ' + str(file) if file else 'in ' + str(Path.cwd())}",
                            hint="run it in a project folder, pass -f path/ngcx.yaml, or create one with `ngcx init`")
        cat = load_catalog(catalog_file)
        project = load_project(found, cat)
        opts = BuildOptions(base=base, ca_cert=ca_cert, pip_index_url=pip_index_url,
                            pip_extra_index_urls=list(pip_extra_index_url or []), progress="auto")
        path, pins, image = lock_project(project, opts, cat)
        shown = ", ".join(pins[:5]) + (f" and {len(pins) - 5} more" if len(pins) > 5 else "")
        print(f"wrote {path}: {len(pins)} package(s) added to {image.tag} ({image.id[:19]})"
              + (f": {shown}" if pins else ""))
