"""ECS's instances and the real machines behind them: the state every ECS API family of EcsEmulator shares.

Why a module of its own: the instance records, their status machine (Pending -> Running -> Stopping ->
Stopped -> Starting, economical-mode stops releasing the public IP) and the backend workers that make a
HostBackend machine (hosts_api.py) follow them are what the instance API (aliyun_ecs_instances.py), the
images (aliyun_ecs_images.py), the network (aliyun_ecs_network.py) and Cloud Assistant
(aliyun_cloud_assistant.py) all read; so this is their base class, and it imports none of them. It also
holds the lookups and parameter checks they share (instance ids, tags, security groups, stock).
"""

from __future__ import annotations

import secrets
import string
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .aliyun_rpc import ApiError, RpcService, indexed, invalid, iso_now, repeated
from .hosts_api import HostBackend

USER_DATA_LIMIT = 16 * 1024
STOPPED_MODES = ("KeepCharging", "StopCharging")
SPOT_STRATEGIES = ("NoSpot", "SpotWithPriceLimit", "SpotAsPriceGo")


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


def new_id(prefix: str, length: int = 18) -> str:
    return prefix + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length))


def tag_list(tags: Mapping[str, str]) -> dict[str, Any]:
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
    termination_time: str = ""   # a spot instance being reclaimed: its release (UTC, aliyun_ess_spot.py reclaim)


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


class EcsMachines(RpcService):
    """Instances, images and security groups behind one lock, each instance a machine on the HostBackend."""

    def __init__(self, hosts: HostBackend, access_keys: Mapping[str, str], region: str, *, zones: Iterable[str],
                 boot_seconds: float, start_seconds: float, stop_seconds: float,
                 offerings: Mapping[str, Iterable[str]] | None) -> None:
        super().__init__(access_keys, region)
        self.hosts = hosts
        self.zones = tuple(zones)
        self.boot_seconds, self.start_seconds, self.stop_seconds = boot_seconds, start_seconds, stop_seconds
        self.host_errors: list[tuple[str, str]] = []   # (instance or image id, what the backend raised)
        self._offered = self._default_offerings() if offerings is None else {
            zone: set(types) for zone, types in offerings.items()}
        self._stock: dict[tuple[str, str], bool] = {}
        self._instances: dict[str, Instance] = {}
        self._images = {image_id: Image(image_id, name, "Available", "system")
                        for image_id, name in PUBLIC_IMAGES.items()}
        self._vpc_id = new_id("vpc-bp")
        self._vswitches = {new_id("vsw-bp"): zone for zone in self.zones}
        self._security_groups: dict[str, SecurityGroup] = {}
        self._restart_failures: set[str] = set()

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

    def _termination_time(self, instance_id: str) -> str | None:
        """The metadata service's instance/spot/termination-time: when this spot instance is released (None:
        it is not being reclaimed)."""
        with self._lock:
            inst = self._instances.get(instance_id)
            return inst.termination_time if inst is not None and inst.termination_time else None

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

    def _group(self, group_id: str) -> SecurityGroup:
        group = self._security_groups.get(group_id)
        if group is None:
            raise ApiError(404, "InvalidSecurityGroupId.NotFound", f"The specified SecurityGroupId {group_id} "
                                                                   "does not exist.")
        return group
