"""An Alibaba Cloud ECS emulator: a real HTTP server that aliyun-python-sdk-core talks to unchanged.

Why: the deploy code must be tested through the real SDK (signature v1, its retry policy, its
error rewriting) against a cloud that keeps real state — ClientToken idempotency, the instance
state machine, per-zone stock, economical-mode stops — and that can fail on purpose. The API
state lives here; "being a VM" is delegated to a HostBackend (hosts_api.py), so the same
emulator runs on paper in its own tests and on Docker containers in the product's e2e tests.

Where the real API leaves a choice open, the emulator takes the stricter reading and says so:
DescribeImages lists only Available images unless Status is given; DescribeInstances omits
`Tags` on an untagged instance; batch Start/Stop/Delete is all-or-nothing (BatchOptimization
AllTogether); StopInstance defaults to KeepCharging.

Instance RAM roles, RAM itself (2015-05-01, on the same port), the STS keys of roles and the
metadata service live in aliyun_ram.py, ALB (2020-06-16) and its haproxy data plane in aliyun_alb.py,
Auto Scaling (ESS 2014-08-28: groups of these instances behind ALB) in aliyun_ess.py; this module only wires
them in.
"""

from __future__ import annotations

import base64
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from .aliyun_alb import ALB_IDEMPOTENT, ALB_UNLOCKED, ALB_VERSION, Alb
from .aliyun_ess import ESS_IDEMPOTENT, ESS_VERSION, Ess
from .aliyun_ram import (
    ACCOUNT_UID,
    RAM_ACTIONS,
    RAM_VERSION,
    InstanceRoles,
    MetadataServer,
    MetadataService,
    Ram,
)
from .aliyun_rpc import (
    ApiError,
    RpcService,
    as_bool,
    as_int,
    decode_base64,
    indexed,
    invalid,
    iso_now,
    json_list,
    page,
    repeated,
    required,
)
from .hosts_api import HostBackend

ECS_VERSION = "2014-05-26"
CR_VERSION = "2018-12-01"
USER_DATA_LIMIT = 16 * 1024
STOPPED_MODES = ("KeepCharging", "StopCharging")
SPOT_STRATEGIES = ("NoSpot", "SpotWithPriceLimit", "SpotAsPriceGo")
# Actions whose ClientToken makes a retry safe (same token + same params -> the first answer).
IDEMPOTENT = frozenset({"RunInstances", "CreateImage", "CreateSecurityGroup", "DeleteInstances", "RunCommand"})
# Actions that call the backend while answering, so they must not hold the state lock meanwhile.
UNLOCKED = frozenset({"GetInstanceConsoleOutput"})


@dataclass(frozen=True)
class InstanceType:
    id: str
    family: str
    cpus: int
    memory_gib: float
    gpus: int
    gpu_spec: str
    gpu_memory_gib: float


INSTANCE_TYPES: dict[str, InstanceType] = {t.id: t for t in (
    InstanceType("ecs.gn6i-c4g1.xlarge", "ecs.gn6i", 4, 15, 1, "NVIDIA T4", 16),
    InstanceType("ecs.gn6v-c8g1.2xlarge", "ecs.gn6v", 8, 32, 1, "NVIDIA V100", 16),
    InstanceType("ecs.gn6e-c12g1.3xlarge", "ecs.gn6e", 12, 92, 1, "NVIDIA V100", 32),
    InstanceType("ecs.gn7i-c8g1.2xlarge", "ecs.gn7i", 8, 30, 1, "NVIDIA A10", 24),
    InstanceType("ecs.gn7-c12g1.3xlarge", "ecs.gn7", 12, 94, 1, "NVIDIA A100", 40),
    InstanceType("ecs.gn8is.2xlarge", "ecs.gn8is", 8, 64, 1, "NVIDIA L20", 48),
)}
PUBLIC_IMAGES = {
    "ubuntu_22_04_x64_20G_alibase_20240926.vhd": "Ubuntu  22.04 64 bit",
    "ubuntu_24_04_x64_20G_alibase_20240923.vhd": "Ubuntu  24.04 64 bit",
    "aliyun_3_x64_20G_alibase_20240819.vhd": "Alibaba Cloud Linux  3.2104 LTS 64 bit",
}


def _new_id(prefix: str, length: int = 18) -> str:
    return prefix + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length))


def _tag_list(tags: Mapping[str, str]) -> dict[str, Any]:
    """ECS prints tags as TagKey/TagValue (requests send Key/Value)."""
    return {"Tag": [{"TagKey": key, "TagValue": value} for key, value in tags.items()]}


@dataclass
class Instance:
    id: str
    name: str
    type: InstanceType
    zone: str
    vswitch_id: str
    vpc_id: str
    image_id: str
    security_group_ids: list[str]
    tags: dict[str, str]
    bandwidth_out: int
    spot_strategy: str
    client_token: str
    user_data: bytes
    status: str = "Pending"
    stopped_mode: str = "Not-applicable"
    private_ip: str = ""
    public_ip: str = ""
    created: str = field(default_factory=lambda: iso_now(minutes=True))
    on_host: bool = False        # hosts.create returned: the backend has a machine to stop/delete
    generation: int = 0          # bumped by every transition; a worker of an older one stands down
    host_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # orders backend calls
    ram_role: str = ""           # the instance RAM role (RunInstances RamRoleName, AttachInstanceRamRole)


@dataclass
class Image:
    id: str
    name: str
    status: str
    owner: str                   # "system" (public) or "self" (CreateImage)
    tags: dict[str, str] = field(default_factory=dict)
    source_instance: str = ""
    created: str = field(default_factory=iso_now)


