"""ESS alarm tasks (event-triggered tasks: CreateAlarm and friends, 2022-02-22) and simple scaling rules
executed, for the ESS emulator (aliyun_ess.py).

Why a module of its own: aliyun_ess.py is the group API and aliyun_ess_scaling.py what a group does over time;
alarm tasks are a third thing (a CloudMonitor metric watched every period, an action fired) and would push
either past a readable size. Mixed into aliyun_ess.Ess; every action runs under the emulator's lock, the
haproxy counters are read outside it.

What a user notices (issue 22 item 2, scale to zero): a group at 0 behind an ALB answers 503 to every request
(no server is up); an alarm task on the balancer's 503 count (WAKE_METRIC, Dimension loadBalancerId) goes to
ALARM and runs its SimpleScalingRule (QuantityChangeInCapacity +1): desired 0 -> 1, which in recycle mode
starts the group's Stopped instance again.

Emulated: CreateAlarm (ScalingGroupId, Name, Description, MetricType system/custom, MetricName, Statistics
Average/Minimum/Maximum/Sum, ComparisonOperator >= <= > <, Threshold, EvaluationCount (default 3), Period
60/120/300/900 (default 300), AlarmActions.N = ScalingRuleAri of a rule of the group (1..5),
Dimensions.N.{DimensionKey,DimensionValue}), DescribeAlarms (AlarmTaskId, ScalingGroupId, MetricType, State,
IsEnable; AlarmList.Alarm with State ALARM/OK/INSUFFICIENT_DATA and Enable), Enable/Disable/DeleteAlarm
(AlarmTaskId), ExecuteScalingRule (ScalingRuleAri, ClientToken) of a SimpleScalingRule. The evaluation runs in
the target-tracking controller's period (period_s = 60 x time_scale), each alarm every Period/60 of them: the
datapoint of WAKE_METRIC is the refused-request delta (BalancerPlane.counts: haproxy's own 503s while no
server is up) of the load balancer's listeners (its Dimension loadBalancerId, else the listeners forwarding to
the group's server groups) in the alarm's period: Sum is the count, Average/Maximum/Minimum the count per
emulated second (CloudMonitor's LoadBalancerHTTPCode503 is Count/s, one datapoint per period here); any other
MetricName reads what a test `put_metric`s. Threshold crossed on EvaluationCount consecutive datapoints: ALARM,
else OK (no datapoint yet: INSUFFICIENT_DATA; the first evaluation only takes the counters' baseline). While in
ALARM, each period, the actions run: QuantityChangeInCapacity / TotalCapacity / PercentChangeInCapacity
(truncated toward zero), clamped to MinSize/MaxSize, not while an instance of the group is Pending (warm-up),
recorded in `decisions` (group name, before, after, metric) and converged as any resize (recycle mode: Stopped
instances first). DeleteScalingGroup leaves the group's alarm tasks (the reference says so); they find no
group and do nothing.
Not emulated: OK/INSUFFICIENT_DATA actions, ModifyAlarm, expressions (Expressions.N, ExpressionsLogicOperator),
EffectiveTime, GroupId (CloudMonitor application groups), step rules' BreachThreshold/MetricValue, cooldowns,
MinAdjustmentMagnitude.
Guessed: WAKE_METRIC's name as an ESS alarm task's MetricName (CloudMonitor's acs_alb LoadBalancerHTTPCode503
is real; that an ESS system alarm task takes it is not confirmed: ESS CreateAlarm's documented system metrics do not
list it, cli/clouds/ALIYUN_API_NOTES.md); the spellings are ESS 2022-02-22's (AlarmActions.N, Dimensions.N.*; the
gateway's model check refuses 2014-08-28's AlarmAction.N / Dimension.N.*);
Sum as a Statistics value; the error codes InvalidAlarmTaskId.NotFound, InvalidParameter for an AlarmAction
that names no rule of the group; repeated actions every period while ALARM.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .aliyun_ess_scaling import Ecs, Group, new_id
from .aliyun_rpc import Action, ApiError, as_bool, as_int, indexed, invalid, page, repeated, required

WAKE_METRIC = "LoadBalancerHTTPCode503"      # CloudMonitor acs_alb: 503s the ALB itself returned (see Guessed)
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
STATISTICS = ("Average", "Minimum", "Maximum", "Sum")
ADJUSTMENTS = ("QuantityChangeInCapacity", "TotalCapacity", "PercentChangeInCapacity")


@dataclass
class Alarm:
    id: str
    group_id: str
    name: str
    description: str
    metric_type: str
    metric: str
    statistics: str
    operator: str
    threshold: float
    evaluation_count: int
    period: int
    actions: list[str]
    dimensions: dict[str, str]
    enabled: bool = True
    state: str = "INSUFFICIENT_DATA"
    breaches: int = 0
    ticks: int = 0
    counts: dict[str, int] = field(default_factory=dict)     # listener -> refused so far (the baseline)


def rule_id(ari: str) -> str:
    return ari.rsplit("/", 1)[-1]


def simple_settings(rule: Any, params: Mapping[str, str]) -> None:
    """A SimpleScalingRule's AdjustmentType and AdjustmentValue (CreateScalingRule / ModifyScalingRule)."""
    kind = params.get("AdjustmentType") or rule.adjustment[0]
    value = as_int(params, "AdjustmentValue", rule.adjustment[1], -1000, 1000)
    if rule.type == "SimpleScalingRule" and kind not in ADJUSTMENTS:
        raise invalid("AdjustmentType", "Expected QuantityChangeInCapacity, TotalCapacity or "
                                        "PercentChangeInCapacity.")
    rule.adjustment = (kind, value)


