"""A service's replicas as an EC2 Auto Scaling group: launch template, group, drain hook, target tracking (boto3).

Why the cloud's own scaling engine (issue 22): a group keeps its size and follows its policy while the
user's laptop is closed; ngcx only describes it. Used by services' --min/--max through
vm_groups.py (the `kit` at the end of this module).

What ensure_group makes, each named spec.name and tagged with spec.tags (ngcx:owner, ngcx:service), each
found by name before anything is created, so a retry after a lost answer or a killed ngcx makes no
duplicate (a name in use under another owner is refused):
- a launch template: the AMI (the baked host image), instance type, user-data (the host's boot script),
  instance profile, security group, IMDSv2 only, the tags on the instances and volumes it launches. When
  the AMI, user-data, type, profile or group changed, a new *version* (never a new template) and the group
  moves to it; instances already running keep theirs until they are replaced (start_refresh: an instance
  refresh).
- the group: over spec.subnets (one per zone), attached to the target group, health check type ELB with a
  grace period, min/max/desired. A group that exists keeps its desired capacity (its policy owns it), takes
  the new min/max and template version.
- a terminating lifecycle hook (HOOK, CONTINUE by default): scale-in waits in Terminating:Wait while the
  target drains (the target group's deregistration delay), so nothing in flight fails; complete_lifecycle
  ends the wait early once the host is idle, else the hook's heartbeat timeout does.
Target tracking (put_target_tracking) is on a Metric: requests per target from the balancer
(ALBRequestCountPerTarget: resource label from the balancer's and target group's ARNs) or a custom
CloudWatch metric the hosts publish (namespace, name, dimensions, statistic).
Scale to zero (service_group's --min 0): set_idle_stop makes the group's warm pool (Stopped, ReuseOnScaleIn),
put_wake a +1 step policy on a CloudWatch alarm on the ALB's own 503s; delete removes that alarm too (it
outlives the group).

Calls go through cli/clouds/aws.py's Api (botocore retries off, ngcx's own: throttling always, 5xx only
for calls safe to repeat; errors one line with the AWS code and the action, never a secret); what is
already gone counts as done. "Real parts only": tests run this with the real boto3 against
tests/emulators (aws_ec2 + aws_autoscaling: moto behind the wire harness, machines that run the
user-data, a haproxy data plane that the policy's request counts come from), nothing mocked.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...clouds.aws import AwsError
from ...core.errors import UserError

if TYPE_CHECKING:
    from ...clouds.aws import Api
    from ..balancer import BalancerRef

HOOK = "ngcx-drain"
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
OWNER_TAG = "ngcx:owner"
WAKE_WARMUP_S = 300               # the wake policy adds no second host for the same breach while one starts
PAGE_SIZE = 100                    # DescribeAutoScalingGroups' largest page
GONE_CODES = frozenset({"InvalidLaunchTemplateId.NotFound", "InvalidLaunchTemplateName.NotFoundException",
                        "InvalidLaunchTemplateId.Malformed"})


@dataclass(frozen=True)
class GroupSpec:
    """One service's scaling group: what its hosts boot and where, how many, behind which target group."""

    name: str                          # ngcx-svc-<service id>: the template's and the group's name
    image_id: str                      # the baked AMI
    user_data: str                     # the host's boot script (vm.host_script)
    instance_type: str
    subnets: tuple[str, ...]           # one per zone
    target_group_arn: str
    min_size: int
    max_size: int
    desired: int
    tags: dict[str, str] = field(default_factory=dict)
    instance_profile: str | None = None
    security_group: str | None = None
    grace_s: int = 300                 # HealthCheckGracePeriod: a booting host is not judged before that
    drain_wait_s: int = 300            # the terminating hook's heartbeat timeout
    spot: bool = False                 # hosts above on_demand_base bought as spot (MixedInstancesPolicy)
    on_demand_base: int = 0            # OnDemandBaseCapacity: this many hosts always on demand
    instance_types: tuple[str, ...] = ()   # the types the group may launch (Overrides); () = instance_type only

    @property
    def mixed(self) -> bool:
        """A MixedInstancesPolicy instead of the plain template: spot, or more than one instance type."""
        return self.spot or len(self.types) > 1

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.instance_type, *self.instance_types)))


