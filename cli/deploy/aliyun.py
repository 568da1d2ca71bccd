"""The Alibaba Cloud ECS target: the fastest host there is, else a stopped one, else a new one.

Paths (cold-start.md §7): a running host of the same spec gets the new container through Cloud
Assistant (RunCommand) and nothing boots; a stopped host (StopCharging: GPU released, disk and
pulled layers kept) is started, and when the zone has no stock to give its GPU back the deploy
falls back to creating; otherwise RunInstances, with a ClientToken the record holds before the
call (a retry or a re-run after kill -9 cannot double it), DescribeAvailableResource first, and
failover over zones then instance types on capacity errors. The host script (recipes/deploy/
host.sh.j2) does the same on every path and stamps when it started, pulled and started the
container, which is where the per-phase seconds come from.
Every cloud resource carries tags: ngcx:owner (this state store), ngcx:deployment (the record).
"""

from __future__ import annotations

import base64
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ngcx.deploy import store
from ngcx.deploy.common import (
    BOOTING,
    CREATING,
    PATH_FRESH,
    PATH_RUNNING,
    PATH_STOPPED,
    READY,
    REPLACED,
    SERVE_PORT,
    STARTING,
    STOPPED,
    Capabilities,
    CapacityError,
    DeployConfig,
    DeployRecord,
    HostStatus,
)
from ngcx.errors import UserError

CAPABILITIES = Capabilities(stop_start_host=True, choose_instance=True, bake=True, list_orphans=True)
DEFAULT_REGION = "cn-hangzhou"
# A public image to fall back on when the region has no baked ngcx host image (driver + Docker are
# then installed at boot: 5-10 min, cloud-apis.md §7).
FALLBACK_IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
TAG_OWNER, TAG_DEPLOYMENT, TAG_HOST_IMAGE = "ngcx:owner", "ngcx:deployment", "ngcx:host-image"
BOOT_TIMEOUT_S = 900.0
COMMAND_TIMEOUT_S = 900.0
STATE_MAP = {"Running": "running", "Stopped": "stopped", "Starting": "starting", "Pending": "pending",
             "Stopping": "stopping"}


@dataclass
class Plan:
    api: Any
    region: str
    candidates: list[Any]               # offers.Candidate, best first
    host_image: str
    baked: bool
    pull_ref: str
    registry: str
    login_region: str | None            # ACR region when the registry is ACR (temporary token per host job)
    notes: list[str] = field(default_factory=list)


def _say(line: str) -> None:
    print(f"ngcx: {line}", file=sys.stderr)


def region_of(config: DeployConfig) -> str:
    from ngcx.deploy.aliyun_api import credentials

    return config.region or credentials().region or DEFAULT_REGION


def choose(config: DeployConfig) -> Any:
    """The ranked instance types for this image (offers.choose over the Alibaba Cloud table)."""
    from ngcx.deploy import offers

    caps = [c for c in config.labels.get("ai.ngcx.compute-capabilities", "").split(",") if c]
    return offers.choose("aliyun", compute_capabilities=caps, driver_floor=config.labels.get("ai.ngcx.min-driver"),
                         gpu=config.gpu, workload=config.workload, max_price=config.max_price, spot=config.spot)


def prepare(config: DeployConfig) -> Plan:
    """Read-only checks: credentials work, an instance type fits, the image is in a registry."""
    from ngcx import acr
    from ngcx.deploy.aliyun_api import Api

    if not config.pull_ref or not config.registry:
        raise UserError(f"{config.image} has not been pushed to a registry the host can pull from",
                        hint="push it first (ngcx push IMAGE --registry acr://REGION/NAMESPACE) or pass --registry")
    region = region_of(config)
    api = Api(region)
    api.ecs("DescribeRegions")  # proves the credentials before anything is written
    choice = choose(config)
    if not choice.candidates:
        reasons = "; ".join(f"{r.itype.name}: {r.reason}" for r in choice.rejected[:4])
        raise UserError(f"no Alibaba Cloud instance type fits {config.image}: {reasons}",
                        hint="relax --gpu / --max-price, or see them all with --dry-run")
    host_image, baked = find_host_image(api)
    notes = [] if baked else [f"no baked ngcx host image in {region}: a fresh host installs its driver and Docker "
                              f"at boot (5-10 min); make one once: ngcx hosts bake --cloud aliyun --region {region}"]
    login_region = acr.region_of(config.registry)
    pull_ref = config.pull_ref
    if login_region:  # hosts pull in-region through the VPC endpoint
        pull_ref = acr.vpc_endpoint(login_region) + pull_ref[len(config.registry):]
    return Plan(api, region, choice.candidates, host_image, baked, pull_ref,
                acr.vpc_endpoint(login_region) if login_region else config.registry, login_region, notes)


