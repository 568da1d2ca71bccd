"""EC2's hosts for one region (vm.Cloud): instances, SSM Run Command, the security group, the pull role's profile.

Apart from the verbs (verbs.py) so that the balancer (elb.py) and the scaling group (asg.py) can name the
host class without importing the verbs that import them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import UserError
from .. import roles, vm
from ..common import SERVE_PORT, CapacityError, HostStatus

NAME = "aws"
GPU_AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2/gpu/recommended"
INSTANCE_PROFILE = "ngcx-host"   # role + instance profile for SSM; NGCX_AWS_INSTANCE_PROFILE names your own instead
SSM_POLICY = "AmazonSSMManagedInstanceCore"
ROOT_GIB = 100
VISIBLE_AFTER_S = 60.0           # EC2 is eventually consistent: a new instance may be unknown to Describe* a while
AGENT_WAIT_S = 180.0             # an SSM agent registers some seconds after boot or start
PROFILE_PROPAGATION_S = 60.0     # a new instance profile is refused by RunInstances for a few seconds
TAG_OWNER, TAG_DEPLOYMENT, TAG_HOST_IMAGE = vm.TAG_OWNER, vm.TAG_DEPLOYMENT, vm.TAG_HOST_IMAGE
STATE_MAP = {"pending": "pending", "running": "running", "stopping": "stopping", "stopped": "stopped",
             "shutting-down": "gone", "terminated": "gone"}
LIVE_STATES = ["pending", "running", "stopping", "stopped"]
SSM_DONE = {"Success", "Failed", "TimedOut", "Cancelled", "DeliveryTimedOut", "Undeliverable", "Terminated",
            "InvalidPlatform", "AccessDenied"}
# Inserted after the user-data's first line: the SSM agent must run for Run Command to reach the host.
# ECS-optimized AMIs are built from the minimal Amazon Linux, which lacks it; DLAMIs and baked ngcx images have it.
SSM_AGENT = """\
if ! systemctl is-active -q amazon-ssm-agent 2>/dev/null && ! systemctl is-active -q \
snap.amazon-ssm-agent.amazon-ssm-agent 2>/dev/null && ! pgrep -x amazon-ssm-agent >/dev/null 2>&1; then
  { yum install -y -q amazon-ssm-agent || snap install amazon-ssm-agent --classic; } >/dev/null 2>&1 \
    && systemctl enable --now amazon-ssm-agent >/dev/null 2>&1