@dataclass(frozen=True)
class GroupRef:
    """What a record keeps to find the group again (names and ids; nothing secret)."""

    name: str
    template_id: str
    version: str                       # the launch template version the group launches


@dataclass(frozen=True)
class Metric:
    """A target-tracking metric: ALBRequestCountPerTarget (resource_label) or a custom CloudWatch metric."""

    resource_label: str = ""           # app/NAME/ID/targetgroup/NAME/ID
    namespace: str = ""
    name: str = ""
    dimensions: tuple[tuple[str, str], ...] = ()
    statistic: str = "Average"


@dataclass(frozen=True)
class Member:
    instance_id: str
    zone: str
    state: str                         # Pending, InService, Terminating:Wait, ...
    health: str                        # Healthy / Unhealthy
    market: str = "on-demand"          # "spot" when EC2 says InstanceLifecycle spot


def requests_per_target(balancer_arn: str, target_group_arn: str) -> Metric:
    """ALBRequestCountPerTarget's resource label from the two ARNs (…:loadbalancer/app/N/ID, …:targetgroup/N/ID)."""
    balancer = balancer_arn.partition(":loadbalancer/")[2]
    group = target_group_arn.partition(":")[2].rpartition(":")[2]
    if not balancer.startswith("app/") or not group.startswith("targetgroup/"):
        raise UserError(f"not an ALB and target group ARN pair: {balancer_arn!r}, {target_group_arn!r}")
    return Metric(resource_label=f"{balancer}/{group}")