def find_host_image(api: Any) -> tuple[str, bool]:
    """The newest Available image tagged ngcx:host-image in this region, else the public fallback."""
    from ngcx.deploy.aliyun_api import tag_params

    answer = api.ecs("DescribeImages", {"ImageOwnerAlias": "self", "Status": "Available", "PageSize": 100,
                                        **tag_params({TAG_HOST_IMAGE: "1"})})
    images = sorted(answer.get("Images", {}).get("Image", []), key=lambda i: i.get("CreationTime", ""))
    return (images[-1]["ImageId"], True) if images else (FALLBACK_IMAGE, False)


# ---------------------------------------------------------------- run: reuse, restart or create

def run(config: DeployConfig, record: DeployRecord, plan: Plan) -> DeployRecord:
    for note in plan.notes:
        _say(note)
    t0 = time.time()
    names = {c.itype.name for c in plan.candidates}
    for old, status in _reusable_hosts(plan, names, config, record.id):
        if status.state == "running":
            return _swap(config, record, plan, old, status, t0, PATH_RUNNING)
        try:
            status = _start_instance(plan.api, old.instance_id)
        except CapacityError as exc:
            _say(f"stopped host {old.instance_id} cannot start again ({exc.code}: its GPU was released); "
                 "creating a new host")
            store.update(old.id, detail=f"restart failed for stock ({exc.code}) at {time.ctime()}")
            continue
        return _swap(config, record, plan, old, status, t0, PATH_STOPPED)
    return _create(config, record, plan, t0)


def _reusable_hosts(plan: Plan, names: set[str], config: DeployConfig, new_id: int):
    """(record, status) of hosts of the same spec this store owns: running ones first, then stopped.

    A running host is reused only by a deploy of the same image (a redeploy swaps its container);
    one serving another model is never taken over. A stopped host is the warm pool: any image may
    take it (its record becomes `replaced`), keeping the layers the two images share.
    """
    olds = [r for r in store.records(cloud="aliyun") if r.id != new_id and r.instance_id and r.region == plan.region
            and r.instance_type in names and (config.zone is None or r.zone == config.zone)
            and (r.status == STOPPED or (r.status == READY and r.image == config.image))]
    if not olds:
        return []
    found = describe(plan.api, [r.instance_id for r in olds])
    pairs = [(r, found[r.instance_id]) for r in olds if r.instance_id in found]
    return sorted((p for p in pairs if p[1].state in ("running", "stopped")),
                  key=lambda p: (p[1].state != "running", -p[0].id))


def _swap(config: DeployConfig, record: DeployRecord, plan: Plan, old: DeployRecord, status: HostStatus,
          t0: float, path: str) -> DeployRecord:
    """Hand the host over from `old` to `record` and run the host script on it through Cloud Assistant."""
    store.update(old.id, status=REPLACED, pid=None, detail=f"host handed to deployment {record.id}")
    record = store.update(record.id, status=STARTING, instance_id=old.instance_id, instance_type=old.instance_type,
                          zone=old.zone, host=status.address, endpoint=_endpoint(status.address), path=path,
                          region=plan.region)
    t_api = time.time()
    if path == PATH_STOPPED:
        _wait_docker(plan.api, record.instance_id)
    t_boot = time.time()
    script = _host_script(config, record, plan, "command")
    code, output = run_command(plan.api, record.instance_id, script, COMMAND_TIMEOUT_S)
    if code != 0:
        raise UserError(f"the host script failed on {record.instance_id}: {_last(output)}")
    marks = _marks(output)
    phases = {"api": round(t_api - t0, 3), "boot": round(t_boot - t_api, 3)}
    return store.update(record.id, phases=phases, spec=dict(record.spec, marks=marks))


