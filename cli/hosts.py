"""`ngcx hosts bake --cloud aliyun --region R`: a host image with driver, Docker, toolkit and base layers.

Why bake: a fresh GPU VM that installs its NVIDIA driver at boot is unusable for 5-10 minutes and
then reboots (cloud-apis.md §7); SkyPilot's baked images cut GPU provisioning by a third to two
thirds (§11.4). Done once per region: a builder instance runs recipes/deploy/bake.sh.j2 (driver,
Docker, NVIDIA Container Toolkit, persistence mode, and a pull of the images named with --pull so
their shared CUDA layers are on the disk), is stopped, captured with CreateImage (tagged
ngcx:host-image), and deleted. `ngcx deploy` then finds the newest such image by its tag.
"""

from __future__ import annotations

import base64
import sys
import time
from typing import Annotated

import typer

from ngcx.errors import UserError

BAKE_TIMEOUT_S = 1800.0


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Cloud host images for fast deploys.", no_args_is_help=True)
    group.command("bake")(bake_cmd)
    group.command("ls")(ls_cmd)
    app.add_typer(group, name="hosts")


def bake_cmd(
    cloud: Annotated[str, typer.Option("--cloud", help="aliyun")] = "aliyun",
    region: Annotated[str | None, typer.Option("--region", help="Region (default: the profile's).")] = None,
    pull: Annotated[list[str] | None, typer.Option("--pull", help="Image refs to pre-pull (repeatable); default: "
                                                                  "the refs of this machine's pushes.")] = None,
    instance_type: Annotated[str | None, typer.Option("--instance-type", help="Builder type (default: the cheapest "
                                                                              "GPU type in the table).")] = None,
) -> None:
    """Make (once per region) the host image `ngcx deploy` boots from; prints its image id."""
    if cloud != "aliyun":
        raise UserError(f"hosts bake supports --cloud aliyun, not {cloud!r}")
    from ngcx.deploy.aliyun import DEFAULT_REGION
    from ngcx.deploy.aliyun_api import Api, credentials

    region = region or credentials().region or DEFAULT_REGION
    api = Api(region)
    refs = pull if pull is not None else _pushed_refs()
    image_id = bake(api, region, refs, instance_type)
    print(image_id)


def _pushed_refs() -> list[str]:
    """REPO@DIGEST of this machine's latest pushes, as hosts pull them (ACR through its VPC endpoint)."""
    from ngcx import acr, state

    seen: dict[str, str] = {}
    for push in state.list_pushes():
        repository = push.remote_ref.rsplit(":", 1)[0]
        host = repository.split("/", 1)[0]
        region = acr.region_of(host)
        pulled = acr.vpc_endpoint(region) + repository[len(host):] if region else repository
        seen.setdefault(repository, f"{pulled}@{push.digest}")
    return list(seen.values())[:8]


def bake(api, region: str, refs: list[str], instance_type: str | None) -> str:
    """Builder instance -> bake script -> stop -> CreateImage -> delete builder; the new image id."""
    from ngcx.deploy import aliyun, hostscript, store
    from ngcx.deploy.aliyun_api import tag_params

    vswitches, group = aliyun.network(api, "0.0.0.0/0")
    itype, zones = _builder_type(api, instance_type, set(vswitches))
    owner = store.owner_id()
    token = f"ngcx-bake-{owner}-{int(time.time())}"
    script = hostscript.render_bake(refs)
    t0 = time.monotonic()
    answer = api.ecs("RunInstances", {
        "RegionId": region, "ImageId": aliyun.FALLBACK_IMAGE, "InstanceType": itype, "ZoneId": zones[0],
        "VSwitchId": vswitches[zones[0]], "SecurityGroupId": group, "Amount": 1, "InstanceName": "ngcx-bake",
        "UserData": base64.b64encode(script.encode()).decode(), "SystemDisk.Category": "cloud_essd",
        "SystemDisk.Size": 100, **tag_params({aliyun.TAG_OWNER: owner, "ngcx:role": "bake"})}, token=token, write=True)
    builder = answer["InstanceIdSets"]["InstanceIdSet"][0]
    _say(f"builder {builder} ({itype}, {zones[0]}) is baking")
    try:
        aliyun.wait_state(api, builder, "running", aliyun.BOOT_TIMEOUT_S)
        _wait_baked(api, builder)
        api.ecs("StopInstance", {"InstanceId": builder, "StoppedMode": "KeepCharging"}, write=True)
        aliyun.wait_state(api, builder, "stopped", 600)
        name = f"ngcx-host-{time.strftime('%Y%m%d-%H%M%S')}"
        image_id = api.ecs("CreateImage", {"InstanceId": builder, "ImageName": name,
                                           **tag_params({aliyun.TAG_HOST_IMAGE: "1", aliyun.TAG_OWNER: owner})},
                           token=f"{token}-image", write=True)["ImageId"]
        _wait_image(api, image_id)
    finally:
        api.ecs("DeleteInstance", {"InstanceId": builder, "Force": True}, write=True)
    _say(f"host image {image_id} ({name}) ready in {time.monotonic() - t0:.0f} s; deploys in {region} boot from it")
    return image_id