class AutoScalingGroups:
    """ensure_group / set_size / put_target_tracking / instances / complete_lifecycle / delete / tagged."""

    def __init__(self, api: Api) -> None:
        self.api = api

    # --- ensure ------------------------------------------------------------------------------------

    def ensure_group(self, spec: GroupSpec) -> GroupRef:
        if not 0 <= spec.min_size <= spec.desired <= spec.max_size:
            raise UserError(f"group {spec.name}: need 0 <= min ({spec.min_size}) <= desired ({spec.desired}) <= "
                            f"max ({spec.max_size})")
        template_id, version = self._template(spec)
        group = self._group(spec.name)
        launch = _launch(spec, template_id, version)
        if group is None:
            try:
                self._call("create_auto_scaling_group", AutoScalingGroupName=spec.name, **launch,
                           MinSize=spec.min_size, MaxSize=spec.max_size, DesiredCapacity=spec.desired,
                           VPCZoneIdentifier=",".join(spec.subnets), TargetGroupARNs=[spec.target_group_arn],
                           HealthCheckType="ELB", HealthCheckGracePeriod=spec.grace_s,
                           Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True, "ResourceId": spec.name,
                                  "ResourceType": "auto-scaling-group"} for k, v in sorted(spec.tags.items())])
            except AwsError as exc:               # a retry after a lost answer: it exists now
                if exc.code != "AlreadyExists":
                    raise
                group = self._group(spec.name)
        if group is not None:
            self._check_owner(spec, {t["Key"]: t["Value"] for t in group.get("Tags") or []}, "Auto Scaling group")
            if (_launched(group), group.get("MinSize"), group.get("MaxSize")) != (
                    _launched(launch), spec.min_size, spec.max_size):
                self._call("update_auto_scaling_group", AutoScalingGroupName=spec.name, **launch,
                           MinSize=spec.min_size, MaxSize=spec.max_size)
            if spec.target_group_arn not in (group.get("TargetGroupARNs") or []):
                self._call("attach_load_balancer_target_groups", AutoScalingGroupName=spec.name,
                           TargetGroupARNs=[spec.target_group_arn])
        self._call("put_lifecycle_hook", AutoScalingGroupName=spec.name, LifecycleHookName=HOOK,
                   LifecycleTransition=TERMINATING, HeartbeatTimeout=spec.drain_wait_s, DefaultResult="CONTINUE")
        return GroupRef(spec.name, template_id, version)

    def _template(self, spec: GroupSpec) -> tuple[str, str]:
        """The launch template's id and the version that says what spec says (made when missing)."""
        data = _template_data(spec)
        found = self._find_template(spec.name)
        if found is None:
            token = hashlib.sha256(repr((spec.name, sorted(data.items()))).encode()).hexdigest()[:64]
            try:
                made = self._call_ec2("create_launch_template", LaunchTemplateName=spec.name, LaunchTemplateData=data,
                                      ClientToken=token, TagSpecifications=[
                                          {"ResourceType": "launch-template", "Tags": _tags(spec.tags)}])
                return made["LaunchTemplate"]["LaunchTemplateId"], str(made["LaunchTemplate"]["LatestVersionNumber"])
            except AwsError as exc:       # a retry after a lost answer (the name is taken: by that first call)
                if exc.code != "InvalidLaunchTemplateName.AlreadyExistsException":
                    raise
                found = self._find_template(spec.name)
                if found is None:
                    raise
        self._check_owner(spec, {t["Key"]: t["Value"] for t in found.get("Tags") or []}, "launch template")
        template_id = found["LaunchTemplateId"]
        latest = self._call_ec2("describe_launch_template_versions", LaunchTemplateId=template_id,
                                Versions=["$Latest"])["LaunchTemplateVersions"][0]
        if _same_data(latest.get("LaunchTemplateData") or {}, data):
            return template_id, str(latest["VersionNumber"])
        made = self._call_ec2("create_launch_template_version", LaunchTemplateId=template_id, LaunchTemplateData=data,
                              ClientToken=hashlib.sha256(repr((template_id, latest["VersionNumber"],
                                                               sorted(data.items()))).encode()).hexdigest()[:64])
        return template_id, str(made["LaunchTemplateVersion"]["VersionNumber"])

    def _find_template(self, name: str) -> dict[str, Any] | None:
        try:
            found = self._call_ec2("describe_launch_templates", LaunchTemplateNames=[name])["LaunchTemplates"]
        except AwsError as exc:
            if exc.code in GONE_CODES:
                return None
            raise
        return found[0] if found else None

    def _group(self, name: str) -> dict[str, Any] | None:
        found = self._call("describe_auto_scaling_groups", AutoScalingGroupNames=[name])["AutoScalingGroups"]
        return found[0] if found else None

    @staticmethod
    def _check_owner(spec: GroupSpec, tags: dict[str, str], what: str) -> None:
        owner = spec.tags.get(OWNER_TAG)
        if owner and tags.get(OWNER_TAG) != owner:
            raise UserError(f"{what} {spec.name} exists but is not this owner's (tag {OWNER_TAG}="
                            f"{tags.get(OWNER_TAG)!r})", hint="choose another service name or remove it")

    # --- instance refresh (a rolling update) ---------------------------------------------------------

    def start_refresh(self, ref: GroupRef, spec: GroupSpec) -> str:
        """Replace every host with one launched from `spec` (a new template version when it changed), new
        hosts healthy behind the balancer before old ones drain; the refresh's id.

        Why these preferences: MinHealthyPercentage 100 keeps every serving host until its replacement is
        healthy, MaxHealthyPercentage 200 (above 100: launch before terminate) lets the whole batch launch at
        once; SkipMatching leaves hosts that already run the desired configuration (a retry after an
        interrupted ngcx replaces only what is left); the health check is the group's (ELB: a host is
        InService only once healthy in the target group, so InstanceWarmup is 0: it already serves); old
        hosts leave through the deregistration delay and the terminating hook as on scale-in.
        DesiredConfiguration names the exact version, so AWS moves the group to it on success. A
        refresh already running (an earlier ngcx's) is that refresh's id, not a second one."""
        template_id, version = self._template(spec)
        desired = _launch(spec, template_id, version)
        desired.pop("CapacityRebalance", None)
        try:
            answer = self._call("start_instance_refresh", AutoScalingGroupName=ref.name, Strategy="Rolling",
                                DesiredConfiguration=desired,
                                Preferences={"MinHealthyPercentage": 100, "MaxHealthyPercentage": 200,
                                             "SkipMatching": True, "InstanceWarmup": 0})
        except AwsError as exc:
            if exc.code != "InstanceRefreshInProgress":
                raise
            running = self._refreshes(ref.name)
            if not running:
                raise
            return str(running[0]["InstanceRefreshId"])
        return str(answer["InstanceRefreshId"])

    def refresh_state(self, ref: GroupRef, refresh_id: str) -> Any:
        """vm_groups.RefreshState of one refresh (AWS's status in five words; its reason kept)."""
        from ..vm_groups import RefreshState

        found = self._refreshes(ref.name, refresh_id)
        if not found:
            return RefreshState("failed", 0, f"no instance refresh {refresh_id} on group {ref.name}")
        item = found[0]
        return RefreshState(REFRESH_STATUS.get(str(item.get("Status")), "running"),
                            int(item.get("PercentageComplete") or 0), str(item.get("StatusReason") or ""))

    def cancel_refresh(self, ref: GroupRef, refresh_id: str) -> None:
        """Stop the group's running refresh (hosts already replaced stay); none running is done, not an error."""
        try:
            self._call("cancel_instance_refresh", AutoScalingGroupName=ref.name)
        except AwsError as exc:
            if exc.code != "ActiveInstanceRefreshNotFound":
                raise

    def _refreshes(self, name: str, refresh_id: str = "") -> list[dict[str, Any]]:
        """The group's refreshes (newest first, as AWS lists them), or the one named; active ones only when
        no id is given."""
        params: dict[str, Any] = {"AutoScalingGroupName": name}
        if refresh_id:
            params["InstanceRefreshIds"] = [refresh_id]
        found = self._call("describe_instance_refreshes", **params).get("InstanceRefreshes") or []
        if refresh_id:
            return found
        return [r for r in found if r.get("Status") in ("Pending", "InProgress", "Cancelling", "Baking")]

    # --- size, policy, members ------------------------------------------------------------------------

    def set_size(self, ref: GroupRef, min_size: int, max_size: int, desired: int) -> None:
        if not 0 <= min_size <= desired <= max_size:
            raise UserError(f"group {ref.name}: need 0 <= min ({min_size}) <= desired ({desired}) <= max ({max_size})")
        self._call("update_auto_scaling_group", AutoScalingGroupName=ref.name, MinSize=min_size, MaxSize=max_size,
                   DesiredCapacity=desired)

    def put_target_tracking(self, ref: GroupRef, target_value: float, metric: Metric,
                            disable_scale_in: bool = False) -> str:
        """The group's one target-tracking policy (PutScalingPolicy replaces it by name); its ARN."""
        config: dict[str, Any] = {"TargetValue": float(target_value), "DisableScaleIn": disable_scale_in}
        if metric.resource_label:
            config["PredefinedMetricSpecification"] = {"PredefinedMetricType": "ALBRequestCountPerTarget",
                                                       "ResourceLabel": metric.resource_label}
        elif metric.namespace and metric.name:
            config["CustomizedMetricSpecification"] = {
                "Namespace": metric.namespace, "MetricName": metric.name, "Statistic": metric.statistic,
                "Dimensions": [{"Name": k, "Value": v} for k, v in metric.dimensions]}
        else:
            raise UserError("a target-tracking metric needs a resource label or a namespace and a name")
        answer = self._call("put_scaling_policy", AutoScalingGroupName=ref.name, PolicyName=f"{ref.name}-track",
                            PolicyType="TargetTrackingScaling", TargetTrackingConfiguration=config)
        return str(answer.get("PolicyARN") or "")

    def set_idle_stop(self, ref: GroupRef, on: bool) -> None:
        """Scale-in to a warm pool of stopped hosts (on) or to terminated ones (off).

        Why a warm pool: a stopped EC2 instance bills only its EBS volumes, and keeps the image's layers, so a
        wake-up starts it (no launch, no pull) instead of booting a new one. ReuseOnScaleIn returns a host
        that scales in to the pool, after its drain and the terminating hook. The pool's size is AWS's
        default (MaxGroupPreparedCapacity unset: the group's max minus its desired), so the pool may also
        prepare stopped hosts up to the max ahead of need; each costs only its disk."""
        if on:
            self._call("put_warm_pool", AutoScalingGroupName=ref.name, PoolState="Stopped", MinSize=0,
                       InstanceReusePolicy={"ReuseOnScaleIn": True})
            return
        try:
            self._call("delete_warm_pool", AutoScalingGroupName=ref.name, ForceDelete=True)
        except AwsError as exc:                    # no pool (or no group): nothing to delete
            if exc.code not in ("ValidationError", "ResourceInUse") or "warm pool" not in str(exc).lower():
                raise

    def put_wake(self, ref: GroupRef, balancer: BalancerRef, on: bool, warmup_s: int = WAKE_WARMUP_S) -> None:
        """A step policy (+1 host) on an alarm on the balancer's own 503s: the wake-up from zero hosts (on);
        both removed (off).

        Why this signal: with no host in service the target-tracking metric (requests per target) has no
        datapoints, so target tracking never scales out from zero; the balancer answers every request 503
        itself (ALB: "no registered targets") and counts them in HTTPCode_ELB_503_Count. The alarm is
        CloudWatch's, the policy the group's: the wake-up runs with no ngcx. The alarm is not part of the
        group (DeleteAutoScalingGroup leaves it): delete() removes it by name."""
        name = f"{ref.name}-wake"
        if not on:
            self._delete_wake(ref)
            return
        label = balancer.balancer_id.partition(":loadbalancer/")[2]
        if not label.startswith("app/"):
            raise UserError(f"not an ALB ARN: {balancer.balancer_id!r}")
        policy = self._call("put_scaling_policy", AutoScalingGroupName=ref.name, PolicyName=name,
                            PolicyType="StepScaling", AdjustmentType="ChangeInCapacity", MetricAggregationType="Sum",
                            EstimatedInstanceWarmup=warmup_s,
                            StepAdjustments=[{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}])
        self.api.call("cloudwatch", "put_metric_alarm", AlarmName=name, Namespace="AWS/ApplicationELB",
                      MetricName="HTTPCode_ELB_503_Count", Dimensions=[{"Name": "LoadBalancer", "Value": label}],
                      Statistic="Sum", Period=60, EvaluationPeriods=1, Threshold=1.0,
                      ComparisonOperator="GreaterThanOrEqualToThreshold", TreatMissingData="notBreaching",
                      AlarmActions=[policy["PolicyARN"]],
                      AlarmDescription=f"wakes {ref.name} from zero hosts: a request got the balancer's 503")

    def _delete_wake(self, ref: GroupRef) -> None:
        self.api.call("cloudwatch", "delete_alarms", AlarmNames=[f"{ref.name}-wake"])    # absent: no error
        try:
            self._call("delete_policy", AutoScalingGroupName=ref.name, PolicyName=f"{ref.name}-wake")
        except AwsError as exc:
            if exc.code != "ValidationError":          # no such group or policy: gone already
                raise

    def sizes(self, ref: GroupRef) -> tuple[int, int, int] | None:
        group = self._group(ref.name)
        if group is None:
            return None
        return int(group.get("MinSize", 0)), int(group.get("MaxSize", 0)), int(group.get("DesiredCapacity", 0))

    def instances(self, ref: GroupRef) -> list[Member]:
        """The group's instances, then its warm pool's (stopped hosts kept for a wake-up)."""
        group = self._group(ref.name)
        found = list((group or {}).get("Instances") or [])
        if group is not None and group.get("WarmPoolConfiguration"):
            found += self._call("describe_warm_pool", AutoScalingGroupName=ref.name).get("Instances") or []
        markets = self._markets([i["InstanceId"] for i in found]) if group and group.get(
            "MixedInstancesPolicy") else {}
        return [Member(i["InstanceId"], i.get("AvailabilityZone", ""), i.get("LifecycleState", ""),
                       i.get("HealthStatus", ""), markets.get(i["InstanceId"], "on-demand")) for i in found]

    def _markets(self, ids: list[str]) -> dict[str, str]:
        """Instance id -> "spot" / "on-demand" as EC2 says (InstanceLifecycle; the group's list has no market)."""
        if not ids:
            return {}
        try:
            answer = self._call_ec2("describe_instances", InstanceIds=ids)
        except AwsError as exc:                     # one just terminated: the rest are read next time
            if exc.code != "InvalidInstanceID.NotFound":
                raise
            return {}
        return {i["InstanceId"]: "spot" if i.get("InstanceLifecycle") == "spot" else "on-demand"
                for r in answer.get("Reservations") or [] for i in r.get("Instances") or []}

    def complete_lifecycle(self, ref: GroupRef, instance_id: str) -> None:
        """End the instance's Terminating:Wait now (its host is idle); no wait left is done, not an error."""
        try:
            self._call("complete_lifecycle_action", AutoScalingGroupName=ref.name, LifecycleHookName=HOOK,
                       InstanceId=instance_id, LifecycleActionResult="CONTINUE")
        except AwsError as exc:
            if exc.code != "ValidationError" or "No active Lifecycle Action" not in str(exc):
                raise

    # --- delete, gc --------------------------------------------------------------------------------------

    def delete(self, ref: GroupRef) -> None:
        """The group (ForceDelete: its instances and its warm pool's terminate, outstanding waits dropped), its
        wake alarm (not the group's: CloudWatch keeps it), then its template."""
        try:
            self._call("delete_auto_scaling_group", AutoScalingGroupName=ref.name, ForceDelete=True)
        except AwsError as exc:
            if exc.code != "ValidationError" or "not found" not in str(exc):
                raise
        self.api.call("cloudwatch", "delete_alarms", AlarmNames=[f"{ref.name}-wake"])
        template = {"LaunchTemplateId": ref.template_id} if ref.template_id else {"LaunchTemplateName": ref.name}
        try:
            self._call_ec2("delete_launch_template", **template)
        except AwsError as exc:
            if exc.code not in GONE_CODES:
                raise

    def tagged(self, tags: dict[str, str]) -> list[GroupRef]:
        """Every group and launch template carrying all of `tags` (gc: what a killed ngcx left)."""
        groups = self.api.pages("autoscaling", "describe_auto_scaling_groups", "AutoScalingGroups",
                                MaxRecords=PAGE_SIZE)
        templates = self.api.pages("ec2", "describe_launch_templates", "LaunchTemplates")
        by_name = {t["LaunchTemplateName"]: t for t in templates if _has(t.get("Tags"), tags)}
        found = []
        for group in groups:
            if _has(group.get("Tags"), tags):
                launched, version = _launched(group)[:2]
                template = by_name.pop(group["AutoScalingGroupName"], None) or {}
                found.append(GroupRef(group["AutoScalingGroupName"], launched or template.get("LaunchTemplateId", ""),
                                      str(version or "")))
        found += [GroupRef(name, t["LaunchTemplateId"], "") for name, t in sorted(by_name.items())]
        return found

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        return self.api.call("autoscaling", operation, **params)

    def _call_ec2(self, operation: str, **params: Any) -> dict[str, Any]:
        return self.api.call("ec2", operation, **params)


