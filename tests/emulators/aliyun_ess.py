"""Alibaba Cloud Auto Scaling (ESS, 2022-02-22) for the ECS emulator: groups whose instances are real emulated
ECS instances, behind the emulated ALB's server groups, drained through a lifecycle hook, tracked on real load.

Why: ngcx makes a service's replicas a scaling group on Alibaba Cloud (issue 22: a scaling configuration from
the baked host image, the group attached to the service's ALB server group, a target-tracking rule). What a
user notices is what the group *does*: instances that boot the user-data and take traffic, a scale-in that
drains before the machine goes, a rule that follows real load. EcsEmulator serves these actions on its port
(Version 2022-02-22, product "Ess"), so signatures, ClientToken replays (ESS_IDEMPOTENT) and the faults
`fail_next`/`hold` are the emulator's own; every action runs under its lock.

Emulated (names as ESS 2022-02-22's models spell them; the gateway refuses others, aliyun_models_check.py):
- Create/Describe/Modify/Enable/Disable/DeleteScalingGroup, AttachServerGroups: MinSize/MaxSize/
  DesiredCapacity, VSwitchIds.N, ServerGroups.N.{ServerGroupId,Port,Weight,Type=ALB} (the emulated ALB's;
  AttachServerGroups adds more, ForceAttach puts the InService instances in), Tags.N.{Key,Value},
  RemovalPolicies (always OldestScalingConfiguration then OldestInstance, ESS's default). A new group is
  Inactive; EnableScalingGroup (ActiveScalingConfigurationId, else its only configuration) makes it Active,
  and only an Active group with a configuration launches. DeleteScalingGroup of a group with instances needs
  ForceDelete (its instances are taken out of the server groups and released).
- Create/Describe/DeleteScalingConfiguration: ImageId, InstanceType, UserData (base64), SecurityGroupId,
  RamRoleName, InstanceName, Tags (a JSON object string, as ESS takes it). ModifyScalingGroup's
  ActiveScalingConfigurationId switches the group; running instances keep theirs.
- Instances: whenever a group's in-service + pending count differs from DesiredCapacity, a scaling activity
  (DescribeScalingActivities: InProgress -> Successful / Failed with the ECS error) launches them through
  the emulator's own RunInstances (the configuration's image, type, user-data, role, tags; the zone with
  the fewest of the group's instances among its vSwitches) -> `Pending` until the instance is Running and
  added to every attached ALB server group (Conflict.Lock retried), then `InService`. Scale-in takes victims
  by the removal policies: each is removed from the server groups at once (the ALB drain runs) and waits as
  `Removing:Wait` while a SCALE_IN lifecycle hook's action is Pending (DescribeLifecycleActions by activity;
  CompleteLifecycleAction by hook id + token, CONTINUE or ABANDON; HeartbeatTimeout x time_scale ends it as
  Timeout), else `Removing`; it is released (DeleteInstances Force) once both the drain and the wait are over.
- Recycle mode (economical mode; ScalingPolicy of Create/ModifyScalingGroup: release (default), recycle,
  forceRelease, forceRecycle): after the drain and the wait, a victim is stopped instead (StopInstance
  StoppedMode StopCharging: its machine really stops, its disk is kept) and stays in the group as `Stopped`
  (DescribeScalingInstances lists it; StoppedCapacity counts it). A scale-out starts Stopped instances first
  (StartInstance: the machine boots again, `Pending` until it runs and is back in every server group, then
  `InService`) and launches new ones only for the rest (or for those whose start ECS refused, e.g. NoStock).
  DesiredCapacity, MinSize and MaxSize count only the instances that are not Stopped. ForceDelete releases
  the Stopped ones too.
- Alarm tasks (CreateAlarm, DescribeAlarms, Enable/Disable/DeleteAlarm) on the ALB's 503 count or a metric a
  test puts, and ExecuteScalingRule of simple rules: aliyun_ess_alarms.py (its docstring says what and how).
- Instance refresh (Start/Describe/CancelInstanceRefresh): aliyun_ess_refresh.py. Spot: MultiAZPolicy,
  OnDemandBaseCapacity, OnDemandPercentageAboveBaseCapacity, CompensateWithOnDemand, SpotInstanceRemedy on
  the group, SpotStrategy and InstanceTypes.N on the configuration, and a reclaim (`reclaim`):
  aliyun_ess_spot.py. DescribeScalingInstances shows each member's SpotStrategy and TotalSpotCount.
- Create/Describe/Modify/DeleteLifecycleHook; Create/Describe/Modify/DeleteScalingRule; ListTagResources
  (ResourceType scalinggroup).
- Target tracking (ScalingRuleType TargetTrackingScalingRule), evaluated every `period_s` = 60 x time_scale
  (CloudMonitor's one-minute metric): MetricName QPS_METRIC (LoadBalancerRealServerAverageQps, documented; its
  AlarmDimensions rulePool names the server group, aliyun_ess_scaling.py) is the requests per
  emulated second that the ALB planes (real haproxy) sent to the group's server groups in the period / the
  group's InService instances; any other MetricName reads what a test `put_metric`s (the hosts' own metric).
  desired = ceil(in-service x metric / target), clamped to min/max; scale-out at once, scale-in after
  `scale_in_periods` periods below and only without DisableScaleIn; no decision while an instance is Pending
  (warm-up). Decisions go to `decisions`.
Not emulated: scaling groups of launch templates or ECI, CLB/NLB/RDS attachments, SCALE_OUT hooks (accepted,
stored, not waited on), ROLLBACK, notifications and OOS, scheduled tasks, step/predictive rule execution,
health checks replacing instances (HealthStatus says Healthy while the ECS instance runs),
Standby/Protected, cooldowns, instance weights, multi-AZ placement by policy, StopInstanceTimeout, the force*
policies' forced stop/release (they behave as release/recycle); a failed launch (the activity says why) is
not tried again until the group's next change or decision.
Guessed (the reference does not say, or the name is not known for certain): the error
codes NotFound-style `InvalidScalingGroupId.NotFound`, `InvalidScalingConfigurationId.NotFound`,
`InvalidLifecycleHookId.NotFound`, `InvalidScalingRuleId.NotFound`, `LifecycleActionToken.NotFound` (no
Pending action with that token), `IncorrectScalingGroupStatus` (delete with instances, enable without a
configuration), `*.Duplicate` for names in use; DescribeScalingGroups shows Tags and takes ScalingGroupIds.N
and ScalingGroupName; scale-in drains and waits side by side (ESS removes from the balancer first); in
recycle mode TotalCapacity counts the Stopped instances, MinSize/MaxSize/DesiredCapacity do not, a Stopped
instance's HealthStatus is Unhealthy, the policy can be changed both ways by ModifyScalingGroup (Stopped
instances of a group switched to release stay and are still started first), a victim that is not Running
when its wait ends is released, Stopped ones are started oldest first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .aliyun_ecs_machines import SPOT_STRATEGIES
from .aliyun_ess_alarms import Alarm, Alarms, simple_settings
from .aliyun_ess_refresh import Refreshes, RefreshTask
from .aliyun_ess_scaling import RECYCLE, Activity, Ecs, Group, LifecycleAction, Scaling, new_id
from .aliyun_ess_spot import Spot
from .aliyun_rpc import Action, ApiError, as_bool, as_int, indexed, invalid, iso_now, page, repeated, required

ESS_VERSION = "2022-02-22"   # the maintained version (alibabacloud-ess20220222); its plural spellings
ESS_IDEMPOTENT = frozenset({"CreateScalingGroup", "CreateScalingConfiguration", "CreateScalingRule",
                            "CompleteLifecycleAction", "ExecuteScalingRule", "StartInstanceRefresh"})
POLICIES = ("release", "forceRelease", *RECYCLE)                # ScalingPolicy (the instance reclaim mode)


def not_found(kind: str, resource_id: str) -> ApiError:
    return ApiError(404, f"Invalid{kind}.NotFound", f"The specified {kind} {resource_id!r} does not exist.")


@dataclass
class Config:
    id: str
    group_id: str
    name: str
    image_id: str
    instance_type: str
    user_data: str
    security_group: str
    ram_role: str
    instance_name: str
    tags: dict[str, str]
    created: str = field(default_factory=iso_now)
    instance_types: list[str] = field(default_factory=list)    # InstanceTypes.N (instance_type: the first)
    spot_strategy: str = "NoSpot"


@dataclass
class Hook:
    id: str
    group_id: str
    name: str
    transition: str
    timeout: int
    default_result: str


@dataclass
class Rule:
    id: str
    group_id: str
    name: str
    type: str
    metric: str
    target: float
    disable_scale_in: bool
    adjustment: tuple[str, int]


class Ess(Refreshes, Spot, Alarms, Scaling):
    """ESS state and actions over an EcsEmulator (its lock, workers, instances and ALB)."""

    def __init__(self, ecs: Ecs, *, time_scale: float = 1.0, scale_in_periods: int = 3) -> None:
        self.ecs, self._lock = ecs, ecs._lock
        self.time_scale, self.scale_in_periods = time_scale, scale_in_periods
        self.decisions: list[tuple[str, int, int, float]] = []    # (group name, from, to, metric) by the controller
        self.errors: list[str] = []                               # worker and controller failures
        self.metrics: dict[tuple[str, str], float] = {}           # (group id, metric name) -> value (put_metric)
        self._groups: dict[str, Group] = {}
        self._configs: dict[str, Config] = {}
        self._hooks: dict[str, Hook] = {}
        self._rules: dict[str, Rule] = {}
        self._activities: dict[str, Activity] = {}
        self._actions: dict[str, LifecycleAction] = {}
        self._alarms: dict[str, Alarm] = {}
        self._refreshes: dict[str, RefreshTask] = {}
        self._counts: dict[str, int] = {}                         # listener -> requests its plane sent so far
        self._controller: threading.Thread | None = None
        self.actions: dict[str, Action] = {
            "CreateScalingGroup": self._create_group, "DescribeScalingGroups": self._describe_groups,
            "ModifyScalingGroup": self._modify_group, "EnableScalingGroup": self._enable_group,
            "DisableScalingGroup": self._disable_group, "DeleteScalingGroup": self._delete_group,
            "AttachServerGroups": self._attach,
            "CreateScalingConfiguration": self._create_config,
            "DescribeScalingConfigurations": self._describe_configs,
            "DeleteScalingConfiguration": self._delete_config, "DescribeScalingInstances": self._describe_instances,
            "CreateLifecycleHook": self._create_hook, "DescribeLifecycleHooks": self._describe_hooks,
            "ModifyLifecycleHook": self._modify_hook, "DeleteLifecycleHook": self._delete_hook,
            "CompleteLifecycleAction": self._complete, "DescribeLifecycleActions": self._describe_actions,
            "DescribeScalingActivities": self._describe_activities, "CreateScalingRule": self._create_rule,
            "DescribeScalingRules": self._describe_rules, "ModifyScalingRule": self._modify_rule,
            "DeleteScalingRule": self._delete_rule, "ListTagResources": self._list_tags, **self.alarm_actions(),
            **self.refresh_actions()}

    def put_metric(self, group_id: str, name: str, value: float) -> None:
        """What the hosts would publish to CloudMonitor: the value a rule on `name` reads next period."""
        with self._lock:
            self.metrics[(group_id, name)] = value

    # --- lookups -------------------------------------------------------------------------------

    def _group(self, params: Mapping[str, str]) -> Group:
        group_id = required(params, "ScalingGroupId")
        if group_id not in self._groups:
            raise not_found("ScalingGroupId", group_id)
        return self._groups[group_id]

    def _sizes(self, params: Mapping[str, str], group: Group | None) -> tuple[int, int, int]:
        low = as_int(params, "MinSize", group.min if group else -1, 0, 2000)
        high = as_int(params, "MaxSize", group.max if group else -1, 0, 2000)
        if low < 0 or high < 0:
            raise invalid("MinSize" if low < 0 else "MaxSize", "It is mandatory.")
        desired = as_int(params, "DesiredCapacity", group.desired if group else low, 0, 2000)
        if not low <= high:
            raise ApiError(400, "InvalidParameter.Conflict", "MinSize must not be greater than MaxSize.")
        if params.get("DesiredCapacity") and not low <= desired <= high:
            raise ApiError(400, "InvalidParameter.Conflict", "DesiredCapacity must be within [MinSize, MaxSize].")
        return low, high, min(max(desired, low), high)

    # --- groups ----------------------------------------------------------------------------------

    def _create_group(self, params: dict[str, str]) -> dict[str, Any]:
        name = required(params, "ScalingGroupName")
        if any(g.name == name for g in self._groups.values()):
            raise ApiError(400, "ScalingGroupName.Duplicate", f"The specified scaling group name {name!r} exists.")
        low, high, desired = self._sizes(params, None)
        switches = repeated(params, "VSwitchIds") or ([params["VSwitchId"]] if params.get("VSwitchId") else [])
        if not switches:
            raise invalid("VSwitchIds", "A VPC scaling group needs vSwitches.")
        for switch in switches:
            if switch not in self.ecs._vswitches:
                raise ApiError(404, "InvalidVSwitchId.NotFound", f"The specified VSwitchId {switch} does not exist.")
        attached = self._server_groups(params)
        tags = {t.get("Key", ""): t.get("Value", "") for t in indexed(params, "Tags")}
        if any(not key or key.startswith(("aliyun", "acs:")) for key in tags) or len(tags) > 20:
            raise invalid("Tags", "1..20 tags, keys not starting with aliyun or acs:.")
        group = Group(new_id("asg-"), name, low, high, desired, switches, attached, tags,
                      as_int(params, "DefaultCooldown", 300, 0, 86400), policy=self._policy(params, "release"))
        self._spot_settings(group, params)
        self._groups[group.id] = group
        return {"ScalingGroupId": group.id}

    @staticmethod
    def _policy(params: Mapping[str, str], current: str) -> str:
        policy = params.get("ScalingPolicy") or current
        if policy not in POLICIES:
            raise invalid("ScalingPolicy", "Expected release, recycle, forceRelease or forceRecycle.")
        return policy

    def _server_groups(self, params: Mapping[str, str]) -> list[dict[str, Any]]:
        attached = []
        for sg in indexed(params, "ServerGroups"):
            if (sg.get("Type") or "ALB") != "ALB":
                raise invalid("ServerGroups.N.Type", "The emulator attaches ALB server groups.")
            group_id = required(sg, "ServerGroupId")
            if group_id not in self.ecs.alb._groups:
                raise ApiError(404, "InvalidServerGroupId.NotFound", f"The ALB server group {group_id} does not exist.")
            attached.append({"ServerGroupId": group_id, "Port": as_int(sg, "Port", 0, 1, 65535) or int(
                required(sg, "Port")), "Weight": as_int(sg, "Weight", 100, 0, 100), "Type": "ALB"})
        return attached

    def _attach(self, params: dict[str, str]) -> dict[str, Any]:
        """AttachServerGroups: new (server group, port) pairs; with ForceAttach the InService instances join them."""
        group, attached = self._group(params), self._server_groups(params)
        if not attached:
            raise invalid("ServerGroups", "At least one server group.")
        known = {(sg["ServerGroupId"], sg["Port"]) for sg in group.server_groups}
        group.server_groups += [sg for sg in attached if (sg["ServerGroupId"], sg["Port"]) not in known]
        if as_bool(params, "ForceAttach"):
            for member in [m for m in group.members.values() if m.state == "InService"]:
                self.ecs._spawn(self._servers, "add", group, member.instance_id)
        return {"ScalingActivityId": ""}

    def _group_view(self, g: Group) -> dict[str, Any]:
        states = [m.state for m in g.members.values()]
        return {"ScalingGroupId": g.id, "ScalingGroupName": g.name, "RegionId": self.ecs.region,
                "LifecycleState": g.state, "MinSize": g.min, "MaxSize": g.max, "DesiredCapacity": g.desired,
                "DefaultCooldown": g.cooldown, "ActiveScalingConfigurationId": g.config_id,
                "VSwitchId": g.vswitches[0], "VSwitchIds": {"VSwitchId": list(g.vswitches)}, "VpcId": self.ecs._vpc_id,
                "ServerGroups": {"ServerGroup": [dict(s) for s in g.server_groups]}, "CreationTime": g.created,
                "TotalCapacity": len(states), "ActiveCapacity": states.count("InService"),
                "PendingCapacity": states.count("Pending"), "RemovingCapacity": states.count("Removing"),
                "RemovingWaitCapacity": states.count("Removing:Wait"), "GroupType": "ECS",
                "StoppedCapacity": states.count("Stopped"), "ScalingPolicy": g.policy,
                "RemovalPolicies": {"RemovalPolicy": ["OldestScalingConfiguration", "OldestInstance"]},
                "HealthCheckType": "ECS", **self._spot_view(g),
                "Tags": {"Tag": [{"Key": k, "Value": v} for k, v in g.tags.items()]}}

    def _describe_groups(self, params: dict[str, str]) -> dict[str, Any]:
        ids = repeated(params, "ScalingGroupIds") or repeated(params, "ScalingGroupId")
        names = repeated(params, "ScalingGroupNames") + ([params["ScalingGroupName"]]
                                                         if params.get("ScalingGroupName") else [])
        found = [self._group_view(g) for g in self._groups.values()
                 if (not ids or g.id in ids) and (not names or g.name in names)]
        items, paging = page(found, params)
        return {**paging, "ScalingGroups": {"ScalingGroup": items}}

    def _modify_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        low, high, desired = self._sizes(params, group)
        config = params.get("ActiveScalingConfigurationId", "")
        if config and getattr(self._configs.get(config), "group_id", "") != group.id:
            raise not_found("ScalingConfigurationId", config)
        group.min, group.max, group.desired = low, high, desired
        group.config_id = config or group.config_id
        group.name = params.get("ScalingGroupName") or group.name
        group.policy = self._policy(params, group.policy)
        self._spot_settings(group, params)
        self._converge(group, "ModifyScalingGroup")
        return {}

    def _enable_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        config = params.get("ActiveScalingConfigurationId") or group.config_id
        mine = [c.id for c in self._configs.values() if c.group_id == group.id]
        config = config or (mine[0] if len(mine) == 1 else "")
        if config not in mine:
            raise ApiError(400, "IncorrectScalingGroupStatus", "The scaling group has no such active configuration.")
        group.state, group.config_id = "Active", config
        self._converge(group, "EnableScalingGroup")
        return {}

    def _disable_group(self, params: dict[str, str]) -> dict[str, Any]:
        self._group(params).state = "Inactive"
        return {}

    def _delete_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        if group.members and not as_bool(params, "ForceDelete"):
            raise ApiError(400, "IncorrectScalingGroupStatus", "The scaling group has ECS instances; use ForceDelete.")
        del self._groups[group.id]
        for table in (self._configs, self._hooks, self._rules):
            for key in [k for k, v in table.items() if v.group_id == group.id]:
                del table[key]
        for member in group.members.values():
            member.state = "Removing"
            self.ecs._spawn(self._take_out, group, member, None)
        return {}

    # --- configurations -------------------------------------------------------------------------

    def _create_config(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        image, types = required(params, "ImageId"), repeated(params, "InstanceTypes")
        if len(types) > 10:
            raise invalid("InstanceTypes", "At most 10 instance types.")
        itype = types[0] if types else required(params, "InstanceType")      # with InstanceTypes, ignored
        spot = params.get("SpotStrategy") or "NoSpot"
        if spot not in SPOT_STRATEGIES:
            raise invalid("SpotStrategy", f"Expected one of {', '.join(SPOT_STRATEGIES)}.")
        name = params.get("ScalingConfigurationName") or ""
        if name and any(c.name == name and c.group_id == group.id for c in self._configs.values()):
            raise ApiError(400, "ScalingConfigurationName.Duplicate", f"The configuration name {name!r} exists.")
        try:
            tags = json.loads(params.get("Tags") or "{}")
        except ValueError:
            raise invalid("Tags", "Expected a JSON object of tags.") from None
        if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
            raise invalid("Tags", "Expected a JSON object of tags.")
        self.ecs._user_data(params)                        # base64 and size, as RunInstances checks them
        if params.get("SecurityGroupId"):
            self.ecs._group(params["SecurityGroupId"])
        config = Config(new_id("asc-"), group.id, "", image, itype, params.get("UserData", ""),
                        params.get("SecurityGroupId", ""), params.get("RamRoleName", ""),
                        params.get("InstanceName", ""), tags, instance_types=types, spot_strategy=spot)
        config.name = name or config.id
        self._configs[config.id] = config
        return {"ScalingConfigurationId": config.id}

    def _describe_configs(self, params: dict[str, str]) -> dict[str, Any]:
        ids, group_id = repeated(params, "ScalingConfigurationIds"), params.get("ScalingGroupId", "")
        names = repeated(params, "ScalingConfigurationNames")
        found = [c for c in self._configs.values() if (not ids or c.id in ids) and (not names or c.name in names)
                 and group_id in ("", c.group_id)]
        items, paging = page(found, params)
        return {**paging, "ScalingConfigurations": {"ScalingConfiguration": [
            {"ScalingConfigurationId": c.id, "ScalingConfigurationName": c.name, "ScalingGroupId": c.group_id,
             "ImageId": c.image_id, "InstanceType": c.instance_type, "UserData": c.user_data,
             "SecurityGroupId": c.security_group, "RamRoleName": c.ram_role, "InstanceName": c.instance_name,
             "CreationTime": c.created, "Tags": {"Tag": [{"Key": k, "Value": v} for k, v in c.tags.items()]},
             "InstanceTypes": {"InstanceType": list(c.instance_types)}, "SpotStrategy": c.spot_strategy,
             "LifecycleState": "Active" if self._groups[c.group_id].config_id == c.id else "Inactive"}
            for c in items]}}

    def _delete_config(self, params: dict[str, str]) -> dict[str, Any]:
        config_id = required(params, "ScalingConfigurationId")
        config = self._configs.get(config_id)
        if config is None:
            raise not_found("ScalingConfigurationId", config_id)
        if self._groups[config.group_id].config_id == config_id:
            raise ApiError(400, "IncorrectScalingConfigurationStatus", "The configuration is the active one.")
        del self._configs[config_id]
        return {}

    # --- instances -------------------------------------------------------------------------------

    def _describe_instances(self, params: dict[str, str]) -> dict[str, Any]:
        groups = [self._group(params)] if params.get("ScalingGroupId") else list(self._groups.values())
        ids = repeated(params, "InstanceIds") or repeated(params, "InstanceId")
        found = []
        for g in groups:
            for m in g.members.values():
                inst = self.ecs._instances.get(m.instance_id)
                health = "Healthy" if inst is not None and inst.status in ("Pending", "Starting", "Running") \
                    else "Unhealthy"
                view = {"InstanceId": m.instance_id, "ScalingGroupId": g.id, "ScalingConfigurationId": m.config_id,
                        "LifecycleState": m.state, "HealthStatus": health, "CreationType": "AutoCreated",
                        "CreationTime": m.creation_time, "ZoneId": m.zone, "LoadBalancerWeight": 100,
                        "SpotStrategy": m.spot_strategy}
                if (not ids or m.instance_id in ids) and all(params.get(k, view[k]) == view[k]
                                                             for k in ("LifecycleState", "HealthStatus")):
                    found.append(view)
        items, paging = page(found, params)
        return {**paging, "ScalingInstances": {"ScalingInstance": items},
                "TotalSpotCount": sum(v["SpotStrategy"] != "NoSpot" for v in found)}

    # --- lifecycle hooks ---------------------------------------------------------------------------

    def _hook(self, params: Mapping[str, str]) -> Hook:
        hook_id = required(params, "LifecycleHookId")
        if hook_id not in self._hooks:
            raise not_found("LifecycleHookId", hook_id)
        return self._hooks[hook_id]

    @staticmethod
    def _hook_settings(params: Mapping[str, str], hook: Hook | None) -> tuple[str, int, str]:
        transition = params.get("LifecycleTransition") or (hook.transition if hook else "")
        if transition not in ("SCALE_OUT", "SCALE_IN"):
            raise invalid("LifecycleTransition", "Expected SCALE_OUT or SCALE_IN.")
        result = params.get("DefaultResult") or (hook.default_result if hook else "CONTINUE")
        if result not in ("CONTINUE", "ABANDON"):
            raise invalid("DefaultResult", "Expected CONTINUE or ABANDON.")
        return transition, as_int(params, "HeartbeatTimeout", hook.timeout if hook else 600, 30, 21600), result

    def _create_hook(self, params: dict[str, str]) -> dict[str, Any]:
        group, name = self._group(params), params.get("LifecycleHookName") or new_id("ash-")
        if any(h.group_id == group.id and h.name == name for h in self._hooks.values()):
            raise ApiError(400, "LifecycleHookName.Duplicate", f"The lifecycle hook name {name!r} exists.")
        hook = Hook(new_id("ash-"), group.id, name, *self._hook_settings(params, None))
        self._hooks[hook.id] = hook
        return {"LifecycleHookId": hook.id}

    def _describe_hooks(self, params: dict[str, str]) -> dict[str, Any]:
        ids, group_id = repeated(params, "LifecycleHookIds"), params.get("ScalingGroupId", "")
        found = [h for h in self._hooks.values() if (not ids or h.id in ids) and group_id in ("", h.group_id)
                 and params.get("LifecycleHookName", h.name) == h.name]
        items, paging = page(found, params)
        return {**paging, "LifecycleHooks": {"LifecycleHook": [
            {"LifecycleHookId": h.id, "ScalingGroupId": h.group_id, "LifecycleHookName": h.name,
             "LifecycleTransition": h.transition, "HeartbeatTimeout": h.timeout, "DefaultResult": h.default_result,
             "LifecycleHookStatus": "Active"} for h in items]}}

    def _modify_hook(self, params: dict[str, str]) -> dict[str, Any]:
        hook = self._hook(params)
        hook.transition, hook.timeout, hook.default_result = self._hook_settings(params, hook)
        return {}

    def _delete_hook(self, params: dict[str, str]) -> dict[str, Any]:
        del self._hooks[self._hook(params).id]
        return {}

    def _complete(self, params: dict[str, str]) -> dict[str, Any]:
        hook, token = self._hook(params), required(params, "LifecycleActionToken")
        result = params.get("LifecycleActionResult") or "CONTINUE"
        if result not in ("CONTINUE", "ABANDON"):
            raise invalid("LifecycleActionResult", "The emulator takes CONTINUE or ABANDON.")
        action = self._actions.get(token)
        if action is None or action.hook_id != hook.id or action.status != "Pending":
            raise ApiError(404, "LifecycleActionToken.NotFound", "No pending lifecycle action has this token.")
        action.status, action.result = "Completed", result
        return {}

    def _describe_actions(self, params: dict[str, str]) -> dict[str, Any]:
        activity = required(params, "ScalingActivityId")
        status = params.get("LifecycleActionStatus", "")
        found = [{"LifecycleHookId": a.hook_id, "LifecycleActionToken": a.token, "LifecycleActionStatus": a.status,
                  "LifecycleActionResult": a.result, "InstanceIds": {"InstanceId": [a.instance_id]}}
                 for a in self._actions.values() if a.activity_id == activity and status in ("", a.status)]
        size, start = as_int(params, "MaxResults", 10, 1, 50), int(params.get("NextToken") or 0)
        end = start + size
        return {"LifecycleActions": {"LifecycleAction": found[start:end]}, "TotalCount": len(found),
                "MaxResults": size, "NextToken": str(end) if end < len(found) else ""}

    def _describe_activities(self, params: dict[str, str]) -> dict[str, Any]:
        group_id = self._group(params).id if params.get("ScalingGroupId") else ""
        ids, status = repeated(params, "ScalingActivityIds"), params.get("StatusCode", "")
        found = [a for a in reversed(self._activities.values()) if group_id in ("", a.group_id)
                 and (not ids or a.id in ids) and status in ("", a.status)]
        items, paging = page(found, params)
        return {**paging, "ScalingActivities": {"ScalingActivity": [
            {"ScalingActivityId": a.id, "ScalingGroupId": a.group_id, "Description": a.description,
             "Cause": a.cause, "StartTime": a.started, "EndTime": a.ended, "StatusCode": a.status,
             "StatusMessage": a.message, "Progress": 100 * a.done // max(1, a.total),
             "TotalCapacity": str(a.total), "ScalingInstanceNumber": len(a.instances)} for a in items]}}

    # --- rules and the target-tracking controller -----------------------------------------------------

    def _rule(self, params: Mapping[str, str]) -> Rule:
        rule_id = required(params, "ScalingRuleId")
        if rule_id not in self._rules:
            raise not_found("ScalingRuleId", rule_id)
        return self._rules[rule_id]

    def _create_rule(self, params: dict[str, str]) -> dict[str, Any]:
        group, name = self._group(params), params.get("ScalingRuleName") or new_id("asr-")
        kind = params.get("ScalingRuleType") or "SimpleScalingRule"
        if kind not in ("SimpleScalingRule", "TargetTrackingScalingRule", "StepScalingRule"):
            raise invalid("ScalingRuleType", "Expected SimpleScalingRule, TargetTrackingScalingRule or "
                                             "StepScalingRule.")
        if any(r.group_id == group.id and r.name == name for r in self._rules.values()):
            raise ApiError(400, "ScalingRuleName.Duplicate", f"The scaling rule name {name!r} exists.")
        rule = Rule(new_id("asr-"), group.id, name, kind, "", 0.0, False,
                    (params.get("AdjustmentType", ""), as_int(params, "AdjustmentValue", 0, -1000, 1000)))
        self._tracking(rule, params)
        self._rules[rule.id] = rule
        return {"ScalingRuleId": rule.id,
                "ScalingRuleAri": f"ari:acs:ess:{self.ecs.region}:1:scalingrule/{rule.id}"}

    def _tracking(self, rule: Rule, params: Mapping[str, str]) -> None:
        simple_settings(rule, params)
        rule.metric = params.get("MetricName", rule.metric)
        rule.disable_scale_in = as_bool(params, "DisableScaleIn", rule.disable_scale_in)
        if params.get("TargetValue"):
            try:
                rule.target = float(params["TargetValue"])
            except ValueError:
                raise invalid("TargetValue", "Expected a number.") from None
        if rule.type == "TargetTrackingScalingRule":
            if not rule.metric or rule.target <= 0:
                raise invalid("MetricName" if not rule.metric else "TargetValue",
                              "A target tracking rule needs a MetricName and a positive TargetValue.")
            self._start_controller()

    def _describe_rules(self, params: dict[str, str]) -> dict[str, Any]:
        ids, names = repeated(params, "ScalingRuleIds"), repeated(params, "ScalingRuleNames")
        group_id = params.get("ScalingGroupId", "")
        found = [r for r in self._rules.values() if group_id in ("", r.group_id) and (not ids or r.id in ids)
                 and (not names or r.name in names) and params.get("ScalingRuleType", r.type) == r.type]
        items, paging = page(found, params)
        return {**paging, "ScalingRules": {"ScalingRule": [
            {"ScalingRuleId": r.id, "ScalingGroupId": r.group_id, "ScalingRuleName": r.name,
             "ScalingRuleType": r.type, "MetricName": r.metric, "TargetValue": r.target,
             "DisableScaleIn": r.disable_scale_in, "AdjustmentType": r.adjustment[0],
             "AdjustmentValue": r.adjustment[1], "ScalingRuleAri": f"ari:acs:ess:{self.ecs.region}:1:scalingrule/"
                                                                   f"{r.id}"} for r in items]}}

    def _modify_rule(self, params: dict[str, str]) -> dict[str, Any]:
        rule = self._rule(params)
        self._tracking(rule, params)
        return {}

    def _delete_rule(self, params: dict[str, str]) -> dict[str, Any]:
        del self._rules[self._rule(params).id]
        return {}

    def _list_tags(self, params: dict[str, str]) -> dict[str, Any]:
        if (params.get("ResourceType") or "scalinggroup") != "scalinggroup":
            raise invalid("ResourceType", "The emulator tags scaling groups.")
        ids, wanted = repeated(params, "ResourceIds"), indexed(params, "Tags")
        groups = [g for g in self._groups.values() if (not ids or g.id in ids) and all(
            w.get("Key") in g.tags and w.get("Value", g.tags[w["Key"]]) == g.tags[w["Key"]] for w in wanted)]
        return {"NextToken": "", "TagResources": {"TagResource": [
            {"ResourceId": g.id, "ResourceType": "scalinggroup", "TagKey": k, "TagValue": v, "Propagate": False}
            for g in groups for k, v in g.tags.items()]}}

