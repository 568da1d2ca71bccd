"""EC2 Auto Scaling in the AWS double: moto's API state, real machines, drains and a target-tracking controller.

Why: ngcx will make a service's replicas an Auto Scaling group (issue 22: launch template from the baked AMI,
attached to the service's target group, target tracking). What a user notices is what the group *does*:
instances that boot the user-data and take traffic, a scale-in that drains before the machine goes, a policy
that follows real load. moto keeps the API state; this module, attached to an aws_ec2.Ec2Emulator (it takes
every request signed for `autoscaling` on the same wire: SigV4, faults such as `fail_next(action,
"Throttling", 400)` and `hold` are the emulator's), adds what moto lacks.

What moto 5 keeps (checked by experiment, moto 5.2.5): launch templates and their versions (EC2 API);
groups with LaunchTemplate (+ Version), TargetGroupARNs, VPCZoneIdentifier, min/max/desired, health check
type and grace period, tags; SetDesiredCapacity / UpdateAutoScalingGroup launch instances in its EC2 state
(image of the resolved template version) and register them in the groups' target groups; PutScalingPolicy
(TargetTrackingConfiguration and StepAdjustments stored, DescribePolicies), PutLifecycleHook
(DescribeLifecycleHooks), AttachInstances / DetachInstances, DescribeScalingActivities (detaches only),
PutWarmPool's configuration (DescribeWarmPool), CloudWatch's PutMetricData and metric alarms.
What moto lacks: it never runs user-data for a group's instances nor gives them the template's instance profile
(they launch inside moto, not through RunInstances); it says InService at once; it terminates scale-in victims
at once, never deregisters them from target groups, knows no lifecycle waits (CompleteLifecycleAction:
NotImplemented, a 500); it reports every instance's LaunchTemplate Version as "1" for "$Latest"; it puts every
instance in the first subnet; it evaluates no policy; DeleteAutoScalingGroup without ForceDelete removes a group
that has instances; UpdateAutoScalingGroup drops a MixedInstancesPolicy the call does not carry (mended:
keep_mixed_policy); PutScalingPolicy answers without PolicyARN; a warm pool never has an instance; no balancer
publishes a metric and no alarm is evaluated.

What this module adds:
- Machines: after every successful call that may launch (Create/Update/SetDesiredCapacity, and the
  controller's own), the group's new instances are adopted by the Ec2Emulator (`adopt`): each becomes a
  HostBackend machine running the user-data of the launch template version it was launched from (resolved
  then: "$Latest" / "$Default" / a number), `pending` until it boots, as RunInstances. The elbv2 planes
  are refreshed so the targets moto registered get traffic once they have an address.
- LifecycleState: `Pending` while the instance has no running machine, then moto's (InService); the
  instance's LaunchTemplate Version is the one it was launched from.
- Scale-in (SetDesiredCapacity / UpdateAutoScalingGroup below the group's size, and the controller): the
  emulator picks the victims by AWS's default termination policy, simplified: unprotected instances, from
  the zone with the most instances, oldest launch template version first, then the newest launch. Each is
  detached in moto (DetachInstances, ShouldDecrementDesiredCapacity) and stays in DescribeAutoScalingGroups
  as `Terminating:Wait` (a terminating lifecycle hook exists) or `Terminating`; it is deregistered from the
  group's target groups at once (`draining` for the deregistration delay x elbv2.time_scale, in-flight
  requests complete) and terminated (its machine deleted) once both the drain is over and the hook is
  completed (CompleteLifecycleAction) or timed out (HeartbeatTimeout x time_scale;
  RecordLifecycleActionHeartbeat restarts it). AWS runs the drain before the hook; here they run side by
  side and the later one decides, which is never shorter than either.
- DeleteAutoScalingGroup: with instances (or terminating ones) and no ForceDelete: 400 ResourceInUse, as
  AWS; with ForceDelete every instance is deregistered and its machine deleted, outstanding lifecycle
  actions dropped (AWS: "deletes any outstanding lifecycle actions").
- Target tracking (`TargetTrackingScaling` policies), evaluated every `period_s` = 60 x time_scale seconds
  (AWS's one-minute metric): the metric is ALBRequestCountPerTarget (requests the target group's balancer
  plane (real haproxy) served in the period / the group's InService instances) or a CustomizedMetricSpecification
  read from moto's CloudWatch (PutMetricData; the Statistic over the period, Dimensions matched). As AWS:
  desired = ceil(in-service x metric / target), clamped to min/max; scale-out at once, scale-in only when
  DisableScaleIn is false. Simplified: AWS's alarms need 3 datapoints above the target (scale out) and 15
  below 90% of it (scale in); here 1 period above and `scale_in_periods` (default 3) consecutive periods
  below. No cooldowns (target tracking on AWS uses none either); warm-up: no decision while an instance is
  Pending (AWS counts warming instances' capacity without their metric). Scale-in protection of instances is
  honoured (moto's ProtectedFromScaleIn flag); the controller's actions are recorded in `decisions`.
- Warm pools (aws_warm_pool.py, its docstring says what exactly): PutWarmPool prepares stopped instances
  (Warmed:Pending, Warmed:Stopped), a scale-out starts and attaches them before moto launches new ones, a
  scale-in victim returns to the pool (ReuseOnScaleIn) instead of being terminated, DescribeWarmPool lists
  them, DeleteWarmPool and DeleteAutoScalingGroup ForceDelete terminate them.
- The balancers' CloudWatch metrics and alarms (aws_alarms.py): every period, RequestCount and
  HTTPCode_ELB_503_Count of each ALB (in the regions this emulator has seen a call for) into moto's
  CloudWatch; metric alarms whose actions name a scaling policy are evaluated (StateValue set in moto) and,
  while in ALARM, run their StepScaling policy through `_set` (warm pool first); PutScalingPolicy answers
  PolicyARN.
- Instance refresh, mixed instances (spot markets) and spot reclaims: aws_refresh.py (its docstring).
Not emulated: zone balancing (moto's first subnet), replacing unhealthy instances (HealthCheckType ELB is
stored, not acted on), launching lifecycle hooks, simple scaling
policies and ExecutePolicy (moto's own, without machines), DescribeScalingActivities for launches and
terminations.
"""

