"""Options that several commands share, declared once so their names, help and checks agree.

Why a module: `--catalog`, `--variant`, `--json`, `--gpu` and `-f/--file` appear on render, build,
test, run, lock and catalog; a second spelling of the same flag (a help text that drifts, a
`--gpu` that one command validates and another does not) is what users trip over.
Only typer and the standard library are imported here: `ngcx --help` must stay fast.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class Gpu(StrEnum):
    """How a command uses this host's GPUs."""

    auto = "auto"          # all GPUs when the host has NVIDIA GPUs and the container toolkit, else the CPU
    require = "require"    # fail (exit 1) when no GPU can be used
    off = "off"            # the CPU even when GPUs are present


class RegistryLogin(StrEnum):
    """How a cloud host (a deploy's or a bake's builder) logs in to ACR/ECR (deploy/roles.py)."""

    role = "role"     # with its instance role: no registry secret reaches it (default)
    token = "token"   # a short-lived token in the host job (registries without roles; it is left in the cloud)


CatalogOpt = Annotated[Path | None, typer.Option(
    "--catalog", help="Catalog file (default: the shipped registry.yaml).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
VariantOpt = Annotated[str | None, typer.Option(
    "--variant", help="runtime (slim) or devel (compilers, headers); a project's default is its ngcx.yaml's.")]
GpuOpt = Annotated[Gpu, typer.Option(
    "--gpu", case_sensitive=False, help="auto: GPUs when present; require: fail without one; off: CPU only.")]
ProjectFileOpt = Annotated[Path | None, typer.Option(
    "-f", "--file", help="A project's ngcx.yaml (default: ./ngcx.yaml when no IMAGE is given).")]
RegistryLoginOpt = Annotated[RegistryLogin, typer.Option(
    "--registry-login", case_sensitive=False,
    help="Cloud: how the host logs in to ACR/ECR. role: with its instance role, nothing secret sent (default); "
         "token: a short-lived token travels in the host job and stays in the cloud's records.")]
