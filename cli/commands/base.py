"""`ngcx base bootstrap / ls`: offline base images from a Debian mirror (build/base.py does the work)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from ..build.base import (
    BASE_REPO,
    DEFAULT_MIRROR,
    DEFAULT_SUITE,
    LABEL_MIRROR,
    LABEL_SUITE,
    bootstrap,
    check_inputs,
    check_mirror,
)


def register(app: typer.Typer) -> None:
    base_app = typer.Typer(help="Offline base images bootstrapped from a Debian mirror.",
                           no_args_is_help=True)
    base_app.command("bootstrap")(bootstrap_command)
    base_app.command("ls")(ls_command)
    app.add_typer(base_app, name="base")


def bootstrap_command(
    suite: str = typer.Option(DEFAULT_SUITE, "--suite", help="Debian suite (bookworm, trixie, ...)."),
    mirror: str = typer.Option(DEFAULT_MIRROR, "--mirror", help="Debian mirror URL (http, https, file)."),
    tag: str = typer.Option("", "--tag", help="Image tag [default: ngcx/base:<suite>]."),
    variant: str = typer.Option("minbase", "--variant", help="minbase, buildd or default."),
    slim: bool = typer.Option(True, "--slim/--no-slim", help="Drop docs/man/locales like debian:*-slim."),
    workdir: str = typer.Option("/var/tmp", "--workdir",
                                help="Where the temporary root filesystem is built (needs ~400 MB)."),
) -> None:
    """debootstrap SUITE from MIRROR into a temp dir and import it as a Docker image."""
    tag = tag or f"{BASE_REPO}:{suite}"
    check_inputs(suite, mirror, tag, variant)
    from ..core.engine import engine_client
    from ..core.output import human_size

    client = engine_client()
    check_mirror(mirror, suite)
    started = time.monotonic()
    image = bootstrap(client, suite=suite, mirror=mirror, tag=tag, variant=variant, slim=slim,
                      workdir=Path(workdir))
    print(f"{tag}  {image.id}  {human_size(image.attrs.get('Size', 0), places=1)}  "
          f"({time.monotonic() - started:.0f} s, suite {suite}, {variant})")


def ls_command() -> None:
    """List the offline base images (ngcx/base:*) present in the engine."""
    from rich.console import Console
    from rich.table import Table

    from ..core.engine import engine_client
    from ..core.output import human_size

    client = engine_client()
    images = client.images.list(name=BASE_REPO)
    if not images:
        print(f"no {BASE_REPO}:* images; make one with: ngcx base bootstrap", file=sys.stderr)
        return
    table = Table("TAG", "ID", "SIZE", "SUITE", "MIRROR", "CREATED", box=None)
    for image in images:
        labels = image.labels or {}
        for image_tag in image.tags:
            if image_tag.startswith(f"{BASE_REPO}:"):
                created = labels.get("org.opencontainers.image.created", image.attrs.get("Created", "")[:19])
                size = human_size(image.attrs.get("Size", 0), places=1)
                table.add_row(image_tag, image.short_id.split(":")[-1], size,
                              labels.get(LABEL_SUITE, "?"), labels.get(LABEL_MIRROR, "?"), created)
    Console(width=200).print(table)
