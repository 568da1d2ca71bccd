"""Behind `ngcx hosts bake --cloud aliyun --region R`: a host image with driver, Docker, toolkit and base layers.

Why bake: a fresh GPU VM that installs its NVIDIA driver at boot is unusable for 5-10 minutes and
then reboots (cloud-apis.md §7); SkyPilot's baked images cut GPU provisioning by a third to two
thirds (§11.4). Done once per region: a builder instance runs recipes/deploy/bake.sh.j2 (driver,
Docker, NVIDIA Container Toolkit, persistence mode, and a pull of the images named with --pull so
their shared CUDA layers are on the disk), is stopped, captured as an image tagged ngcx:host-image,
and deleted. `ngcx deploy` then boots from the newest such image. The builder pre-pulls private
repositories with its own pull role (roles.py: one role for those repositories), so no registry
secret is in its user-data; `--registry-login token` puts short-lived tokens there instead.
The steps are the same on every VM cloud; the cloud object (cli/deploy/vm.py's Cloud, plus
create_image / image_available / host_images) supplies the calls.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ..core.errors import UserError

BAKE_TIMEOUT_S = 1800.0
BAKE_CLOUDS = ("aliyun", "aws")


def cloud_for(cloud: str, region: str | None) -> Any:
    """The cloud object for --cloud/--region (the profile's region when none is given)."""
    if cloud not in BAKE_CLOUDS:
        raise UserError(f"hosts bake supports --cloud {', '.join(BAKE_CLOUDS)}, not {cloud!r}")
    from . import target

    module = target(cloud)
    if region:
        return module.cloud_for(region)
    if cloud == "aws":   # AWS_REGION, AWS_DEFAULT_REGION or the profile's region, as the AWS CLI
        return module.cloud_for(module.default_region())
    from ..clouds.aliyun import credentials

    return module.cloud_for(credentials().region or module.DEFAULT_REGION)


def pushed_refs(cloud: str = "aliyun") -> list[str]:
    """REPO@DIGEST of this machine's latest pushes, as `cloud`'s hosts pull them (ACR / ECR through the VPC)."""
    from ..state import db as state

    seen: dict[str, str] = {}
    for push in state.list_pushes():
        repository = push.remote_ref.rsplit(":", 1)[0]
        host = repository.split("/", 1)[0]
        seen.setdefault(repository, f"{_hosts_pull_from(cloud, host)}{repository[len(host):]}@{push.digest}")
    return list(seen.values())[:8]


def _hosts_pull_from(cloud: str, host: str) -> str:
    """The address `cloud`'s hosts reach registry `host` at: its own registry through the VPC endpoint."""
    from ..registry import acr, ecr

    if cloud == "aws":
        return ecr.vpc_endpoint(host) if ecr.region_of(host) else host
    region = acr.region_of(host)
    return acr.vpc_endpoint(region) if region else host


def logins(cloud: str, mode: str = "role") -> dict[str, Any]:
    """The builder's login to each of the cloud's own registries the pushes went to, keyed by the host it
    pulls from: a RoleLogin (the builder's role gets the login on the host, roles.py) or, with
    `--registry-login token`, a short-lived token that the script scrubs before the capture."""
    from ..registry import acr, ecr
    from ..state import db as state
    from .roles import RoleLogin

    logins: dict[str, Any] = {}
    for push in state.list_pushes():
        host = push.remote_ref.split("/", 1)[0]
        pulled = _hosts_pull_from(cloud, host)
        if pulled in logins:
            continue
        if cloud == "aws" and ecr.region_of(host):
            region = str(ecr.region_of(host))
            logins[pulled] = ecr.temporary_login(region) if mode == "token" else RoleLogin(
                cloud, region, ecr.api_host_endpoint(region))
        elif cloud == "aliyun" and acr.region_of(host):
            region = str(acr.region_of(host))
            logins[pulled] = acr.temporary_login(region) if mode == "token" else RoleLogin(
                cloud, region, acr.api_host_endpoint(region), acr.instance_id())
    return logins


def pull_role(refs: list[str], logins: dict[str, Any]) -> Any:
    """The builder's role: pulls of the refs whose registry it logs in to with its role, and nothing else
    (None when no registry is logged in to that way)."""
    from . import roles

    grants = []
    for ref in refs:
        login = logins.get(ref.split("/", 1)[0])
        if isinstance(login, roles.RoleLogin):
            grants.append(roles.PullGrant(login.cloud, login.region, roles.repository_of(ref), login.registry_instance))
    return roles.PullRole(tuple(dict.fromkeys(grants))) if grants else None


def bake(cloud: Any, refs: list[str], instance_type: str | None, logins: dict[str, Any] | None = None) -> str:
    """Builder instance -> bake script -> stop -> image -> delete builder; the new image id."""
    from . import hostscript, store, vm

    cloud.prepare_network("0.0.0.0/0")
    itype, zones = _builder_type(cloud, cloud.name, instance_type)
    owner = store.owner_id()
    token = f"ngcx-bake-{owner}-{int(time.time())}"
    t0 = time.monotonic()
    script = hostscript.render_bake(refs, logins or {})
    wanted = pull_role(refs, logins or {})
    role = cloud.ensure_pull_role(wanted) if wanted else None
    builder = cloud.create(vm.CreateSpec(itype, zones[0], cloud.fallback_image(), script, token,
                                         {vm.TAG_OWNER: owner, vm.TAG_ROLE: "bake"}, "ngcx-bake", role=role))
    _say(f"builder {builder} ({itype}, {zones[0]}) is baking")
    try:
        vm.wait_state(cloud, builder, "running", vm.BOOT_TIMEOUT_S)
        _wait_baked(cloud, builder)
        cloud.stop(builder)
        vm.wait_state(cloud, builder, "stopped", 600)
        name = f"ngcx-host-{time.strftime('%Y%m%d-%H%M%S')}"
        image_id = cloud.create_image(builder, name, {vm.TAG_HOST_IMAGE: "1", vm.TAG_OWNER: owner}, f"{token}-image")
        _wait(lambda: cloud.image_available(image_id), f"image {image_id} is not available")
    finally:
        cloud.delete(builder)
    _say(f"host image {image_id} ({name}) ready in {time.monotonic() - t0:.0f} s; deploys in {cloud.region} "
         "boot from it")
    return image_id


def _builder_type(cloud: Any, cloud_name: str, wanted: str | None) -> tuple[str, list[str]]:
    """The builder's type (--instance-type, else the cheapest one-GPU type with stock) and its zones."""
    from . import offers

    if wanted:
        names = [wanted]
    else:
        types, _meta = offers.load_table(cloud_name)
        names = [t.name for t in sorted((t for t in types if t.gpu_count == 1),
                                        key=lambda t: (t.price_per_hour is None, t.price_per_hour or 0, t.name))]
    for name in names:
        zones = cloud.zones_for(name, None)
        if zones:
            return name, zones
    raise UserError(f"no stock for a builder ({', '.join(names[:3])}{', …' if len(names) > 3 else ''}) in "
                    f"{cloud.region}", hint="pass --instance-type with a type the region sells now")


def _wait_baked(cloud: Any, instance_id: str) -> None:
    def done() -> bool:
        code, out = cloud.run_command(instance_id, "test -f /var/lib/ngcx/baked && exit 0; "
                                                   "cat /var/lib/ngcx/bake-failed 2>/dev/null && exit 3; exit 1", 60)
        if code == 3:
            raise UserError(f"baking failed on {instance_id}: {out.strip()[-300:]}")
        return code == 0
    _wait(done, f"baking on {instance_id} did not finish", pause=5)


def _wait(ready: Any, what: str, pause: float = 2.0) -> None:
    deadline = time.monotonic() + BAKE_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            raise UserError(f"{what} after {BAKE_TIMEOUT_S:.0f} s")
        time.sleep(pause)


def _say(line: str) -> None:
    print(f"ngcx: {line}", file=sys.stderr)