@dataclass
class SecurityGroup:
    id: str
    name: str
    vpc_id: str
    description: str
    tags: dict[str, str]
    rules: list[dict[str, str]] = field(default_factory=list)
    created: str = field(default_factory=iso_now)


@dataclass
class Invocation:
    invoke_id: str
    command_id: str
    instance_id: str
    script: str = ""
    status: str = "Running"
    exit_code: int | None = None
    output: str = ""
    error: str = ""
    started: str = field(default_factory=iso_now)
    finished: str = ""


class EcsEmulator(RpcService):
    """ECS (2014-05-26) + ACR GetAuthorizationToken (2018-12-01) + RAM (2015-05-01) on 127.0.0.1, state
    behind one lock, and the instances' metadata service on its own port (metadata_address)."""

    products = {ECS_VERSION: ("Ecs", "ecs.aliyuncs.com"), CR_VERSION: ("cr", "cr.aliyuncs.com"),
                RAM_VERSION: ("Ram", "ram.aliyuncs.com"), ALB_VERSION: ("Alb", "alb.aliyuncs.com"),
                ESS_VERSION: ("Ess", "ess.aliyuncs.com")}
    idempotent = IDEMPOTENT | ALB_IDEMPOTENT | ESS_IDEMPOTENT
    unlocked = UNLOCKED | ALB_UNLOCKED
    regionless = frozenset({"DescribeRegions"}) | RAM_ACTIONS

    def __init__(self, hosts: HostBackend, *, access_keys: Mapping[str, str] | None = None,
                 region: str = "cn-hangzhou",
                 zones: Iterable[str] = ("cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j"),
                 boot_seconds: float = 0.5, start_seconds: float = 0.5, stop_seconds: float = 0.2,
                 offerings: Mapping[str, Iterable[str]] | None = None, metadata_host: str = "127.0.0.1") -> None:
        """`offerings`: zone -> the instance types it sells; default every type everywhere except
        ecs.gn8is.2xlarge, which only the last zone offers (so ZoneNotSupported can happen).
        `metadata_host`: where the metadata service listens (the instances must reach it there)."""
        super().__init__({"test-ak": "test-secret"} if access_keys is None else access_keys, region)
        self.hosts = hosts
        self.zones = tuple(zones)
        self.boot_seconds, self.start_seconds, self.stop_seconds = boot_seconds, start_seconds, stop_seconds
        self.issued_tokens: list[str] = []
        self.token_grants: list[dict[str, Any]] = []   # {"token", "caller", "instance", "pull"} per issued token
        self.ram = Ram(self._lock)
        self.temporary_keys = self.ram.temporary_secret
        self.instance_roles = InstanceRoles(self.ram, self._instance, lambda: self._instances.values(), region)
        self.metadata_host = metadata_host
        self._metadata: MetadataServer | None = None
        self.host_errors: list[tuple[str, str]] = []   # (instance or image id, what the backend raised)
        self._offered = self._default_offerings() if offerings is None else {
            zone: set(types) for zone, types in offerings.items()}
        self._stock: dict[tuple[str, str], bool] = {}
        self._instances: dict[str, Instance] = {}
        self._images = {image_id: Image(image_id, name, "Available", "system")
                        for image_id, name in PUBLIC_IMAGES.items()}
        self._vpc_id = _new_id("vpc-bp")
        self._vswitches = {_new_id("vsw-bp"): zone for zone in self.zones}
        self._security_groups: dict[str, SecurityGroup] = {}
        self._invocations: dict[str, list[Invocation]] = {}
        self._restart_failures: set[str] = set()
        self.alb = Alb(self._lock, self._spawn, self._sleep_until, self._vpc_id, self._vswitches, self._instances.get,
                       region)    # ALB 2020-06-16 (aliyun_alb.py), its data plane a haproxy per load balancer
        self.ess = Ess(self)    # Auto Scaling 2014-08-28 (aliyun_ess.py): groups of these instances behind ALB
        self.actions = {
            ECS_VERSION: {
                "DescribeRegions": self._describe_regions, "DescribeZones": self._describe_zones,
                "DescribeInstanceTypes": self._describe_instance_types,
                "DescribeAvailableResource": self._describe_available_resource,
                "DescribeVpcs": self._describe_vpcs, "DescribeVSwitches": self._describe_vswitches,
                "DescribeSecurityGroups": self._describe_security_groups,
                "DescribeSecurityGroupAttribute": self._describe_security_group_attribute,
                "CreateSecurityGroup": self._create_security_group,
                "AuthorizeSecurityGroup": self._authorize_security_group,
                "RunInstances": self._run_instances, "DescribeInstances": self._describe_instances,
                "StartInstance": self._start_instances, "StartInstances": self._start_instances,
                "StopInstance": self._stop_instances, "StopInstances": self._stop_instances,
                "DeleteInstance": self._delete_instances, "DeleteInstances": self._delete_instances,
                "CreateImage": self._create_image, "DescribeImages": self._describe_images,
                "DeleteImage": self._delete_image, "RunCommand": self._run_command,
                "DescribeInvocationResults": self._describe_invocation_results,
                "GetInstanceConsoleOutput": self._console_output,
            },
            CR_VERSION: {"GetAuthorizationToken": self._get_authorization_token},
            RAM_VERSION: self.ram.actions,
            ALB_VERSION: self.alb.actions,
            ESS_VERSION: self.ess.actions,
        }
        self.actions[ECS_VERSION].update(self.instance_roles.actions)

    def start(self) -> Self:
        """The API on a free loopback port, the metadata service on a free port of metadata_host."""
        super().start()
        if self._metadata is None:
            self._metadata = MetadataServer(self.metadata_host,
                                            MetadataService(self._metadata_caller, self.ram, self.region))
        return self

    @property
    def metadata_address(self) -> str:
        """host:port of the metadata service (what 100.100.100.200:80 is on ECS)."""
        if self._metadata is None:
            raise RuntimeError("EcsEmulator.start() first")
        return self._metadata.address

    def close(self) -> None:
        """Stop serving, let running backend calls finish, then have the backend remove its machines."""
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
        super().close()
        self.alb.close()
        self.hosts.close()

    # --- fault injection and inspection (tests) -----------------------------------------

    def set_stock(self, zone: str, instance_type: str, available: bool) -> None:
        if zone not in self.zones or instance_type not in INSTANCE_TYPES:
            raise ValueError(f"unknown zone or instance type: {zone} {instance_type}")
        with self._lock:
            self._stock[(zone, instance_type)] = available

    def fail_restart(self, instance_id: str) -> None:
        """The next StartInstance of this instance answers 403 OperationDenied.NoStock."""
        with self._lock:
            self._restart_failures.add(instance_id)

    def instances(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": i.id, "name": i.name, "status": i.status, "zone": i.zone, "type": i.type.id,
                     "image_id": i.image_id, "tags": dict(i.tags), "client_token": i.client_token,
                     "private_ip": i.private_ip, "public_ip": i.public_ip, "stopped_mode": i.stopped_mode,
                     "bandwidth_out": i.bandwidth_out, "spot_strategy": i.spot_strategy,
                     "security_group_ids": list(i.security_group_ids), "user_data": i.user_data,
                     "ram_role": i.ram_role}
                    for i in self._instances.values()]

    def commands_sent(self, instance_id: str) -> list[str]:
        """The scripts of the Cloud Assistant commands this instance has been sent, in order (each one a round
        trip of a deploy)."""
        with self._lock:
            return [i.script for batch in self._invocations.values() for i in batch if i.instance_id == instance_id]

    def balancer_address(self, load_balancer: str, listener_port: int) -> tuple[str, int]:
        """(host, port) where the data plane serves this ALB listener (load balancer id or DNSName)."""
        return self.alb.address(load_balancer, listener_port)

    def issued_secrets(self) -> list[str]:
        """Every STS AccessKeySecret and SecurityToken handed out (tests search logs for them)."""
        return self.ram.issued_secrets()

    def _metadata_caller(self, ip: str) -> tuple[str, str] | None:
        """(instance id, role) of the one Running instance with this private IP: the metadata caller."""
        with self._lock:
            found = [i for i in self._instances.values() if i.status == "Running" and i.private_ip == ip]
            return (found[0].id, found[0].ram_role) if len(found) == 1 else None

    def images(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": m.id, "name": m.name, "status": m.status, "owner": m.owner, "tags": dict(m.tags),
                     "source_instance": m.source_instance} for m in self._images.values()]

    # --- backend workers: one per transition, ordered per instance by its host_lock ------------

    def _current(self, inst: Instance, generation: int) -> bool:
        return self._instances.get(inst.id) is inst and inst.generation == generation

    def _still(self, inst: Instance, generation: int) -> bool:
        """Locked _current: a worker whose transition was overtaken (deleted meanwhile) does nothing."""
        with self._lock:
            return self._current(inst, generation)

    def _host_failed(self, resource_id: str, call: str, exc: BaseException) -> None:
        with self._lock:
            self.host_errors.append((resource_id, f"{call}: {type(exc).__name__}: {exc}"[:500]))

    def _finish(self, inst: Instance, generation: int, change: Callable[[Instance], None]) -> None:
        with self._lock:
            if self._current(inst, generation):
                change(inst)

    def _boot(self, inst: Instance, generation: int, ready_at: float) -> None:
        """Pending first (boot_seconds: ECS placing and powering on the VM), then the machine boots for real:
        as on ECS, nothing on the machine (its user-data) runs while the API still says Pending."""
        if not self._sleep_until(ready_at):
            return
        with inst.host_lock:
            if not self._still(inst, generation):
                return
            try:
                ip = self.hosts.create(inst.id, inst.image_id, inst.user_data)
            except Exception as exc:  # any backend failure is the cloud's SystemFailure.Delete
                self._host_failed(inst.id, "create", exc)
                with self._lock:
                    if self._current(inst, generation):
                        del self._instances[inst.id]
                return
            with self._lock:
                inst.on_host = True
                if self._current(inst, generation):
                    inst.private_ip, inst.status = ip, "Running"
                    inst.public_ip = ip if inst.bandwidth_out > 0 else ""

    def _stop(self, inst: Instance, generation: int, mode: str, done_at: float) -> None:
        with inst.host_lock:
            if not self._still(inst, generation):
                return
            try:
                self.hosts.stop(inst.id)
            except Exception as exc:  # the stop failed: the machine keeps running
                self._host_failed(inst.id, "stop", exc)
                self._finish(inst, generation, lambda i: setattr(i, "status", "Running"))
                return

        def stopped(i: Instance) -> None:
            i.status, i.stopped_mode = "Stopped", mode
            if mode == "StopCharging":      # economical mode releases the public IP (cloud-apis.md §5.3)
                i.public_ip = ""
        if self._sleep_until(done_at):
            self._finish(inst, generation, stopped)

    def _start(self, inst: Instance, generation: int, done_at: float) -> None:
        """Starting for start_seconds, then the machine powers on (its disk and containers as they were)."""
        if not self._sleep_until(done_at):
            return
        with inst.host_lock:
            if not self._still(inst, generation):
                return
            try:
                ip = self.hosts.start(inst.id)
            except Exception as exc:  # the start failed: the machine stays stopped
                self._host_failed(inst.id, "start", exc)
                self._finish(inst, generation, lambda i: setattr(i, "status", "Stopped"))
                return

        def addressed(i: Instance) -> None:
            i.private_ip, i.public_ip = ip, (ip if i.bandwidth_out > 0 else "")

        def running(i: Instance) -> None:
            i.status, i.stopped_mode = "Running", "Not-applicable"
        self._finish(inst, generation, addressed)
        self._finish(inst, generation, running)

    def _destroy(self, inst: Instance) -> None:
        with inst.host_lock:        # after a create still in flight, so no machine is left behind
            if inst.on_host:
                try:
                    self.hosts.delete(inst.id)
                except Exception as exc:  # reported, the API already forgot the instance
                    self._host_failed(inst.id, "delete", exc)

    # --- shared lookups and parameters ----------------------------------------------------

    def _default_offerings(self) -> dict[str, set[str]]:
        everywhere = set(INSTANCE_TYPES) - {"ecs.gn8is.2xlarge"}
        offered = {zone: set(everywhere) for zone in self.zones}
        if self.zones:
            offered[self.zones[-1]].add("ecs.gn8is.2xlarge")
        return offered

    def _in_stock(self, zone: str, type_id: str) -> bool:
        return self._stock.get((zone, type_id), True)

    def _check_capacity(self, zone: str, type_id: str) -> None:
        if type_id not in self._offered.get(zone, set()):
            raise ApiError(403, "InvalidInstanceType.ZoneNotSupported",
                           f"The specified zone {zone} does not offer the instance type {type_id}.")
        if not self._in_stock(zone, type_id):
            raise ApiError(403, "OperationDenied.NoStock")

    def _instance(self, instance_id: str) -> Instance:
        inst = self._instances.get(instance_id)
        if inst is None:
            raise ApiError(404, "InvalidInstanceId.NotFound", f"The specified InstanceId {instance_id} does not exist.")
        return inst

    def _instance_ids(self, params: dict[str, str]) -> list[str]:
        """InstanceId (singular actions) or InstanceId.N (plural ones), 1..100 of them."""
        ids = [params["InstanceId"]] if params.get("InstanceId") else repeated(params, "InstanceId")
        if not ids:
            raise ApiError(400, "MissingInstanceId",
                           'The input parameter "InstanceId" that is mandatory for processing this request '
                           "is not supplied.")
        if len(ids) > 100:
            raise invalid("InstanceId.N", "At most 100 instances.")
        return ids

    @staticmethod
    def _incorrect_status(inst: Instance, wanted: str) -> ApiError:
        return ApiError(403, "IncorrectInstanceStatus",
                        f"The current status of the resource does not support this operation: {inst.id} is "
                        f"{inst.status}, this needs {wanted}.")

    @staticmethod
    def _tags(params: dict[str, str]) -> dict[str, str]:
        tags: dict[str, str] = {}
        for tag in indexed(params, "Tag"):
            key = tag.get("Key", "")
            if not key or len(key) > 128 or key.startswith(("aliyun", "acs:")):
                raise ApiError(400, "InvalidTagKey.Malformed", "The specified Tag.n.Key is not valid.")
            tags[key] = tag.get("Value", "")
        if len(tags) > 20:
            raise invalid("Tag.N", "At most 20 tags.")
        return tags

    @staticmethod
    def _tags_match(tags: Mapping[str, str], params: dict[str, str]) -> bool:
        """Tag.N.Key (+ .Value) filters: every given tag must be present (with that value)."""
        return all(want.get("Key") in tags and ("Value" not in want or tags[want["Key"]] == want["Value"])
                   for want in indexed(params, "Tag"))

    # --- regions, zones, types, stock ------------------------------------------------------

    def _describe_regions(self, params: dict[str, str]) -> dict[str, Any]:
        return {"Regions": {"Region": [{"RegionId": self.region, "LocalName": self.region, "Status": "available",
                                        "RegionEndpoint": f"ecs.{self.region}.aliyuncs.com"}]}}

    def _describe_zones(self, params: dict[str, str]) -> dict[str, Any]:
        return {"Zones": {"Zone": [
            {"ZoneId": zone, "LocalName": zone,
             "AvailableResourceCreation": {"ResourceTypes": ["Instance", "Disk", "VSwitch"]},
             "AvailableInstanceTypes": {"InstanceTypes": sorted(self._offered.get(zone, ()))}}
            for zone in self.zones]}}

    def _describe_instance_types(self, params: dict[str, str]) -> dict[str, Any]:
        wanted = set(repeated(params, "InstanceTypes"))
        family = params.get("InstanceTypeFamily", "")
        return {"InstanceTypes": {"InstanceType": [
            {"InstanceTypeId": t.id, "InstanceTypeFamily": t.family, "CpuCoreCount": t.cpus,
             "MemorySize": t.memory_gib, "GPUAmount": t.gpus, "GPUSpec": t.gpu_spec,
             "GPUMemorySize": t.gpu_memory_gib}
            for t in INSTANCE_TYPES.values()
            if (not wanted or t.id in wanted) and (not family or t.family == family)]}}

    def _describe_available_resource(self, params: dict[str, str]) -> dict[str, Any]:
        destination = required(params, "DestinationResource")
        if destination not in ("Zone", "InstanceType"):
            raise invalid("DestinationResource", "The emulator answers Zone and InstanceType.")
        zone_filter, type_filter = params.get("ZoneId", ""), params.get("InstanceType", "")
        zones = []
        for zone in self.zones:
            types = sorted(t for t in self._offered.get(zone, ()) if not type_filter or t == type_filter)
            if (zone_filter and zone != zone_filter) or not types:
                continue
            supported = [{"Value": t, "Status": "Available" if self._in_stock(zone, t) else "SoldOut",
                          "StatusCategory": "WithStock" if self._in_stock(zone, t) else "WithoutStock"}
                         for t in types]
            any_stock = any(item["Status"] == "Available" for item in supported)
            zones.append({"RegionId": self.region, "ZoneId": zone,
                          "Status": "Available" if any_stock else "SoldOut",
                          "StatusCategory": "WithStock" if any_stock else "WithoutStock",
                          "AvailableResources": {"AvailableResource": [
                              {"Type": destination, "SupportedResources": {"SupportedResource": supported}}]}})
        return {"AvailableZones": {"AvailableZone": zones}}

    # --- network ----------------------------------------------------------------------------

    def _describe_vpcs(self, params: dict[str, str]) -> dict[str, Any]:
        vpcs = [{"VpcId": self._vpc_id, "RegionId": self.region, "Status": "Available", "VpcName": "default",
                 "CidrBlock": "172.16.0.0/12", "IsDefault": True, "CreationTime": iso_now(),
                 "VSwitchIds": {"VSwitchId": list(self._vswitches)}}]
        vpcs = [v for v in vpcs if params.get("VpcId", v["VpcId"]) == v["VpcId"]]
        items, paging = page(vpcs, params)
        return {"Vpcs": {"Vpc": items}, **paging}

    def _describe_vswitches(self, params: dict[str, str]) -> dict[str, Any]:
        found = [{"VSwitchId": vsw, "VpcId": self._vpc_id, "ZoneId": zone, "Status": "Available",
                  "CidrBlock": f"172.{16 + n}.0.0/20", "IsDefault": True, "AvailableIpAddressCount": 4000,
                  "VSwitchName": f"default-{zone}"}
                 for n, (vsw, zone) in enumerate(self._vswitches.items())]
        found = [v for v in found if all(params.get(k, v[k]) == v[k] for k in ("VpcId", "ZoneId", "VSwitchId"))]
        items, paging = page(found, params)
        return {"VSwitches": {"VSwitch": items}, **paging}

    def _group(self, group_id: str) -> SecurityGroup:
        group = self._security_groups.get(group_id)
        if group is None:
            raise ApiError(404, "InvalidSecurityGroupId.NotFound", f"The specified SecurityGroupId {group_id} "
                                                                   "does not exist.")
        return group

    def _describe_security_groups(self, params: dict[str, str]) -> dict[str, Any]:
        ids = json_list(params, "SecurityGroupIds")
        if params.get("SecurityGroupId"):
            ids = [params["SecurityGroupId"]]
        found = [g for g in self._security_groups.values()
                 if (ids is None or g.id in ids) and params.get("VpcId", g.vpc_id) == g.vpc_id
                 and params.get("SecurityGroupName", g.name) == g.name and self._tags_match(g.tags, params)]
        items, paging = page(found, params)
        return {"RegionId": self.region, **paging, "SecurityGroups": {"SecurityGroup": [
            {"SecurityGroupId": g.id, "SecurityGroupName": g.name, "VpcId": g.vpc_id, "Description": g.description,
             "SecurityGroupType": "normal", "CreationTime": g.created, "Tags": _tag_list(g.tags)}
            for g in items]}}

    def _describe_security_group_attribute(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(required(params, "SecurityGroupId"))
        return {"RegionId": self.region, "SecurityGroupId": group.id, "SecurityGroupName": group.name,
                "VpcId": group.vpc_id, "Description": group.description, "InnerAccessPolicy": "Accept",
                "Permissions": {"Permission": [dict(rule) for rule in group.rules]}}

    def _create_security_group(self, params: dict[str, str]) -> dict[str, Any]:
        vpc_id = params.get("VpcId") or self._vpc_id
        if vpc_id != self._vpc_id:
            raise ApiError(404, "InvalidVpcId.NotFound", f"The specified VpcId {vpc_id} does not exist.")
        group = SecurityGroup(_new_id("sg-bp"), params.get("SecurityGroupName", ""), vpc_id,
                              params.get("Description", ""), self._tags(params))
        self._security_groups[group.id] = group
        return {"SecurityGroupId": group.id}

    def _authorize_security_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(required(params, "SecurityGroupId"))
        rules = indexed(params, "Permissions") or [params]
        for rule in rules:
            stored = self._rule(rule)
            if stored not in group.rules:       # re-authorizing the same rule is a no-op, not a duplicate
                group.rules.append(stored)
        return {}

    @staticmethod
    def _rule(rule: Mapping[str, str]) -> dict[str, str]:
        protocol = (rule.get("IpProtocol") or "").lower()
        if not protocol:
            raise ApiError(400, "MissingIpProtocol", 'The input parameter "IpProtocol" that is mandatory for '
                                                     "processing this request is not supplied.")
        if protocol not in ("tcp", "udp", "icmp", "gre", "all"):
            raise ApiError(400, "InvalidIpProtocol.Malformed", "The specified IpProtocol is not valid.")
        port_range = rule.get("PortRange", "")
        low, _, high = port_range.partition("/")
        valid = port_range == "-1/-1" or (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high) <= 65535)
        if not valid:
            raise ApiError(400, "InvalidPortRange.Malformed", f"The specified PortRange {port_range!r} is not valid "
                                                              "(expected from/to, e.g. 8000/8000).")
        return {"IpProtocol": protocol.upper(), "PortRange": port_range, "Direction": "ingress",
                "SourceCidrIp": rule.get("SourceCidrIp", ""), "Policy": rule.get("Policy") or "Accept",
                "Priority": rule.get("Priority") or "1", "Description": rule.get("Description", "")}

    # --- instances --------------------------------------------------------------------------

    def _placement(self, params: dict[str, str], type_id: str) -> tuple[str, str]:
        """(zone, vSwitch): from VSwitchId, else ZoneId's default vSwitch, else a zone with stock."""
        vswitch, zone = params.get("VSwitchId", ""), params.get("ZoneId", "")
        if vswitch:
            if vswitch not in self._vswitches:
                raise ApiError(404, "InvalidVSwitchId.NotFound", f"The specified VSwitchId {vswitch} does not exist.")
            if zone and zone != self._vswitches[vswitch]:
                raise invalid("ZoneId", f"VSwitch {vswitch} is in zone {self._vswitches[vswitch]}.")
            return self._vswitches[vswitch], vswitch
        if zone and zone not in self.zones:
            raise ApiError(404, "InvalidZoneId.NotFound", f"The specified zone {zone} does not exist.")
        if not zone:
            offering = [z for z in self.zones if type_id in self._offered.get(z, set())]
            zone = next((z for z in offering if self._in_stock(z, type_id)), offering[0] if offering else self.zones[0])
        return zone, next(v for v, z in self._vswitches.items() if z == zone)

    def _user_data(self, params: dict[str, str]) -> bytes:
        encoded = params.get("UserData", "")
        if not encoded:
            return b""
        raw = decode_base64(encoded)
        if raw is None:
            raise ApiError(400, "InvalidUserData.Base64FormatInvalid", "The specified UserData is not valid Base64.")
        if len(raw) > USER_DATA_LIMIT:
            raise ApiError(400, "InvalidUserData.SizeExceeded",
                           f"The specified UserData is {len(raw)} bytes; at most {USER_DATA_LIMIT} before Base64.")
        return raw

    def _run_instances(self, params: dict[str, str]) -> dict[str, Any]:
        image_id, type_id = required(params, "ImageId"), required(params, "InstanceType")
        itype = INSTANCE_TYPES.get(type_id)
        if itype is None:
            raise ApiError(400, "InvalidInstanceType.ValueNotSupported",
                           f"The specified InstanceType {type_id} is not supported.")
        amount = as_int(params, "Amount", 1, 1, 100)
        image = self._images.get(image_id)
        if image is None or image.status != "Available":
            raise ApiError(404, "InvalidImageId.NotFound", f"The specified ImageId {image_id} does not exist.")
        zone, vswitch = self._placement(params, type_id)
        groups = repeated(params, "SecurityGroupIds") or ([params["SecurityGroupId"]]
                                                           if params.get("SecurityGroupId") else [])
        for group_id in groups:
            self._group(group_id)
        user_data = self._user_data(params)
        bandwidth = as_int(params, "InternetMaxBandwidthOut", 0, 0, 100)
        spot = params.get("SpotStrategy") or "NoSpot"
        if spot not in SPOT_STRATEGIES:
            raise invalid("SpotStrategy", f"Expected one of {', '.join(SPOT_STRATEGIES)}.")
        tags = self._tags(params)
        role = self.instance_roles.launch_role(params)
        self._check_capacity(zone, type_id)
        if as_bool(params, "DryRun"):
            raise ApiError(400, "DryRunOperation", "Request validation has been passed with DryRun flag set.")
        ids = []
        for _ in range(amount):
            inst = Instance(_new_id("i-bp"), "", itype, zone, vswitch, self._vpc_id, image_id, groups, dict(tags),
                            bandwidth, spot, params.get("ClientToken", ""), user_data)
            inst.name, inst.ram_role = params.get("InstanceName") or inst.id, role
            self._instances[inst.id] = inst
            ids.append(inst.id)
            self._spawn(self._boot, inst, inst.generation, time.monotonic() + self.boot_seconds)
        return {"InstanceIdSets": {"InstanceIdSet": ids}}

    def _instance_view(self, inst: Instance) -> dict[str, Any]:
        view: dict[str, Any] = {
            "InstanceId": inst.id, "InstanceName": inst.name, "HostName": f"iZ{inst.id[2:]}Z",
            "Status": inst.status, "InstanceType": inst.type.id, "InstanceTypeFamily": inst.type.family,
            "Cpu": inst.type.cpus, "Memory": int(inst.type.memory_gib * 1024), "GPUAmount": inst.type.gpus,
            "GPUSpec": inst.type.gpu_spec, "ZoneId": inst.zone, "RegionId": self.region, "ImageId": inst.image_id,
            "CreationTime": inst.created, "StoppedMode": inst.stopped_mode, "InstanceChargeType": "PostPaid",
            "InternetChargeType": "PayByTraffic", "InternetMaxBandwidthOut": inst.bandwidth_out,
            "SpotStrategy": inst.spot_strategy, "InstanceNetworkType": "vpc", "OSType": "linux",
            "ExpiredTime": "2099-12-31T15:59Z", "DeletionProtection": False,
            "SecurityGroupIds": {"SecurityGroupId": list(inst.security_group_ids)},
            "PublicIpAddress": {"IpAddress": [inst.public_ip] if inst.public_ip else []},
            "InnerIpAddress": {"IpAddress": []}, "EipAddress": {"IpAddress": "", "AllocationId": ""},
            "VpcAttributes": {"VpcId": inst.vpc_id, "VSwitchId": inst.vswitch_id, "NatIpAddress": "",
                              "PrivateIpAddress": {"IpAddress": [inst.private_ip] if inst.private_ip else []}},
        }
        if inst.tags:
            view["Tags"] = _tag_list(inst.tags)
        return view

    def _describe_instances(self, params: dict[str, str]) -> dict[str, Any]:
        ids = json_list(params, "InstanceIds")
        simple = ("Status", "ZoneId", "InstanceType", "VpcId", "VSwitchId", "InstanceName", "ImageId")
        found = []
        for inst in self._instances.values():
            view = self._instance_view(inst)
            flat = {**view, "VpcId": inst.vpc_id, "VSwitchId": inst.vswitch_id}
            if ids is not None and inst.id not in ids:
                continue
            if all(params.get(k, "") in ("", flat[k]) for k in simple) and self._tags_match(inst.tags, params):
                found.append(view)
        items, paging = page(found, params)
        return {"Instances": {"Instance": items}, **paging}

    def _start_instances(self, params: dict[str, str]) -> dict[str, Any]:
        instances = [self._instance(i) for i in self._instance_ids(params)]
        for inst in instances:      # all or nothing: every instance is checked before any starts
            if inst.status != "Stopped":
                raise self._incorrect_status(inst, "Stopped")
            forced = inst.id in self._restart_failures
            if forced or (inst.stopped_mode == "StopCharging" and not self._in_stock(inst.zone, inst.type.id)):
                self._restart_failures.discard(inst.id)     # economical mode gave the GPU back (§5.3)
                raise ApiError(403, "OperationDenied.NoStock")
        for inst in instances:
            inst.status = "Starting"
            inst.generation += 1
            self._spawn(self._start, inst, inst.generation, time.monotonic() + self.start_seconds)
        return self._batch_answer(instances, "Stopped", params)

    def _stop_instances(self, params: dict[str, str]) -> dict[str, Any]:
        instances = [self._instance(i) for i in self._instance_ids(params)]
        mode = params.get("StoppedMode") or "KeepCharging"
        if mode not in STOPPED_MODES:
            raise invalid("StoppedMode", "Expected KeepCharging or StopCharging.")
        for inst in instances:
            if inst.status != "Running":
                raise self._incorrect_status(inst, "Running")
        for inst in instances:
            inst.status = "Stopping"
            inst.generation += 1
            self._spawn(self._stop, inst, inst.generation, mode, time.monotonic() + self.stop_seconds)
        return self._batch_answer(instances, "Running", params)

    @staticmethod
    def _batch_answer(instances: list[Instance], previous: str, params: dict[str, str]) -> dict[str, Any]:
        """StartInstances/StopInstances list each instance; the singular actions answer only RequestId."""
        if params.get("InstanceId"):
            return {}
        return {"InstanceResponses": {"InstanceResponse": [
            {"InstanceId": i.id, "Code": "200", "Message": "success", "PreviousStatus": previous,
             "CurrentStatus": i.status} for i in instances]}}

    def _delete_instances(self, params: dict[str, str]) -> dict[str, Any]:
        instances = [self._instance(i) for i in self._instance_ids(params)]
        force = as_bool(params, "Force")
        for inst in instances:
            if inst.status != "Stopped" and not force:
                raise self._incorrect_status(inst, "Stopped (or Force=true)")
        for inst in instances:
            del self._instances[inst.id]
            inst.generation += 1
            self._spawn(self._destroy, inst)
        return {}

    # --- images -----------------------------------------------------------------------------

    def _create_image(self, params: dict[str, str]) -> dict[str, Any]:
        inst = self._instance(required(params, "InstanceId"))
        if inst.status not in ("Running", "Stopped"):
            raise self._incorrect_status(inst, "Running or Stopped")
        name = params.get("ImageName", "")
        if name and any(m.name == name and m.owner == "self" for m in self._images.values()):
            raise ApiError(400, "InvalidImageName.Duplicated", f"The specified ImageName {name} already exists.")
        image = Image(_new_id("m-bp"), name, "Creating", "self", self._tags(params), inst.id)
        image.name = image.name or image.id
        self._images[image.id] = image
        self._spawn(self._snapshot, inst, image)
        return {"ImageId": image.id}

    def _snapshot(self, inst: Instance, image: Image) -> None:
        with inst.host_lock:
            try:
                if not inst.on_host:
                    raise RuntimeError("the instance has no machine (deleted or never booted)")
                self.hosts.snapshot(inst.id, image.id)
                status = "Available"
            except Exception as exc:  # reported as the image's CreateFailed status
                self._host_failed(image.id, "snapshot", exc)
                status = "CreateFailed"
        with self._lock:
            image.status = status

    def _describe_images(self, params: dict[str, str]) -> dict[str, Any]:
        ids = [i for i in params.get("ImageId", "").split(",") if i]
        statuses = (params.get("Status") or "Available").split(",")
        owner = params.get("ImageOwnerAlias", "")
        found = [m for m in self._images.values()
                 if (not ids or m.id in ids) and m.status in statuses and owner in ("", m.owner)
                 and params.get("ImageName", m.name) == m.name and self._tags_match(m.tags, params)]
        items, paging = page(found, params)
        return {"RegionId": self.region, **paging, "Images": {"Image": [
            {"ImageId": m.id, "ImageName": m.name, "Status": m.status, "ImageOwnerAlias": m.owner,
             "Progress": "100%" if m.status == "Available" else "0%", "CreationTime": m.created,
             "OSType": "linux", "Architecture": "x86_64", "Size": 20, "Tags": _tag_list(m.tags)}
            for m in items]}}

    def _delete_image(self, params: dict[str, str]) -> dict[str, Any]:
        image_id = required(params, "ImageId")
        image = self._images.get(image_id)
        if image is None:
            raise ApiError(404, "InvalidImageId.NotFound", f"The specified ImageId {image_id} does not exist.")
        if image.owner != "self":
            raise ApiError(403, "OperationDenied", "Public images cannot be deleted.")
        if image.status == "Creating":
            raise ApiError(403, "IncorrectImageStatus", "The image is still being created.")
        del self._images[image_id]
        if image.status == "Available":
            self._spawn(self._drop_image, image_id)
        return {}

    def _drop_image(self, image_id: str) -> None:
        try:
            self.hosts.delete_image(image_id)
        except Exception as exc:  # reported; the API already forgot the image
            self._host_failed(image_id, "delete_image", exc)

    # --- Cloud Assistant and console ---------------------------------------------------------

    def _run_command(self, params: dict[str, str]) -> dict[str, Any]:
        if required(params, "Type") != "RunShellScript":
            raise invalid("Type", "Linux instances run RunShellScript.")
        content = required(params, "CommandContent")
        if (params.get("ContentEncoding") or "PlainText").lower() == "base64":
            raw = decode_base64(content)
            if raw is None:
                raise invalid("CommandContent", "ContentEncoding is Base64 but the content is not.")
            content = raw.decode("utf-8", "replace")
        timeout = as_int(params, "Timeout", 60, 10, 86400)
        instances = [self._instance(i) for i in self._instance_ids(params)]
        for inst in instances:
            if inst.status != "Running":
                raise self._incorrect_status(inst, "Running")
        command_id, invoke_id = _new_id("c-hz"), _new_id("t-hz")
        self._invocations[invoke_id] = []
        for inst in instances:
            invocation = Invocation(invoke_id, command_id, inst.id, script=content)
            self._invocations[invoke_id].append(invocation)
            self._spawn(self._execute, invocation, content, timeout)
        return {"CommandId": command_id, "InvokeId": invoke_id}

    def _execute(self, invocation: Invocation, script: str, timeout: int) -> None:
        try:
            result = self.hosts.run_command(invocation.instance_id, script, timeout)
        except Exception as exc:  # Cloud Assistant reports it as a failed invocation
            self._host_failed(invocation.instance_id, "run_command", exc)
            with self._lock:
                invocation.status, invocation.error, invocation.finished = "Failed", str(exc)[:500], iso_now()
            return
        with self._lock:
            invocation.exit_code, invocation.output, invocation.finished = result.exit_code, result.output, iso_now()
            invocation.status = "Success" if result.exit_code == 0 else "Failed"

    def _describe_invocation_results(self, params: dict[str, str]) -> dict[str, Any]:
        plain = (params.get("ContentEncoding") or "Base64").lower() == "plaintext"
        found = [i for batch in self._invocations.values() for i in batch
                 if all(params.get(k, "") in ("", v) for k, v in
                        (("InvokeId", i.invoke_id), ("InstanceId", i.instance_id), ("CommandId", i.command_id)))]
        items, paging = page(found, params)
        results = [{"CommandId": i.command_id, "InvokeId": i.invoke_id, "InstanceId": i.instance_id,
                    "InvocationStatus": i.status, "InvokeRecordStatus": "Running" if i.status == "Running" else
                    "Finished", "ExitCode": i.exit_code, "ErrorInfo": i.error, "StartTime": i.started,
                    "FinishedTime": i.finished, "Dropped": 0,
                    "Output": i.output if plain else base64.b64encode(i.output.encode()).decode()} for i in items]
        return {"Invocation": {"InvocationResults": {"InvocationResult": results}, **paging}}

    def _console_output(self, params: dict[str, str]) -> dict[str, Any]:
        instance_id = required(params, "InstanceId")
        with self._lock:
            on_host = self._instance(instance_id).on_host
        try:
            text = self.hosts.console_output(instance_id) if on_host else ""
        except Exception as exc:  # the console could not be read this time
            self._host_failed(instance_id, "console_output", exc)
            raise ApiError(500, "InternalError") from None
        return {"InstanceId": instance_id, "LastUpdateTime": iso_now(),
                "ConsoleOutput": base64.b64encode(text.encode()).decode()}

    # --- ACR ------------------------------------------------------------------------------------

    def _get_authorization_token(self, params: dict[str, str]) -> dict[str, Any]:
        """cr 2018-12-01: a fresh temporary registry password per call, valid one hour for a permanent
        key; for a role's STS keys only if its policies allow cr:GetAuthorizationToken on the instance
        (else 403 Forbidden.RAM), valid as long as the keys. Each is recorded with its scope."""
        instance = required(params, "InstanceId")
        resource = f"acs:cr:{self.region}:{ACCOUNT_UID}:instance/{instance}"
        grant = self.ram.registry_grant(params["AccessKeyId"], resource)
        token = secrets.token_urlsafe(48)
        self.issued_tokens.append(token)
        self.token_grants.append({"token": token, "caller": grant.caller, "instance": grant.instance,
                                  "pull": grant.pull})
        return {"IsSuccess": True, "TempUsername": "cr_temp_user", "AuthorizationToken": token,
                "ExpireTime": int(grant.expires * 1000)}