REFRESH_STATUS = {"Pending": "pending", "InProgress": "running", "Baking": "running", "Cancelling": "running",
                  "RollbackInProgress": "running", "Successful": "done", "Failed": "failed",
                  "RollbackFailed": "failed", "RollbackSuccessful": "failed", "Cancelled": "cancelled"}


def _launch(spec: GroupSpec, template_id: str, version: str) -> dict[str, Any]:
    """The group's launch parameters: the template version, or a MixedInstancesPolicy over it.

    Why this policy for spot (issue 49): OnDemandBaseCapacity keeps an on-demand floor, every host above it
    is spot (OnDemandPercentageAboveBaseCapacity 0), capacity-optimized picks the pools least likely to be
    interrupted, one Override per instance type widens those pools, and CapacityRebalance makes the group
    replace a spot host on EC2's rebalance recommendation: it launches the replacement, waits for its health
    check, then terminates the old one through the terminating lifecycle hook and the target group's
    deregistration delay (AWS, "Capacity Rebalancing" in the EC2 Auto Scaling guide) — the drain that keeps
    a reclaimed host's in-flight requests, with no watcher on the host. Without spot, several types are the
    same policy all on demand."""
    template = {"LaunchTemplateId": template_id, "Version": version}
    if not spec.mixed:
        return {"LaunchTemplate": template}
    return {"MixedInstancesPolicy": {
        "LaunchTemplate": {"LaunchTemplateSpecification": template,
                           "Overrides": [{"InstanceType": t} for t in spec.types]},
        "InstancesDistribution": {"OnDemandBaseCapacity": spec.on_demand_base if spec.spot else 0,
                                  "OnDemandPercentageAboveBaseCapacity": 0 if spec.spot else 100,
                                  "SpotAllocationStrategy": "capacity-optimized"}},
        "CapacityRebalance": spec.spot}


