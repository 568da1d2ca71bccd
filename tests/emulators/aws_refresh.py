"""Instance refresh, spot markets and spot reclaims for the Auto Scaling emulator (aws_autoscaling.py).

Why: an autoscaled service's rolling update is an instance refresh (issue 49), its spot hosts come from a
MixedInstancesPolicy, and what a user must never notice is EC2 reclaiming one. moto 5.2.5 answers
StartInstanceRefresh / DescribeInstanceRefreshes / CancelInstanceRefresh with NotImplemented; it keeps a
MixedInstancesPolicy and CapacityRebalance (DescribeAutoScalingGroups echoes them) but launches every
instance on demand; it has no spot interruption at all. AutoScaling hooks this module in: the three calls go
through `handlers()`, every instance it adopts is given its market (`mark_markets`), and a test calls
`reclaim()`.

Every call's parameters are checked against botocore's model of the action (`check_params`: a name the
real API does not know is a 400 ValidationError), then as AWS documents them:
- StartInstanceRefresh: the group must exist (400 ValidationError) and have no refresh that is Pending /
  InProgress / Cancelling (400 InstanceRefreshInProgress); Preferences MinHealthyPercentage 0..100 (default
  90), MaxHealthyPercentage 100..200 (default 100), their difference at most 100; Strategy Rolling only.
  DesiredConfiguration (LaunchTemplate or MixedInstancesPolicy) is applied to the group in moto when the
  refresh starts, so that replacements launch from it. AWS applies it to the group when the refresh
  succeeds and launches replacements from it meanwhile; the group's own description during the refresh is
  the part this emulator guesses.
  The refresh, on a thread: the instances to replace are the group's InService ones (with SkipMatching:
  those not launched from the desired template version). With MaxHealthyPercentage above 100 a batch is
  launched first (batch = desired x (max - 100) / 100, at least 1; moto's desired raised, the machines
  adopted), the refresh waits until every new instance is healthy in the group's target groups (the ELB
  health check) and InstanceWarmup x time_scale has passed, then the old batch leaves as a scale-in victim
  does (deregistered, drained, the terminating hook; aws_autoscaling.retire). At or below 100 the old batch
  (desired x (100 - min) / 100, at least 1) leaves first, then its replacements launch. PercentageComplete
  is the share of instances replaced; Status Pending -> InProgress -> Successful. New instances that are not
  healthy within (HealthCheckGracePeriod + 600) x time_scale (or `launch_timeout_s`: hosts that boot a real
  container take longer than the scaled time) fail the refresh (Status Failed, StatusReason
  says which): they leave again, the old ones were never touched. CancelInstanceRefresh: Cancelling until the
  batch in flight is settled, then Cancelled (replaced instances stay); no active refresh: 400
  ActiveInstanceRefreshNotFound. Not emulated: checkpoints, bake time, alarms, AutoRollback (accepted and
  ignored), warm pool instances. (moto's CreateLaunchTemplateVersion keeps UserData unwrapped, which its
  launch then asserts on: `wrap_user_data` mends the versions before a refresh launches.)
- Markets: an instance launched into a group with a MixedInstancesPolicy is on demand while the group's
  on-demand instances (those leaving or being replaced by a refresh not counted) are fewer than
  OnDemandBaseCapacity, then spot for OnDemandPercentageAboveBaseCapacity
  0 (above it, that percentage on demand, rounded up as AWS does); EC2's DescribeInstances shows spot ones
  with InstanceLifecycle spot. The instance type is the launch template's (capacity-optimized choosing among
  the Overrides is not emulated).
- reclaim(region, instance_id): EC2 reclaiming a spot instance, as the EC2 user guide describes: the
  instance's metadata (aws_imds.py) shows the rebalance recommendation (events/recommendations/rebalance,
  {"noticeTime"}) and, `lead_s` later, the interruption notice (spot/instance-action, {"action": "terminate",
  "time"} two minutes ahead). With CapacityRebalance on the group launches a replacement at the
  recommendation and, once it is healthy, terminates the old instance through the terminating hook and the
  deregistration delay (EC2 Auto Scaling guide, "Capacity Rebalancing"). At the interruption notice an
  instance not yet leaving leaves the same way (without CapacityRebalance its replacement launches then);
  the hook's and the drain's waits are cut at the interruption time. Two minutes (x time_scale) after the
  notice EC2 terminates the instance whatever is left. Which of these AWS overlaps in what order beyond the
  documented "replacement healthy before termination" is this emulator's reading.
"""

from __future__ import annotations

