"""A service's replicas as an Alibaba Cloud Auto Scaling (ESS 2022-02-22) group: configuration, group, drain hook,
target tracking (CommonRequest through clouds/aliyun.py's Api; no ESS SDK needed).

Why the cloud's own scaling engine (issue 22): a group keeps its size and follows its rule while the user's
laptop is closed; ngcx only describes it. The twin of aws/asg.py (EC2 Auto Scaling), the same shape and
rules; used by services' --min/--max through vm_groups.py (the `kit` at the end of this module).

What ensure_group makes, found by name before anything is created (a name in use under another owner, by
the group's ngcx:owner tag, is refused), so a retry after a lost answer or a killed ngcx makes no duplicate:
- the scaling group, named spec.name and tagged spec.tags (ngcx:owner, ngcx:service): over spec.vswitches
  (one per zone), attached to the service's ALB server group on spec.port (ServerGroups, Type ALB),
  min/max/desired. A group that exists keeps its desired capacity (its rule owns it), takes the new min/max,
  and is attached to the server group when it is not yet.
- a scaling configuration: the baked host image, instance type, user-data (the host's boot script), RAM
  role (registry pulls, never a token in user-data), security group, the tags on the instances. When image,
  user-data, type, role or group changed, a *new* configuration (or one of the group's that already says so)
  becomes the group's active one; instances already running keep theirs until they are replaced (rolling
  them is service.py's). Old configurations stay (ESS keeps at most 10 per group: not pruned here yet).
- a SCALE_IN lifecycle hook (HOOK, CONTINUE by default): scale-in waits in Removing:Wait after ESS took the
  instance out of the server group (ALB drains it), so nothing in flight fails; complete_lifecycle ends the
  wait early once the host is idle, else the hook's heartbeat timeout (spec.drain_wait_s) does.
- the group is enabled with that configuration (a new ESS group is Inactive and launches nothing).
Creates carry ClientTokens that are digests of their parameters; a token whose first answer names something
deleted since (a service deleted, then made again) makes way for the next of a fixed sequence, as in
alb.py. CreateScalingRule has no ClientToken in either ESS version's model (issue 47), so a rule is found by
name first and created once, not retried blind. Target tracking (put_target_tracking) is one
TargetTrackingScalingRule per group on a Metric: ESS_QPS, the documented LoadBalancerRealServerAverageQps
(QPS per backend server) with the AlarmDimensions `rulePool` = the ALB server group (ESS 2022-02-22
CreateScalingRule, AlarmDimensions: "if you use LoadBalancerRealServerAverageQps as your predefined metric,
you must use this parameter to specify the rulePool dimension"), or a custom CloudMonitor metric.

Spot (issue 49 item 3, spec.spot): the group is COST_OPTIMIZED with OnDemandBaseCapacity = spec.on_demand_base,
OnDemandPercentageAboveBaseCapacity 0, CompensateWithOnDemand and SpotInstanceRemedy (a host ECS is about to
reclaim is replaced, and leaves the server group through the drain, before it goes), its configuration
SpotAsPriceGo over spec.instance_types (InstanceTypes.N, in the offers table's order); each Member says its
market from DescribeScalingInstances' SpotStrategy. Rolling a group to a new spec: ess_refresh.py.

Scale to zero (issue 22 item 2): set_idle_stop puts the group in recycle mode (ESS "economical mode",
ModifyScalingGroup ScalingPolicy recycle; release is the default): a scale-in stops its instances
(StopCharging, the disk kept) and they stay in the group as `Stopped`; a scale-out starts them first, so a
wake is a boot, not a new machine. put_wake makes the wake path: a SimpleScalingRule `<group>-wake`
(QuantityChangeInCapacity +1) and an alarm task `<group>-wake` (CreateAlarm) that runs it while the service's
ALB answers 503s of its own (no replica up): WAKE_METRIC, CloudMonitor's acs_alb LoadBalancerHTTPCode503
(Count/s, Dimensions loadBalancerId), Average > 0 over one 60 s period; spellings AlarmActions.N / Dimensions.N.*
(ESS 2022-02-22 CreateAlarm). Not documented: ESS's CreateAlarm lists its system metrics and that ALB metric is
not among them (none of them sees requests while no replica runs); cli/clouds/ALIYUN_API_NOTES.md keeps it as
an open case. Alarm tasks
outlive DeleteScalingGroup (the reference says so), so delete removes the group's alarm tasks first.

Calls go through cli/clouds/aliyun.py's Api (ngcx's own retries: reads and settings that are safe to repeat
always, creates only with their token; errors one line with the code and the action, never a secret); what
is already gone counts as done. "Real parts only": tests run this with the real aliyun-python-sdk-core
against tests/emulators (aliyun_ecs + aliyun_alb + aliyun_ess: instances that run the user-data, a haproxy
data plane that the rule's request counts come from), nothing mocked.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...clouds.aliyun import AliyunError
from ...core.errors import UserError
from .ess_refresh import Refreshes

if TYPE_CHECKING:
    from ...clouds.aliyun import Api
    from ..balancer import BalancerRef

HOOK = "ngcx-drain"
OWNER_TAG = "ngcx:owner"
ESS_QPS = "LoadBalancerRealServerAverageQps"   # documented; needs AlarmDimensions rulePool (module docstring)
QPS_DIMENSION = "rulePool"                     # its dimension: the ALB server group id
PAGE_SIZE = 50                         # ESS's largest page
TOKEN_TRIES = 8                        # generations of one spec.name (made, deleted, made again)
GONE = "InvalidScalingGroupId.NotFound"
UNTOKENED = frozenset({"CreateScalingRule"})   # no ClientToken in ESS 2014-08-28's nor 2022-02-22's model
ALARM_GONE = "InvalidAlarmTaskId.NotFound"
RULE_GONE = "InvalidScalingRuleId.NotFound"
WAKE_METRIC = "LoadBalancerHTTPCode503"   # the ALB's own 503s (a guess as an alarm task's metric, see above)


@dataclass(frozen=True)
class GroupSpec:
    """One service's scaling group: what its hosts boot and where, how many, behind which ALB server group."""

    name: str                          # ngcx-svc-<service id>: the group's and its configurations' name
    image_id: str                      # the baked host image
    user_data: str                     # the host's boot script (vm.host_script)
    instance_type: str
    vswitches: tuple[str, ...]         # one per zone
    server_group_id: str               # the service's ALB server group
    port: int                          # the replicas' port in it
    min_size: int
    max_size: int
    desired: int
    tags: dict[str, str] = field(default_factory=dict)
    ram_role: str | None = None
    security_group: str | None = None
    weight: int = 100
    drain_wait_s: int = 300            # the SCALE_IN hook's heartbeat timeout (ESS: 30..21600)
    spot: bool = False                 # SpotAsPriceGo hosts above an on-demand floor (_capacity, _config_data)
    on_demand_base: int = 0            # that floor: OnDemandBaseCapacity
    instance_types: tuple[str, ...] = ()   # InstanceTypes.N in priority order; () is instance_type alone