def _launched(found: dict[str, Any]) -> tuple[Any, ...]:
    """What a group (or _launch's parameters) launches: template id, version, types, on-demand base, spot."""
    mixed = found.get("MixedInstancesPolicy")
    if not mixed:
        template = found.get("LaunchTemplate") or {}
        return template.get("LaunchTemplateId"), template.get("Version"), (), 0, False
    template = mixed.get("LaunchTemplate", {}).get("LaunchTemplateSpecification") or {}
    split = mixed.get("InstancesDistribution") or {}
    return (template.get("LaunchTemplateId"), template.get("Version"),
            tuple(o.get("InstanceType") for o in mixed.get("LaunchTemplate", {}).get("Overrides") or []),
            int(split.get("OnDemandBaseCapacity") or 0), bool(found.get("CapacityRebalance")))


def _template_data(spec: GroupSpec) -> dict[str, Any]:
    data: dict[str, Any] = {
        "ImageId": spec.image_id, "InstanceType": spec.instance_type,
        "UserData": base64.b64encode(spec.user_data.encode()).decode(),
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": [{"ResourceType": kind, "Tags": _tags(spec.tags)} for kind in ("instance", "volume")]}
    if spec.instance_profile:
        data["IamInstanceProfile"] = {"Name": spec.instance_profile}
    if spec.security_group:
        data["SecurityGroupIds"] = [spec.security_group]
    return data


def _same_data(found: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """The parts that decide what a host boots (AWS echoes them, maybe with more keys around)."""
    profile = (found.get("IamInstanceProfile") or {}).get("Name")
    return (found.get("ImageId"), found.get("InstanceType"), found.get("UserData"), profile,
            sorted(found.get("SecurityGroupIds") or [])) == (
        wanted["ImageId"], wanted["InstanceType"], wanted["UserData"],
        (wanted.get("IamInstanceProfile") or {}).get("Name"), sorted(wanted.get("SecurityGroupIds") or []))


def _tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def _has(found: list[dict[str, Any]] | None, wanted: dict[str, str]) -> bool:
    have = {t.get("Key"): t.get("Value") for t in found or []}
    return all(have.get(k) == v for k, v in wanted.items())


# --- the kit vm_groups.py drives --------------------------------------------------------------------------
STATES = {"Pending": "pending", "Pending:Wait": "pending", "Pending:Proceed": "pending", "InService": "in-service",
          "Terminating": "leaving", "Terminating:Wait": "leaving", "Terminating:Proceed": "leaving",
          "Terminated": "leaving", "Detaching": "leaving", "Detached": "leaving",
          "Warmed:Pending": "warming", "Warmed:Pending:Wait": "warming", "Warmed:Pending:Proceed": "warming",
          "Warmed:Stopped": "stopped", "Warmed:Running": "stopped", "Warmed:Terminating": "leaving",
          "Warmed:Terminating:Wait": "leaving", "Warmed:Terminated": "leaving"}


def kit(api: Api) -> Any:
    """vm_groups.GroupKit over this module: a target group's ARN, requests per target per minute (AWS's
    ALBRequestCountPerTarget is a per-minute sum, the unit of --target-requests)."""
    from ..vm_groups import GroupKit

    def spec(*, networks: tuple[str, ...], balancer: BalancerRef, role: str | None, **common: Any) -> GroupSpec:
        return GroupSpec(subnets=networks, target_group_arn=balancer.group_id, instance_profile=role, **common)

    def metric(balancer: BalancerRef, per_minute: float) -> tuple[float, Metric]:
        return per_minute, requests_per_target(balancer.balancer_id, balancer.group_id)

    return GroupKit(AutoScalingGroups(api), GroupRef, spec, metric, STATES)
