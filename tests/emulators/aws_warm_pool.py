"""Warm pools for the Auto Scaling emulator (aws_autoscaling.py): prepared, stopped instances a group scales out to.

Why a module of its own: aws_autoscaling.py carries the group's own machines, drains and target tracking; the
warm pool is a second set of instances with a life of its own (prepared, stopped, started again, returned on
scale-in), and ngcx's scale to zero stands on it. AutoScaling hooks it in: PutWarmPool / DescribeWarmPool /
DeleteWarmPool go through `handlers()`, a scale-out takes `attach()` first, a scale-in victim is `park()`ed
instead of terminated, and every resize and controller period ends with `reconcile()`.

What moto 5.2.5 keeps (checked by experiment): PutWarmPool's configuration (MinSize, PoolState,
InstanceReusePolicy, MaxGroupPreparedCapacity) and DescribeWarmPool's WarmPoolConfiguration; DeleteWarmPool
drops it; DeleteAutoScalingGroup drops it with the group. It never has a pool instance (`Instances` is always
empty) and DescribeWarmPool of an unknown group answers 500.

What this module adds, as AWS does:
- The pool's size: max(MinSize, MaxGroupPreparedCapacity (default: the group's MaxSize) - DesiredCapacity).
  Missing instances are *prepared*: launched in moto from the group's launch template version as it resolves
  now (RunInstances in the group's first subnet, as moto places the group's own), given the template's
  instance profile, adopted by the Ec2Emulator (a machine that boots the user-data), `Warmed:Pending` while
  it boots, then stopped through the emulator's own StopInstances path (the machine really stops, its disk
  is kept): `Warmed:Stopped` (`Warmed:Hibernated` for PoolState Hibernated, stopped the same way;
  `Warmed:Running` for PoolState Running, left running). A pool larger than its size loses its newest
  instances (terminated).
- Scale-out: ready pool instances are used first: started through the emulator's StartInstances path (the
  machine boots again on its kept disk), put back in the group with moto's AttachInstances (which raises
  DesiredCapacity by one each and registers them in the group's target groups); the group shows them
  `Pending` until their machine runs, then InService. Only the rest is launched new (moto).
- Scale-in with InstanceReusePolicy.ReuseOnScaleIn: a victim, after its drain and terminating lifecycle
  hook, is stopped and joins the pool (`Warmed:Pending` while it stops, then `Warmed:Stopped`) instead of
  being terminated. While it drains it counts towards the pool's size (no extra instance is prepared).
- DescribeWarmPool lists the pool's instances (InstanceId, InstanceType, AvailabilityZone, LifecycleState,
  HealthStatus Healthy, LaunchTemplate with the version it was launched from); an unknown group answers 400
  ValidationError. DeleteWarmPool (with or without ForceDelete) and DeleteAutoScalingGroup with ForceDelete
  terminate the pool's instances; DeleteAutoScalingGroup without ForceDelete while the pool has instances
  answers 400 ResourceInUse. Pool instances are never members of the group (DescribeAutoScalingGroups).
Not emulated: warm pool lifecycle hooks (Warmed:Pending:Wait), PendingDelete status (the instances go at
once), instance refresh of pool instances, a pool instance failing its start (it stays in the pool and a new
instance is launched instead), the aws:autoscaling:groupName tag on pool instances.
"""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from .aws_scaling_owner import NS, ScalingOwner, Victim
from .aws_wire import (
    EC2_VERSION,
    AwsError,
    WireRequest,
    WireResponse,
    child,
    child_text,
    items,
    members,
    parse_xml,
    xml_bytes,
)
from .aws_wire import path as xpath

READY = ("Warmed:Stopped", "Warmed:Hibernated", "Warmed:Running")
SETTLE_TIMEOUT_S = 600.0


@dataclass
class Warm:
    """One instance of a group's warm pool."""

    instance_id: str
    group: str
    region: str
    zone: str
    instance_type: str
    version: str
    state: str = "Warmed:Pending"


