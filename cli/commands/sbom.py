"""`ngcx sbom`: the SBOM of a built image, made from inside it (trust/sbom.py), as CycloneDX 1.6 or SPDX 2.3 JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("sbom")(sbom_command)


def sbom_command(
    ref: Annotated[str, typer.Argument(help="A local image (tag, NAME@DIGEST or ID) or a catalog IMAGE[:RELEASE] "
                                            "built here, e.g. cuda:24.05.")],
    fmt: Annotated[str, typer.Option("--format", help="cyclonedx (CycloneDX 1.6, validated against its schema) "
                                                      "or spdx (SPDX 2.3).")] = "cyclonedx",
    out: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON to FILE (default: stdout).")]
    = None,
    variant: Annotated[str, typer.Option("--variant", help="runtime or devel (catalog images).")] = "runtime",
) -> None:
    """List every Debian package, Python distribution and loaded CUDA library an image holds, with its digests."""
    import json
    import sys

    from ..core import naming
    from ..core.errors import UserError
    from ..trust.sbom import FORMATS, build_sbom

    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}", hint="use cyclonedx or spdx")
    if variant not in naming.VARIANTS:
        raise UserError(f"unknown --variant {variant!r}", hint=f"use one of: {', '.join(naming.VARIANTS)}")
    if out is not None and not out.parent.is_dir():
        raise UserError(f"cannot write {out}: folder {out.parent} does not exist", hint="create it, or pick another -o")
    result = build_sbom(ref, fmt, variant)  # type: ignore[arg-type]
    text = json.dumps(result.document, indent=2) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(text)
        tmp.replace(out)
    print(f"sbom {result.image} ({result.digest}): {result.components} components, {fmt}, "
          f"collected in {result.collect_s:.2f} s, {result.total_s:.2f} s in all"
          + (f" -> {out}" if out else ""), file=sys.stderr)