def _create(config: DeployConfig, record: DeployRecord, plan: Plan, t0: float) -> DeployRecord:
    """RunInstances over candidates x zones with stock; the first that is accepted wins."""
    from ngcx.deploy.aliyun_api import tag_params

    vswitches, group = network(plan.api, config.allow_from)
    tried: list[str] = []
    attempt = 0
    for cand in plan.candidates:
        for zone in _zones_with_stock(plan.api, cand.itype.name, config.zone):
            if zone not in vswitches:
                continue
            attempt += 1
            token = f"ngcx-{store.owner_id()}-{record.id}-{attempt}"
            record = store.update(record.id, status=CREATING, client_token=token, zone=zone,
                                  instance_type=cand.itype.name, region=plan.region, path=PATH_FRESH)
            user_data = base64.b64encode(_host_script(config, record, plan, "user-data").encode()).decode()
            params = {"RegionId": plan.region, "ImageId": plan.host_image, "InstanceType": cand.itype.name,
                      "ZoneId": zone, "VSwitchId": vswitches[zone], "SecurityGroupId": group, "UserData": user_data,
                      "InstanceName": f"ngcx-deploy-{record.id}", "InternetMaxBandwidthOut": 100, "Amount": 1,
                      "SystemDisk.Category": "cloud_essd", "SystemDisk.Size": 100,
                      **_spot(config),
                      **tag_params({TAG_OWNER: store.owner_id(), TAG_DEPLOYMENT: str(record.id)})}
            try:
                answer = plan.api.ecs("RunInstances", params, token=token, write=True)
            except CapacityError as exc:
                tried.append(f"{cand.itype.name} in {zone}: {exc.code}")
                _say(f"{cand.itype.name} in {zone}: {exc.code}; trying the next")
                continue
            instance_id = answer["InstanceIdSets"]["InstanceIdSet"][0]
            record = store.update(record.id, status=BOOTING, instance_id=instance_id)
            t_api = time.time()
            status = wait_state(plan.api, instance_id, "running", BOOT_TIMEOUT_S)
            phases = {"api": round(t_api - t0, 3), "boot": round(time.time() - t_api, 3)}
            return store.update(record.id, status=STARTING, host=status.address,
                                endpoint=_endpoint(status.address), phases=phases)
    raise UserError(f"no stock for any fitting instance type in {plan.region}: {'; '.join(tried) or 'none offered'}",
                    hint="try another --region or --gpu, or later")


def _spot(config: DeployConfig) -> dict[str, Any]:
    """Spot: capped at --max-price when one is given (SpotWithPriceLimit), else the market price."""
    if not config.spot:
        return {"SpotStrategy": "NoSpot"}
    if config.max_price is not None:
        return {"SpotStrategy": "SpotWithPriceLimit", "SpotPriceLimit": config.max_price}
    return {"SpotStrategy": "SpotAsPriceGo"}


def _zones_with_stock(api: Any, instance_type: str, zone: str | None) -> list[str]:
    """DescribeAvailableResource: the zones selling `instance_type` now, WithStock before ClosedWithStock."""
    params = {"DestinationResource": "InstanceType", "InstanceType": instance_type, "ZoneId": zone,
              "InstanceChargeType": "PostPaid"}
    answer = api.ecs("DescribeAvailableResource", params)
    ranked = []
    for item in answer.get("AvailableZones", {}).get("AvailableZone", []):
        if item.get("Status") != "Available" or item.get("StatusCategory") not in ("WithStock", "ClosedWithStock"):
            continue
        ranked.append((item.get("StatusCategory") != "WithStock", item["ZoneId"]))
    return [z for _, z in sorted(ranked)]