class Alarms:
    """Mixed into aliyun_ess.Ess (before Scaling): alarm tasks and simple-rule execution."""

    ecs: Ecs
    _lock: threading.RLock
    time_scale: float
    decisions: list[tuple[str, int, int, float]]
    metrics: dict[tuple[str, str], float]
    _groups: dict[str, Group]
    _rules: dict[str, Any]
    _activities: dict[str, Any]
    _alarms: dict[str, Alarm]
    _group: Callable[[Mapping[str, str]], Group]
    _converge: Callable[[Group, str], None]
    _failed: Callable[[str, BaseException], None]
    _start_controller: Callable[[], None]

    def alarm_actions(self) -> dict[str, Action]:
        return {"CreateAlarm": self._create_alarm, "DescribeAlarms": self._describe_alarms,
                "EnableAlarm": self._enable_alarm, "DisableAlarm": self._disable_alarm,
                "DeleteAlarm": self._delete_alarm, "ExecuteScalingRule": self._execute_rule}

    # --- the API -------------------------------------------------------------------------------------

    def _alarm(self, params: Mapping[str, str]) -> Alarm:
        alarm_id = required(params, "AlarmTaskId")
        if alarm_id not in self._alarms:
            raise ApiError(404, "InvalidAlarmTaskId.NotFound", f"The specified alarm task {alarm_id!r} does not exist.")
        return self._alarms[alarm_id]

    def _create_alarm(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        actions = repeated(params, "AlarmActions")
        if not 1 <= len(actions) <= 5:
            raise invalid("AlarmActions", "1 to 5 alarm actions (scaling rule ARIs).")
        for ari in actions:
            if getattr(self._rules.get(rule_id(ari)), "group_id", "") != group.id:
                raise invalid("AlarmActions", f"{ari} is no scaling rule of the group.")
        dimensions = {d.get("DimensionKey", ""): d.get("DimensionValue", "") for d in indexed(params, "Dimensions")}
        alarm = Alarm(new_id("asg-"), group.id, params.get("Name") or "", params.get("Description") or "",
                      params.get("MetricType") or "system", required(params, "MetricName"),
                      *self._condition(params), actions, dimensions)
        alarm.name = alarm.name or alarm.id
        self._alarms[alarm.id] = alarm
        self._start_controller()
        return {"AlarmTaskId": alarm.id}

    @staticmethod
    def _condition(params: Mapping[str, str]) -> tuple[str, str, float, int, int]:
        statistics, op = params.get("Statistics") or "Average", params.get("ComparisonOperator") or ">="
        if statistics not in STATISTICS:
            raise invalid("Statistics", "Expected Average, Minimum, Maximum or Sum.")
        if op not in OPERATORS:
            raise invalid("ComparisonOperator", "Expected >=, <=, > or <.")
        try:
            threshold = float(required(params, "Threshold"))
        except ValueError:
            raise invalid("Threshold", "Expected a number.") from None
        period = as_int(params, "Period", 300, 60, 900)
        if period not in (60, 120, 300, 900):
            raise invalid("Period", "Expected 60, 120, 300 or 900.")
        return statistics, op, threshold, as_int(params, "EvaluationCount", 3, 1, 100), period

    def _describe_alarms(self, params: dict[str, str]) -> dict[str, Any]:
        wanted = {"id": params.get("AlarmTaskId", ""), "group_id": params.get("ScalingGroupId", ""),
                  "metric_type": params.get("MetricType", ""), "state": params.get("State", "")}
        enabled = as_bool(params, "IsEnable") if params.get("IsEnable") else None
        found = [a for a in self._alarms.values() if all(v in ("", getattr(a, k)) for k, v in wanted.items())
                 and enabled in (None, a.enabled)]
        items, paging = page(found, params)
        return {**paging, "AlarmList": {"Alarm": [self._alarm_view(a) for a in items]}}

    @staticmethod
    def _alarm_view(a: Alarm) -> dict[str, Any]:
        return {"AlarmTaskId": a.id, "ScalingGroupId": a.group_id, "Name": a.name, "Description": a.description,
                "MetricType": a.metric_type, "MetricName": a.metric, "Statistics": a.statistics,
                "ComparisonOperator": a.operator, "Threshold": a.threshold, "EvaluationCount": a.evaluation_count,
                "Period": a.period, "State": a.state, "Enable": a.enabled,
                "AlarmActions": {"AlarmAction": list(a.actions)},
                "Dimensions": {"Dimension": [{"DimensionKey": k, "DimensionValue": v}
                                             for k, v in a.dimensions.items()]}}

    def _enable_alarm(self, params: dict[str, str]) -> dict[str, Any]:
        self._alarm(params).enabled = True
        return {}

    def _disable_alarm(self, params: dict[str, str]) -> dict[str, Any]:
        alarm = self._alarm(params)
        alarm.enabled, alarm.state, alarm.breaches = False, "INSUFFICIENT_DATA", 0
        return {}

    def _delete_alarm(self, params: dict[str, str]) -> dict[str, Any]:
        del self._alarms[self._alarm(params).id]
        return {"AlarmTaskId": params["AlarmTaskId"]}

    def _execute_rule(self, params: dict[str, str]) -> dict[str, Any]:
        """ExecuteScalingRule of a SimpleScalingRule: the adjustment now (no warm-up wait, no decision)."""
        rule = self._rules.get(rule_id(required(params, "ScalingRuleAri")))
        if rule is None:
            raise ApiError(404, "InvalidScalingRuleAri.NotFound", "The specified scaling rule does not exist.")
        if rule.type != "SimpleScalingRule":
            raise invalid("ScalingRuleAri", "The emulator executes simple scaling rules.")
        group = self._groups[rule.group_id]
        if group.state != "Active":
            raise ApiError(400, "IncorrectScalingGroupStatus", "The scaling group is not Active.")
        before = set(self._activities)
        self._adjust(group, rule, f"ExecuteScalingRule {rule.name}", None)
        made = [a for a in self._activities if a not in before]
        return {"ScalingActivityId": made[0] if made else ""}

    # --- the period ----------------------------------------------------------------------------------

    def _adjust(self, group: Group, rule: Any, cause: str, metric: float | None) -> None:
        kind, value = rule.adjustment
        before = group.desired
        wanted = value if kind == "TotalCapacity" else before + (
            math.trunc(before * value / 100) if kind == "PercentChangeInCapacity" else value)
        wanted = min(max(wanted, group.min), group.max)
        if wanted == before:
            return
        group.desired = wanted
        if metric is not None:
            self.decisions.append((group.name, before, wanted, metric))
        self._converge(group, cause)

    def _evaluate_alarms(self) -> None:
        with self._lock:
            alarms = [a for a in self._alarms.values() if a.enabled]
        for alarm in alarms:
            try:
                self._evaluate(alarm)
            except Exception as exc:  # reported; the next period tries again
                self._failed(alarm.id, exc)

    def _evaluate(self, alarm: Alarm) -> None:
        alarm.ticks += 1
        if alarm.ticks % max(1, alarm.period // 60):
            return
        value = self._datapoint(alarm)
        with self._lock:
            if value is None:
                alarm.state, alarm.breaches = "INSUFFICIENT_DATA", 0
                return
            alarm.breaches = alarm.breaches + 1 if OPERATORS[alarm.operator](value, alarm.threshold) else 0
            alarm.state = "ALARM" if alarm.breaches >= alarm.evaluation_count else "OK"
            group = self._groups.get(alarm.group_id)
            if alarm.state != "ALARM" or not alarm.enabled or group is None or group.state != "Active":
                return
            if any(m.state == "Pending" for m in group.members.values()):
                return                                          # warming up: no action
            for ari in alarm.actions:
                rule = self._rules.get(rule_id(ari))
                if rule is not None and rule.group_id == group.id and rule.type == "SimpleScalingRule":
                    self._adjust(group, rule, f"alarm task {alarm.name}", value)

    def _datapoint(self, alarm: Alarm) -> float | None:
        if alarm.metric != WAKE_METRIC:
            with self._lock:
                return self.metrics.get((alarm.group_id, alarm.metric))
        with self._lock:
            listeners = self._listeners(alarm)
        refused, first = 0, not alarm.counts
        for listener_id, plane in listeners:
            total = plane.counts(listener_id)[1] if plane is not None else 0
            before = alarm.counts.get(listener_id, 0)
            alarm.counts[listener_id] = total
            refused += total - before if total >= before else total        # a rebuilt haproxy starts at 0
        if first or not listeners:
            return None                                         # the baseline, or nothing to measure
        return float(refused) if alarm.statistics == "Sum" else refused / alarm.period

    def _listeners(self, alarm: Alarm) -> list[tuple[str, Any]]:
        """(listener id, its balancer's data plane) the alarm measures (under the lock)."""
        alb, group = self.ecs.alb, self._groups.get(alarm.group_id)
        lb_id = alarm.dimensions.get("loadBalancerId", "")
        ids = {sg["ServerGroupId"] for sg in group.server_groups} if group is not None else set()
        found = [li for li in alb._listeners.values() if (li.lb_id == lb_id if lb_id else li.group_id in ids)]
        return [(li.id, getattr(alb._lbs.get(li.lb_id), "plane", None)) for li in found]
