"""ECS's network as the instances see it (2014-05-26): the one VPC, a vSwitch per zone, security groups.

Why apart: the network is its own resource family (DescribeVpcs / DescribeVSwitches,
Describe/Create/AuthorizeSecurityGroup(Attribute)) with its own checks; instances only look their groups up
(EcsMachines._group). The VPC and vSwitches are fixed at start (ALB places its zones on them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .aliyun_ecs_machines import EcsMachines, SecurityGroup, new_id, tag_list
from .aliyun_rpc import ApiError, indexed, iso_now, json_list, page, required


class EcsNetwork(EcsMachines):
    """DescribeVpcs, DescribeVSwitches and the security group actions."""

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
             "SecurityGroupType": "normal", "CreationTime": g.created, "Tags": tag_list(g.tags)}
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
        group = SecurityGroup(new_id("sg-bp"), params.get("SecurityGroupName", ""), vpc_id,
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