def network(api: Any, allow_from: str) -> tuple[dict[str, str], str]:
    """vSwitch per zone of the default VPC, and ngcx's security group there (port 8000 open to allow_from)."""
    from ngcx.deploy.aliyun_api import tag_params

    vpcs = api.ecs("DescribeVpcs", {"PageSize": 50}).get("Vpcs", {}).get("Vpc", [])
    if not vpcs:
        raise UserError(f"no VPC in {api.region}", hint="create one (with a vSwitch per zone) in the console")
    vpc = next((v for v in vpcs if v.get("IsDefault")), vpcs[0])["VpcId"]
    switches = api.ecs("DescribeVSwitches", {"VpcId": vpc, "PageSize": 50}).get("VSwitches", {}).get("VSwitch", [])
    by_zone = {s["ZoneId"]: s["VSwitchId"] for s in switches}
    tags = {TAG_OWNER: store.owner_id()}
    groups = api.ecs("DescribeSecurityGroups", {"VpcId": vpc, **tag_params(tags)}).get(
        "SecurityGroups", {}).get("SecurityGroup", [])
    if groups:
        return by_zone, groups[0]["SecurityGroupId"]
    group = api.ecs("CreateSecurityGroup", {"VpcId": vpc, "SecurityGroupName": "ngcx-serve",
                                            "Description": "ngcx deploy: KServe v2 HTTP", **tag_params(tags)},
                    token=f"ngcx-sg-{store.owner_id()}-{vpc}"[:64], write=True)["SecurityGroupId"]
    api.ecs("AuthorizeSecurityGroup", {"SecurityGroupId": group, "IpProtocol": "tcp",
                                       "PortRange": f"{SERVE_PORT}/{SERVE_PORT}", "SourceCidrIp": allow_from},
            token=f"ngcx-sgr-{group}"[:64], write=True)
    if allow_from == "0.0.0.0/0":
        _say(f"port {SERVE_PORT} of ngcx hosts is open to 0.0.0.0/0; restrict it with --allow-from CIDR")
    return by_zone, group


# ---------------------------------------------------------------- hosts: state, commands

def describe(api: Any, ids: list[str]) -> dict[str, HostStatus]:
    if not ids:
        return {}
    answer = api.ecs("DescribeInstances", {"InstanceIds": ids[:100], "PageSize": 100})
    return {i["InstanceId"]: _status(i) for i in answer.get("Instances", {}).get("Instance", [])}


def _status(item: dict[str, Any]) -> HostStatus:
    public = item.get("PublicIpAddress", {}).get("IpAddress") or []
    private = item.get("VpcAttributes", {}).get("PrivateIpAddress", {}).get("IpAddress") or []
    address = (public or private or [None])[0]
    return HostStatus(STATE_MAP.get(item.get("Status", ""), "pending"), address, item.get("InstanceType"),
                      item.get("ZoneId"))


def wait_state(api: Any, instance_id: str, state: str, timeout: float) -> HostStatus:
    """Poll DescribeInstances until `state` (bounded); 'gone' when the instance disappears."""
    deadline, pause = time.monotonic() + timeout, 0.25
    while True:
        status = describe(api, [instance_id]).get(instance_id, HostStatus("gone"))
        if status.state == state or status.state == "gone":
            return status
        if time.monotonic() > deadline:
            raise UserError(f"instance {instance_id} is still {status.state} after {timeout:.0f} s (wanted {state})",
                            hint="check it in the console; `ngcx deployments gc` finds it if it lingers")
        time.sleep(pause)
        pause = min(2.0, pause * 1.5)


def _start_instance(api: Any, instance_id: str) -> HostStatus:
    api.ecs("StartInstance", {"InstanceId": instance_id}, write=True)
    return wait_state(api, instance_id, "running", BOOT_TIMEOUT_S)


