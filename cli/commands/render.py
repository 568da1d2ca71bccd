"""`ngcx render`: a release's Dockerfile (and build context) on stdout or in a folder (render/dockerfile.py)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

if TYPE_CHECKING:
    import typer

from ..render.dockerfile import render_dockerfile, write_context


def _write_output(output: Path, text: str) -> None:
    """-o FILE: missing parent folders are created (as `mkdir -p`); any other failure is one line."""
    from ..core.errors import UserError

    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    except OSError as exc:
        if output.is_dir():
            what = "it is a folder"
        elif isinstance(exc, FileExistsError | NotADirectoryError):
            what = "a folder on its path is a file"
        else:
            what = exc.strerror or exc.__class__.__name__
        raise UserError(f"cannot write -o {output}: {what}", hint="pass -o a file path you can write to") from None


def render_command(ref: str, output: Path | None = None, variant: str = "runtime", base: str | None = None,
                   context: Path | None = None, catalog_file: Path | None = None) -> None:
    """`ngcx render` itself (typer's command below and commands/fastpath.py both call this)."""
    from ..catalog import load_catalog

    cat = load_catalog(catalog_file)
    release = cat.resolve(ref)
    if context:
        ctx = write_context(release, context, variant, base, cat)
        print(f"wrote build context {ctx.path} (Dockerfile sha256 {ctx.digest[:12]})")
        return
    text = render_dockerfile(release, variant, base, cat)
    if output:
        _write_output(output, text)
        print(f"wrote {output}")
    else:
        print(text, end="")


def register(app: "typer.Typer") -> None:
    """Add `ngcx render` to the app. typer is imported here, not at module level, so that
    commands/fastpath.py renders without it; hence no `from __future__ import annotations` in this module:
    the command's annotations must be objects when typer reads them, not names to look up."""
    import typer

    from .options import CatalogOpt, VariantOpt

    base_opt = Annotated[str | None, typer.Option(
        "--base", help="Base image to build FROM; 'offline' = the catalog's bootstrapped base (ngcx base bootstrap).")]

    @app.command("render")
    def render(
        ref: Annotated[str, typer.Argument(help="IMAGE[:RELEASE]; a bare image = newest release.")],
        output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the Dockerfile here.")] = None,
        variant: VariantOpt = "runtime",
        base: base_opt = None,
        context: Annotated[Path | None, typer.Option(
            "--context", help="Write a whole build context (Dockerfile, ngcx-runtime/, tests/) here.")] = None,
        catalog_file: CatalogOpt = None,
    ) -> None:
        """Render the Dockerfile of one image release (stdout unless -o/--context)."""
        render_command(ref, output, variant, base, context, catalog_file)