def _builder_type(api, wanted: str | None, zones_with_switch: set[str]) -> tuple[str, list[str]]:
    """The builder's type (--instance-type, else the cheapest one-GPU type with stock) and its zones."""
    from ngcx.deploy import aliyun, offers

    if wanted:
        names = [wanted]
    else:
        types, _meta = offers.load_table("aliyun")
        names = [t.name for t in sorted((t for t in types if t.gpu_count == 1),
                                        key=lambda t: (t.price_per_hour is None, t.price_per_hour or 0, t.name))]
    for name in names:
        zones = [z for z in aliyun._zones_with_stock(api, name, None) if z in zones_with_switch]
        if zones:
            return name, zones
    raise UserError(f"no stock for a builder ({', '.join(names[:3])}{', …' if len(names) > 3 else ''}) in "
                    f"{api.region}", hint="pass --instance-type with a type the region sells now")


def _wait_baked(api, instance_id: str) -> None:
    from ngcx.deploy import aliyun

    deadline = time.monotonic() + BAKE_TIMEOUT_S
    while time.monotonic() < deadline:
        code, out = aliyun.run_command(api, instance_id, "cat /var/lib/ngcx/baked 2>/dev/null || "
                                                         "{ cat /var/lib/ngcx/bake-failed 2>/dev/null && exit 3; }; "
                                                         "test -f /var/lib/ngcx/baked", 60)
        if code == 0:
            return
        if code == 3:
            raise UserError(f"baking failed on {instance_id}: {out.strip()[-300:]}")
        time.sleep(5)
    raise UserError(f"baking on {instance_id} did not finish in {BAKE_TIMEOUT_S:.0f} s")


def _wait_image(api, image_id: str) -> None:
    deadline = time.monotonic() + BAKE_TIMEOUT_S
    while time.monotonic() < deadline:
        images = api.ecs("DescribeImages", {"ImageId": image_id, "ImageOwnerAlias": "self"}).get(
            "Images", {}).get("Image", [])
        if images and images[0].get("Status") == "Available":
            return
        time.sleep(2)
    raise UserError(f"image {image_id} is not Available after {BAKE_TIMEOUT_S:.0f} s")


def ls_cmd(region: Annotated[str | None, typer.Option("--region")] = None) -> None:
    """The baked host images in a region."""
    from ngcx.deploy.aliyun import DEFAULT_REGION, TAG_HOST_IMAGE
    from ngcx.deploy.aliyun_api import Api, credentials, tag_params

    api = Api(region or credentials().region or DEFAULT_REGION)
    params = {"ImageOwnerAlias": "self", "PageSize": 100, **tag_params({TAG_HOST_IMAGE: "1"})}
    for image in api.ecs("DescribeImages", params).get("Images", {}).get("Image", []):
        print("  ".join(str(image.get(k, "")) for k in ("ImageId", "ImageName", "Status", "CreationTime")))


def _say(line: str) -> None:
    print(f"ngcx: {line}", file=sys.stderr)
