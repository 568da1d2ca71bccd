"""ECS's hosts for one region (vm.Cloud): instances, Cloud Assistant, the stock check, a pull role per repository.

Apart from the verbs (verbs.py) so that the balancer (alb.py) and the scaling group (ess.py) can name the
host class without importing the verbs that import them.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ...core.errors import UserError
from .. import roles, vm
from ..common import SERVE_PORT, CapacityError, HostStatus

NAME = "aliyun"
# A public image to fall back on when the region has no baked ngcx host image (driver + Docker are
# then installed at boot: 5-10 min, cloud-apis.md §7).
FALLBACK_IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
TAG_OWNER, TAG_DEPLOYMENT, TAG_HOST_IMAGE = vm.TAG_OWNER, vm.TAG_DEPLOYMENT, vm.TAG_HOST_IMAGE
STATE_MAP = {"Running": "running", "Stopped": "stopped", "Starting": "starting", "Pending": "pending",
             "Stopping": "stopping"}


@dataclass
class Ecs:
    """vm.Cloud for one Alibaba Cloud region."""

    api: Any
    name: str = NAME
    vswitches: dict[str, str] | None = None
    security_group: str | None = None

    @property
    def region(self) -> str:
        return self.api.region

    def describe(self, ids: list[str]) -> dict[str, HostStatus]:
        if not ids:
            return {}
        answer = self.api.ecs("DescribeInstances", {"InstanceIds": ids[:100], "PageSize": 100})
        return {i["InstanceId"]: _status(i) for i in answer.get("Instances", {}).get("Instance", [])}

    def start(self, instance_id: str) -> None:
        self.api.ecs("StartInstance", {"InstanceId": instance_id}, write=True)

    def stop(self, instance_id: str) -> None:
        """StopCharging: the GPU and vCPUs stop billing, the disk keeps the pulled layers."""
        self.api.ecs("StopInstance", {"InstanceId": instance_id, "StoppedMode": "StopCharging"}, write=True)

    def delete(self, instance_id: str) -> None:
        from ...clouds.aliyun import AliyunError

        try:
            self.api.ecs("DeleteInstance", {"InstanceId": instance_id, "Force": True}, write=True)
        except AliyunError as exc:
            if exc.code != "InvalidInstanceId.NotFound":
                raise

    def zones_for(self, instance_type: str, zone: str | None) -> list[str]:
        """DescribeAvailableResource: zones selling `instance_type` now, WithStock before ClosedWithStock."""
        answer = self.api.ecs("DescribeAvailableResource", {
            "DestinationResource": "InstanceType", "InstanceType": instance_type, "ZoneId": zone,
            "InstanceChargeType": "PostPaid"})
        ranked = []
        for item in answer.get("AvailableZones", {}).get("AvailableZone", []):
            if item.get("Status") == "Available" and item.get("StatusCategory") in ("WithStock", "ClosedWithStock"):
                ranked.append((item.get("StatusCategory") != "WithStock", item["ZoneId"]))
        zones = [z for _, z in sorted(ranked)]
        return [z for z in zones if self.vswitches is None or z in self.vswitches]

    def read_network(self) -> str:
        """The default VPC's id (else the first) and its vSwitch per zone (self.vswitches); reads only."""
        vpcs = self.api.ecs("DescribeVpcs", {"PageSize": 50}).get("Vpcs", {}).get("Vpc", [])
        if not vpcs:
            raise UserError(f"no VPC in {self.region}", hint="create one (with a vSwitch per zone) in the console")
        vpc = next((v for v in vpcs if v.get("IsDefault")), vpcs[0])["VpcId"]
        switches = self.api.ecs("DescribeVSwitches", {"VpcId": vpc, "PageSize": 50}).get(
            "VSwitches", {}).get("VSwitch", [])
        self.vswitches = {s["ZoneId"]: s["VSwitchId"] for s in switches}
        return str(vpc)

    def prepare_network(self, allow_from: str) -> None:
        """vSwitch per zone of the default VPC, and ngcx's security group (port 8000 open to allow_from)."""
        from ...clouds.aliyun import tag_params
        from .. import store

        if self.security_group:
            return
        vpc = self.read_network()
        tags = tag_params({TAG_OWNER: store.owner_id()})
        groups = self.api.ecs("DescribeSecurityGroups", {"VpcId": vpc, **tags}).get(
            "SecurityGroups", {}).get("SecurityGroup", [])
        if groups:
            self.security_group = groups[0]["SecurityGroupId"]
            return
        self.security_group = self.api.ecs("CreateSecurityGroup", {
            "VpcId": vpc, "SecurityGroupName": "ngcx-serve", "Description": "ngcx deploy: KServe v2 HTTP", **tags},
            token=f"ngcx-sg-{store.owner_id()}-{vpc}"[:64], write=True)["SecurityGroupId"]
        self.api.ecs("AuthorizeSecurityGroup", {"SecurityGroupId": self.security_group, "IpProtocol": "tcp",
                                                "PortRange": f"{SERVE_PORT}/{SERVE_PORT}", "SourceCidrIp": allow_from},
                     token=f"ngcx-sgr-{self.security_group}"[:64], write=True)
        if allow_from == "0.0.0.0/0":
            vm.say(f"port {SERVE_PORT} of ngcx hosts is open to 0.0.0.0/0; restrict it with --allow-from CIDR")

    def pull_role_name(self, grant: roles.PullGrant | roles.PullRole) -> str:
        return roles.pull_role(grant).role_name

    def ensure_pull_role(self, grant: roles.PullGrant | roles.PullRole) -> str:
        """The RAM role ECS hosts assume to pull `grant`'s repositories: made once, found by its name after that."""
        from ...clouds.aliyun import AliyunError

        role = roles.pull_role(grant)
        name, document = role.role_name, roles.aliyun_policy(role)
        try:
            attached = self.api.ram("ListPoliciesForRole", {"RoleName": name}).get("Policies", {}).get("Policy", [])
            if any(p.get("PolicyName") == name for p in attached):
                self._keep_policy_current(name, document)
                return name
        except AliyunError as exc:
            if exc.code != "EntityNotExist.Role":
                raise
        vm.say(f"creating the RAM role {name}: hosts pull {role.repositories} with it, no registry secret sent")
        steps = [("CreateRole", {"RoleName": name, "AssumeRolePolicyDocument": roles.aliyun_trust(),
                                 "Description": role.description}, "EntityAlreadyExists.Role"),
                 ("CreatePolicy", {"PolicyName": name, "PolicyDocument": document,
                                   "Description": role.description}, "EntityAlreadyExists.Policy"),
                 ("AttachPolicyToRole", {"PolicyType": "Custom", "PolicyName": name, "RoleName": name},
                  "EntityAlreadyExists.Role.Policy")]
        for action, params, done in steps:
            try:
                self.api.ram(action, params)
            except AliyunError as exc:    # made by an earlier, interrupted run: fine
                if exc.code != done:
                    raise
        return name

    def _keep_policy_current(self, name: str, document: str) -> None:
        """The role's policy says what this ngcx grants (a newer ngcx may narrow it): when the default version
        differs, a new one becomes the default (the oldest spare one dropped at RAM's limit of 5)."""
        found = self.api.ram("GetPolicy", {"PolicyType": "Custom", "PolicyName": name})
        if roles.same_document(found.get("DefaultPolicyVersion", {}).get("PolicyDocument") or "", document):
            return
        vm.say(f"updating the RAM policy {name} to what this ngcx grants")
        self.api.ram("CreatePolicyVersion", {"PolicyName": name, "PolicyDocument": document, "SetAsDefault": "true",
                                             "RotateStrategy": "DeleteOldestNonDefaultVersionWhenLimitExceeded"})

    def attach_role(self, instance_id: str, role: str) -> None:
        """A reused host gets this repository's role (ECS holds one per instance: the old one is detached)."""
        ids = json.dumps([instance_id])
        sets = self.api.ecs("DescribeInstanceRamRole", {"InstanceIds": ids}).get(
            "InstanceRamRoleSets", {}).get("InstanceRamRoleSet", [])
        current = [s.get("RamRoleName") for s in sets if s.get("InstanceId") == instance_id and s.get("RamRoleName")]
        if role in current:
            return
        for old in current:
            self.api.ecs("DetachInstanceRamRole", {"InstanceIds": ids, "RamRoleName": old}, write=True)
        self.api.ecs("AttachInstanceRamRole", {"InstanceIds": ids, "RamRoleName": role}, write=True)

    def create(self, spec: vm.CreateSpec) -> str:
        from ...clouds.aliyun import tag_params

        if spec.zone not in (self.vswitches or {}):
            raise CapacityError("NoVSwitchInZone", spec.zone)
        params = {"RegionId": self.region, "ImageId": spec.image_id, "InstanceType": spec.instance_type,
                  "ZoneId": spec.zone, "VSwitchId": (self.vswitches or {})[spec.zone],
                  "SecurityGroupId": self.security_group, "InstanceName": spec.name, "Amount": 1,
                  "UserData": base64.b64encode(spec.user_data.encode()).decode(), "InternetMaxBandwidthOut": 100,
                  "SystemDisk.Category": "cloud_essd", "SystemDisk.Size": 100, **_spot(spec), **tag_params(spec.tags)}
        if spec.role:
            params["RamRoleName"] = spec.role
        answer = self.api.ecs("RunInstances", params, token=spec.token, write=True)
        return answer["InstanceIdSets"]["InstanceIdSet"][0]

    def run_command(self, instance_id: str, script: str, timeout: float) -> tuple[int, str]:
        """Cloud Assistant: run `script` on the host; (exit code, output). A permanent refusal is vm.ChannelError."""
        answer = self._assistant("RunCommand", instance_id, {
            "Type": "RunShellScript", "InstanceId.1": instance_id,
            "CommandContent": base64.b64encode(script.encode()).decode(), "ContentEncoding": "Base64",
            "Timeout": int(timeout)}, token=uuid.uuid4().hex)      # a token: a retry after a 5xx never runs it twice
        started = time.monotonic()
        deadline = started + timeout + 30
        while time.monotonic() < deadline:
            results = self._assistant("DescribeInvocationResults", instance_id, {"InvokeId": answer["InvokeId"]}).get(
                "Invocation", {}).get("InvocationResults", {}).get("InvocationResult", [])
            for result in results:
                if result.get("InvocationStatus") in ("Success", "Failed", "Timeout", "Error", "Finished"):
                    output = base64.b64decode(result.get("Output") or "").decode(errors="replace")
                    return int(result.get("ExitCode") or 0), output
            time.sleep(vm.poll_pause(started))
        raise UserError(f"Cloud Assistant command on {instance_id} did not finish in {timeout:.0f} s")

    def _assistant(self, action: str, instance_id: str, params: dict[str, Any], token: str | None = None
                   ) -> dict[str, Any]:
        """A Cloud Assistant call; the codes asking again cannot cure become vm.ChannelError (the Api already
        retried the transient ones: Throttling, 5xx)."""
        from ...clouds.aliyun import AliyunError

        try:
            return self.api.ecs(action, params, token=token, write=token is not None)
        except AliyunError as exc:
            hint = _channel_hint(exc.code)
            if hint is None:
                raise
            raise vm.ChannelError("Alibaba Cloud", exc.code, action, instance_id, hint) from None

    def create_image(self, instance_id: str, name: str, tags: dict[str, str], token: str) -> str:
        from ...clouds.aliyun import tag_params

        return self.api.ecs("CreateImage", {"InstanceId": instance_id, "ImageName": name, **tag_params(tags)},
                            token=token, write=True)["ImageId"]

    def image_available(self, image_id: str) -> bool:
        images = self.api.ecs("DescribeImages", {"ImageId": image_id, "ImageOwnerAlias": "self",
                                                 "Status": "Creating,Available"}).get("Images", {}).get("Image", [])
        return bool(images) and images[0].get("Status") == "Available"

    def host_images(self) -> list[tuple[str, str, str]]:
        """(image id, name, creation time) of the baked ngcx host images, oldest first."""
        from ...clouds.aliyun import tag_params

        answer = self.api.ecs("DescribeImages", {"ImageOwnerAlias": "self", "Status": "Available", "PageSize": 100,
                                                 **tag_params({TAG_HOST_IMAGE: "1"})})
        images = sorted(answer.get("Images", {}).get("Image", []), key=lambda i: i.get("CreationTime", ""))
        return [(i["ImageId"], i.get("ImageName", ""), i.get("CreationTime", "")) for i in images]

    def fallback_image(self) -> str:
        return FALLBACK_IMAGE

    def tagged(self, tags: dict[str, str]) -> list[str]:
        from ...clouds.aliyun import tag_params

        ids, page = [], 1
        while True:
            answer = self.api.ecs("DescribeInstances", {"PageSize": 100, "PageNumber": page, **tag_params(tags)})
            items = answer.get("Instances", {}).get("Instance", [])
            ids += [i["InstanceId"] for i in items]
            if len(items) < 100:
                return ids
            page += 1