fi
"""


@dataclass(frozen=True)
class Subnet:
    id: str
    public: bool        # MapPublicIpOnLaunch: otherwise the launch asks for a public address itself


@dataclass
class Ec2:
    """vm.Cloud for one AWS region (plus create_image, image_available, host_images, fallback_image)."""

    api: Any
    name: str = NAME
    subnets: dict[str, Subnet] | None = None
    security_group: str | None = None
    instance_profile: str | None = None
    _launched: dict[str, float] = field(default_factory=dict)
    _zones: list[str] | None = None
    _fallback: str | None = None

    @property
    def region(self) -> str:
        return self.api.region

    # ------------------------------------------------------------ state

    def describe(self, ids: list[str]) -> dict[str, HostStatus]:
        """By filter, not InstanceIds: one unknown id would fail the whole call (InvalidInstanceID.NotFound)."""
        found: dict[str, HostStatus] = {}
        for start in range(0, len(ids), 199):
            reservations = self.api.pages("ec2", "describe_instances", "Reservations",
                                          Filters=[{"Name": "instance-id", "Values": ids[start:start + 199]}])
            found.update({i["InstanceId"]: _status(i) for r in reservations for i in r.get("Instances", [])})
        now = time.monotonic()
        for instance_id in ids:    # launched by this process moments ago: not visible yet is not gone
            if instance_id not in found and now - self._launched.get(instance_id, -VISIBLE_AFTER_S) < VISIBLE_AFTER_S:
                found[instance_id] = HostStatus("pending")
        return found

    def tagged(self, tags: dict[str, str]) -> list[str]:
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in sorted(tags.items())]
        reservations = self.api.pages("ec2", "describe_instances", "Reservations",
                                      Filters=[*filters, {"Name": "instance-state-name", "Values": LIVE_STATES}])
        return [i["InstanceId"] for r in reservations for i in r.get("Instances", [])]

    def start(self, instance_id: str) -> None:
        self.api.call("ec2", "start_instances", capacity=True, where=instance_id, InstanceIds=[instance_id])

    def stop(self, instance_id: str) -> None:
        """The EBS disk (pulled layers) stays; the instance and its GPU stop billing."""
        self.api.call("ec2", "stop_instances", InstanceIds=[instance_id])

    def delete(self, instance_id: str) -> None:
        from ...clouds.aws import AwsError

        try:
            self.api.call("ec2", "terminate_instances", InstanceIds=[instance_id])
        except AwsError as exc:
            if exc.code != "InvalidInstanceID.NotFound":
                raise

    # ------------------------------------------------------------ placement and network

    def check(self) -> None:
        """A read that proves the credentials (and that EC2 answers) before anything is written."""
        self._available_zones()

    def _available_zones(self) -> list[str]:
        if self._zones is None:
            answer = self.api.call("ec2", "describe_availability_zones",
                                   Filters=[{"Name": "state", "Values": ["available"]}])
            self._zones = sorted(z["ZoneName"] for z in answer.get("AvailabilityZones", [])
                                 if z.get("ZoneType", "availability-zone") == "availability-zone")
        return self._zones

    def zones_for(self, instance_type: str, zone: str | None) -> list[str]:
        """Zones that sell `instance_type` (DescribeInstanceTypeOfferings), are available, and have a default subnet."""
        offerings = self.api.pages("ec2", "describe_instance_type_offerings", "InstanceTypeOfferings",
                                   LocationType="availability-zone",
                                   Filters=[{"Name": "instance-type", "Values": [instance_type]}])
        offered = {o["Location"] for o in offerings}
        zones = [z for z in self._available_zones() if z in offered and zone in (None, z)]
        return [z for z in zones if self.subnets is None or z in self.subnets]

    def prepare_network(self, allow_from: str) -> None:
        """Default subnets per zone, ngcx's security group (port 8000 from allow_from), the SSM instance profile."""
        if self.security_group and self.subnets is not None:
            return
        vpc = self.read_network()
        self.security_group = self._security_group(vpc, allow_from)
        self.instance_profile = self._instance_profile()

    def read_network(self) -> str:
        """The default VPC's id and its default subnet per zone (self.subnets); reads only, nothing is made."""
        vpcs = self.api.call("ec2", "describe_vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise UserError(f"no default VPC in {self.region}",
                            hint=f"create one: aws ec2 create-default-vpc --region {self.region}")
        subnets = self.api.pages("ec2", "describe_subnets", "Subnets", Filters=[
            {"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]}, {"Name": "default-for-az", "Values": ["true"]}])
        self.subnets = {s["AvailabilityZone"]: Subnet(s["SubnetId"], bool(s.get("MapPublicIpOnLaunch")))
                        for s in subnets}
        return str(vpcs[0]["VpcId"])

    def _security_group(self, vpc: str, allow_from: str) -> str:
        from ...clouds.aws import AwsError
        from .. import store

        owner = store.owner_id()
        groups = self.api.call("ec2", "describe_security_groups", Filters=[
            {"Name": "vpc-id", "Values": [vpc]}, {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["SecurityGroups"]
        name = f"ngcx-serve-{owner}"
        if groups:
            group_id, permissions = groups[0]["GroupId"], groups[0].get("IpPermissions", [])
        else:
            try:
                group_id = self.api.call("ec2", "create_security_group", idempotent=False, GroupName=name, VpcId=vpc,
                                         Description="ngcx deploy: KServe v2 HTTP", TagSpecifications=[{
                                             "ResourceType": "security-group",
                                             "Tags": _tags({TAG_OWNER: owner, "Name": name})}])["GroupId"]
            except AwsError as exc:   # a concurrent deploy made it first
                if exc.code != "InvalidGroup.Duplicate":
                    raise
                group_id = self.api.call("ec2", "describe_security_groups", Filters=[
                    {"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": [name]}]
                )["SecurityGroups"][0]["GroupId"]
            permissions = []
        if not _allows(permissions, allow_from):
            ranges = ({"Ipv6Ranges": [{"CidrIpv6": allow_from, "Description": "ngcx deploy"}]} if ":" in allow_from
                      else {"IpRanges": [{"CidrIp": allow_from, "Description": "ngcx deploy"}]})
            try:
                self.api.call("ec2", "authorize_security_group_ingress", GroupId=group_id, IpPermissions=[
                    {"IpProtocol": "tcp", "FromPort": SERVE_PORT, "ToPort": SERVE_PORT, **ranges}])
            except AwsError as exc:
                if exc.code != "InvalidPermission.Duplicate":
                    raise
            if allow_from in ("0.0.0.0/0", "::/0"):
                vm.say(f"port {SERVE_PORT} of ngcx hosts is open to {allow_from}; restrict it with --allow-from CIDR")
        return group_id

    def _instance_profile(self) -> str:
        """NGCX_AWS_INSTANCE_PROFILE, else `ngcx-host` (made once: role for EC2 + AmazonSSMManagedInstanceCore)."""
        from ...clouds.aws import AwsError
        from . import roles as aws_roles

        own = aws_roles.own_profile()
        if own:
            return own
        try:
            profile = self.api.call("iam", "get_instance_profile", InstanceProfileName=INSTANCE_PROFILE)
            if profile["InstanceProfile"].get("Roles"):
                return INSTANCE_PROFILE
        except AwsError as exc:
            if exc.code != "NoSuchEntity":
                raise
        vm.say(f"creating the IAM role and instance profile {INSTANCE_PROFILE} (SSM Run Command reaches hosts with it)")
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                          "Principal": {"Service": "ec2.amazonaws.com"}}]}
        steps = [("create_role", {"RoleName": INSTANCE_PROFILE, "AssumeRolePolicyDocument": json.dumps(trust),
                                  "Description": "ngcx deploy hosts: SSM Run Command"}),
                 ("attach_role_policy", {"RoleName": INSTANCE_PROFILE,
                                         "PolicyArn": f"arn:{self.api.partition()}:iam::aws:policy/{SSM_POLICY}"}),
                 ("create_instance_profile", {"InstanceProfileName": INSTANCE_PROFILE}),
                 ("add_role_to_instance_profile", {"InstanceProfileName": INSTANCE_PROFILE,
                                                   "RoleName": INSTANCE_PROFILE})]
        for operation, params in steps:
            try:
                self.api.call("iam", operation, **params)
            except AwsError as exc:    # made by an earlier, interrupted run: fine
                if exc.code not in ("EntityAlreadyExists", "LimitExceeded"):
                    raise
        return INSTANCE_PROFILE

    # ------------------------------------------------------------ pull roles (roles.py)

    def pull_role_name(self, grant: roles.PullGrant | roles.PullRole) -> str:
        from . import roles as aws_roles

        return aws_roles.profile_name(grant)

    def ensure_pull_role(self, grant: roles.PullGrant | roles.PullRole) -> str:
        from . import roles as aws_roles

        return aws_roles.ensure_pull_profile(self.api, grant)

    def attach_role(self, instance_id: str, role: str) -> None:
        from . import roles as aws_roles

        _while_profile_propagates(lambda: aws_roles.attach_profile(self.api, instance_id, role))

    # ------------------------------------------------------------ create

    def create(self, spec: vm.CreateSpec) -> str:
        """RunInstances with spec.token; CapacityError when the zone has no stock for the type."""
        subnet = (self.subnets or {}).get(spec.zone)
        if subnet is None:
            raise CapacityError("NoDefaultSubnetInZone", spec.zone)
        params = self._launch_params(spec, subnet)
        answer = _while_profile_propagates(
            lambda: self.api.call("ec2", "run_instances", capacity=True, where=spec.zone, **params))
        instance_id = answer["Instances"][0]["InstanceId"]
        self._launched[instance_id] = time.monotonic()
        return instance_id

    def _launch_params(self, spec: vm.CreateSpec, subnet: Subnet) -> dict[str, Any]:
        tags = _tags({**spec.tags, "Name": spec.name})
        params: dict[str, Any] = {
            "ImageId": spec.image_id, "InstanceType": spec.instance_type, "MinCount": 1, "MaxCount": 1,
            "ClientToken": spec.token, "UserData": with_ssm_agent(spec.user_data),   # boto3 base64-encodes it
            "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            **self._root_disk(spec.image_id), **_market(spec)}
        if spec.role or self.instance_profile:
            params["IamInstanceProfile"] = {"Name": spec.role or self.instance_profile}
        groups = [self.security_group] if self.security_group else []
        if subnet.public:
            params.update(SubnetId=subnet.id, SecurityGroupIds=groups)
        else:   # the subnet does not map public addresses: ask for one on the primary interface
            params["NetworkInterfaces"] = [{"DeviceIndex": 0, "SubnetId": subnet.id, "Groups": groups,
                                            "AssociatePublicIpAddress": True, "DeleteOnTermination": True}]
        return params

    def _root_disk(self, image_id: str) -> dict[str, Any]:
        """A 100 GiB gp3 root (images are large; the AMI's default is often 30 GiB), deleted with the instance."""
        images = self.api.call("ec2", "describe_images", ImageIds=[image_id]).get("Images", [])
        root = images[0].get("RootDeviceName") if images else None
        if not root:
            return {}
        size = next((m.get("Ebs", {}).get("VolumeSize") or 0 for m in images[0].get("BlockDeviceMappings", [])
                     if m.get("DeviceName") == root), 0)
        return {"BlockDeviceMappings": [{"DeviceName": root, "Ebs": {
            "VolumeSize": max(ROOT_GIB, int(size)), "VolumeType": "gp3", "DeleteOnTermination": True}}]}

    # ------------------------------------------------------------ the command channel: SSM Run Command

    def run_command(self, instance_id: str, script: str, timeout: float) -> tuple[int, str]:
        """AWS-RunShellScript on the host; (exit code, stdout + stderr). Not retried after a 5xx (it may have run)."""
        deadline = time.monotonic() + timeout + 60
        with _channel("SendCommand", instance_id):
            command_id = self._send_command(instance_id, script, timeout)
        started = time.monotonic()
        while time.monotonic() < deadline:
            with _channel("GetCommandInvocation", instance_id):
                invocation = self._invocation(command_id, instance_id)
            if invocation and invocation.get("Status") in SSM_DONE:
                output = "".join(invocation.get(k) or "" for k in ("StandardOutputContent", "StandardErrorContent"))
                code = int(invocation.get("ResponseCode", -1))
                if invocation["Status"] != "Success" and code in (-1, 0):
                    code = 124 if invocation["Status"] == "TimedOut" else 1
                    output += f"\n(SSM: {invocation['Status']}: {invocation.get('StatusDetails', '')})"
                return code, output
            time.sleep(vm.poll_pause(started))
        raise UserError(f"SSM command {command_id} on {instance_id} did not finish in {timeout:.0f} s")

    def _send_command(self, instance_id: str, script: str, timeout: float) -> str:
        """SendCommand; an instance whose agent has not registered yet (InvalidInstanceId) is waited for."""
        from ...clouds.aws import AwsError

        deadline, pause = time.monotonic() + AGENT_WAIT_S, 1.0
        while True:
            try:
                answer = self.api.call("ssm", "send_command", idempotent=False, InstanceIds=[instance_id],
                                       DocumentName="AWS-RunShellScript", Comment="ngcx", TimeoutSeconds=60,
                                       Parameters={"commands": [script],
                                                   "executionTimeout": [str(max(1, int(timeout)))]})
                return answer["Command"]["CommandId"]
            except AwsError as exc:
                if exc.code != "InvalidInstanceId":
                    raise
                if time.monotonic() > deadline:   # past the agent's registration grace: permanent
                    raise vm.ChannelError("AWS", exc.code, "SendCommand", instance_id,
                                          "the host needs a running SSM agent and an instance profile with "
                                          f"{SSM_POLICY} (NGCX_AWS_INSTANCE_PROFILE)",
                                          f"SSM Run Command cannot reach {instance_id}: {exc.code}: {exc.message}"
                                          ) from None
                time.sleep(pause)
                pause = min(5.0, pause * 1.5)

    def _invocation(self, command_id: str, instance_id: str) -> dict[str, Any] | None:
        from ...clouds.aws import AwsError

        try:
            return self.api.call("ssm", "get_command_invocation", CommandId=command_id, InstanceId=instance_id)
        except AwsError as exc:     # the agent has not picked it up yet
            if exc.code == "InvocationDoesNotExist":
                return None
            raise

    # ------------------------------------------------------------ host images (ngcx hosts bake)

    def create_image(self, instance_id: str, name: str, tags: dict[str, str], token: str) -> str:
        """CreateImage has no ClientToken; the image name is unique per account and region, so a retry whose
        first answer was lost finds its image by name instead of making a second one (`token` is unused)."""
        from ...clouds.aws import AwsError

        del token
        kinds = [{"ResourceType": kind, "Tags": _tags({**tags, "Name": name})} for kind in ("image", "snapshot")]
        try:
            return self.api.call("ec2", "create_image", InstanceId=instance_id, Name=name,
                                 Description="ngcx host: NVIDIA driver, Docker, container toolkit, base layers",
                                 TagSpecifications=kinds)["ImageId"]
        except AwsError as exc:
            if exc.code != "InvalidAMIName.Duplicate":
                raise
        images = self.api.call("ec2", "describe_images", Owners=["self"],
                               Filters=[{"Name": "name", "Values": [name]}]).get("Images", [])
        if not images:
            raise UserError(f"image name {name} is taken but no image of this account has it")
        return images[0]["ImageId"]

    def image_available(self, image_id: str) -> bool:
        images = self.api.call("ec2", "describe_images", ImageIds=[image_id]).get("Images", [])
        state = images[0].get("State", "") if images else "gone"
        if state in ("failed", "invalid", "error", "deregistered", "gone"):
            reason = (images[0].get("StateReason") or {}).get("Message", "") if images else ""
            raise UserError(f"image {image_id} is {state}{': ' + reason if reason else ''}",
                            hint="bake again: ngcx hosts bake --cloud aws")
        return state == "available"

    def host_images(self) -> list[tuple[str, str, str]]:
        """(image id, name, creation time) of the baked ngcx host images of this account, oldest first."""
        images = self.api.call("ec2", "describe_images", Owners=["self"], Filters=[
            {"Name": f"tag:{TAG_HOST_IMAGE}", "Values": ["1"]}, {"Name": "state", "Values": ["available"]}]
        ).get("Images", [])
        images.sort(key=lambda i: i.get("CreationDate", ""))
        return [(i["ImageId"], i.get("Name", ""), i.get("CreationDate", "")) for i in images]

    def fallback_image(self) -> str:
        """The ECS GPU-optimized AMI (NVIDIA driver, Docker, container runtime) from its public SSM parameter."""
        from ...clouds.aws import AwsError

        if self._fallback is None:
            try:
                value = self.api.call("ssm", "get_parameter", Name=GPU_AMI_PARAMETER)["Parameter"]["Value"]
                self._fallback = str(json.loads(value)["image_id"])
            except AwsError as exc:
                raise UserError(f"no ECS GPU AMI in {self.region} ({GPU_AMI_PARAMETER}: {exc.code})",
                                hint="bake a host image there, or pick another --region") from None
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{GPU_AMI_PARAMETER} in {self.region} does not hold the expected JSON "
                                "with image_id") from None
        return self._fallback


def with_ssm_agent(user_data: str) -> str:
    """The user-data with the SSM agent check inserted after its first line (the shebang stays first)."""
    first, newline, rest = user_data.partition("\n")
    if not first.startswith("#!"):
        return SSM_AGENT + user_data
    return f"{first}{newline}{SSM_AGENT}{rest}"


def _status(item: dict[str, Any]) -> HostStatus:
    address = item.get("PublicIpAddress") or item.get("PrivateIpAddress")
    return HostStatus(STATE_MAP.get((item.get("State") or {}).get("Name", ""), "pending"), address,
                      item.get("InstanceType"), (item.get("Placement") or {}).get("AvailabilityZone"))


def _tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in sorted(tags.items())]


def _allows(permissions: list[dict[str, Any]], cidr: str) -> bool:
    for rule in permissions:
        ports = rule.get("IpProtocol") == "-1" or rule.get("FromPort", 0) <= SERVE_PORT <= rule.get("ToPort", -1)
        ranges = [r.get("CidrIp") for r in rule.get("IpRanges", [])] + \
            [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])]
        if rule.get("IpProtocol") in ("tcp", "-1") and ports and cidr in ranges:
            return True
    return False


