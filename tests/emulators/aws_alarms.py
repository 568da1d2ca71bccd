"""The balancers' CloudWatch metrics and the metric alarms that run Auto Scaling step policies, for the emulator.

Why a module of its own: aws_autoscaling.py's controller tracks targets; waking a group that scaled to zero
takes what AWS does outside Auto Scaling: the ALB publishes its metrics into CloudWatch, CloudWatch evaluates an
alarm on them, the alarm runs a step-scaling policy. AutoScaling calls `tick(region)` every period (60 s x
time_scale) and routes PutScalingPolicy here.

What moto 5.2.5 keeps (checked by experiment): PutMetricData and GetMetricStatistics; PutMetricAlarm /
DescribeAlarms / DeleteAlarms (StateValue stays OK: "Unchecked: Initial alarm creation"; SetAlarmState works);
StepScaling policies (DescribePolicies: PolicyType, AdjustmentType, StepAdjustments with
MetricIntervalLowerBound / UpperBound and ScalingAdjustment, MinAdjustmentMagnitude, MetricAggregationType,
EstimatedInstanceWarmup). What it lacks: no ALB ever publishes a metric; no alarm is ever evaluated; no
alarm action runs; PutScalingPolicy answers without PolicyARN (moto names it PolicyArn, which its serializer
drops), so a client cannot name the policy in AlarmActions.

What this module adds, as AWS does:
- PutScalingPolicy answers PolicyARN (read back from DescribePolicies) and an empty Alarms list.
- Every period, for each application load balancer with a data plane (real haproxy, balancer_plane.py), the
  difference of its listeners' `counts()` since the last period is published into moto's CloudWatch, namespace
  AWS/ApplicationELB, dimension LoadBalancer=app/NAME/ID, unit Count: `RequestCount` (requests a target took)
  and `HTTPCode_ELB_503_Count` (requests no target took: haproxy's own 503). As the ALB, a metric with nothing
  to count is not published (no zero datapoints).
- Every period, each metric alarm of the region whose AlarmActions name an Auto Scaling policy ARN and whose
  Period (x time_scale) has passed since its last evaluation is evaluated: its Statistic over the last Period
  from CloudWatch (Dimensions matched), compared with Threshold by ComparisonOperator; the last
  EvaluationPeriods results decide (ALARM when DatapointsToAlarm of them (default: all) breach); a period
  without data is what TreatMissingData says (missing (default): not counted, all missing =
  INSUFFICIENT_DATA; notBreaching; breaching; ignore: the state stays). The state is set in moto
  (DescribeAlarms shows StateValue, StateReason).
- While an alarm with ActionsEnabled is in ALARM, at every evaluation (AWS re-runs Auto Scaling actions every
  period the alarm stays in ALARM), its StepScaling policies run: the step whose interval (bounds relative to
  the threshold, lower inclusive, upper exclusive, missing = infinite) holds the metric; ChangeInCapacity,
  ExactCapacity or PercentChangeInCapacity (AWS's rounding: above 1 down, between 0 and 1 to 1, and the same
  towards 0 for negative changes; MinAdjustmentMagnitude); clamped to MinSize / MaxSize. Not while an
  instance of the group is Pending, nor within the policy's warm-up after its last action (EstimatedInstanceWarmup,
  else the group's DefaultInstanceWarmup, else DefaultCooldown; x time_scale): AWS counts warming instances as
  capacity, so breaches in the same step while they warm add nothing. Simplified: a breach in a larger step
  during the warm-up adds nothing either (AWS adds the difference).
  The resize goes through the controller's own path (AutoScaling._set: warm pool first) and is recorded in
  `decisions` as (group, before, after, metric).
Not emulated: SimpleScaling policies and cooldowns, ExecutePolicy (moto's own: it resizes without machines),
OK / INSUFFICIENT_DATA actions and SNS actions, metric math alarms, composite alarms, percentile statistics,
the other ALB metrics (TargetResponseTime, HealthyHostCount, ...), per-target-group dimensions.
"""

