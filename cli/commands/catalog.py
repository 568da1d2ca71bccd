"""`ngcx catalog ls / show / check / lock`: the releases of registry.yaml, one release in full, the rules checked over a
file, the wheel hashes refreshed from the package index (catalog/refresh.py).

catalog/ loads and validates; this module prints. It stays light (the standard library only) so the CLI
starts fast: typer is imported only by register(), so commands/fastpath.py runs `catalog ls` without it
(issue 13: no slower than hpccm). No `from __future__ import annotations` here: register()'s command
functions are defined inside it, and typer reads their annotations, which must be objects, not names.
"""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

if TYPE_CHECKING:
    import typer

    from ..catalog.model import Release
from ..catalog import load_catalog, release_summary


def list_releases(json_out: bool = False, catalog_file: Path | None = None) -> None:
    """`ngcx catalog ls` (typer's command and commands/fastpath.py both call this)."""
    from ..core import output

    cat = load_catalog(catalog_file)
    rows = []
    for rel in cat.all_releases():
        img = cat.image(rel.image)
        rows.append({
            "ref": rel.ref, "cuda": rel.cuda,
            "cudnn": rel.pin("cudnn").version if rel.pin("cudnn") else None,
            "nccl": rel.pin("nccl").version if rel.pin("nccl") else None,
            "framework": rel.framework.requirement if rel.framework else None,
            "python": rel.spec.python, "min_driver": rel.min_driver,
            "buildable_here": img.buildable,
            "newest": cat.newest(rel.image).tag == rel.tag,
        })
    if json_out:
        output.emit_json(rows)
        return
    output.table(f"ngcx catalog ({cat.source})",
                 ["image:release", "CUDA", "cuDNN", "NCCL", "framework", "python", "min driver", "note"],
                 [[r["ref"] + (" *" if r["newest"] else ""), r["cuda"], r["cudnn"], r["nccl"],
                   r["framework"] or "-", r["python"], r["min_driver"],
                   "" if r["buildable_here"] else "render-only"] for r in rows])
    print("* = newest release (what a bare image name means)")


def _show(ref: str, json_out: bool, catalog_file: Path | None) -> None:
    from ..core import output

    cat = load_catalog(catalog_file)
    rel = cat.resolve(ref)
    data = release_summary(rel)
    data["built"] = _built_images(rel)
    if json_out:
        output.emit_json(data)
        return
    print(f"{rel.ref}  —  {cat.image(rel.image).description}")
    print(f"  base      {rel.base.image}  (offline: {rel.base.offline or '-'}), python {rel.spec.python}")
    print(f"  CUDA      {rel.cuda}")
    for p in rel.pins:
        print(f"  {p.component:<9} {p.wheel}=={p.version}")
    if rel.framework:
        print(f"  framework {rel.framework.requirement}")
    for extra in rel.extras:
        print(f"  extra     {extra}")
    print(f"  driver    >= {rel.min_driver} (full feature set: >= {rel.full_driver})")
    for cc, drv in rel.arch_min_driver.items():
        print(f"            compute capability {cc} needs >= {drv}")
    print(f"  GPUs      compute capability {', '.join(rel.compute_capabilities)}")
    require = rel.require_cuda.split(" ")
    print(f"  NVIDIA_REQUIRE_CUDA {require[0]} (+{len(require) - 1} branch groups)")
    for b in data["built"]:
        print(f"  built     {b['tag']}  {output.human_size(b['size_bytes'])}  {b['digest'] or b['image_id']}")


def _built_images(rel: "Release") -> list[dict]:
    """Builds of this release recorded in the state store (empty when none or no store)."""
    from ..state import db as state

    try:
        builds = state.list_builds(rel.image)
    except Exception:  # a missing/locked state store must not break `catalog show`
        return []
    newest: dict[str, dict] = {}  # list_builds is newest first: keep the newest build per tag
    for b in builds:
        if b.release == rel.tag and b.tag not in newest:
            newest[b.tag] = {"tag": b.tag, "variant": b.variant, "size_bytes": b.size_bytes,
                             "image_id": b.image_id, "digest": b.digest, "built_at": b.built_at}
    return list(newest.values())


def _check(catalog_file: Path | None, json_out: bool) -> None:
    from ..catalog.model import complete, problems_of
    from ..core import output, paths
    from ..core.errors import UserError
    from ..core.problems import Problem

    file = catalog_file or paths.registry_file()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read catalog {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"catalog {file} is not UTF-8 text (byte {exc.start})",
                        hint="save it as UTF-8, or check that this is the right file") from None
    try:
        spec, problems = problems_of(text, str(file))
    except UserError as exc:  # malformed YAML: one problem, with its file:line:column
        where, _, message = exc.message.partition(": ")
        spec, problems = None, [Problem(where, "", "parse.yaml", message, exc.hint or "")]
    if json_out:
        output.emit_json({"file": str(file), "ok": not problems, "problems": [p.as_dict() for p in problems]})
    elif problems:
        for problem in problems:
            print(problem.line())
    if problems:
        if not json_out:
            print(f"{len(problems)} problem(s) in {file}", file=sys.stderr)
        import typer

        raise typer.Exit(2)
    cat = complete(spec, str(file))
    if not json_out:
        n = len(cat.all_releases())
        print(f"{file}: ok — {len(cat.image_names())} images, {n} releases, all compatibility rules hold")


def _lock(catalog_file: Path | None) -> None:
    """`ngcx catalog lock`: resolve every release's layers and write the hashes beside the catalog."""
    from ..catalog.refresh import refresh

    report = refresh(load_catalog(catalog_file))
    for ref, reason in sorted(report.skipped.items()):
        print(f"ngcx: {ref}: not locked (it will not build): {reason}", file=sys.stderr)
    print(f"{report.path}: {len(report.releases)} releases, {report.files} file hashes")


def register(app: "typer.Typer") -> None:
    import typer

    from .options import CatalogOpt, JsonOpt

    group = typer.Typer(help="Inspect and validate the catalog (registry.yaml).", no_args_is_help=True)

    @group.command("ls")
    def ls(json_out: JsonOpt = False, catalog_file: CatalogOpt = None) -> None:
        """List every image:release with its CUDA stack."""
        list_releases(json_out, catalog_file)

    @group.command("show")
    def show(ref: Annotated[str, typer.Argument(help="IMAGE[:RELEASE]; a bare image = newest release.")],
             json_out: JsonOpt = False, catalog_file: CatalogOpt = None) -> None:
        """Pins, minimum driver and supported GPUs of one release."""
        _show(ref, json_out, catalog_file)

    @group.command("check")
    def check(file: Annotated[Path | None, typer.Argument(help="Catalog to check (default: shipped).")] = None,
              json_out: JsonOpt = False) -> None:
        """Validate schema and every compatibility rule; exit 2 listing each violation."""
        _check(file, json_out)

    @group.command("lock")
    def lock(catalog_file: CatalogOpt = None) -> None:
        """Fetch the sha256 of every wheel each release installs (registry.lock.yaml); builds need them."""
        _lock(catalog_file)

    app.add_typer(group, name="catalog")