def run_command(api: Any, instance_id: str, script: str, timeout: float) -> tuple[int, str]:
    """Cloud Assistant: run `script` on the host; (exit code, output)."""
    answer = api.ecs("RunCommand", {"Type": "RunShellScript", "InstanceId.1": instance_id,
                                    "CommandContent": base64.b64encode(script.encode()).decode(),
                                    "ContentEncoding": "Base64", "Timeout": int(timeout)}, write=True)
    invoke = answer["InvokeId"]
    deadline, pause = time.monotonic() + timeout + 30, 0.1
    while time.monotonic() < deadline:
        results = api.ecs("DescribeInvocationResults", {"InvokeId": invoke}).get("Invocation", {}).get(
            "InvocationResults", {}).get("InvocationResult", [])
        for result in results:
            if result.get("InvocationStatus") in ("Success", "Failed", "Timeout", "Error", "Finished"):
                output = base64.b64decode(result.get("Output") or "").decode(errors="replace")
                return int(result.get("ExitCode") or 0), output
        time.sleep(pause)
        pause = min(1.0, pause * 1.5)
    raise UserError(f"Cloud Assistant command on {instance_id} did not finish in {timeout:.0f} s")


def _wait_docker(api: Any, instance_id: str) -> None:
    """After a start the host's dockerd needs a moment; the host script waits too, this bounds it."""
    code, out = run_command(api, instance_id, "i=0; until docker info >/dev/null 2>&1; do i=$((i+1)); "
                                              "[ $i -gt 600 ] && exit 1; sleep 0.2; done", 150)
    if code != 0:
        raise UserError(f"dockerd on {instance_id} did not come up after the start: {_last(out)}")


def _host_script(config: DeployConfig, record: DeployRecord, plan: Plan, mode: str) -> str:
    from ngcx import acr
    from ngcx.deploy import hostscript

    login = acr.temporary_login(plan.login_region) if plan.login_region else None
    job = hostscript.HostJob(record.id, plan.pull_ref, plan.registry, config.labels.get("ai.ngcx.min-driver", "0"),
                             config.gpu_mode, login, tuple(config.cmd), tuple(sorted(config.env.items())))
    return hostscript.render(job, mode)


def _marks(output: str) -> dict[str, float]:
    for line in reversed(output.splitlines()):
        if line.startswith("{") and '"started"' in line:
            return json.loads(line)
        if "started deployment" in line and "{" in line:
            return json.loads(line[line.index("{"):])
    return {}


def report_phases(record: DeployRecord, t_ready: float) -> dict[str, float]:
    """Split the time after boot into pull / start / ready with the host script's own timestamps."""
    marks = record.spec.get("marks") or _fetch_marks(record)
    phases = dict(record.phases)
    if marks:
        phases["pull"] = round(max(0.0, marks["pulled"] - marks["script"]), 3)
        phases["start"] = round(max(0.0, marks["started"] - marks["pulled"]), 3)
        phases["ready"] = round(max(0.0, t_ready - marks["started"]), 3)
    return phases


def _fetch_marks(record: DeployRecord) -> dict[str, float]:
    from ngcx.deploy.aliyun_api import Api

    try:
        code, out = run_command(Api(record.region or DEFAULT_REGION), record.instance_id or "",
                                "cat /var/lib/ngcx/phases.json", 60)
        return json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else {}
    except (UserError, ValueError, IndexError):
        return {}


def _endpoint(address: str | None) -> str | None:
    return f"http://{address}:{SERVE_PORT}" if address else None


def _last(text: str, n: int = 400) -> str:
    return " | ".join(line for line in text.splitlines() if line.strip())[-n:]


# ---------------------------------------------------------------- the contract's other verbs

def _api(record: DeployRecord) -> Any:
    from ngcx.deploy.aliyun_api import Api

    return Api(record.region or DEFAULT_REGION)


def container_failure(record: DeployRecord) -> str | None:
    """The host script's failure, or the container's exit with its last lines; None while all is well."""
    if not record.instance_id:
        return None
    probe = ("cat /var/lib/ngcx/failed 2>/dev/null && exit 3; "
             "s=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' ngcx-serve 2>/dev/null) || exit 0; "
             "case \"$s\" in exited*|dead*) echo \"the container exited (${s#* }): "
             "$(docker logs --tail 6 ngcx-serve 2>&1 | tr '\\n' '|')\"; exit 4;; esac")
    try:
        code, out = run_command(_api(record), record.instance_id, probe, 60)
    except UserError:
        return None
    if code == 3:
        return f"the host script failed: {_last(out)}"
    if code == 4:
        return _last(out, 600)
    return None


