"""`ngcx push`: an image to a registry, verified by digest (registry/push.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..core.errors import UserError
from ..registry.push import push_image, target
from .options import ProjectFileOpt


def register(app: typer.Typer) -> None:
    app.command("push")(push_command)


def push_command(
    ref: str | None = typer.Argument(None, help="Catalog IMAGE[:RELEASE] (e.g. pytorch:25.08), or a local image "
                                                "reference such as ngcx/base:bookworm; omit it in a project "
                                                "folder (ngcx.yaml) to push the project's image."),
    registry: str = typer.Option(..., "--registry", "-r", help="HOST[:PORT][/NAMESPACE], acr://REGION/NAMESPACE "
                                                                "or ecr://REGION[/REPO] to push to."),
    variant: str = typer.Option("runtime", "--variant", help="runtime or devel (catalog images)."),
    ecr_tag_mutability: str | None = typer.Option(
        None, "--ecr-tag-mutability", envvar="NGCX_ECR_TAG_MUTABILITY",
        help="ecr:// only, for a repository it creates: MUTABLE (default; deploys pull by digest) or IMMUTABLE."),
    project_file: ProjectFileOpt = None,
    sign: bool = typer.Option(True, "--sign/--no-sign", help="Sign the pushed digest and attach its provenance "
                                                             "(and SBOM) in cosign's format (default: sign)."),
    key: str | None = typer.Option(None, "--key", help="Signing key: a PEM EC P-256 private key or awskms:///alias/"
                                                       "NAME (default: ngcx's own, made on first use)."),
) -> None:
    """Push a built image to REGISTRY and verify the registry serves the same digest."""
    from ..core import naming
    from ..core.engine import engine_client
    from ..workstation.host import resolve_local

    if variant not in naming.VARIANTS:
        raise UserError(f"unknown --variant {variant!r}", hint=f"use one of: {', '.join(naming.VARIANTS)}")
    target(registry)  # a malformed --registry is one line before the engine is asked anything
    client = engine_client()
    local_ref, name, tag = resolve_local(client, ref if ref is not None else _project_image(client, project_file),
                                         variant)
    from ..trust.publish import prepare_signer, publish_after_push  # trust/publish.py: issue 48

    signer = prepare_signer(key) if sign else None  # a bad --key is one line before anything is uploaded
    remote, digest = push_image(local_ref, registry, name=name, tag=tag, ecr_tag_mutability=ecr_tag_mutability)
    if signer is not None:
        publish_after_push(remote, digest, local_ref=local_ref, registry=registry, signer=signer)
    print(f"{remote}@{digest}")


def _project_image(client: object, project_file: Path | None) -> str:
    """The project's image tag (ngcx-app/NAME:latest), as `ngcx build`, `test` and `deploy` find it
    (commands/test.py _project_checks, deploy/image.py resolve): ./ngcx.yaml or -f FILE."""
    from ..core.engine import image_or_none
    from ..project import find_project_file
    from ..project.spec import load_project

    file = find_project_file(project_file) if project_file else find_project_file()
    if file is None:
        raise UserError(f"no IMAGE given and no ngcx.yaml in {project_file or Path.cwd()}",
                        hint="give an image (`ngcx push pytorch:25.08 --registry R`) or run it in a project folder")
    tag = load_project(file).image_tag
    if image_or_none(client, tag) is None:
        raise UserError(f"the project's image {tag} is not built", hint=f"run `ngcx build` in {file.parent} first")
    return tag