def _status(item: dict[str, Any]) -> HostStatus:
    public = item.get("PublicIpAddress", {}).get("IpAddress") or []
    private = item.get("VpcAttributes", {}).get("PrivateIpAddress", {}).get("IpAddress") or []
    return HostStatus(STATE_MAP.get(item.get("Status", ""), "pending"), (public or private or [None])[0],
                      item.get("InstanceType"), item.get("ZoneId"))


def _spot(spec: vm.CreateSpec) -> dict[str, Any]:
    """Spot: capped at --max-price when one is given (SpotWithPriceLimit), else the market price."""
    if not spec.spot:
        return {"SpotStrategy": "NoSpot"}
    if spec.max_price is not None:
        return {"SpotStrategy": "SpotWithPriceLimit", "SpotPriceLimit": spec.max_price}
    return {"SpotStrategy": "SpotAsPriceGo"}


def cloud_for(region: str) -> Ecs:
    from ...clouds.aliyun import Api

    return Ecs(Api(region))


def _channel_hint(code: str) -> str | None:
    """What to do about a permanent Cloud Assistant refusal; None for any other code (retried or raised as is)."""
    if code in ("InvalidAction.NotFound", "InvalidApi.NotFound"):
        return ("this ECS endpoint has no Cloud Assistant API: check NGCX_ALIYUN_ECS_ENDPOINT and the region "
                "(Cloud Assistant is ECS 2014-05-26 RunCommand)")
    if code == "Forbidden.RAM" or code.startswith("NoPermission") or code.startswith("Forbidden"):
        return ("grant the RAM user ecs:RunCommand and ecs:DescribeInvocationResults (the policy "
                "AliyunECSAssistantFullAccess has both)")
    if code in ("InvalidInstance.NotFound", "InvalidInstanceId.NotFound", "InvalidInstance.NotMatch"):
        return "the instance is gone or in another region: see it with `ngcx deployments show ID`, then redeploy"
    return None
