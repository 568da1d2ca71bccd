"""ECS's side of instance RAM roles: AttachInstanceRamRole / DetachInstanceRamRole / DescribeInstanceRamRole.

Why apart from aliyun_ram.py: these are ECS actions (2014-05-26, served under EcsEmulator's ECS
version) over ECS's instances, which only look roles up in RAM; RAM itself knows no instances. The
stricter readings: AttachInstanceRamRole refuses an instance that has any role already, the same one
included (the per-instance Code for that, ROLE_ATTACHED, is not documented upstream: the name is the
emulator's), and RunInstances' RamRoleName must name a role ECS may assume (`launch_role`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from .aliyun_ram import Ram
from .aliyun_rpc import Action, ApiError, missing, page, required

ROLE_ATTACHED = "InvalidRamRole.AlreadyAttached"    # undocumented upstream (see the module docstring)
ROLE_NOT_ATTACHED = "InvalidRamRole.NotAttached"    # the same, for DetachInstanceRamRole


class RoleHolder(Protocol):
    id: str
    ram_role: str


def instance_ids(params: Mapping[str, str], limit: int = 100) -> list[str] | None:
    """InstanceIds as these actions take it: a JSON array of 1..100 IDs (InvalidInstanceIds.Malformed)."""
    value = params.get("InstanceIds", "")
    if value == "":
        return None
    try:
        ids = json.loads(value)
    except ValueError:
        ids = None
    if not isinstance(ids, list) or not 1 <= len(ids) <= limit or not all(isinstance(i, str) and i for i in ids):
        raise ApiError(400, "InvalidInstanceIds.Malformed", "The specified instanceIds are not valid.")
    return ids


class InstanceRoles:
    """AttachInstanceRamRole / DetachInstanceRamRole / DescribeInstanceRamRole over the emulator's
    instances (`lookup` raises InvalidInstanceId.NotFound, `listing` gives them all); one role per
    instance, kept in its `ram_role`."""

    def __init__(self, ram: Ram, lookup: Callable[[str], RoleHolder], listing: Callable[[], Iterable[RoleHolder]],
                 region: str) -> None:
        self.ram, self.lookup, self.listing, self.region = ram, lookup, listing, region
        self.actions: dict[str, Action] = {"AttachInstanceRamRole": self._attach,
                                           "DetachInstanceRamRole": self._detach,
                                           "DescribeInstanceRamRole": self._describe}

    def launch_role(self, params: Mapping[str, str]) -> str:
        """RunInstances' RamRoleName, checked as AttachInstanceRamRole checks it ("" when none)."""
        name = params.get("RamRoleName", "")
        return self.ram.check_ecs_role(name).name if name else ""

    def _targets(self, params: Mapping[str, str]) -> list[RoleHolder]:
        ids = instance_ids(params)
        if ids is None:
            raise missing("InstanceIds")
        return [self.lookup(i) for i in ids]

    @staticmethod
    def _result(inst: RoleHolder, error: tuple[str, str] | None) -> dict[str, Any]:
        code, message = error or ("200", "success")
        return {"InstanceId": inst.id, "Success": error is None, "Code": code, "Message": message}

    def _attach(self, params: dict[str, str]) -> dict[str, Any]:
        role = self.ram.check_ecs_role(required(params, "RamRoleName"))
        results = []
        for inst in self._targets(params):
            if inst.ram_role:
                results.append(self._result(inst, (ROLE_ATTACHED, f"The instance already has a RAM role: "
                                                                  f"{inst.ram_role}.")))
                continue
            inst.ram_role = role.name
            results.append(self._result(inst, None))
        return {"RamRoleName": role.name, "TotalCount": len(results),
                "FailCount": sum(not r["Success"] for r in results),
                "AttachInstanceRamRoleResults": {"AttachInstanceRamRoleResult": results}}

    def _detach(self, params: dict[str, str]) -> dict[str, Any]:
        wanted = params.get("RamRoleName", "")
        results = []
        for inst in self._targets(params):
            held = inst.ram_role
            attached = bool(held) and (not wanted or held.lower() == wanted.lower())
            error = None if attached else (ROLE_NOT_ATTACHED, "The instance does not have this RAM role.")
            result = self._result(inst, error)
            if attached:
                inst.ram_role = ""
                result["InstanceRamRoleSets"] = {"InstanceRamRoleSet": [{"InstanceId": inst.id, "RamRoleName": held}]}
            results.append(result)
        return {"RamRoleName": wanted, "TotalCount": len(results), "FailCount": sum(not r["Success"] for r in results),
                "DetachInstanceRamRoleResults": {"DetachInstanceRamRoleResult": results}}

    def _describe(self, params: dict[str, str]) -> dict[str, Any]:
        ids, name = instance_ids(params), params.get("RamRoleName", "")
        if ids is None and not name:
            raise missing("InstanceIds")
        found = [{"InstanceId": i.id, "RamRoleName": i.ram_role} for i in self.listing()
                 if i.ram_role and (ids is None or i.id in ids) and (not name or i.ram_role.lower() == name.lower())]
        items, paging = page(found, params)
        return {"RegionId": self.region, "TotalCount": paging["TotalCount"],
                "InstanceRamRoleSets": {"InstanceRamRoleSet": items}}