import json
import math
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from .aws_scaling_owner import NS, ScalingOwner, scaling_answer
from .aws_wire import AwsError, WireRequest, WireResponse, child, child_text, members, new_request_id, parse_xml
from .aws_wire import path as xpath

ACTIVE = ("Pending", "InProgress", "Cancelling")
NOTICE_S = 120.0                 # EC2's two-minute spot interruption notice
ACCOUNT = "123456789012"         # moto's default account
ELB_VERSION = "2015-12-01"


def check_params(action: str, params: dict[str, str]) -> None:
    """400 ValidationError for a parameter botocore's model of `action` does not have (names only)."""
    import botocore.session

    shape = botocore.session.get_session().get_service_model("autoscaling").operation_model(action).input_shape
    for key in params:
        if key not in ("Action", "Version") and not _known(shape, key.split(".")):
            raise AwsError(400, "ValidationError", f"Unknown parameter {key!r} for {action}")


def _known(shape: Any, parts: list[str]) -> bool:
    """Whether a query key (A.B.member.1.C) names a member of `shape` (maps: any key)."""
    if not parts:
        return True
    if shape.type_name == "structure":
        return parts[0] in shape.members and _known(shape.members[parts[0]], parts[1:])
    if shape.type_name == "list":
        return len(parts) > 1 and parts[0] == "member" and parts[1].isdigit() and _known(shape.member, parts[2:])
    return shape.type_name == "map"


def wrap_user_data(region: str) -> None:
    """moto 5.2.5's CreateLaunchTemplateVersion keeps UserData as a plain str, and a group launching from such a
    version then fails an assertion of moto's (a 500); wrapped as moto's own CreateLaunchTemplate does."""
    from moto.core.types import Base64EncodedString
    from moto.ec2.models import ec2_backends

    for template in list(ec2_backends[ACCOUNT][region].launch_templates.values()):
        for version in template.versions:
            if isinstance(version.data.get("UserData"), str):
                version.data["UserData"] = Base64EncodedString(version.data["UserData"])


def _spec(params: dict[str, str], prefix: str) -> dict[str, str]:
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


@dataclass
class Refresh:
    refresh_id: str
    group: str
    region: str
    min_healthy: int
    max_healthy: int
    skip_matching: bool
    warmup_s: float
    status: str = "Pending"
    reason: str = ""
    percent: int = 0
    to_update: int = 0
    started: float = field(default_factory=time.time)
    ended: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    outgoing: set[str] = field(default_factory=set)   # the batch being replaced now