from __future__ import annotations

import datetime
import json
import math
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from typing import Any

from .aws_scaling_owner import ScalingOwner, scaling_answer
from .aws_wire import AwsError, WireRequest, WireResponse, child_text, members, parse_xml
from .aws_wire import path as xpath

ACCOUNT = "123456789012"
NAMESPACE = "AWS/ApplicationELB"
OPERATORS = {
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)       # moto keeps naive UTC times


def _cloudwatch(region: str) -> Any:
    from moto.cloudwatch.models import cloudwatch_backends

    return cloudwatch_backends[ACCOUNT][region]


class AlarmActions:
    """ALB metrics into CloudWatch, alarm evaluation, step-scaling actions for an AutoScaling emulator."""

    def __init__(self, scaling: ScalingOwner) -> None:
        self.scaling = scaling
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], tuple[int, int]] = {}      # (balancer, listener) -> counts so far
        self._results: dict[str, deque[str]] = {}                      # _key(alarm) -> "breach" / "ok" / "missing"
        self._evaluated: dict[str, float] = {}                         # _key(alarm) -> monotonic time of the last
        self._acted: dict[str, float] = {}                             # policy ARN -> monotonic time of its last

    def tick(self, region: str) -> None:
        self.publish(region)
        self.evaluate(region)

    # --- PutScalingPolicy ---------------------------------------------------------------------------

    def put_policy(self, request: WireRequest) -> WireResponse:
        """moto's answer lacks PolicyARN: read it back."""
        answer = self.scaling.ec2._forward(request)
        if not answer.ok:
            return answer
        params = request.params
        root = self.scaling._moto(request.region, "DescribePolicies", {
            "AutoScalingGroupName": params.get("AutoScalingGroupName", ""),
            "PolicyNames.member.1": params.get("PolicyName", "")})
        policies = members(xpath(root, "DescribePoliciesResult") if root is not None else None, "ScalingPolicies")
        if not policies:
            raise AwsError(500, "InternalFailure", "the policy was not stored")
        arn = child_text(policies[0], "PolicyARN")

        def build(result: ET.Element) -> None:
            ns = result.tag.partition("}")[0] + "}"
            ET.SubElement(result, f"{ns}PolicyARN").text = arn
            ET.SubElement(result, f"{ns}Alarms")

        return scaling_answer("PutScalingPolicy", build)

    # --- the balancers' metrics ---------------------------------------------------------------------

    def publish(self, region: str) -> None:
        """RequestCount and HTTPCode_ELB_503_Count of every application load balancer, for the last period."""
        reply = self.scaling.ec2._need_upstream().query("elasticloadbalancing", region, "DescribeLoadBalancers",
                                                        "2015-12-01", {"PageSize": "400"})
        root = parse_xml(reply.body) if reply.ok else None
        for balancer in members(xpath(root, "DescribeLoadBalancersResult") if root is not None else None,
                                "LoadBalancers"):
            if child_text(balancer, "Type") not in ("", "application"):
                continue
            arn = child_text(balancer, "LoadBalancerArn")
            served, refused = self.period_counts(arn)
            label = arn.partition(":loadbalancer/")[2]
            data = [{"MetricName": name, "Value": float(value), "Unit": "Count", "Timestamp": _now(),
                     "Dimensions": [{"Name": "LoadBalancer", "Value": label}]}
                    for name, value in (("RequestCount", served), ("HTTPCode_ELB_503_Count", refused)) if value > 0]
            if data:
                _cloudwatch(region).put_metric_data(NAMESPACE, data)

    def period_counts(self, balancer_arn: str) -> tuple[int, int]:
        """(requests a target took, requests none took) since the last call, over the balancer's listeners."""
        try:
            plane = self.scaling.ec2.elbv2.plane(balancer_arn)
        except KeyError:
            return 0, 0
        served = refused = 0
        for listener in plane.listeners():
            requests, failed = plane.counts(listener)
            with self._lock:
                before = self._counts.get((balancer_arn, listener), (0, 0))
                self._counts[(balancer_arn, listener)] = (requests, failed)
            if requests < before[0] or failed < before[1]:      # a rebuilt haproxy starts at zero
                before = (0, 0)
            served += (requests - before[0]) - (failed - before[1])
            refused += failed - before[1]
        return max(0, served), refused

    # --- alarms -------------------------------------------------------------------------------------

    def evaluate(self, region: str) -> None:
        backend = _cloudwatch(region)
        for alarm in list(backend.alarms.values()):
            policies = [a for a in alarm.alarm_actions or [] if a.startswith("arn:aws:autoscaling:")
                        and ":scalingPolicy:" in a]
            if not policies or not alarm.metric_name or not self._due(alarm):
                continue
            value = self._statistic(region, alarm)
            state = self._judge(alarm, value)
            if state is not None and state != alarm.state_value:
                backend.set_alarm_state(alarm.name, self._reason(alarm, value, state),
                                        json.dumps({"version": "1.0", "statistic": alarm.statistic,
                                                    "period": alarm.period, "threshold": alarm.threshold,
                                                    "recentDatapoints": [] if value is None else [value]}), state)
            if alarm.state_value == "ALARM" and alarm.actions_enabled:
                for arn in policies:
                    self._step(region, arn, alarm, value)

    def _due(self, alarm: Any) -> bool:
        now, window = time.monotonic(), float(alarm.period or 60) * self.scaling.time_scale
        with self._lock:
            if now - self._evaluated.get(_key(alarm), -math.inf) < window * 0.95:
                return False
            self._evaluated[_key(alarm)] = now
        return True

    def _statistic(self, region: str, alarm: Any) -> float | None:
        """The alarm's Statistic over its last Period (x time_scale), None without datapoints."""
        window = float(alarm.period or 60) * self.scaling.time_scale
        end = _now() + datetime.timedelta(seconds=1)                  # moto drops the microseconds of the end
        start = end - datetime.timedelta(seconds=window)
        dimensions = [{"Name": d.name, "Value": d.value} for d in alarm.dimensions]
        points = _cloudwatch(region).get_metric_statistics(alarm.namespace, alarm.metric_name, start, end,
                                                           math.ceil(window) + 2, [alarm.statistic or "Average"],
                                                           dimensions)
        values = [float(v) for p in points if (v := p.get_statistics_for_type(alarm.statistic or "Average"))
                  is not None]
        return values[-1] if values else None

    def _judge(self, alarm: Any, value: float | None) -> str | None:
        """The alarm's state after this period's result (None: keep it, TreatMissingData ignore)."""
        missing = alarm.treat_missing_data or "missing"
        if value is None and missing == "ignore":
            return None
        if value is None:
            result = {"notBreaching": "ok", "breaching": "breach"}.get(missing, "missing")
        else:
            compare = OPERATORS.get(alarm.comparison_operator)
            result = "breach" if compare is not None and compare(value, float(alarm.threshold)) else "ok"
        periods = max(1, int(alarm.evaluation_periods or 1))
        with self._lock:
            results = self._results.setdefault(_key(alarm), deque(maxlen=periods))
            results.append(result)
            recent = list(results)
        if all(r == "missing" for r in recent):
            return "INSUFFICIENT_DATA"
        needed = int(alarm.datapoints_to_alarm or periods)
        return "ALARM" if sum(r == "breach" for r in recent) >= needed else "OK"

    @staticmethod
    def _reason(alarm: Any, value: float | None, state: str) -> str:
        if value is None:
            return f"Threshold Crossed: no datapoints were received for {alarm.evaluation_periods} period(s)."
        word = {"GreaterThanOrEqualToThreshold": "greater than or equal to", "GreaterThanThreshold": "greater than",
                "LessThanThreshold": "less than", "LessThanOrEqualToThreshold": "less than or equal to"}.get(
            alarm.comparison_operator, alarm.comparison_operator)
        verb = "was" if state == "ALARM" else "was not"
        return f"Threshold Crossed: 1 datapoint [{value}] {verb} {word} the threshold ({float(alarm.threshold)})."

    # --- step scaling -------------------------------------------------------------------------------

    def _policy(self, region: str, arn: str) -> ET.Element | None:
        root = self.scaling._moto(region, "DescribePolicies", {})
        return next((p for p in members(xpath(root, "DescribePoliciesResult") if root is not None else None,
                                        "ScalingPolicies") if child_text(p, "PolicyARN") == arn), None)

    def _step(self, region: str, arn: str, alarm: Any, value: float | None) -> None:
        policy = self._policy(region, arn)
        if policy is None or child_text(policy, "PolicyType") != "StepScaling" or value is None:
            return
        name = child_text(policy, "AutoScalingGroupName")
        group = self.scaling._group(region, name)
        if group is None:
            return
        if self._warming(policy, group):
            return                                       # the breach is being answered
        step = _step_for(policy, value - float(alarm.threshold))
        if step is None:
            return
        desired = int(child_text(group, "DesiredCapacity") or 0)
        wanted = _adjusted(desired, child_text(policy, "AdjustmentType"), int(child_text(step, "ScalingAdjustment")
                                                                              or 0),
                           int(child_text(policy, "MinAdjustmentMagnitude") or 0))
        low, high = int(child_text(group, "MinSize") or 0), int(child_text(group, "MaxSize") or 0)
        wanted = min(max(wanted, low), high)
        if wanted != desired:
            with self._lock:
                self._acted[arn] = time.monotonic()
            self.scaling._set(region, name, desired, wanted, value)

    def _warming(self, policy: ET.Element, group: ET.Element) -> bool:
        """An instance of the group is Pending, or the policy's last action is younger than its warm-up
        (EstimatedInstanceWarmup, else the group's DefaultInstanceWarmup, else its DefaultCooldown; x time_scale)."""
        if any(not self.scaling.ec2._private_ip(child_text(m, "InstanceId")) for m in members(group, "Instances")):
            return True
        warmup = (child_text(policy, "EstimatedInstanceWarmup") or child_text(group, "DefaultInstanceWarmup")
                  or child_text(group, "DefaultCooldown") or "300")
        with self._lock:
            acted = self._acted.get(child_text(policy, "PolicyARN"), -math.inf)
        return time.monotonic() - acted < float(warmup) * self.scaling.time_scale