from __future__ import annotations

import math
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import TYPE_CHECKING

from .aws_alarms import AlarmActions
from .aws_refresh import ACCOUNT, Refreshes
from .aws_scaling_owner import NS, Victim, scaling_answer
from .aws_warm_pool import WarmPools
from .aws_wire import (
    AwsError,
    WireRequest,
    WireResponse,
    child,
    child_text,
    items,
    local,
    members,
    parse_xml,
    xml_bytes,
)
from .aws_wire import path as xpath

if TYPE_CHECKING:
    from .aws_ec2 import Ec2Emulator

SERVICE, VERSION = "autoscaling", "2011-01-01"
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
DEFAULT_HEARTBEAT_S = 3600
MINUTE_S = 60.0


class AutoScaling:
    """Auto Scaling for an Ec2Emulator: `AutoScaling(emulator)` hooks itself onto the emulator's wire."""

    def __init__(self, emulator: Ec2Emulator, *, time_scale: float = 1.0, scale_in_periods: int = 3) -> None:
        self.ec2 = emulator
        self.time_scale = time_scale
        self.scale_in_periods = scale_in_periods
        self.decisions: list[tuple[str, int, int, float]] = []   # (group, from, to, metric) by the controller
        self.errors: list[str] = []                              # controller failures (a test asserts none)
        self._lock = threading.RLock()
        self._scale_lock = threading.Lock()                      # one resize at a time (calls and controller)
        self._versions: dict[str, str] = {}                      # instance id -> launch template version
        self._victims: dict[str, Victim] = {}
        self._regions: set[str] = set()
        self._below: dict[str, int] = {}                         # group -> consecutive periods below target
        self._counts: dict[str, int] = {}                        # balancer plane -> its requests so far
        self._closing = threading.Event()
        self._controller: threading.Thread | None = None
        self._handlers: dict[str, Callable[[WireRequest], WireResponse]] = {
            "CreateAutoScalingGroup": self._launching,
            "SetDesiredCapacity": self._resize,
            "UpdateAutoScalingGroup": self._resize,
            "DeleteAutoScalingGroup": self._delete,
            "CompleteLifecycleAction": self._complete,
            "RecordLifecycleActionHeartbeat": self._heartbeat,
            "DescribeAutoScalingGroups": self._describe,
        }
        self.pool = WarmPools(self)                              # aws_warm_pool.py
        self.refresh = Refreshes(self)                           # aws_refresh.py: refreshes, spot, reclaims
        self.alarms = AlarmActions(self)                         # aws_alarms.py
        self._handlers.update(self.pool.handlers())
        self._handlers.update(self.refresh.handlers())
        self._handlers["PutScalingPolicy"] = self.alarms.put_policy
        emulator.routes.append(self.route)
        emulator.closers.append(self.close)

    @property
    def period_s(self) -> float:
        return MINUTE_S * self.time_scale

    def route(self, request: WireRequest) -> Callable[[WireRequest], WireResponse] | None:
        ours = request.service == SERVICE or (request.service == "" and request.params.get("Version") == VERSION)
        return self.handle if ours and request.protocol == "query" else None

    def handle(self, request: WireRequest) -> WireResponse:
        with self._lock:
            self._regions.add(request.region)
        self._start_controller()
        return self._handlers.get(request.action, self.ec2._forward)(request)

    def close(self) -> None:
        self._closing.set()
        if self._controller is not None:
            self._controller.join(10)

    def victims(self) -> list[Victim]:
        with self._lock:
            return list(self._victims.values())

    # --- moto, read back --------------------------------------------------------------------------

    def _moto(self, region: str, action: str, params: dict[str, str]) -> ET.Element | None:
        reply = self.ec2._need_upstream().query(SERVICE, region, action, VERSION, params)
        return parse_xml(reply.body) if reply.ok else None

    def _group(self, region: str, name: str) -> ET.Element | None:
        root = self._moto(region, "DescribeAutoScalingGroups", {"AutoScalingGroupNames.member.1": name})
        found = members(xpath(root, "DescribeAutoScalingGroupsResult") if root is not None else None,
                        "AutoScalingGroups")
        return found[0] if found else None

    def _groups(self, region: str) -> list[ET.Element]:
        root = self._moto(region, "DescribeAutoScalingGroups", {})
        return members(xpath(root, "DescribeAutoScalingGroupsResult") if root is not None else None,
                       "AutoScalingGroups")

    def _template_version(self, region: str, template: ET.Element | None) -> tuple[str, bytes, dict[str, str]]:
        """(version number, user-data, its IamInstanceProfile as AssociateIamInstanceProfile params) of the
        group's launch template version as it resolves now."""
        from .aws_ec2 import Ec2Emulator

        if template is None:
            return "", b"", {}
        wanted = child_text(template, "Version") or "$Default"
        params = {"LaunchTemplateVersion.1": wanted}
        if child_text(template, "LaunchTemplateId"):
            params["LaunchTemplateId"] = child_text(template, "LaunchTemplateId")
        else:
            params["LaunchTemplateName"] = child_text(template, "LaunchTemplateName")
        root = parse_xml(self.ec2._need_upstream().ec2(region, "DescribeLaunchTemplateVersions", params).body)
        for version in items(root, "launchTemplateVersionSet"):
            data = child(version, "launchTemplateData")
            encoded = child_text(data, "userData")
            profile = child(data, "iamInstanceProfile")
            role = {f"IamInstanceProfile.{key.capitalize()}": child_text(profile, key) for key in ("name", "arn")
                    if profile is not None and child_text(profile, key)}
            return child_text(version, "versionNumber"), (Ec2Emulator._user_data({"UserData": encoded})
                                                          if encoded else b""), role
        return "", b"", {}

    def _sync(self, region: str, name: str) -> None:
        """The group's instances that have no machine yet get one; the balancer planes follow moto."""
        group = self._group(region, name)
        if group is None:
            return
        with self._lock:
            new = [child_text(m, "InstanceId") for m in members(group, "Instances")
                   if child_text(m, "InstanceId") not in self._versions]
        if new:
            template = child(group, "LaunchTemplate")
            if template is None:                  # a MixedInstancesPolicy's template (aws_refresh.py: markets)
                template = xpath(group, "MixedInstancesPolicy", "LaunchTemplate", "LaunchTemplateSpecification")
            version, user_data, profile = self._template_version(region, template)
            with self._lock:
                self._versions.update({i: version for i in new})
            for instance_id in new if profile else []:    # moto launches them without the template's profile
                self.ec2._need_upstream().ec2(region, "AssociateIamInstanceProfile",
                                              {"InstanceId": instance_id, **profile})
            self.refresh.mark_markets(region, group, new)
            self.ec2.adopt(region, {i: user_data for i in new})
        self.ec2.elbv2.refresh(region)

    # --- calls ------------------------------------------------------------------------------------

    def _launching(self, request: WireRequest) -> WireResponse:
        answer = self.ec2._forward(request)
        if answer.ok:
            self._sync(request.region, request.params.get("AutoScalingGroupName", ""))
        return answer

    def _resize(self, request: WireRequest) -> WireResponse:
        """Shrink first (the emulator's victims, drained), or start warm pool instances, then let moto carry out
        the call (it launches what is still missing)."""
        region, name, params = request.region, request.params.get("AutoScalingGroupName", ""), request.params
        with self._scale_lock:
            group = self._group(region, name)
            if group is not None:
                low = int(params.get("MinSize") or child_text(group, "MinSize") or 0)
                high = int(params.get("MaxSize") or child_text(group, "MaxSize") or 0)
                desired = params.get("DesiredCapacity")
                if desired is not None and not low <= int(desired) <= high:
                    raise AwsError(400, "ValidationError", f"New SetDesiredCapacity value {desired} is below min "
                                   f"value {low} for the AutoScalingGroup." if int(desired) < low else
                                   f"New SetDesiredCapacity value {desired} is above max value {high} for the "
                                   "AutoScalingGroup.")
                target = int(desired) if desired is not None else min(max(
                    int(child_text(group, "DesiredCapacity") or 0), low), high)
                self._shrink(region, group, target)
                self.pool.attach(region, group, target)     # warm pool first, moto launches the rest
            policy = keep_mixed_policy(region, name)
            answer = self.ec2._forward(request)
            if answer.ok:
                if not any(k.startswith(("MixedInstancesPolicy.", "LaunchTemplate.")) for k in params):
                    policy()
                self._sync(region, name)
        if answer.ok:
            self.pool.reconcile(region, name)
        return answer

    def _shrink(self, region: str, group: ET.Element, target: int) -> None:
        instances = members(group, "Instances")
        excess = len(instances) - target
        if excess <= 0:
            return
        zones: dict[str, int] = {}
        for m in instances:
            zones[child_text(m, "AvailabilityZone")] = zones.get(child_text(m, "AvailabilityZone"), 0) + 1
        with self._lock:
            versions = dict(self._versions)
        order = sorted((m for m in instances if child_text(m, "ProtectedFromScaleIn") != "true"),
                       key=lambda m: (-zones[child_text(m, "AvailabilityZone")],
                                      int(versions.get(child_text(m, "InstanceId")) or 0),
                                      -list(instances).index(m)))
        self.retire(region, group, [child_text(m, "InstanceId") for m in order[:excess]])

    def retire(self, region: str, group: ET.Element, ids: list[str], decrement: bool = True,
               deadline: float | None = None) -> None:
        """Take `ids` out of the group as a scale-in does: detached in moto, deregistered (draining), waiting for
        the terminating hook, then terminated (or parked in the warm pool). Also an instance refresh's and a
        spot interruption's way out (aws_refresh.py); `deadline` (monotonic) caps the hook's wait (EC2 reclaims
        a spot host at its interruption time whatever the hook says)."""
        if not ids:
            return
        name = child_text(group, "AutoScalingGroupName")
        chosen = [m for m in members(group, "Instances") if child_text(m, "InstanceId") in ids]
        with self._lock:
            versions = dict(self._versions)
        params = {f"InstanceIds.member.{n}": i for n, i in enumerate(ids, start=1)}
        self._moto(region, "DetachInstances", {"AutoScalingGroupName": name,
                                               "ShouldDecrementDesiredCapacity": str(decrement).lower(), **params})
        hooks = self._moto(region, "DescribeLifecycleHooks", {"AutoScalingGroupName": name})
        hook = next((h for h in members(xpath(hooks, "DescribeLifecycleHooksResult") if hooks is not None else None,
                                        "LifecycleHooks") if child_text(h, "LifecycleTransition") == TERMINATING),
                    None)
        heartbeat = float(child_text(hook, "HeartbeatTimeout") or DEFAULT_HEARTBEAT_S) * self.time_scale
        now = time.monotonic()
        drained = now + self._delay(region, group)
        if deadline is not None:
            heartbeat, drained = min(heartbeat, max(0.0, deadline - now)), min(drained, deadline)
        with self._lock:
            for m in chosen:
                i = child_text(m, "InstanceId")
                self._victims[i] = Victim(i, name, region, child_text(m, "AvailabilityZone"),
                                          versions.get(i, ""), child_text(hook, "LifecycleHookName"), drained,
                                          now + heartbeat if hook is not None else now, heartbeat)
        self.ec2.elbv2.instances_terminated(region, ids)      # deregistered: draining for the delay
        for i in ids:
            self.ec2._spawn(self._terminate_when_done, i)

    def _delay(self, region: str, group: ET.Element) -> float:
        """The longest deregistration delay of the group's target groups, in emulator seconds."""
        longest = 0.0
        for arn in [m.text or "" for m in members(group, "TargetGroupARNs")]:
            reply = self.ec2._need_upstream().query("elasticloadbalancing", region, "DescribeTargetGroupAttributes",
                                                    "2015-12-01", {"TargetGroupArn": arn})
            root = parse_xml(reply.body) if reply.ok else None
            for m in members(xpath(root, "DescribeTargetGroupAttributesResult") if root is not None else None,
                             "Attributes"):
                if child_text(m, "Key") == "deregistration_delay.timeout_seconds":
                    longest = max(longest, float(child_text(m, "Value") or 300))
        return longest * self.ec2.elbv2.time_scale

    def _terminate_when_done(self, instance_id: str) -> None:
        while not self._closing.is_set():
            with self._lock:
                victim = self._victims.get(instance_id)
            if victim is None:
                return
            now = time.monotonic()
            hook_done = victim.completed.is_set() or now >= victim.hook_deadline
            if now >= victim.drained_at and hook_done:
                break
            self._closing.wait(0.05)
        else:
            return
        with self._lock:
            victim = self._victims.get(instance_id)
        if victim is not None and self.pool.takes(victim):
            self.pool.park(victim)                        # ReuseOnScaleIn: back to the warm pool, stopped
            with self._lock:
                self._victims.pop(instance_id, None)
            return
        with self._lock:
            victim = self._victims.pop(instance_id, None)
        if victim is None:
            return
        self.ec2._need_upstream().ec2(victim.region, "TerminateInstances", {"InstanceId.1": instance_id})
        self.ec2.machines_gone(victim.region, [instance_id])

    def _delete(self, request: WireRequest) -> WireResponse:
        region, name = request.region, request.params.get("AutoScalingGroupName", "")
        with self._scale_lock:
            group = self._group(region, name)
            with self._lock:
                waiting = [v.instance_id for v in self._victims.values() if v.group == name and v.region == region]
            ids = [child_text(m, "InstanceId") for m in members(group, "Instances")] if group is not None else []
            warm = self.pool.instances(region, name)
            if group is not None and (ids or waiting or warm) and request.params.get("ForceDelete") != "true":
                raise AwsError(400, "ResourceInUse", "You cannot delete an AutoScalingGroup while there are instances "
                                                     "or pending Spot instance request(s) still in the group.")
            answer = self.ec2._forward(request)
            if not answer.ok:
                return answer
            with self._lock:
                for i in waiting:
                    self._victims.pop(i, None)
        self.pool.drop(region, name)
        if waiting:
            params = {f"InstanceId.{n}": i for n, i in enumerate(waiting, start=1)}
            self.ec2._need_upstream().ec2(region, "TerminateInstances", params)
        self.ec2.machines_gone(region, ids + waiting)      # moto terminated the group's own already
        return answer

    def _victim(self, request: WireRequest) -> Victim:
        params = request.params
        with self._lock:
            found = next((v for v in self._victims.values() if v.group == params.get("AutoScalingGroupName")
                          and v.hook and v.hook == params.get("LifecycleHookName")
                          and (v.instance_id == params.get("InstanceId") or v.token == params.get(
                              "LifecycleActionToken")) and not v.completed.is_set()), None)
        if found is None:
            what = (f"instance ID {params['InstanceId']}" if params.get("InstanceId")
                    else f"token {params.get('LifecycleActionToken', '')}")
            raise AwsError(400, "ValidationError", f"No active Lifecycle Action found with {what}")
        return found

    def _complete(self, request: WireRequest) -> WireResponse:
        """moto: NotImplemented. The waiting instance goes on terminating (CONTINUE and ABANDON alike, as AWS
        does on scale-in)."""
        if request.params.get("LifecycleActionResult") not in ("CONTINUE", "ABANDON"):
            raise AwsError(400, "ValidationError", "LifecycleActionResult must be CONTINUE or ABANDON")
        self._victim(request).completed.set()
        return scaling_answer("CompleteLifecycleAction")

    def _heartbeat(self, request: WireRequest) -> WireResponse:
        victim = self._victim(request)
        with self._lock:
            victim.hook_deadline = time.monotonic() + victim.heartbeat_s
        return scaling_answer("RecordLifecycleActionHeartbeat")

    def _describe(self, request: WireRequest) -> WireResponse:
        """Pending until the machine runs; the launch version it came from; the terminating ones."""
        answer = self.ec2._forward(request)
        root = parse_xml(answer.body) if answer.ok else None
        if root is None:
            return answer
        with self._lock:
            versions, victims = dict(self._versions), list(self._victims.values())
        for group in members(xpath(root, "DescribeAutoScalingGroupsResult"), "AutoScalingGroups"):
            name = child_text(group, "AutoScalingGroupName")
            listed = child(group, "Instances")
            if listed is None:
                listed = ET.SubElement(group, f"{{{NS}}}Instances")
            for m in list(listed):
                instance_id = child_text(m, "InstanceId")
                for element in m:
                    if local(element.tag) == "LifecycleState" and not self.ec2._private_ip(instance_id):
                        element.text = "Pending"
                    version = xpath(m, "LaunchTemplate", "Version")
                    if version is not None and versions.get(instance_id):
                        version.text = versions[instance_id]
            for victim in [v for v in victims if v.group == name and v.region == request.region]:
                member = ET.SubElement(listed, f"{{{NS}}}member")
                waiting = victim.hook and not victim.completed.is_set()
                for key, text in (("InstanceId", victim.instance_id), ("AvailabilityZone", victim.zone),
                                  ("LifecycleState", "Terminating:Wait" if waiting else "Terminating"),
                                  ("HealthStatus", "Healthy"), ("ProtectedFromScaleIn", "false")):
                    ET.SubElement(member, f"{{{NS}}}{key}").text = text
        return answer.with_body(xml_bytes(root))

    # --- the target-tracking controller -------------------------------------------------------------

    def _start_controller(self) -> None:
        with self._lock:
            if self._controller is not None or self._closing.is_set():
                return
            self._controller = threading.Thread(target=self._control, name="autoscaling", daemon=True)
        self._controller.start()

    def _control(self) -> None:
        while not self._closing.wait(self.period_s):
            with self._lock:
                regions = sorted(self._regions)
            for region in regions:
                for step in (self.alarms.tick, self._evaluate, self.pool.reconcile_region):
                    try:
                        step(region)
                    except Exception as exc:  # reported; the next period tries again
                        with self._lock:
                            self.errors.append(f"{region}: {step.__name__}: {type(exc).__name__}: {exc}"[:500])

    def _evaluate(self, region: str) -> None:
        root = self._moto(region, "DescribePolicies", {})
        policies = [p for p in members(xpath(root, "DescribePoliciesResult") if root is not None else None,
                                       "ScalingPolicies") if child_text(p, "PolicyType") == "TargetTrackingScaling"]
        groups = {child_text(g, "AutoScalingGroupName"): g for g in self._groups(region)}
        for policy in policies:
            group = groups.get(child_text(policy, "AutoScalingGroupName"))
            config = child(policy, "TargetTrackingConfiguration")
            if group is None or config is None:
                continue
            self._track(region, group, config)

    def _track(self, region: str, group: ET.Element, config: ET.Element) -> None:
        name = child_text(group, "AutoScalingGroupName")
        instances = members(group, "Instances")
        serving = [m for m in instances if self.ec2._private_ip(child_text(m, "InstanceId"))]
        metric = self._metric(region, group, config, max(1, len(serving)))
        if metric is None or len(serving) < len(instances):
            return                                        # no datapoint, or warming up: no decision
        target = float(child_text(config, "TargetValue") or 0) or 1.0
        low, high = int(child_text(group, "MinSize") or 0), int(child_text(group, "MaxSize") or 0)
        desired = int(child_text(group, "DesiredCapacity") or 0)
        wanted = min(max(math.ceil(round(len(serving) * metric / target, 6)), low), high)
        if wanted > desired:
            self._below[name] = 0
            self._set(region, name, desired, wanted, metric)
        elif wanted < desired and child_text(config, "DisableScaleIn") != "true":
            self._below[name] = self._below.get(name, 0) + 1
            if self._below[name] >= self.scale_in_periods:
                self._below[name] = 0
                self._set(region, name, desired, wanted, metric)
        else:
            self._below[name] = 0

    def _set(self, region: str, name: str, before: int, after: int, metric: float) -> None:
        """A controller's (or an alarm's) resize, as a SetDesiredCapacity call: drained victims or the warm pool."""
        with self._lock:
            self.decisions.append((name, before, after, metric))
        with self._scale_lock:
            group = self._group(region, name)
            if group is not None:
                self._shrink(region, group, after)
                self.pool.attach(region, group, after)
            self._moto(region, "SetDesiredCapacity", {"AutoScalingGroupName": name, "DesiredCapacity": str(after)})
            self._sync(region, name)
        self.pool.reconcile(region, name)

    def _metric(self, region: str, group: ET.Element, config: ET.Element, serving: int) -> float | None:
        predefined = child(config, "PredefinedMetricSpecification")
        if predefined is not None:
            if child_text(predefined, "PredefinedMetricType") != "ALBRequestCountPerTarget":
                return None
            label = child_text(predefined, "ResourceLabel")      # app/NAME/ID/targetgroup/NAME/ID
            balancer_label, _, _group_label = label.partition("/targetgroup/")
            arns = [m.text or "" for m in members(group, "TargetGroupARNs")]
            if not arns or not balancer_label:
                return None
            balancer_arn = arns[0].partition(":targetgroup/")[0] + ":loadbalancer/" + balancer_label
            return self._requests(balancer_arn) / serving
        custom = child(config, "CustomizedMetricSpecification")
        return self._custom(region, custom) if custom is not None else None

    def _requests(self, balancer_arn: str) -> int:
        """Requests the balancer's plane sent to its targets since the last period (haproxy's backend `stot`:
        the front opens one back connection per request), from BalancerPlane.counts."""
        plane = self.ec2.elbv2.plane(balancer_arn)
        total = sum(plane.counts(listener)[0] for listener in plane.listeners())
        with self._lock:
            before = self._counts.get(balancer_arn, 0)
            self._counts[balancer_arn] = total
        return total - before if total >= before else total     # a rebuilt back haproxy starts at zero

    def _custom(self, region: str, spec: ET.Element) -> float | None:
        """The metric's Statistic over the last period, from moto's CloudWatch (what PutMetricData stored)."""
        import datetime

        from moto.cloudwatch.models import cloudwatch_backends

        backend = cloudwatch_backends["123456789012"][region]
        dimensions = [{"Name": child_text(d, "Name"), "Value": child_text(d, "Value")}
                      for d in members(spec, "Dimensions")]
        statistic = child_text(spec, "Statistic") or "Average"
        end = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)      # moto keeps naive UTC times
        start = end - datetime.timedelta(seconds=max(1.0, self.period_s))
        points = backend.get_metric_statistics(child_text(spec, "Namespace"), child_text(spec, "MetricName"),
                                               start, end, 60, [statistic], dimensions)
        values = [float(v) for p in points if (v := p.get_statistics_for_type(statistic)) is not None]
        return values[-1] if values else None


def keep_mixed_policy(region: str, name: str) -> Callable[[], None]:
    """moto 5.2.5's UpdateAutoScalingGroup sets the group's MixedInstancesPolicy to what the call carries, so a
    resize alone (MinSize / MaxSize / DesiredCapacity) drops it, and the hosts it launches come from no template
    (no user-data) and all on demand (issue 49's `deployments start`). AWS's UpdateAutoScalingGroup reference:
    "Any properties that you don't specify are not changed by this update request." The returned call puts
    back the policy the group had before."""
    from moto.autoscaling.models import autoscaling_backends

    group = autoscaling_backends[ACCOUNT][region].autoscaling_groups.get(name)
    before = getattr(group, "mixed_instances_policy", None)

    def restore() -> None:
        if group is not None and before is not None:
            group.mixed_instances_policy = before
    return restore