@dataclass(frozen=True)
class GroupRef:
    """What a record keeps to find the group again (names and ids; nothing secret)."""

    name: str
    group_id: str
    config_id: str                     # the scaling configuration the group launches


@dataclass(frozen=True)
class Metric:
    """A target-tracking metric: ESS_QPS of an ALB server group (its rulePool dimension) or a custom metric's name."""

    name: str = ESS_QPS
    server_group_id: str = ""


@dataclass(frozen=True)
class Member:
    instance_id: str
    zone: str
    state: str                         # Pending, InService, Removing:Wait, Removing, ...
    health: str                        # Healthy / Unhealthy
    market: str = "on-demand"          # "spot" or "on-demand", from the instance's SpotStrategy


def _check_sizes(name: str, low: int, high: int, desired: int) -> None:
    if not 0 <= low <= desired <= high:
        raise UserError(f"group {name}: need 0 <= min ({low}) <= desired ({desired}) <= max ({high})")


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ScalingGroups(Refreshes):
    """ensure_group / set_size / put_target_tracking / instances / complete_lifecycle / delete / tagged, and
    (ess_refresh.py) start_refresh / refresh_state / cancel_refresh."""

    def __init__(self, api: Api) -> None:
        self.api = api

    @staticmethod
    def _capacity_of(spec: GroupSpec) -> dict[str, Any]:
        return _capacity(spec, reset=True)

    @staticmethod
    def _token(*parts: Any) -> str:
        return _digest(*parts)

    # --- ensure ------------------------------------------------------------------------------------

    def ensure_group(self, spec: GroupSpec) -> GroupRef:
        _check_sizes(spec.name, spec.min_size, spec.max_size, spec.desired)
        group = self._find(spec.name)
        if group is None:
            params = {"ScalingGroupName": spec.name, "MinSize": spec.min_size, "MaxSize": spec.max_size,
                      "DesiredCapacity": spec.desired, **{f"VSwitchIds.{n}": v for n, v in
                                                          enumerate(spec.vswitches, 1)},
                      **_server_group(spec), **_capacity(spec), **{f"Tags.{n}.{k}": v for n, (key, value) in
                                                                  enumerate(sorted(spec.tags.items()), 1)
                                                                  for k, v in (("Key", key), ("Value", value))}}
            try:
                group_id = self._create("CreateScalingGroup", params, "ScalingGroupId", self._group_exists)
            except AliyunError as exc:            # made meanwhile by another ngcx: it is the one found next
                if exc.code != "ScalingGroupName.Duplicate":
                    raise
            group = self._find(spec.name)
            if group is None:
                raise UserError(f"scaling group {spec.name} was made but is not found", hint="run it again")
        else:
            self._check_owner(spec, group)
        group_id = str(group["ScalingGroupId"])
        config_id = self._configuration(spec, group_id)
        self._attach(spec, group)
        if not _same_capacity(group, spec):
            self._set("ModifyScalingGroup", ScalingGroupId=group_id, **_capacity(spec, reset=True))
        if (group.get("ActiveScalingConfigurationId"), group.get("MinSize"), group.get("MaxSize")) != (
                config_id, spec.min_size, spec.max_size) and group.get("LifecycleState") == "Active":
            self._set("ModifyScalingGroup", ScalingGroupId=group_id, ActiveScalingConfigurationId=config_id,
                      MinSize=spec.min_size, MaxSize=spec.max_size)
        self._hook(spec, group_id)
        if group.get("LifecycleState") != "Active":       # last: the hook is there before anything launches
            self._set("ModifyScalingGroup", ScalingGroupId=group_id, MinSize=spec.min_size, MaxSize=spec.max_size)
            self._set("EnableScalingGroup", ScalingGroupId=group_id, ActiveScalingConfigurationId=config_id)
        return GroupRef(spec.name, group_id, config_id)

    def _configuration(self, spec: GroupSpec, group_id: str) -> str:
        """The group's configuration that says what spec says (made when none does)."""
        wanted = _config_data(spec)
        found = self._all("DescribeScalingConfigurations", "ScalingConfigurations", "ScalingConfiguration",
                          ScalingGroupId=group_id)
        same = [c for c in found if _same_config(c, wanted)]
        same.sort(key=lambda c: c.get("LifecycleState") != "Active")        # the active one first
        if same:
            return str(same[0]["ScalingConfigurationId"])
        params = {"ScalingGroupId": group_id, "ScalingConfigurationName": f"{spec.name}-{_digest(wanted)[:8]}",
                  **wanted}
        return self._create("CreateScalingConfiguration", params, "ScalingConfigurationId",
                            lambda config_id: bool(self._all("DescribeScalingConfigurations", "ScalingConfigurations",
                                                             "ScalingConfiguration",
                                                             **{"ScalingConfigurationIds.1": config_id})))

    def _attach(self, spec: GroupSpec, group: dict[str, Any]) -> None:
        attached = {(s.get("ServerGroupId"), int(s.get("Port") or 0))
                    for s in (group.get("ServerGroups") or {}).get("ServerGroup") or []}
        if (spec.server_group_id, spec.port) not in attached:
            self._set("AttachServerGroups", ScalingGroupId=group["ScalingGroupId"], ForceAttach=True,
                      **_server_group(spec))

    def _hook(self, spec: GroupSpec, group_id: str) -> None:
        hooks = self._all("DescribeLifecycleHooks", "LifecycleHooks", "LifecycleHook", ScalingGroupId=group_id,
                          LifecycleHookName=HOOK)
        if not hooks:
            try:
                self.api.ess("CreateLifecycleHook", {
                    "ScalingGroupId": group_id, "LifecycleHookName": HOOK, "LifecycleTransition": "SCALE_IN",
                    "HeartbeatTimeout": spec.drain_wait_s, "DefaultResult": "CONTINUE"}, write=True)
            except AliyunError as exc:            # a second ngcx made it meanwhile
                if exc.code != "LifecycleHookName.Duplicate":
                    raise
        elif int(hooks[0].get("HeartbeatTimeout") or 0) != spec.drain_wait_s:
            self._set("ModifyLifecycleHook", LifecycleHookId=hooks[0]["LifecycleHookId"],
                      HeartbeatTimeout=spec.drain_wait_s)

    def _find(self, name: str) -> dict[str, Any] | None:
        found = self._all("DescribeScalingGroups", "ScalingGroups", "ScalingGroup", ScalingGroupName=name)
        found = [g for g in found if g.get("ScalingGroupName") == name]
        return found[0] if found else None

    def _group_exists(self, group_id: str) -> bool:
        return bool(self._all("DescribeScalingGroups", "ScalingGroups", "ScalingGroup",
                              **{"ScalingGroupIds.1": group_id}))

    def _check_owner(self, spec: GroupSpec, group: dict[str, Any]) -> None:
        owner = spec.tags.get(OWNER_TAG)
        if not owner:
            return
        tags = self._tags_of([str(group["ScalingGroupId"])]).get(str(group["ScalingGroupId"]), {})
        if tags.get(OWNER_TAG) != owner:
            raise UserError(f"scaling group {spec.name} exists but is not this owner's (tag {OWNER_TAG}="
                            f"{tags.get(OWNER_TAG)!r})", hint="choose another service name or delete that group")

    def _create(self, action: str, params: dict[str, Any], id_key: str, exists: Any) -> str:
        """Create with the ClientTokens of a fixed sequence: one whose first answer is gone makes way for the next.
        An action whose model has no ClientToken (CreateScalingRule) is sent once, unretried: the caller found
        nothing by name just before."""
        if action in UNTOKENED:
            return str(self.api.ess(action, params, write=True)[id_key])
        digest = _digest(action, params)
        for n in range(TOKEN_TRIES):
            new_id = str(self.api.ess(action, params, token=f"ngcx-{digest}-{n}", write=True)[id_key])
            if exists(new_id):
                return new_id
        raise UserError(f"ESS {action} kept answering resources that are gone ({TOKEN_TRIES} client tokens)")

    # --- size, rule, members --------------------------------------------------------------------------

    def set_size(self, ref: GroupRef, min_size: int, max_size: int, desired: int) -> None:
        _check_sizes(ref.name, min_size, max_size, desired)
        self._set("ModifyScalingGroup", ScalingGroupId=ref.group_id, MinSize=min_size, MaxSize=max_size,
                  DesiredCapacity=desired)

    def put_target_tracking(self, ref: GroupRef, target_value: float, metric: Metric | None = None,
                            disable_scale_in: bool = False) -> str:
        """The group's one target-tracking rule (made, or changed in place); its id."""
        metric = metric or Metric()
        if not metric.name or target_value <= 0:
            raise UserError("a target-tracking rule needs a metric name and a positive target value")
        name = f"{ref.name}-track"
        settings: dict[str, Any] = {"MetricName": metric.name, "TargetValue": float(target_value),
                                    "DisableScaleIn": disable_scale_in}
        if metric.name == ESS_QPS and metric.server_group_id:
            settings |= {"AlarmDimensions.1.DimensionKey": QPS_DIMENSION,
                         "AlarmDimensions.1.DimensionValue": metric.server_group_id}
        found = self._all("DescribeScalingRules", "ScalingRules", "ScalingRule", ScalingGroupId=ref.group_id,
                          **{"ScalingRuleNames.1": name})
        if found:
            self._set("ModifyScalingRule", ScalingRuleId=found[0]["ScalingRuleId"], **settings)
            return str(found[0]["ScalingRuleId"])
        params = {"ScalingGroupId": ref.group_id, "ScalingRuleName": name,
                  "ScalingRuleType": "TargetTrackingScalingRule", **settings}
        return self._create("CreateScalingRule", params, "ScalingRuleId", lambda rule_id: bool(self._all(
            "DescribeScalingRules", "ScalingRules", "ScalingRule", **{"ScalingRuleIds.1": rule_id})))

    # --- scale to zero ---------------------------------------------------------------------------------

    def set_idle_stop(self, ref: GroupRef, on: bool) -> None:
        """Recycle mode on (ScalingPolicy recycle: scaled-in instances are stopped and started again first) or
        off (release: scaled-in instances are released; Stopped ones stay until a scale-out starts them)."""
        self._set("ModifyScalingGroup", ScalingGroupId=ref.group_id, ScalingPolicy="recycle" if on else "release")

    def put_wake(self, ref: GroupRef, balancer: BalancerRef | None, on: bool) -> None:
        """On: the rule and alarm task `<group>-wake` that add one instance while the balancer answers 503s
        itself (found by name first; one of each). Off: both deleted; absent is done."""
        name = f"{ref.name}-wake"
        alarms = [a for a in self._alarms(ref.group_id) if a.get("Name") == name]
        rules = self._all("DescribeScalingRules", "ScalingRules", "ScalingRule", ScalingGroupId=ref.group_id,
                          **{"ScalingRuleNames.1": name})
        if not on or balancer is None:
            if on:
                raise UserError(f"group {ref.name}: waking from zero needs the service's balancer")
            for alarm in alarms:
                self._gone("DeleteAlarm", ALARM_GONE, AlarmTaskId=alarm["AlarmTaskId"])
            for rule in rules:
                self._gone("DeleteScalingRule", RULE_GONE, ScalingRuleId=rule["ScalingRuleId"])
            return
        wanted = _wake_alarm(self._wake_rule(ref, name, rules), balancer)
        same = [a for a in alarms if _same_alarm(a, wanted)][:1]
        for alarm in alarms:
            if alarm not in same:                 # changed settings, or a second one of a race
                self._gone("DeleteAlarm", ALARM_GONE, AlarmTaskId=alarm["AlarmTaskId"])
        if not same:
            self.api.ess("CreateAlarm", {"ScalingGroupId": ref.group_id, "Name": name, **wanted}, write=True)
        elif str(same[0].get("Enable", True)).lower() == "false":
            self._set("EnableAlarm", AlarmTaskId=same[0]["AlarmTaskId"])

    def _wake_rule(self, ref: GroupRef, name: str, rules: list[dict[str, Any]]) -> str:
        """The wake rule's ScalingRuleAri (made, or set back to +1)."""
        settings = {"AdjustmentType": "QuantityChangeInCapacity", "AdjustmentValue": 1}
        if rules:
            if (rules[0].get("AdjustmentType"), int(rules[0].get("AdjustmentValue") or 0)) != tuple(settings.values()):
                self._set("ModifyScalingRule", ScalingRuleId=rules[0]["ScalingRuleId"], **settings)
            return str(rules[0]["ScalingRuleAri"])
        params = {"ScalingGroupId": ref.group_id, "ScalingRuleName": name, "ScalingRuleType": "SimpleScalingRule",
                  **settings}
        rule_id = self._create("CreateScalingRule", params, "ScalingRuleId", lambda made: bool(self._rules_by_id(made)))
        return str(self._rules_by_id(rule_id)[0]["ScalingRuleAri"])

    def _rules_by_id(self, rule_id: str) -> list[dict[str, Any]]:
        return self._all("DescribeScalingRules", "ScalingRules", "ScalingRule", **{"ScalingRuleIds.1": rule_id})

    def _alarms(self, group_id: str) -> list[dict[str, Any]]:
        return self._all("DescribeAlarms", "AlarmList", "Alarm", ScalingGroupId=group_id)

    def _gone(self, action: str, code: str, **params: Any) -> None:
        """A delete; what is already gone (`code`) is done."""
        try:
            self._set(action, **params)
        except AliyunError as exc:
            if exc.code != code:
                raise

    def sizes(self, ref: GroupRef) -> tuple[int, int, int] | None:
        """(min, max, desired) as the group has them now; None: no such group."""
        group = self._find(ref.name)
        if group is None:
            return None
        return int(group.get("MinSize") or 0), int(group.get("MaxSize") or 0), int(group.get("DesiredCapacity") or 0)

    def instances(self, ref: GroupRef) -> list[Member]:
        rows = self._all("DescribeScalingInstances", "ScalingInstances", "ScalingInstance", ScalingGroupId=ref.group_id)
        return [Member(r["InstanceId"], r.get("ZoneId", ""), r.get("LifecycleState", ""), r.get("HealthStatus", ""),
                       "on-demand" if (r.get("SpotStrategy") or "NoSpot") == "NoSpot" else "spot") for r in rows]

    def complete_lifecycle(self, ref: GroupRef, instance_id: str) -> None:
        """End the instance's Removing:Wait now (its host is idle); no wait left is done, not an error. The token
        comes from DescribeLifecycleActions of the group's activities in progress."""
        hooks = self._all("DescribeLifecycleHooks", "LifecycleHooks", "LifecycleHook", ScalingGroupId=ref.group_id,
                          LifecycleHookName=HOOK)
        if not hooks:
            return
        hook_id = hooks[0]["LifecycleHookId"]
        for activity in self._all("DescribeScalingActivities", "ScalingActivities", "ScalingActivity",
                                  ScalingGroupId=ref.group_id, StatusCode="InProgress"):
            actions = self.api.ess("DescribeLifecycleActions", {
                "ScalingActivityId": activity["ScalingActivityId"], "LifecycleActionStatus": "Pending",
                "MaxResults": 50}).get("LifecycleActions", {}).get("LifecycleAction") or []
            for action in actions:
                if action.get("LifecycleHookId") == hook_id and instance_id in (action.get("InstanceIds") or {}).get(
                        "InstanceId", []):
                    try:
                        self.api.ess("CompleteLifecycleAction", {
                            "LifecycleHookId": hook_id, "LifecycleActionToken": action["LifecycleActionToken"],
                            "LifecycleActionResult": "CONTINUE"}, token=_digest(action["LifecycleActionToken"]),
                            write=True)
                    except AliyunError as exc:    # timed out or completed meanwhile: done
                        if exc.code != "LifecycleActionToken.NotFound":
                            raise

    # --- delete, gc --------------------------------------------------------------------------------------

    def delete(self, ref: GroupRef) -> None:
        """The group's alarm tasks, then the group with ForceDelete: its instances (Stopped ones too) leave the
        server group and are released, its configurations, rules and hooks go with it. Already gone is done."""
        group_id = ref.group_id or str((self._find(ref.name) or {}).get("ScalingGroupId") or "")
        if not group_id:
            return
        for alarm in self._alarms(group_id):      # alarm tasks outlive DeleteScalingGroup
            self._gone("DeleteAlarm", ALARM_GONE, AlarmTaskId=alarm["AlarmTaskId"])
        try:
            self._set("DeleteScalingGroup", ScalingGroupId=group_id, ForceDelete=True)
        except AliyunError as exc:
            if exc.code != GONE:
                raise

    def tagged(self, tags: dict[str, str]) -> list[GroupRef]:
        """Every scaling group carrying all of `tags` (gc: what a killed ngcx left)."""
        wanted = self._tags_of([], tags)
        ids = sorted(i for i, have in wanted.items() if all(have.get(k) == v for k, v in tags.items()))
        found = []
        for start in range(0, len(ids), 20):
            batch = {f"ScalingGroupIds.{n}": i for n, i in enumerate(ids[start:start + 20], 1)}
            found += [GroupRef(g["ScalingGroupName"], g["ScalingGroupId"], g.get("ActiveScalingConfigurationId") or "")
                      for g in self._all("DescribeScalingGroups", "ScalingGroups", "ScalingGroup", **batch)]
        return sorted(found, key=lambda ref: ref.name)

    # --- calls ---------------------------------------------------------------------------------------

    def _set(self, action: str, **params: Any) -> dict[str, Any]:
        """A call that sets absolute values or deletes: safe to repeat, so retried as a read."""
        return self.api.ess(action, params)

    def _all(self, action: str, key: str, item: str, **params: Any) -> list[dict[str, Any]]:
        """Every item of a PageNumber/PageSize listing."""
        found: list[dict[str, Any]] = []
        number = 1
        while True:
            answer = self.api.ess(action, {**params, "PageNumber": number, "PageSize": PAGE_SIZE})
            items = (answer.get(key) or {}).get(item) or []
            found += items
            if len(items) < PAGE_SIZE or len(found) >= int(answer.get("TotalCount") or 0):
                return found
            number += 1

    def _tags_of(self, ids: list[str], tags: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
        """Scaling group id -> its tags, from ListTagResources (by ids, or by tags)."""
        params: dict[str, Any] = {"ResourceType": "scalinggroup", **{f"ResourceIds.{n}": i for n, i in
                                                                     enumerate(ids, 1)}}
        for n, (key, value) in enumerate(sorted((tags or {}).items()), 1):
            params[f"Tags.{n}.Key"], params[f"Tags.{n}.Value"] = key, value
        found: dict[str, dict[str, str]] = {}
        token = ""
        while True:
            answer = self.api.ess("ListTagResources", {**params, **({"NextToken": token} if token else {})})
            for row in (answer.get("TagResources") or {}).get("TagResource") or []:
                found.setdefault(str(row["ResourceId"]), {})[str(row["TagKey"])] = str(row.get("TagValue", ""))
            token = str(answer.get("NextToken") or "")
            if not token:
                return found


# --- the kit vm_groups.py drives --------------------------------------------------------------------------
STATES = {"Pending": "pending", "Pending:Wait": "pending", "InService": "in-service", "Removing": "leaving",
          "Removing:Wait": "leaving", "Standby": "leaving", "Protected": "in-service", "Stopped": "stopped"}


def kit(api: Api) -> Any:
    """vm_groups.GroupKit over this module: the ALB server group on the replicas' port, and QPS per backend
    server (ESS_QPS, per second) from --target-requests (per minute, as on AWS) / 60."""
    from ..common import SERVE_PORT
    from ..vm_groups import GroupKit

    def spec(*, networks: tuple[str, ...], balancer: BalancerRef, role: str | None, **common: Any) -> GroupSpec:
        return GroupSpec(vswitches=networks, server_group_id=balancer.group_id, port=SERVE_PORT, ram_role=role,
                         **common)

    def metric(balancer: BalancerRef, per_minute: float) -> tuple[float, Metric]:
        return per_minute / 60.0, Metric(ESS_QPS, balancer.group_id)

    return GroupKit(ScalingGroups(api), GroupRef, spec, metric, STATES)


def _server_group(spec: GroupSpec) -> dict[str, Any]:
    return {"ServerGroups.1.ServerGroupId": spec.server_group_id, "ServerGroups.1.Port": spec.port,
            "ServerGroups.1.Weight": spec.weight, "ServerGroups.1.Type": "ALB"}


def _wake_alarm(rule_ari: str, balancer: BalancerRef) -> dict[str, Any]:
    """CreateAlarm's settings for the wake: any 503 of the balancer's own in a minute runs the rule."""
    return {"MetricType": "system", "MetricName": WAKE_METRIC, "Statistics": "Average", "ComparisonOperator": ">",
            "Threshold": 0, "EvaluationCount": 1, "Period": 60, "AlarmActions.1": rule_ari,
            "Dimensions.1.DimensionKey": "loadBalancerId", "Dimensions.1.DimensionValue": balancer.balancer_id}


def _same_alarm(found: dict[str, Any], wanted: dict[str, Any]) -> bool:
    dimensions = {d.get("DimensionKey"): d.get("DimensionValue")
                  for d in (found.get("Dimensions") or {}).get("Dimension") or []}
    return (found.get("MetricName"), found.get("Statistics"), found.get("ComparisonOperator"),
            float(found.get("Threshold") or 0), int(found.get("EvaluationCount") or 0), int(found.get("Period") or 0),
            (found.get("AlarmActions") or {}).get("AlarmAction"), dimensions) == (
        wanted["MetricName"], wanted["Statistics"], wanted["ComparisonOperator"], float(wanted["Threshold"]),
        wanted["EvaluationCount"], wanted["Period"], [wanted["AlarmActions.1"]],
        {"loadBalancerId": wanted["Dimensions.1.DimensionValue"]})


def _capacity(spec: GroupSpec, reset: bool = False) -> dict[str, Any]:
    """The group's spot settings (ESS 2022-02-22 CreateScalingGroup): COST_OPTIMIZED launches the cheapest
    types and spot first; OnDemandBaseCapacity on-demand hosts always, none above it
    (OnDemandPercentageAboveBaseCapacity 0); CompensateWithOnDemand: on-demand when no spot can be had;
    SpotInstanceRemedy: a host about to be reclaimed is replaced before it goes. `reset`: back to ESS's
    defaults (PRIORITY) for a group that stops using spot."""
    if spec.spot:
        return {"MultiAZPolicy": "COST_OPTIMIZED", "OnDemandBaseCapacity": spec.on_demand_base,
                "OnDemandPercentageAboveBaseCapacity": 0, "SpotInstanceRemedy": True, "CompensateWithOnDemand": True}
    return {"MultiAZPolicy": "PRIORITY"} if reset else {}


def _same_capacity(group: dict[str, Any], spec: GroupSpec) -> bool:
    wanted = _capacity(spec, reset=True)
    return all(str(group.get(k, "")).lower() == str(v).lower() for k, v in wanted.items())


def _names(value: Any) -> list[str]:
    """A list as ESS answers it: plain, or wrapped ({"InstanceType": [...]})."""
    if isinstance(value, dict):
        value = next(iter(value.values()), [])
    return [str(v) for v in value or []]


def _config_data(spec: GroupSpec) -> dict[str, Any]:
    data: dict[str, Any] = {"ImageId": spec.image_id, "UserData": base64.b64encode(spec.user_data.encode()).decode(),
                            "Tags": json.dumps(dict(sorted(spec.tags.items())))}
    if spec.instance_types:          # ESS: with InstanceTypes, InstanceType is ignored (so it is not sent)
        data |= {f"InstanceTypes.{n}": t for n, t in enumerate(spec.instance_types, 1)}
    else:
        data["InstanceType"] = spec.instance_type
    if spec.spot:
        data["SpotStrategy"] = "SpotAsPriceGo"      # the market price, no bid: reclaimed only for stock
    if spec.ram_role:
        data["RamRoleName"] = spec.ram_role
    if spec.security_group:
        data["SecurityGroupId"] = spec.security_group
    return data


def _same_config(found: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """The parts that decide what a host boots (ESS echoes them, with more fields around)."""
    keys = ("ImageId", "UserData", "RamRoleName", "SecurityGroupId")
    types = [wanted[f"InstanceTypes.{n}"] for n in range(1, len(wanted) + 1) if f"InstanceTypes.{n}" in wanted]
    have = _names(found.get("InstanceTypes")) or ([found["InstanceType"]] if found.get("InstanceType") else [])
    return all((found.get(k) or "") == (wanted.get(k) or "") for k in keys) and (
        have == (types or [wanted.get("InstanceType")])) and (
        (found.get("SpotStrategy") or "NoSpot") == wanted.get("SpotStrategy", "NoSpot"))