def ec2_request(region: str, action: str, params: dict[str, str]) -> WireRequest:
    """The emulator's own EC2 call as a client request, for its handlers (StopInstances, StartInstances, ...)."""
    body = urlencode({"Action": action, "Version": EC2_VERSION, **params}).encode()
    headers = (("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"),
               ("Authorization", f"AWS4-HMAC-SHA256 Credential=harness/20260101/{region}/ec2/aws4_request, "
                                 "SignedHeaders=host, Signature=0"))
    return WireRequest("POST", "/", headers, body, "query", action, dict(params), None, region, "ec2")


class WarmPools:
    """The warm pools of an AutoScaling emulator's groups."""

    def __init__(self, scaling: ScalingOwner) -> None:
        self.scaling = scaling
        self.ec2 = scaling.ec2
        self._lock = threading.RLock()
        self._pool: dict[str, Warm] = {}

    def handlers(self) -> dict[str, Callable[[WireRequest], WireResponse]]:
        return {"PutWarmPool": self._put, "DescribeWarmPool": self._describe, "DeleteWarmPool": self._delete}

    def instances(self, region: str, group: str) -> list[Warm]:
        with self._lock:
            return [w for w in self._pool.values() if w.group == group and w.region == region]

    # --- moto, read back --------------------------------------------------------------------------

    def config(self, region: str, group: str) -> ET.Element | None:
        """The group's WarmPoolConfiguration in moto (None: no pool, or no group)."""
        root = self.scaling._moto(region, "DescribeWarmPool", {"AutoScalingGroupName": group})
        return xpath(root, "DescribeWarmPoolResult", "WarmPoolConfiguration") if root is not None else None

    def _size(self, group: ET.Element, config: ET.Element) -> int:
        prepared = child_text(config, "MaxGroupPreparedCapacity")
        high = int(prepared) if prepared not in ("", None) and int(prepared) >= 0 else int(
            child_text(group, "MaxSize") or 0)
        return max(int(child_text(config, "MinSize") or 0), high - int(child_text(group, "DesiredCapacity") or 0))

    def _instance(self, region: str, instance_id: str) -> ET.Element | None:
        """The instance as the emulator's DescribeInstances shows it (its state masked during transitions)."""
        answer = self.ec2._describe_instances(ec2_request(region, "DescribeInstances", {"InstanceId.1": instance_id}))
        root = parse_xml(answer.body) if answer.ok else None
        for reservation in items(root, "reservationSet") if root is not None else []:
            for item in items(reservation, "instancesSet"):
                return item
        return None

    def _state(self, region: str, instance_id: str) -> str:
        return child_text(child(self._instance(region, instance_id), "instanceState"), "name")

    # --- the pool's size --------------------------------------------------------------------------

    def reconcile(self, region: str, name: str) -> None:
        """Prepare the missing pool instances, terminate the excess (newest first). Not under _scale_lock."""
        with self.scaling._scale_lock:            # not between a scale-in's detach and its victims
            group = self.scaling._group(region, name)
            config = self.config(region, name) if group is not None else None
            if group is None or config is None:
                return
            size = self._size(group, config)
            with self._lock:
                pooled = [w for w in self._pool.values() if w.group == name and w.region == region]
            returning = {v.instance_id for v in self.scaling.victims() if v.group == name and v.region == region
                         } - {w.instance_id for w in pooled} if self._reuses(config) else set()
            missing = size - len(pooled) - len(returning)
            if missing > 0:
                self._prepare(region, group, config, missing)
            elif missing < 0:
                self._terminate(region, [w.instance_id for w in pooled[::-1] if w.state in READY][:-missing])

    def reconcile_region(self, region: str) -> None:
        for group in self.scaling._groups(region):
            self.reconcile(region, child_text(group, "AutoScalingGroupName"))

    @staticmethod
    def _reuses(config: ET.Element | None) -> bool:
        return child_text(child(config, "InstanceReusePolicy"), "ReuseOnScaleIn") == "true"

    def _prepare(self, region: str, group: ET.Element, config: ET.Element, count: int) -> None:
        template = child(group, "LaunchTemplate")
        version, user_data, profile = self.scaling._template_version(region, template)
        if template is None or not version:
            return
        subnet = (child_text(group, "VPCZoneIdentifier") or "").split(",")[0]
        params = {"LaunchTemplate.Version": version, "MinCount": str(count), "MaxCount": str(count),
                  **({"SubnetId": subnet} if subnet else {})}
        key = "LaunchTemplateId" if child_text(template, "LaunchTemplateId") else "LaunchTemplateName"
        params[f"LaunchTemplate.{key}"] = child_text(template, key)
        root = parse_xml(self.ec2._need_upstream().ec2(region, "RunInstances", params).body)
        launched = [Warm(child_text(i, "instanceId"), child_text(group, "AutoScalingGroupName"), region,
                         child_text(xpath(i, "placement"), "availabilityZone"), child_text(i, "instanceType"),
                         version) for i in items(root, "instancesSet")]
        with self._lock:
            self._pool.update({w.instance_id: w for w in launched})
        with self.scaling._lock:
            self.scaling._versions.update({w.instance_id: version for w in launched})
        for warm in launched if profile else []:          # as _sync: the template's profile
            self.ec2._need_upstream().ec2(region, "AssociateIamInstanceProfile",
                                          {"InstanceId": warm.instance_id, **profile})
        self.ec2.adopt(region, {w.instance_id: user_data for w in launched})
        pool_state = child_text(config, "PoolState") or "Stopped"
        for warm in launched:
            self.ec2._spawn(self._settle, warm, pool_state)

    def _settle(self, warm: Warm, pool_state: str) -> None:
        """Warmed:Pending until the machine runs, then stopped (Stopped / Hibernated) or left running."""
        if not self._wait_for(warm, "running"):
            return
        if pool_state == "Running":
            self._mark(warm, "Warmed:Running")
            return
        try:
            self.ec2._stop_instances(ec2_request(warm.region, "StopInstances", {"InstanceId.1": warm.instance_id}))
        except AwsError as error:
            self._error(f"warm pool stop {warm.instance_id}: {error}")
            return
        if self._wait_for(warm, "stopped"):
            self._mark(warm, "Warmed:Hibernated" if pool_state == "Hibernated" else "Warmed:Stopped")

    def _wait_for(self, warm: Warm, state: str) -> bool:
        """True once DescribeInstances shows `state`; False when the instance left the pool or time ran out."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline and not self.scaling._closing.is_set():
            with self._lock:
                if self._pool.get(warm.instance_id) is not warm:
                    return False
            if self._state(warm.region, warm.instance_id) == state:
                return True
            self.scaling._closing.wait(0.1)
        return False

    def _error(self, message: str) -> None:
        with self.scaling._lock:
            self.scaling.errors.append(message[:500])

    def _mark(self, warm: Warm, state: str) -> None:
        with self._lock:
            if self._pool.get(warm.instance_id) is warm:
                warm.state = state

    def _terminate(self, region: str, ids: list[str]) -> None:
        with self._lock:
            for i in ids:
                self._pool.pop(i, None)
        if ids:
            params = {f"InstanceId.{n}": i for n, i in enumerate(ids, start=1)}
            self.ec2._terminate_instances(ec2_request(region, "TerminateInstances", params))

    def drop(self, region: str, name: str) -> None:
        """Every pool instance of the group terminated (DeleteWarmPool, DeleteAutoScalingGroup ForceDelete)."""
        self._terminate(region, [w.instance_id for w in self.instances(region, name)])

    # --- scale-out and scale-in -------------------------------------------------------------------

    def attach(self, region: str, group: ET.Element, target: int) -> list[str]:
        """Ready pool instances started and attached towards `target` (before moto launches the rest)."""
        name = child_text(group, "AutoScalingGroupName")
        size = len(members(group, "Instances"))
        wanted = min(target, int(child_text(group, "MaxSize") or 0)) - size
        with self._lock:
            ready = [w for w in self._pool.values() if w.group == name and w.region == region and w.state in READY]
            taken = ready[:max(0, wanted)]
            for warm in taken:
                del self._pool[warm.instance_id]
        attached = [w.instance_id for w in taken if self._start(w)]
        if attached:
            params = {f"InstanceIds.member.{n}": i for n, i in enumerate(attached, start=1)}
            self.scaling._moto(region, "AttachInstances", {"AutoScalingGroupName": name, **params})
            self.ec2.elbv2.refresh(region)
        return attached

    def _start(self, warm: Warm) -> bool:
        if warm.state == "Warmed:Running":
            return True
        try:
            self.ec2._start_instances(ec2_request(warm.region, "StartInstances", {"InstanceId.1": warm.instance_id}))
        except AwsError as error:              # no capacity: it stays in the pool, a new one is launched
            with self._lock:
                self._pool[warm.instance_id] = warm
            if error.code != "InsufficientInstanceCapacity":
                self._error(f"warm pool start {warm.instance_id}: {error}")
            return False
        return True

    def takes(self, victim: Victim) -> bool:
        """Whether a scale-in victim returns to its group's pool (ReuseOnScaleIn) instead of terminating."""
        return self._reuses(self.config(victim.region, victim.group))

    def park(self, victim: Victim) -> None:
        """The victim, drained, joins the pool: stopped (the pool's state), Warmed:Pending until then."""
        config = self.config(victim.region, victim.group)
        instance_type = child_text(self._instance(victim.region, victim.instance_id), "instanceType")
        warm = Warm(victim.instance_id, victim.group, victim.region, victim.zone, instance_type, victim.version)
        with self._lock:
            self._pool[warm.instance_id] = warm
        self.ec2._spawn(self._settle, warm, child_text(config, "PoolState") or "Stopped")

    # --- calls ------------------------------------------------------------------------------------

    def _put(self, request: WireRequest) -> WireResponse:
        answer = self.ec2._forward(request)
        if answer.ok:
            self.reconcile(request.region, request.params.get("AutoScalingGroupName", ""))
        return answer

    def _delete(self, request: WireRequest) -> WireResponse:
        name = request.params.get("AutoScalingGroupName", "")
        self._known(request.region, name)
        answer = self.ec2._forward(request)
        if answer.ok:
            self.drop(request.region, name)
        return answer

    def _known(self, region: str, name: str) -> ET.Element:
        group = self.scaling._group(region, name)
        if group is None:
            raise AwsError(400, "ValidationError", f"AutoScalingGroup name not found - {name}")
        return group

    def _describe(self, request: WireRequest) -> WireResponse:
        region, name = request.region, request.params.get("AutoScalingGroupName", "")
        template = child(self._known(region, name), "LaunchTemplate")
        answer = self.ec2._forward(request)
        root = parse_xml(answer.body) if answer.ok else None
        result = xpath(root, "DescribeWarmPoolResult") if root is not None else None
        if result is None:
            return answer
        listed = child(result, "Instances")
        if listed is None:
            listed = ET.SubElement(result, f"{{{NS}}}Instances")
        for warm in self.instances(region, name):
            self._member(listed, warm, template)
        return answer.with_body(xml_bytes(root))

    def _member(self, listed: ET.Element, warm: Warm, template: ET.Element | None) -> None:
        member = ET.SubElement(listed, f"{{{NS}}}member")
        for key, text in (("InstanceId", warm.instance_id), ("InstanceType", warm.instance_type),
                          ("AvailabilityZone", warm.zone), ("LifecycleState", warm.state),
                          ("HealthStatus", "Healthy")):
            if text:
                ET.SubElement(member, f"{{{NS}}}{key}").text = text
        if template is not None:
            spec = ET.SubElement(member, f"{{{NS}}}LaunchTemplate")
            for key in ("LaunchTemplateId", "LaunchTemplateName"):
                ET.SubElement(spec, f"{{{NS}}}{key}").text = child_text(template, key)
            ET.SubElement(spec, f"{{{NS}}}Version").text = warm.version