def cleanup_failed(record: DeployRecord, plan: Plan) -> str:
    """A host this deploy created is deleted (billed); a reused host keeps running without the container."""
    if record.path == PATH_FRESH:
        ids = [record.instance_id] if record.instance_id else _tagged(plan.api, {TAG_DEPLOYMENT: str(record.id)})
        for instance_id in ids:
            plan.api.ecs("DeleteInstance", {"InstanceId": instance_id, "Force": True}, write=True)
        return f"instance {', '.join(ids)} deleted" if ids else "no instance was created"
    if record.instance_id:
        run_command(plan.api, record.instance_id, "docker rm -f ngcx-serve >/dev/null 2>&1; true", 60)
        return f"host {record.instance_id} kept, its container removed"
    return ""


def _tagged(api: Any, tags: dict[str, str]) -> list[str]:
    from ngcx.deploy.aliyun_api import tag_params

    ids, page = [], 1
    while True:
        answer = api.ecs("DescribeInstances", {"PageSize": 100, "PageNumber": page, **tag_params(tags)})
        items = answer.get("Instances", {}).get("Instance", [])
        ids += [i["InstanceId"] for i in items]
        if len(items) < 100:
            return ids
        page += 1


def query(record: DeployRecord) -> HostStatus:
    if not record.instance_id:
        return HostStatus("gone")
    return describe(_api(record), [record.instance_id]).get(record.instance_id, HostStatus("gone"))


def start(record: DeployRecord) -> DeployRecord:
    """Start the stopped host; its container comes back by itself (--restart unless-stopped)."""
    api = _api(record)
    try:
        status = _start_instance(api, record.instance_id or "")
    except CapacityError as exc:
        raise UserError(f"host {record.instance_id} cannot start: {exc.code} (StopCharging released its GPU and "
                        "the zone has none now)", hint="deploy again to create a new host, or try later") from None
    return store.update(record.id, status=STARTING, host=status.address, endpoint=_endpoint(status.address))


def stop(record: DeployRecord) -> DeployRecord:
    """StopCharging: the GPU and vCPUs stop billing, the disk keeps the pulled layers for the next deploy."""
    api = _api(record)
    api.ecs("StopInstance", {"InstanceId": record.instance_id, "StoppedMode": "StopCharging"}, write=True)
    wait_state(api, record.instance_id or "", "stopped", 300)
    return record


def terminate(record: DeployRecord) -> DeployRecord:
    from ngcx.deploy.aliyun_api import AliyunError

    if record.instance_id:
        try:
            _api(record).ecs("DeleteInstance", {"InstanceId": record.instance_id, "Force": True}, write=True)
        except AliyunError as exc:
            if exc.code != "InvalidInstanceId.NotFound":
                raise
    return store.mark_destroyed(record.id)


def logs(record: DeployRecord, tail: int = 50) -> str:
    if not record.instance_id:
        return ""
    code, out = run_command(_api(record), record.instance_id,
                            f"docker logs --tail {int(tail)} ngcx-serve 2>&1 || tail -n {int(tail)} "
                            "/var/log/cloud-init-output.log 2>/dev/null", 60)
    return out


def orphans() -> list[dict[str, str]]:
    """Instances tagged with this store's owner id that no live record owns (in the regions it used)."""
    from ngcx.deploy.aliyun_api import Api, credentials

    regions = {r.region for r in store.records(cloud="aliyun", include_gone=True) if r.region}
    regions.add(credentials().region or DEFAULT_REGION)
    owned = store.owned_instance_ids("aliyun")
    found = []
    for region in sorted(regions):
        api = Api(region)
        answer_ids = _tagged(api, {TAG_OWNER: store.owner_id()})
        statuses = describe(api, answer_ids)
        for instance_id in answer_ids:
            if instance_id in owned:
                continue
            status = statuses.get(instance_id, HostStatus("gone"))
            found.append({"id": instance_id, "region": region, "status": status.state,
                          "type": status.instance_type or ""})
    return found


def delete_orphan(item: dict[str, str]) -> None:
    from ngcx.deploy.aliyun_api import Api

    Api(item["region"]).ecs("DeleteInstance", {"InstanceId": item["id"], "Force": True}, write=True)
