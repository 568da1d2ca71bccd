"""ECS's instance API (2014-05-26): RunInstances, DescribeInstances, Start/Stop/DeleteInstance(s), and the
catalogue they are placed from (DescribeRegions / Zones / InstanceTypes / AvailableResource).

Why apart from aliyun_ecs_machines.py: these are the actions a client calls, with ECS's parameter checks
and answer shapes (ClientToken idempotency is RpcService's, aliyun_rpc.py); the machines' side of each
transition is the base class's workers. Where the real API leaves a choice open, the stricter reading:
DescribeInstances omits `Tags` on an untagged instance; batch Start/Stop/Delete is all-or-nothing
(BatchOptimization AllTogether); StopInstance defaults to KeepCharging.
"""

from __future__ import annotations

import time
from typing import Any

from .aliyun_ecs_machines import (
    INSTANCE_TYPES,
    SPOT_STRATEGIES,
    STOPPED_MODES,
    USER_DATA_LIMIT,
    EcsMachines,
    Instance,
    new_id,
    tag_list,
)
from .aliyun_instance_roles import InstanceRoles
from .aliyun_rpc import ApiError, as_bool, as_int, decode_base64, invalid, json_list, page, repeated, required


class EcsInstances(EcsMachines):
    """The instance actions and the placement catalogue of ECS 2014-05-26."""

    instance_roles: InstanceRoles   # RunInstances' RamRoleName (aliyun_ram.py; EcsEmulator wires it in)

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
            inst = Instance(new_id("i-bp"), "", itype, zone, vswitch, self._vpc_id, image_id, groups, dict(tags),
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
            view["Tags"] = tag_list(inst.tags)
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
