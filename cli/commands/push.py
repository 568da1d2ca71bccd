"""`ngcx push`: an image to a registry, verified by digest (registry/push.py)."""

from __future__ import annotations

import typer

from ..core.errors import UserError
from ..registry.push import push_image, target


def register(app: typer.Typer) -> None:
    app.command("push")(push_command)


def push_command(
    ref: str = typer.Argument(..., help="Catalog IMAGE[:RELEASE] (e.g. pytorch:25.08), or a local image "
                                         "reference such as ngcx/base:bookworm."),
    registry: str = typer.Option(..., "--registry", "-r", help="HOST[:PORT][/NAMESPACE], acr://REGION/NAMESPACE "
                                                                "or ecr://REGION[/REPO] to push to."),
    variant: str = typer.Option("runtime", "--variant", help="runtime or devel (catalog images)."),
    ecr_tag_mutability: str | None = typer.Option(
        None, "--ecr-tag-mutability", envvar="NGCX_ECR_TAG_MUTABILITY",
        help="ecr:// only, for a repository it creates: MUTABLE (default; deploys pull by digest) or IMMUTABLE."),
) -> None:
    """Push a built image to REGISTRY and verify the registry serves the same digest."""
    from ..core import naming
    from ..core.engine import engine_client
    from ..workstation.host import resolve_local

    if variant not in naming.VARIANTS:
        raise UserError(f"unknown --variant {variant!r}", hint=f"use one of: {', '.join(naming.VARIANTS)}")
    target(registry)  # a malformed --registry is one line before the engine is asked anything
    local_ref, name, tag = resolve_local(engine_client(), ref, variant)
    remote, digest = push_image(local_ref, registry, name=name, tag=tag, ecr_tag_mutability=ecr_tag_mutability)
    print(f"{remote}@{digest}")