def _market(spec: vm.CreateSpec) -> dict[str, Any]:
    """Spot: persistent with interruption behaviour `stop`, so `ngcx deployments stop/start` works as on-demand;
    capped at --max-price when one is given, else up to the on-demand price (EC2's default)."""
    if not spec.spot:
        return {}
    options: dict[str, Any] = {"SpotInstanceType": "persistent", "InstanceInterruptionBehavior": "stop"}
    if spec.max_price is not None:
        options["MaxPrice"] = f"{spec.max_price:.4f}"
    return {"InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": options}}


def _while_profile_propagates(call: Any) -> Any:
    """IAM is eventually consistent: a fresh instance profile is "invalid" to EC2 for seconds."""
    from ...clouds.aws import AwsError

    deadline = time.monotonic() + PROFILE_PROPAGATION_S
    while True:
        try:
            return call()
        except AwsError as exc:
            if "iaminstanceprofile" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(3)


def cloud_for(region: str) -> Ec2:
    from ...clouds.aws import Api

    return Ec2(Api(region))


@contextlib.contextmanager
def _channel(action: str, instance_id: str) -> Iterator[None]:
    """SSM's permanent refusals (a denied permission) become vm.ChannelError: asking again cannot help, and a
    readiness wait must end at once with AWS's code (issue 47 item 6). Transient ones were retried by the Api."""
    from ...clouds.aws import DENIED_CODES, AwsError

    try:
        yield
    except AwsError as exc:
        if exc.code not in DENIED_CODES:
            raise
        raise vm.ChannelError("AWS", exc.code, action, instance_id,
                              f"grant the caller ssm:SendCommand and ssm:GetCommandInvocation ({exc.line()})") from None
