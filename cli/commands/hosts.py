"""`ngcx hosts bake / ls`: the host images deploys boot from (deploy/bake.py bakes them)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..deploy.bake import bake, cloud_for, logins, pushed_refs
from .options import RegistryLogin, RegistryLoginOpt


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Cloud host images for fast deploys.", no_args_is_help=True)
    group.command("bake")(bake_cmd)
    group.command("ls")(ls_cmd)
    app.add_typer(group, name="hosts")


def bake_cmd(
    cloud: Annotated[str, typer.Option("--cloud", help="aliyun or aws")] = "aliyun",
    region: Annotated[str | None, typer.Option("--region", help="Region (default: the profile's).")] = None,
    pull: Annotated[list[str] | None, typer.Option("--pull", help="Image refs to pre-pull (repeatable); default: "
                                                                  "the refs of this machine's pushes.")] = None,
    instance_type: Annotated[str | None, typer.Option("--instance-type", help="Builder type (default: the cheapest "
                                                                              "one-GPU type with stock).")] = None,
    registry_login: RegistryLoginOpt = RegistryLogin.role,
) -> None:
    """Make (once per region) the host image `ngcx deploy` boots from; prints its image id."""
    target_cloud = cloud_for(cloud, region)
    refs = pull if pull is not None else pushed_refs(cloud)
    print(bake(target_cloud, refs, instance_type, logins(cloud, registry_login.value)))


def ls_cmd(cloud: Annotated[str, typer.Option("--cloud", help="aliyun or aws")] = "aliyun",
           region: Annotated[str | None, typer.Option("--region")] = None) -> None:
    """The baked host images in a region, newest last."""
    for image_id, name, created in cloud_for(cloud, region).host_images():
        print(f"{image_id}  {name}  {created}")