class Refreshes:
    """Instance refreshes, markets and reclaims of an AutoScaling emulator's groups."""

    def __init__(self, scaling: ScalingOwner) -> None:
        self.scaling = scaling
        self.ec2 = scaling.ec2
        self._lock = threading.RLock()
        self._refreshes: dict[str, Refresh] = {}
        self.markets: dict[str, str] = {}              # instance id -> "spot" / "on-demand"
        self.reclaimed: list[str] = []
        self.launch_timeout_s: float | None = None      # a test's bound on a new instance's health (else below)

    def handlers(self) -> dict[str, Callable[[WireRequest], WireResponse]]:
        return {"StartInstanceRefresh": self._start, "DescribeInstanceRefreshes": self._describe,
                "CancelInstanceRefresh": self._cancel}

    # --- calls ------------------------------------------------------------------------------------

    def _start(self, request: WireRequest) -> WireResponse:
        params, region = request.params, request.region
        check_params("StartInstanceRefresh", params)
        name = params.get("AutoScalingGroupName", "")
        if self.scaling._group(region, name) is None:
            raise AwsError(400, "ValidationError", f"AutoScalingGroup name not found - {name}")
        if params.get("Strategy", "Rolling") != "Rolling":
            raise AwsError(400, "ValidationError", f"Unsupported strategy {params['Strategy']}")
        low = int(params.get("Preferences.MinHealthyPercentage", 90))
        high = int(params.get("Preferences.MaxHealthyPercentage", 100))
        if not (0 <= low <= 100 and 100 <= high <= 200 and high - low <= 100):
            raise AwsError(400, "ValidationError", "MinHealthyPercentage must be 0..100, MaxHealthyPercentage "
                                                   "100..200, and their difference at most 100")
        with self._lock:
            if any(r.group == name and r.region == region and r.status in ACTIVE for r in self._refreshes.values()):
                raise AwsError(400, "InstanceRefreshInProgress", f"An Instance Refresh is already in progress and "
                                                                 f"blocks the execution of this Instance Refresh "
                                                                 f"for group {name}.")
            refresh = Refresh(new_request_id(), name, region, low, high,
                              params.get("Preferences.SkipMatching") == "true",
                              float(params.get("Preferences.InstanceWarmup", 0)) * self.scaling.time_scale)
            self._refreshes[refresh.refresh_id] = refresh
        desired = _spec(params, "DesiredConfiguration.")
        wrap_user_data(region)
        if desired:
            self.scaling._moto(region, "UpdateAutoScalingGroup", {"AutoScalingGroupName": name, **desired})
        self.ec2._spawn(self._run, refresh)
        return scaling_answer("StartInstanceRefresh",
                              lambda result: _text(result, "InstanceRefreshId", refresh.refresh_id))

    def _describe(self, request: WireRequest) -> WireResponse:
        params = request.params
        check_params("DescribeInstanceRefreshes", params)
        wanted = {v for k, v in params.items() if k.startswith("InstanceRefreshIds.member.")}
        with self._lock:
            found = sorted((r for r in self._refreshes.values() if r.group == params.get("AutoScalingGroupName")
                            and r.region == request.region and (not wanted or r.refresh_id in wanted)),
                           key=lambda r: -r.started)

        def build(result: ET.Element) -> None:
            listed = ET.SubElement(result, f"{{{NS}}}InstanceRefreshes")
            for r in found:
                member = ET.SubElement(listed, f"{{{NS}}}member")
                for key, value in (("InstanceRefreshId", r.refresh_id), ("AutoScalingGroupName", r.group),
                                   ("Status", r.status), ("StatusReason", r.reason),
                                   ("StartTime", _stamp(r.started)), ("PercentageComplete", str(r.percent)),
                                   ("InstancesToUpdate", str(r.to_update)),
                                   ("EndTime", _stamp(r.ended) if r.ended else "")):
                    if value:
                        _text(member, key, value)
        return scaling_answer("DescribeInstanceRefreshes", build)

    def _cancel(self, request: WireRequest) -> WireResponse:
        check_params("CancelInstanceRefresh", request.params)
        name = request.params.get("AutoScalingGroupName", "")
        with self._lock:
            active = [r for r in self._refreshes.values() if r.group == name and r.region == request.region
                      and r.status in ACTIVE]
            for r in active:
                r.status = "Cancelling"
                r.cancel.set()
        if not active:
            raise AwsError(400, "ActiveInstanceRefreshNotFound", f"No in progress or pending Instance Refresh found "
                                                                 f"for Auto Scaling group {name}")
        return scaling_answer("CancelInstanceRefresh",
                              lambda result: _text(result, "InstanceRefreshId", active[0].refresh_id))

    # --- the refresh ------------------------------------------------------------------------------

    def _run(self, refresh: Refresh) -> None:
        try:
            self._replace(refresh)
        except Exception as exc:                # reported; the refresh says Failed
            self._end(refresh, "Failed", f"{type(exc).__name__}: {exc}"[:300])
            with self.scaling._lock:
                self.scaling.errors.append(f"refresh {refresh.refresh_id}: {exc}"[:500])

    def _replace(self, refresh: Refresh) -> None:
        region, name = refresh.region, refresh.group
        group = self.scaling._group(region, name)
        if group is None:
            return self._end(refresh, "Failed", "the group was deleted")
        version = self._desired_version(group)
        with self.scaling._lock:
            versions = dict(self.scaling._versions)
        old = [child_text(m, "InstanceId") for m in members(group, "Instances")
               if not (refresh.skip_matching and versions.get(child_text(m, "InstanceId")) == version)]
        desired = int(child_text(group, "DesiredCapacity") or 0)
        refresh.to_update, total = len(old), max(1, len(old))
        refresh.status = "InProgress" if refresh.status == "Pending" else refresh.status
        surge = refresh.max_healthy > 100
        batch = max(1, desired * (refresh.max_healthy - 100) // 100 if surge
                    else desired * (100 - refresh.min_healthy) // 100)
        while old:
            if refresh.cancel.is_set():
                return self._end(refresh, "Cancelled", "cancelled by CancelInstanceRefresh")
            now, old = old[:batch], old[batch:]
            with self._lock:
                refresh.outgoing = set(now)                # not the on-demand floor's any more (markets)
            if surge:
                new = self._launch(region, name, len(now))
                failed = self._wait_healthy(refresh, new)
                if failed:
                    self._retire(region, name, new)
                    return self._end(refresh, "Failed", failed)
                self._retire(region, name, now)
            else:
                self._retire(region, name, now)
                failed = self._wait_healthy(refresh, self._launch(region, name, len(now)))
                if failed:
                    return self._end(refresh, "Failed", failed)
            self._wait_gone(now)
            with self._lock:
                refresh.outgoing = set()
            refresh.percent = int(100 * (total - len(old)) / total)
        refresh.percent = 100
        self._end(refresh, "Cancelled" if refresh.cancel.is_set() else "Successful", "")

    def _end(self, refresh: Refresh, status: str, reason: str) -> None:
        with self._lock:
            refresh.status, refresh.reason, refresh.ended = status, reason, time.time()

    @staticmethod
    def _desired_version(group: ET.Element) -> str:
        template = child(group, "LaunchTemplate")
        if template is None:
            template = xpath(group, "MixedInstancesPolicy", "LaunchTemplate", "LaunchTemplateSpecification")
        return child_text(template, "Version") if template is not None else ""

    def _launch(self, region: str, name: str, count: int) -> list[str]:
        """`count` more instances in the group (moto's desired raised, past MaxSize as a surge may), adopted."""
        wrap_user_data(region)
        with self.scaling._scale_lock:
            group = self.scaling._group(region, name)
            before = {child_text(m, "InstanceId") for m in members(group, "Instances")}
            desired = int(child_text(group, "DesiredCapacity") or 0)
            self.scaling._moto(region, "SetDesiredCapacity", {"AutoScalingGroupName": name,
                                                              "DesiredCapacity": str(desired + count)})
            self.scaling._sync(region, name)
            group = self.scaling._group(region, name)
        return [i for m in members(group, "Instances") if (i := child_text(m, "InstanceId")) not in before]

    def _retire(self, region: str, name: str, ids: list[str], decrement: bool = True,
                deadline: float | None = None) -> None:
        with self.scaling._scale_lock:
            group = self.scaling._group(region, name)
            if group is not None:
                present = {child_text(m, "InstanceId") for m in members(group, "Instances")}
                self.scaling.retire(region, group, [i for i in ids if i in present], decrement, deadline)
                if not decrement:
                    self.scaling._sync(region, name)

    def _wait_healthy(self, refresh: Refresh, ids: list[str]) -> str:
        """"" once every id is healthy in the group's target groups and warmed up; else why not."""
        group = self.scaling._group(refresh.region, refresh.group)
        grace = float(child_text(group, "HealthCheckGracePeriod") or 300) if group is not None else 300.0
        deadline = time.monotonic() + (self.launch_timeout_s or (grace + 600) * self.scaling.time_scale)
        arns = [m.text or "" for m in members(group, "TargetGroupARNs")] if group is not None else []
        health: dict[str, str] = {}
        while time.monotonic() < deadline and not self.scaling._closing.is_set():
            health = self.target_health(refresh.region, arns)
            if all(health.get(i) == "healthy" for i in ids):
                self.scaling._closing.wait(refresh.warmup_s)
                return ""
            self.scaling._closing.wait(0.1)
        states = ", ".join(f"{i} {health.get(i, 'unregistered')}" for i in ids)
        return f"instances did not become healthy in the target group: {states}"

    def _wait_gone(self, ids: list[str]) -> None:
        deadline = time.monotonic() + 3600 * max(self.scaling.time_scale, 0.01)
        while time.monotonic() < deadline and not self.scaling._closing.is_set():
            if not {v.instance_id for v in self.scaling.victims()} & set(ids):
                return
            self.scaling._closing.wait(0.1)

    def target_health(self, region: str, arns: list[str]) -> dict[str, str]:
        """Instance id -> its state in any of the target groups (healthy wins), from the elbv2 emulator."""
        found: dict[str, str] = {}
        for arn in arns:
            body = urlencode({"Action": "DescribeTargetHealth", "Version": ELB_VERSION, "TargetGroupArn": arn})
            headers = (("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"),
                       ("Authorization", f"AWS4-HMAC-SHA256 Credential=harness/20260101/{region}/elasticloadbalancing/"
                                         "aws4_request, SignedHeaders=host, Signature=0"))
            request = WireRequest("POST", "/", headers,
                                  body.encode(), "query", "DescribeTargetHealth", {"TargetGroupArn": arn}, None,
                                  region, "elasticloadbalancing")
            answer = self.ec2.elbv2.handle(request)
            root = parse_xml(answer.body) if answer.ok else None
            for m in members(xpath(root, "DescribeTargetHealthResult") if root is not None else None,
                             "TargetHealthDescriptions"):
                target = child_text(xpath(m, "Target"), "Id")
                state = child_text(xpath(m, "TargetHealth"), "State")
                if found.get(target) != "healthy":
                    found[target] = state
        return found

    # --- markets and reclaims -----------------------------------------------------------------------

    def mark_markets(self, region: str, group: ET.Element, new: list[str]) -> None:
        """Each new instance of a mixed-instances group on demand up to the base, then spot (see docstring)."""
        policy = xpath(group, "MixedInstancesPolicy", "InstancesDistribution")
        if xpath(group, "MixedInstancesPolicy") is None:
            return
        base = int(child_text(policy, "OnDemandBaseCapacity") or 0) if policy is not None else 0
        above = int(child_text(policy, "OnDemandPercentageAboveBaseCapacity") or 100) if policy is not None else 100
        with self._lock:
            leaving = {v.instance_id for v in self.scaling.victims()}.union(
                *(r.outgoing for r in self._refreshes.values() if r.status in ACTIVE))
        current = [child_text(m, "InstanceId") for m in members(group, "Instances")]
        with self._lock:
            kept = [i for i in current if i not in new and i not in leaving]
            on_demand = sum(1 for i in kept if self.markets.get(i) == "on-demand")
            for i in new:
                size_above = max(0, len(kept) + 1 - base)
                want_on_demand = on_demand < base or on_demand - base < math.ceil(size_above * above / 100)
                self.markets[i] = "on-demand" if want_on_demand else "spot"
                on_demand += want_on_demand
                kept.append(i)
        from moto.ec2.models import ec2_backends

        backend = ec2_backends[ACCOUNT][region]
        for i in new:
            if self.markets[i] == "spot":
                backend.get_instance(i).lifecycle = "spot"

    def reclaim(self, region: str, instance_id: str, lead_s: float = 0.0) -> None:
        """EC2 takes a spot instance back (see the module docstring): notices, replacement, drain, termination."""
        if self.markets.get(instance_id) != "spot":
            raise ValueError(f"{instance_id} is not a spot instance of a group")
        group = next((g for g in self.scaling._groups(region) if instance_id in
                      {child_text(m, "InstanceId") for m in members(g, "Instances")}), None)
        if group is None:
            raise ValueError(f"{instance_id} is in no group")
        self.reclaimed.append(instance_id)
        self._notice(instance_id, "events", {"recommendations": {"rebalance": json.dumps(
            {"noticeTime": _stamp(time.time())})}})
        self.ec2._spawn(self._reclaim, region, child_text(group, "AutoScalingGroupName"), instance_id,
                        child_text(group, "CapacityRebalance") == "true", lead_s * self.scaling.time_scale)

    def _reclaim(self, region: str, name: str, instance_id: str, rebalance: bool, lead_s: float) -> None:
        notice_at = time.monotonic() + lead_s
        end = notice_at + NOTICE_S * self.scaling.time_scale
        leaving = False
        if rebalance:
            new = self._launch(region, name, 1)
            group = self.scaling._group(region, name)
            arns = [m.text or "" for m in members(group, "TargetGroupARNs")] if group is not None else []
            while time.monotonic() < notice_at and not self.scaling._closing.is_set():
                if all(self.target_health(region, arns).get(i) == "healthy" for i in new):
                    self._retire(region, name, [instance_id], True, end)
                    leaving = True
                    break
                self.scaling._closing.wait(0.1)
        self.scaling._closing.wait(max(0.0, notice_at - time.monotonic()))
        self._notice(instance_id, "spot", {"instance-action": json.dumps(
            {"action": "terminate", "time": _stamp(time.time() + NOTICE_S * self.scaling.time_scale)})})
        if not leaving:
            self._retire(region, name, [instance_id], rebalance, end)
        self.scaling._closing.wait(max(0.0, end - time.monotonic()))
        if self.scaling._closing.is_set():
            return
        with self.scaling._lock:
            victim = self.scaling._victims.pop(instance_id, None)
        if victim is not None:                            # the hook or drain outlasted the notice: EC2 decides
            self.ec2._need_upstream().ec2(region, "TerminateInstances", {"InstanceId.1": instance_id})
            self.ec2.machines_gone(region, [instance_id])

    def _notice(self, instance_id: str, key: str, tree: dict[str, Any]) -> None:
        imds = self.ec2._imds
        if imds is not None:
            imds.notices.setdefault(instance_id, {})[key] = tree


def _text(parent: ET.Element, key: str, value: str) -> ET.Element:
    element = ET.SubElement(parent, f"{{{NS}}}{key}")
    element.text = value
    return element


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
