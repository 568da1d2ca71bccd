"""`ngcx build`: a catalog image, or the project in ./ngcx.yaml, with BuildKit (build/image.py, project/build.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..build.image import BuildOptions, build
from ..core.errors import UserError
from .options import CatalogOpt, ProjectFileOpt, VariantOpt


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build_cmd(
        ref: Annotated[str | None, typer.Argument(
            help="IMAGE[:RELEASE]; a bare image = newest release. Left out: the project in ./ngcx.yaml.")] = None,
        file: ProjectFileOpt = None,
        tag: Annotated[str | None, typer.Option(
            "--tag", help="Image tag (default ngcx/IMAGE:RELEASE-VARIANT).")] = None,
        variant: VariantOpt = None,
        base: Annotated[str | None, typer.Option(
            "--base", help="Base image; 'offline' = the bootstrapped base (ngcx base bootstrap).")] = None,
        ca_cert: Annotated[Path | None, typer.Option(
            "--ca-cert",
            help="CA bundle for pip/apt (default: $PIP_CERT, $REQUESTS_CA_BUNDLE, $SSL_CERT_FILE).")] = None,
        pip_index_url: Annotated[str | None, typer.Option(
            "--pip-index-url", help="pip index (may hold credentials).")] = None,
        pip_extra_index_url: Annotated[list[str] | None, typer.Option(
            "--pip-extra-index-url", help="Extra pip index (repeatable).")] = None,
        apt_mirror: Annotated[str | None, typer.Option(
            "--apt-mirror", help="Debian mirror, e.g. http://mirrors.aliyun.com.")] = None,
        no_cache: Annotated[bool, typer.Option("--no-cache", help="Ignore the layer cache.")] = False,
        progress: Annotated[str, typer.Option("--progress", help="auto | plain | quiet.")] = "auto",
        catalog_file: CatalogOpt = None,
    ) -> None:
        """Build an image from the catalog, or the project in ./ngcx.yaml, with BuildKit (secrets never land
        in a layer)."""
        from ..catalog import load_catalog
        from ..core import naming, output

        if ref is None or file is not None:
            _build_project(ref, file, tag, variant, BuildOptions(
                base=base, ca_cert=ca_cert, pip_index_url=pip_index_url,
                pip_extra_index_urls=list(pip_extra_index_url or []), apt_mirror=apt_mirror, no_cache=no_cache,
                progress=progress), catalog_file)
            return
        variant = variant or naming.DEFAULT_VARIANT
        if variant not in naming.VARIANTS:
            raise UserError(f"unknown variant {variant!r}", hint=f"use one of {', '.join(naming.VARIANTS)}")
        if progress not in ("auto", "plain", "quiet"):
            raise UserError(f"--progress {progress!r}: use auto, plain or quiet")
        cat = load_catalog(catalog_file)
        release = cat.resolve(ref)
        opts = BuildOptions(variant=variant, tag=tag, base=base, ca_cert=ca_cert, pip_index_url=pip_index_url,
                            pip_extra_index_urls=list(pip_extra_index_url or []), apt_mirror=apt_mirror,
                            no_cache=no_cache, progress=progress)
        result = build(release, opts, cat)
        print(f"built {result.tag}  {result.image_id[:19]}  {output.human_size(result.size_bytes)}  "
              f"in {result.duration_s:.1f}s ({result.cached_steps}/{result.steps} steps cached)")


def _build_project(ref: str | None, file: Path | None, tag: str | None, variant: str | None, opts: BuildOptions,
                   catalog_file: Path | None) -> None:
    """`ngcx build` without IMAGE (or with -f): the project's image, FROM its base release (project/build.py)."""
    from ..catalog import load_catalog
    from ..core import output
    from ..project import find_project_file
    from ..project.build import build_project
    from ..project.spec import load_project

    if ref is not None:
        raise UserError(f"pass either IMAGE ({ref}) or -f {file}, not both",
                        hint="`ngcx build IMAGE` builds a catalog image, `ngcx build -f ngcx.yaml` a project")
    found = find_project_file(file) if file else find_project_file()
    if found is None:
        raise UserError(f"no ngcx.yaml {'at ' + str(file) if file else 'in ' + str(Path.cwd())} and no IMAGE given",
                        hint="`ngcx build IMAGE[:RELEASE]` builds a catalog image; in a project folder (or with "
                             "-f path/ngcx.yaml) it builds the project; `ngcx init` starts one")
    if tag is not None:
        raise UserError("--tag does not apply to a project", hint="a project's image is always ngcx-app/NAME:latest")
    if opts.progress not in ("auto", "plain", "quiet"):
        raise UserError(f"--progress {opts.progress!r}: use auto, plain or quiet")
    cat = load_catalog(catalog_file)
    project = load_project(found, cat)
    if variant is not None and variant != project.spec.variant:
        raise UserError(f"--variant {variant} differs from `variant: {project.spec.variant}` in {found}",
                        hint="set the variant in ngcx.yaml")
    result = build_project(project, opts, cat)
    print(f"built {result.tag}  {result.image_id[:19]}  {output.human_size(result.size_bytes)}  "
          f"in {result.duration_s:.1f}s ({result.cached_steps}/{result.steps} steps cached)")