def _key(alarm: Any) -> str:
    """An alarm as PutMetricAlarm last configured it: a new configuration starts a new history."""
    return f"{alarm.alarm_arn}@{alarm.configuration_updated_timestamp}"


def _step_for(policy: ET.Element, difference: float) -> ET.Element | None:
    """The step whose [lower, upper) interval, relative to the threshold, holds the metric."""
    for step in members(policy, "StepAdjustments"):
        lower, upper = child_text(step, "MetricIntervalLowerBound"), child_text(step, "MetricIntervalUpperBound")
        if (lower == "" or difference >= float(lower)) and (upper == "" or difference < float(upper)):
            return step
    return None


def _adjusted(desired: int, kind: str, adjustment: int, magnitude: int) -> int:
    """The new desired capacity, as AWS computes it for the policy's AdjustmentType."""
    if kind == "ExactCapacity":
        return adjustment
    if kind != "PercentChangeInCapacity":
        return desired + adjustment
    change = desired * adjustment / 100.0
    if 0 < change < 1:
        change = 1
    elif -1 < change < 0:
        change = -1
    change = math.floor(change) if change > 0 else math.ceil(change)
    if magnitude and 0 < abs(change) < magnitude:
        change = magnitude if change > 0 else -magnitude
    return desired + int(change)

